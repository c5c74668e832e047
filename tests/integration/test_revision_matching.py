"""Never worse than a direct connection (issue 22): a backend that speaks both revisions is
spoken to in the revision of the client it serves where that changes what works, and a
request a backend sends outside a call reaches the client. Default config (nothing
pinned), a real official-SDK backend, the official SDK client directly and through the
gateway, compared."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import mcp
import pytest

from tests.asking_backends import AskingBackend, asking_backend
from tests.backends import RawMcpBackend, _echo_tools
from tests.gateway import admin_get, backend_entry, wait_until
from tests.task_backends import modern_rpc
from tests.integration.test_client_requests import _elicitation, _roots, _sampling

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ADMIN_ENV, ADMIN_TOKEN = "VMCP_TEST_REVISION_ADMIN_TOKEN", "revision-admin-token-7c2e"
PREFIX = "asking_"  # the default conflict resolution prefixes every tool with its backend's name
CALLBACKS = {"sampling_callback": _sampling, "elicitation_callback": _elicitation({"name": "Ada", "count": 3}),
             "list_roots_callback": _roots}


@pytest.fixture(autouse=True)
def admin_token(monkeypatch):
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)


def config(backend: Any, **extra: Any) -> dict:
    return {"name": "t", "backends": [backend_entry("asking", backend)], "admin": {"tokenEnv": ADMIN_ENV}, **extra}


def roots_on_cue(backend: AskingBackend) -> threading.Event:
    """Give ``backend`` (not started yet) a tool ``roots_on_cue``: it answers at once, and asks
    for the client's roots (roots/list outside any call) when the test sets the returned event;
    ``.events`` says what came back and how long it took. (The shared ``roots_later`` asks
    0.3 s after answering, which on a busy machine can come before the client has gone.)"""
    from mcp.server.mcpserver import Context

    cue = threading.Event()
    asking: list[asyncio.Task] = []  # kept from the garbage collector

    async def roots_on_cue(ctx):
        """Answer at once; ask for the client's roots on the test's cue."""
        session = ctx.session

        async def ask() -> None:
            if not await asyncio.to_thread(cue.wait, 30):
                backend.events.append("never cued")
                return
            started = time.monotonic()
            try:
                result = await session.list_roots()
                outcome = "roots: " + ",".join(str(root.uri) for root in result.roots)
            except Exception as error:  # noqa: BLE001 - recorded for the test
                outcome = f"refused: {error}"
            backend.events.append(f"{outcome} after {time.monotonic() - started:.1f} s")

        asking.append(asyncio.get_running_loop().create_task(ask()))
        return "asking on cue"

    roots_on_cue.__annotations__ = {"ctx": Context, "return": str}  # real types: the SDK looks for Context
    backend.server.add_tool(roots_on_cue)
    return cue


def calls(names: list[str], prefix: str = "", mode: str = "legacy", **client_args: Any):
    """Each tool called once with the SDK client, in order: (is_error, first text) each, or
    ("refused", code, message) for a JSON-RPC error."""
    arguments = {"ask_llm": {"prompt": "hello"}, "ask_user": {"question": "Who?"}, "touch": {"uri": "test://x"}}

    async def main(url: str) -> list[tuple[Any, ...]]:
        async with mcp.Client(url, mode=mode, **client_args) as client:
            results: list[tuple[Any, ...]] = []
            for name in names:
                try:
                    result = await asyncio.wait_for(client.call_tool(prefix + name, arguments.get(name, {})), 20)
                except mcp.MCPError as error:
                    results.append(("refused", error.error.code, error.error.message))
                    continue
                results.append((result.is_error, result.content[0].text))
            return results

    return lambda url: asyncio.run(main(url))


def users(gateway) -> list[dict]:
    return admin_get(gateway, token=ADMIN_TOKEN).json()["users"]


def connections(gateway) -> list[dict]:
    """Every live user's backend connections, with whether the user prefers 2025."""
    state = admin_get(gateway, token=ADMIN_TOKEN).json()
    return [{**backend, "prefersLegacy": user["prefersLegacy"]} for user in state["users"]
            for backend in user["backends"]]


BACK_CHANNEL = ["ask_llm", "ask_user", "ask_url", "roots"]


