"""Opaque tokens checked by RFC 7662 introspection (issue 14, item 9: ToolHive's OIDC
``clientId``, ``clientSecretEnv``, ``introspectionUrl``, ``scopes``, ``resource``),
against the local IdP's real introspection endpoint; JWTs keep working beside them."""

from __future__ import annotations

import pytest
import requests

from tests.backends import header_backend
from tests.gateway import backend_entry
from tests.idp import LocalIdP
from tests.integration.test_identity import INIT, bearer

AUD = "vmcp"
CLIENT, SECRET_ENV, SECRET = "vmcp-gateway", "VMCP_INTROSPECTION_SECRET", "intr0spect-s3cret"


@pytest.fixture
def idp():
    provider = LocalIdP().start()
    provider.register_client(CLIENT, SECRET)
    yield provider
    provider.stop()


@pytest.fixture
def gateway(start_gateway, idp, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    backend = header_backend("plain")
    gateway = start_gateway({"name": "intro", "backends": [backend_entry("plain", backend)],
                             "incomingAuth": {"type": "oidc", "oidc": {
                                 "issuer": idp.issuer, "audience": AUD, "introspectionUrl": idp.introspection_url,
                                 "clientId": CLIENT, "clientSecretEnv": SECRET_ENV, "scopes": ["mcp:tools"],
                                 "resource": "http://127.0.0.1/mcp"}}})
    yield gateway
    backend.stop()


def test_an_opaque_token_is_introspected_once_and_identifies_its_subject(gateway, idp):
    token = idp.issue_opaque_token("alice", AUD)
    opened = gateway.post(INIT, headers=bearer(token))
    assert opened.status_code == 200, opened.text
    sid = opened.headers["Mcp-Session-Id"]
    headers = {"MCP-Protocol-Version": "2025-11-25", **bearer(token)}
    for _ in range(3):
        answer = gateway.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, sid, headers=headers)
        assert answer.status_code == 200
    assert idp.introspections == 1  # the answer is reused (for at most a minute)
    # The session is alice's: a JWT for bob cannot use it.
    stolen = gateway.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, sid,
                          headers={"MCP-Protocol-Version": "2025-11-25", **bearer(idp.issue_token("bob", AUD))})
    assert stolen.status_code == 404
    assert gateway.post(INIT, headers=bearer(idp.issue_token("carol", AUD))).status_code == 200  # JWTs still work


@pytest.mark.parametrize("case", ["unknown", "wrong-audience", "expired"])
def test_an_inactive_or_foreign_opaque_token_is_401(gateway, idp, case):
    token = {"unknown": "opaque-never-issued",
             "wrong-audience": idp.issue_opaque_token("alice", "another-api"),
             "expired": idp.issue_opaque_token("alice", AUD, expires_in=-120)}[case]
    refused = gateway.post(INIT, headers=bearer(token))
    assert refused.status_code == 401
    assert 'error="invalid_token"' in refused.headers["WWW-Authenticate"]
    assert token not in refused.text


def test_a_refused_introspection_client_is_503_not_a_login_failure(start_gateway, idp, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "not-the-secret")
    backend = header_backend("plain")
    try:
        gateway = start_gateway({"name": "intro", "backends": [backend_entry("plain", backend)],
                                 "incomingAuth": {"type": "oidc", "oidc": {
                                     "issuer": idp.issuer, "audience": AUD,
                                     "introspectionUrl": idp.introspection_url,
                                     "clientId": CLIENT, "clientSecretEnv": SECRET_ENV}}})
        refused = gateway.post(INIT, headers=bearer(idp.issue_opaque_token("alice", AUD)))
        assert refused.status_code == 503
    finally:
        backend.stop()


def test_scopes_and_resource_are_advertised(gateway):
    metadata = requests.get(gateway.base + "/.well-known/oauth-protected-resource", timeout=5).json()
    assert metadata["scopes_supported"] == ["mcp:tools"]
    assert metadata["resource"] == "http://127.0.0.1/mcp"
