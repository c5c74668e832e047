"""WorkflowRun: one composite-tool call run by an actor over a fake StepCaller."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from typing import Any

import pykka
import pytest

from tests.gateway import wait_until
from vmcp_actors.concurrency import Deadline, TimerHandle, call_later
from vmcp_actors.protocol import INTERNAL_ERROR, INVALID_PARAMS, JsonRpcError
from vmcp_actors.workflows import (
    CompositeTool,
    ForEach,
    OnError,
    OutputProperty,
    OutputSpec,
    Step,
    StepSpec,
    composite_problems,
    step_specs,
)
from vmcp_actors.workflows.engine import WorkflowCancelled, WorkflowRun, validate_params

WAIT = 15.0  # generous: every wait on it ends as soon as what it waits for happens


@pytest.fixture(autouse=True)
def stop_actors():
    yield
    pykka.ActorRegistry.stop_all()


def text(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}]}


def structured(value: dict[str, Any]) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": "ignored"}], "structuredContent": value}


class FakeCaller:
    """Tools are functions ``(arguments) -> result``; records every call (when it is made)
    with its times."""

    def __init__(self, tools: dict[str, Any], schemas: dict[str, dict[str, Any]] | None = None):
        self.tools = tools
        self.schemas = schemas or {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.spans: dict[str, tuple[float, float]] = {}
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0

    def input_schema(self, tool: str):
        return self.schemas.get(tool)

    def call(self, tool: str, arguments: dict[str, Any], deadline: Deadline) -> cf.Future[dict[str, Any]]:
        """Returns at once, as the real caller does; the tool runs on a thread of its own
        (and its answer is dropped when the run cancelled the call meanwhile)."""
        outcome: cf.Future[dict[str, Any]] = cf.Future()
        with self.lock:
            self.calls.append((tool, arguments))

        def run() -> None:
            try:
                answer, failure = self._call(tool, arguments), None
            except Exception as error:  # noqa: BLE001 - lands in the future, as a real failure does
                answer, failure = None, error
            if outcome.cancelled():
                return
            if failure is not None:
                outcome.set_exception(failure)
            else:
                outcome.set_result(answer)

        threading.Thread(target=run, daemon=True).start()
        return outcome

    def _call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        start = time.monotonic()
        try:
            return self.tools[tool](arguments)
        finally:
            with self.lock:
                self.in_flight -= 1
                self.spans[f"{tool}:{len(self.spans)}"] = (start, time.monotonic())


def sleeper(seconds: float, result: dict[str, Any] | None = None):
    def tool(arguments):
        time.sleep(seconds)
        return result or structured({"slept": seconds, **arguments})
    return tool


def held(release: threading.Event, result: dict[str, Any] | None = None):
    """A tool that answers once the test sets ``release``."""
    def tool(arguments):
        assert release.wait(WAIT), "the test never released the tool"
        return result or structured(dict(arguments))
    return tool


def echo(arguments):
    return structured(dict(arguments))


def composite(*steps: Step, **options: Any) -> CompositeTool:
    options.setdefault("parameters", {"type": "object", "properties": {}})
    return CompositeTool(name="c", description="test", steps=steps, **options)


def run(tool: CompositeTool, caller: FakeCaller, params: dict[str, Any] | None = None, **kwargs: Any):
    ref = WorkflowRun.start(tool, params or {}, caller, run_id="run-1", **kwargs)
    return ref, ref.proxy().result().get(timeout=WAIT)


def outcome(tool: CompositeTool, caller: FakeCaller, params: dict[str, Any] | None = None, **kwargs: Any):
    _, future = run(tool, caller, params, **kwargs)
    return future.result(timeout=WAIT)


# -- definitions -------------------------------------------------------------------------


def test_step_specs_read_templates_of_arguments_condition_and_collection():
    tool = composite(
        Step("a", "t"),
        Step("b", "t", condition="{{ steps.a.status == 'completed' }}", depends_on=("a",), default_results={}),
        Step("c", "t", {"x": "{{ steps.b.output }}"}, depends_on=("b",), type="forEach",
             for_each=ForEach("{{ steps.a.output.list }}")),
    )
    assert step_specs(tool) == [
        StepSpec("a", output_referenced=frozenset()),
        StepSpec("b", ("a",), frozenset({"a"}), True, True, frozenset()),
        StepSpec("c", ("b",), frozenset({"a", "b"}), False, False, frozenset({"a", "b"})),
    ]


@pytest.mark.parametrize("build", [
    lambda: OnError("explode"),
    lambda: OnError("retry", retry_count=11),
    lambda: ForEach("{{ x }}", max_iterations=1001),
    lambda: ForEach("{{ x }}", item_var="index"),
    lambda: Step("s", "t", type="forEach"),
    lambda: Step("s", None),
])
def test_definitions_refuse_out_of_range_values(build):
    with pytest.raises(ValueError):
        build()


# -- the graph ---------------------------------------------------------------------------


def test_sequential_chain_passes_output_through_templates():
    caller = FakeCaller({"a": lambda args: structured({"value": args["n"] * 2}), "b": echo})
    tool = composite(
        Step("first", "a", {"n": "{{ params.n }}"}),
        Step("second", "b", {"got": "{{ steps.first.output.value }}", "run": "{{ workflow.id }}"},
             depends_on=("first",)),
        parameters={"type": "object", "properties": {"n": {"type": "integer"}}},
    )
    result = outcome(tool, caller, {"n": 4})
    assert result["isError"] is False
    assert result["structuredContent"] == {"got": 8, "run": "run-1"}
    assert result["content"][0]["type"] == "text"
    assert [call[0] for call in caller.calls] == ["a", "b"]


def test_independent_steps_run_in_parallel():
    all_three = threading.Barrier(3, timeout=WAIT)  # passes only while the three calls are in flight together

    def together(arguments):
        all_three.wait()
        return structured({})

    caller = FakeCaller({"s": together})
    tool = composite(Step("x", "s"), Step("y", "s"), Step("z", "s"))
    result = outcome(tool, caller)
    assert result["isError"] is False, result
    assert caller.max_in_flight == 3


def test_max_parallel_one_runs_steps_one_at_a_time():
    caller = FakeCaller({"s": sleeper(0.05)})  # long enough for calls to overlap, were they allowed to
    tool = composite(Step("x", "s"), Step("y", "s"), Step("z", "s"), max_parallel=1)
    started = time.monotonic()
    outcome(tool, caller)
    assert time.monotonic() - started >= 0.15
    assert caller.max_in_flight == 1


def test_diamond_runs_the_join_after_both_branches():
    order: list[str] = []
    right_done = threading.Event()

    def tool_named(name, after: threading.Event | None = None):
        def tool(arguments):
            if after is not None:
                assert after.wait(WAIT), f"{name} ran alone"  # both branches run at once
            order.append(name)
            if name == "right":
                right_done.set()
            return structured({"from": name})
        return tool

    # left finishes after right: the join waits for the branch that ends last
    caller = FakeCaller({"top": tool_named("top"), "left": tool_named("left", after=right_done),
                         "right": tool_named("right"), "join": tool_named("join")})
    tool = composite(
        Step("top", "top"),
        Step("left", "left", depends_on=("top",)),
        Step("right", "right", depends_on=("top",)),
        Step("join", "join", {"l": "{{ steps.left.output['from'] }}"}, depends_on=("left", "right")),
    )
    result = outcome(tool, caller)
    assert order == ["top", "right", "left", "join"]
    assert result["structuredContent"] == {"from": "join"}


def test_condition_false_skips_the_step_and_dependents_see_default_results():
    caller = FakeCaller({"t": echo})
    tool = composite(
        Step("maybe", "t", {"x": 1}, condition="{{ params.go }}", default_results={"x": "default"}),
        Step("after", "t", {"seen": "{{ steps.maybe.output.x }}", "status": "{{ steps.maybe.status }}"},
             depends_on=("maybe",)),
        parameters={"type": "object", "properties": {"go": {"type": "boolean"}}},
    )
    assert outcome(tool, caller, {"go": False})["structuredContent"] == {"seen": "default", "status": "skipped"}
    assert caller.calls == [("t", {"seen": "default", "status": "skipped"})]
    pykka.ActorRegistry.stop_all()
    assert outcome(tool, caller, {"go": True})["structuredContent"] == {"seen": 1, "status": "completed"}


def test_condition_that_is_not_a_boolean_fails_the_step():
    caller = FakeCaller({"t": echo})
    result = outcome(composite(Step("s", "t", condition="{{ 'maybe' }}")), caller)
    assert result["isError"] is True
    assert "step 's' failed" in result["content"][0]["text"]
    assert caller.calls == []


# -- errors and retries ------------------------------------------------------------------


def failing(message="backend down"):
    def tool(arguments):
        raise JsonRpcError(-32000, message)
    return tool


def test_abort_stops_the_run_with_an_error_result_naming_the_step():
    caller = FakeCaller({"bad": failing(), "t": echo})
    tool = composite(Step("broken", "bad"), Step("next", "t", depends_on=("broken",)))
    result = outcome(tool, caller)
    assert result["isError"] is True
    assert "'broken'" in result["content"][0]["text"] and "backend down" in result["content"][0]["text"]
    assert [call[0] for call in caller.calls] == ["bad"]


def test_continue_on_error_exposes_the_error_to_dependents():
    caller = FakeCaller({"bad": failing("nope"), "t": echo})
    tool = composite(
        Step("broken", "bad", on_error=OnError("continue")),
        Step("next", "t", {"error": "{{ steps.broken.error }}", "status": "{{ steps.broken.status }}"},
             depends_on=("broken",)),
    )
    ref, future = run(tool, caller)
    result = future.result(timeout=WAIT)
    assert result["structuredContent"] == {"error": "nope", "status": "failed"}


def test_retry_succeeds_on_the_third_try_with_exponential_backoff():
    attempts = []

    def flaky(arguments):
        attempts.append(1)
        if len(attempts) < 3:
            raise RuntimeError("flaky")
        return structured({"ok": True})

    backoffs: list[float] = []

    def schedule(delay, fn):
        if delay < 1:  # not a step or run timeout: a back-off
            backoffs.append(delay)
        return call_later(delay, fn)

    caller = FakeCaller({"f": flaky})
    tool = composite(Step("s", "f", on_error=OnError("retry", retry_count=3, retry_delay=0.01)))
    result = outcome(tool, caller, schedule=schedule)
    assert result["structuredContent"] == {"ok": True}
    assert len(attempts) == 3
    assert backoffs == [0.01, 0.02]  # timers: no thread slept through the back-off


def test_retry_exhausted_aborts():
    caller = FakeCaller({"bad": failing("still down")})
    tool = composite(Step("s", "bad", on_error=OnError("retry", retry_count=2, retry_delay=0.0)))
    result = outcome(tool, caller)
    assert result["isError"] is True
    assert "still down" in result["content"][0]["text"]
    assert len(caller.calls) == 3


def test_is_error_result_counts_as_a_failure():
    caller = FakeCaller({"e": lambda args: {"content": [{"type": "text", "text": "no such issue"}], "isError": True}})
    ref = WorkflowRun.start(composite(Step("s", "e")), {}, caller, run_id="r")
    proxy = ref.proxy()
    result = proxy.result().get(timeout=WAIT).result(timeout=WAIT)
    assert result["isError"] is True
    assert "no such issue" in result["content"][0]["text"]


# -- timeouts ----------------------------------------------------------------------------


def test_step_timeout_fails_the_step_and_ignores_the_late_answer():
    release = threading.Event()  # the slow tool answers only after the run's result is in
    caller = FakeCaller({"slow": held(release), "t": echo})
    tool = composite(
        Step("slow", "slow", timeout=0.1, on_error=OnError("continue")),
        Step("after", "t", {"error": "{{ steps.slow.error }}"}, depends_on=("slow",)),
    )
    ref, future = run(tool, caller)
    result = future.result(timeout=WAIT)
    assert "timed out after 0.1 s" in result["structuredContent"]["error"]
    release.set()  # the late answer
    assert wait_until(lambda: not ref.is_alive(), timeout=WAIT)
    assert [name for name, _ in caller.calls] == ["slow", "t"]


def test_workflow_timeout_returns_an_error_result():
    release = threading.Event()  # the step answers only after the run's result is in
    caller = FakeCaller({"slow": held(release)})
    result = outcome(composite(Step("s", "slow"), timeout=0.2), caller)
    release.set()
    assert result["isError"] is True
    assert "timed out after 0.2 s" in result["content"][0]["text"]


class MissesItsDeadline(FakeCaller):
    """A backend call that fails as the gateway's HTTP client fails it: once its deadline
    has passed, with the backend's "did not answer" error."""

    def call(self, tool: str, arguments: dict[str, Any], deadline: Deadline) -> cf.Future[dict[str, Any]]:
        failed: cf.Future[dict[str, Any]] = cf.Future()
        self.calls.append((tool, arguments))
        call_later(deadline.remaining(), lambda: failed.set_exception(
            RuntimeError(f"backend 'work' did not answer within {deadline.remaining():g}s")))
        return failed


