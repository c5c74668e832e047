"""The tasks backend (tests/task_backends.py) against the official conformance suite, directly,
and its flows over raw HTTP.

* The conformance suite 0.2.0-alpha.12 runs its 2026-07-28 requirement set
  (``server --requirements 2026-07-28``) straight at the backend: every ``tasks-*`` scenario
  (the tasks extension, SEP-2663) must pass, and the transport scenarios the backend can answer
  (header validation, DNS rebinding, tools/list). The rest of the set calls tools of the
  conformance fixture (tests/conformance/fixture_server.py) this backend does not have.
  Needs ``scripts/install-conformance`` (skipped without it, failed under CI=true).
* Raw HTTP: each tool's task flow, the -32021 answers to a client without the extension,
  unknown and expired task ids, the request headers, and subscriptions/listen.

Run only these: ``.venv/bin/python -m pytest tests/integration/test_task_backend_conformance.py``.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest
import requests

from tests.conformance import (
    MODERN_EXTENSION,
    MODERN_REQUIREMENTS,
    MODERN_SUITE_VERSION,
    SUITE_TIMEOUT,
    Suite,
    SuiteRun,
    run_suite,
)
from tests.conformance.test_conformance import installed_suite
from tests.gateway import QuickStopGatewayServer, wait_until
from tests.task_backends import (
    HEADER_MISMATCH,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    PROTOCOL_VERSION,
    TASKS_EXTENSION,
    TOOL_NAMES,
    UNSUPPORTED_PROTOCOL_VERSION,
    TaskBackend,
    client_capabilities,
    listen,
    modern_post,
    modern_rpc,
    poll_task,
    task_backend,
)

INVALID_PARAMS = -32602
METHOD_NOT_FOUND = -32601
TASK_SCENARIOS = tuple(name for name in MODERN_EXTENSION if name.startswith("tasks-"))
# 0.2.0-alpha.12 ships this one as a placeholder: its only check is SKIPPED (the harness does
# not read subscriptions/listen yet). test_listen_* below cover task notifications instead.
PLACEHOLDER_SCENARIOS = frozenset({"tasks-status-notifications"})
# How many checks each scenario writes in 0.2.0-alpha.12, its schema check of the backend's
# messages (wire-schema-valid) included: all of them pass straight at the backend.
PASSING_CHECKS = {
    "tasks-lifecycle": 9, "tasks-capability-negotiation": 5, "tasks-wire-fields": 4,
    "tasks-request-state-removal": 3, "tasks-mrtr-input": 4, "tasks-request-headers": 5,
    "tasks-dispatch-and-envelope": 9, "tasks-status-notifications": 0, "tasks-required-task-error": 3,
    "tasks-mrtr-composition": 2,
}
# Scenarios of the requirement set that test the wire, not fixture tools: the backend passes them.
WIRE_SCENARIOS = ("tools-list", "dns-rebinding-protection", "http-header-validation")
NO_TASKS = client_capabilities(tasks=False)
# The backend the suite runs at. The suite waits for each task it starts to end, and checks
# statuses and shapes, never how long a task took: failing_job, protocol_error_job and
# test_tool_with_task's task work 0.1 s, not 1 s, 1 s and 0.5 s; slow_compute a quarter of the
# seconds asked (its 2 s task, which the suite polls right after creating it, still works 0.5 s;
# its 60 s ones, which it cancels, 15 s). That is 4-5 s less per run.
SUITE_BACKEND = {"job_seconds": 0.1, "delay": 0.1, "compute_scale": 0.25}


# -- the conformance suite, straight at the backend (and through the gateway, side by side) -----


@pytest.fixture(scope="module")
def modern_suite() -> Suite:
    return installed_suite(MODERN_SUITE_VERSION)


@pytest.fixture(scope="module")
def suite_runs(modern_suite: Suite, tmp_path_factory) -> dict[str, SuiteRun]:
    """One ``server --requirements 2026-07-28`` run straight at a backend and one through the
    gateway in front of another, side by side (each mostly waits on its backend's tasks and the
    suite's own read timeouts: together they take the time of the longer one, about 10 s)."""
    with ThreadPoolExecutor(2, thread_name_prefix="suite") as pool:
        directly = pool.submit(_run_directly, modern_suite, tmp_path_factory.mktemp("suite"))
        through = pool.submit(_run_through_the_gateway, modern_suite, tmp_path_factory.mktemp("through"))
        return {"directly": directly.result(), "through the gateway": through.result()}


def _run_directly(suite: Suite, workdir: Path) -> SuiteRun:
    with task_backend("tasks", **SUITE_BACKEND) as backend:
        return run_suite(suite, backend.mcp_url, MODERN_REQUIREMENTS, workdir, expected_failures=None)


def _run_through_the_gateway(suite: Suite, workdir: Path) -> SuiteRun:
    """The gateway in front of the backend, relaying its tasks under handles. The gateway is
    stopped before the tests read the run: actors do not outlive a test."""
    import pykka

    with task_backend("tasks", **SUITE_BACKEND) as backend:
        gateway = QuickStopGatewayServer({"name": "vmcp-tasks", "backends": [{"name": "tasks", "url": backend.mcp_url}],
                                          "aggregation": {"conflictResolution": "manual"},
                                          "operational": {"timeouts": {"default": "10s"}}}).start()
        try:
            return run_suite(suite, gateway.url, MODERN_REQUIREMENTS, workdir, expected_failures=None)
        finally:
            gateway.stop()
            pykka.ActorRegistry.stop_all()


@pytest.fixture(scope="module")
def requirement_run(suite_runs: dict[str, SuiteRun]) -> SuiteRun:
    """The run straight at the backend."""
    run = suite_runs["directly"]
    shown = set(TASK_SCENARIOS) | set(WIRE_SCENARIOS)  # the others call conformance-fixture tools
    rows = [row for row in run.table().splitlines() if row.split()[1] in shown]
    print("\ntasks backend directly, 2026-07-28, its scenarios of the set:\n" + "\n".join(rows))
    assert run.checks and not run.timed_out, f"the suite did not run to the end\n{run.report()}"
    return run


@pytest.mark.conformance
def test_the_suite_has_ten_tasks_scenarios(modern_suite: Suite) -> None:
    listed = modern_suite.requirements(MODERN_REQUIREMENTS)
    tasks = tuple(name for name in listed.reason("extension") if name.startswith("tasks-"))
    assert tasks == TASK_SCENARIOS and set(PASSING_CHECKS) == set(tasks)
    assert len(tasks) == 10


@pytest.mark.conformance
@pytest.mark.timeout(SUITE_TIMEOUT + 60)
@pytest.mark.parametrize("scenario", TASK_SCENARIOS)
def test_every_tasks_scenario_passes_directly(requirement_run: SuiteRun, scenario: str) -> None:
    checks = assert_scenario_passed(requirement_run, scenario)
    if scenario not in PLACEHOLDER_SCENARIOS:
        # every message the backend sent in the scenario is valid per the 2026-07-28 schema
        assert [check.status for check in checks if check.id == "wire-schema-valid"] == ["SUCCESS"], checks


def assert_scenario_passed(run: SuiteRun, scenario: str) -> list:
    """Its checks, every one passed (the placeholder's one skipped); the scenario's checks."""
    checks = [check for check in run.checks if check.scenario == scenario]
    assert scenario in run.ran, f"{scenario} wrote no results\n{run.report()}"
    problems = [str(check) for check in checks if check.status in ("FAILURE", "WARNING")]
    assert not problems, "\n".join(problems)
    expected = ["SKIPPED"] if scenario in PLACEHOLDER_SCENARIOS else ["SUCCESS"] * PASSING_CHECKS[scenario]
    assert [check.status for check in checks] == expected, checks
    return checks


@pytest.mark.conformance
@pytest.mark.timeout(SUITE_TIMEOUT + 60)
@pytest.mark.parametrize("scenario", WIRE_SCENARIOS)
def test_the_wire_scenarios_pass_directly(requirement_run: SuiteRun, scenario: str) -> None:
    assert requirement_run.scenarios().get(scenario) == "passed", requirement_run.report()


# -- the conformance suite, through the gateway ---------------------------------------------------


@pytest.fixture(scope="module")
def gateway_run(suite_runs: dict[str, SuiteRun]) -> SuiteRun:
    """The same run through the gateway in front of the backend."""
    run = suite_runs["through the gateway"]
    rows = [row for row in run.table().splitlines() if row.split()[1] in TASK_SCENARIOS]
    print("\ntasks backend through the gateway, 2026-07-28:\n" + "\n".join(rows))
    assert run.checks and not run.timed_out, f"the suite did not run to the end\n{run.report()}"
    return run


@pytest.mark.conformance
@pytest.mark.timeout(SUITE_TIMEOUT + 60)
@pytest.mark.parametrize("scenario", TASK_SCENARIOS)
def test_every_tasks_scenario_passes_through_the_gateway(gateway_run: SuiteRun, scenario: str) -> None:
    assert_scenario_passed(gateway_run, scenario)


# -- raw HTTP ---------------------------------------------------------------------------------


@pytest.fixture
def served() -> TaskBackend:
    with task_backend("jobs", delay=0.2, job_seconds=0.1) as backend:
        yield backend


def result_of(answer: dict) -> dict:
    assert "result" in answer, answer
    return answer["result"]


def error_of(response: requests.Response, code: int, status: int = 400) -> dict:
    body = response.json()
    assert response.status_code == status and body.get("error", {}).get("code") == code, (response.status_code, body)
    return body["error"]


def call(served: TaskBackend, tool: str, arguments: dict | None = None, **options) -> dict:
    return modern_rpc(served.mcp_url, "tools/call", {"name": tool, "arguments": arguments or {}}, **options)


def get(served: TaskBackend, task_id: str, **options) -> dict:
    return result_of(modern_rpc(served.mcp_url, "tasks/get", {"taskId": task_id}, **options))


def poll(served: TaskBackend, task_id: str, statuses: set[str]) -> dict:
    """tasks/get until the task has one of ``statuses``; the last answer (the caller checks it)."""
    return poll_task(served.mcp_url, task_id, statuses)


def iso(value: str) -> datetime:
    return datetime.fromisoformat(value)  # 3.11 reads the trailing Z


def test_discover_declares_the_tasks_extension(served: TaskBackend) -> None:
    result = result_of(modern_rpc(served.mcp_url, "server/discover"))
    assert result["capabilities"]["extensions"] == {TASKS_EXTENSION: {}}
    assert "tasks" not in result["capabilities"]  # the 2025-11-25 slot is not used
    assert result["supportedVersions"] == [PROTOCOL_VERSION] and result["resultType"] == "complete"
    tools = result_of(modern_rpc(served.mcp_url, "tools/list"))["tools"]
    assert [tool["name"] for tool in tools] == list(TOOL_NAMES)


def test_a_task_completes_after_its_delay_with_a_text_result(served: TaskBackend) -> None:
    created = result_of(call(served, "delayed_echo", {"text": "hi", "seconds": 0.3}))
    assert created["resultType"] == "task" and created["status"] == "working"
    assert not {"result", "error", "inputRequests", "requestState", "task", "ttl", "pollInterval"} & set(created)
    assert isinstance(created["ttlMs"], int) and isinstance(created["pollIntervalMs"], int)
    task_id = created["taskId"]
    working = get(served, task_id)  # at once: the task exists before its handle is sent
    assert working["resultType"] == "complete" and working["status"] == "working" and "result" not in working
    done = poll(served, task_id, {"completed"})
    assert done["status"] == "completed"
    assert done["result"]["content"] == [{"type": "text", "text": "jobs:hi"}] and done["result"]["isError"] is False
    assert iso(done["createdAt"]) == iso(created["createdAt"]) <= iso(done["lastUpdatedAt"])
    assert (iso(done["lastUpdatedAt"]) - iso(done["createdAt"])).total_seconds() >= 0.3
    assert served.task(task_id).history == ("working", "completed")
    # every tasks/get carried the task id in Mcp-Name
    assert {m.headers.get("mcp-name") for m in served.requests("tasks/get")} == {task_id}


def test_the_same_tool_answers_without_a_task_to_a_client_without_the_extension(served: TaskBackend) -> None:
    result = result_of(call(served, "delayed_echo", {"text": "now", "seconds": 0.1}, capabilities=NO_TASKS))
    assert result["resultType"] == "complete" and "taskId" not in result
    assert result["content"] == [{"type": "text", "text": "jobs:now"}]
    legacy_hint = {"name": "greet", "arguments": {"name": "Ada"}, "task": {"ttl": 60000}}  # ignored
    assert result_of(modern_rpc(served.mcp_url, "tools/call", legacy_hint))["content"][0]["text"] == "Hello, Ada!"
    assert served.tasks == {}


def test_a_task_asks_for_input_and_completes_after_tasks_update(served: TaskBackend) -> None:
    task_id = result_of(call(served, "confirm_delete", {"filename": "notes.txt"}))["taskId"]
    waiting = poll(served, task_id, {"input_required"})
    request = waiting["inputRequests"]["confirm"]
    assert request["method"] == "elicitation/create" and request["params"]["mode"] == "form"
    assert "confirm" in request["params"]["requestedSchema"]["properties"]
    again = get(served, task_id)  # an unanswered request is shown again on every poll
    assert again["inputRequests"] == waiting["inputRequests"]
    ignored = modern_rpc(served.mcp_url, "tasks/update", {"taskId": task_id, "inputResponses": {"other": {"x": 1}}})
    assert set(result_of(ignored)) == {"resultType", "_meta"} and get(served, task_id)["status"] == "input_required"
    answer = {"confirm": {"action": "accept", "content": {"confirm": True}}}
    ack = result_of(modern_rpc(served.mcp_url, "tasks/update", {"taskId": task_id, "inputResponses": answer}))
    assert ack["resultType"] == "complete" and set(ack) == {"resultType", "_meta"}
    done = poll(served, task_id, {"completed"})
    assert done["result"]["content"][0]["text"] == "Deleted notes.txt" and "inputRequests" not in done
    view = served.task(task_id)
    assert view.history == ("working", "input_required", "working", "completed")
    assert view.input_responses == ({"other": {"x": 1}}, answer)


def test_answers_may_come_one_at_a_time(served: TaskBackend) -> None:
    task_id = result_of(call(served, "multi_input"))["taskId"]
    assert set(poll(served, task_id, {"input_required"})["inputRequests"]) == {"name", "confirm"}
    name = {"name": {"action": "accept", "content": {"name": "Ada"}}}
    modern_rpc(served.mcp_url, "tasks/update", {"taskId": task_id, "inputResponses": name})
    partial = get(served, task_id)
    assert partial["status"] == "input_required" and set(partial["inputRequests"]) == {"confirm"}
    confirm = {"confirm": {"action": "accept", "content": {"confirm": True}}}
    modern_rpc(served.mcp_url, "tasks/update", {"taskId": task_id, "inputResponses": confirm})
    assert poll(served, task_id, {"completed"})["result"]["content"][0]["text"] == "name=Ada, confirm=true"


def test_without_the_extension_the_questions_come_as_input_required_results(served: TaskBackend) -> None:
    params = {"name": "confirm_delete", "arguments": {"filename": "a.txt"}}
    first = result_of(modern_rpc(served.mcp_url, "tools/call", params, capabilities=NO_TASKS))
    assert first["resultType"] == "input_required" and list(first["inputRequests"]) == ["confirm"]
    retry = {**params, "inputResponses": {"confirm": {"action": "accept", "content": {"confirm": False}}}}
    assert result_of(modern_rpc(served.mcp_url, "tools/call", retry, capabilities=NO_TASKS))["content"][0]["text"] \
        == "Kept a.txt"
    no_elicitation = modern_post(served.mcp_url, "tools/call", params,
                                 capabilities=client_capabilities(elicitation=False))
    error = error_of(no_elicitation, MISSING_REQUIRED_CLIENT_CAPABILITY)
    assert error["data"] == {"requiredCapabilities": {"elicitation": {"form": {}}}}


def test_a_json_rpc_error_fails_the_task_and_a_tool_error_completes_it(served: TaskBackend) -> None:
    failed = poll(served, result_of(call(served, "protocol_error_job"))["taskId"], {"failed"})
    assert failed["status"] == "failed" and "result" not in failed
    assert failed["error"]["code"] == -32603 and isinstance(failed["error"]["message"], str)
    assert failed["statusMessage"].startswith("Tool execution failed")
    tool_error = poll(served, result_of(call(served, "failing_job"))["taskId"], {"completed", "failed"})
    assert tool_error["status"] == "completed" and tool_error["result"]["isError"] is True
    sync = modern_post(served.mcp_url, "tools/call", {"name": "protocol_error_job", "arguments": {}},
                       capabilities=NO_TASKS)
    error_of(sync, -32603, status=200)


def test_a_task_runs_until_cancelled(served: TaskBackend) -> None:
    task_id = result_of(call(served, "run_until_cancelled"))["taskId"]
    # its body has started and waits (it says so in the status message) ...
    assert wait_until(lambda: served.task(task_id).detailed["statusMessage"] == "working until tasks/cancel",
                      timeout=10)
    assert get(served, task_id)["status"] == "working"  # ... and only tasks/cancel ends it
    ack = result_of(modern_rpc(served.mcp_url, "tasks/cancel", {"taskId": task_id}))
    assert set(ack) == {"resultType", "_meta"} and ack["resultType"] == "complete"
    cancelled = get(served, task_id)
    assert cancelled["status"] == "cancelled" and not {"result", "error"} & set(cancelled)
    again = result_of(modern_rpc(served.mcp_url, "tasks/cancel", {"taskId": task_id}))  # terminal: the same ack
    assert again["resultType"] == "complete" and served.task(task_id).history == ("working", "cancelled")
    assert served.task(task_id).cancel_requested


@pytest.mark.parametrize("tool", ["failing_job", "run_until_cancelled", "test_tool_with_task"])
def test_tasks_only_tools_refuse_a_client_without_the_extension(served: TaskBackend, tool: str) -> None:
    response = modern_post(served.mcp_url, "tools/call", {"name": tool, "arguments": {}}, capabilities=NO_TASKS)
    error = error_of(response, MISSING_REQUIRED_CLIENT_CAPABILITY)
    assert error["data"] == {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}
    assert served.tasks == {}


def test_the_task_methods_need_the_extension_on_each_request(served: TaskBackend) -> None:
    task_id = result_of(call(served, "run_until_cancelled"))["taskId"]  # declared on this request only
    for method, params in (("tasks/get", {}), ("tasks/update", {"inputResponses": {}}), ("tasks/cancel", {})):
        response = modern_post(served.mcp_url, method, {"taskId": task_id, **params}, capabilities=NO_TASKS)
        error = error_of(response, MISSING_REQUIRED_CLIENT_CAPABILITY)
        assert error["data"]["requiredCapabilities"] == {"extensions": {TASKS_EXTENSION: {}}}
    error_of(listen(served.mcp_url, [task_id], capabilities=NO_TASKS).response, MISSING_REQUIRED_CLIENT_CAPABILITY)
    assert served.task(task_id).status == "working"


def test_unknown_and_expired_task_ids_are_invalid_params() -> None:
    with task_backend("short", ttl_ms=800) as served:
        for method, params in (("tasks/get", {}), ("tasks/update", {"inputResponses": {}}), ("tasks/cancel", {})):
            error = error_of(modern_post(served.mcp_url, method, {"taskId": "no-such-task", **params}), INVALID_PARAMS)
            assert "not found" in error["message"]
        started = time.monotonic()
        created = result_of(call(served, "slow_compute", {"seconds": 0, "label": "quick"}))
        assert created["ttlMs"] == 800
        assert poll(served, created["taskId"], {"completed"})["result"]["content"][0]["text"] \
            == "Computed quick in 0 s"

        answers: list[requests.Response] = []

        def gone() -> bool:
            answers.append(modern_post(served.mcp_url, "tasks/get", {"taskId": created["taskId"]}))
            return answers[-1].status_code != 200

        assert wait_until(gone, timeout=10, interval=0.05)
        assert time.monotonic() - started >= 0.8  # not before its ttlMs (counted from its creation)
        error = error_of(answers[-1], INVALID_PARAMS)
        assert "expired" in error["message"] and served.tasks == {}


def test_the_request_headers_are_checked(served: TaskBackend) -> None:
    url = served.mcp_url
    task_id = result_of(call(served, "run_until_cancelled"))["taskId"]
    get_task = {"taskId": task_id}
    error_of(modern_post(url, "tasks/get", get_task, headers={"Mcp-Name": "another-task"}), HEADER_MISMATCH)
    error_of(modern_post(url, "tasks/get", get_task, headers={"Mcp-Name": None}), HEADER_MISMATCH)
    error_of(modern_post(url, "tasks/get", get_task, headers={"Mcp-Method": "tasks/cancel"}), HEADER_MISMATCH)
    error_of(modern_post(url, "tasks/get", get_task, headers={"MCP-Protocol-Version": None}), HEADER_MISMATCH)
    encoded = modern_post(url, "tasks/get", get_task, headers={"Mcp-Name": "=?base64?" + _b64(task_id) + "?="})
    assert encoded.status_code == 200 and encoded.json()["result"]["taskId"] == task_id
    greet = {"name": "greet", "arguments": {"name": "x"}}
    error_of(modern_post(url, "tools/call", greet, headers={"Mcp-Method": "tasks/get"}), HEADER_MISMATCH)
    unsupported = error_of(modern_post(url, "tools/call", greet, headers={"MCP-Protocol-Version": "2025-11-25"}),
                           UNSUPPORTED_PROTOCOL_VERSION)
    assert unsupported["data"] == {"supported": [PROTOCOL_VERSION], "requested": "2025-11-25"}
    error_of(modern_post(url, "tools/call", {**greet, "_meta": {"io.modelcontextprotocol/clientCapabilities": None}}),
             INVALID_PARAMS)
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                             "clientInfo": {"name": "c", "version": "1"}}}
    legacy = requests.post(url, json=initialize, headers={"Accept": "application/json, text/event-stream"}, timeout=10)
    assert error_of(legacy, UNSUPPORTED_PROTOCOL_VERSION)["data"]["requested"] == "2025-11-25"
    for removed in ("tasks/result", "tasks/list"):
        error_of(modern_post(url, removed, {"taskId": task_id} if removed == "tasks/result" else {}), METHOD_NOT_FOUND,
                 status=404)
    assert requests.get(url, timeout=10).status_code == 405
    foreign = requests.post(url, json=initialize, headers={"Origin": "https://evil.example"}, timeout=10)
    assert foreign.status_code == 403


