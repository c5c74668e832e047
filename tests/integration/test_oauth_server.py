"""The gateway as its clients' authorization server (issue 36), at the protocol level:
a real OpenID provider upstream (oidc-provider, without dynamic registration, as company
IdPs are), its real login and consent pages and the gateway's consent page in a headless
browser, Authlib's OAuth client, and /mcp with the gateway's tokens. Each refusal is
checked with its exact RFC 6749 error."""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jwt
import pykka
import pytest
import requests

from tests.backends import sdk_backend
from tests.gateway import answer_of, backend_entry
from tests.oauth_browser import GATEWAY_CONSENT, IDP_LOGIN, browser, need_browser, sign_in_pages
from tests.oauth_gateway import ADMIN_TOKEN, RawOAuthClient, SignInGateway, mcp_post, new_signing_key
from vmcp_actors.web._installed import EXTENSION_KEY

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
REGISTRATIONS_PER_MINUTE = 40
POLICIES = ['permit(principal, action, resource);',
            'forbid(principal == Client::"bob", action == Action::"call_tool", resource == Tool::"alpha_echo");']


@pytest.fixture(autouse=True)
def stop_all_actors():
    """Overrides the conftest fixture: the module's gateway serves every test, so its
    actors outlive a test; the module's fixture stops it."""
    yield


@pytest.fixture(scope="module")
def setup():
    need_browser()
    backend = sdk_backend("alpha", ["echo", "whoami"])
    # The IdP's access tokens are short (20 s): due for renewal halfway through.
    gateway = SignInGateway([backend_entry("alpha", backend)],
                            oauth={"registrationsPerMinute": REGISTRATIONS_PER_MINUTE},
                            idp={"access_token_ttl": 20},
                            extra={"audit": {"enabled": True},
                                   "rateLimiting": {"perUser": {"maxTokens": 1000, "refillPeriod": "1m"}}},
                            authz={"type": "cedar", "policies": POLICIES})
    try:
        with browser() as driver:
            yield gateway, driver
    finally:
        gateway.stop()
        backend.stop()
        pykka.ActorRegistry.stop_all(block=True, timeout=5)


def runtime_of(gateway: SignInGateway) -> Any:
    return gateway.gateway.app.extensions[EXTENSION_KEY]


@pytest.fixture()
def client(setup):
    gateway, driver = setup
    driver.delete_all_cookies()  # every test signs in afresh (all servers share the 127.0.0.1 cookie jar)
    made = RawOAuthClient(gateway.issuer)
    yield made
    made.stop()


def signed_in(setup, client: RawOAuthClient, login: str = "alice") -> dict[str, Any]:
    gateway, driver = setup
    return client.sign_in(driver, login)


def refresh(gateway: SignInGateway, client: RawOAuthClient, refresh_token: str, **extra: str) -> requests.Response:
    return requests.post(f"{gateway.issuer}/oauth/token", data={
        "grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": client.client_id, **extra},
        timeout=10)


MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {},
               "io.modelcontextprotocol/clientInfo": {"name": "oauth-test", "version": "0"}}


