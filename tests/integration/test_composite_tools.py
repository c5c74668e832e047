"""Composite tools end to end: declarative workflows over backend tools, advertised and
called like any other tool, over real official-SDK backends and the real gateway server.

The backends (``tests/workflow_backends.py``) record every call with its typed arguments
and let a test steer a workflow without sleeping: a barrier that only concurrent calls
pass, gates the test releases, a tool that fails twice per key. They are started once for
the module and reset after each test; every test starts its own gateway and session.

Sections: advertising; step semantics (chains, parallelism, conditions, errors, retries,
timeouts, forEach); results and types (output mapping, coercion); name resolution
(hidden tools, dot form under every strategy); the template sandbox and config
validation; the official SDK client; progress, concurrency and the admin view.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import time
from dataclasses import dataclass
from typing import Any

import jsonschema
import pytest
import requests

from tests.gateway import (
    GatewayServer,
    admin_get,
    backend_entry,
    list_all,
    run_client,
    sse_messages,
)
from tests.workflow_backends import BLOCK_LIMIT, WorkflowBackend, workflow_backend
from vmcp_actors.config import config_from_mapping
from vmcp_actors.exceptions import ConfigError

INVALID_PARAMS = -32602
ADMIN_ENV = "VMCP_COMPOSITE_TESTS_ADMIN_TOKEN"
ADMIN_TOKEN = "composite-tests-admin-token"
ISSUE_PARAMS = {"type": "object", "properties": {"issue": {"type": "integer"}}, "required": ["issue"]}
WAIT = 30.0  # for what takes milliseconds: generous, so a loaded machine does not fail a test


# -- backends and sessions ---------------------------------------------------------------


@pytest.fixture(scope="module")
def work():
    backend = workflow_backend("work")
    yield backend
    backend.stop()


@pytest.fixture(scope="module")
def mirror():
    """A second backend whose get_issue clashes with work's."""
    backend = workflow_backend("mirror", tools=("get_issue",))
    yield backend
    backend.stop()


@pytest.fixture(autouse=True)
def fresh_backends(work, mirror):
    yield
    for backend in (work, mirror):
        backend.state.reset()


@pytest.fixture
def pool():
    """Threads for calls that block while the test looks at the gateway."""
    with cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="composite-test") as executor:
        yield executor


