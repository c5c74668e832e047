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

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.gateway import answer_of, wait_until
from tests.task_backends import (
    TERMINAL,
    client_capabilities,
    listen,
    modern_rpc,
    poll_task,
    task_backend,
)
from tests.ts_tasks import comparable, outcome_diff, research_scenario, run_ts_tasks

pytestmark = pytest.mark.timeout(120)

BACKEND = "everything"


@pytest.fixture
def gateway(start_gateway, everything):
    return start_gateway({"name": "t", "backends": [{"name": BACKEND, "url": everything.mcp_url}]})


def test_the_task_api_gives_through_the_gateway_what_it_gives_directly(everything, gateway):
    # side by side: each waits out the research task's four one-second stages (sessions of
    # server-everything keep their tasks apart: test_ts_tasks_direct runs two at once too)
    with ThreadPoolExecutor(2) as pool:
        direct = pool.submit(run_ts_tasks, everything.mcp_url, research_scenario())
        through = pool.submit(run_ts_tasks, gateway.url, research_scenario(f"{BACKEND}_simulate-research-query"))
        direct, through = comparable(direct.result()), comparable(through.result())
    assert through == direct, outcome_diff(direct, through)


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


# -- 2026-07-28: the tasks extension (tests/task_backends.py) --------------------------------------


@pytest.fixture
def jobs():
    with task_backend("jobs", delay=0.3, job_seconds=0.2) as backend:
        yield backend


@pytest.fixture
def jobs_gateway(start_gateway, jobs):
    return start_gateway({"name": "t", "backends": [{"name": "jobs", "url": jobs.mcp_url}]})


def test_a_modern_task_is_relayed_under_a_handle_and_its_input_goes_back(jobs_gateway, jobs):
    url = jobs_gateway.url
    created = modern_rpc(url, "tools/call", {"name": "jobs_confirm_delete", "arguments": {"filename": "a.txt"}})
    task = created["result"]
    assert task["resultType"] == "task" and task["status"] == "working"
    handle = task["taskId"]
    assert handle not in jobs.tasks  # the backend's id never reaches the client
    (backend_id,) = jobs.tasks
    jobs.wait_for_status(backend_id, "input_required")
    asked = modern_rpc(url, "tasks/get", {"taskId": handle})["result"]
    assert asked["taskId"] == handle and asked["status"] == "input_required" and asked["resultType"] == "complete"
    (key,) = asked["inputRequests"]
    assert modern_rpc(url, "tasks/update", {"taskId": handle, "inputResponses": {
        key: {"action": "accept", "content": {"confirm": True}}}})["result"]["resultType"] == "complete"
    jobs.wait_for_status(backend_id, "completed")
    done = modern_rpc(url, "tasks/get", {"taskId": handle})["result"]
    assert done["status"] == "completed" and done["result"]["content"][0]["text"].startswith("Deleted")


def test_a_modern_handle_is_the_callers_only(start_gateway, jobs):
    from tests.idp import LocalIdP

    idp = LocalIdP("tasks-idp").start()
    try:
        gateway = start_gateway({"name": "t", "backends": [{"name": "jobs", "url": jobs.mcp_url}],
                                 "incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": "vmcp"}}})
        alice, bob = ({"Authorization": f"Bearer {idp.issue_token(person, 'vmcp')}"} for person in ("alice", "bob"))
        url = gateway.url
        handle = modern_rpc(url, "tools/call", {"name": "jobs_run_until_cancelled", "arguments": {}},
                            headers=alice)["result"]["taskId"]
        forged = modern_rpc(url, "tasks/get", {"taskId": handle[:-4] + "AAAA"}, headers=alice)
        assert forged["error"]["code"] == -32602
        # the same caller declaring other capabilities on its tasks/get is still the caller
        fewer = client_capabilities(elicitation=False)
        assert modern_rpc(url, "tasks/get", {"taskId": handle}, headers=alice,
                          capabilities=fewer)["result"]["status"] == "working"
        seen = len(jobs.requests("tasks/get"))
        other = modern_rpc(url, "tasks/get", {"taskId": handle}, headers=bob)
        assert other["error"]["code"] == -32602 and "another caller" in other["error"]["message"]
        assert len(jobs.requests("tasks/get")) == seen  # refused before any backend was asked
        assert modern_rpc(url, "tasks/cancel", {"taskId": handle}, headers=alice)["result"]["resultType"] == "complete"
    finally:
        idp.stop()


