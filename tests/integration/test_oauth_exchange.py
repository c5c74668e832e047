"""With the gateway as authorization server, ``token_exchange`` outgoing auth exchanges the
identity provider's token of the caller's sign-in (issue 36): kept by the gateway (never
the client's token, which the IdP cannot read), refreshed when due, one refresh for
many requests, and a sign-in the IdP no longer accepts is a 401 (sign in again)."""

from __future__ import annotations

import threading
from typing import Any

import jwt
import pykka
import pytest

from tests.backends import header_backend
from tests.oauth_browser import browser, need_browser
from tests.oauth_gateway import RawOAuthClient, SignInGateway, mcp_post
from vmcp_actors.demo._serve import serve_asgi_in_thread
from vmcp_actors.web._installed import EXTENSION_KEY

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {},
               "io.modelcontextprotocol/clientInfo": {"name": "exchange-test", "version": "0"}}
CALL = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "guarded_echo", "arguments": {"text": "x"}, "_meta": MODERN_META}}
MODERN = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "guarded_echo"}


def call(gateway: SignInGateway, access: str) -> Any:
    """A stateless tools/call: discovery and the call both reach the backend with exchanged tokens."""
    return mcp_post(gateway.mcp_url, access, CALL, **MODERN)


class ExchangeEndpoint:
    """An RFC 8693 token endpoint that records each subject token and answers a token of its own."""

    def __init__(self) -> None:
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        self.subject_tokens: list[str] = []
        self._lock = threading.Lock()  # guards subject_tokens

        async def token(request: Any) -> JSONResponse:
            form = await request.form()
            with self._lock:
                self.subject_tokens.append(str(form.get("subject_token")))
                number = len(self.subject_tokens)
            return JSONResponse({"access_token": f"exchanged-{number}", "token_type": "Bearer", "expires_in": 300,
                                 "issued_token_type": "urn:ietf:params:oauth:token-type:access_token"})

        self._served = serve_asgi_in_thread(Starlette(routes=[Route("/token", token, methods=["POST"])]),
                                            name="exchange")
        self.url = f"{self._served.url}/token"

    def stop(self) -> None:
        self._served.stop()


@pytest.fixture()
def exchanging():
    need_browser()
    exchange = ExchangeEndpoint()
    backend = header_backend("guarded", required_header="Authorization")
    gateway = SignInGateway(
        [{"name": "guarded", "url": backend.url + "/mcp"}], idp={"access_token_ttl": 600},
        extra={"outgoingAuth": {"default": {"type": "token_exchange", "tokenExchange": {
            "tokenUrl": exchange.url, "clientId": "vmcp-exchange"}}}})
    try:
        yield gateway, exchange, backend
    finally:
        gateway.stop()
        backend.stop()
        exchange.stop()
        pykka.ActorRegistry.stop_all(block=True, timeout=5)


def signed_in(gateway: SignInGateway, login: str) -> str:
    """The gateway's access token for ``login``, signed in through the real pages."""
    client = RawOAuthClient(gateway.issuer)
    try:
        with browser() as driver:
            return client.sign_in(driver, login)["access_token"]
    finally:
        client.stop()


def upstream_of(gateway: SignInGateway, access_token: str) -> dict[str, Any]:
    runtime = gateway.gateway.app.extensions[EXTENSION_KEY]
    grant = jwt.decode(access_token, options={"verify_signature": False})["grant"]
    return runtime.oauth.records.get("upstream", grant)


def test_the_subject_token_is_the_identity_providers_token_of_the_sign_in_refreshed_when_due(exchanging):
    gateway, exchange, backend = exchanging
    access = signed_in(gateway, "alice")
    first = upstream_of(gateway, access)["access_token"]
    called = call(gateway, access)
    assert called.status_code == 200 and "guarded:x" in called.text, called.text
    assert exchange.subject_tokens and set(exchange.subject_tokens) == {first}  # not the gateway's own token
    assert access not in exchange.subject_tokens
    assert any(received.headers.get("Authorization", "").startswith("Bearer exchanged-")
               for received in backend.received)

    # The IdP's token is due: the next request renews it once (upstream), then exchanges the new one.
    upstream = gateway.gateway.app.extensions[EXTENSION_KEY].oauth.server.upstream
    real_clock = upstream._clock
    upstream._clock = lambda: real_clock() + 3600
    before = gateway.idp.token_requests().get("refresh_token", 0)
    try:
        answers = []
        threads = [threading.Thread(target=lambda: answers.append(call(gateway, access)))
                   for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    finally:
        upstream._clock = real_clock
    assert [answer.status_code for answer in answers] == [200] * 6
    assert gateway.idp.token_requests().get("refresh_token", 0) == before + 1  # six requests, one refresh
    renewed = upstream_of(gateway, access)["access_token"]
    assert renewed != first and exchange.subject_tokens[-1] == renewed


def test_a_sign_in_the_identity_provider_no_longer_accepts_is_a_401(exchanging):
    gateway, exchange, _ = exchanging
    access = signed_in(gateway, "bob")
    runtime = gateway.gateway.app.extensions[EXTENSION_KEY]
    grant = jwt.decode(access, options={"verify_signature": False})["grant"]
    # The IdP's refresh token is no longer good (revoked there, or the person disabled).
    runtime.oauth.records.update("upstream", grant, lambda kept: {**kept, "refresh_token": "revoked-at-the-idp",
                                                                  "expires_at": 0})
    refused = mcp_post(gateway.mcp_url, access, INIT)
    assert refused.status_code == 401, refused.text
    assert "no longer accepts" in refused.headers["WWW-Authenticate"]
    assert runtime.oauth.records.get("grant", grant) is None  # the grant ended: its refresh token too
    assert call(gateway, access).status_code == 401