def test_a_multi_round_trip_request_then_a_task(served: TaskBackend) -> None:
    params = {"name": "test_tool_with_task", "arguments": {}}
    first = result_of(modern_rpc(served.mcp_url, "tools/call", params))
    assert first["resultType"] == "input_required" and "taskId" not in first
    assert list(first["inputRequests"]) == ["user_name"] and isinstance(first["requestState"], str)
    answer = {"user_name": {"action": "accept", "content": {"name": "Ada"}}}
    tampered = modern_post(served.mcp_url, "tools/call",
                           {**params, "inputResponses": answer, "requestState": first["requestState"] + "x"})
    error_of(tampered, INVALID_PARAMS)
    created = result_of(modern_rpc(served.mcp_url, "tools/call",
                                   {**params, "inputResponses": answer, "requestState": first["requestState"]}))
    assert created["resultType"] == "task" and not {"requestState", "inputRequests"} & set(created)
    done = poll(served, created["taskId"], {"completed"})
    assert done["result"]["content"][0]["text"] == "Hello, Ada!"


def test_listen_acknowledges_then_sends_each_change_of_the_tasks(served: TaskBackend) -> None:
    task_id = result_of(call(served, "run_until_cancelled"))["taskId"]
    with listen(served.mcp_url, [task_id, "no-such-task"], request_id="sub-1") as stream:
        assert stream.status == 200 and stream.is_stream
        ack = stream.next()
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        assert ack["params"] == {"_meta": {"io.modelcontextprotocol/subscriptionId": "sub-1"},
                                 "notifications": {"taskIds": [task_id]}}
        current = stream.next()  # the state at subscription time
        assert current["method"] == "notifications/tasks" and current["params"]["status"] == "working"
        assert current["params"]["_meta"] == {"io.modelcontextprotocol/subscriptionId": "sub-1"}
        assert [s.task_ids for s in served.subscriptions] == [frozenset({task_id})]
        modern_rpc(served.mcp_url, "tasks/cancel", {"taskId": task_id})
        cancelled = stream.next()["params"]
        assert cancelled["taskId"] == task_id and cancelled["status"] == "cancelled"
        assert {k: v for k, v in cancelled.items() if k != "_meta"} == served.task(task_id).detailed


