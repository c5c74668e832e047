"""Smoke tests for the local identity provider (tests/idp.py) and the authenticated test
backends (authed_backend, header_backend in tests/backends.py)."""

import base64
import json
import time

import jwt
import pytest
import requests

from tests.backends import authed_backend, header_backend
from tests.idp import ACCESS_TOKEN_TYPE, TOKEN_EXCHANGE_GRANT, LocalIdP

ACCEPT = "application/json, text/event-stream"
CLIENT_ID, CLIENT_SECRET = "gateway", "s3cret-gateway"


@pytest.fixture
def idp():
    provider = LocalIdP()
    try:
        provider.start()
        provider.register_client(CLIENT_ID, CLIENT_SECRET)
        yield provider
    finally:
        provider.stop()


@pytest.fixture
def started():
    """Call with a started backend; stops every one at teardown."""
    backends = []

    def track(backend):
        backends.append(backend)
        return backend

    try:
        yield track
    finally:
        for backend in backends:
            backend.stop()


def verify_with_jwks(idp, token, audience):
    key = jwt.PyJWKClient(idp.jwks_url, cache_jwk_set=False).get_signing_key_from_jwt(token)
    return jwt.decode(token, key.key, algorithms=[key.algorithm_name], audience=audience, issuer=idp.issuer)


def exchange(idp, subject_token, audience="backend-a", scope=None, auth=(CLIENT_ID, CLIENT_SECRET), **extra):
    form = {
        "grant_type": TOKEN_EXCHANGE_GRANT,
        "subject_token": subject_token,
        "subject_token_type": ACCESS_TOKEN_TYPE,
        **extra,
    }
    if audience is not None:
        form["audience"] = audience
    if scope is not None:
        form["scope"] = scope
    return requests.post(idp.token_url, data=form, auth=auth, timeout=5)


def b64json(segment):
    return json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))


# -- discovery, JWKS, minting ---------------------------------------------------------


def test_discovery_and_jwks_shape(idp):
    doc = requests.get(idp.discovery_url, timeout=5).json()
    assert doc["issuer"] == idp.issuer and idp.issuer.startswith("http://127.0.0.1:")
    assert doc["jwks_uri"] == idp.jwks_url == f"{idp.issuer}/jwks"
    assert doc["token_endpoint"] == idp.token_url == f"{idp.issuer}/token"
    assert TOKEN_EXCHANGE_GRANT in doc["grant_types_supported"]
    assert {"RS256", "ES256"} <= set(doc["id_token_signing_alg_values_supported"])
    assert doc["token_endpoint_auth_methods_supported"] == ["client_secret_basic", "client_secret_post"]
    assert idp.discovery_fetches == 1

    keys = {k["kid"]: k for k in requests.get(idp.jwks_url, timeout=5).json()["keys"]}
    assert idp.jwks_fetches == 1
    assert set(keys) == {"rsa-1", "ec-1"}
    rsa, ec = keys["rsa-1"], keys["ec-1"]
    assert (rsa["kty"], rsa["use"], rsa["alg"], rsa["e"]) == ("RSA", "sig", "RS256", "AQAB")
    assert len(base64.urlsafe_b64decode(rsa["n"] + "==")) == 256  # 2048 bits
    assert (ec["kty"], ec["use"], ec["alg"], ec["crv"]) == ("EC", "sig", "ES256", "P-256")
    assert {"x", "y"} <= set(ec) and not {"d", "p", "q"} & (set(rsa) | set(ec))  # public halves only


@pytest.mark.parametrize("algorithm, kid", [(None, "rsa-1"), ("ES256", "ec-1")])
def test_issued_tokens_verify_against_jwks(idp, algorithm, kid):
    token = idp.issue_token("alice", "backend-a", algorithm=algorithm, scope=["read", "write"],
                            not_before=time.time() - 5, extra_claims={"tenant": "t1"})
    header = jwt.get_unverified_header(token)
    assert header["kid"] == kid and header["alg"] == (algorithm or "RS256")
    claims = verify_with_jwks(idp, token, "backend-a")
    assert claims["sub"] == "alice" and claims["iss"] == idp.issuer and claims["aud"] == "backend-a"
    assert claims["exp"] - claims["iat"] == 300 and "nbf" in claims and claims["jti"]
    assert claims["scope"] == "read write" and claims["tenant"] == "t1"