def no_timers(delay: float, fn: Any) -> TimerHandle:
    """Timers that never fire: the call's own failure is all the run hears of its deadline."""
    return TimerHandle()


@pytest.mark.parametrize(("step_timeout", "run_timeout", "said"), [
    (0.2, 60, "step 'slow' failed: timed out after 0.2 s"),
    (60, 0.2, "composite tool 'c' timed out after 0.2 s"),
])
def test_a_call_failing_at_its_deadline_reads_as_the_timeout_whichever_is_heard_first(step_timeout, run_timeout,
                                                                                       said):
    # The run's timer and the call's deadline fall on one instant; here the call's failure
    # always comes first, and the run says what its own timer would have said.
    tool = composite(Step("slow", "slow", timeout=step_timeout), timeout=run_timeout)
    result = outcome(tool, MissesItsDeadline({}), schedule=no_timers)
    assert result["isError"] is True and said in result["content"][0]["text"], result
    assert "did not answer" not in result["content"][0]["text"]


# -- forEach -----------------------------------------------------------------------------


def test_for_each_collects_outputs_in_item_order_within_max_parallel():
    second_done = threading.Event()

    def double(arguments):
        if arguments["index"] == 0:
            assert second_done.wait(WAIT), "item 1 never ran beside item 0"  # a later item finishes first
        else:
            time.sleep(0.02)  # long enough for items to overlap, were more than two let run at once
        answer = structured({"double": arguments["value"] * 2, "index": arguments["index"]})
        if arguments["index"] == 1:
            second_done.set()
        return answer

    caller = FakeCaller({"double": double})
    tool = composite(Step(
        "each", "double", {"value": "{{ forEach.n }}", "index": "{{ forEach.index }}"}, type="forEach",
        for_each=ForEach("{{ params.numbers }}", item_var="n", max_parallel=2),
    ), parameters={"type": "object", "properties": {"numbers": {"type": "array"}}})
    result = outcome(tool, caller, {"numbers": [1, 2, 3, 4, 5]})
    assert result["isError"] is False
    assert [item["double"] for item in _last_output(result)] == [2, 4, 6, 8, 10]
    assert caller.max_in_flight == 2