def tool_call(gateway: SignInGateway, token: str, name: str, arguments: dict[str, Any]) -> requests.Response:
    """A stateless (2026-07-28) tools/call with the gateway's token."""
    return mcp_post(gateway.mcp_url, token, {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                             "params": {"name": name, "arguments": arguments, "_meta": MODERN_META}},
                    **{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": name})


def test_the_metadata_names_the_gateway_as_authorization_server_and_resource(setup):
    gateway, _ = setup
    issuer = gateway.issuer
    for path in ("/.well-known/oauth-authorization-server", "/.well-known/openid-configuration"):
        metadata = requests.get(issuer + path, timeout=5).json()
        assert metadata["issuer"] == issuer
        assert metadata["authorization_endpoint"] == f"{issuer}/oauth/authorize"
        assert metadata["code_challenge_methods_supported"] == ["S256"]
        assert metadata["authorization_response_iss_parameter_supported"] is True
        assert metadata["client_id_metadata_document_supported"] is True
        assert "none" in metadata["token_endpoint_auth_methods_supported"]
    # path-aware (RFC 8414 section 3.1): the issuer has no path, so a suffixed one is not it
    assert requests.get(issuer + "/.well-known/oauth-authorization-server/other", timeout=5).status_code == 404
    resource = requests.get(issuer + "/.well-known/oauth-protected-resource/mcp", timeout=5).json()
    assert resource["resource"] == gateway.mcp_url and resource["authorization_servers"] == [issuer]
    unauthenticated = mcp_post(gateway.mcp_url, None, INIT)
    assert unauthenticated.status_code == 401
    assert f'resource_metadata="{issuer}/.well-known/oauth-protected-resource/mcp"' in \
        unauthenticated.headers["WWW-Authenticate"]
    assert 'scope="openid email profile groups"' in unauthenticated.headers["WWW-Authenticate"]  # what to ask for
    assert resource["scopes_supported"] == ["openid", "email", "profile", "groups"]
    keys = requests.get(f"{issuer}/oauth/jwks", timeout=5).json()["keys"]
    assert len(keys) == 1 and keys[0]["alg"] == "ES256" and "d" not in keys[0]


def test_a_client_signs_in_through_both_consent_pages_and_calls_tools_as_that_person(setup, client):
    gateway, driver = setup
    token = signed_in(setup, client, "alice")
    assert token["_redirect"]["iss"] == gateway.issuer  # RFC 9207
    claims = jwt.decode(token["access_token"], options={"verify_signature": False})
    assert claims["aud"] == gateway.mcp_url and claims["iss"] == gateway.issuer
    assert claims["sub"] == "alice" and claims["idp"] == gateway.idp.issuer
    assert jwt.get_unverified_header(token["access_token"])["kid"] == \
        requests.get(f"{gateway.issuer}/oauth/jwks", timeout=5).json()["keys"][0]["kid"]
    response = mcp_post(gateway.mcp_url, token["access_token"], INIT)
    assert response.status_code == 200, response.text
    called = tool_call(gateway, token["access_token"], "alpha_echo", {"text": "hi"})
    assert answer_of(called)["result"]["content"][0]["text"] == "alpha:hi"


def test_two_people_get_their_own_identity_policies_and_buckets(setup):
    gateway, _ = setup
    alice_client, bob_client = RawOAuthClient(gateway.issuer), RawOAuthClient(gateway.issuer)
    try:
        alice = signed_in(setup, alice_client, "alice")["access_token"]
        setup[1].delete_all_cookies()  # bob signs in in a fresh browser session
        bob = signed_in(setup, bob_client, "bob")["access_token"]
    finally:
        alice_client.stop()
        bob_client.stop()
    assert answer_of(tool_call(gateway, alice, "alpha_echo", {"text": "a"}))["result"]["content"][0]["text"] == "alpha:a"
    refused = answer_of(tool_call(gateway, bob, "alpha_echo", {"text": "b"}))
    assert "error" in refused or refused["result"].get("isError"), refused  # Cedar: not bob's
    assert answer_of(tool_call(gateway, bob, "alpha_whoami", {}))["result"]["content"][0]["text"] == "alpha"
    limits = runtime_of(gateway).limits_state()["rateLimits"]
    assert limits is not None
    state = requests.get(f"{gateway.issuer}/admin/state", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                         timeout=5).json()
    subjects = {user["user"] for user in state["users"]}
    assert {"alice", "bob"} <= subjects, subjects


def test_refresh_rotates_and_a_just_rotated_token_presented_again_within_the_grace_period_still_works(setup, client):
    gateway, _ = setup
    first = signed_in(setup, client)
    upstream_before = gateway.idp.token_requests().get("refresh_token", 0)
    upstream = runtime_of(gateway).oauth.server.upstream
    real_clock = upstream._clock
    upstream._clock = lambda: real_clock() + 15  # the IdP's 20 s token is past the half of its life
    try:
        second = refresh(gateway, client, first["refresh_token"])
    finally:
        upstream._clock = real_clock
    assert second.status_code == 200, second.text
    assert second.json()["refresh_token"] != first["refresh_token"]
    # the IdP's token was near its end: refreshed upstream, once
    assert gateway.idp.token_requests().get("refresh_token", 0) == upstream_before + 1
    again = refresh(gateway, client, first["refresh_token"])  # a client that lost the answer retries
    assert again.status_code == 200, again.text
    for pair in (second.json(), again.json()):
        assert mcp_post(gateway.mcp_url, pair["access_token"], INIT).status_code == 200
        assert refresh(gateway, client, pair["refresh_token"]).status_code == 200


def test_a_rotated_refresh_token_replayed_after_the_grace_period_ends_the_whole_grant(setup, client):
    gateway, _ = setup
    first = signed_in(setup, client)
    second = refresh(gateway, client, first["refresh_token"]).json()
    grants = runtime_of(gateway).oauth.server.grants
    real_clock = grants._clock
    grants._clock = lambda: real_clock() + 120  # two minutes later: past the 30 s grace
    try:
        replay = refresh(gateway, client, first["refresh_token"])
    finally:
        grants._clock = real_clock
    assert replay.status_code == 400 and replay.json()["error"] == "invalid_grant"
    assert refresh(gateway, client, second["refresh_token"]).json()["error"] == "invalid_grant"
    assert mcp_post(gateway.mcp_url, second["access_token"], INIT).status_code == 401


def test_revoking_a_refresh_token_ends_its_grant(setup, client):
    gateway, _ = setup
    token = signed_in(setup, client)
    revoked = requests.post(f"{gateway.issuer}/oauth/revoke", data={
        "token": token["refresh_token"], "token_type_hint": "refresh_token", "client_id": client.client_id}, timeout=5)
    assert revoked.status_code == 200, revoked.text
    assert refresh(gateway, client, token["refresh_token"]).json()["error"] == "invalid_grant"
    refused = mcp_post(gateway.mcp_url, token["access_token"], INIT)
    assert refused.status_code == 401 and "revoked" in refused.headers["WWW-Authenticate"]


def _code(setup, client: RawOAuthClient, **params: str) -> tuple[Any, str, dict[str, str]]:
    gateway, driver = setup
    session = client.session()
    verifier = secrets.token_urlsafe(48)
    url, _ = client.authorization_url(session, verifier, **params)
    sign_in_pages(driver, url, login="alice", stop_prefix=client.catcher.redirect_uri)
    return session, verifier, client.catcher.wait()


def _exchange(gateway: SignInGateway, client: RawOAuthClient, code: str, verifier: str, **extra: str):
    return requests.post(f"{gateway.issuer}/oauth/token", data={
        "grant_type": "authorization_code", "code": code, "code_verifier": verifier,
        "redirect_uri": client.catcher.redirect_uri, "client_id": client.client_id, **extra}, timeout=10)


def test_a_code_is_used_once_and_its_reuse_ends_what_it_made(setup, client):
    gateway, _ = setup
    _, verifier, redirect = _code(setup, client)
    first = _exchange(gateway, client, redirect["code"], verifier)
    assert first.status_code == 200, first.text
    second = _exchange(gateway, client, redirect["code"], verifier)
    assert second.status_code == 400 and second.json()["error"] == "invalid_grant"
    assert refresh(gateway, client, first.json()["refresh_token"]).json()["error"] == "invalid_grant"
    assert mcp_post(gateway.mcp_url, first.json()["access_token"], INIT).status_code == 401


def test_a_wrong_pkce_verifier_and_a_wrong_redirect_uri_are_invalid_grant(setup, client):
    gateway, _ = setup
    _, verifier, redirect = _code(setup, client)
    wrong = _exchange(gateway, client, redirect["code"], secrets.token_urlsafe(48))
    assert wrong.status_code == 400 and wrong.json()["error"] == "invalid_grant"
    client.catcher.stop()
    client.catcher = type(client.catcher)()
    _, verifier, redirect = _code(setup, client)
    moved = _exchange(gateway, client, redirect["code"], verifier, redirect_uri="http://127.0.0.1:1/elsewhere")
    assert moved.status_code == 400 and moved.json()["error"] == "invalid_grant"


def test_authorization_requests_without_s256_pkce_or_for_another_resource_get_a_page_never_a_redirect(setup, client):
    """Nobody signed in or saw where the app sends them: a page says what is wrong, and a
    link (not a redirect) carries the exact error, state and iss back if the person wants."""
    gateway, _ = setup
    base = {"response_type": "code", "client_id": client.client_id, "redirect_uri": client.catcher.redirect_uri,
            "state": "s1"}
    cases = [({}, "invalid_request"),
             ({"code_challenge": "a" * 43, "code_challenge_method": "plain"}, "invalid_request"),
             ({"code_challenge": "a" * 43, "code_challenge_method": "S256", "resource": "https://other.example/mcp"},
              "invalid_target")]
    for extra, error in cases:
        answer = requests.get(f"{gateway.issuer}/oauth/authorize", params={**base, **extra}, allow_redirects=False,
                              timeout=5)
        assert answer.status_code == 400 and "Location" not in answer.headers, answer.text
        back = answer.text.split('id="back-to-app" href="')[1].split('"')[0].replace("&amp;", "&")
        assert back.startswith(client.catcher.redirect_uri)
        query = parse_qs(urlsplit(back).query)
        assert query["error"] == [error] and query["state"] == ["s1"] and query["iss"] == [gateway.issuer]


def test_a_resource_differing_only_in_case_or_a_trailing_slash_is_this_one(setup, client):
    gateway, _ = setup
    upper = gateway.mcp_url.replace("http://", "HTTP://") + "/"
    answer = requests.get(f"{gateway.issuer}/oauth/authorize", params={
        "response_type": "code", "client_id": client.client_id, "redirect_uri": client.catcher.redirect_uri,
        "code_challenge": "a" * 43, "code_challenge_method": "S256", "resource": upper}, allow_redirects=False,
        timeout=5)
    assert answer.status_code == 303 and "/oauth/consent?flow=" in answer.headers["Location"], answer.text


def test_an_unregistered_redirect_uri_gets_a_page_never_a_redirect(setup, client):
    gateway, _ = setup
    answer = requests.get(f"{gateway.issuer}/oauth/authorize", params={
        "response_type": "code", "client_id": client.client_id, "redirect_uri": "https://attacker.example/cb",
        "code_challenge": "a" * 43, "code_challenge_method": "S256"}, allow_redirects=False, timeout=5)
    assert answer.status_code == 400 and "Location" not in answer.headers
    assert "redirect" in answer.text.lower()


def test_the_token_endpoint_refuses_another_resource(setup, client):
    gateway, _ = setup
    _, verifier, redirect = _code(setup, client)
    other = _exchange(gateway, client, redirect["code"], verifier, resource="https://other.example/mcp")
    assert other.status_code == 400 and other.json()["error"] == "invalid_target"


def test_expired_forged_and_foreign_tokens_are_refused_on_mcp(setup):
    gateway, _ = setup
    key = runtime_of(gateway).oauth.server.keys.current
    now = int(time.time())
    base = {"iss": gateway.issuer, "sub": "alice", "aud": gateway.mcp_url, "grant": "g_x", "idp": gateway.idp.issuer,
            "iat": now, "exp": now + 600}

    def signed(claims: dict[str, Any], private_key: Any = key.private_key, kid: str = key.kid,
               typ: str = "at+jwt") -> str:
        return jwt.encode(claims, private_key, algorithm="ES256", headers={"kid": kid, "typ": typ})
    from cryptography.hazmat.primitives import serialization

    stranger = serialization.load_pem_private_key(new_signing_key().encode(), password=None)
    cases = {
        "expired": signed({**base, "iat": now - 7200, "exp": now - 3600}),
        "audience": signed({**base, "aud": "https://other.example/mcp"}),
        "issuer": signed({**base, "iss": "https://other.example"}),
        "signature": signed(base, stranger),
        "revoked": signed(base),  # a grant that does not exist
        "type": signed({**base, "grant": "g_live"}, typ="JWT"),  # not an access token (RFC 9068)
    }
    said = {"expired": "expired", "audience": "audience", "issuer": "issuer", "signature": "signature",
            "revoked": "revoked", "type": "rejected"}
    for why, token in cases.items():
        answer = mcp_post(gateway.mcp_url, token, INIT)
        assert answer.status_code == 401, why
        challenge = answer.headers["WWW-Authenticate"]
        assert 'error="invalid_token"' in challenge and said[why] in challenge.split("error_description=")[1], \
            (why, challenge)


def test_denying_at_the_consent_page_sends_access_denied_with_iss_and_state(setup, client):
    gateway, driver = setup
    session = client.session()
    url, state = client.authorization_url(session, secrets.token_urlsafe(48))
    _, pages = sign_in_pages(driver, url, login="alice", approve=False, stop_prefix=client.catcher.redirect_uri)
    assert GATEWAY_CONSENT in pages
    answer = client.catcher.wait()
    assert answer["error"] == "access_denied" and answer["state"] == state and answer["iss"] == gateway.issuer


def test_the_consent_page_comes_before_the_identity_provider_and_a_remembered_one_is_skipped(setup, client):
    """The IdP may remember the person and answer at once: the person allows this client
    first (the confused-deputy rule), and may have that remembered for this client."""
    gateway, driver = setup
    url, _ = client.authorization_url(client.session(), secrets.token_urlsafe(48))
    _, pages = sign_in_pages(driver, url, login="alice", remember=True, stop_prefix=client.catcher.redirect_uri)
    assert pages[0] == GATEWAY_CONSENT and IDP_LOGIN in pages, pages
    assert "code" in client.catcher.wait()
    client.catcher.stop()
    client.catcher = type(client.catcher)()  # a native app listens on a new port each time
    url, _ = client.authorization_url(client.session(), secrets.token_urlsafe(48))
    _, pages = sign_in_pages(driver, url, login="alice", stop_prefix=client.catcher.redirect_uri)
    assert GATEWAY_CONSENT not in pages, pages
    assert "code" in client.catcher.wait()


def test_the_consent_page_shows_the_app_and_where_it_sends_the_person(setup, client):
    gateway, driver = setup
    from selenium.webdriver.common.by import By

    url, _ = client.authorization_url(client.session(), secrets.token_urlsafe(48))
    driver.get(url)
    assert driver.current_url.startswith(f"{gateway.issuer}/oauth/consent")
    assert driver.find_element(By.ID, "client-name").text == "raw test client"
    assert "unverified" in driver.find_element(By.ID, "client-domain").text  # DCR: its name proves nothing
    assert driver.find_element(By.ID, "redirect-host").text == urlsplit(client.catcher.redirect_uri).netloc
    assert driver.find_element(By.ID, "local-warning")  # a loopback redirect: any local program could be it
    assert urlsplit(gateway.idp.issuer).netloc in driver.find_element(By.ID, "sign-in-next").text


def test_the_consent_form_refuses_another_browser_and_a_wrong_csrf_token(setup, client):
    gateway, driver = setup
    from selenium.webdriver.common.by import By

    session = client.session()
    url, _ = client.authorization_url(session, secrets.token_urlsafe(48))
    driver.get(url)
    consent_url = driver.current_url
    assert consent_url.startswith(f"{gateway.issuer}/oauth/consent")
    flow = parse_qs(urlsplit(consent_url).query)["flow"][0]
    elsewhere = requests.get(consent_url, timeout=5)  # no cookie: another browser
    assert elsewhere.status_code == 400 and "another browser" in elsewhere.text
    cookie = {c["name"]: c["value"] for c in driver.get_cookies()}
    forged = requests.post(f"{gateway.issuer}/oauth/consent", data={"flow": flow, "csrf": "x" * 43,
                                                                    "decision": "approve"},
                           cookies=cookie, allow_redirects=False, timeout=5)
    assert forged.status_code == 403 and "Location" not in forged.headers
    stolen = requests.post(f"{gateway.issuer}/oauth/consent", data={"flow": flow, "csrf": "x" * 43,
                                                                    "decision": "approve"},
                           allow_redirects=False, timeout=5)
    assert stolen.status_code == 400 and "Location" not in stolen.headers
    sign_in_pages(driver, None, login="alice", stop_prefix=client.catcher.redirect_uri)  # the real page still works
    assert "code" in client.catcher.wait()
    assert driver.find_elements(By.ID, "approve") == []


def test_a_client_id_metadata_url_inside_the_network_is_refused(setup):
    gateway, _ = setup
    for target in ("https://127.0.0.1/client.json", "https://10.0.0.7/client.json", "https://169.254.169.254/x"):
        answer = requests.get(f"{gateway.issuer}/oauth/authorize", params={
            "response_type": "code", "client_id": target, "redirect_uri": "http://127.0.0.1:9/cb",
            "code_challenge": "a" * 43, "code_challenge_method": "S256"}, allow_redirects=False, timeout=10)
        assert answer.status_code == 400 and "Location" not in answer.headers, target
        assert "private" in answer.text, target
        token = requests.post(f"{gateway.issuer}/oauth/token", data={
            "grant_type": "authorization_code", "code": "x", "code_verifier": "y" * 43, "client_id": target,
            "redirect_uri": "http://127.0.0.1:9/cb"}, timeout=10)
        assert token.status_code in (400, 401) and token.json()["error"] == "invalid_client", token.text


def test_operators_list_and_end_grants_without_seeing_tokens(setup, client):
    gateway, _ = setup
    token = signed_in(setup, client, "alice")
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    overview = requests.get(f"{gateway.issuer}/admin/oauth", headers=admin, timeout=5)
    assert overview.status_code == 200
    text = overview.text
    assert token["access_token"] not in text and token["refresh_token"] not in text
    assert any(row["clientId"] == client.client_id and row["kind"] == "dcr" for row in overview.json()["clients"]), text
    assert any(row["client_id"] == client.client_id and row["user"] == "alice" for row in overview.json()["grants"])
    assert requests.post(f"{gateway.issuer}/admin/oauth/revoke", json={"client": client.client_id},
                         timeout=5).status_code == 401  # behind the admin token
    ended = requests.post(f"{gateway.issuer}/admin/oauth/revoke", json={"client": client.client_id}, headers=admin,
                          timeout=5)
    assert ended.json()["ended"] >= 1
    assert mcp_post(gateway.mcp_url, token["access_token"], INIT).status_code == 401
    assert refresh(gateway, client, token["refresh_token"]).json()["error"] == "invalid_grant"


def test_metrics_and_audit_count_sign_ins_and_refusals_without_tokens(setup, client, caplog):
    gateway, _ = setup
    with caplog.at_level(logging.INFO, logger="vmcp_actors.audit"):
        token = signed_in(setup, client, "alice")
        refresh(gateway, client, "not-a-refresh-token")
    lines = [record.getMessage() for record in caplog.records if record.name == "vmcp_actors.audit"]
    events = {(line.split('"event":"')[1].split('"')[0]) for line in lines if '"type":"oauth"' in line}
    assert {"authorize", "login", "consent", "code", "token"} <= events, events
    joined = "\n".join(lines)
    assert token["access_token"] not in joined and token["refresh_token"] not in joined
    metrics = requests.get(f"{gateway.issuer}/metrics", timeout=5).text
    assert 'vmcp_oauth_events_total{event="token",outcome="ok"}' in metrics
    assert 'vmcp_oauth_events_total{event="token",outcome="invalid_grant"}' in metrics


def test_the_admin_page_lists_sign_ins_and_its_end_button_ends_a_grant(setup, client):
    gateway, _ = setup
    token = signed_in(setup, client, "alice")
    grant = jwt.decode(token["access_token"], options={"verify_signature": False})["grant"]
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    page = requests.get(f"{gateway.issuer}/admin", headers=admin, timeout=5)
    assert page.status_code == 200 and 'id="oauth-grants"' in page.text and grant in page.text
    assert token["access_token"] not in page.text and token["refresh_token"] not in page.text
    ended = requests.post(f"{gateway.issuer}/admin/oauth-end", data={"grant": grant}, headers=admin,
                          allow_redirects=False, timeout=5)
    assert ended.status_code == 303
    assert mcp_post(gateway.mcp_url, token["access_token"], INIT).status_code == 401


def test_registration_refuses_bad_metadata_and_a_flood(setup):
    """Last in the module: the flood leaves no registrations for the minute after it."""
    gateway, _ = setup
    register = f"{gateway.issuer}/oauth/register"
    bad = requests.post(register, json={"redirect_uris": ["http://evil.example/cb"]}, timeout=5)
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_redirect_uri"
    worse = requests.post(register, data="not json", timeout=5)
    assert worse.status_code == 400 and worse.json()["error"] == "invalid_client_metadata"
    answers = [requests.post(register, json={"redirect_uris": ["http://127.0.0.1:9/cb"],
                                             "token_endpoint_auth_method": "none"}, timeout=5).status_code
               for _ in range(REGISTRATIONS_PER_MINUTE + 2)]
    assert answers[-1] == 429 and answers.count(201) < len(answers)