def test_a_2025_session_that_takes_requests_gets_a_2025_backend_session_and_what_direct_gets(start_gateway):
    with asking_backend() as backend:
        gateway = start_gateway(config(backend))
        direct = calls(BACK_CHANNEL, **CALLBACKS)(backend.mcp_url)
        through = calls(BACK_CHANNEL, PREFIX, **CALLBACKS)(gateway.url)
        assert through == direct == [(False, "model test-model said: HELLO"), (False, "accepted: Ada x3"),
                                     (False, "url: accept"), (False, "file:///work/project")]
        [connection] = connections(gateway)
        assert connection["protocolVersion"] == "2025-11-25" and connection["prefersLegacy"]
        assert "takes sampling, elicitation or roots" in connection["protocolReason"]


def test_2026_clients_get_2026_backend_sessions_and_a_2025_session_that_takes_nothing_a_2025_one(start_gateway):
    with asking_backend() as backend:
        gateway = start_gateway(config(backend))
        # A 2026-07-28 client (auto mode: the gateway and the backend answer server/discover)
        # gets the backend's 2026-07-28 behaviour, as directly: what the tool asks mid-call
        # fails there (the SDK has no back channel on a 2026-07-28 connection).
        direct = calls(["ask_llm", "touch"], mode="auto", **CALLBACKS)(backend.mcp_url)
        through = calls(["ask_llm", "touch"], PREFIX, mode="auto", **CALLBACKS)(gateway.url)
        assert through == direct and direct[0][0] == "refused" and direct[1] == (False, "touched test://x"), direct
        found = wait_until(lambda: len(connections(gateway)) == 1 and connections(gateway), timeout=20)
        assert found, connections(gateway)
        assert [(c["protocolVersion"], c["prefersLegacy"]) for c in found] == [("2026-07-28", False)]
        assert "answers server/discover" in found[0]["protocolReason"]
        # A 2025 session that declares nothing gets a 2025 backend session, as a legacy
        # client directly would: what the backend keeps per session is then that client's.
        session = open_session(gateway)
        assert gateway.rpc(session, "tools/call", {"name": "asking_touch", "arguments": {"uri": "test://x"}}
                           )["result"]["content"][0]["text"] == "touched test://x"
        found = wait_until(lambda: len(connections(gateway)) == 2 and connections(gateway), timeout=20)
        assert found, connections(gateway)
        assert sorted((c["protocolVersion"], c["prefersLegacy"]) for c in found) == [
            ("2025-11-25", True), ("2026-07-28", False)]


def test_a_request_outside_any_call_with_nowhere_to_go_is_refused_at_once_and_logged(start_gateway, caplog):
    caplog.set_level(logging.WARNING, logger="vmcp_actors")
    backend = AskingBackend("asking")
    cue = roots_on_cue(backend)
    with backend.start():
        gateway = start_gateway(config(backend))
        assert calls(["roots_on_cue"], PREFIX, mode="legacy", list_roots_callback=_roots)(gateway.url) == [
            (False, "asking on cue")]
        # The client has gone: no call of its user in flight, no stream open. Then the backend asks.
        assert wait_until(lambda: [(user["inFlight"], user["standaloneStreams"]) for user in users(gateway)] == [(0, 0)],
                          timeout=20), users(gateway)
        cue.set()
        refused = wait_until(lambda: [e for e in backend.events if e.startswith("refused")], timeout=20)
        assert refused, backend.events
        assert "no call of this user is in flight" in refused[0]
        # at once, not after the 30 s backend timeout a wait for an answer would take
        assert float(refused[0].rsplit(" after ", 1)[1].split()[0]) < 10.0
        assert any("outside a call" in record.getMessage() and "roots/list" in record.getMessage()
                   for record in caplog.records)


def test_a_request_outside_a_call_goes_to_the_standalone_stream_when_two_calls_are_in_flight(start_gateway):
    with asking_backend() as backend:
        gateway = start_gateway(config(backend))

        async def main() -> str:
            async with mcp.Client(gateway.url, mode="legacy", **CALLBACKS) as client:
                arrived = asyncio.Event()  # the backend's wait reports progress 0 once the call reached it

                async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                    arrived.set()

                waiting = asyncio.ensure_future(client.call_tool(PREFIX + "wait", {}, progress_callback=on_progress))
                try:
                    # With wait in flight on the backend session, roots makes two: no one call takes
                    # the backend's roots/list.
                    await asyncio.wait_for(arrived.wait(), 20)
                    result = await asyncio.wait_for(client.call_tool(PREFIX + "roots", {}), 20)
                finally:
                    waiting.cancel()
                return result.content[0].text

        # The SDK client keeps its standalone stream open: the request is asked there.
        assert asyncio.run(main()) == "file:///work/project"