def _last_output(result):
    import json
    return json.loads(result["content"][0]["text"])


def test_for_each_collection_from_a_json_string_and_over_the_limit():
    caller = FakeCaller({"t": echo})
    tool = composite(Step("each", "t", {"v": "{{ forEach.item }}"}, type="forEach",
                          for_each=ForEach('{{ "[1, 2]" }}')))
    assert _last_output(outcome(tool, caller)) == [{"v": 1}, {"v": 2}]
    pykka.ActorRegistry.stop_all()
    too_many = composite(Step("each", "t", type="forEach", for_each=ForEach("{{ [1, 2, 3] }}", max_iterations=2)))
    result = outcome(too_many, caller)
    assert result["isError"] is True and "more than the limit of 2" in result["content"][0]["text"]


def test_for_each_item_failure_fails_the_step():
    def picky(arguments):
        if arguments["v"] == 2:
            raise RuntimeError("two is bad")
        return structured(arguments)

    result = outcome(composite(Step("each", "p", {"v": "{{ forEach.item }}"}, type="forEach",
                                    for_each=ForEach("{{ [1, 2, 3] }}"))), FakeCaller({"p": picky}))
    assert result["isError"] is True
    assert "item 1: two is bad" in result["content"][0]["text"]


# -- output and coercion -----------------------------------------------------------------


def test_output_mapping_renders_properties_with_default_fallback():
    caller = FakeCaller({"t": lambda args: text("hello")})
    tool = composite(Step("s", "t"), output=OutputSpec({
        "greeting": OutputProperty("{{ steps.s.output.text }}"),
        "missing": OutputProperty("{{ steps.s.output.nothing }}", default="fallback"),
        "count": OutputProperty("{{ '3' }}", type="integer"),
    }))
    result = outcome(tool, caller)
    assert result["structuredContent"] == {"greeting": "hello", "missing": "fallback", "count": 3}
    assert '"greeting": "hello"' in result["content"][0]["text"]


