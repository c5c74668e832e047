"""Identity end to end (issue 3): OIDC incoming auth, sessions bound to a person, outgoing
auth per backend (header injection, RFC 8693 token exchange, passthrough headers),
per-user discovery and its cache, and secrets kept out of logs, admin output and errors.

Everything runs over real HTTP: the gateway on werkzeug, the IdP (``tests.idp.LocalIdP``)
and the backends on uvicorn. Tokens are real JWTs signed by the IdP.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import threading
import time
from typing import Any

import pykka
import pytest
import requests

from tests.backends import (
    authed_backend,
    delayed_backend,
    header_backend,
    restartable_backend,
)
from tests.gateway import (
    GatewayServer,
    admin_get,
    answer_of,
    wait_until,
)
from tests.idp import TOKEN_EXCHANGE_GRANT, LocalIdP
from tests.ports import closed_port_url
from vmcp_actors.config import config_from_mapping
from vmcp_actors.edge import _auth as web_auth
from vmcp_actors.exceptions import ConfigError

AUD = "vmcp"
CLIENT_ID = "vmcp"
CLIENT_SECRET = "cl1ent-s3cret-Zq8"  # registered at the IdP; the gateway reads it from EX_SECRET
INJECTED = "inj3cted-api-key-Wx4"  # a header_injection value
ADMIN_TOKEN = "adm1n-token-Kp2"
METADATA_PATH = "/.well-known/oauth-protected-resource"
JWT_PATTERN = re.compile(r"eyJ[\w-]+\.[\w-]+\.[\w-]*")
INVALID_PARAMS = -32602
INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}},
}


# -- fixtures and helpers -----------------------------------------------------------------------


@pytest.fixture
def idp(monkeypatch):
    provider = LocalIdP().start()
    provider.register_client(CLIENT_ID, CLIENT_SECRET)
    monkeypatch.setenv("EX_SECRET", CLIENT_SECRET)
    yield provider
    provider.stop()


@pytest.fixture
def servers():
    """Collects started backends and stops them after the test."""
    started: list[Any] = []

    def keep(backend):
        started.append(backend)
        return backend

    yield keep
    for backend in reversed(started):
        backend.stop()


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token is not None else {}


def oidc(idp: LocalIdP, **extra: Any) -> dict[str, Any]:
    return {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUD, **extra}}


def exchange(idp: LocalIdP, audience: str, scopes: tuple[str, ...] = ("read",)) -> dict[str, Any]:
    return {
        "type": "token_exchange",
        "tokenExchange": {
            "tokenUrl": idp.token_url,
            "clientId": CLIENT_ID,
            "clientSecretEnv": "EX_SECRET",
            "audience": audience,
            "scopes": list(scopes),
        },
    }


def gateway_config(backends: dict[str, Any], *, incoming: dict | None = None, outgoing: dict | None = None,
                   operational: dict | None = None, admin: bool = False) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": "t",
        "backends": [{"name": name, "url": url if isinstance(url, str) else url.url + "/mcp"}
                     for name, url in backends.items()],
    }
    if incoming is not None:
        config["incomingAuth"] = incoming
    if outgoing is not None:
        config["outgoingAuth"] = outgoing
    if operational is not None:
        config["operational"] = operational
    if admin:
        config["admin"] = {"tokenEnv": "VMCP_ADMIN_TOKEN"}
    return config


class Caller:
    """One MCP client (a bearer token, maybe extra headers) talking raw HTTP to the gateway.
    Every response it gets is appended to ``transcript`` when one is given."""

    def __init__(self, gateway: GatewayServer, token: str | None = None, headers: dict | None = None,
                 transcript: list | None = None):
        self.gateway = gateway
        self.token = token
        self.headers = dict(headers or {})
        self.transcript = transcript

    def with_token(self, token: str | None) -> Caller:
        return Caller(self.gateway, token, self.headers, self.transcript)

    def post(self, message: Any, session_id: str | None = None, headers: dict | None = None) -> requests.Response:
        response = self.gateway.post(message, session_id, headers={**bearer(self.token), **self.headers, **(headers or {})})
        if self.transcript is not None:
            self.transcript.append(response)
        return response

    def open(self, headers: dict | None = None) -> str:
        response = self.post(INIT, headers=headers)
        assert response.status_code == 200, (response.status_code, response.text)
        session_id = response.headers["Mcp-Session-Id"]
        assert self.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session_id,
                         headers=headers).status_code == 202
        return session_id

    def rpc(self, session_id: str, method: str, params: dict | None = None, request_id: int = 1,
            headers: dict | None = None) -> dict:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        return answer_of(self.post(message, session_id, headers=headers))

    def tools(self, session_id: str, headers: dict | None = None) -> list[str]:
        answer = self.rpc(session_id, "tools/list", {}, headers=headers)
        assert "result" in answer, answer
        return sorted(tool["name"] for tool in answer["result"]["tools"])

    def call(self, session_id: str, name: str, arguments: dict | None = None, headers: dict | None = None) -> dict:
        return self.rpc(session_id, "tools/call", {"name": name, "arguments": arguments or {}}, headers=headers)


def text_of(answer: dict) -> str:
    assert "result" in answer, answer
    assert not answer["result"].get("isError"), answer
    return answer["result"]["content"][0]["text"]


def admin_state(gateway: GatewayServer) -> dict:
    response = admin_get(gateway, token=ADMIN_TOKEN)
    assert response.status_code == 200, response.text
    return response.json()


def session_row(state: dict, session_id: str) -> dict:
    return next(row for row in state["sessions"] if row["id"] == session_id)


def received(backend, method: str) -> list:
    return [message for message in backend.received if message.method == method]


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def with_header(token: str, **changes: Any) -> str:
    """The same token with its JOSE header changed (the signature no longer matches it)."""
    head, payload, signature = token.split(".")
    header = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    header.update(changes)
    return f"{_b64url(json.dumps(header).encode())}.{payload}.{signature}"


def assert_unauthorized(response: requests.Response, gateway: GatewayServer, fragment: str, token: str | None) -> None:
    assert response.status_code == 401, (response.status_code, response.text)
    challenge = response.headers.get("WWW-Authenticate", "")
    assert challenge.startswith("Bearer"), challenge
    assert f'resource_metadata="{gateway.base}{METADATA_PATH}"' in challenge, challenge
    assert fragment in response.text.lower(), response.text
    if token:
        assert token not in response.text
        assert token not in challenge
        for part in token.split("."):
            if len(part) > 8:
                assert part not in response.text and part not in challenge


# -- 1. incoming authentication: valid and refused tokens -----------------------------------------


def test_valid_token_opens_a_session_and_serves_tools(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp)))
    alice = Caller(gateway, idp.issue_token("alice", AUD))
    sid = alice.open()
    assert alice.tools(sid) == ["plain_echo", "plain_whoami"]
    assert text_of(alice.call(sid, "plain_echo", {"text": "hi"})) == "plain:hi"


BAD_TOKENS = {
    # case: (make the Authorization header value from the IdP, fragment the 401 body must name)
    "missing": (lambda idp: None, "missing"),
    "not_bearer": (lambda idp: "Basic dXNlcjpwYXNz", "bearer"),
    "malformed": (lambda idp: "Bearer not-a-jwt-at-all", "malformed"),
    "expired": (lambda idp: "Bearer " + idp.expired_token("alice", AUD), "expired"),
    "wrong_audience": (lambda idp: "Bearer " + idp.issue_token("alice", "someone-else"), "audience"),
    "wrong_issuer": (lambda idp: "Bearer " + idp.issue_token("alice", AUD, issuer="https://evil.example"), "issuer"),
    "wrong_key": (lambda idp: "Bearer " + idp.token_signed_by_foreign_key("alice", AUD), "signature"),
    "unknown_kid": (lambda idp: "Bearer " + idp.token_with_unknown_kid("alice", AUD), "unknown key"),
    "alg_none": (lambda idp: "Bearer " + idp.unsigned_token("alice", AUD), "algorithm"),
    "hmac_with_public_key": (lambda idp: "Bearer " + idp.hmac_with_public_key_token("alice", AUD), "algorithm"),
    "not_yet_valid": (lambda idp: "Bearer " + idp.issue_token("alice", AUD, not_before=time.time() + 600), "not valid yet"),
}


@pytest.mark.parametrize("case", list(BAD_TOKENS))
def test_bad_token_is_401_with_challenge_and_reason_without_the_token(case, start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp)))
    make, fragment = BAD_TOKENS[case]
    authorization = make(idp)
    headers = {"Authorization": authorization} if authorization is not None else {}
    response = gateway.post(INIT, headers=headers)
    token = authorization.partition(" ")[2] if authorization else None
    assert_unauthorized(response, gateway, fragment, token)
    assert "Mcp-Session-Id" not in response.headers
    assert plain.received == []  # nothing reached a backend


def test_bad_token_on_an_existing_session_is_401_and_not_forwarded(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp)))
    alice = Caller(gateway, idp.issue_token("alice", AUD))
    sid = alice.open()
    assert alice.tools(sid)
    before = len(plain.received)
    expired = idp.expired_token("alice", AUD)
    response = alice.with_token(expired).post({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                                               "params": {"name": "plain_echo", "arguments": {"text": "x"}}}, sid)
    assert_unauthorized(response, gateway, "expired", expired)
    assert len(plain.received) == before


@pytest.mark.parametrize("signed_with", ["ES256", "RS256"])
def test_token_whose_alg_does_not_match_its_key_is_401_not_500(signed_with, start_gateway, idp, servers):
    """An allowed alg naming the kid of a key of the other type: a wrongly-signed token, so 401."""
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp)))
    other_kid = idp.current_kid if signed_with == "ES256" else idp.ec_kid
    forged = with_header(idp.issue_token("alice", AUD, algorithm=signed_with), kid=other_kid)
    response = gateway.post(INIT, headers=bearer(forged))
    assert_unauthorized(response, gateway, "", forged)


def test_missing_token_challenge_carries_no_error_code(start_gateway, idp, servers):
    """RFC 6750 3.1: a request without credentials gets the bare challenge (no error=)."""
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp)))
    response = gateway.post(INIT)
    assert_unauthorized(response, gateway, "missing", None)
    assert "error=" not in response.headers["WWW-Authenticate"]
    bad = gateway.post(INIT, headers=bearer("garbage"))
    assert 'error="invalid_token"' in bad.headers["WWW-Authenticate"]


def test_get_and_delete_need_a_token_too(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp)))
    sid = Caller(gateway, idp.issue_token("alice", AUD)).open()
    for method in ("GET", "DELETE"):
        response = requests.request(method, gateway.url, headers={"Mcp-Session-Id": sid}, timeout=10)
        assert_unauthorized(response, gateway, "missing", None)


def test_token_with_several_audiences_including_ours_is_accepted(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp)))
    assert gateway.post(INIT, headers=bearer(idp.issue_token("alice", ["other", AUD]))).status_code == 200
    others = idp.issue_token("alice", ["other", "third"])
    assert_unauthorized(gateway.post(INIT, headers=bearer(others)), gateway, "audience", others)


def test_es256_tokens_are_accepted(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp)))
    alice = Caller(gateway, idp.issue_token("alice", AUD, algorithm="ES256"))
    sid = alice.open()
    assert alice.tools(sid) == ["plain_echo", "plain_whoami"]


def test_allowed_algorithms_come_from_config(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp, algorithms=["ES256"])))
    rs256 = idp.issue_token("alice", AUD)
    assert_unauthorized(gateway.post(INIT, headers=bearer(rs256)), gateway, "algorithm", rs256)
    assert gateway.post(INIT, headers=bearer(idp.issue_token("alice", AUD, algorithm="ES256"))).status_code == 200


@pytest.mark.parametrize("algorithm", ["none", "HS256", "hs512"])
def test_config_refuses_none_and_hmac_algorithms(algorithm):
    with pytest.raises(ConfigError) as refused:
        config_from_mapping(gateway_config({"a": "http://127.0.0.1:9/mcp"}, incoming={
            "type": "oidc", "oidc": {"issuer": "https://idp.example", "audience": AUD, "algorithms": [algorithm]}}))
    assert "incomingAuth.oidc.algorithms[0]" in str(refused.value)
    assert algorithm in str(refused.value)


def test_not_before_within_clock_skew_is_accepted_beyond_it_refused(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp, clockSkew="5s")))
    soon = idp.issue_token("alice", AUD, not_before=time.time() + 2)
    assert gateway.post(INIT, headers=bearer(soon)).status_code == 200
    later = idp.issue_token("alice", AUD, not_before=time.time() + 30)
    assert_unauthorized(gateway.post(INIT, headers=bearer(later)), gateway, "not valid yet", later)


def test_expiry_within_clock_skew_is_accepted_beyond_it_refused(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp, clockSkew="20s")))
    just_expired = idp.issue_token("alice", AUD, issued_at=time.time() - 70, expires_in=60)  # 10 s ago
    assert gateway.post(INIT, headers=bearer(just_expired)).status_code == 200
    long_expired = idp.issue_token("alice", AUD, issued_at=time.time() - 100, expires_in=60)  # 40 s ago
    assert_unauthorized(gateway.post(INIT, headers=bearer(long_expired)), gateway, "expired", long_expired)


def test_unreachable_idp_is_503_without_the_token(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    dead_issuer = closed_port_url().removesuffix("/mcp")
    gateway = start_gateway(gateway_config({"plain": plain}, incoming={
        "type": "oidc", "oidc": {"issuer": dead_issuer, "audience": AUD}}))
    token = idp.issue_token("alice", AUD, issuer=dead_issuer)
    response = gateway.post(INIT, headers=bearer(token))
    assert response.status_code == 503, response.text
    assert token not in response.text
    assert dead_issuer.split("//")[1] not in response.text


# -- 2. RFC 9728 metadata, anonymous default ------------------------------------------------------


def test_protected_resource_metadata_names_the_issuer(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp)))
    for path in (METADATA_PATH, METADATA_PATH + "/mcp"):
        response = requests.get(gateway.base + path, timeout=10)  # no token needed
        assert response.status_code == 200, (path, response.text)
        assert response.headers["Content-Type"].startswith("application/json")
        body = response.json()
        assert body["resource"] == gateway.url
        assert body["authorization_servers"] == [idp.issuer]
        assert "header" in body["bearer_methods_supported"]


def test_protected_resource_metadata_advertises_the_configured_resource_url(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp, resourceUrl="https://mcp.example.com/mcp")))
    body = requests.get(gateway.base + METADATA_PATH, timeout=10).json()
    assert body["resource"] == "https://mcp.example.com/mcp"
    assert body["authorization_servers"] == [idp.issuer]
    # The challenge still points at this server's own metadata document.
    response = gateway.post(INIT)
    assert f'resource_metadata="{gateway.base}{METADATA_PATH}"' in response.headers["WWW-Authenticate"]


def test_no_protected_resource_metadata_when_anonymous(start_gateway, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}))
    assert requests.get(gateway.base + METADATA_PATH, timeout=10).status_code == 404


def test_anonymous_is_the_default_and_ignores_bearer_tokens(start_gateway, servers, monkeypatch):
    monkeypatch.setenv("VMCP_ADMIN_TOKEN", ADMIN_TOKEN)
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, admin=True))
    anonymous = Caller(gateway)
    sid = anonymous.open()
    assert anonymous.tools(sid) == ["plain_echo", "plain_whoami"]
    assert Caller(gateway, "whatever-token").open()
    assert session_row(admin_state(gateway), sid)["subject"] == "anonymous"
    assert all("authorization" not in message.headers for message in plain.received)


# -- 3. JWKS: discovery, lazy fetch, cache, rotation, rate limit -----------------------------------


def test_keys_are_found_through_openid_configuration(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp)))
    assert (idp.discovery_fetches, idp.jwks_fetches) == (0, 0)
    Caller(gateway, idp.issue_token("alice", AUD)).open()
    assert (idp.discovery_fetches, idp.jwks_fetches) == (1, 1)
    Caller(gateway, idp.issue_token("bob", AUD)).open()
    assert (idp.discovery_fetches, idp.jwks_fetches) == (1, 1)


def test_configured_jwks_url_skips_discovery(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp, jwksUrl=idp.jwks_url)))
    Caller(gateway, idp.issue_token("alice", AUD)).open()
    assert (idp.discovery_fetches, idp.jwks_fetches) == (0, 1)


def test_jwks_is_fetched_lazily_and_cached(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp, jwksUrl=idp.jwks_url)))
    time.sleep(0.1)  # an absence (no fetch at start): nothing to wait for, only time to let one happen
    assert idp.jwks_fetches == 0
    Caller(gateway, idp.issue_token("alice", AUD)).open()
    assert idp.jwks_fetches == 1
    for i in range(10):
        algorithm = "ES256" if i % 2 else None
        assert gateway.post(INIT, headers=bearer(idp.issue_token(f"user{i}", AUD, algorithm=algorithm))).status_code == 200
    assert idp.jwks_fetches == 1


def test_rotated_key_is_picked_up_with_one_refetch(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp, jwksUrl=idp.jwks_url)))
    Caller(gateway, idp.issue_token("alice", AUD)).open()
    assert idp.jwks_fetches == 1
    new_kid = idp.rotate_rsa_key()
    for _ in range(3):
        token = idp.issue_token("alice", AUD, kid=new_kid)
        response = gateway.post(INIT, headers=bearer(token))
        assert response.status_code == 200, response.text
    assert idp.jwks_fetches == 2


def test_unknown_kids_cannot_hammer_the_idp(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp, jwksUrl=idp.jwks_url)))
    Caller(gateway, idp.issue_token("alice", AUD)).open()
    assert idp.jwks_fetches == 1
    for i in range(20):
        token = with_header(idp.issue_token("mallory", AUD), kid=f"made-up-{i}")
        assert_unauthorized(gateway.post(INIT, headers=bearer(token)), gateway, "unknown key", token)
    assert idp.jwks_fetches <= 2
    # The valid keys still work while unknown kids are being refused.
    assert gateway.post(INIT, headers=bearer(idp.issue_token("alice", AUD))).status_code == 200


def test_unknown_kid_refetch_is_allowed_again_after_the_interval(start_gateway, idp, servers, monkeypatch):
    monkeypatch.setattr(web_auth, "MIN_JWKS_REFETCH", 1.0)  # the five below fit in it, even under load
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp, jwksUrl=idp.jwks_url)))
    Caller(gateway, idp.issue_token("alice", AUD)).open()
    for i in range(5):
        gateway.post(INIT, headers=bearer(with_header(idp.issue_token("m", AUD), kid=f"x{i}")))
    fetches = idp.jwks_fetches
    assert fetches <= 2
    new_kid = idp.rotate_rsa_key()

    def accepted() -> bool:
        return gateway.post(INIT, headers=bearer(idp.issue_token("alice", AUD, kid=new_kid))).status_code == 200

    # Refused without a fetch until the interval has passed; then one refetch finds the new key.
    assert wait_until(accepted, timeout=10, interval=0.1)
    assert idp.jwks_fetches == fetches + 1


class FailingJwksIdP(LocalIdP):
    """A LocalIdP whose JWKS endpoint answers 503 while ``jwks_down`` is set (fetches still counted)."""

    jwks_down = True

    async def _jwks(self, request: Any) -> Any:
        from starlette.responses import Response

        if not self.jwks_down:
            return await super()._jwks(request)
        with self._lock:
            self._jwks_fetches += 1
        return Response("unavailable", status_code=503)


def test_failing_jwks_endpoint_is_not_hammered_by_every_request(start_gateway, servers, monkeypatch):
    monkeypatch.setattr(web_auth, "JWKS_RETRY_AFTER_FAILURE", 1.0)  # the twenty below fit in two, even under load
    provider = FailingJwksIdP().start()
    try:
        plain = servers(header_backend("plain"))
        gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(provider, jwksUrl=provider.jwks_url)))
        for i in range(20):
            response = gateway.post(INIT, headers=bearer(provider.issue_token(f"user{i}", AUD)))
            assert response.status_code == 503, response.text
        fetches = provider.jwks_fetches
        assert fetches <= 2
        provider.jwks_down = False

        def accepted() -> bool:
            return gateway.post(INIT, headers=bearer(provider.issue_token("alice", AUD))).status_code == 200

        # Refused without a fetch until the retry is due; then one fetch, and the keys are there.
        assert wait_until(accepted, timeout=10, interval=0.1)
        assert provider.jwks_fetches == fetches + 1
    finally:
        provider.stop()


# -- 4. sessions belong to a person ----------------------------------------------------------------


def test_session_hijack_gets_404_like_an_unknown_session(start_gateway, idp, servers, monkeypatch):
    monkeypatch.setenv("VMCP_ADMIN_TOKEN", ADMIN_TOKEN)
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues"], "bob": ["issues"]}))
    gateway = start_gateway(gateway_config(
        {"jira": jira}, incoming=oidc(idp), outgoing={"backends": {"jira": exchange(idp, "jira-api")}}, admin=True))
    alice = Caller(gateway, idp.issue_token("alice", AUD))
    bob = Caller(gateway, idp.issue_token("bob", AUD))
    sid = alice.open()
    assert text_of(alice.call(sid, "jira_issues")) == "jira:issues:alice"
    seen_by_backend = len(jira.received)
    exchanges = len(idp.exchanges)
    time.sleep(0.4)  # real time: the session's idle clock, checked below, has run this long

    call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "jira_issues", "arguments": {}}}
    hijack = bob.post(call, sid)
    unknown = bob.post(call, "0" * 32)
    assert hijack.status_code == unknown.status_code == 404
    assert hijack.json() == unknown.json()
    assert bob.post({"jsonrpc": "2.0", "id": 10, "method": "tools/list"}, sid).status_code == 404
    assert bob.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid).status_code == 404
    delete = requests.delete(gateway.url, headers={"Mcp-Session-Id": sid, **bearer(bob.token)}, timeout=10)
    assert delete.status_code == 404

    # Nothing of the intruder reached a backend or the IdP, and the session was not touched.
    assert len(jira.received) == seen_by_backend
    assert len(idp.exchanges) == exchanges
    assert {message.subject for message in jira.received} == {"alice"}
    row = session_row(admin_state(gateway), sid)
    assert row["subject"] == "alice"
    assert row["idleSeconds"] >= 0.35  # the intruder's requests did not reset the idle clock
    # The owner's session still works.
    assert text_of(alice.call(sid, "jira_issues")) == "jira:issues:alice"


def test_refreshed_token_keeps_the_session_and_is_exchanged_anew(start_gateway, idp, servers):
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues"]}))
    gateway = start_gateway(gateway_config(
        {"jira": jira}, incoming=oidc(idp), outgoing={"backends": {"jira": exchange(idp, "jira-api")}}))
    alice = Caller(gateway, idp.issue_token("alice", AUD, expires_in=60))
    sid = alice.open()
    assert text_of(alice.call(sid, "jira_issues")) == "jira:issues:alice"
    assert [(r.subject, r.outcome) for r in idp.exchanges] == [("alice", "issued")]
    first_backend_token = received(jira, "tools/call")[-1].claims["jti"]

    refreshed = alice.with_token(idp.issue_token("alice", AUD, expires_in=300))
    assert text_of(refreshed.call(sid, "jira_issues")) == "jira:issues:alice"
    assert [(r.subject, r.outcome) for r in idp.exchanges] == [("alice", "issued"), ("alice", "issued")]
    assert received(jira, "tools/call")[-1].claims["jti"] != first_backend_token  # the backend sees the new token
    assert refreshed.tools(sid) == ["jira_issues"]
    ended = requests.delete(gateway.url, headers={"Mcp-Session-Id": sid, **bearer(refreshed.token)}, timeout=10)
    assert ended.status_code == 200


def test_refreshed_token_keeps_the_session_without_outgoing_auth(start_gateway, idp, servers):
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp)))
    alice = Caller(gateway, idp.issue_token("alice", AUD))
    sid = alice.open()
    assert alice.tools(sid)
    assert text_of(alice.with_token(idp.issue_token("alice", AUD, algorithm="ES256")).call(
        sid, "plain_echo", {"text": "again"})) == "plain:again"


def test_admin_state_shows_the_subject_never_the_token(start_gateway, idp, servers, monkeypatch):
    monkeypatch.setenv("VMCP_ADMIN_TOKEN", ADMIN_TOKEN)
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues"], "bob": ["issues"]}))
    gateway = start_gateway(gateway_config(
        {"jira": jira}, incoming=oidc(idp), outgoing={"backends": {"jira": exchange(idp, "jira-api")}}, admin=True))
    tokens = {"alice": idp.issue_token("alice", AUD), "bob": idp.issue_token("bob", AUD)}
    sessions = {}
    for user, token in tokens.items():
        caller = Caller(gateway, token)
        sessions[user] = caller.open()
        assert text_of(caller.call(sessions[user], "jira_issues")) == f"jira:issues:{user}"
    response = admin_get(gateway, token=ADMIN_TOKEN)
    state = response.json()
    assert {user: session_row(state, sid)["subject"] for user, sid in sessions.items()} == {"alice": "alice", "bob": "bob"}
    for token in tokens.values():
        assert token not in response.text
    assert not JWT_PATTERN.search(response.text)
    assert CLIENT_SECRET not in response.text


def test_end_user_jwt_does_not_open_admin(start_gateway, idp, servers, monkeypatch):
    monkeypatch.setenv("VMCP_ADMIN_TOKEN", ADMIN_TOKEN)
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"plain": plain}, incoming=oidc(idp), admin=True))
    user_jwt = idp.issue_token("alice", AUD)
    Caller(gateway, user_jwt).open()
    refused = admin_get(gateway, token=user_jwt)
    assert refused.status_code == 401
    assert user_jwt not in refused.text
    assert admin_get(gateway).status_code == 401
    assert admin_get(gateway, token=ADMIN_TOKEN).status_code == 200
    # ... and the admin token is no end-user credential either.
    as_user = gateway.post(INIT, headers=bearer(ADMIN_TOKEN))
    assert as_user.status_code == 401
    assert ADMIN_TOKEN not in as_user.text and ADMIN_TOKEN not in as_user.headers.get("WWW-Authenticate", "")


# -- 5. per-user discovery -------------------------------------------------------------------------


def _sdk_view(url: str, token: str, own_tool: str, foreign_tool: str,
              mode: str = "legacy") -> tuple[list[str], str, int | None]:
    """The official SDK client with a bearer header: (tools, own tool's text, foreign call's error code)."""
    import httpx2
    import mcp
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    async def main():
        async with httpx2.AsyncClient(headers=bearer(token), timeout=30) as http:
            async with mcp.Client(streamable_http_client(url, http_client=http), mode=mode) as client:
                names = sorted(tool.name for tool in (await client.list_tools()).tools)
                own = (await client.call_tool(own_tool, {})).content[0].text
                try:
                    await client.call_tool(foreign_tool, {})
                    code = None
                except MCPError as error:
                    code = error.error.code
                return names, own, code

    return asyncio.run(main())


@pytest.mark.parametrize("mode", ["legacy", "auto"])  # auto: MCP 2026-07-28, no session
def test_two_users_see_their_own_tools_with_the_sdk_client(start_gateway, idp, servers, mode):
    jira = servers(authed_backend("jira", idp, "jira-api",
                                  {"alice": ["issues", "admin_panel"], "bob": ["issues", "reports"]}))
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config(
        {"jira": jira, "plain": plain}, incoming=oidc(idp), outgoing={"backends": {"jira": exchange(idp, "jira-api")}}))
    alice = _sdk_view(gateway.url, idp.issue_token("alice", AUD), "jira_admin_panel", "jira_reports", mode)
    bob = _sdk_view(gateway.url, idp.issue_token("bob", AUD), "jira_reports", "jira_admin_panel", mode)
    assert alice == (["jira_admin_panel", "jira_issues", "plain_echo", "plain_whoami"], "jira:admin_panel:alice", INVALID_PARAMS)
    assert bob == (["jira_issues", "jira_reports", "plain_echo", "plain_whoami"], "jira:reports:bob", INVALID_PARAMS)
    # The backend never served a tool to the wrong person.
    calls = [(m.subject, m.params["name"]) for m in received(jira, "tools/call")]
    assert sorted(calls) == [("alice", "admin_panel"), ("bob", "reports")]


def test_other_users_tool_is_invalid_params_and_never_reaches_the_backend(start_gateway, idp, servers):
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["admin_panel"], "bob": ["reports"]}))
    gateway = start_gateway(gateway_config(
        {"jira": jira}, incoming=oidc(idp), outgoing={"backends": {"jira": exchange(idp, "jira-api")}}))
    alice, bob = Caller(gateway, idp.issue_token("alice", AUD)), Caller(gateway, idp.issue_token("bob", AUD))
    alice_sid, bob_sid = alice.open(), bob.open()
    assert alice.tools(alice_sid) == ["jira_admin_panel"]
    assert bob.tools(bob_sid) == ["jira_reports"]
    assert alice.call(alice_sid, "jira_reports")["error"]["code"] == INVALID_PARAMS
    assert bob.call(bob_sid, "jira_admin_panel")["error"]["code"] == INVALID_PARAMS
    assert received(jira, "tools/call") == []


def test_concurrent_users_never_see_each_others_identity(start_gateway, idp, servers):
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues"], "bob": ["issues"], "carol": ["issues"]}))
    gateway = start_gateway(gateway_config(
        {"jira": jira}, incoming=oidc(idp), outgoing={"backends": {"jira": exchange(idp, "jira-api")}}))
    users = {name: Caller(gateway, idp.issue_token(name, AUD)) for name in ("alice", "bob", "carol")}
    sessions = {name: caller.open() for name, caller in users.items()}
    wrong: list[tuple[str, str]] = []

    def work(name: str) -> None:
        for _ in range(8):
            got = text_of(users[name].call(sessions[name], "jira_issues"))
            if got != f"jira:issues:{name}":
                wrong.append((name, got))

    threads = [threading.Thread(target=work, args=(name,)) for name in users for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert wrong == []
    assert len(received(jira, "tools/call")) == 48
    assert sorted(r.subject for r in idp.successful_exchanges()) == ["alice", "bob", "carol"]


def test_two_users_never_share_actors_or_backend_sessions_nor_do_one_users_sessions(start_gateway, idp, servers):
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues"], "bob": ["issues"]}))
    gateway = start_gateway(gateway_config(
        {"jira": jira}, incoming=oidc(idp), outgoing={"backends": {"jira": exchange(idp, "jira-api")}}))
    alice, bob = Caller(gateway, idp.issue_token("alice", AUD)), Caller(gateway, idp.issue_token("bob", AUD))
    alice_sessions = [alice.open(), alice.open()]
    bob_session = bob.open()
    for sid in alice_sessions:
        assert text_of(alice.call(sid, "jira_issues")) == "jira:issues:alice"
    assert text_of(bob.call(bob_session, "jira_issues")) == "jira:issues:bob"

    backend_sessions: dict[str, set[str]] = {}
    for message in received(jira, "tools/call"):
        backend_sessions.setdefault(message.subject, set()).add(message.session_id)
    # Each client session has its own backend session, as two direct clients would.
    assert {who: len(ids) for who, ids in backend_sessions.items()} == {"alice": 2, "bob": 1}
    assert backend_sessions["alice"].isdisjoint(backend_sessions["bob"])
    actors = [ref.actor_class.__name__ for ref in pykka.ActorRegistry.get_all()]
    assert actors.count("UserActor") == 3 and actors.count("BackendConnection") == 3
    assert len(received(jira, "initialize")) == 3
    # The person's token was exchanged once: their sessions share the exchanged token.
    assert sorted(r.subject for r in idp.successful_exchanges()) == ["alice", "bob"]


# -- 6. token exchange -----------------------------------------------------------------------------


def test_token_exchange_request_follows_rfc_8693(start_gateway, idp, servers):
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues"]}))
    gateway = start_gateway(gateway_config({"jira": jira}, incoming=oidc(idp), outgoing={
        "backends": {"jira": exchange(idp, "jira-api", scopes=("read", "write"))}}))
    alice = Caller(gateway, idp.issue_token("alice", AUD))
    sid = alice.open()
    assert text_of(alice.call(sid, "jira_issues")) == "jira:issues:alice"
    [record] = idp.exchanges
    assert record.outcome == "issued"
    assert record.grant_type == TOKEN_EXCHANGE_GRANT
    assert record.client_id == CLIENT_ID
    assert record.auth_method in ("client_secret_basic", "client_secret_post")
    assert record.subject == "alice"  # the subject token was the caller's own token
    assert record.audiences == ("jira-api",)
    assert record.scopes == ("read", "write")
    # The backend got the exchanged token: its audience, scopes and the gateway as actor.
    for message in jira.received:
        assert message.subject == "alice"
        assert message.audience == "jira-api"
        assert message.scope == "read write"
        assert message.claims["act"] == {"sub": CLIENT_ID}


def test_exchange_failure_isolates_that_backend(start_gateway, idp, servers, caplog):
    caplog.set_level(logging.WARNING)
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues"]}))
    wiki = servers(authed_backend("wiki", idp, "wiki-api", {"alice": ["pages"]}))
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"jira": jira, "wiki": wiki, "plain": plain}, incoming=oidc(idp), outgoing={
        "backends": {"jira": exchange(idp, "jira-api"), "wiki": exchange(idp, "wiki-api")}}))
    idp.deny_audiences = {"wiki-api"}
    alice = Caller(gateway, idp.issue_token("alice", AUD))
    sid = alice.open()
    assert alice.tools(sid) == ["jira_issues", "plain_echo", "plain_whoami"]
    assert text_of(alice.call(sid, "jira_issues")) == "jira:issues:alice"
    assert text_of(alice.call(sid, "plain_echo", {"text": "ok"})) == "plain:ok"
    assert alice.call(sid, "wiki_pages")["error"]["code"] == INVALID_PARAMS
    assert wiki.received == [] and wiki.rejections == []  # no request without a token
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("wiki" in line and "invalid_target" in line for line in warnings), warnings


def test_exchange_failure_is_for_that_user_only(start_gateway, idp, servers):
    wiki = servers(authed_backend("wiki", idp, "wiki-api", {"alice": ["pages"], "bob": ["pages"]}))
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"wiki": wiki, "plain": plain}, incoming=oidc(idp), outgoing={
        "backends": {"wiki": exchange(idp, "wiki-api")}}))
    alice, bob = Caller(gateway, idp.issue_token("alice", AUD)), Caller(gateway, idp.issue_token("bob", AUD))
    alice_sid, bob_sid = alice.open(), bob.open()
    idp.fail_next_exchanges(1, "invalid_target", 400)
    assert alice.tools(alice_sid) == ["plain_echo", "plain_whoami"]
    assert bob.tools(bob_sid) == ["plain_echo", "plain_whoami", "wiki_pages"]
    assert text_of(bob.call(bob_sid, "wiki_pages")) == "wiki:pages:bob"
    assert [(r.subject, r.outcome) for r in idp.exchanges][-1] == ("bob", "issued")


def test_exchanged_token_is_reused_across_calls(start_gateway, idp, servers):
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues"]}))
    wiki = servers(authed_backend("wiki", idp, "wiki-api", {"alice": ["pages"]}))
    gateway = start_gateway(gateway_config({"jira": jira, "wiki": wiki}, incoming=oidc(idp), outgoing={
        "backends": {"jira": exchange(idp, "jira-api"), "wiki": exchange(idp, "wiki-api")}}))
    alice = Caller(gateway, idp.issue_token("alice", AUD))
    sid = alice.open()
    for _ in range(5):
        assert text_of(alice.call(sid, "jira_issues")) == "jira:issues:alice"
        assert text_of(alice.call(sid, "wiki_pages")) == "wiki:pages:alice"
    # A second session with the same token reuses the same exchanged tokens too.
    other = alice.open()
    assert text_of(alice.call(other, "jira_issues")) == "jira:issues:alice"
    assert sorted(r.audience for r in idp.successful_exchanges()) == ["jira-api", "wiki-api"]
    assert len(idp.exchanges) == 2
    assert len({m.claims["jti"] for m in jira.received}) == 1  # one exchanged token for every jira request


def test_exchanged_token_is_renewed_shortly_before_expiry(start_gateway, idp, servers):
    idp.exchange_expires_in = 2  # the gateway renews 10 % early: after 1.8 s
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues"]}))
    gateway = start_gateway(gateway_config({"jira": jira}, incoming=oidc(idp), outgoing={
        "backends": {"jira": exchange(idp, "jira-api")}}))
    alice = Caller(gateway, idp.issue_token("alice", AUD))
    sid = alice.open()
    assert text_of(alice.call(sid, "jira_issues")) == "jira:issues:alice"
    assert text_of(alice.call(sid, "jira_issues")) == "jira:issues:alice"
    assert len(idp.successful_exchanges()) == 1
    first = idp.successful_exchanges()[0].at
    time.sleep(max(0.0, first + 1.9 - time.monotonic()))  # real time: past the renewal point (1.8 s)
    assert text_of(alice.call(sid, "jira_issues")) == "jira:issues:alice"
    exchanges = idp.successful_exchanges()
    assert len(exchanges) == 2
    assert exchanges[1].at - first >= 1.7
    assert len(jira.rejections) == 0  # no request went out with an expired token


def test_exchanged_tokens_are_never_shared_between_users(start_gateway, idp, servers):
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues"], "bob": ["issues"]}))
    gateway = start_gateway(gateway_config({"jira": jira}, incoming=oidc(idp), outgoing={
        "backends": {"jira": exchange(idp, "jira-api")}}))
    users = {name: Caller(gateway, idp.issue_token(name, AUD)) for name in ("alice", "bob")}
    sessions = {name: caller.open() for name, caller in users.items()}
    for _ in range(3):
        for name, caller in users.items():
            assert text_of(caller.call(sessions[name], "jira_issues")) == f"jira:issues:{name}"
    assert sorted(r.subject for r in idp.successful_exchanges()) == ["alice", "bob"]
    jti_by_subject: dict[str, set] = {}
    for message in jira.received:
        jti_by_subject.setdefault(message.subject, set()).add(message.claims["jti"])
    assert set(jti_by_subject) == {"alice", "bob"}
    assert not jti_by_subject["alice"] & jti_by_subject["bob"]


def test_concurrent_calls_of_one_user_share_one_exchange(start_gateway, idp, servers):
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues"]}))
    gateway = start_gateway(gateway_config({"jira": jira}, incoming=oidc(idp), outgoing={
        "backends": {"jira": exchange(idp, "jira-api")}}))
    alice = Caller(gateway, idp.issue_token("alice", AUD))
    sids = [alice.open() for _ in range(4)]
    results: list[str] = []

    def work(sid):
        results.append(text_of(alice.call(sid, "jira_issues")))

    threads = [threading.Thread(target=work, args=(sid,)) for sid in sids for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == ["jira:issues:alice"] * 8
    assert len(idp.exchanges) == 1


# -- 7. header injection and passthrough -----------------------------------------------------------


def test_header_injection_from_env_reaches_the_backend(start_gateway, servers, monkeypatch):
    monkeypatch.setenv("SVC_API_KEY", INJECTED)
    svc = servers(header_backend("svc", required_header="X-Api-Key", expected_value=INJECTED))
    gateway = start_gateway(gateway_config({"svc": svc}, outgoing={"backends": {"svc": {
        "type": "header_injection", "headerInjection": {"headerName": "X-Api-Key", "headerValueEnv": "SVC_API_KEY"}}}}))
    caller = Caller(gateway)
    sid = caller.open()
    assert caller.tools(sid) == ["svc_echo", "svc_whoami"]
    assert text_of(caller.call(sid, "svc_echo", {"text": "k"})) == "svc:k"
    assert svc.rejections == []
    assert {m.headers["x-api-key"] for m in svc.received} == {INJECTED}
    assert {"initialize", "tools/list", "tools/call"} <= {m.method for m in svc.received}


def test_header_injection_with_a_literal_value(start_gateway, servers):
    svc = servers(header_backend("svc", required_header="X-Api-Key", expected_value="literal-key"))
    other = servers(header_backend("other"))
    gateway = start_gateway(gateway_config({"svc": svc, "other": other}, outgoing={"backends": {"svc": {
        "type": "header_injection", "headerInjection": {"headerName": "X-Api-Key", "headerValue": "literal-key"}}}}))
    caller = Caller(gateway)
    sid = caller.open()
    assert text_of(caller.call(sid, "svc_echo", {"text": "lit"})) == "svc:lit"
    assert svc.rejections == []
    assert all("x-api-key" not in m.headers for m in other.received)  # only the configured backend gets it


@pytest.mark.parametrize("where", ["backend", "default"])
@pytest.mark.parametrize("value", [None, ""])
def test_unset_header_env_var_is_a_startup_error_naming_it(where, value, servers, monkeypatch):
    if value is None:
        monkeypatch.delenv("SVC_API_KEY", raising=False)
    else:
        monkeypatch.setenv("SVC_API_KEY", value)
    svc = servers(header_backend("svc"))
    auth = {"type": "header_injection", "headerInjection": {"headerName": "X-Api-Key", "headerValueEnv": "SVC_API_KEY"}}
    outgoing = {"backends": {"svc": auth}} if where == "backend" else {"default": auth}
    server = GatewayServer(gateway_config({"svc": svc}, outgoing=outgoing))
    with pytest.raises(ConfigError) as refused:
        server.start()
    message = str(refused.value)
    assert "SVC_API_KEY" in message
    path = "outgoingAuth.backends.svc" if where == "backend" else "outgoingAuth.default"
    assert f"{path}.headerInjection.headerValueEnv" in message
    assert svc.received == []


def test_unset_client_secret_env_var_is_a_startup_error_naming_it(idp, servers, monkeypatch):
    monkeypatch.delenv("EX_SECRET")
    jira = servers(authed_backend("jira", idp, "jira-api", {}))
    server = GatewayServer(gateway_config({"jira": jira}, incoming=oidc(idp), outgoing={
        "backends": {"jira": exchange(idp, "jira-api")}}))
    with pytest.raises(ConfigError) as refused:
        server.start()
    assert "EX_SECRET" in str(refused.value)
    assert "outgoingAuth.backends.jira.tokenExchange.clientSecretEnv" in str(refused.value)
    assert idp.token_requests == 0


def test_passthrough_headers_are_forwarded_to_every_backend(start_gateway, servers):
    a, b = servers(header_backend("a")), servers(header_backend("b"))
    gateway = start_gateway(gateway_config({"a": a, "b": b}, outgoing={"passthroughHeaders": ["X-Request-Id"]}))
    caller = Caller(gateway)
    sid = caller.open()
    extra = {"X-Request-Id": "req-1", "X-Not-Listed": "nope"}
    assert caller.tools(sid, headers=extra) == ["a_echo", "a_whoami", "b_echo", "b_whoami"]
    assert text_of(caller.call(sid, "a_echo", {"text": "1"}, headers={**extra, "X-Request-Id": "req-a"})) == "a:1"
    assert text_of(caller.call(sid, "b_echo", {"text": "2"}, headers={**extra, "X-Request-Id": "req-b"})) == "b:2"
    for backend, expected in ((a, "req-a"), (b, "req-b")):
        assert received(backend, "tools/list")[0].headers.get("x-request-id") == "req-1"
        assert received(backend, "tools/call")[-1].headers.get("x-request-id") == expected  # per request
        assert all("x-not-listed" not in m.headers for m in backend.received)


def test_caller_token_is_never_forwarded_to_backends(start_gateway, idp, servers):
    a, b = servers(header_backend("a")), servers(header_backend("b"))
    gateway = start_gateway(gateway_config({"a": a, "b": b}, incoming=oidc(idp),
                                           outgoing={"passthroughHeaders": ["X-Request-Id"]}))
    token = idp.issue_token("alice", AUD)
    caller = Caller(gateway, token, headers={"X-Request-Id": "r", "Cookie": "sid=abc"})
    sid = caller.open()
    assert text_of(caller.call(sid, "a_echo", {"text": "x"})) == "a:x"
    assert text_of(caller.call(sid, "b_echo", {"text": "y"})) == "b:y"
    for backend in (a, b):
        assert backend.received
        for message in backend.received:
            assert "authorization" not in message.headers
            assert "cookie" not in message.headers
            assert token not in json.dumps(dict(message.headers))


def test_backend_auth_header_wins_over_a_passthrough_header_of_the_same_name(start_gateway, servers, monkeypatch):
    monkeypatch.setenv("SVC_API_KEY", INJECTED)
    svc = servers(header_backend("svc", required_header="X-Api-Key", expected_value=INJECTED))
    gateway = start_gateway(gateway_config({"svc": svc}, outgoing={
        "backends": {"svc": {"type": "header_injection",
                             "headerInjection": {"headerName": "X-Api-Key", "headerValueEnv": "SVC_API_KEY"}}},
        "passthroughHeaders": ["X-Api-Key"]}))
    caller = Caller(gateway, headers={"X-Api-Key": "spoofed-by-client"})
    sid = caller.open()
    assert text_of(caller.call(sid, "svc_echo", {"text": "z"})) == "svc:z"
    assert {m.headers["x-api-key"] for m in svc.received} == {INJECTED}
    assert svc.rejections == []


@pytest.mark.parametrize("header", ["Authorization", "authorization", "Cookie", "Host", "Connection",
                                    "Transfer-Encoding", "Proxy-Authorization"])
def test_passthrough_refuses_credential_and_hop_by_hop_headers(header):
    with pytest.raises(ConfigError) as refused:
        config_from_mapping(gateway_config({"a": "http://127.0.0.1:9/mcp"},
                                           outgoing={"passthroughHeaders": ["X-Request-Id", header]}))
    message = str(refused.value)
    assert "outgoingAuth.passthroughHeaders[1]" in message
    assert header in message
    assert "not allowed" in message


# -- 8. discovery cache ----------------------------------------------------------------------------


def _cache_gateway(start_gateway, idp, servers, ttl: str | None = None, admin: bool = True):
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues"], "bob": ["reports"]}))
    operational = {"discoveryCacheTTL": ttl} if ttl is not None else None
    gateway = start_gateway(gateway_config({"jira": jira}, incoming=oidc(idp), outgoing={
        "backends": {"jira": exchange(idp, "jira-api")}}, operational=operational, admin=admin))
    return jira, gateway


def test_discovery_cache_serves_a_second_session_of_the_same_user(start_gateway, idp, servers, monkeypatch):
    monkeypatch.setenv("VMCP_ADMIN_TOKEN", ADMIN_TOKEN)
    jira, gateway = _cache_gateway(start_gateway, idp, servers)  # default TTL (30 s)
    alice = Caller(gateway, idp.issue_token("alice", AUD))
    first = alice.open()
    assert alice.tools(first) == ["jira_issues"]
    assert len(received(jira, "tools/list")) == 1
    again = alice.with_token(idp.issue_token("alice", AUD))  # reconnecting with a fresh token: same person
    second = again.open()
    assert again.tools(second) == ["jira_issues"]
    assert len(received(jira, "tools/list")) == 1
    state = admin_state(gateway)
    assert state["discoveryCache"]["hits"] >= 1
    assert session_row(state, second)["catalogFromCache"] is True
    assert session_row(state, first)["catalogFromCache"] is False
    assert text_of(again.call(second, "jira_issues")) == "jira:issues:alice"  # a cached catalog still routes


def test_discovery_cache_is_per_user(start_gateway, idp, servers, monkeypatch):
    monkeypatch.setenv("VMCP_ADMIN_TOKEN", ADMIN_TOKEN)
    jira, gateway = _cache_gateway(start_gateway, idp, servers, ttl="30s")
    alice, bob = Caller(gateway, idp.issue_token("alice", AUD)), Caller(gateway, idp.issue_token("bob", AUD))
    assert alice.tools(alice.open()) == ["jira_issues"]
    bob_sid = bob.open()
    assert bob.tools(bob_sid) == ["jira_reports"]
    assert [m.subject for m in received(jira, "tools/list")] == ["alice", "bob"]
    state = admin_state(gateway)
    assert state["discoveryCache"]["hits"] == 0
    assert session_row(state, bob_sid)["catalogFromCache"] is False


def test_discovery_cache_ttl_zero_disables_it(start_gateway, idp, servers, monkeypatch):
    monkeypatch.setenv("VMCP_ADMIN_TOKEN", ADMIN_TOKEN)
    jira, gateway = _cache_gateway(start_gateway, idp, servers, ttl="0")
    alice = Caller(gateway, idp.issue_token("alice", AUD))
    sids = [alice.open() for _ in range(2)]
    for sid in sids:
        assert alice.tools(sid) == ["jira_issues"]
    assert len(received(jira, "tools/list")) == 2
    state = admin_state(gateway)
    assert state["discoveryCache"]["hits"] == 0
    assert not any(row["catalogFromCache"] for row in state["sessions"])


def test_discovery_cache_entry_expires_after_the_ttl(start_gateway, idp, servers, monkeypatch):
    monkeypatch.setenv("VMCP_ADMIN_TOKEN", ADMIN_TOKEN)
    jira, gateway = _cache_gateway(start_gateway, idp, servers, ttl="200ms")
    alice = Caller(gateway, idp.issue_token("alice", AUD))
    assert alice.tools(alice.open()) == ["jira_issues"]
    time.sleep(0.3)  # real time: past the entry's TTL
    assert alice.tools(alice.open()) == ["jira_issues"]
    assert len(received(jira, "tools/list")) == 2


def test_failed_discovery_is_not_cached(start_gateway, idp, servers, monkeypatch):
    monkeypatch.setenv("VMCP_ADMIN_TOKEN", ADMIN_TOKEN)
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues"]}))
    wiki = servers(authed_backend("wiki", idp, "wiki-api", {"alice": ["pages"]}))
    gateway = start_gateway(gateway_config({"jira": jira, "wiki": wiki}, incoming=oidc(idp), outgoing={
        "backends": {"jira": exchange(idp, "jira-api"), "wiki": exchange(idp, "wiki-api")}}, admin=True))
    idp.deny_audiences = {"wiki-api"}
    alice = Caller(gateway, idp.issue_token("alice", AUD))
    first = alice.open()
    assert alice.tools(first) == ["jira_issues"]
    idp.deny_audiences = set()
    second = alice.open()
    assert alice.tools(second) == ["jira_issues", "wiki_pages"]
    assert text_of(alice.call(second, "wiki_pages")) == "wiki:pages:alice"
    state = admin_state(gateway)
    assert session_row(state, second)["catalogFromCache"] is False
    # Now complete, the catalog is cached: a third session discovers nothing again.
    lists = len(received(jira, "tools/list"))
    third = alice.open()
    assert alice.tools(third) == ["jira_issues", "wiki_pages"]
    assert len(received(jira, "tools/list")) == lists


# -- 9. nothing contacted at start -----------------------------------------------------------------


def test_no_backend_or_idp_is_contacted_at_start_with_auth(start_gateway, idp, servers, monkeypatch):
    monkeypatch.setenv("SVC_API_KEY", INJECTED)
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues"]}))
    svc = servers(header_backend("svc", required_header="X-Api-Key", expected_value=INJECTED))
    gateway = start_gateway(gateway_config({"jira": jira, "svc": svc}, incoming=oidc(idp), outgoing={
        "backends": {"jira": exchange(idp, "jira-api"), "svc": {"type": "header_injection", "headerInjection": {
            "headerName": "X-Api-Key", "headerValueEnv": "SVC_API_KEY"}}}}))
    time.sleep(0.3)  # an absence (no contact at start): nothing to wait for, only time to let one happen
    assert (idp.discovery_fetches, idp.jwks_fetches, idp.token_requests) == (0, 0, 0)
    assert (jira.received, jira.rejections, svc.received, svc.rejections) == ([], [], [], [])
    alice = Caller(gateway, idp.issue_token("alice", AUD))
    sid = alice.open()
    assert idp.token_requests == 0 and jira.received == [] and svc.received == []  # a session alone contacts no backend
    assert alice.tools(sid) == ["jira_issues", "svc_echo", "svc_whoami"]
    assert idp.token_requests == 1 and jira.received and svc.received


def test_no_backend_is_contacted_at_start_without_auth(start_gateway, servers):
    a = servers(restartable_backend("a"))
    gateway = start_gateway(gateway_config({"a": a}))
    time.sleep(0.3)  # an absence (no contact at start): nothing to wait for, only time to let one happen
    assert a.received == []
    assert requests.get(gateway.base + "/readyz", timeout=10).status_code == 200
    assert Caller(gateway).open()
    assert a.received == []  # a session alone contacts no backend either


# -- 10. secrets -----------------------------------------------------------------------------------


def test_no_secret_in_logs_responses_admin_or_errors(start_gateway, idp, servers, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("SVC_API_KEY", INJECTED)
    monkeypatch.setenv("VMCP_ADMIN_TOKEN", ADMIN_TOKEN)
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues"]}))
    svc = servers(header_backend("svc", required_header="X-Api-Key", expected_value=INJECTED))
    slow = servers(delayed_backend(0.0, name="slow"))
    gone = servers(restartable_backend("gone"))
    down_url = closed_port_url()
    backends = {"jira": jira, "svc": svc, "slow": slow, "gone": gone, "down": down_url}
    gateway = start_gateway(gateway_config(
        backends,
        incoming=oidc(idp),
        outgoing={
            "backends": {
                "jira": exchange(idp, "jira-api"),
                "svc": {"type": "header_injection",
                        "headerInjection": {"headerName": "X-Api-Key", "headerValueEnv": "SVC_API_KEY"}},
            },
            "passthroughHeaders": ["X-Request-Id"],
        },
        operational={"timeouts": {"default": "5s", "perWorkload": {"slow": "1s", "down": "1s"}}},
        admin=True,
    ))
    transcript: list[requests.Response] = []
    tokens = [idp.issue_token("alice", AUD), idp.issue_token("alice", AUD), idp.expired_token("alice", AUD),
              idp.token_signed_by_foreign_key("alice", AUD), idp.unsigned_token("alice", AUD)]
    alice = Caller(gateway, tokens[0], headers={"X-Request-Id": "trace-1"}, transcript=transcript)

    # Refused tokens.
    for bad in tokens[2:]:
        assert alice.with_token(bad).post(INIT).status_code == 401
    # A working session over every kind of backend ("down" never answers).
    sid = alice.open()
    assert alice.tools(sid) == ["gone_echo", "gone_sleep", "jira_issues", "slow_echo", "slow_sleep",
                                "svc_echo", "svc_whoami"]
    assert text_of(alice.call(sid, "jira_issues")) == "jira:issues:alice"
    assert text_of(alice.call(sid, "svc_echo", {"text": "s"})) == "svc:s"
    # Errors a client gets: a timeout, a vanished backend, a failed exchange (refreshed token, denied).
    slow.delay = 3.0
    errors = [alice.call(sid, "slow_echo", {"text": "late"})]
    gone.stop()
    errors.append(alice.call(sid, "gone_echo", {"text": "x"}))
    idp.deny_audiences = {"jira-api"}
    errors.append(alice.with_token(tokens[1]).call(sid, "jira_issues"))
    for answer in errors:
        assert "error" in answer or answer.get("result", {}).get("isError"), answer
    admin = admin_get(gateway, token=ADMIN_TOKEN)
    assert admin.status_code == 200
    slow.delay = 0.0

    # Everything the clients and operators saw, and everything logged.
    seen_by_clients = [
        f"{r.status_code} {json.dumps(dict(r.headers))} {r.text}" for r in transcript
    ] + [admin.text]
    records = [record.getMessage() for record in caplog.records]
    logged = caplog.text + "\n".join(records)
    assert any("warn" in r.levelname.lower() for r in caplog.records)  # the scenario did log
    for secret in (*tokens, CLIENT_SECRET, INJECTED, ADMIN_TOKEN):
        assert secret not in logged, f"a secret was logged: {secret[:6]}..."
        for text in seen_by_clients:
            assert secret not in text, f"a secret reached a client: {secret[:6]}..."
    assert not JWT_PATTERN.search(logged), JWT_PATTERN.search(logged).group(0)[:20]
    for text in seen_by_clients:
        assert not JWT_PATTERN.search(text)

    # No backend or IdP address in any JSON-RPC error returned to the client.
    addresses = [f"127.0.0.1:{b.port}" for b in (jira, svc, slow, gone)]
    addresses += [down_url.split("//")[1].split("/")[0], f"127.0.0.1:{idp.port}", "/mcp\""]
    error_bodies = []
    for response in transcript:
        try:
            body = answer_of(response) if response.text else None
        except ValueError:
            continue
        if isinstance(body, dict) and "error" in body:
            error_bodies.append(json.dumps(body))
    assert sum('"jsonrpc"' in error for error in error_bodies) >= 3, error_bodies  # timeout, unreachable, exchange
    for error in error_bodies:
        for address in addresses:
            assert address not in error, (address, error)


def test_wrong_client_secret_fails_the_backend_without_leaking_the_secret(start_gateway, idp, servers,
                                                                          monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    wrong = "wr0ng-s3cret-Jh5"
    monkeypatch.setenv("EX_SECRET", wrong)
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues"]}))
    plain = servers(header_backend("plain"))
    gateway = start_gateway(gateway_config({"jira": jira, "plain": plain}, incoming=oidc(idp), outgoing={
        "backends": {"jira": exchange(idp, "jira-api")}}))
    alice = Caller(gateway, idp.issue_token("alice", AUD))
    sid = alice.open()
    answer = alice.rpc(sid, "tools/list", {})
    assert sorted(t["name"] for t in answer["result"]["tools"]) == ["plain_echo", "plain_whoami"]
    assert [r.outcome for r in idp.exchanges] == ["invalid_client"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("jira" in line and "invalid_client" in line for line in warnings), warnings
    assert wrong not in caplog.text and wrong not in json.dumps(answer)
    assert not JWT_PATTERN.search(caplog.text)


def test_backend_address_never_in_errors_when_every_backend_is_down(start_gateway, idp, servers):
    down = closed_port_url()
    gateway = start_gateway(gateway_config({"down": down}, incoming=oidc(idp),
                                           operational={"timeouts": {"default": "1s"}}))
    alice = Caller(gateway, idp.issue_token("alice", AUD))
    sid = alice.open()
    response = alice.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, sid)
    body = response.text
    assert "error" in answer_of(response)
    assert down.split("//")[1].split("/")[0] not in body
    assert "127.0.0.1" not in body


# -- composite tools, per user ------------------------------------------------------------------


def test_a_composite_is_advertised_to_the_users_whose_discovery_finds_every_step_tool(
        start_gateway, idp, servers, monkeypatch):
    """alice's token exchange shows her `issues` and `reports`; bob's only `reports`. The
    composite over both is alice's alone, and its steps run with alice's exchanged token."""
    monkeypatch.setenv("VMCP_ADMIN_TOKEN", ADMIN_TOKEN)
    jira = servers(authed_backend("jira", idp, "jira-api", {"alice": ["issues", "reports"], "bob": ["reports"]}))
    config = gateway_config({"jira": jira}, incoming=oidc(idp), outgoing={"backends": {"jira": exchange(idp, "jira-api")}},
                            admin=True)
    config["compositeTools"] = [{
        "name": "digest", "description": "issues and reports",
        "steps": [{"id": "issues", "tool": "jira.issues"}, {"id": "reports", "tool": "jira_reports"}],
        "output": {"properties": {"issues": {"type": "string", "value": "{{ steps.issues.output.text }}"},
                                  "reports": {"type": "string", "value": "{{ steps.reports.output.text }}"}}},
    }]
    gateway = start_gateway(config)
    alice, bob = Caller(gateway, idp.issue_token("alice", AUD)), Caller(gateway, idp.issue_token("bob", AUD))
    alice_sid, bob_sid = alice.open(), bob.open()

    assert alice.tools(alice_sid) == ["digest", "jira_issues", "jira_reports"]
    answer = alice.call(alice_sid, "digest")
    assert answer["result"]["structuredContent"] == {"issues": "jira:issues:alice", "reports": "jira:reports:alice"}

    assert bob.tools(bob_sid) == ["jira_reports"]
    refused = bob.call(bob_sid, "digest")
    assert refused["error"]["code"] == -32602 and refused["error"]["message"] == "Unknown tool: digest"
    assert not [m for m in received(jira, "tools/call") if m.subject == "bob"]
    problems = session_row(admin_state(gateway), bob_sid)["compositeProblems"]
    assert problems == ["composite tool 'digest' is not advertised: step 'issues' calls 'jira.issues', "
                        "which this session's backends do not offer"]
    assert session_row(admin_state(gateway), alice_sid)["compositeProblems"] == []