def test_a_2026_client_gets_a_backends_request_outside_the_call_as_input_required(start_gateway):
    """The backend speaks only 2025 here (as the TypeScript reference server does) and sends
    roots/list on its standalone stream: the one call in flight answers input_required."""
    from tests.asking_backends import AskingBackend
    from tests.eras import start_in_era

    backend = start_in_era(AskingBackend("asking"), "legacy")
    try:
        gateway = start_gateway(config(backend))
        assert calls(["roots"], PREFIX, mode="auto", list_roots_callback=_roots)(gateway.url) == [
            (False, "file:///work/project")]
        [connection] = connections(gateway)
        assert connection["protocolVersion"] == "2025-11-25" and not connection["prefersLegacy"]
        assert "refuses server/discover" in connection["protocolReason"]
    finally:
        backend.stop()


# -- remembered revisions -----------------------------------------------------------------------


def legacy_backend() -> RawMcpBackend:
    """A 2025-only backend (server/discover: -32601) that records what it gets."""
    return RawMcpBackend("old", _echo_tools("old")).start()


def open_session(gateway, capabilities: dict | None = None, headers: dict | None = None) -> str:
    response = gateway.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": capabilities or {},
        "clientInfo": {"name": "raw", "version": "1"}}}, headers=headers)
    assert response.status_code == 200, response.text
    session_id = response.headers["Mcp-Session-Id"]
    gateway.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session_id, headers=headers)
    return session_id


def list_tools_2026(gateway, headers: dict | None = None) -> None:
    """A 2026-07-28 client's tools/list: it prefers a 2026-07-28 backend session (probes)."""
    answer = modern_rpc(gateway.url, "tools/list", headers=headers)
    assert "result" in answer, answer


def list_tools(gateway, session_id: str, headers: dict | None = None) -> None:
    response = gateway.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, session_id,
                            headers={"MCP-Protocol-Version": "2025-11-25", **(headers or {})})
    assert response.status_code == 200, response.text


def test_a_backends_revision_is_remembered_in_redis_and_a_new_process_does_not_probe_again(
        start_gateway, redis_server, monkeypatch):
    monkeypatch.setenv("SHARED_SIGNING_KEY", "shared-signing-key-0123456789abcdef")
    backend = legacy_backend()
    try:
        shared = {"name": "t", "backends": [backend_entry("old", backend)],
                  # a passthrough header tells users apart: each process serves a new user
                  "outgoingAuth": {"passthroughHeaders": ["X-Tenant"]},
                  "operational": {"signingKeyEnv": "SHARED_SIGNING_KEY"},
                  "sessionStorage": {"provider": "redis", "address": redis_server.address, "db": 0,
                                     "keyPrefix": "t:"}}
        first = start_gateway(shared)
        list_tools_2026(first, {"X-Tenant": "a"})
        assert backend.methods()[:2] == ["server/discover", "initialize"]
        first.stop()
        backend.clear_received()
        second = start_gateway(shared)  # another process: nothing learned locally
        list_tools_2026(second, {"X-Tenant": "b"})
        assert backend.methods()[:2] == ["initialize", "notifications/initialized"], backend.methods()
        assert "server/discover" not in backend.methods()
    finally:
        backend.stop()


def test_without_redis_a_new_process_probes_again(start_gateway):
    backend = legacy_backend()
    try:
        plain = {"name": "t", "backends": [backend_entry("old", backend)]}
        first = start_gateway(plain)
        list_tools_2026(first)
        first.stop()
        backend.clear_received()
        second = start_gateway(plain)
        list_tools_2026(second)
        assert backend.methods()[:2] == ["server/discover", "initialize"], backend.methods()
    finally:
        backend.stop()


@pytest.mark.parametrize("capabilities", [{"roots": {}}, {}], ids=["takes-requests", "declares-nothing"])
def test_a_legacy_backend_costs_a_2025_session_no_probe(start_gateway, capabilities):
    backend = legacy_backend()
    try:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("old", backend)]})
        list_tools(gateway, open_session(gateway, capabilities))
        assert backend.methods()[:2] == ["initialize", "notifications/initialized"], backend.methods()
        assert "server/discover" not in backend.methods()
    finally:
        backend.stop()