def test_text_only_results_become_text_keys():
    caller = FakeCaller({"t": lambda args: {"content": [{"type": "text", "text": "one"},
                                                         {"type": "text", "text": "two"}]}})
    assert outcome(composite(Step("s", "t")), caller)["structuredContent"] == {"text": "one", "text_1": "two"}


def test_arguments_are_coerced_to_the_target_input_schema():
    schema = {"type": "object", "properties": {
        "count": {"type": "integer"}, "flag": {"type": "boolean"},
        "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
    }}
    caller = FakeCaller({"t": echo}, schemas={"t": schema})
    tool = composite(Step("s", "t", {"count": "3", "flag": "true", "matrix": [["1", "2.5"], ["3"]]}))
    outcome(tool, caller)
    assert caller.calls == [("t", {"count": 3, "flag": True, "matrix": [[1, 2.5], [3]]})]


# -- parameters --------------------------------------------------------------------------


PARAMS = {"type": "object", "required": ["issue"],
          "properties": {"issue": {"type": "integer"}, "limit": {"type": "integer", "default": 5}}}


def test_parameter_defaults_are_applied():
    caller = FakeCaller({"t": echo})
    tool = composite(Step("s", "t", {"issue": "{{ params.issue }}", "limit": "{{ params.limit }}"}),
                     parameters=PARAMS)
    assert outcome(tool, caller, {"issue": 7})["structuredContent"] == {"issue": 7, "limit": 5}


@pytest.mark.parametrize("params, problem", [({}, "missing required property 'issue'"),
                                             ({"issue": "seven"}, "issue must be integer, got string")])
def test_bad_parameters_fail_before_any_step_runs(params, problem):
    caller = FakeCaller({"t": echo})
    _, future = run(composite(Step("s", "t"), parameters=PARAMS), caller, params)
    with pytest.raises(JsonRpcError) as raised:
        future.result(timeout=WAIT)
    assert raised.value.code == INVALID_PARAMS
    assert problem in raised.value.message
    assert caller.calls == []


CHECKED = {"type": "object", "properties": {
    "unit": {"enum": ["C", "F"]},
    "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "city": {"type": "string", "minLength": 2},
    "tags": {"type": "array", "items": {"type": "string"}},
    "trip": {"type": "object", "additionalProperties": False, "properties": {"nights": {"type": "integer"}}},
}}


@pytest.mark.parametrize(("params", "problem"), [
    ({"unit": "K"}, "unit: 'K' is not one of ['C', 'F']"),
    ({"code": "osl"}, "code: 'osl' does not match '^[A-Z]{3}$'"),
    ({"days": 0}, "days: 0 is less than the minimum of 1"),
    ({"days": 15}, "days: 15 is greater than the maximum of 14"),
    ({"city": "X"}, "city: 'X' is too short"),
    ({"tags": ["a", 2]}, "tags[1] must be string, got integer"),
    ({"trip": {"nights": 2, "pets": 1}}, "trip: Additional properties are not allowed ('pets' was unexpected)"),
])
def test_every_keyword_of_the_parameters_schema_is_enforced_naming_where(params, problem):
    with pytest.raises(JsonRpcError) as raised:
        validate_params(params, CHECKED)
    assert raised.value.code == INVALID_PARAMS
    assert raised.value.message == f"Invalid params: {problem}"


def test_parameters_the_schema_allows_pass_with_defaults_filled_in_at_every_level():
    schema = {"type": "object", "properties": {
        "trip": {"type": "object", "default": {}, "properties": {"nights": {"type": "integer", "default": 3}}},
        "days": {"type": "integer", "minimum": 1},
    }}
    assert validate_params(None, schema) == {"trip": {"nights": 3}}
    assert validate_params({"trip": {}, "days": 2}, schema) == {"trip": {"nights": 3}, "days": 2}


def test_a_missing_required_property_is_named_before_a_problem_deeper_down():
    schema = {"type": "object", "required": ["issue"],
              "properties": {"issue": {"type": "integer"}, "trip": {"properties": {"nights": {"type": "integer"}}}}}
    with pytest.raises(JsonRpcError) as raised:
        validate_params({"trip": {"nights": "two"}}, schema)
    assert raised.value.message == "Invalid params: missing required property 'issue'"


def test_a_ref_the_schema_cannot_resolve_is_an_internal_error_not_a_crash():
    schema = {"type": "object", "properties": {"unit": {"$ref": "https://schemas.example.com/unit.json"}}}
    with pytest.raises(JsonRpcError) as raised:
        validate_params({"unit": "C"}, schema)
    assert raised.value.code == INTERNAL_ERROR
    assert "cannot be resolved" in raised.value.message


# -- lifecycle ---------------------------------------------------------------------------


def test_status_snapshot_while_running_and_cancel_on_stop():
    release = threading.Event()

    def blocked(arguments):
        release.wait(WAIT)
        return structured({})

    caller = FakeCaller({"b": blocked, "t": echo})
    tool = composite(Step("first", "t"), Step("wait", "b", depends_on=("first",)),
                     Step("later", "t", depends_on=("wait",)))
    ref = WorkflowRun.start(tool, {}, caller, run_id="run-9")
    proxy = ref.proxy()
    future = proxy.result().get(timeout=WAIT)
    assert wait_until(lambda: proxy.status().get(timeout=WAIT)["steps"]["wait"] == "running", timeout=WAIT)
    status = proxy.status().get(timeout=WAIT)
    assert status["composite"] == "c" and status["runId"] == "run-9"
    assert status["steps"] == {"first": "completed", "wait": "running", "later": "pending"}
    assert status["stepsStarted"] == 2

    ref.stop(timeout=WAIT)
    with pytest.raises(WorkflowCancelled):
        future.result(timeout=WAIT)
    release.set()


