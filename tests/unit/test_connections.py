"""People's connections to backends of type oauth (``vmcp_actors.oauth._connections``): what
a backend's challenge says, where its metadata may send the gateway, which client it is
there, and how a person's tokens are kept, refreshed once and dropped."""

from __future__ import annotations

import json
import threading
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import responses

from vmcp_actors.config import config_from_mapping
from vmcp_actors.exceptions import BackendAuthError, ConnectionNeeded
from vmcp_actors.identity import Identity
from vmcp_actors.oauth._backend_servers import (
    AuthServer,
    ConnectRefused,
    ConnectUnavailable,
    UrlGuard,
    parse_challenge,
)
from vmcp_actors.oauth._connections import Connections, person_key
from vmcp_actors.oauth._records import MemoryOAuthRecords

BACKEND = "https://mcp.saas.example/mcp"
AS = "https://auth.saas.example"
ALICE = Identity("https://idp.example", "alice")
BOB = Identity("https://idp.example", "bob")


def public_resolver(host: str, port: Any) -> list[Any]:
    addresses = {"mcp.saas.example": "93.184.216.34", "auth.saas.example": "93.184.216.35",
                 "evil.example": "10.0.0.7", "internal.corp": "192.168.1.20"}
    return [(2, 1, 6, "", (addresses.get(host, "93.184.216.99"), 0))]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def config(**oauth: Any) -> Any:
    auth: dict[str, Any] = {"type": "oauth"}
    if oauth:
        auth["oauth"] = oauth
    return config_from_mapping({
        "name": "gw", "backends": [{"name": "saas", "url": BACKEND}],
        "incomingAuth": {"type": "oidc", "oidc": {"issuer": "https://idp.example", "audience": "gw",
                                                  "clientId": "gw", "clientSecretEnv": "GW_SECRET"}},
        "outgoingAuth": {"backends": {"saas": auth}},
        "operational": {"publicUrl": "https://gw.example"}})


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def connections(clock) -> Connections:
    return Connections(config(), MemoryOAuthRecords(clock), {}, clock=clock,
                       guard_for=lambda url: UrlGuard(url, public_resolver))


def server_metadata(**extra: Any) -> dict[str, Any]:
    return {"issuer": AS, "authorization_endpoint": f"{AS}/authorize", "token_endpoint": f"{AS}/token",
            "registration_endpoint": f"{AS}/register", "revocation_endpoint": f"{AS}/revoke",
            "token_endpoint_auth_methods_supported": ["none", "client_secret_basic"],
            "authorization_response_iss_parameter_supported": True, **extra}


def publish_backend(metadata: dict[str, Any] | None = None, challenge_scope: str = "repo") -> None:
    """The backend's 401 names its metadata, which names its authorization server."""
    responses.add(responses.POST, BACKEND, status=401, headers={
        "WWW-Authenticate": f'Bearer error="invalid_token", resource_metadata="https://mcp.saas.example/'
                            f'.well-known/oauth-protected-resource/mcp", scope="{challenge_scope}"'})
    responses.add(responses.GET, "https://mcp.saas.example/.well-known/oauth-protected-resource/mcp",
                  json={"resource": BACKEND, "authorization_servers": [AS], "scopes_supported": ["repo", "user"]})
    responses.add(responses.GET, f"{AS}/.well-known/oauth-authorization-server",
                  json=metadata if metadata is not None else server_metadata())


def store(connections: Connections, identity: Identity, backend: str = "saas", **fields: Any) -> dict[str, Any]:
    now = connections._clock()
    record = {"access_token": f"at-{identity.subject}", "refresh_token": f"rt-{identity.subject}",
              "expires_at": now + 3600, "refresh_at": now + 3570, "backend": backend,
              "person": [identity.issuer, identity.subject],
              "client": {"client_id": "registered", "client_secret": None, "method": "none"},
              "scopes": ["repo"], "since": now, **fields}
    connections.records.put("connection", f"{person_key(identity)}|{backend}", record, 86400)
    return record


# -- the backend's challenge ------------------------------------------------------------------