def test_key_rotation_adds_a_kid(idp):
    old = idp.issue_token("alice", "a")
    new_kid = idp.rotate_rsa_key()
    assert new_kid == "rsa-2" and idp.current_kid == "rsa-2"
    assert {k["kid"] for k in requests.get(idp.jwks_url, timeout=5).json()["keys"]} == {"rsa-1", "rsa-2", "ec-1"}
    new = idp.issue_token("alice", "a")
    assert jwt.get_unverified_header(new)["kid"] == "rsa-2"
    assert verify_with_jwks(idp, old, "a")["sub"] == verify_with_jwks(idp, new, "a")["sub"] == "alice"
    idp.rotate_rsa_key(drop_old=True)
    assert idp.kids == ["ec-1", "rsa-3"]


def test_bad_token_helpers_do_not_verify(idp):
    with pytest.raises(jwt.InvalidSignatureError):
        verify_with_jwks(idp, idp.token_signed_by_foreign_key("alice", "a"), "a")
    with pytest.raises(jwt.ExpiredSignatureError):
        verify_with_jwks(idp, idp.expired_token("alice", "a"), "a")
    for token in (idp.unsigned_token("alice", "a"), idp.hmac_token("alice", "a", "secret"),
                  idp.hmac_with_public_key_token("alice", "a")):
        with pytest.raises(jwt.InvalidAlgorithmError):
            verify_with_jwks(idp, token, "a")
    confused = idp.hmac_with_public_key_token("alice", "a")
    assert jwt.get_unverified_header(confused) == {"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}


# -- token exchange -------------------------------------------------------------------


@pytest.mark.parametrize("method", ["client_secret_basic", "client_secret_post"])
def test_token_exchange_success(idp, method):
    idp.exchange_expires_in = 120
    subject_token = idp.issue_token("alice", "gateway")
    if method == "client_secret_basic":
        response = exchange(idp, subject_token, scope="read write")
    else:
        response = exchange(idp, subject_token, scope="read write", auth=None,
                            client_id=CLIENT_ID, client_secret=CLIENT_SECRET)
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    assert body["issued_token_type"] == ACCESS_TOKEN_TYPE and body["token_type"] == "Bearer"
    assert body["expires_in"] == 120 and body["scope"] == "read write"
    claims = verify_with_jwks(idp, body["access_token"], "backend-a")
    assert claims["sub"] == "alice" and claims["aud"] == "backend-a" and claims["scope"] == "read write"
    assert claims["exp"] - claims["iat"] == 120
    assert claims["client_id"] == CLIENT_ID and claims["act"] == {"sub": CLIENT_ID}
    assert body["access_token"] != subject_token

    [record] = idp.exchanges
    assert (record.client_id, record.subject, record.audience, record.scopes, record.outcome, record.auth_method) == (
        CLIENT_ID, "alice", "backend-a", ("read", "write"), "issued", method,
    )
    assert idp.token_requests == 1


def test_token_exchange_client_auth_errors(idp):
    subject_token = idp.issue_token("alice", "gateway")
    for auth, form in [((CLIENT_ID, "wrong"), {}), (None, {"client_id": CLIENT_ID}),
                       (None, {"client_id": CLIENT_ID, "client_secret": "wrong"}), (("nobody", "x"), {})]:
        response = exchange(idp, subject_token, auth=auth, **form)
        assert response.status_code == 401, (auth, form)
        assert response.json()["error"] == "invalid_client" and "error_description" in response.json()
        assert response.headers["www-authenticate"].startswith("Basic")
    assert [r.outcome for r in idp.exchanges] == ["invalid_client"] * 4
    assert all(r.subject is None for r in idp.exchanges)


def test_token_exchange_bad_subject_tokens_and_requests(idp):
    bad_tokens = [idp.expired_token("alice", "gateway"), idp.token_signed_by_foreign_key("alice", "gateway"),
                  idp.unsigned_token("alice", "gateway"), idp.hmac_with_public_key_token("alice", "gateway"),
                  idp.issue_token("alice", "gateway", issuer="https://elsewhere.example"), "not-a-jwt"]
    for token in bad_tokens:
        response = exchange(idp, token)
        assert response.status_code == 400 and response.json()["error"] == "invalid_grant"
    good = idp.issue_token("alice", "gateway")
    assert exchange(idp, good, grant_type="client_credentials").json()["error"] == "unsupported_grant_type"
    assert exchange(idp, good, subject_token_type="urn:x").json()["error"] == "invalid_request"
    assert exchange(idp, good, audience=None).json()["error"] == "invalid_request"


def test_denied_audience_and_injected_failures(idp):
    subject_token = idp.issue_token("bob", "gateway")
    idp.deny_audiences.add("forbidden")
    response = exchange(idp, subject_token, audience="forbidden")
    assert response.status_code == 400 and response.json()["error"] == "invalid_target"

    idp.fail_next_exchanges(2)
    for _ in range(2):
        response = exchange(idp, subject_token)
        assert response.status_code == 503 and response.json()["error"] == "temporarily_unavailable"
    idp.fail_next_exchanges(1, error="server_error", status=500)
    assert exchange(idp, subject_token).status_code == 500
    assert exchange(idp, subject_token).status_code == 200
    assert [r.outcome for r in idp.exchanges] == [
        "invalid_target", "temporarily_unavailable", "temporarily_unavailable", "server_error", "issued",
    ]
    assert idp.token_requests == 5


def test_exchange_records_hold_no_tokens_or_secrets(idp):
    subject_token = idp.issue_token("carol", "gateway")
    issued = exchange(idp, subject_token).json()["access_token"]
    exchange(idp, subject_token, auth=(CLIENT_ID, "wrong-secret"))
    text = repr(idp.exchanges)
    for secret in (subject_token, issued, CLIENT_SECRET, "wrong-secret", subject_token.split(".")[2]):
        assert secret not in text


# -- authed_backend -------------------------------------------------------------------


class BearerClient:
    """A plain-requests MCP client sending a bearer token on every request."""

    def __init__(self, backend, token):
        self.url, self.token, self.session_id, self.next_id = backend.mcp_url, token, None, 1

    def request(self, method, params=None):
        headers = {"Accept": ACCEPT, "Content-Type": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.session_id:
            headers["Mcp-Session-Id"] = self.session_id
        payload = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            payload["params"] = params
        self.next_id += 1
        return requests.post(self.url, data=json.dumps(payload), headers=headers, timeout=5)

    def initialize(self):
        response = self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                               "clientInfo": {"name": "t", "version": "0"}})
        if response.status_code == 200:
            self.session_id = response.headers["Mcp-Session-Id"]
        return response