def test_cancel_fails_the_result_and_stops_the_run():
    release = threading.Event()
    caller = FakeCaller({"b": lambda args: (release.wait(WAIT), structured({}))[1]})
    ref = WorkflowRun.start(composite(Step("s", "b")), {}, caller, run_id="r")
    proxy = ref.proxy()
    future = proxy.result().get(timeout=WAIT)
    proxy.cancel().get(timeout=WAIT)
    with pytest.raises(WorkflowCancelled):
        future.result(timeout=WAIT)
    assert wait_until(lambda: not ref.is_alive(), timeout=WAIT)
    release.set()


def test_the_run_stops_itself_once_settled():
    ref, future = run(composite(Step("s", "t")), FakeCaller({"t": echo}))
    future.result(timeout=WAIT)
    assert wait_until(lambda: not ref.is_alive(), timeout=WAIT)


def test_nested_output_properties_build_an_object_and_values_left_empty_are_absent():
    caller = FakeCaller({"t": lambda args: structured({"n": "7", "tags": '["a", "b"]'})})
    tool = composite(Step("s", "t"), output=OutputSpec({
        "summary": OutputProperty(properties={
            "count": OutputProperty("{{ steps.s.output.n }}", type="integer"),
            "tags": OutputProperty("{{ steps.s.output.tags }}", type="array"),
        }),
        "absent": OutputProperty("{{ steps.s.output.nothing }}", type="string"),
    }))
    assert outcome(tool, caller)["structuredContent"] == {"summary": {"count": 7, "tags": ["a", "b"]}}


def test_a_required_output_without_value_or_default_is_an_error_result():
    caller = FakeCaller({"t": lambda args: text("hello")})
    tool = composite(Step("s", "t"), output=OutputSpec(
        {"title": OutputProperty("{{ steps.s.output.title }}", type="string")}, required=("title",)))
    result = outcome(tool, caller)
    assert result["isError"] is True
    assert "required output 'title' has no value" in result["content"][0]["text"]


def test_a_step_that_continues_on_error_offers_its_default_results_downstream():
    caller = FakeCaller({"bad": failing(), "t": echo})
    tool = composite(
        Step("a", "bad", on_error=OnError("continue"), default_results={"title": "fallback"}),
        Step("b", "t", {"got": "{{ steps.a.output.title }}", "status": "{{ steps.a.status }}"}, depends_on=("a",)),
    )
    result = outcome(tool, caller)
    assert result["structuredContent"] == {"got": "fallback", "status": "failed"}


def test_observers_hear_each_step_end_and_the_settled_run_once():
    progress: list[tuple[int, int, str]] = []
    finished: list[dict[str, Any]] = []
    caller = FakeCaller({"t": echo})
    tool = composite(Step("a", "t"), Step("b", "t", condition="{{ false }}", default_results={}),
                     Step("c", "t", depends_on=("a",)))
    result = outcome(tool, caller, on_progress=lambda *event: progress.append(event), on_finish=finished.append)
    assert result["isError"] is False
    assert [done for done, _, _ in progress] == [1, 2, 3]
    assert {total for _, total, _ in progress} == {3}
    assert "step 'b' skipped" in [message for _, _, message in progress]
    assert len(finished) == 1 and finished[0]["state"] == "completed" and finished[0]["composite"] == "c"


def test_an_output_value_of_the_wrong_type_falls_back_to_the_default_or_is_left_out():
    caller = FakeCaller({"t": lambda args: structured({"word": "many", "n": "4"})})
    tool = composite(Step("s", "t"), output=OutputSpec({
        "count": OutputProperty("{{ steps.s.output.word }}", type="integer", default=0),
        "flag": OutputProperty("{{ steps.s.output.word }}", type="boolean"),
        "n": OutputProperty("{{ steps.s.output.n }}", type="integer", default="not a number"),
    }))
    assert outcome(tool, caller)["structuredContent"] == {"count": 0, "n": 4}


def test_templates_reading_names_the_context_lacks_are_composite_problems():
    go_function = composite(Step("a", "t", {"same": "{{ eq .params.a .params.b }}"}))
    assert composite_problems(go_function) == [(
        "steps[0].arguments.same",
        "composite 'c', step 'a': reads 'eq', which templates do not have (they read params, steps, workflow, "
        "and forEach in a forEach step's arguments; Go-template functions such as eq are not supported, write Jinja)",
    )]
    stray_item = composite(Step("a", "t", {"x": "{{ forEach.item }}"}))
    assert composite_problems(stray_item)[0][1].endswith("forEach is only defined in the arguments of a forEach "
                                                         "step's inner step")
    fine = composite(
        Step("a", "t", {"x": "{{ forEach.item }}", "y": "{% set z = params.q %}{{ z }}{{ range(2) | list }}"},
             type="forEach", for_each=ForEach("{{ [1] }}")),
        output=OutputSpec({"v": OutputProperty("{{ workflow.id }}")}))
    assert composite_problems(fine) == []
    unknown_in_output = composite(Step("a", "t"), output=OutputSpec({"v": OutputProperty("{{ nope }}")}))
    assert composite_problems(unknown_in_output)[0][0] == "output.properties.v.value"


def test_a_failed_run_is_logged_once_with_the_composite_the_step_and_why(caplog):
    caplog.set_level("DEBUG", logger="vmcp_actors.workflows.engine")
    caller = FakeCaller({"bad": failing("backend down")})
    ref, future = run(composite(Step("broken", "bad")), caller)
    assert future.result(timeout=WAIT)["isError"] is True
    # The run logs on its own thread after the outcome arrives; once it has stopped, it logs no more.
    assert wait_until(lambda: not ref.is_alive(), timeout=WAIT)
    lines = [record for record in caplog.records if record.name == "vmcp_actors.workflows.engine"]
    assert len(lines) == 1 and lines[0].levelname == "WARNING"
    assert "composite 'c' run" in lines[0].getMessage() and "step 'broken' failed: backend down" in lines[0].getMessage()