@pytest.mark.parametrize(("header", "expected"), [
    ('Bearer resource_metadata="https://x/.well-known/oauth-protected-resource", scope="a b"',
     {"resource_metadata": "https://x/.well-known/oauth-protected-resource", "scope": "a b"}),
    ('bearer error="insufficient_scope", scope="repo admin"', {"error": "insufficient_scope", "scope": "repo admin"}),
    ('Bearer realm="x", error_description="say \\"hi\\""', {"realm": "x", "error_description": 'say "hi"'}),
    ("Basic realm=x", {}),
    ("", {}),
    (None, {}),
])
def test_a_bearer_challenge_is_read_as_its_parameters(header, expected):
    assert parse_challenge(header) == expected


# -- where metadata may send the gateway -----------------------------------------------------------


@pytest.mark.parametrize("url", [
    "http://auth.saas.example/token",  # plain http to another host
    "https://evil.example/token",  # resolves to a private address
    "https://internal.corp/token",
    "https://127.0.0.1/token",
    "https://[::1]/token",
    "file:///etc/passwd",
    "https://user:pw@auth.saas.example/token",
    42,
])
def test_a_public_backends_metadata_cannot_point_the_gateway_into_its_network(url):
    guard = UrlGuard(BACKEND, public_resolver)
    with pytest.raises(ConnectUnavailable):
        guard.check(url)


def test_a_backend_on_loopback_may_name_loopback_and_private_servers():
    guard = UrlGuard("http://127.0.0.1:9000/mcp", public_resolver)
    assert guard.check("http://127.0.0.1:9001/token") == "http://127.0.0.1:9001/token"
    assert guard.check("https://internal.corp/token")
    with pytest.raises(ConnectUnavailable):
        guard.check("http://internal.corp/token")  # still https off loopback


# -- the authorization server and the gateway's client there -----------------------------------------


@responses.activate
def test_the_server_is_found_from_the_backends_challenge_and_the_gateway_registers_once(connections):
    publish_backend()
    responses.add(responses.POST, f"{AS}/register", json={"client_id": "dyn-1", "token_endpoint_auth_method": "none"},
                  status=201)
    authorization = connections.backends["saas"]
    server = authorization.server()
    assert server == AuthServer(issuer=AS, authorization_endpoint=f"{AS}/authorize", token_endpoint=f"{AS}/token",
                                resource=BACKEND, scopes=("repo",), registration_endpoint=f"{AS}/register",
                                revocation_endpoint=f"{AS}/revoke", auth_methods=("none", "client_secret_basic"),
                                cimd=False, sends_iss=True)
    assert authorization.client(server)["client_id"] == "dyn-1"
    assert authorization.client(server)["client_id"] == "dyn-1"  # kept: registered once
    registered = [call for call in responses.calls if call.request.url == f"{AS}/register"]
    assert len(registered) == 1
    asked = json.loads(registered[0].request.body)
    assert asked["redirect_uris"] == ["https://gw.example/connect/callback"]
    assert asked["token_endpoint_auth_method"] == "none"


@responses.activate
def test_a_server_that_takes_metadata_documents_gets_the_gateways(connections):
    publish_backend(server_metadata(client_id_metadata_document_supported=True))
    authorization = connections.backends["saas"]
    client = authorization.client(authorization.server())
    assert client == {"client_id": "https://gw.example/connect/client.json", "client_secret": None, "method": "none"}
    assert authorization.client_document()["redirect_uris"] == ["https://gw.example/connect/callback"]


@responses.activate
def test_a_configured_client_is_used_as_it_is(clock):
    publish_backend()
    configured = Connections(config(clientId="Iv1.abc", clientSecretEnv="GH_SECRET"), MemoryOAuthRecords(clock),
                             {"saas": "s3cret"}, clock=clock, guard_for=lambda url: UrlGuard(url, public_resolver))
    authorization = configured.backends["saas"]
    assert authorization.client(authorization.server()) == {"client_id": "Iv1.abc", "client_secret": "s3cret",
                                                            "method": "client_secret_basic"}


@responses.activate
def test_metadata_that_names_another_issuer_is_refused(connections):
    publish_backend(server_metadata(issuer="https://impostor.example"))
    with pytest.raises(ConnectUnavailable, match="another issuer"):
        connections.backends["saas"].server()


@responses.activate
def test_metadata_pointing_at_a_private_address_is_refused(connections):
    publish_backend(server_metadata(token_endpoint="https://evil.example/token"))
    with pytest.raises(ConnectUnavailable, match="private or loopback"):
        connections.backends["saas"].server()


# -- a connect ----------------------------------------------------------------------------------------


