"""2025 tasks with real software, directly: the TypeScript SDK client's task API
(tests/node/ts_tasks.mjs, tests/ts_tasks.py) against the TypeScript reference server
server-everything, no gateway. What it shows is what a connection through the gateway must
show too (the same outcome, task ids being labels).

server-everything's ``simulate-research-query`` (``execution.taskSupport: "required"``)
works through four one-second stages; ambiguous, it asks the client which interpretation it
means (an ``elicitation/create`` tied to the task by the related-task ``_meta``, queued until
the client calls ``tasks/result``) and sits in ``input_required`` meanwhile. The client's
``callToolStream`` polls ``tasks/get`` while the task works; on ``input_required`` it calls
``tasks/result``, which carries the elicitation and then blocks until the task is done, so
the stream ends with the result and no ``completed`` taskStatus: that comes as a
``notifications/tasks/status`` (the server sends one for every change) and from
``tasks/get`` afterwards.

Needs ``scripts/install-node-mcp`` (skips without it, fails under CI).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.ts_tasks import (
    POLLED_STAGE,
    RELATED_TASK,
    comparable,
    outcome_diff,
    research_scenario,
    run_ts_tasks,
)

pytestmark = pytest.mark.timeout(90)

TASK_SHAPE = {"ttl": 300000, "pollInterval": 1000, "createdAt": "<time>", "lastUpdatedAt": "<time>"}
ASKING = 'Found multiple interpretations for "python". Requesting clarification...'
ANSWERED = "programming"  # the first interpretation offered for "python", the driver's canned answer


@pytest.fixture(scope="module")
def two_outcomes(everything) -> tuple[dict, dict]:
    """The scenario in two sessions at once (each waits out the research task's four one-second
    stages; test_tasks_relay runs one directly and one through the gateway at once too)."""
    with ThreadPoolExecutor(2) as pool:
        first, second = (pool.submit(run_ts_tasks, everything.mcp_url, research_scenario()) for _ in range(2))
        return first.result(), second.result()


@pytest.fixture(scope="module")
def outcome(two_outcomes):
    return two_outcomes[0]


def _steps(outcome: dict) -> dict[str, list[dict]]:
    steps: dict[str, list[dict]] = {}
    for step in outcome["steps"]:
        steps.setdefault(step["op"], []).append(step)
    return steps


def test_the_server_declares_tasks(outcome):
    assert "connect" not in outcome
    assert outcome["protocolVersion"] == "2025-11-25"
    assert outcome["tasksCapability"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}


def test_the_stream_goes_working_input_required_result(outcome):
    call = _steps(outcome)["callToolStream"][0]
    assert call["taskSupport"] == "required"
    # the first poll finds "Gathering sources..." (the first stage), or a later stage when it comes
    # more than a second after the task was created: POLLED_STAGE is one of RESEARCH_STAGES
    assert comparable(outcome)["steps"][0]["stream"] == [
        {"type": "taskCreated", "taskId": "T1", "status": "working", "ttl": 300000, "pollInterval": 1000},
        {"type": "taskStatus", "taskId": "T1", "status": "working", "ttl": 300000, "pollInterval": 1000,
         "statusMessage": POLLED_STAGE},
        {"type": "taskStatus", "taskId": "T1", "status": "input_required", "ttl": 300000, "pollInterval": 1000,
         "statusMessage": ASKING},
        {"type": "result", "result": call["stream"][-1]["result"]},
    ]
    result = call["stream"][-1]["result"]
    assert result["_meta"] == {RELATED_TASK: {"taskId": "T1"}}
    [content] = result["content"]
    assert content["type"] == "text"
    assert content["text"].startswith(f"# Research Report: python ({ANSWERED})\n")
    assert f"- **Clarification**: {ANSWERED}" in content["text"]
    assert "`working` → `input_required` → `working` → `completed`" in content["text"]


def test_the_elicitation_comes_for_the_task(outcome):
    call = _steps(outcome)["callToolStream"][0]
    [asked] = call["elicitations"]
    assert outcome["elicitations"] == [asked]
    assert asked["method"] == "elicitation/create"
    assert asked["message"].startswith('The research query "python" could have multiple interpretations.')
    assert asked["requestedSchema"]["required"] == ["interpretation"]
    offered = [choice["const"] for choice in asked["requestedSchema"]["properties"]["interpretation"]["oneOf"]]
    assert offered == ["programming", "snake", "comedy"]
    assert asked["relatedTask"] == "T1"  # the id the task was created with
    assert asked["after"] == "input_required"
    assert asked["answered"] == {"action": "accept", "content": {"interpretation": ANSWERED}}


def test_every_status_change_is_notified(outcome):
    notified = [(n["taskId"], n["status"], n.get("statusMessage")) for n in outcome["taskNotifications"]]
    assert notified == [
        ("T1", "working", "Gathering sources..."),
        ("T1", "working", "Analyzing content..."),
        ("T1", "working", "Synthesizing findings..."),
        ("T1", "input_required", ASKING),
        ("T1", "input_required", ASKING),  # again as the elicitation goes out (no new message)
        ("T1", "working", f'Continuing with interpretation: "{ANSWERED}"...'),
        ("T1", "working", "Generating report..."),
        ("T1", "completed", "Generating report..."),
        ("T2", "working", "Gathering sources..."),  # the cancelled task; cancelling is not notified
    ]
    assert all({key: n[key] for key in TASK_SHAPE} == TASK_SHAPE for n in outcome["taskNotifications"])
    assert outcome["otherNotifications"] == []


def test_get_result_and_list_after_completion(outcome):
    steps = _steps(outcome)
    completed = {"taskId": "T1", "status": "completed", "statusMessage": "Generating report...", **TASK_SHAPE}
    assert steps["waitTaskStatus"] == [{"op": "waitTaskStatus", "seen": True}]
    assert steps["tasks/get"][0] == {"op": "tasks/get", "result": completed}
    streamed = steps["callToolStream"][0]["stream"][-1]["result"]
    assert steps["tasks/result"][0] == {"op": "tasks/result", "result": streamed}
    assert steps["tasks/list"][0] == {"op": "tasks/list", "result": {"count": 1, "tasks": [completed]}}


def test_cancel_a_working_task(outcome):
    steps = _steps(outcome)
    started = steps["callToolStream"][1]
    assert started["stream"] == [
        {"type": "taskCreated", "taskId": "T2", "status": "working", "ttl": 300000, "pollInterval": 1000}]
    assert started["elicitations"] == []
    cancelled = {"taskId": "T2", "status": "cancelled", "statusMessage": "Client cancelled task execution.",
                 **TASK_SHAPE}
    assert steps["tasks/cancel"][0] == {"op": "tasks/cancel", "result": cancelled}
    assert steps["tasks/get"][1] == {"op": "tasks/get", "result": cancelled}
    assert steps["tasks/result"][1] == {"op": "tasks/result",
                                        "error": {"code": -32603, "message": "Task T2 has no result stored"}}
    # server-everything wraps its own McpError, so the prefix is in the message it sends
    assert steps["tasks/cancel"][1] == {"op": "tasks/cancel", "error": {
        "code": -32602, "message": "MCP error -32602: Cannot cancel task in terminal status: cancelled"}}
    listed = steps["tasks/list"][1]["result"]
    assert listed["count"] == 2
    assert [(task["taskId"], task["status"]) for task in listed["tasks"]] == [("T1", "completed"), ("T2", "cancelled")]


def test_the_outcome_is_the_same_every_time(two_outcomes):
    """What a comparison with the gateway needs: a second session, at the same time, gives the
    same outcome (neither sees the other's tasks, in tasks/list or in notifications)."""
    first, second = (comparable(outcome) for outcome in two_outcomes)
    assert second == first, outcome_diff(first, second)