# -- elicitation steps (ToolHive's type: elicitation) ------------------------------------------

CONFIRM = {"type": "object", "properties": {"confirm": {"type": "boolean"}, "note": {"type": "string"}},
           "required": ["confirm"]}


class AskingCaller(FakeCaller):
    """A FakeCaller whose client answers elicitations with ``answer``: a dict, an exception,
    or None to leave the future for the test to settle (``pending``)."""

    def __init__(self, tools: dict[str, Any], answer: Any = None):
        super().__init__(tools)
        self.answer = answer
        self.asked: list[tuple[str, str, dict[str, Any]]] = []
        self.deadlines: list[Deadline] = []
        self.pending: list[cf.Future[dict[str, Any]]] = []
        self.asked_event = threading.Event()

    def elicit(self, step_id: str, message: str, requested_schema: Any, deadline: Deadline):
        self.asked.append((step_id, message, dict(requested_schema)))
        self.deadlines.append(deadline)
        future: cf.Future[dict[str, Any]] = cf.Future()
        if isinstance(self.answer, BaseException):
            future.set_exception(self.answer)
        elif self.answer is not None:
            future.set_result(self.answer)
        self.pending.append(future)
        self.asked_event.set()
        return future


def confirm_step(**fields: Any) -> Step:
    fields.setdefault("message", "Deploy {{ params.app }}?")
    return Step("confirm", None, type="elicitation", elicitation_schema=CONFIRM, **fields)


def deploy_step(**fields: Any) -> Step:
    return Step("deploy", "deploy", {"approved": "{{ steps.confirm.output.action }}",
                                     "note": "{{ steps.confirm.output.content.note | default('none') }}"},
                depends_on=("confirm",), **fields)


def texts_of(result: dict[str, Any]) -> str:
    return " ".join(block.get("text", "") for block in result.get("content", []))


def confirm_output() -> OutputSpec:
    return OutputSpec({"answer": OutputProperty("{{ steps.confirm.output }}", type="object")})


def test_an_accepted_elicitation_feeds_later_steps_through_its_output():
    caller = AskingCaller({"deploy": echo}, {"action": "accept", "content": {"confirm": True, "note": "go"}})
    result = outcome(composite(confirm_step(), deploy_step()), caller, {"app": "web"})
    assert caller.asked == [("confirm", "Deploy web?", CONFIRM)]
    assert caller.calls == [("deploy", {"approved": "accept", "note": "go"})]
    assert result["structuredContent"] == {"approved": "accept", "note": "go"}


def test_the_output_of_each_answer_as_later_steps_read_it():
    answers = {
        "accept": ({"action": "accept", "content": {"confirm": False}}, {}),
        "decline": ({"action": "decline"}, {"on_decline": "continue"}),
        "cancel": ({"action": "cancel", "content": {"ignored": 1}}, {"on_cancel": "continue"}),
    }
    outputs = {}
    for action, (answer, fields) in answers.items():
        caller = AskingCaller({}, answer)
        result = outcome(composite(confirm_step(**fields), output=confirm_output()), caller, {"app": "web"})
        outputs[action] = result["structuredContent"]["answer"]
    assert outputs == {
        "accept": {"action": "accept", "content": {"confirm": False}},
        "decline": {"action": "decline", "content": {}},
        "cancel": {"action": "cancel", "content": {}},
    }


@pytest.mark.parametrize("action, policy, ran_deploy, failed", [
    ("decline", "abort", False, True),
    ("decline", "continue", True, False),
    ("decline", "skip_remaining", False, False),
    ("cancel", "abort", False, True),
    ("cancel", "continue", True, False),
    ("cancel", "skip_remaining", False, False),
])
def test_decline_and_cancel_follow_their_action(action, policy, ran_deploy, failed):
    caller = AskingCaller({"deploy": echo}, {"action": action})
    other = "on_cancel" if action == "decline" else "on_decline"  # the other action must not matter
    fields = {"on_decline" if action == "decline" else "on_cancel": policy, other: "continue"}
    result = outcome(composite(confirm_step(**fields), deploy_step()), caller, {"app": "web"})
    assert bool(caller.calls) is ran_deploy
    if ran_deploy:
        assert caller.calls == [("deploy", {"approved": action, "note": "none"})]
    assert bool(result.get("isError")) is failed
    if failed:
        on = "onDecline" if action == "decline" else "onCancel"
        assert texts_of(result) == (f"composite tool 'c': step 'confirm' failed: the user {action}d ({on} is abort)"
                                    if action == "decline" else
                                    f"composite tool 'c': step 'confirm' failed: the user cancelled ({on} is abort)")