@responses.activate
def test_a_connect_sends_pkce_resource_and_state_and_stores_the_tokens_for_the_person(connections):
    publish_backend()
    responses.add(responses.POST, f"{AS}/register", json={"client_id": "dyn-1"}, status=201)
    responses.add(responses.POST, f"{AS}/token", json={"access_token": "at-1", "refresh_token": "rt-1",
                                                       "expires_in": 600, "token_type": "Bearer", "scope": "repo"})
    url, elicitation = connections.link(ALICE, "saas")
    ticket_id = urlsplit(url).path.rsplit("/", 1)[-1]
    assert url.startswith("https://gw.example/connect/") and "alice" not in url
    where = connections.authorization_url(connections.ticket(ticket_id), ticket_id, "browser-digest")
    query = parse_qs(urlsplit(where).query)
    assert query["code_challenge_method"] == ["S256"] and query["resource"] == [BACKEND]
    assert query["redirect_uri"] == ["https://gw.example/connect/callback"] and query["scope"] == ["repo"]
    done = connections.finish(query["state"][0], "code-1", AS, "browser-digest")
    assert done == {"backend": "saas", "elicitation": elicitation, "person": [ALICE.issuer, ALICE.subject]}
    assert connections.token(ALICE, "saas") == "at-1"
    with pytest.raises(ConnectionNeeded):
        connections.token(BOB, "saas")
    sent = parse_qs(responses.calls[-1].request.body)
    assert sent["code_verifier"] and sent["resource"] == [BACKEND]
    assert connections.ticket(ticket_id) is None  # the link is used up


@responses.activate
@pytest.mark.parametrize(("iss", "browser"), [("https://impostor.example", "browser-digest"),
                                              (None, "browser-digest"),  # the server says it names itself
                                              (AS, "another-browser")])
def test_a_callback_from_elsewhere_stores_nothing(connections, iss, browser):
    publish_backend()
    responses.add(responses.POST, f"{AS}/register", json={"client_id": "dyn-1"}, status=201)
    url, _ = connections.link(ALICE, "saas")
    ticket_id = urlsplit(url).path.rsplit("/", 1)[-1]
    state = parse_qs(urlsplit(connections.authorization_url(connections.ticket(ticket_id), ticket_id,
                                                            "browser-digest")).query)["state"][0]
    with pytest.raises(ConnectRefused):
        connections.finish(state, "code-1", iss, browser)
    with pytest.raises(ConnectRefused):  # taken once: a second try finds nothing either
        connections.finish(state, "code-1", AS, "browser-digest")
    assert not connections.connected(ALICE, "saas")
    assert not [call for call in responses.calls if call.request.url == f"{AS}/token"]


# -- tokens ----------------------------------------------------------------------------------------------


@responses.activate
def test_a_token_due_is_refreshed_once_by_concurrent_callers(connections, clock):
    publish_backend()
    store(connections, ALICE)
    clock.now += 3580  # past refresh_at
    release = threading.Event()

    def token_answer(request: Any) -> tuple[int, dict[str, str], str]:
        release.wait(5)
        return 200, {}, json.dumps({"access_token": "at-2", "refresh_token": "rt-2", "expires_in": 3600})

    responses.add_callback(responses.POST, f"{AS}/token", callback=token_answer)
    got: list[str] = []
    callers = [threading.Thread(target=lambda: got.append(connections.token(ALICE, "saas"))) for _ in range(4)]
    for caller in callers:
        caller.start()
    release.set()
    for caller in callers:
        caller.join(10)
    assert got == ["at-2"] * 4
    assert len([call for call in responses.calls if call.request.url == f"{AS}/token"]) == 1
    assert connections.refreshes == 1
    kept = connections.records.get("connection", f"{person_key(ALICE)}|saas")
    assert kept["refresh_token"] == "rt-2"


@responses.activate
def test_a_refused_refresh_ends_only_that_connection(connections, clock):
    publish_backend()
    store(connections, ALICE)
    store(connections, ALICE, backend="other")
    store(connections, BOB)
    clock.now += 3580
    responses.add(responses.POST, f"{AS}/token", json={"error": "invalid_grant"}, status=400)
    with pytest.raises(ConnectionNeeded) as asked:
        connections.token(ALICE, "saas")
    assert asked.value.scopes == ("repo",)
    assert not connections.connected(ALICE, "saas")
    assert connections.connected(ALICE, "other") and connections.connected(BOB, "saas")


