"""A request holds its session and user for exactly as long as it runs, however it ends:
a call whose client dropped keeps its lease until the call ends, and a request refused
after taking a hold lets go of it. Real SDK backend, real gateway over HTTP."""

from __future__ import annotations

import json
import time

import pytest
import requests

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
    rows = _directory(gateway).overview()["sessions"]
    return next(activity["inFlight"] for record, activity in rows if record.session_id == session_id)


def test_a_call_whose_client_dropped_keeps_its_lease_and_user_until_it_ends(start_gateway, plain):
    gateway = start_gateway({"name": "t", "backends": [backend_entry("plain", plain)],
                             "operational": {"userIdleTimeout": "200ms", "sessionTTL": "60s"}})
    session_id = gateway.initialize("2025-11-25")
    response = requests.post(gateway.url, json={
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "plain_progress", "arguments": {"steps": 6, "delay": 0.5}, "_meta": {"progressToken": "p"}}},
        headers={**MCP_HEADERS, "Mcp-Session-Id": session_id}, stream=True, timeout=30)
    events = iter_sse_events(response.iter_lines())
    priming = next(events)
    assert priming.id and priming.data == ""
    first = next(events)
    assert json.loads(first.data)["method"] == "notifications/progress"
    response.close()  # the client leaves; the 2025-11-25 call goes on for a resume

    time.sleep(1.0)  # well past userIdleTimeout: an idle user would have been released by now
    assert _in_flight(gateway, session_id) == 1
    assert any(user.key.label == "anonymous" for user in _directory(gateway).live_users())

    resumed = requests.get(gateway.url, headers={**MCP_HEADERS, "Mcp-Session-Id": session_id,
                                                 "Last-Event-ID": first.id}, stream=True, timeout=30)
    rest = [json.loads(event.data) for event in iter_sse_events(resumed.iter_lines()) if event.data.strip()]
    assert rest[-1]["id"] == 7 and rest[-1]["result"]["content"][0]["text"] == "done"
    wait_until(lambda: _in_flight(gateway, session_id) == 0, 5)


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