def test_skip_remaining_lets_steps_in_flight_finish_skips_the_rest_and_completes():
    release_slow = threading.Event()
    caller = AskingCaller({"slow": held(release_slow, structured({"slept": 0.3})), "deploy": echo, "notify": echo},
                          None)
    tool = composite(
        Step("slow", "slow", {"n": 1}),  # independent of the question: already running
        confirm_step(on_decline="skip_remaining"),
        deploy_step(default_results={"not": "deployed"}),
        Step("notify", "notify", {}, depends_on=("deploy",)),
        output=OutputSpec({
            "answer": OutputProperty("{{ steps.confirm.output }}", type="object"),
            "slow": OutputProperty("{{ steps.slow.output.slept }}", type="number"),
            "deploy": OutputProperty("{{ steps.deploy.output }}", type="object"),
            "statuses": OutputProperty("{{ steps.deploy.status }} {{ steps.notify.status }} "
                                       "{{ steps.confirm.status }}"),
        }),
    )
    progress: list[tuple[int, int, str]] = []
    ref = WorkflowRun.start(tool, {"app": "web"}, caller, run_id="r", on_progress=lambda *e: progress.append(e))
    assert caller.asked_event.wait(WAIT)
    caller.pending[0].set_result({"action": "decline"})
    assert wait_until(lambda: len(progress) == 3, timeout=WAIT)  # the rest is skipped while slow still runs
    release_slow.set()
    result = ref.proxy().result().get(timeout=WAIT).result(timeout=WAIT)
    assert result["structuredContent"] == {
        "answer": {"action": "decline", "content": {}, "skipped": True},
        "slow": 0.3,
        "deploy": {"not": "deployed"},
        "statuses": "skipped skipped completed",
    }
    assert [tool_name for tool_name, _ in caller.calls] == ["slow"]
    assert progress == [(1, 4, "step 'confirm' completed (decline: skipping the remaining steps)"),
                        (2, 4, "step 'deploy' skipped"), (3, 4, "step 'notify' skipped"),
                        (4, 4, "step 'slow' completed")]


def test_a_user_who_declines_is_logged_at_info_not_as_a_gateway_problem(caplog):
    caplog.set_level("INFO", logger="vmcp_actors.workflows.engine")
    ref, future = run(composite(confirm_step(), deploy_step()), AskingCaller({"deploy": echo}, {"action": "decline"}),
                      {"app": "web"})
    future.result(timeout=WAIT)
    # The run logs on its own thread after the outcome arrives; once it has stopped, it logs no more.
    assert wait_until(lambda: not ref.is_alive(), timeout=WAIT)
    lines = [record for record in caplog.records if record.name == "vmcp_actors.workflows.engine"]
    assert [record.levelname for record in lines] == ["INFO"]
    assert "step 'confirm' failed: the user declined (onDecline is abort)" in lines[0].getMessage()


def test_abort_still_lets_on_error_continue_the_run_as_in_toolhive():
    caller = AskingCaller({"deploy": echo}, {"action": "decline"})
    tool = composite(confirm_step(on_error=OnError("continue"), default_results={"action": "none", "content": {}}),
                     deploy_step())
    result = outcome(tool, caller, {"app": "web"})
    assert caller.calls == [("deploy", {"approved": "none", "note": "none"})]
    assert not result["isError"]


def test_a_client_that_cannot_be_asked_fails_the_step_by_name_at_once():
    from vmcp_actors.workflows.engine import ElicitationUnsupported

    caller = AskingCaller({"deploy": echo}, ElicitationUnsupported("confirm"))
    started = time.monotonic()
    result = outcome(composite(confirm_step(), deploy_step()), caller, {"app": "web"})
    assert result["isError"] and texts_of(result) == (
        "composite tool 'c': step 'confirm' needs the client to support elicitation, and it did not declare it")
    # at once: not after the step's 300 s wait for an answer
    assert time.monotonic() - started < 10 and caller.calls == []


def test_a_caller_that_raises_instead_of_answering_fails_the_step():
    class Raising(AskingCaller):
        def elicit(self, *args: Any):
            raise JsonRpcError(INTERNAL_ERROR, "no stream to ask on")

    result = outcome(composite(confirm_step()), Raising({}), {"app": "web"})
    assert texts_of(result) == ("composite tool 'c': step 'confirm' failed: asking the client failed: "
                                "no stream to ask on")


def test_an_error_answer_fails_the_step_and_is_never_retried():
    caller = AskingCaller({}, JsonRpcError(INTERNAL_ERROR, "User rejected"))
    result = outcome(composite(confirm_step(on_error=OnError("retry", retry_count=3, retry_delay=0))), caller,
                     {"app": "web"})
    assert texts_of(result) == "composite tool 'c': step 'confirm' failed: asking the client failed: User rejected"
    assert len(caller.asked) == 1


@pytest.mark.parametrize("answer, why", [
    ({"action": "maybe"}, "action 'maybe' is not one of accept, decline, cancel"),
    ("accept", "the result is str, not an object"),
    ({"action": "accept", "content": "yes"}, "content must be an object, got string"),
    ({"action": "accept", "content": {"note": "no confirm"}},
     "content does not match the schema: missing required property 'confirm'"),
    ({"action": "accept", "content": {"confirm": "yes"}},
     "content does not match the schema: confirm must be boolean, got string"),
    ({"action": "accept", "content": {"confirm": True, "x": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {
        "h": {"i": {"j": 1}}}}}}}}}}}}, "content is nested deeper than 10 levels"),
])
def test_a_malformed_answer_fails_the_step_by_name(answer, why):
    caller = AskingCaller({"deploy": echo}, answer)
    result = outcome(composite(confirm_step(), deploy_step()), caller, {"app": "web"})
    assert texts_of(result) == f"composite tool 'c': step 'confirm' failed: the client's answer is malformed: {why}"
    assert caller.calls == []


def test_accept_without_content_reads_as_empty_content():
    optional = {"type": "object", "properties": {"note": {"type": "string"}}}
    caller = AskingCaller({}, {"action": "accept"})
    step = Step("confirm", None, type="elicitation", message="Note?", elicitation_schema=optional)
    result = outcome(composite(step, output=confirm_output()), caller)
    assert result["structuredContent"] == {"answer": {"action": "accept", "content": {}}}


