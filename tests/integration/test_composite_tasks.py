"""Composite tools as tasks, one worker (issue 24, item 3): a client that accepts tasks gets
one at once and the run goes on; the task's status names the step in progress; an
elicitation step waits as ``input_required`` and is answered with ``tasks/update``
(2026-07-28) or on the stream of ``tasks/result`` (2025-11-25: the TypeScript SDK client's
task API); a tool error is ``completed`` with ``isError`` in 2026-07-28 and ``failed`` in
2025; results are kept for ``operational.tasks.resultTTL`` (or less, when the client asks);
a per-user cap refuses more live tasks, and a worker holding its cap of runs answers 503. Two workers with Redis: test_composite_tasks_shared."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from tests import node_mcp
from tests.backends import sdk_backend
from tests.gateway import backend_entry, wait_until
from tests.integration.test_composite_tasks_shared import (
    CAREFUL_ECHO,
    SLOW_ECHO,
    start_task,
    task_of,
    wait_for,
)
from tests.task_backends import client_capabilities, modern_rpc
from tests.ts_tasks import run_ts_tasks

pytestmark = pytest.mark.timeout(120)

DOOMED = {"name": "doomed", "description": "A step that fails",
          "parameters": {"type": "object", "properties": {}},
          "steps": [{"id": "boom", "tool": "plain_fail", "arguments": {}}]}


@pytest.fixture(scope="module")
def backend():
    served = sdk_backend("plain", ["echo", "sleep", "fail"])
    yield served
    served.stop()


@pytest.fixture
def gateway(start_gateway, backend):
    def start(**tasks):
        return start_gateway({"name": "tasks", "backends": [backend_entry("plain", backend)],
                              "compositeTools": [CAREFUL_ECHO, SLOW_ECHO, DOOMED],
                              "operational": {"tasks": {"pollInterval": "200ms", **tasks}}})
    return start


def test_the_typescript_task_api_runs_a_composite_as_a_2025_task(gateway):
    node_mcp.need_node_mcp()
    outcome = run_ts_tasks(gateway().url, {"steps": [
        {"op": "callToolStream", "name": "careful_echo", "arguments": {"text": "hi"}},
        {"op": "tasks/get", "task": "T1"},
        {"op": "tasks/result", "task": "T1"},
        {"op": "tasks/list"},
        {"op": "callToolStream", "name": "slow_echo", "arguments": {"seconds": 30}, "until": "taskCreated"},
        {"op": "tasks/cancel", "task": "T2"},
        {"op": "tasks/result", "task": "T2"},
        {"op": "tasks/cancel", "task": "T2"},
    ]})
    call, got, result, listed, slow, cancelled, cancelled_result, again = outcome["steps"]
    assert call["taskSupport"] == "optional"  # the client asks for a task because the listing says it may
    stream = call["stream"]
    assert [stream[0]["type"], stream[1]["type"], stream[1]["status"], stream[-1]["type"]] == \
        ["taskCreated", "taskStatus", "input_required", "result"]
    (asked,) = call["elicitations"]
    assert asked["message"] == "Echo hi?" and asked["relatedTask"] == "T1" and asked["after"] == "input_required"
    assert call["stream"][-1]["result"]["structuredContent"] == {"result": "plain:hi loud=true"}
    assert got["result"]["status"] == "completed" and got["result"]["ttl"] == 3_600_000
    assert result["result"]["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": "T1"}
    assert [task["taskId"] for task in listed["result"]["tasks"]] == ["T1"]
    assert slow["stream"][0]["type"] == "taskCreated" and cancelled["result"]["status"] == "cancelled"
    assert cancelled_result["error"] == {"code": -32603, "message": "The task was cancelled"}
    assert again["error"]["code"] == -32602  # a terminal task cannot be cancelled (2025-11-25)


def test_a_2026_client_sees_the_step_in_progress_and_the_answer(gateway):
    url = gateway().url
    handle = start_task(url, "slow_echo", {"seconds": 0.6})
    assert wait_for(url, handle, "working")["statusMessage"] == "running step 'nap' (0 of 2 steps done)"
    done = wait_for(url, handle, "completed")
    assert done["result"]["structuredContent"] == {"result": "plain:woke"}
    assert done["ttlMs"] == 3_600_000 and done["pollIntervalMs"] == 200 and done["statusMessage"] == "completed"


def test_a_tool_error_is_completed_in_2026_and_failed_in_2025(gateway):
    served = gateway()
    handle = start_task(served.url, "doomed", {})
    modern = wait_for(served.url, handle, "completed")
    assert modern["result"]["isError"] is True and "plain failed on purpose" in modern["result"]["content"][0]["text"]
    session = served.initialize()
    created = served.rpc(session, "tools/call", {"name": "doomed", "arguments": {}, "task": {"ttl": 5000}})
    legacy = created["result"]["task"]
    assert legacy["ttl"] == 5000  # the client asked for less than the configured TTL
    assert wait_until(lambda: served.rpc(session, "tasks/get", {"taskId": legacy["taskId"]})["result"]["status"]
                      != "working", timeout=10, interval=0.05)
    assert served.rpc(session, "tasks/get", {"taskId": legacy["taskId"]})["result"]["status"] == "failed"
    result = served.rpc(session, "tasks/result", {"taskId": legacy["taskId"]})["result"]
    assert result["isError"] is True  # what the call itself would have answered


def test_an_elicitation_step_needs_a_client_that_can_answer(gateway):
    url = gateway().url
    answer = modern_rpc(url, "tools/call", {"name": "careful_echo", "arguments": {"text": "x"}},
                        capabilities=client_capabilities(elicitation=False))
    done = wait_for(url, answer["result"]["taskId"], "completed")
    assert done["result"]["isError"] is True and "needs the client to support elicitation" in \
        done["result"]["content"][0]["text"]


def test_a_client_without_tasks_gets_the_answer_of_a_plain_call(gateway):
    url = gateway().url
    answer = modern_rpc(url, "tools/call", {"name": "slow_echo", "arguments": {"seconds": 0.1}},
                        capabilities=client_capabilities(tasks=False))
    assert answer["result"]["structuredContent"] == {"result": "plain:woke"} and "taskId" not in answer["result"]


def test_live_tasks_are_capped_per_user_and_results_expire(gateway):
    url = gateway(maxLivePerUser=2, resultTTL="1s").url
    first, second = (start_task(url, "slow_echo", {"seconds": 30}) for _ in range(2))
    refused = modern_rpc(url, "tools/call", {"name": "slow_echo", "arguments": {"seconds": 30}})
    assert refused["error"]["code"] == -32600 and refused["error"]["data"] == {"maxLiveTasks": 2}
    assert "2 of at most 2" in refused["error"]["message"]
    modern_rpc(url, "tasks/cancel", {"taskId": first})
    third = start_task(url, "slow_echo", {"seconds": 0.1})  # an ended task frees its place
    done = wait_for(url, third, "completed")
    assert done["ttlMs"] == 1000
    ended = datetime.fromisoformat(done["lastUpdatedAt"]).timestamp()  # to the ms, rounded down
    gone = wait_until(lambda: modern_rpc(url, "tasks/get", {"taskId": third}).get("error"), timeout=10, interval=0.05)
    assert time.time() - ended >= 1.0  # kept for its resultTTL from its end, not less
    assert gone and gone["code"] == -32602 and "expired" in gone["message"], gone
    modern_rpc(url, "tasks/cancel", {"taskId": second})
    assert task_of(url, second)["status"] == "cancelled"


def test_a_worker_at_its_cap_of_runs_answers_503_with_retry_after_in_both_revisions(gateway):
    from tests.task_backends import modern_post

    served = gateway(maxLivePerWorker=1)
    first = start_task(served.url, "slow_echo", {"seconds": 30})
    refused = modern_post(served.url, "tools/call", {"name": "slow_echo", "arguments": {"seconds": 30}})
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
    assert refused.json()["error"]["data"] == {"maxLiveTasksPerWorker": 1, "retryAfterSeconds": 5}
    session = served.initialize()
    legacy = served.post({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "slow_echo", "arguments": {"seconds": 30}, "task": {}}}, session,
        headers={"MCP-Protocol-Version": "2025-11-25"})
    assert legacy.status_code == 503 and legacy.headers["Retry-After"] == "5"
    assert legacy.json()["id"] == 7 and "runs as many tasks as it may (1)" in legacy.json()["error"]["message"]
    modern_rpc(served.url, "tasks/cancel", {"taskId": first})

    def another_task() -> str | None:
        """A new task's id once the cancelled run has ended and given its place back (the
        cancel is answered before the run stops); None while the worker is still full."""
        answer = modern_rpc(served.url, "tools/call", {"name": "slow_echo", "arguments": {"seconds": 0.1}})
        if "maxLiveTasksPerWorker" in (answer.get("error") or {}).get("data", {}):
            return None
        assert answer["result"]["resultType"] == "task", answer
        return answer["result"]["taskId"]
    started = wait_until(another_task, timeout=10)
    assert started and wait_for(served.url, started, "completed")  # room again


def test_cancelling_a_task_cancels_its_step_call_at_the_backend(start_gateway):
    from tests.backends import restartable_backend

    with restartable_backend("raw") as raw:
        napping = {"name": "napping", "description": "One long backend call",
                   "parameters": {"type": "object", "properties": {}},
                   "steps": [{"id": "nap", "tool": "raw_sleep", "arguments": {"seconds": 30}, "timeout": "60s"}]}
        url = start_gateway({"name": "tasks", "backends": [backend_entry("raw", raw)],
                             "compositeTools": [napping]}).url
        handle = start_task(url, "napping", {})
        (call,) = raw.wait_for("tools/call")
        modern_rpc(url, "tasks/cancel", {"taskId": handle})
        (cancelled,) = raw.wait_for("notifications/cancelled")  # the run's end reached the backend
        assert cancelled.params["requestId"] == call.id
        assert task_of(url, handle)["status"] == "cancelled"