@responses.activate
def test_an_unreachable_server_keeps_a_token_still_valid_and_fails_one_past_its_end(connections, clock):
    publish_backend()
    store(connections, ALICE)
    clock.now += 3580
    assert connections.token(ALICE, "saas") == "at-alice"  # token endpoint unreachable (no answer registered)
    clock.now += 60
    connections._tokens.clear()
    with pytest.raises(BackendAuthError) as failed:
        connections.token(ALICE, "saas")
    assert not isinstance(failed.value, ConnectionNeeded)  # not the person's doing: nothing to reconnect
    assert connections.connected(ALICE, "saas")


def test_a_401_drops_the_token_it_refused_and_no_newer_one(connections):
    store(connections, ALICE)
    asked = connections.refused(ALICE, "saas", "at-stale", 401, 'Bearer error="invalid_token"')
    assert isinstance(asked, ConnectionNeeded) and connections.connected(ALICE, "saas")  # a newer token is kept
    asked = connections.refused(ALICE, "saas", "at-alice", 401, 'Bearer error="invalid_token"')
    assert not connections.connected(ALICE, "saas")
    assert "connect again" in str(asked)


def test_a_403_for_scope_asks_for_the_union_and_keeps_the_token(connections):
    store(connections, ALICE)
    asked = connections.refused(ALICE, "saas", "at-alice", 403, 'Bearer error="insufficient_scope", scope="admin"')
    assert asked.scopes == ("repo", "admin")
    assert connections.connected(ALICE, "saas")


def test_the_person_and_the_operator_see_connections_without_tokens(connections):
    store(connections, ALICE)
    mine = connections.of((ALICE.issuer, ALICE.subject))
    assert mine == [{"backend": "saas", "connected": True, "scopes": ["repo"], "since": connections._clock(),
                     "state": "connected"}]
    everyone = json.dumps(connections.overview())
    assert "alice" in everyone and "at-alice" not in everyone and "rt-alice" not in everyone


@responses.activate
def test_a_disconnect_revokes_at_the_server_and_forgets(connections):
    publish_backend()
    responses.add(responses.POST, f"{AS}/revoke", status=200)
    store(connections, ALICE)
    assert connections.disconnect((ALICE.issuer, ALICE.subject), "saas")
    revoked = [parse_qs(call.request.body) for call in responses.calls if call.request.url == f"{AS}/revoke"]
    assert [sent["token"] for sent in revoked] == [["rt-alice"], ["at-alice"]]
    assert not connections.connected(ALICE, "saas")
    assert not connections.disconnect((ALICE.issuer, ALICE.subject), "saas")


@responses.activate
def test_a_named_issuer_is_used_without_asking_the_backend(clock):
    responses.add(responses.GET, f"{AS}/.well-known/oauth-authorization-server", json=server_metadata())
    named = Connections(config(issuer=AS, resource="https://api.saas.example"), MemoryOAuthRecords(clock), {},
                        clock=clock, guard_for=lambda url: UrlGuard(url, public_resolver))
    server = named.backends["saas"].server()
    assert (server.issuer, server.resource) == (AS, "https://api.saas.example")
    assert [call.request.method for call in responses.calls] == ["GET"]  # no probe of the backend


def test_a_403_for_another_reason_is_the_backends_answer_and_keeps_the_connection(connections):
    store(connections, ALICE)
    assert connections.refused(ALICE, "saas", "at-alice", 403, 'Bearer error="forbidden"') is None
    assert connections.refused(ALICE, "saas", "at-alice", 403, None) is None
    assert connections.connected(ALICE, "saas")


def test_a_wait_for_a_connect_is_for_one_made_since_it_was_asked(connections, clock):
    store(connections, ALICE)  # connected before: a 403 asked for more scopes
    asked_at = clock.now + 1
    assert not connections.wait_connected(ALICE, "saas", 0.0, since=asked_at)
    store(connections, ALICE, since=asked_at + 5)  # the new connect, with the scopes
    assert connections.wait_connected(ALICE, "saas", 0.0, since=asked_at)


def test_records_are_keyed_by_digests_of_links_and_states(connections):
    url, _ = connections.link(ALICE, "saas")
    ticket = urlsplit(url).path.rsplit("/", 1)[-1]
    assert connections.ticket(ticket) is not None
    assert ticket not in connections.records.keys("connect-ticket")
