"""The WorkflowRun actor: one run of a composite tool.

The actor owns the run's state (which steps are pending, running, done; their outcomes;
timers) and never waits in its loop: every step call, and every question to the client
(an elicitation step), is handed to the StepCaller, which returns a future at once, and
its outcome comes back as a message (``_CallDone``, ``_Elicited``); timers report with
``_StepTimedOut`` / ``_RunTimedOut`` / ``_Relaunch``. Templates are rendered and
arguments coerced to the target's input schema in the actor (CPU only, bounded by the
sandbox's budget). Nor does anything on its loop call a store: what the StepCaller, the
observers (``on_steps``, ``on_progress``, ``on_finish``) and the result future's callbacks
run on the loop only hands store I/O (a task's record, a rate-limit decision) to the I/O
pool (a ``LoopActor``: the test suite refuses a store call here).

Semantics follow ToolHive's vMCP: every step whose dependencies are done starts at once,
up to ``max_parallel``; ``onError`` decides whether a failure aborts the run, lets its
dependents continue, or is retried with exponential backoff (a timer, so no thread sleeps
through it); a step or run that outlives its timeout fails, and a late answer is ignored.
The run ends by its deadline (the request's, else its own timeout from the start), and
each step call's deadline is the sooner of the run's and the step's timeout.

The run stops itself once its result is settled and the owner has asked ``result()``; the
future stays readable after that. The owner stops it early (or calls ``cancel``) to
cancel: the result then fails with :class:`WorkflowCancelled`.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from jsonschema.exceptions import best_match

from vmcp_actors.concurrency import (
    Deadline,
    LoopActor,
    TimerHandle,
    call_later,
    on_settled,
    stop_quietly,
    tell_quietly,
)
from vmcp_actors.protocol import INTERNAL_ERROR, INVALID_PARAMS, JsonRpcError
from vmcp_actors.workflows._coercion import _has_type as has_json_type
from vmcp_actors.workflows._coercion import coerce_arguments
from vmcp_actors.workflows._dag import StepSpec, ready_steps
from vmcp_actors.workflows._definition import (
    MAX_FOR_EACH_ITERATIONS,
    CompositeTool,
    OutputProperty,
    Step,
)
from vmcp_actors.workflows._errors import TemplateError
from vmcp_actors.workflows._params import json_type as _json_type
from vmcp_actors.workflows._params import problem_text as _problem_text
from vmcp_actors.workflows._params import schema_validator as _validator
from vmcp_actors.workflows._params import validate_params
from vmcp_actors.workflows._sandbox import as_text
from vmcp_actors.workflows._templates import (
    ForEachItem,
    StepOutcome,
    render_condition,
    render_value,
    template_context,
)

logger = logging.getLogger(__name__)


class StepCaller(Protocol):
    """What the session layer provides to a run (the composite layer over the routing table)."""

    def elicit(self, step_id: str, message: str, requested_schema: Mapping[str, Any],
               deadline: Deadline) -> cf.Future[dict[str, Any]]:
        """Ask the client that called the composite (elicitation/create, form mode), without
        blocking or calling a store (a task's question is recorded on the I/O pool). The future settles with the client's ElicitResult dict
        ({"action": "accept" | "decline" | "cancel", "content": {...}}), or fails with a
        JsonRpcError: the client did not declare elicitation (ElicitationUnsupported), it
        answered with an error, or it did not answer by ``deadline``."""

    def input_schema(self, tool: str) -> Mapping[str, Any] | None:
        """The target tool's input schema, from below the advertising filter."""

    def call(self, tool: str, arguments: dict[str, Any], deadline: Deadline) -> cf.Future[dict[str, Any]]:
        """Start calling ``tool`` without blocking or calling a store (called in the
        run's actor: a rate-limit decision is pooled work too); the future settles with the MCP
        CallToolResult dict, or with ``JsonRpcError`` (or any exception) on failure. The run
        cancels the future when it ends first: the call is then dropped or cancelled."""


class ElicitationUnsupported(JsonRpcError):
    """The client that called the composite cannot be asked (it did not declare elicitation)."""

    def __init__(self, step_id: str):
        super().__init__(INVALID_PARAMS, f"step {step_id!r} needs the client to support elicitation, and it did "
                                         "not declare it")


class WorkflowCancelled(JsonRpcError):
    """The run was stopped before it produced a result."""

    def __init__(self, composite: str):
        super().__init__(INTERNAL_ERROR, f"composite tool {composite!r}: the run was cancelled")


# -- messages (to the actor itself) ------------------------------------------------------


@dataclass(frozen=True)
class _CallDone:
    step_id: str
    attempt: int
    index: int | None  # the forEach iteration, None for a plain step
    result: Any = None  # the CallToolResult dict, when the call returned
    error: str | None = None  # when it raised
    late: bool = False  # it raised at or after its deadline: the step's or the run's timeout, not the backend


@dataclass(frozen=True)
class _Elicited:
    step_id: str
    attempt: int
    result: Any = None  # the client's ElicitResult dict
    error: str | None = None  # when asking failed
    unsupported: bool = False  # the failure was ElicitationUnsupported: error is its whole message


@dataclass(frozen=True)
class _StepTimedOut:
    step_id: str
    attempt: int


@dataclass(frozen=True)
class _RunTimedOut:
    pass


@dataclass(frozen=True)
class _Relaunch:
    """A retry's back-off is over: start the attempt."""

    step_id: str
    attempt: int


class _StepFailure(Exception):
    """A step failed in a way that retrying cannot change (a template, a bad collection)."""


@dataclass
class _Running:
    """A step in flight (mutable, actor-private)."""

    attempt: int
    timer: TimerHandle
    retries: int = 0
    deadline: Deadline | None = None  # an elicitation's: a failure after it counts as its timeout
    # forEach only: the rendered items, their outputs, and what is left to start
    items: list[Any] | None = None
    outputs: list[Any] | None = None
    next_item: int = 0
    in_flight: int = 0
    finished_items: int = 0


# -- the actor ---------------------------------------------------------------------------


class WorkflowRun(LoopActor):
    """One composite-tool call. Ask ``result()`` for the CallToolResult future,
    ``status()`` for the admin snapshot, ``cancel()`` to stop it."""

    def __init__(self, tool: CompositeTool, params: dict[str, Any] | None, caller: StepCaller, *,
                 run_id: str, clock: Callable[[], float] = time.monotonic,
                 deadline: Deadline | None = None,
                 schedule: Callable[[float, Callable[[], None]], TimerHandle] = call_later,
                 on_progress: Callable[[int, int, str], None] | None = None,
                 on_finish: Callable[[dict[str, Any]], None] | None = None,
                 on_steps: Callable[[dict[str, str]], None] | None = None):
        """``on_progress(done, total, message)`` is called (in the actor) as each step
        ends; ``on_steps(states)`` with every step's state after steps start or end;
        ``on_finish(status)`` once, when the run settles. None may block or call a store.
        ``deadline`` ends the run (default: the composite's timeout from now);
        ``schedule(delay, fn)`` runs timers (back-off, timeouts)."""
        super().__init__()
        self._on_progress = on_progress
        self._on_finish = on_finish
        self._on_steps = on_steps
        self._tool = tool
        self._raw_params = params
        self._params: dict[str, Any] = {}
        self._caller = caller
        self._run_id = run_id
        self._clock = clock
        self._deadline = deadline if deadline is not None else Deadline.after(tool.timeout)
        self._schedule_later = schedule
        self._steps = {step.id: step for step in reversed(tool.steps)}  # first declaration wins
        self._specs: tuple[StepSpec, ...] = ()  # the step graph, once the definition proved valid
        self._future: cf.Future[dict[str, Any]] = cf.Future()
        self._status = {step.id: "pending" for step in tool.steps}
        self._outcomes: dict[str, StepOutcome] = {}
        self._running: dict[str, _Running] = {}
        self._calls: list[cf.Future[dict[str, Any]]] = []  # every step call made (cancelled when the run ends)
        self._run_timer: TimerHandle | None = None
        self._state = "new"  # running, completed, failed, cancelled
        self._scheduling = False
        self._result_taken = False
        self._ended_by_client = False  # the user declined or cancelled, or the client cannot be asked
        self._started_wall = time.time()
        self._started = clock()
        self._ended: float | None = None
        # counters for metrics
        self.steps_started = 0
        self.steps_failed = 0

    # -- asked by the owner ----------------------------------------------------------------

    def result(self) -> cf.Future[dict[str, Any]]:
        """The run's CallToolResult. Once the owner holds it and it is settled, the run
        stops itself (not before: a run settled in ``on_start`` must stay askable). The
        future is settled in the actor: its callbacks run on the loop unless added later."""
        self._result_taken = True
        if self._future.done():
            self._stop_soon()
        return self._future

    def status(self) -> dict[str, Any]:
        return {
            "composite": self._tool.name,
            "runId": self._run_id,
            "started": self._started_wall,
            "state": self._state,
            "steps": dict(self._status),
            "stepsStarted": self.steps_started,
            "stepsFailed": self.steps_failed,
            "duration": self.duration,
        }

    @property
    def duration(self) -> float:
        return (self._ended if self._ended is not None else self._clock()) - self._started

    def cancel(self) -> None:
        self._settle(error=WorkflowCancelled(self._tool.name), state="cancelled")
        self._stop_soon()

    # -- lifecycle -------------------------------------------------------------------------

    def on_start(self) -> None:
        self._state = "running"
        try:
            self._params = validate_params(self._raw_params, self._tool.parameters)
        except JsonRpcError as err:
            self._settle(error=err, state="failed")
            return
        problems = self._tool.problems
        if problems:
            message = "; ".join(f"{path}: {problem}" for path, problem in problems)
            self._settle(error=JsonRpcError(INTERNAL_ERROR, f"invalid composite tool: {message}"), state="failed")
            return
        self._specs = self._tool.graph
        self._run_timer = self._timer(self._deadline.remaining(), _RunTimedOut())
        self._schedule()

    def on_stop(self) -> None:
        self._cancel_timers()
        if not self._future.done():
            self._settle(error=WorkflowCancelled(self._tool.name), state="cancelled")

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        self._cancel_timers()
        if not self._future.done():
            self._future.set_exception(JsonRpcError(INTERNAL_ERROR, f"composite tool {self._tool.name!r}: "
                                                                    f"internal error: {exception_value}"))

    def on_receive(self, message: Any) -> None:
        if self._future.done():
            return  # late answers and timers after the result is settled
        if isinstance(message, _CallDone):
            self._on_call_done(message)
        elif isinstance(message, _Elicited):
            self._on_elicited(message)
        elif isinstance(message, _StepTimedOut):
            running = self._running.get(message.step_id)
            if running is not None and running.attempt == message.attempt:
                self._timed_out(self._steps[message.step_id])
        elif isinstance(message, _Relaunch):
            running = self._running.get(message.step_id)
            if running is not None and running.attempt == message.attempt:
                self._launch(self._steps[message.step_id], running, delay=0.0)
        elif isinstance(message, _RunTimedOut):
            self._run_timed_out()

    def _timed_out(self, step: Step) -> None:
        if step.type == "elicitation":
            self._not_accepted(step, "timeout")
        else:
            self._attempt_failed(step, f"timed out after {step.timeout:g} s")

    def _run_timed_out(self) -> None:
        self._settle(result=error_result(
            f"composite tool {self._tool.name!r} timed out after {self._tool.timeout:g} s"), state="failed")

    # -- scheduling ------------------------------------------------------------------------

    def _schedule(self) -> None:
        """Start every ready step up to max_parallel; settle the run once all are done.
        Steps that finish at once (skipped, failing to render) loop here, not recurse."""
        if self._scheduling:
            return
        self._scheduling = True
        try:
            while not self._future.done():
                done = [step_id for step_id, outcome in self._outcomes.items()]
                ready = ready_steps(self._specs, done, self._running)
                capacity = self._tool.max_parallel - len(self._running)
                if not ready or capacity <= 0:
                    break
                for step_id in ready[:capacity]:
                    self._start_step(self._steps[step_id])
                    if self._future.done():
                        return
            if not self._future.done() and not self._running:
                if len(self._outcomes) == len(self._steps):
                    self._settle(result=self._final_result(), state="completed")
                else:
                    stuck = ", ".join(repr(s) for s in self._steps if s not in self._outcomes)
                    self._settle(error=JsonRpcError(INTERNAL_ERROR, f"composite tool {self._tool.name!r}: "
                                                                    f"steps {stuck} cannot run"), state="failed")
        finally:
            self._scheduling = False
        if self._on_steps is not None and not self._future.done():
            try:
                self._on_steps(dict(self._status))
            except Exception:  # noqa: BLE001 - an observer must not break the run
                logger.exception("composite %r run %s: a step observer failed", self._tool.name, self._run_id)

    def _start_step(self, step: Step) -> None:
        self.steps_started += 1
        self._status[step.id] = "running"
        if step.condition is not None:
            try:
                run_it = render_condition(step.condition, self._context())
            except TemplateError as err:
                self._step_failed(step, f"condition: {err}")
                return
            if not run_it:
                self._status[step.id] = "skipped"
                self._outcomes[step.id] = StepOutcome("skipped", copy.deepcopy(step.default_results))
                self._progress(f"step {step.id!r} skipped")
                return
        attempt = _Running(attempt=1, timer=self._timer(step.attempt_timeout, _StepTimedOut(step.id, 1)))
        self._running[step.id] = attempt
        self._launch(step, attempt, delay=0.0)

    def _launch(self, step: Step, running: _Running, delay: float) -> None:
        if delay > 0:  # a retry's back-off: a timer, not a sleeping thread
            self._timer(delay, _Relaunch(step.id, running.attempt))
            return
        try:
            if step.type == "elicitation":
                self._elicit(step, running)
            elif step.for_each is None:
                arguments = self._render_arguments(step, None)
                self._submit(step, running.attempt, None, arguments)
            else:
                running.items = self._render_collection(step)
                running.outputs = [None] * len(running.items)
                running.next_item = running.in_flight = running.finished_items = 0
                if not running.items:
                    self._step_completed(step, [])
                    return
                self._start_items(step, running)
        except _StepFailure as err:
            self._step_failed(step, str(err))

    def _start_items(self, step: Step, running: _Running) -> None:
        assert step.for_each is not None and running.items is not None
        while running.in_flight < step.for_each.max_parallel and running.next_item < len(running.items):
            index = running.next_item
            running.next_item += 1
            running.in_flight += 1
            item = ForEachItem(running.items[index], index, step.for_each.item_var)
            self._submit(step, running.attempt, index, self._render_arguments(step, item))

    def _submit(self, step: Step, attempt: int, index: int | None, arguments: dict[str, Any]) -> None:
        assert step.tool is not None
        actor_ref = self.actor_ref
        deadline = Deadline(min(self._deadline.at, time.monotonic() + step.timeout))
        try:
            future = self._caller.call(step.tool, coerce_arguments(arguments, self._caller.input_schema(step.tool) or {}),
                                       deadline)
        except Exception as error:  # noqa: BLE001 - e.g. a tool gone from the catalog: the step fails
            tell_quietly(actor_ref, _CallDone(step.id, attempt, index, error=_describe(error)))
            return

        def report(done: cf.Future[dict[str, Any]]) -> None:
            if done.cancelled():
                return  # the run ended and cancelled it
            error = done.exception()
            tell_quietly(actor_ref, _CallDone(step.id, attempt, index, None if error else done.result(),
                                              None if error is None else _describe(error),
                                              late=error is not None and deadline.expired))

        self._calls = [call for call in self._calls if not call.done()] + [future]
        on_settled(future, report)

    def _elicit(self, step: Step, running: _Running) -> None:
        try:
            message = as_text(render_value(step.message, self._context()))
        except TemplateError as err:
            raise _StepFailure(f"message: {err}") from None
        actor_ref, attempt = self.actor_ref, running.attempt
        running.deadline = Deadline(min(self._deadline.at, time.monotonic() + step.attempt_timeout))
        try:
            future = self._caller.elicit(step.id, message, step.elicitation_schema or {}, running.deadline)
        except Exception as error:  # noqa: BLE001 - a caller that cannot ask: the step fails
            tell_quietly(actor_ref, _Elicited(step.id, attempt, error=_describe(error),
                                              unsupported=isinstance(error, ElicitationUnsupported)))
            return

        def report(done: cf.Future[dict[str, Any]]) -> None:
            error = done.exception()
            tell_quietly(actor_ref, _Elicited(step.id, attempt, None if error else done.result(),
                                              None if error is None else _describe(error),
                                              isinstance(error, ElicitationUnsupported)))

        on_settled(future, report)

    # -- outcomes --------------------------------------------------------------------------

    def _on_elicited(self, message: _Elicited) -> None:
        running = self._running.get(message.step_id)
        if running is None or running.attempt != message.attempt:
            return  # timed out (or the run moved on): a late answer changes nothing
        step = self._steps[message.step_id]
        if message.unsupported:  # its message names the step already
            self._client_failed(step, message.error or "", f"composite tool {self._tool.name!r}: {message.error}")
        elif message.error is not None:
            if running.deadline is not None and running.deadline.expired:
                self._not_accepted(step, "timeout")  # the caller gave up at the deadline
            else:
                self._step_failed(step, f"asking the client failed: {message.error}")  # never retried
        else:
            try:
                action, content = _elicit_answer(message.result, step.elicitation_schema or {})
            except _MalformedAnswer as err:
                self._step_failed(step, f"the client's answer is malformed: {err}")
                return
            if action == "accept":
                self._step_completed(step, {"action": "accept", "content": content})
            else:
                self._not_accepted(step, action)

    def _not_accepted(self, step: Step, action: str) -> None:
        """The user declined, cancelled, or let the step time out (which ToolHive treats as
        a cancel); ``onDecline`` / ``onCancel`` say what that does to the run."""
        policy = step.on_decline if action == "decline" else step.on_cancel
        if policy == "abort":
            why = {"decline": "the user declined (onDecline is abort)",
                   "cancel": "the user cancelled (onCancel is abort)",
                   "timeout": f"timed out after {step.attempt_timeout:g} s without an answer (a timeout counts "
                              "as a cancel; onCancel is abort)"}[action]
            self._client_failed(step, why)  # onError: continue still lets the run go on, as in ToolHive
            return
        output: dict[str, Any] = {"action": action, "content": {}}
        if policy == "continue":
            self._step_completed(step, output)
            return
        # skip_remaining: the step completes, no step starts after it, the steps in flight
        # finish, and the run completes with its usual result.
        output["skipped"] = True
        self._stop_step(step.id)
        self._status[step.id] = "completed"
        self._outcomes[step.id] = StepOutcome("completed", output)
        self._progress(f"step {step.id!r} completed ({action}: skipping the remaining steps)")
        for other in self._tool.steps:  # in declaration order
            if other.id not in self._outcomes and other.id not in self._running:
                self._status[other.id] = "skipped"
                self._outcomes[other.id] = StepOutcome("skipped", copy.deepcopy(other.default_results))
                self._progress(f"step {other.id!r} skipped")
        self._schedule()

    def _client_failed(self, step: Step, error: str, result_text: str | None = None) -> None:
        """A failure the user or the client chose: the run ends as expected (logged at INFO)."""
        self._ended_by_client = step.on_error.action != "continue"
        self._step_failed(step, error, result_text)

    def _on_call_done(self, message: _CallDone) -> None:
        running = self._running.get(message.step_id)
        if running is None or running.attempt != message.attempt:
            return  # a timed-out or superseded attempt answering late
        step = self._steps[message.step_id]
        if message.late:
            # The call's deadline is the step's (or the run's) timer's instant: whichever of the
            # two reaches this actor first, the run says the same.
            if self._deadline.expired:
                self._run_timed_out()
            else:
                self._timed_out(step)
            return
        failure = message.error if message.error is not None else _result_error(message.result)
        where = "" if message.index is None else f"item {message.index}: "
        if failure is not None:
            self._attempt_failed(step, where + failure)
            return
        output = step_output(message.result)
        if message.index is None:
            self._step_completed(step, output)
            return
        assert running.outputs is not None and running.items is not None
        running.outputs[message.index] = output
        running.in_flight -= 1
        running.finished_items += 1
        if running.finished_items == len(running.items):
            self._step_completed(step, list(running.outputs))
            return
        try:
            self._start_items(step, running)
        except _StepFailure as err:
            self._attempt_failed(step, str(err), retryable=False)

    def _attempt_failed(self, step: Step, error: str, retryable: bool = True) -> None:
        running = self._running.get(step.id)
        if running is not None:
            running.timer.cancel()
            policy = step.on_error
            if retryable and policy.action == "retry" and running.retries < policy.retry_count:
                delay = policy.retry_delay * (2 ** running.retries)
                running.retries += 1
                running.attempt += 1
                # the step's timeout counts from the end of the back-off
                running.timer = self._timer(step.timeout + delay, _StepTimedOut(step.id, running.attempt))
                self._launch(step, running, delay)
                return
        self._step_failed(step, error)

    def _step_failed(self, step: Step, error: str, result_text: str | None = None) -> None:
        """``result_text`` replaces the usual error result, "step 'ID' failed: ERROR"."""
        self._stop_step(step.id)
        self.steps_failed += 1
        self._status[step.id] = "failed"
        # a step that continues on error offers its defaultResults to the steps after it
        self._outcomes[step.id] = StepOutcome("failed", copy.deepcopy(step.default_results), error)
        if step.on_error.action == "continue":
            self._progress(f"step {step.id!r} failed; continuing")
            self._schedule()
            return
        self._settle(result=error_result(result_text or f"composite tool {self._tool.name!r}: step {step.id!r} "
                                                        f"failed: {error}"), state="failed")

    def _step_completed(self, step: Step, output: Any) -> None:
        self._stop_step(step.id)
        self._status[step.id] = "completed"
        self._outcomes[step.id] = StepOutcome("completed", output)
        self._progress(f"step {step.id!r} completed")
        self._schedule()

    def _progress(self, message: str) -> None:
        if self._on_progress is not None:
            try:
                self._on_progress(len(self._outcomes), len(self._steps), message)
            except Exception:  # noqa: BLE001 - an observer must not break the run
                pass

    def _stop_step(self, step_id: str) -> None:
        running = self._running.pop(step_id, None)
        if running is not None:
            running.timer.cancel()

    def _settle(self, *, result: dict[str, Any] | None = None, error: BaseException | None = None,
                state: str) -> None:
        if self._future.done():
            return
        self._state = state
        self._ended = self._clock()
        self._cancel_timers()
        for step_id in self._running:
            self._status[step_id] = "cancelled"
        self._running.clear()
        for call in self._calls:  # not sent yet: dropped; in flight: cancelled at the backend
            call.cancel()
        self._calls = []
        if error is not None:
            self._future.set_exception(error)
        else:
            self._future.set_result(result or error_result("no result"))
        self._log_outcome(result, error)
        if self._on_finish is not None:
            try:
                self._on_finish(self.status())
            except Exception:  # noqa: BLE001 - an observer must not break the run
                pass
        if self._result_taken:
            self._stop_soon()

    def _log_outcome(self, result: dict[str, Any] | None, error: BaseException | None) -> None:
        """One line per run that did not complete (what failed and why), DEBUG otherwise."""
        duration = f"{self.duration:.3f}s"
        if self._state == "completed":
            logger.debug("composite %r run %s completed in %s", self._tool.name, self._run_id, duration)
            return
        if error is not None:
            why = _describe(error)
        else:
            texts = _texts(result or {})
            why = texts[0] if texts else "no result"
        expected = (self._state == "cancelled" or self._ended_by_client
                    or (isinstance(error, JsonRpcError) and error.code == INVALID_PARAMS))
        level = logging.INFO if expected else logging.WARNING
        logger.log(level, "composite %r run %s %s after %s: %s", self._tool.name, self._run_id, self._state,
                   duration, why[:500])

    def _stop_soon(self) -> None:
        """Stop after the messages already queued (the result stays readable); a run
        settled from ``on_stop`` is already stopping."""
        stop_quietly(self.actor_ref)

    # -- templates and results -------------------------------------------------------------

    def _context(self, item: ForEachItem | None = None) -> dict[str, Any]:
        return template_context(params=self._params, steps=self._outcomes, workflow_id=self._run_id, for_each=item)

    def _render_arguments(self, step: Step, item: ForEachItem | None) -> dict[str, Any]:
        try:
            rendered = render_value(step.arguments if step.arguments is not None else {}, self._context(item))
        except TemplateError as err:
            raise _StepFailure(f"arguments: {err}") from None
        if not isinstance(rendered, dict):
            raise _StepFailure(f"arguments must render to an object, got {type(rendered).__name__}")
        return rendered

    def _render_collection(self, step: Step) -> list[Any]:
        assert step.for_each is not None
        try:
            collection = render_value(step.for_each.collection, self._context())
        except TemplateError as err:
            raise _StepFailure(f"forEach collection: {err}") from None
        if isinstance(collection, str):
            try:
                collection = json.loads(collection)
            except ValueError:
                raise _StepFailure("forEach collection is a string that is not a JSON array") from None
        if not isinstance(collection, list):
            raise _StepFailure(f"forEach collection must be an array, got {type(collection).__name__}")
        limit = min(step.for_each.max_iterations, MAX_FOR_EACH_ITERATIONS)
        if len(collection) > limit:
            raise _StepFailure(f"forEach collection has {len(collection)} items, more than the limit of {limit}")
        return collection

    def _final_result(self) -> dict[str, Any]:
        if self._tool.output is not None:
            structured = self._build_output(self._tool.output.properties, self._context())
            missing = [name for name in self._tool.output.required if name not in structured]
            if missing:
                return error_result(f"composite tool {self._tool.name!r}: required output "
                                    f"{', '.join(repr(name) for name in missing)} has no value (and no default)")
            return structured_result(structured)
        last = [step.id for step in self._tool.steps if self._status.get(step.id) == "completed"]
        output = self._outcomes[last[-1]].output if last else {}
        if isinstance(output, dict):
            return structured_result(output)
        text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
        return {"content": [{"type": "text", "text": text}], "isError": False}

    def _build_output(self, properties: Mapping[str, OutputProperty], context: dict[str, Any]) -> dict[str, Any]:
        structured: dict[str, Any] = {}
        for name, prop in properties.items():
            if prop.properties is not None:
                structured[name] = self._build_output(prop.properties, context)
                continue
            try:
                value = render_value(prop.value, context) if prop.value is not None else None
            except TemplateError:
                value = None
            value = _typed(value, prop.type)
            if value is None:
                value = _typed(copy.deepcopy(prop.default), prop.type)
            if value is not None:  # absent rather than null or mistyped, which the outputSchema would refuse
                structured[name] = value
        return structured

    # -- timers ----------------------------------------------------------------------------

    def _timer(self, seconds: float, message: Any) -> TimerHandle:
        actor_ref = self.actor_ref
        return self._schedule_later(seconds, lambda: tell_quietly(actor_ref, message))

    def _cancel_timers(self) -> None:
        if self._run_timer is not None:
            self._run_timer.cancel()
        for running in self._running.values():
            running.timer.cancel()


# -- pure helpers ------------------------------------------------------------------------


def _typed(value: Any, json_type: str | None) -> Any:
    """``value`` coerced to ``json_type`` (JSON text for an object or array, as ToolHive
    allows), or None when it is empty or cannot be."""
    if value is None or value == "":
        return None
    if json_type is None:
        return value
    if json_type in ("object", "array") and isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    value = coerce_arguments({"v": value}, {"type": "object", "properties": {"v": {"type": json_type}}})["v"]
    return value if has_json_type(value, json_type) else None


ELICIT_ACTIONS = ("accept", "decline", "cancel")
# ToolHive's limits on accepted content: it ends up in templates.
MAX_ELICITED_CONTENT = 1024 * 1024  # characters of JSON
MAX_ELICITED_DEPTH = 10


class _MalformedAnswer(ValueError):
    """An ElicitResult the run cannot use."""


def _elicit_answer(result: Any, schema: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(action, content)`` of the client's ElicitResult; accepted content must match
    ``schema`` (absent content reads as ``{}``), the rest carry none. Raises
    :class:`_MalformedAnswer` saying what is wrong."""
    if not isinstance(result, Mapping):
        raise _MalformedAnswer(f"the result is {type(result).__name__}, not an object")
    action = result.get("action")
    if action not in ELICIT_ACTIONS:
        raise _MalformedAnswer(f"action {str(action)[:40]!r} is not one of {', '.join(ELICIT_ACTIONS)}")
    if action != "accept":
        return action, {}
    content = result.get("content")
    content = {} if content is None else content
    if not isinstance(content, dict):
        raise _MalformedAnswer(f"content must be an object, got {_json_type(content)}")
    if len(json.dumps(content, default=str)) > MAX_ELICITED_CONTENT:
        raise _MalformedAnswer(f"content is larger than {MAX_ELICITED_CONTENT} characters of JSON")
    if _depth(content) > MAX_ELICITED_DEPTH:
        raise _MalformedAnswer(f"content is nested deeper than {MAX_ELICITED_DEPTH} levels")
    error = best_match(_validator(json.dumps(schema, sort_keys=True)).iter_errors(content))
    if error is not None:
        raise _MalformedAnswer(f"content does not match the schema: {_problem_text(error)}"[:300])
    return action, copy.deepcopy(content)


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_ELICITED_DEPTH:
        return level  # deep enough to refuse; stop before Python's own limit
    if isinstance(value, dict):
        return max((_depth(item, level + 1) for item in value.values()), default=level)
    if isinstance(value, list):
        return max((_depth(item, level + 1) for item in value), default=level)
    return level


def _describe(error: BaseException) -> str:
    if isinstance(error, JsonRpcError):
        return error.message
    return str(error) or type(error).__name__


def _result_error(result: Any) -> str | None:
    """Why ``result`` counts as a failure, or None."""
    if not isinstance(result, Mapping):
        return f"the tool returned {type(result).__name__}, not a result object"
    if result.get("isError"):
        texts = _texts(result)
        return "; ".join(texts) if texts else "the tool reported an error"
    return None


def _texts(result: Mapping[str, Any]) -> list[str]:
    return [part["text"] for part in result.get("content") or ()
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)]


def step_output(result: Mapping[str, Any]) -> Any:
    """What ``steps.<id>.output`` holds: ``structuredContent`` when present, else the
    text contents as ``{"text": first, "text_1": second, ...}``."""
    if result.get("structuredContent") is not None:
        return result["structuredContent"]
    return {("text" if index == 0 else f"text_{index}"): text for index, text in enumerate(_texts(result))}


def structured_result(structured: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(structured, ensure_ascii=False)
    return {"content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": False}


def error_result(message: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": message}], "isError": True}


# -- parameters --------------------------------------------------------------------------
