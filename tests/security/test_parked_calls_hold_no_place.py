"""A 2026-07-28 client that never comes back cannot exhaust a backend's bulkhead (issue 35).
A call whose 2025 backend asked the client something mid-call is parked in the gateway
(answered ``input_required``) until the client retries with the answer or the deadline
passes. While parked it holds no place of ``maxConcurrentCalls``: it gave it back, and its
retry takes one again, like a new call, before the answer reaches the backend.

Here the bulkhead has N places, N calls are parked and never continued, and a new call is
still served at once, while they are all still parked; then a parked one is continued and
finishes (it found a place again)."""

from __future__ import annotations

import pytest

from tests.gateway import backend_entry
from tests.integration.test_modern import ALL_CAPABILITIES, PREFIX, answer
from tests.mrtr_backends import mrtr_backend
from tests.task_backends import modern_post

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

PLACES = 2
# The parked calls' deadline: far beyond the new call's own patience (CLIENT_PATIENCE), so
# no parked call ends, freeing its place, while the test runs.
DEADLINE = "60s"
CLIENT_PATIENCE = 20.0  # seconds the new call's client waits for its answer (it comes at once)


def confirm(gateway, item: str, **retry) -> dict:
    response = modern_post(gateway.url, "tools/call", {"name": "asker_confirm", "arguments": {"item": item}, **retry},
                           capabilities=ALL_CAPABILITIES, timeout=CLIENT_PATIENCE)
    return answer(response)


def test_parked_calls_nobody_continues_leave_the_bulkhead_to_new_calls(start_gateway):
    with mrtr_backend("asker") as asker:
        gateway = start_gateway({
            "name": "bulkhead", "aggregation": PREFIX,
            "backends": [{**backend_entry("asker", asker, "legacy"), "maxConcurrentCalls": PLACES}],
            "operational": {"timeouts": {"default": DEADLINE}}})
        runtime = gateway.app.extensions["vmcp_actors"]
        parked = [confirm(gateway, f"never-{n}")["result"] for n in range(PLACES)]
        assert all(result["resultType"] == "input_required" for result in parked), parked
        assert runtime.service.parked.count() == PLACES
        held = runtime.bulkheads.snapshot()["asker"]
        assert held["inFlight"] == 0, f"parked calls hold places of the bulkhead: {held}"

        fresh = confirm(gateway, "new")["result"]  # it reaches the backend: it found a place
        assert fresh["resultType"] == "input_required", fresh
        (key,) = fresh["inputRequests"]
        done = confirm(gateway, "new", inputResponses={key: {"action": "accept", "content": {"ok": True}}},
                       requestState=fresh["requestState"])
        assert done["result"]["content"][0]["text"] == "confirmed new", done
        assert runtime.service.parked.count() == PLACES  # the ones never continued still wait

        (first_key,) = parked[0]["inputRequests"]  # a parked one continued late takes a place again
        late = confirm(gateway, "never-0", inputResponses={first_key: {"action": "accept", "content": {"ok": True}}},
                       requestState=parked[0]["requestState"])
        assert late["result"]["content"][0]["text"] == "confirmed never-0", late
        assert runtime.bulkheads.snapshot()["asker"]["inFlight"] == 0
        assert runtime.service.parked.count() == PLACES - 1