def test_listen_carries_input_requests_and_the_result(served: TaskBackend) -> None:
    task_id = result_of(call(served, "confirm_delete", {"filename": "b.txt"}))["taskId"]
    served.wait_for_status(task_id, "input_required")
    with listen(served.mcp_url, [task_id]) as stream:
        stream.next()  # the acknowledgement
        assert set(stream.next()["params"]["inputRequests"]) == {"confirm"}
        answer = {"confirm": {"action": "decline"}}
        modern_rpc(served.mcp_url, "tasks/update", {"taskId": task_id, "inputResponses": answer})
        assert stream.next()["params"]["status"] == "working"
        completed = stream.next()["params"]
        assert completed["status"] == "completed"
        assert completed["result"]["content"][0]["text"] == "Kept b.txt (decline)"


def test_listen_ends_with_its_result_when_the_backend_stops() -> None:
    backend = task_backend("stopping", announce_on_listen=False)
    try:
        task_id = result_of(call(backend, "run_until_cancelled"))["taskId"]
        stream = listen(backend.mcp_url, [task_id], request_id=7)
        assert stream.next()["params"]["notifications"] == {"taskIds": [task_id]}
        without_tasks = listen(backend.mcp_url, None, capabilities=NO_TASKS)  # no taskIds: no extension needed
        assert without_tasks.next()["params"]["notifications"] == {}
    finally:
        backend.stop()
    closing = stream.next()
    assert closing["id"] == 7 and closing["result"]["resultType"] == "complete"
    assert closing["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == 7
    stream.close()
    without_tasks.close()


def _b64(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()