def test_an_unanswered_elicitation_times_out_and_a_late_answer_is_ignored():
    caller = AskingCaller({"deploy": echo}, None)
    started = time.monotonic()
    ref, future = run(composite(confirm_step(timeout=0.3, on_error=OnError("retry", retry_count=2, retry_delay=0)),
                                deploy_step()), caller, {"app": "web"})
    result = future.result(timeout=WAIT)
    assert texts_of(result) == ("composite tool 'c': step 'confirm' failed: timed out after 0.3 s without an answer "
                                "(a timeout counts as a cancel; onCancel is abort)")
    assert time.monotonic() - started >= 0.3 and len(caller.asked) == 1  # a person is not asked twice
    caller.pending[0].set_result({"action": "accept", "content": {"confirm": True}})  # too late: nothing happens
    assert wait_until(lambda: not ref.is_alive(), timeout=WAIT)  # a run that stopped calls nothing more
    assert caller.calls == []


def test_a_timeout_follows_on_cancel_as_in_toolhive_with_the_action_timeout():
    caller = AskingCaller({"deploy": echo}, None)
    result = outcome(composite(confirm_step(timeout=0.2, on_cancel="continue"), deploy_step()), caller,
                     {"app": "web"})
    assert caller.calls == [("deploy", {"approved": "timeout", "note": "none"})]
    caller.pending[0].set_result({"action": "accept", "content": {"confirm": True}})  # late: ignored
    assert not result["isError"]


def test_a_caller_that_gives_up_at_the_deadline_counts_as_a_timeout():
    class GivingUp(AskingCaller):
        def elicit(self, step_id, message, requested_schema, deadline):
            future = super().elicit(step_id, message, requested_schema, deadline)
            call_later(max(0.0, deadline.remaining()) + 0.01,
                       lambda: future.set_exception(JsonRpcError(INTERNAL_ERROR, "no answer")))
            return future

    # the run's timers run late here, so the caller's failure at the deadline comes first
    caller = GivingUp({"deploy": echo}, None)
    result = outcome(composite(confirm_step(timeout=0.2, on_cancel="continue"), deploy_step()), caller,
                     {"app": "web"}, schedule=lambda delay, fn: call_later(delay + 1.0, fn))
    assert caller.calls == [("deploy", {"approved": "timeout", "note": "none"})] and not result["isError"]


def test_the_caller_gets_the_rendered_message_the_schema_and_a_deadline_within_the_step_timeout():
    caller = AskingCaller({}, {"action": "accept", "content": {"confirm": True}})
    started = time.monotonic()
    step = confirm_step(message="{{ params.apps }}", timeout=60)
    outcome(composite(step), caller, {"apps": ["web", "db"]})
    assert caller.asked == [("confirm", '["web","db"]', CONFIRM)]  # a whole value is written as JSON text
    assert started + 59 < caller.deadlines[0].at <= time.monotonic() + 60


def test_an_elicitation_waits_at_most_ten_minutes_and_no_longer_than_the_run():
    caller = AskingCaller({}, {"action": "accept", "content": {"confirm": True}})
    outcome(composite(confirm_step(timeout=3600)), caller, {"app": "web"})
    assert caller.deadlines[0].remaining() <= 600
    caller = AskingCaller({}, {"action": "accept", "content": {"confirm": True}})
    outcome(composite(confirm_step(timeout=300), timeout=5), caller, {"app": "web"})
    assert caller.deadlines[0].remaining() <= 5


def test_a_message_that_fails_to_render_fails_the_step_without_asking():
    caller = AskingCaller({}, {"action": "accept", "content": {"confirm": True}})
    result = outcome(composite(confirm_step(message="Deploy {{ params.app.name }}?")), caller, {"app": "web"})
    assert texts_of(result).startswith("composite tool 'c': step 'confirm' failed: message: ")
    assert caller.asked == []


def test_a_condition_skips_an_elicitation_like_any_step():
    caller = AskingCaller({"deploy": echo}, {"action": "accept", "content": {"confirm": True}})
    tool = composite(confirm_step(condition="{{ params.app == 'prod' }}",
                                  default_results={"action": "accept", "content": {"note": "auto"}}), deploy_step())
    outcome(tool, caller, {"app": "web"})
    assert caller.asked == [] and caller.calls == [("deploy", {"approved": "accept", "note": "auto"})]


def test_elicitation_steps_count_in_progress_like_other_steps():
    caller = AskingCaller({"deploy": echo}, {"action": "accept", "content": {"confirm": True}})
    progress: list[tuple[int, int, str]] = []
    outcome(composite(confirm_step(), deploy_step()), caller, {"app": "web"},
            on_progress=lambda *event: progress.append(event))
    assert progress == [(1, 2, "step 'confirm' completed"), (2, 2, "step 'deploy' completed")]


def test_a_toolhive_config_with_a_for_each_inner_id_and_type_loads_and_runs():
    from vmcp_actors.config import config_from_mapping

    config = config_from_mapping({
        "name": "t",
        "backends": [{"name": "osv", "url": "http://127.0.0.1:8081/mcp"}],
        "compositeTools": [{
            "name": "check", "description": "Each package",
            "parameters": {"type": "object", "properties": {"packages": {"type": "array"}}},
            "steps": [{"id": "each", "type": "forEach", "collection": "{{json .params.packages}}", "itemVar": "pkg",
                       "step": {"id": "query", "type": "tool", "tool": "osv.query",
                                "arguments": {"name": "{{.forEach.pkg.name}}", "at": "{{ forEach.index }}"}}}],
        }],
    })
    caller = FakeCaller({"osv.query": echo})
    result = outcome(config.composite_tools[0], caller, {"packages": [{"name": "a"}, {"name": "b"}]})
    assert sorted(caller.calls, key=lambda call: call[1]["at"]) == [
        ("osv.query", {"name": "a", "at": 0}), ("osv.query", {"name": "b", "at": 1})]
    assert texts_of(result) == '[{"name": "a", "at": 0}, {"name": "b", "at": 1}]'