def test_a_client_without_the_extension_gets_no_task(jobs_gateway, jobs):
    url = jobs_gateway.url
    plain = client_capabilities(tasks=False)
    answered = modern_rpc(url, "tools/call", {"name": "jobs_delayed_echo", "arguments": {"text": "x", "seconds": 0.1}},
                          capabilities=plain)
    assert answered["result"]["content"][0]["text"] == "jobs:x" and answered["result"].get("resultType") != "task"
    refused = modern_rpc(url, "tasks/get", {"taskId": "anything"}, capabilities=plain)
    assert refused["error"]["code"] == -32021
    assert refused["error"]["data"] == {"requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}


def test_a_2025_client_gets_a_modern_backends_task_in_its_own_revision(jobs_gateway, jobs):
    session = jobs_gateway.initialize()
    created = jobs_gateway.rpc(session, "tools/call", {"name": "jobs_delayed_echo",
                                                       "arguments": {"text": "y", "seconds": 0.2}, "task": {"ttl": 60000}})
    task = created["result"]["task"]
    assert set(task) >= {"taskId", "status", "createdAt", "lastUpdatedAt", "ttl"} and "ttlMs" not in task
    got = jobs_gateway.rpc(session, "tasks/get", {"taskId": task["taskId"]})["result"]
    assert got["taskId"] == task["taskId"] and "result" not in got and "resultType" not in got
    result = jobs_gateway.rpc(session, "tasks/result", {"taskId": task["taskId"]})["result"]
    assert result["content"][0]["text"] == "jobs:y"


def test_task_creation_and_its_ends_are_audited(start_gateway, jobs, tmp_path):
    import json

    path = tmp_path / "audit.log"
    gateway = start_gateway({"name": "t", "backends": [{"name": "jobs", "url": jobs.mcp_url}],
                             "audit": {"enabled": True, "logFile": str(path)}})
    handle = modern_rpc(gateway.url, "tools/call", {"name": "jobs_delayed_echo",
                                                    "arguments": {"text": "z", "seconds": 0.1}})["result"]["taskId"]
    (backend_id,) = jobs.tasks
    jobs.wait_for_status(backend_id, "completed")
    modern_rpc(gateway.url, "tasks/get", {"taskId": handle})
    written = [json.loads(line) for line in path.read_text().splitlines()]
    created, polled = written[-2], written[-1]
    assert created["type"] == "mcp_tool_call" and created["outcome"] == "task_created"
    assert polled["type"] == "mcp_task" and polled["method"] == "tasks/get" and polled["outcome"] == "task_completed"
    assert created["task"] == polled["task"] == handle[:12] and created["backend"] == "jobs"


def test_a_listen_stream_hears_the_tasks_it_names(jobs_gateway, jobs):
    url = jobs_gateway.url
    handle = modern_rpc(url, "tools/call", {"name": "jobs_delayed_echo",
                                            "arguments": {"text": "w", "seconds": 0.6}})["result"]["taskId"]
    with listen(url, [handle, "forged"]) as stream:
        acknowledged = stream.next()
        assert acknowledged["method"] == "notifications/subscriptions/acknowledged"
        assert acknowledged["params"]["notifications"]["taskIds"] == [handle]  # not the forged one
        states = []
        while not states or states[-1]["status"] != "completed":
            notification = stream.next()
            assert notification["method"] == "notifications/tasks" and notification["params"]["taskId"] == handle
            states.append(notification["params"])
    assert states[0]["status"] == "working" and states[-1]["result"]["content"][0]["text"] == "jobs:w"
    refused = listen(url, [handle], capabilities=client_capabilities(tasks=False))
    assert refused.json()["error"]["code"] == -32021


def test_a_modern_client_gets_a_2025_backends_task_as_the_extension_has_it(gateway, everything):
    created = modern_rpc(gateway.url, "tools/call", {"name": f"{BACKEND}_simulate-research-query",
                                                     "arguments": {"topic": "rust"}})["result"]
    assert created["resultType"] == "task" and "ttlMs" in created and "ttl" not in created
    handle = created["taskId"]
    states: list[dict] = []

    def completed() -> bool:
        states.append(modern_rpc(gateway.url, "tasks/get", {"taskId": handle})["result"])
        assert states[-1]["taskId"] == handle and states[-1]["resultType"] == "complete"  # on every poll
        return states[-1]["status"] == "completed"

    assert wait_until(completed, timeout=30, interval=0.1), states[-1]
    assert "Research Report: rust" in states[-1]["result"]["content"][0]["text"]


def test_another_worker_serves_a_handle_before_it_has_spoken_to_the_backend(start_gateway, jobs, monkeypatch):
    monkeypatch.setenv("TASKS_SIGNING_KEY", "tasks-signing-key-0123456789abcdef")
    config = {"name": "t", "backends": [{"name": "jobs", "url": jobs.mcp_url}],
              "operational": {"signingKeyEnv": "TASKS_SIGNING_KEY"}}
    first, second = start_gateway(config), start_gateway(config)
    handle = modern_rpc(first.url, "tools/call", {"name": "jobs_run_until_cancelled", "arguments": {}})["result"]["taskId"]
    got = modern_rpc(second.url, "tasks/get", {"taskId": handle})  # the second worker's first request
    assert got["result"]["taskId"] == handle and got["result"]["status"] == "working", got
    assert modern_rpc(second.url, "tasks/cancel", {"taskId": handle})["result"]["resultType"] == "complete"


def test_a_client_that_asked_no_task_gets_the_result_of_one_a_backend_made_anyway(start_gateway):
    with task_backend("eager", eager=True, poll_interval_ms=50) as eager:
        gateway = start_gateway({"name": "t", "backends": [{"name": "eager", "url": eager.mcp_url}]})
        answer = modern_rpc(gateway.url, "tools/call", {"name": "eager_delayed_echo",
                                                        "arguments": {"text": "m", "seconds": 0.3}},
                            capabilities=client_capabilities(tasks=False))
        assert answer["result"]["content"][0]["text"] == "eager:m" and "taskId" not in answer["result"]
        session = gateway.initialize()  # a 2025 client that sent no params.task
        legacy = gateway.rpc(session, "tools/call", {"name": "eager_delayed_echo",
                                                     "arguments": {"text": "l", "seconds": 0.3}})["result"]
        assert legacy["content"][0]["text"] == "eager:l" and "task" not in legacy
        assert "io.modelcontextprotocol/related-task" not in (legacy.get("_meta") or {})
        assert len(eager.tasks) == 2 and len(eager.requests("tasks/get")) >= 2  # it was polled, not lost


def test_a_task_only_tool_called_without_a_task_answers_as_it_does_directly(gateway, everything, jobs_gateway, jobs):
    from mcp.shared.exceptions import MCPError

    from tests.gateway import run_client

    async def call(client, name):
        try:
            result = await client.call_tool(name, {"topic": "x"})
            return result.is_error, [block.text for block in result.content]
        except MCPError as error:
            return error.error.code, error.error.message

    direct = run_client(everything.mcp_url, lambda client: call(client, "simulate-research-query"))
    through = run_client(gateway.url, lambda client: call(client, f"{BACKEND}_simulate-research-query"))
    assert through == direct and direct[0] is True, direct  # server-everything: a tool error that says so
    assert "task" in " ".join(direct[1])
    plain = client_capabilities(tasks=False)
    direct = modern_rpc(jobs.mcp_url, "tools/call", {"name": "failing_job", "arguments": {}}, capabilities=plain)
    through = modern_rpc(jobs_gateway.url, "tools/call", {"name": "jobs_failing_job", "arguments": {}},
                         capabilities=plain)
    assert through["error"]["code"] == direct["error"]["code"] == -32021
    assert through["error"]["data"] == direct["error"]["data"]


def test_a_2025_client_gets_the_answer_of_a_modern_task_only_tool(jobs_gateway, jobs):
    session = jobs_gateway.initialize()  # sends no params.task: 2025 clients see no taskSupport there
    answer = jobs_gateway.rpc(session, "tools/call", {"name": "jobs_failing_job", "arguments": {}})
    assert answer["result"]["isError"] is True and "taskId" not in answer["result"], answer
    (backend_id,) = jobs.tasks  # the backend was told the extension, made a task, and it was waited for
    assert jobs.tasks[backend_id].status == "completed"


def _research_until_asked(url: str, handle_of: list[str] | None = None, *, within: float = 30.0) -> tuple[str, dict]:
    """A 2026-07-28 client's research task on server-everything (a 2025 backend), polled
    until it asks (its question comes only on the stream of tasks/result there)."""
    created = modern_rpc(url, "tools/call", {"name": f"{BACKEND}_simulate-research-query",
                                             "arguments": {"topic": "rust", "ambiguous": True}})["result"]
    handle = created["taskId"]
    return handle, poll_task(url, handle, {"input_required", *TERMINAL}, timeout=within, interval=0.1)


def _finished(url: str, handle: str, *, within: float = 30.0) -> dict:
    return poll_task(url, handle, TERMINAL, timeout=within, interval=0.1)


def _research_question(state: dict) -> tuple[str, dict]:
    assert state["status"] == "input_required", state
    (key, request), = state["inputRequests"].items()
    assert request["method"] == "elicitation/create"
    assert "could have multiple interpretations" in request["params"]["message"]
    assert "interpretation" in request["params"]["requestedSchema"]["properties"]
    assert "io.modelcontextprotocol/related-task" not in (request["params"].get("_meta") or {})
    return key, request


def test_a_modern_client_answers_a_2025_backends_task_question_with_tasks_update(gateway, everything):
    """The 2025 backend asks on tasks/result's stream only; the 2026 client sees the
    question in tasks/get (again on every poll until answered) and answers with tasks/update."""
    handle, state = _research_until_asked(gateway.url)
    key, request = _research_question(state)
    again = modern_rpc(gateway.url, "tasks/get", {"taskId": handle})["result"]
    assert again["status"] == "input_required" and again["inputRequests"] == {key: request}  # held, not lost
    ignored = modern_rpc(gateway.url, "tasks/update", {"taskId": handle, "inputResponses": {"nothing-asked": {}}})
    assert ignored["result"]["resultType"] == "complete"
    assert modern_rpc(gateway.url, "tasks/update", {"taskId": handle, "inputResponses": "no"})["error"]["code"] == -32602
    answered = modern_rpc(gateway.url, "tasks/update", {"taskId": handle, "inputResponses": {
        key: {"action": "accept", "content": {"interpretation": "technical"}}}})
    assert answered["result"]["resultType"] == "complete"
    done = _finished(gateway.url, handle)
    assert done["status"] == "completed", done
    assert "Research Report: rust (technical)" in done["result"]["content"][0]["text"]


def test_another_worker_answers_a_2025_backends_task_question(start_gateway, everything, redis_server, monkeypatch):
    """Heard on one worker, answered on the other: the answer goes to the user's backend
    session under the backend's request id, whichever worker heard the question."""
    monkeypatch.setenv("RELAY_SIGNING_KEY", "relay-signing-key-0123456789abcdef")
    settings = {"name": "t", "backends": [{"name": BACKEND, "url": everything.mcp_url}],
                "operational": {"signingKeyEnv": "RELAY_SIGNING_KEY"},
                "sessionStorage": {"provider": "redis", "address": redis_server.address, "keyPrefix": "rq:"}}
    first, second = (start_gateway(settings) for _ in range(2))
    handle, state = _research_until_asked(first.url)
    key, request = _research_question(state)
    assert modern_rpc(second.url, "tasks/get", {"taskId": handle})["result"]["inputRequests"] == {key: request}
    import redis as redis_client
    raw = redis_client.Redis(port=redis_server.port)
    held = [raw.get(name) for name in raw.keys("rq:q:*")]
    assert held and not any(b"interpretations" in blob for blob in held)  # held in Redis, encrypted
    answered = modern_rpc(second.url, "tasks/update", {"taskId": handle, "inputResponses": {
        key: {"action": "accept", "content": {"interpretation": "historical"}}}})
    assert answered["result"]["resultType"] == "complete"
    done = _finished(first.url, handle)
    assert done["status"] == "completed" and "Research Report: rust (historical)" in done["result"]["content"][0]["text"]
