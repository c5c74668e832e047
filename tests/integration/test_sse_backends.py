"""Backends of the 2024-11-05 HTTP+SSE transport (``transport: sse``): the gateway GETs the
event stream, reads its ``endpoint`` event, POSTs messages there and reads the answers on
the stream; a stream that drops is opened again, and initialized again, on the next use;
each user has a stream of its own, opened and used with that user's outgoing credential.

Real servers only: the TypeScript reference server ``server-everything`` in its ``sse``
mode (tests/node_mcp.py, installed by scripts/install-node-mcp), compared with the Python
SDK's own SSE client; official-SDK ``MCPServer.sse_app()`` servers under uvicorn
(tests/sse_servers.py records what they get); the IdP stand-in (tests/idp.py); the gateway
on a real HTTP server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import jwt
import mcp
import pytest
from mcp.client.sse import sse_client

from tests import node_mcp
from tests.backends import BearerJwtVerifier, Unauthorized
from tests.gateway import BearerSession, answer_of, wait_until
from tests.idp import LocalIdP
from tests.sse_servers import SseBackend

# A hang fails in a minute (not the suite's two); a node server starting under load takes its time.
pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

AUDIENCE = "vmcp"  # the gateway's own tokens
BACKEND_AUDIENCE = "sse-api"  # what the backend accepts: exchanged tokens only
CLIENT_ID = "vmcp"
CLIENT_SECRET = "sse-cl1ent-s3cret"


def session(target: Any, mode: str, steps: Callable[[Any], Awaitable[Any]]) -> Any:
    """``steps(client)`` with the official SDK client connected to ``target`` (a URL: the
    gateway; or a transport such as ``sse_client(url)``)."""

    async def main() -> Any:
        async with mcp.Client(target, mode=mode) as client:
            return await steps(client)

    return asyncio.run(asyncio.wait_for(main(), 30))


def dumped(model: Any) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_none=True)


def text_of(result: Any) -> str:
    return result.content[0].text


# -- server-everything in its sse mode, through the gateway and directly ---------------------


@pytest.fixture
def everything_sse():
    node_mcp.need_node_mcp()
    server = node_mcp.EverythingServer("everything", transport="sse")
    yield server
    server.stop()


async def _all_pages(list_page: Callable[..., Awaitable[Any]], key: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    for _ in range(100):
        page = await list_page(cursor=cursor)
        items.extend(dumped(item) for item in getattr(page, key))
        cursor = page.next_cursor
        if not cursor:
            return items
    raise AssertionError(f"{key}: too many pages")


def _seen_by(prefix: str) -> Callable[[Any], Awaitable[dict[str, Any]]]:
    """What a client sees of server-everything: its lists (whole, names without ``prefix``)
    and an echo call's result."""

    def unprefixed(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        assert all(item["name"].startswith(prefix) for item in items), [item["name"] for item in items]
        return [{**item, "name": item["name"].removeprefix(prefix)} for item in items]

    async def steps(client: Any) -> dict[str, Any]:
        echo = dumped(await client.call_tool(f"{prefix}echo", {"message": "over sse"}))
        (echo.get("meta") or {}).pop("io.modelcontextprotocol/serverInfo", None)  # the gateway's identity
        if not echo.get("meta"):
            echo.pop("meta", None)
        return {
            "tools": unprefixed(await _all_pages(client.list_tools, "tools")),
            "resources": await _all_pages(client.list_resources, "resources"),  # URIs are never rewritten
            "prompts": unprefixed(await _all_pages(client.list_prompts, "prompts")),
            "echo": echo,
        }

    return steps


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_server_everything_over_sse_answers_through_the_gateway_as_directly(start_gateway, everything_sse, mode):
    gateway = start_gateway({"name": "t", "backends": [
        {"name": "everything", "transport": "sse", "url": everything_sse.sse_url}]})
    direct = session(sse_client(everything_sse.sse_url), mode, _seen_by(""))
    through = session(gateway.url, mode, _seen_by("everything_"))
    assert direct["echo"]["content"] == [{"type": "text", "text": "Echo: over sse"}]
    assert len(direct["tools"]) > 10 and direct["resources"] and direct["prompts"]
    for what in ("tools", "resources", "prompts", "echo"):
        assert through[what] == direct[what], what


# -- an SDK server: answers, and a stream that drops ------------------------------------------


def echo_server(name: str = "old", **settings: Any) -> Any:
    from mcp.server.auth.middleware.auth_context import get_access_token
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(name, instructions=f"echo over sse ({name})", log_level="WARNING", **settings)

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text."""
        return f"echo:{text}"

    @server.tool()
    def subject() -> str:
        """Whose credential opened the stream this call runs on (the SDK's own view)."""
        token = get_access_token()
        return token.subject if token is not None and token.subject else "<anonymous>"

    return server


@pytest.fixture
def sse_backend():
    with SseBackend(echo_server()).start() as backend:
        yield backend


def sse_entry(backend: SseBackend, name: str = "old") -> dict[str, str]:
    return {"name": name, "transport": "sse", "url": backend.sse_url}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_legacy_sse_server_answers_through_the_gateway(start_gateway, sse_backend, mode):
    gateway = start_gateway({"name": "t", "backends": [sse_entry(sse_backend)]})

    async def steps(client) -> tuple[Any, ...]:
        tools = [tool.name for tool in (await client.list_tools()).tools]
        return tools, text_of(await client.call_tool("old_echo", {"text": "hi"}))

    assert session(gateway.url, mode, steps) == (["old_echo", "old_subject"], "echo:hi")
    (stream,) = sse_backend.streams()
    assert stream.path == "/sse" and stream.headers["accept"] == "text/event-stream"
    posts = sse_backend.posted()
    assert posts and all(post.path == "/messages/" and post.session == stream.session for post in posts)
    assert [post.rpc_method for post in posts][:2] == ["initialize", "notifications/initialized"]


# How a stream drops, and what the gateway logs when it notices (None: it cannot, the
# stream looks open; the POST answered 404 tells it).
DROPS = {
    "the server restarts": (lambda backend: backend.restart(), "its event stream ended"),
    "the server ends the stream": (lambda backend: backend.end_streams("end"), "its event stream ended"),
    "the stream breaks": (lambda backend: backend.end_streams("break"), "its event stream broke"),
    "the stream goes silent": (lambda backend: backend.end_streams("silence"), None),
}


@pytest.mark.parametrize("drop", list(DROPS))
def test_after_the_stream_drops_the_next_call_opens_a_new_one_and_initializes_it_again(
        start_gateway, sse_backend, drop, caplog):
    caplog.set_level(logging.WARNING, logger="vmcp_actors.backends._bus")
    gateway = start_gateway({"name": "t", "backends": [sse_entry(sse_backend)]})
    make_it_drop, logged = DROPS[drop]

    def noticed() -> bool:
        return any(logged in record.getMessage() for record in caplog.records)

    async def steps(client) -> tuple[str, ...]:
        before = text_of(await client.call_tool("old_echo", {"text": "before"}))
        await asyncio.to_thread(make_it_drop, sse_backend)
        if logged is not None:  # the call below goes out once the gateway knows
            assert await asyncio.to_thread(wait_until, noticed, 10), "the gateway never saw its stream end"
        after = text_of(await client.call_tool("old_echo", {"text": "after"}))
        return before, after, text_of(await client.call_tool("old_echo", {"text": "later"}))

    started = time.monotonic()
    assert session(gateway.url, "legacy", steps) == ("echo:before", "echo:after", "echo:later")
    # The calls after the drop did not wait for the 30 s call timeout (they take seconds, a
    # few more under load).
    assert time.monotonic() - started < 20
    first, second = sse_backend.streams()
    assert first.session != second.session
    initializes = sse_backend.posted("initialize")
    assert [post.session for post in initializes] == [first.session, second.session]
    assert initializes[1].message["params"] == initializes[0].message["params"]  # the same initialize again
    assert [post.session for post in sse_backend.posted("notifications/initialized")] == \
        [first.session, second.session]
    after = [post.session for post in sse_backend.posted("tools/call")
             if post.message["params"]["arguments"]["text"] == "after"]
    # A silent stream's session is found gone by the call's POST (404): sent again on the new one.
    assert after == ([first.session] if logged is None else []) + [second.session]


# -- per user, with outgoing auth ------------------------------------------------------------


@pytest.fixture
def idp(monkeypatch):
    provider = LocalIdP("sse-idp").start()
    provider.register_client(CLIENT_ID, CLIENT_SECRET)
    monkeypatch.setenv("SSE_EXCHANGE_SECRET", CLIENT_SECRET)
    yield provider
    provider.stop()


class IdpTokens:
    """The backend's token verifier (the SDK's ``TokenVerifier``): a JWT of the IdP for
    ``BACKEND_AUDIENCE``, checked against its JWKS."""

    def __init__(self, idp: LocalIdP):
        self._verify = BearerJwtVerifier(idp.jwks_url, idp.issuer, BACKEND_AUDIENCE)

    async def verify_token(self, token: str) -> Any:
        from mcp.server.auth.provider import AccessToken

        try:
            claims = self._verify(SimpleNamespace(headers={"authorization": f"Bearer {token}"}))
        except Unauthorized:
            return None
        return AccessToken(token=token, client_id=str(claims.get("client_id", "")), subject=claims["sub"],
                           scopes=str(claims.get("scope", "")).split(), expires_at=claims["exp"], claims=claims)


@pytest.fixture
def authed_backend(idp):
    from mcp.server.auth.settings import AuthSettings

    server = echo_server(auth=AuthSettings(issuer_url=idp.issuer, resource_server_url=None),
                         token_verifier=IdpTokens(idp))
    with SseBackend(server).start() as backend:
        yield backend


def exchanging_gateway(start_gateway, idp: LocalIdP, backend: SseBackend) -> Any:
    return start_gateway({
        "name": "t",
        "backends": [sse_entry(backend)],
        "incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUDIENCE}},
        "outgoingAuth": {"backends": {"old": {"type": "token_exchange", "tokenExchange": {
            "tokenUrl": idp.token_url, "clientId": CLIENT_ID, "clientSecretEnv": "SSE_EXCHANGE_SECRET",
            "audience": BACKEND_AUDIENCE, "scopes": ["read"]}}}},
    })


def called(user: BearerSession, tool: str, arguments: dict[str, Any] | None = None) -> str:
    """The text of ``tool``'s result, called in ``user``'s session."""
    answer = answer_of(user.call(tool, arguments))
    assert "result" in answer, answer
    return answer["result"]["content"][0]["text"]


def bearer_claims(headers: dict[str, str]) -> dict[str, Any]:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    assert scheme == "Bearer" and token, "a request without a bearer token"
    return jwt.decode(token, options={"verify_signature": False})  # the backend verified it already


def test_each_user_has_a_stream_of_its_own_carrying_only_its_own_exchanged_token(start_gateway, idp, authed_backend):
    gateway = exchanging_gateway(start_gateway, idp, authed_backend)
    alice, bob = (BearerSession(gateway, idp.issue_token(person, AUDIENCE)) for person in ("alice", "bob"))
    for round_ in range(2):
        assert called(alice, "old_subject") == "alice"
        assert called(bob, "old_subject") == "bob"
        assert called(alice, "old_echo", {"text": f"a{round_}"}) == f"echo:a{round_}"
        assert called(bob, "old_echo", {"text": f"b{round_}"}) == f"echo:b{round_}"

    streams = {stream.session: bearer_claims(stream.headers) for stream in authed_backend.streams()}
    assert sorted(claims["sub"] for claims in streams.values()) == ["alice", "bob"]
    for claims in streams.values():  # exchanged for the backend, by the gateway: not the caller's own token
        assert claims["aud"] == BACKEND_AUDIENCE and claims["act"] == {"sub": CLIENT_ID}
    tokens: dict[str, set[str]] = {"alice": set(), "bob": set()}
    for post in authed_backend.posted():
        opened_by = streams[post.session]
        claims = bearer_claims(post.headers)
        assert claims["sub"] == opened_by["sub"], f"{post.rpc_method} on {opened_by['sub']}'s stream"
        tokens[claims["sub"]].add(post.headers["authorization"])
    for stream in authed_backend.streams():
        tokens[streams[stream.session]["sub"]].add(stream.headers["authorization"])
    assert tokens["alice"] and tokens["bob"] and not tokens["alice"] & tokens["bob"]
    assert len(authed_backend.posted("initialize")) == 2
    assert sorted(record.subject for record in idp.successful_exchanges()) == ["alice", "bob"]


def test_injected_header_goes_on_the_streams_get_and_on_every_post(start_gateway, sse_backend, monkeypatch):
    monkeypatch.setenv("SSE_API_KEY", "sse-inj3cted-key")
    gateway = start_gateway({"name": "t", "backends": [sse_entry(sse_backend)], "outgoingAuth": {"backends": {
        "old": {"type": "header_injection",
                "headerInjection": {"headerName": "X-Api-Key", "headerValueEnv": "SSE_API_KEY"}}}}})

    async def steps(client) -> str:
        return text_of(await client.call_tool("old_echo", {"text": "k"}))

    assert session(gateway.url, "legacy", steps) == "echo:k"
    assert sse_backend.streams() and sse_backend.posted()
    assert {seen.headers.get("x-api-key") for seen in sse_backend.seen} == {"sse-inj3cted-key"}


def test_a_renewed_exchanged_token_is_what_the_open_stream_posts_with(start_gateway, idp, authed_backend):
    idp.exchange_expires_in = 2  # the gateway renews 10 % early: after 1.8 s
    gateway = exchanging_gateway(start_gateway, idp, authed_backend)
    alice = BearerSession(gateway, idp.issue_token("alice", AUDIENCE))
    assert called(alice, "old_echo", {"text": "fresh"}) == "echo:fresh"
    first = idp.successful_exchanges()[0].at
    # Real time is the behaviour here: the first exchanged token has expired (its 2 s lifetime).
    time.sleep(max(0.0, first + 2.1 - time.monotonic()))
    assert called(alice, "old_echo", {"text": "renewed"}) == "echo:renewed"
    assert len(idp.successful_exchanges()) == 2
    (stream,) = authed_backend.streams()  # still the one stream (and session) it opened
    last = authed_backend.posted("tools/call")[-1]
    assert last.session == stream.session
    assert last.headers["authorization"] != stream.headers["authorization"]
    assert bearer_claims(last.headers)["exp"] > time.time()
