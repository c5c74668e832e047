"""The gateway as its clients' authorization server (issue 36), at the protocol level:
a real OpenID provider (oidc-provider, no dynamic registration) upstream, the real pages
in a headless browser, Authlib's OAuth client, and /mcp with the gateway's tokens."""

from __future__ import annotations

import pytest

from tests.backends import sdk_backend
from tests.gateway import answer_of, backend_entry
from tests.oauth_browser import browser, need_browser
from tests.oauth_gateway import RawOAuthClient, SignInGateway, mcp_post

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


@pytest.fixture(scope="module")
def setup():
    need_browser()
    backend = sdk_backend("alpha", ["echo", "whoami"])
    gateway = SignInGateway([backend_entry("alpha", backend)])
    try:
        with browser() as driver:
            yield gateway, driver
    finally:
        gateway.stop()
        backend.stop()


def test_a_client_signs_in_and_calls_tools_with_the_gateways_token(setup):
    gateway, driver = setup
    client = RawOAuthClient(gateway.issuer)
    try:
        token = client.sign_in(driver, "alice")
    finally:
        client.stop()
    assert token["_redirect"]["iss"] == gateway.issuer
    response = mcp_post(gateway.mcp_url, token["access_token"], INIT)
    assert response.status_code == 200, response.text
    assert answer_of(response)["result"]["serverInfo"]
