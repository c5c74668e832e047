"""A request holds its session and user for exactly as long as it runs, however it ends:
a call whose client dropped keeps its lease until the call ends, and a request refused
after taking a hold lets go of it. Real SDK backend, real gateway over HTTP."""

from __future__ import annotations

import json
import threading

import anyio
import pytest
import requests
from mcp.server.mcpserver import Context

from tests.backends import sdk_backend
from tests.gateway import MCP_HEADERS, backend_entry, wait_until
from tests.integration.test_modern import modern_post
from vmcp_actors.protocol.sse import iter_sse_events
from vmcp_actors.users import UserKey


@pytest.fixture
def plain():
    with sdk_backend("plain", ["progress", "echo"]) as served:
        yield served


def _directory(gateway):
    return gateway.app.extensions["vmcp_actors"].service._directory


def _in_flight(gateway, session_id: str) -> int:
    rows = _directory(gateway).board()["sessions"]
    return next(activity["inFlight"] for sid, activity in rows if sid == session_id)


def _live_users(gateway) -> set[UserKey]:
    return {user.key for user in _directory(gateway).live_users()}


class _HeldProgress:
    """An official-SDK tool, ``held``: progress 1/2, then it waits until ``release`` is set
    (or 30 s), progress 2/2, and 'done'."""

    def __init__(self) -> None:
        self.release = threading.Event()

    async def held(self, ctx: Context) -> str:
        """Report progress, wait to be released, answer 'done'."""
        await ctx.report_progress(1, 2, "step 1/2")
        with anyio.move_on_after(30):
            while not self.release.is_set():
                await anyio.sleep(0.01)
        await ctx.report_progress(2, 2, "step 2/2")
        return "done"


def test_a_call_whose_client_dropped_keeps_its_lease_and_user_until_it_ends(start_gateway):
    call = _HeldProgress()
    with sdk_backend("plain", ["echo"], extra_tools=[call.held]) as plain:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("plain", plain)],
                                 "operational": {"userIdleTimeout": "200ms", "sessionTTL": "60s"}})
        session_id = gateway.initialize("2025-11-25")
        try:
            response = requests.post(gateway.url, json={
                "jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "plain_held", "arguments": {}, "_meta": {"progressToken": "p"}}},
                headers={**MCP_HEADERS, "Mcp-Session-Id": session_id}, stream=True, timeout=30)
            events = iter_sse_events(response.iter_lines())
            priming = next(events)
            assert priming.id and priming.data == ""
            first = next(events)
            assert json.loads(first.data)["method"] == "notifications/progress"
            response.close()  # the client leaves; the 2025-11-25 call goes on for a resume
            (user,) = _live_users(gateway)

            # Another user (its client declares roots), used after the call began, then left
            # idle: once it is released, an idle user of the call would have been too.
            other = gateway.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {"roots": {}},
                "clientInfo": {"name": "other", "version": "1"}}}).headers["Mcp-Session-Id"]
            assert "result" in gateway.rpc(other, "tools/list")
            (other_user,) = _live_users(gateway) - {user}
            assert wait_until(lambda: other_user not in _live_users(gateway), timeout=10)
            assert _in_flight(gateway, session_id) == 1
            assert user in _live_users(gateway) and user.label == "anonymous"
        finally:
            call.release.set()

        resumed = requests.get(gateway.url, headers={**MCP_HEADERS, "Mcp-Session-Id": session_id,
                                                     "Last-Event-ID": first.id}, stream=True, timeout=30)
        rest = [json.loads(event.data) for event in iter_sse_events(resumed.iter_lines()) if event.data.strip()]
        assert rest[-1]["id"] == 7 and rest[-1]["result"]["content"][0]["text"] == "done"
        assert wait_until(lambda: _in_flight(gateway, session_id) == 0, 10)


def test_a_hold_taken_on_the_last_try_is_released_and_the_request_served(start_gateway, plain, monkeypatch):
    """The user is released between its start and the request's hold once, then held: the
    request is served, and nothing stays in flight after it."""
    gateway = start_gateway({"name": "t", "backends": [backend_entry("plain", plain)]})
    directory = _directory(gateway)
    real_hold = directory.hold_user
    misses = {"left": 2}

    def hold_user(key: UserKey):
        if misses["left"]:
            misses["left"] -= 1
            return None  # released again before the hold
        return real_hold(key)

    monkeypatch.setattr(directory, "hold_user", hold_user)
    answered = modern_post(gateway.url, "tools/call", {"name": "plain_echo", "arguments": {"text": "hi"}})
    assert answered.status_code == 200, answered.text
    assert answered.json()["result"]["content"][0]["text"] == "plain:hi"
    key = UserKey.of(None, {})
    assert directory._user_activity[key].in_flight == 0


def test_a_continued_call_passes_through_every_layer_including_an_embedders():
    """``resume`` is part of the core interface: the retry of an input_required call reaches
    an embedder's layer (which could refuse it), not only the innermost one."""
    from tests.integration.test_modern import ALL_CAPABILITIES, _config, answer
    from tests.mrtr_backends import mrtr_backend
    from vmcp_actors import core as library

    seen: list[tuple[str, str, dict]] = []

    class Watching(library.Layer):
        def resume(self, identity, continuation, deadline):
            seen.append((continuation.method, continuation.name, dict(continuation.input_responses)))
            return self.inner.resume(identity, continuation, deadline)

    with mrtr_backend("asker") as asker:
        running = library.start(library.build(_config(("asker", asker, "modern"))).decorated(Watching))
        try:
            first = answer(modern_post(running.url, "tools/call", {"name": "asker_confirm", "arguments": {"item": "x"}},
                                       capabilities=ALL_CAPABILITIES))["result"]
            (key,) = first["inputRequests"]
            responses = {key: {"action": "accept", "content": {"ok": True}}}
            done = answer(modern_post(running.url, "tools/call", {
                "name": "asker_confirm", "arguments": {"item": "x"}, "requestState": first["requestState"],
                "inputResponses": responses}, capabilities=ALL_CAPABILITIES, request_id=2))
        finally:
            running.stop()
    assert done["result"]["content"][0]["text"] == "confirmed x", done
    assert seen == [("tools/call", "asker_confirm", responses)]