def test_authed_backend_refuses_bad_tokens(idp, started):
    backend = started(authed_backend("secure", idp, "backend-a", {"alice": ["a1"]}))
    cases = {
        "none": None,
        "wrong audience": idp.issue_token("alice", "backend-b"),
        "foreign key": idp.token_signed_by_foreign_key("alice", "backend-a"),
        "expired": idp.expired_token("alice", "backend-a"),
        "wrong issuer": idp.issue_token("alice", "backend-a", issuer="https://evil.example"),
        "alg none": idp.unsigned_token("alice", "backend-a"),
        "hmac": idp.hmac_token("alice", "backend-a", "secret"),
        "alg confusion": idp.hmac_with_public_key_token("alice", "backend-a"),
        "unknown kid": idp.token_with_unknown_kid("alice", "backend-a"),
    }
    for case, token in cases.items():
        response = BearerClient(backend, token).initialize()
        assert response.status_code == 401, case
        assert response.headers["www-authenticate"].startswith("Bearer "), case
        assert 'error="invalid_token"' in response.headers["www-authenticate"], case
    assert backend.received == [] and backend.initialize_count == 0
    assert len(backend.rejections) == len(cases)
    assert requests.get(backend.mcp_url, timeout=5).status_code == 401  # every request, not just POST


def test_authed_backend_per_subject_tools_and_recording(idp, started):
    backend = started(authed_backend("secure", idp, "backend-a", {"alice": ["a1", "shared"], "bob": ["b1"]},
                                     default_tools=["public"]))
    alice = BearerClient(backend, idp.issue_token("alice", "backend-a", scope="read"))
    bob = BearerClient(backend, idp.issue_token("bob", ["backend-a", "other"], algorithm="ES256"))
    anon = BearerClient(backend, idp.issue_token("zed", "backend-a"))
    for client in (alice, bob, anon):
        assert client.initialize().status_code == 200

    def tools(client):
        return [t["name"] for t in client.request("tools/list").json()["result"]["tools"]]

    assert tools(alice) == ["a1", "shared"] and tools(bob) == ["b1"] and tools(anon) == ["public"]
    called = alice.request("tools/call", {"name": "a1", "arguments": {}}).json()
    assert called["result"] == {"content": [{"type": "text", "text": "secure:a1:alice"}]}
    assert bob.request("tools/call", {"name": "a1", "arguments": {}}).json()["error"]["code"] == -32602

    # The token is checked on every request, not only at initialize.
    bob.token = idp.expired_token("bob", "backend-a")
    assert bob.request("tools/list").status_code == 401

    calls = backend.requests("tools/call")
    assert [(m.subject, m.audience) for m in calls] == [("alice", "backend-a"), ("bob", ["backend-a", "other"])]
    assert calls[0].scope == "read" and calls[0].claims["iss"] == idp.issuer
    assert {m.subject for m in backend.requests("initialize")} == {"alice", "bob", "zed"}
    assert all(m.headers["Authorization"] == "Bearer <redacted>" for m in backend.received)
    assert alice.token not in repr(backend.received)