@dataclass
class Session:
    """One raw MCP session on a started gateway."""

    gateway: GatewayServer
    id: str

    def tools(self) -> dict[str, dict[str, Any]]:
        return {tool["name"]: tool for tool in list_all(self.gateway, self.id, "tools/list", "tools")}

    def answer(self, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """The JSON-RPC answer to a tools/call."""
        return self.gateway.rpc(self.id, "tools/call", {"name": name, "arguments": arguments or {}})

    def call(self, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """The CallToolResult (successful or isError); a JSON-RPC error fails the test."""
        answer = self.answer(name, arguments)
        assert "error" not in answer, answer
        return answer["result"]

    def error(self, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """The JSON-RPC error; a result fails the test."""
        answer = self.answer(name, arguments)
        assert "error" in answer, answer
        return answer["error"]

    def admin_state(self) -> dict[str, Any]:
        response = admin_get(self.gateway, token=ADMIN_TOKEN)
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture
def serve(start_gateway, work, monkeypatch):
    """``serve(*composites, backends=[work], aggregation=None, admin=False)``: a gateway
    with those composite tools and one open session on it."""

    def serve(*composites: dict, backends: list[WorkflowBackend] | None = None,
              aggregation: dict | None = None, admin: bool = False) -> Session:
        config: dict[str, Any] = {
            "name": "composites",
            "backends": [backend_entry(backend.name, backend) for backend in backends or [work]],
            "compositeTools": list(composites),
        }
        if aggregation is not None:
            config["aggregation"] = aggregation
        if admin:
            monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
            config["admin"] = {"tokenEnv": ADMIN_ENV}
        gateway = start_gateway(config)
        return Session(gateway, gateway.initialize())

    return serve


def composite(name: str, *steps: dict, **fields: Any) -> dict[str, Any]:
    """A ``compositeTools`` entry; parameters default to ``{issue: integer}`` (required)."""
    return {"name": name, "description": f"the {name} workflow", "parameters": ISSUE_PARAMS,
            "steps": list(steps), **fields}


def step(step_id: str, tool: str, after: tuple[str, ...] = (), **fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": step_id, "tool": tool, **fields}
    if after:
        entry["dependsOn"] = list(after)
    return entry


def structured(result: dict[str, Any]) -> Any:
    """A successful result's structuredContent, checked against its text content."""
    assert result.get("isError") is not True, result
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
    return result["structuredContent"]


def failure_text(result: dict[str, Any]) -> str:
    assert result.get("isError") is True, result
    (content,) = result["content"]
    return content["text"]


def timed(function, *args: Any) -> tuple[Any, float]:
    started = time.monotonic()
    value = function(*args)
    return value, time.monotonic() - started


def until_the_backend_gives_up(started: float) -> float:
    """What is left of BLOCK_LIMIT after ``started``: a ``wait`` call made after ``started``
    cannot return on its own before then, so an answer within it did not wait for the backend."""
    return max(0.0, started + BLOCK_LIMIT - time.monotonic())


# -- advertising -------------------------------------------------------------------------

TRIAGE_OUTPUT = {
    "properties": {
        "title": {"type": "string", "description": "the issue title", "value": "{{ steps.fetch.output.title }}"},
        "loud": {"type": "string", "value": "{{ steps.loud.output.text }}"},
    },
    "required": ["title"],
}


def test_composites_are_listed_after_the_backend_tools_with_their_schemas_and_annotations(serve):
    session = serve(
        composite("triage", step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
                  step("loud", "work.shout", ("fetch",), arguments={"text": "{{ steps.fetch.output.title }}"}),
                  output=TRIAGE_OUTPUT),
        composite("relabel", step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
                  step("mark", "work.label", ("fetch",), arguments={"id": "x", "pos": 0})),
        composite("jot", step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
                  step("write", "work.note", ("fetch",), arguments={"text": "seen"})),
        composite("careful", step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
                  annotations={"title": "Careful triage", "readOnlyHint": False}),
    )
    names = list(session.tools())
    assert names[-4:] == ["triage", "relabel", "jot", "careful"]
    assert all(name.startswith("work_") for name in names[:-4]) and len(names) == 4 + 11
    tools = session.tools()
    for name in ("triage", "relabel", "jot", "careful"):
        assert tools[name]["inputSchema"] == ISSUE_PARAMS
        assert tools[name]["description"] == f"the {name} workflow"
    assert tools["triage"]["outputSchema"] == {
        "type": "object",
        "properties": {"title": {"type": "string", "description": "the issue title"}, "loud": {"type": "string"}},
        "required": ["title"],
    }
    assert all("outputSchema" not in tools[name] for name in ("relabel", "jot", "careful"))
    # every step read-only -> read-only; any destructive or unannotated step -> the MCP defaults win
    assert tools["triage"]["annotations"] == {"readOnlyHint": True, "destructiveHint": False,
                                              "idempotentHint": True, "openWorldHint": False}
    assert tools["relabel"]["annotations"] == {"readOnlyHint": False, "destructiveHint": True,
                                               "idempotentHint": False, "openWorldHint": False}
    assert tools["jot"]["annotations"] == {"readOnlyHint": False, "destructiveHint": True,
                                           "idempotentHint": False, "openWorldHint": True}
    assert tools["careful"]["annotations"] == {"title": "Careful triage", "readOnlyHint": False,
                                               "destructiveHint": False, "idempotentHint": True,
                                               "openWorldHint": False}


def test_a_composite_whose_step_tool_the_backend_lacks_is_neither_listed_nor_callable(serve, work, mirror):
    session = serve(
        composite("mirrored", step("fetch", "mirror.get_issue", arguments={"number": "{{ params.issue }}"})),
        composite("needs_shout", step("fetch", "mirror.get_issue", arguments={"number": "{{ params.issue }}"}),
                  step("loud", "mirror.shout", ("fetch",), arguments={"text": "x"})),
        backends=[work, mirror], admin=True,
    )
    names = list(session.tools())
    assert "mirrored" in names and "needs_shout" not in names
    refused = session.error("needs_shout", {"issue": 1})
    unknown = session.error("no_such_tool", {"issue": 1})
    assert refused["code"] == unknown["code"] == INVALID_PARAMS
    assert refused["message"] == unknown["message"].replace("no_such_tool", "needs_shout")
    assert mirror.calls == [] and work.calls == []  # not even the first step ran
    (state,) = session.admin_state()["sessions"]
    assert state["compositeProblems"] == [
        "composite tool 'needs_shout' is not advertised: step 'loud' calls 'mirror.shout', "
        "which this session's backends do not offer"
    ]
    assert structured(session.call("mirrored", {"issue": 4}))["title"] == "Mirror issue 4"


def test_a_composite_named_like_an_advertised_backend_tool_leaves_the_name_to_the_tool(serve, work):
    session = serve(composite("add", step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"})),
                    aggregation={"conflictResolution": "manual"}, admin=True)
    assert list(session.tools()).count("add") == 1
    assert structured(session.call("add", {"a": 1, "b": 2})) == {"backend": "work", "sum": 3}  # the backend's tool
    assert [call.tool for call in work.calls] == ["add"]
    (state,) = session.admin_state()["sessions"]
    assert state["compositeProblems"] == ["composite tool 'add' is not advertised: backend 'work' advertises a tool "
                                          "with the same name (its 'add'); rename one of them"]


def test_bad_parameters_are_invalid_params_and_reach_no_backend(serve, work):
    session = serve(composite("triage", step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"})))
    missing = session.error("triage", {})
    assert missing["code"] == INVALID_PARAMS
    assert "issue" in missing["message"] and "required" in missing["message"]
    wrong = session.error("triage", {"issue": "seven"})
    assert wrong["code"] == INVALID_PARAMS
    assert "issue must be integer, got string" in wrong["message"]
    assert work.calls == []


# -- step semantics ----------------------------------------------------------------------


def test_a_sequential_chain_hands_each_steps_output_to_the_next(serve, work):
    session = serve(composite(
        "chain",
        step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
        step("loud", "work.shout", ("fetch",), arguments={"text": "{{ steps.fetch.output.title }}"}),
        step("both", "work.two_texts", ("loud",), arguments={"text": "{{ steps.loud.output.text }}"}),
    ))
    result = session.call("chain", {"issue": 7})
    # no output spec: the last step's output, here text contents as {text, text_1}
    assert structured(result) == {"text": "WORK ISSUE 7!", "text_1": "!7 EUSSI KROW"}
    assert [(call.tool, call.arguments) for call in work.calls] == [
        ("get_issue", {"number": 7}), ("shout", {"text": "Work issue 7"}), ("two_texts", {"text": "WORK ISSUE 7!"}),
    ]


def test_independent_steps_run_in_parallel(serve, work):
    work.state.expect_meeting("fan", 3, timeout=BLOCK_LIMIT)  # passes only when all three wait at once
    session = serve(composite(
        "fan_out",
        *(step(name, "work.meet", arguments={"group": "fan", "value": value})
          for name, value in (("one", 1), ("two", 2), ("three", 3))),
        step("total", "work.add", ("one", "two", "three"),
             arguments={"a": "{{ steps.one.output.value + steps.two.output.value }}",
                        "b": "{{ steps.three.output.value }}"}),
    ))
    assert structured(session.call("fan_out", {"issue": 1})) == {"backend": "work", "sum": 6}
    assert [call.tool for call in work.calls][-1] == "add"


def test_max_parallel_caps_the_steps_running_at_once(serve, work):
    work.state.expect_meeting("capped", 3, timeout=0.5)  # three can never meet two at a time
    session = serve(composite(
        "capped",
        *(step(name, "work.meet", arguments={"group": "capped"}) for name in ("one", "two", "three")),
        maxParallel=2,
    ))
    text = failure_text(session.call("capped", {"issue": 1}))
    assert re.fullmatch(r"composite tool 'capped': step '(one|two)' failed: .*meeting 'capped' broke.*", text), text
    assert [call.arguments["group"] for call in work.state.calls_of("meet")] == ["capped", "capped"]


def test_a_diamond_runs_its_middle_steps_together_and_joins_them(serve, work):
    work.state.expect_meeting("diamond", 2, timeout=BLOCK_LIMIT)  # b and c only pass together
    session = serve(composite(
        "diamond",
        step("a", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
        step("b", "work.meet", ("a",), arguments={"group": "diamond", "value": "{{ steps.a.output.number }}"}),
        step("c", "work.meet", ("a",), arguments={"group": "diamond", "value": "{{ steps.a.output.number * 2 }}"}),
        step("d", "work.add", ("b", "c"),
             arguments={"a": "{{ steps.b.output.value }}", "b": "{{ steps.c.output.value }}"}),
    ))
    assert structured(session.call("diamond", {"issue": 5})) == {"backend": "work", "sum": 15}
    tools = [call.tool for call in work.calls]
    assert tools[0] == "get_issue" and tools[-1] == "add" and sorted(tools[1:3]) == ["meet", "meet"]


CONDITIONAL = composite(
    "maybe_loud",
    step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
    step("loud", "work.shout", ("fetch",), arguments={"text": "{{ steps.fetch.output.title }}"},
         condition="{{ params.loud }}", defaultResults={"text": "(quiet)"}),
    step("report", "work.note", ("loud",), arguments={"text": "{{ steps.loud.status }}: {{ steps.loud.output.text }}"}),
    parameters={"type": "object", "properties": {"issue": {"type": "integer"}, "loud": {"type": "boolean"}},
                "required": ["issue", "loud"]},
)


def test_a_true_condition_runs_the_step(serve, work):
    session = serve(CONDITIONAL)
    assert structured(session.call("maybe_loud", {"issue": 3, "loud": True}))["text"] == "completed: WORK ISSUE 3!"
    assert len(work.state.calls_of("shout")) == 1


def test_a_false_condition_skips_the_step_and_offers_its_default_results(serve, work):
    session = serve(CONDITIONAL)
    assert structured(session.call("maybe_loud", {"issue": 3, "loud": False}))["text"] == "skipped: (quiet)"
    assert work.state.calls_of("shout") == []
    assert [call.tool for call in work.calls] == ["get_issue", "note"]


def test_a_condition_that_is_not_a_boolean_fails_its_step(serve, work):
    session = serve(composite(
        "muddled",
        step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"}, condition="{{ params.issue }}",
             defaultResults={}),
    ))
    text = failure_text(session.call("muddled", {"issue": 3}))
    assert text.startswith("composite tool 'muddled': step 'fetch' failed: condition: ")
    assert "must render to true or false, got 3" in text
    assert work.calls == []


def test_a_failing_step_aborts_the_run_with_an_error_result_naming_it(serve, work):
    session = serve(composite(
        "doomed",
        step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
        step("boom", "work.broken", ("fetch",), arguments={"reason": "disk full"}),
        step("never", "work.note", ("boom",), arguments={"text": "unreachable"}),
    ))
    text = failure_text(session.call("doomed", {"issue": 1}))
    assert text.startswith("composite tool 'doomed': step 'boom' failed: ")
    assert "broken: disk full" in text  # the backend's isError text
    assert [call.tool for call in work.calls] == ["get_issue", "broken"]


def test_a_step_that_continues_on_error_lets_later_steps_see_its_failure(serve, work):
    session = serve(composite(
        "resilient",
        step("risky", "work.broken", arguments={"reason": "disk full"},
             onError={"action": "continue"}, defaultResults={"value": "fallback"}),
        step("after", "work.note", ("risky",),
             arguments={"text": "{{ steps.risky.status }}|{{ steps.risky.error }}|{{ steps.risky.output.value }}"}),
    ))
    text = structured(session.call("resilient", {"issue": 1}))["text"]
    status, error, output = text.split("|")
    assert (status, output) == ("failed", "fallback")
    assert "broken: disk full" in error
    assert [call.tool for call in work.calls] == ["broken", "note"]


def test_a_retried_step_succeeds_on_its_third_attempt_with_exponential_backoff(serve, work):
    session = serve(composite(
        "stubborn",
        step("try", "work.flaky", arguments={"key": "k{{ params.issue }}"},
             onError={"action": "retry", "retryCount": 3, "retryDelay": "50ms"}),
    ))
    assert structured(session.call("stubborn", {"issue": 1})) == {"backend": "work", "key": "k1", "attempts": 3}
    calls = work.state.calls_of("flaky")
    assert len(calls) == 3
    assert calls[1].at - calls[0].at >= 0.05  # retryDelay
    assert calls[2].at - calls[1].at >= 0.10  # doubled


def test_a_step_out_of_retries_fails_with_its_last_error(serve, work):
    session = serve(composite(
        "impatient_retry",
        step("try", "work.flaky", arguments={"key": "k"}, onError={"action": "retry", "retryCount": 1,
                                                                  "retryDelay": "10ms"}),
    ))
    text = failure_text(session.call("impatient_retry", {"issue": 1}))
    assert text.startswith("composite tool 'impatient_retry': step 'try' failed: ")
    assert "flaky k: attempt 2 failed" in text
    assert len(work.state.calls_of("flaky")) == 2


def test_a_step_timeout_fails_the_run_without_waiting_for_the_backend(serve, work):
    session = serve(composite(
        "hasty",
        step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
        # 1 s: time enough for the call to reach the backend before the step times out, even on a busy machine
        step("slow", "work.wait", ("fetch",), arguments={"key": "hasty"}, timeout="1s"),
    ))
    try:
        result, elapsed = timed(session.call, "hasty", {"issue": 1})
        assert failure_text(result) == "composite tool 'hasty': step 'slow' failed: timed out after 1 s"
        # Not before the step's timeout; and before the backend's wait could end (BLOCK_LIMIT
        # after the call reached it): the gateway did not wait for the backend.
        assert 1.0 <= elapsed < BLOCK_LIMIT, elapsed
        assert work.state.wait_entered("hasty", timeout=WAIT)  # the backend got it, and holds it till released
    finally:
        work.state.release("hasty")


def test_a_workflow_timeout_fails_the_run_without_waiting_for_the_backend(serve, work):
    session = serve(composite(
        "brief",
        step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
        step("slow", "work.wait", ("fetch",), arguments={"key": "brief"}),
        timeout="300ms",
    ))
    try:
        result, elapsed = timed(session.call, "brief", {"issue": 1})
        assert failure_text(result) == "composite tool 'brief' timed out after 0.3 s"
        assert 0.3 <= elapsed < BLOCK_LIMIT, elapsed  # as above: the backend's wait had not ended
    finally:
        work.state.release("brief")


FOR_EACH_STEPS = (
    step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
    {"id": "each", "type": "forEach", "dependsOn": ["fetch"], "collection": "{{ steps.fetch.output.items }}",
     "itemVar": "it", "maxParallel": 5, "maxIterations": 10,
     # of=3: the items finish in reverse order, so the output's order is the items' own
     "step": {"tool": "work.label", "arguments": {"id": "{{ forEach.it }}", "pos": "{{ forEach.index }}", "of": 3}}},
)


def test_for_each_calls_the_tool_per_item_and_keeps_the_items_order(serve, work):
    session = serve(composite(
        "label_all", *FOR_EACH_STEPS,
        output={"properties": {"labels": {"type": "array", "value": "{{ steps.each.output }}"},
                               "count": {"type": "integer", "value": "{{ steps.each.output | length }}"}}},
    ))
    result = structured(session.call("label_all", {"issue": 5}))
    assert result == {"count": 3, "labels": [
        {"backend": "work", "id": "5", "pos": 0, "labelled": True},  # id: the integer item coerced to the string
        {"backend": "work", "id": "6", "pos": 1, "labelled": True},
        {"backend": "work", "id": "7", "pos": 2, "labelled": True},
    ]}
    assert sorted(call.arguments["pos"] for call in work.state.calls_of("label")) == [0, 1, 2]


def test_a_for_each_step_last_without_output_spec_answers_its_list_as_text(serve):
    session = serve(composite("label_all", *FOR_EACH_STEPS))
    result = session.call("label_all", {"issue": 1})
    assert result.get("isError") is not True and "structuredContent" not in result
    assert [item["id"] for item in json.loads(result["content"][0]["text"])] == ["1", "2", "3"]


# -- results and types -------------------------------------------------------------------

REPORT_OUTPUT = {
    "properties": {
        "title": {"type": "string", "value": "{{ steps.fetch.output.title }}"},
        "tenfold": {"type": "integer", "value": "{{ steps.fetch.output.number }}0"},  # text "70" -> 70
        "half": {"type": "number", "value": "{{ steps.fetch.output.number / 2 }}"},
        "open": {"type": "boolean", "value": "{{ steps.fetch.output.state == 'open' }}"},
        "shouting": {"type": "boolean", "value": "{{ 'TRUE' if steps.loud.output.text.endswith('!') else 'no' }}"},
        "assignee": {"type": "string", "value": "{{ steps.fetch.output.assignee }}", "default": "nobody"},
        "labels": {"type": "array", "value": "{{ steps.fetch.output.labels | tojson }}"},
        "details": {"type": "object", "properties": {
            "loud": {"type": "string", "value": "{{ steps.loud.output.text }}"},
            "size": {"type": "integer", "value": "{{ steps.fetch.output['items'] | length }}"},
            "milestone": {"type": "integer", "value": "{{ steps.fetch.output.milestone }}", "default": 0},
        }},
    },
    "required": ["title", "tenfold"],
}


def test_the_output_spec_builds_typed_structured_content_with_defaults_and_nesting(serve):
    session = serve(composite(
        "report",
        step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
        step("loud", "work.shout", ("fetch",), arguments={"text": "{{ steps.fetch.output.title }}"}),
        output=REPORT_OUTPUT,
    ))
    schema = session.tools()["report"]["outputSchema"]
    assert schema["required"] == ["title", "tenfold"]
    assert schema["properties"]["details"] == {"type": "object", "properties": {
        "loud": {"type": "string"}, "size": {"type": "integer"}, "milestone": {"type": "integer"}}}
    result = structured(session.call("report", {"issue": 7}))
    assert result == {
        "title": "Work issue 7",
        "tenfold": 70,
        "half": 3.5,
        "open": True,
        "shouting": True,
        "assignee": "nobody",
        "labels": ["bug", "ui"],
        "details": {"loud": "WORK ISSUE 7!", "size": 3, "milestone": 0},
    }
    jsonschema.validate(result, schema)


def test_toolhive_path_form_and_json_filters_render_in_steps_and_output(serve, work):
    session = serve(composite(
        "toolhive",
        step("fetch", "work.get_issue", arguments={"number": "{{.params.issue}}"}),
        step("labels", "work.note", ("fetch",), arguments={"text": "{{json .steps.fetch.output.labels}}"}),
        step("quoted", "work.note", ("labels",),
             arguments={"text": "{{ (steps.labels.output.text | fromjson)[1] }} "
                                "{{ steps.fetch.output.title | quote }}"}),
        output={"properties": {"title": {"type": "string", "value": "{{ .steps.fetch.output.title }}"},
                               "quoted": {"type": "string", "value": "{{quote .steps.quoted.output.text}}"}}},
    ))
    assert structured(session.call("toolhive", {"issue": 4})) == {
        "title": "Work issue 4", "quoted": '"ui \\"Work issue 4\\""'}
    assert [call.arguments for call in work.state.calls_of("note")] == [
        {"text": '["bug","ui"]'}, {"text": 'ui "Work issue 4"'}]


STRICT_ARGUMENTS = {
    "count": "{{ steps.fetch.output.number }}0",  # text -> integer
    "flag": "true",  # a literal string -> boolean
    "ratio": "2.5",  # -> number
    "ids": ["1", "{{ params.issue }}0", "{{ params.issue }}"],  # strings and an integer -> integers
    "spec": {"depth": "4", "tags": ["true", "0", "{{ params.issue > 1 }}"]},  # nested, through $ref
}


def test_arguments_are_coerced_to_the_schema_of_a_hidden_strictly_typed_tool(serve, start_gateway, work):
    session = serve(
        composite("typed", step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
                  step("send", "work.strict", ("fetch",), arguments=STRICT_ARGUMENTS)),
        aggregation={"tools": [{"workload": "work", "filter": ["get_issue"]}]},
    )
    assert "work_strict" not in session.tools()
    result = structured(session.call("typed", {"issue": 3}))
    assert result == {"backend": "work", "count": 30, "flag": True, "ratio": 2.5, "ids": [1, 30, 3],
                      "spec": {"depth": 4, "tags": [True, False, True]}, "types": ["int", "bool", "float"]}

    # the control: this backend refuses the uncoerced strings
    plain = start_gateway({"name": "plain", "backends": [backend_entry("work", work)]})
    plain_session = Session(plain, plain.initialize())
    refused = plain_session.call("work_strict", {"count": "30", "flag": "true", "ratio": "2.5", "ids": ["1"],
                                                 "spec": {"depth": "4", "tags": ["true"]}})
    assert refused["isError"] is True
    assert "valid integer" in refused["content"][0]["text"]


@pytest.mark.parametrize("hiding", [
    {"tools": [{"workload": "work", "filter": ["shout"]}]},
    {"tools": [{"workload": "work", "excludeAll": True}]},
    {"excludeAllTools": True},
], ids=["filter", "excludeAll", "excludeAllTools"])
def test_a_composite_calls_a_tool_hidden_from_clients(serve, work, hiding):
    session = serve(composite("peek", step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"})),
                    aggregation=hiding)
    tools = session.tools()
    assert "peek" in tools and "work_get_issue" not in tools
    hidden = session.error("work_get_issue", {"number": 2})
    unknown = session.error("work_no_such_tool", {"number": 2})
    assert hidden["code"] == unknown["code"] == INVALID_PARAMS
    assert hidden["message"] == unknown["message"].replace("work_no_such_tool", "work_get_issue")
    assert work.calls == []
    assert structured(session.call("peek", {"issue": 2}))["title"] == "Work issue 2"
    assert [call.tool for call in work.calls] == ["get_issue"]


# -- which tool a step's name reaches ------------------------------------------------------

RESOLUTION_CASES = {
    "prefix": ({}, {"work.get_issue": "work", "work_get_issue": "work"}),
    "prefix with a rename": (
        {"tools": [{"workload": "work", "overrides": {"get_issue": {"name": "fetch_issue"}}}]},
        {"work.get_issue": "work", "work.fetch_issue": "work", "work_fetch_issue": "work"},
    ),
    "priority": (  # mirror wins the bare name; work's tool is still reachable by the dot form
        {"conflictResolution": "priority", "conflictResolutionConfig": {"priorityOrder": ["mirror", "work"]}},
        {"get_issue": "mirror", "mirror.get_issue": "mirror", "work.get_issue": "work"},
    ),
    "manual with a rename": (
        {"conflictResolution": "manual",
         "tools": [{"workload": "mirror", "overrides": {"get_issue": {"name": "mirror_issue"}}}]},
        {"get_issue": "work", "work.get_issue": "work", "mirror_issue": "mirror",
         "mirror.get_issue": "mirror", "mirror.mirror_issue": "mirror"},
    ),
}


@pytest.mark.parametrize("case", RESOLUTION_CASES)
def test_step_names_reach_their_backend_tool_under_each_strategy(serve, work, mirror, case):
    aggregation, expected = RESOLUTION_CASES[case]
    references = list(expected)
    reached_backend = {f"s{index}": {"type": "string", "value": f"{{{{ steps.s{index}.output.backend }}}}"}
                       for index in range(len(references))}
    session = serve(
        composite("resolve", *(step(f"s{index}", tool, arguments={"number": index})
                               for index, tool in enumerate(references)),
                  output={"properties": reached_backend}),
        backends=[work, mirror], aggregation=aggregation,
    )
    assert "resolve" in session.tools()
    reached = structured(session.call("resolve", {"issue": 0}))
    assert {tool: reached[f"s{index}"] for index, tool in enumerate(references)} == expected
    for backend in (work, mirror):  # and each backend got exactly the calls meant for it
        numbers = sorted(call.arguments["number"] for call in backend.state.calls_of("get_issue"))
        assert numbers == [index for index, tool in enumerate(references) if expected[tool] == backend.name]


# -- the template sandbox and config validation ------------------------------------------


def test_templates_reaching_python_internals_are_refused_when_the_config_loads(work):
    config = {
        "name": "t", "backends": [backend_entry("work", work)],
        "compositeTools": [composite(
            "escape",
            step("probe", "work.note", arguments={"text": "{{ params.__class__.__mro__ }}",
                                                  "more": ["{{ cycler.__init__.__globals__ }}"]},
                 condition="{{ ''.__class__ }}", defaultResults={}),
            output={"properties": {"leak": {"type": "string", "value": "{{ steps.probe.output.__dict__ }}"}}},
        )],
    }
    with pytest.raises(ConfigError) as raised:
        config_from_mapping(config)
    lines = raised.value.errors
    for path, attribute in (("compositeTools[0].steps[0].arguments.text", "__class__"),
                            ("compositeTools[0].steps[0].arguments.more[0]", "__init__"),
                            ("compositeTools[0].steps[0].condition", "__class__"),
                            ("compositeTools[0].output.properties.leak.value", "__dict__")):
        assert any(line.startswith(f"{path}: ") and f"attribute {attribute!r} reaches Python internals" in line
                   for line in lines), (path, lines)


RUNTIME_ESCAPES = [
    "{{ params | attr('__class__') }}",
    "{{ (cycler | attr('__init__')) | attr('__globals__') }}",
    "{{ '{0.__class__.__mro__}'.format(params) }}",
    "{{ params['__cla' ~ 'ss__'] }}",
    "text {{ params.items | attr('__self__') }}",
]
LEAK_MARKERS = ("<class", "<built-in", "<function", "<module", "object at 0x", "<bound method", "builtins")


@pytest.mark.parametrize("template", RUNTIME_ESCAPES)
def test_escapes_the_text_does_not_show_are_refused_at_run_time(serve, work, template):
    session = serve(composite("escape", step("probe", "work.note", arguments={"text": template})))
    text = failure_text(session.call("escape", {"issue": 1}))
    assert text.startswith("composite tool 'escape': step 'probe' failed: arguments: "), text
    assert not any(marker in text for marker in LEAK_MARKERS), text
    assert work.calls == []


def test_every_composite_problem_in_a_config_is_reported_with_its_path(start_gateway, work):
    config = {
        "name": "t", "backends": [backend_entry("work", work)],
        "compositeTools": [
            composite("graph",
                      step("a", "work.get_issue", ("ghost",), arguments={"number": 1}),
                      step("b", "work.note", arguments={"text": "{{ steps.a.output.title }}"})),
            composite("graph", step("a", "work.get_issue", arguments={"number": 1})),
            composite("syntax", step("a", "work.note", arguments={"text": "{{ params.issue "})),
            composite("nested", step("a", "graph")),
            composite("settings", step("a", "work.get_issue", timeout="10",
                                       onError={"action": "retry", "retryCount": 0})),
        ],
    }
    with pytest.raises(ConfigError) as raised:
        start_gateway(config)
    lines = raised.value.errors
    expected = {
        "compositeTools[0].steps[0].dependsOn[0]": "unknown step 'ghost'",
        "compositeTools[0].steps[1]": "'a' is not among the steps it depends on",
        "compositeTools[1].name": "duplicate composite name 'graph'",
        "compositeTools[2].steps[0].arguments.text": "composite 'syntax', step 'a'",
        "compositeTools[3].steps[0].tool": "composite tools cannot call composite tools",
        "compositeTools[4].steps[0].timeout": "durations need a unit",
        "compositeTools[4].steps[0].onError.retryCount": "between 1 and 10",
    }
    for path, words in expected.items():
        assert any(line.startswith(f"{path}: ") and words in line for line in lines), (path, lines)
    assert len(lines) == len(expected), lines


# -- the official SDK client -------------------------------------------------------------


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_the_sdk_client_lists_and_calls_a_composite_with_valid_structured_content(serve, mode):
    session = serve(
        composite("triage", step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
                  step("loud", "work.shout", ("fetch",), arguments={"text": "{{ steps.fetch.output.title }}"}),
                  output=TRIAGE_OUTPUT),
        composite("doomed", step("boom", "work.broken", arguments={})),
    )

    progress: list[tuple[float, float | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total))

    async def work_with(client):
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        # the SDK checks structuredContent against the outputSchema it listed
        called = await client.call_tool("triage", {"issue": 9}, progress_callback=on_progress)
        failed = await client.call_tool("doomed", {"issue": 9})
        return tools["triage"], called, failed

    tool, called, failed = run_client(session.gateway.url, work_with, mode=mode)
    assert progress == [(1, 2), (2, 2)]
    assert tool.input_schema == ISSUE_PARAMS
    assert called.is_error is False
    assert called.structured_content == {"title": "Work issue 9", "loud": "WORK ISSUE 9!"}
    jsonschema.validate(called.structured_content, tool.output_schema)
    assert json.loads(called.content[0].text) == called.structured_content
    assert failed.is_error is True
    assert failed.content[0].text.startswith("composite tool 'doomed': step 'boom' failed: ")


# -- progress, concurrency, operators ----------------------------------------------------


def progress_call(session: Session, name: str, arguments: dict[str, Any], token: str) -> list[dict[str, Any]]:
    message = {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
               "params": {"name": name, "arguments": arguments, "_meta": {"progressToken": token}}}
    response = session.gateway.post(message, session.id)
    if response.headers["Content-Type"].startswith("text/event-stream"):
        return sse_messages(response)
    return [response.json()]  # the answer alone: no notifications came first


def test_a_call_with_a_progress_token_gets_a_notification_per_finished_step(serve):
    session = serve(composite(
        "chain",
        step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
        step("loud", "work.shout", ("fetch",), arguments={"text": "{{ steps.fetch.output.title }}"}),
        step("both", "work.two_texts", ("loud",), arguments={"text": "{{ steps.loud.output.text }}"}),
    ))
    *notifications, final = progress_call(session, "chain", {"issue": 2}, "chain-progress")
    assert final["id"] == 5 and structured(final["result"])["text"] == "WORK ISSUE 2!"
    assert {n["method"] for n in notifications} == {"notifications/progress"}
    assert [(n["params"]["progressToken"], n["params"]["progress"], n["params"]["total"]) for n in notifications] \
        == [("chain-progress", 1, 3), ("chain-progress", 2, 3), ("chain-progress", 3, 3)]
    plain = session.gateway.post({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
                                  "params": {"name": "chain", "arguments": {"issue": 2}}}, session.id)
    assert plain.headers["Content-Type"].startswith("application/json")  # no token, no notifications


def test_progress_reports_steps_that_finish_without_a_backend_call(serve, work):
    """Skipped steps finish too, and count. Here every step is skipped, so the run settles
    before the gateway starts relaying its progress: the notifications it queued must still
    be sent (the same loss hits, now and then, the last steps of any run that finish
    together, e.g. two parallel final steps)."""
    session = serve(composite(
        "idle",
        step("one", "work.note", arguments={"text": "1"}, condition="{{ params.issue > 10 }}", defaultResults={}),
        step("two", "work.note", arguments={"text": "2"}, condition="{{ params.issue > 10 }}", defaultResults={}),
    ))
    *notifications, final = progress_call(session, "idle", {"issue": 1}, "idle-progress")
    assert final["id"] == 5 and final["result"].get("isError") is not True
    assert [(n["params"]["progressToken"], n["params"]["progress"], n["params"]["total"]) for n in notifications] \
        == [("idle-progress", 1, 2), ("idle-progress", 2, 2)]
    assert work.calls == []


def test_the_session_keeps_serving_while_a_composite_waits_on_a_backend(serve, work, pool):
    session = serve(
        composite("held", step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
                  step("hold", "work.wait", ("fetch",), arguments={"key": "held"})),
        composite("quick", step("fetch", "work.get_issue", arguments={"number": "{{ params.issue }}"})),
    )
    try:
        held = pool.submit(session.call, "held", {"issue": 1})
        assert work.state.wait_entered("held", timeout=WAIT)
        assert {"held", "quick", "work_get_issue"} <= set(session.tools())
        assert structured(session.call("work_get_issue", {"number": 2}))["title"] == "Work issue 2"
        assert structured(session.call("quick", {"issue": 3}))["title"] == "Work issue 3"
        assert not held.done()
    finally:
        work.state.release("held")
    assert structured(held.result(timeout=WAIT)) == {"backend": "work", "key": "held", "released": True}


HELD = composite(
    "held",
    step("first", "work.get_issue", arguments={"number": "{{ params.issue }}"}),
    step("hold", "work.wait", ("first",), arguments={"key": "{{ params.issue }}"}),
    step("after", "work.note", ("hold",), arguments={"text": "done"}),
)


def test_the_admin_state_shows_runs_in_flight_and_counts_them_afterwards(serve, work, pool):
    session = serve(HELD, composite("doomed", step("boom", "work.broken", arguments={})), admin=True)
    before = time.time()
    try:
        held = [pool.submit(session.call, "held", {"issue": issue}) for issue in (1, 2)]  # one run each
        assert work.state.wait_entered("1", timeout=WAIT) and work.state.wait_entered("2", timeout=WAIT)
        state = session.admin_state()
        runs = state["sessions"][0]["workflowRuns"]
        assert len(runs) == 2 and runs[0]["runId"] != runs[1]["runId"]
        for run in runs:
            assert run["composite"] == "held" and run["state"] == "running"
            assert re.fullmatch(r"[0-9a-f]{16}", run["runId"])
            assert before - 1 <= run["started"] <= time.time()
            assert run["steps"] == {"first": "completed", "hold": "running", "after": "pending"}
        assert state["workflows"]["held"]["running"] == 2 and state["workflows"]["held"]["runs"] == 2
    finally:
        work.state.release("1")
        work.state.release("2")
    assert [structured(future.result(timeout=WAIT))["text"] for future in held] == ["done", "done"]
    failure_text(session.call("doomed", {"issue": 1}))

    state = session.admin_state()
    assert state["sessions"][0]["workflowRuns"] == []
    held_counters = state["workflows"]["held"]
    assert {key: held_counters[key] for key in ("runs", "completed", "failed", "cancelled", "running",
                                                "stepsStarted", "stepsFailed")} == \
        {"runs": 2, "completed": 2, "failed": 0, "cancelled": 0, "running": 0, "stepsStarted": 6, "stepsFailed": 0}
    assert 0 < held_counters["durationSecondsMax"] <= held_counters["durationSecondsTotal"]
    doomed = state["workflows"]["doomed"]
    assert (doomed["runs"], doomed["failed"], doomed["completed"], doomed["stepsFailed"]) == (1, 1, 0, 1)


def test_ending_the_session_cancels_its_runs_in_flight(serve, work, pool):
    session = serve(HELD, admin=True)
    try:
        started = time.monotonic()
        held = pool.submit(session.answer, "held", {"issue": 2})
        assert work.state.wait_entered("2", timeout=WAIT)
        deleted = requests.delete(session.gateway.url, headers={"Mcp-Session-Id": session.id}, timeout=WAIT)
        assert deleted.status_code == 200
        answer = held.result(timeout=until_the_backend_gives_up(started))  # without waiting for the backend
        assert answer["error"]["message"] == "composite tool 'held': the run was cancelled"
        counters = session.admin_state()["workflows"]["held"]
        assert (counters["runs"], counters["cancelled"], counters["running"]) == (1, 1, 0)
    finally:
        work.state.release("2")