def test_authed_backend_follows_key_rotation(idp, started):
    backend = started(authed_backend("secure", idp, "backend-a", {}, default_tools=["t"]))
    assert BearerClient(backend, idp.issue_token("alice", "backend-a")).initialize().status_code == 200
    fetches = idp.jwks_fetches
    assert BearerClient(backend, idp.issue_token("alice", "backend-a")).initialize().status_code == 200
    assert idp.jwks_fetches == fetches  # cached
    idp.rotate_rsa_key()
    assert BearerClient(backend, idp.issue_token("alice", "backend-a")).initialize().status_code == 200
    assert idp.jwks_fetches == fetches + 1  # unknown kid -> refetched once


# -- header_backend -------------------------------------------------------------------


def test_header_backend_requires_and_records_headers(started):
    backend = started(header_backend("hdr", required_header="X-Api-Key", expected_value="k-123"))
    client = BearerClient(backend, None)
    assert client.initialize().status_code == 401
    response = requests.post(backend.mcp_url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize"},
                             headers={"x-api-key": "wrong"}, timeout=5)
    assert response.status_code == 401
    assert [r.reason for r in backend.rejections] == ["missing header X-Api-Key", "wrong value for header X-Api-Key"]

    response = requests.post(backend.mcp_url, json={"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {}},
                             headers={"X-API-KEY": "k-123", "X-Tenant": "t1"}, timeout=5)
    assert response.status_code == 200
    session = response.headers["Mcp-Session-Id"]
    result = requests.post(backend.mcp_url, json={"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                                                  "params": {"name": "whoami", "arguments": {}}},
                           headers={"X-Api-Key": "k-123", "Mcp-Session-Id": session}, timeout=5).json()
    assert result["result"]["content"][0]["text"] == "hdr"
    [init, call] = backend.received
    for key in ("x-api-key", "X-Api-Key", "X-API-KEY"):
        assert init.headers[key] == "k-123" and key in init.headers and init.headers.get(key) == "k-123"
    assert init.headers["x-tenant"] == "t1" and "X-Tenant" not in call.headers


def test_header_backend_without_requirement_is_open(started):
    backend = started(header_backend("open"))
    assert BearerClient(backend, None).initialize().status_code == 200
    assert backend.rejections == [] and backend.received[0].subject is None


def test_basic_auth_accepts_form_encoded_and_raw_secrets_and_public_clients(idp):
    from urllib.parse import quote_plus

    idp.register_client("odd client", "p+ss/w%rd:x")
    idp.register_client("public-app")
    subject_token = idp.issue_token("dave", "gateway")
    encoded = base64.b64encode(f"{quote_plus('odd client')}:{quote_plus('p+ss/w%rd:x')}".encode()).decode()
    form = {"grant_type": TOKEN_EXCHANGE_GRANT, "subject_token": subject_token,
            "subject_token_type": ACCESS_TOKEN_TYPE, "audience": "backend-a"}
    response = requests.post(idp.token_url, data=form, headers={"Authorization": f"Basic {encoded}"}, timeout=5)
    assert response.status_code == 200, response.text  # RFC 6749 2.3.1 encoding
    assert exchange(idp, subject_token, auth=("odd client", "p+ss/w%rd:x")).status_code == 200  # raw
    # Public clients: a registered one, and (unless require_client_auth) an unregistered one.
    assert exchange(idp, subject_token, auth=None, client_id="public-app").status_code == 200
    assert exchange(idp, subject_token, auth=None, client_id="someone").status_code == 200
    idp.require_client_auth = True
    assert exchange(idp, subject_token, auth=None, client_id="someone").status_code == 401
    assert [r.client_id for r in idp.exchanges] == ["odd client", "odd client", "public-app", "someone", "someone"]
