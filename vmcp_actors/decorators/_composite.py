"""Composite tools: a decorator over the capability interface, below the advertising filter.

Outermost first: AdvertisingFilter -> CompositeTools -> AggregatedBackends. A composite
sees every backend tool, hidden or not, by advertised name or ``workload.tool``, and
reads each target's input schema from below the filter (ToolHive #4287 read it from the
filtered list, so coercion silently did nothing for hidden tools).

What a session offers is decided per catalog, so per user: a composite is advertised
only when every step's tool resolves in that user's catalog, its name is not taken by an
advertised backend tool, and its explicit annotations claim no more safety than its
steps. A composite that is not advertised is not callable either (the same -32602 as an
unknown name); the reason is in the admin state, and logged once per catalog.

Each call runs in its own ``WorkflowRun`` actor; the calling web thread waits for its
result until the request's deadline (relaying progress when the client asked for it), so
the UserActor is never involved and the user's sessions keep serving meanwhile. The run
ends a moment before that deadline, so the client gets the run's own answer.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import logging
import queue
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pykka

from vmcp_actors import tracing
from vmcp_actors.backends import CallOpened
from vmcp_actors.concurrency import (
    ASK_TIMEOUT,
    Deadline,
    failed,
    on_settled,
    run_in_thread,
    settle_from,
    stop_quietly,
)
from vmcp_actors.config import AggregationConfig
from vmcp_actors.core._aggregated import ANSWER_MARGIN, AggregatedBackends
from vmcp_actors.core._catalog import Catalog, InternalTool, Route, by_name
from vmcp_actors.decorators._admission import StepAdmission
from vmcp_actors.core._exchange import (
    SESSION_ENDED,
    CallCancelled,
    Exchange,
    Notification,
    ServerRequest,
    answered,
)
from vmcp_actors.core._explain import ABSENT, ADDS, PASSES, USES, Explanation, Finding
from vmcp_actors.core._interface import CoreLayer
from vmcp_actors.core._tasks import LEGACY_TASK_METHODS, MODERN_TASK_METHODS, TaskRequest, requested_task
from vmcp_actors.decorators._composite_tasks import UserTasks
from vmcp_actors.decorators._filter import is_advertised
from vmcp_actors.identity import Identity
from vmcp_actors.metrics import METRICS
from vmcp_actors.protocol import INTERNAL_ERROR, INVALID_PARAMS, JsonRpcError
from vmcp_actors.protocol.mcp import missing_capability
from vmcp_actors.workflows import (
    CompositeTool,
    composite_annotations,
    output_schema,
    unsafe_claims,
)
from vmcp_actors.workflows.engine import (
    ElicitationUnsupported,
    WorkflowCancelled,
    WorkflowRun,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompositeView:
    """The composites one catalog allows: their tool definitions, routes and step targets."""

    tools: tuple[dict[str, Any], ...]  # the catalog's tools, then the advertised composites
    advertised: Mapping[str, CompositeTool]
    targets: Mapping[str, InternalTool]  # step tool reference -> the tool it reaches
    problems: tuple[str, ...] = ()

    @functools.cached_property
    def definitions(self) -> Mapping[str, dict[str, Any]]:
        """``tools`` by name (derived once per view)."""
        return MappingProxyType(by_name(self.tools))


# What 2025-11-25 clients read to know they may ask a composite for a task.
TASK_EXECUTION = MappingProxyType({"taskSupport": "optional"})


def build_view(catalog: Catalog, composites: Sequence[CompositeTool], aggregation: AggregationConfig,
               takes_tasks: bool = False) -> CompositeView:
    advertised_backend_tools = {name for name, route in catalog.tool_routes.items() if is_advertised(aggregation, route)}
    definitions: list[dict[str, Any]] = []
    advertised: dict[str, CompositeTool] = {}
    targets: dict[str, InternalTool] = {}
    problems: list[str] = []
    for composite in composites:
        resolved, why_not = _resolve(composite, catalog, advertised_backend_tools)
        if why_not is not None:
            problems.append(f"composite tool {composite.name!r} is not advertised: {why_not}")
            continue
        targets.update(resolved)
        definition: dict[str, Any] = {
            "name": composite.name,
            "description": composite.description,
            "inputSchema": dict(composite.parameters),
            "annotations": composite_annotations(
                composite.annotations, [resolved[step.tool].definition.get("annotations")  # type: ignore[index]
                                        for step in composite.steps if step.tool is not None]),
        }
        if composite.output is not None:
            definition["outputSchema"] = output_schema(composite.output)
        if takes_tasks:
            definition["execution"] = dict(TASK_EXECUTION)
        definitions.append(definition)
        advertised[composite.name] = composite
    for problem in problems:
        logger.warning("%s", problem)
    # A hidden backend tool whose name a composite takes is not listed under it (its name
    # answers the composite): the list, a description and a lookup agree.
    backend_tools = tuple(tool for tool in catalog.tools if tool["name"] not in advertised) if advertised \
        else catalog.tools
    return CompositeView(
        tools=backend_tools + tuple(definitions),
        advertised=advertised,
        targets=targets,
        problems=tuple(problems),
    )


def _resolve(composite: CompositeTool, catalog: Catalog,
             advertised_backend_tools: set[str]) -> tuple[dict[str, InternalTool], str | None]:
    """The tools ``composite``'s steps reach (by the step's tool reference), or why it
    cannot be advertised in ``catalog``."""
    if composite.name in advertised_backend_tools:
        route = catalog.tool_routes[composite.name]
        return {}, (f"backend {route.backend!r} advertises a tool with the same name "
                    f"(its {route.original_name!r}); rename one of them")
    resolved: dict[str, InternalTool] = {}
    for step in composite.steps:
        if step.tool is None:
            continue  # an elicitation step asks the client, not a backend
        target = catalog.resolve_internal(step.tool)
        if target is None:
            return {}, f"step {step.id!r} calls {step.tool!r}, which this session's backends do not offer"
        resolved[step.tool] = target
    if composite.annotations:
        step_annotations = [(step.id, resolved[step.tool].definition.get("annotations"))  # type: ignore[index]
                            for step in composite.steps if step.tool is not None]
        claims = unsafe_claims(composite.annotations, step_annotations)
        if claims:
            return {}, "; ".join(claims)
    return resolved, None


class WorkflowMetrics:
    """Process-wide counters per composite, ready for a metrics endpoint. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _by_composite (the counters)
        self._by_composite: dict[str, dict[str, float]] = {}

    def started(self, composite: str) -> None:
        with self._lock:
            self._counters(composite)["runs"] += 1

    def finished(self, status: Mapping[str, Any]) -> None:
        with self._lock:
            counters = self._counters(status["composite"])
            state = status["state"]
            counters[state if state in ("completed", "failed", "cancelled") else "failed"] += 1
            counters["durationSecondsTotal"] += status["duration"]
            counters["durationSecondsMax"] = max(counters["durationSecondsMax"], status["duration"])
            counters["stepsStarted"] += status["stepsStarted"]
            counters["stepsFailed"] += status["stepsFailed"]
        METRICS.observe("workflow", (status["composite"], state if state in ("completed", "cancelled") else "failed"),
                        status["duration"])

    def snapshot(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {name: {**counters, "running": counters["runs"] - counters["completed"] - counters["failed"]
                           - counters["cancelled"]}
                    for name, counters in sorted(self._by_composite.items())}

    def _counters(self, composite: str) -> dict[str, float]:
        return self._by_composite.setdefault(composite, {
            "runs": 0, "completed": 0, "failed": 0, "cancelled": 0,
            "durationSecondsTotal": 0.0, "durationSecondsMax": 0.0, "stepsStarted": 0, "stepsFailed": 0,
        })


class _StepCaller:
    """What a WorkflowRun calls, for one user: backend tools through the routing table,
    whatever the advertising filter hides. Every step's target was resolved when the view
    was built, so nothing here waits for a catalog; calls are pooled work (a step's
    progress and log notifications are not relayed)."""

    def __init__(self, backends: AggregatedBackends, identity: Identity | None, targets: Mapping[str, InternalTool],
                 client_capabilities: Mapping[str, Any], to_client: Any,
                 ask: Callable[[str, dict[str, Any]], cf.Future[dict[str, Any]]] | None = None,
                 admission: StepAdmission = StepAdmission()):
        self._backends = backends
        self._admission = admission  # what a step's call passes: Cedar as the caller, its tool's own buckets
        self._identity = identity
        self._targets = targets
        self._client_capabilities = client_capabilities
        self._to_client = to_client  # puts events on the calling client's stream
        self._ask = ask  # a task's: records the question for whoever answers the task
        self._trace = tracing.current_context()  # the composite call's span: steps go under it

    def input_schema(self, tool: str) -> Mapping[str, Any] | None:
        target = self._targets.get(tool)
        schema = target.definition.get("inputSchema") if target is not None else None
        return schema if isinstance(schema, Mapping) else None

    def call(self, tool: str, arguments: dict[str, Any], deadline: Deadline) -> cf.Future[dict[str, Any]]:
        target = self._targets.get(tool)
        if target is None:
            raise JsonRpcError(INVALID_PARAMS, f"tool {tool!r} is not available in this session")
        admission = self._admission
        if not admission.decides():
            return self._submit(tool, target, arguments, deadline)
        # Called in the run's actor: the decision may be a Redis round trip, so it is made
        # on the I/O pool, and the call is submitted from there.
        outcome: cf.Future[dict[str, Any]] = cf.Future()

        def admit_then_submit() -> None:
            if outcome.cancelled():
                return  # the run ended first
            try:
                with admission.admitting(self._identity, target, arguments) as allowed:
                    if not allowed:  # as for no such tool: nothing revealed
                        raise JsonRpcError(INVALID_PARAMS, f"tool {tool!r} is not available in this session")
                    submitted = self._submit(tool, target, arguments, deadline)
            except Exception as error:  # noqa: BLE001 - refused (429, 503) or not sent: the step's failure
                settle_from(outcome, failed(error))
                return
            outcome.add_done_callback(lambda done: submitted.cancel() if done.cancelled() else None)
            on_settled(submitted, lambda done: None if done.cancelled() else settle_from(outcome, done))

        run_in_thread(admit_then_submit)
        return outcome

    def _submit(self, tool: str, target: InternalTool, arguments: dict[str, Any],
                deadline: Deadline) -> cf.Future[dict[str, Any]]:
        span = tracing.start_span(f"composite step {tool}", self._trace, {"vmcp.backend": target.route.backend})
        outcome = tracing.within(span, self._backends.submit_route, self._identity, target.route, arguments, deadline)
        if span is not None:
            outcome.add_done_callback(lambda done: tracing.end(span, None if done.cancelled() else done.exception()))
        return outcome

    def elicit(self, step_id: str, message: str, requested_schema: Mapping[str, Any],
               deadline: Deadline) -> cf.Future[dict[str, Any]]:
        """Ask the client that called the composite, on the call's stream; its answer (or
        the gateway's error when it cannot answer) settles the future."""
        outcome: cf.Future[dict[str, Any]] = cf.Future()
        params = {"message": message, "requestedSchema": dict(requested_schema)}
        if missing_capability("elicitation/create", params, self._client_capabilities) is not None:
            outcome.set_exception(ElicitationUnsupported(step_id))
            return outcome
        if self._ask is not None:
            return self._ask(step_id, {"method": "elicitation/create", "params": {"mode": "form", **params}})

        def respond(answer: dict[str, Any]) -> None:
            if "result" in answer:
                outcome.set_result(answer["result"])
                return
            error = answer.get("error") if isinstance(answer.get("error"), dict) else {}
            outcome.set_exception(JsonRpcError(INTERNAL_ERROR, f"step {step_id!r}: elicitation failed: "
                                                               f"{error.get('message', 'no answer')}"))

        self._to_client(ServerRequest("elicitation/create", params, respond, f"composite step {step_id!r}"))
        return outcome


class CompositeTools(CoreLayer):
    """UserCore plus the config's composite tools (everything but tools passes through)."""

    _inner: AggregatedBackends
    layer_name = "composite tools"

    def __init__(self, inner: AggregatedBackends, composites: Sequence[CompositeTool], aggregation: AggregationConfig,
                 metrics: WorkflowMetrics | None = None, *, client_capabilities: Mapping[str, Any] | None = None,
                 tasks: UserTasks | None = None, admission: StepAdmission = StepAdmission()):
        """``tasks``: where a call the client accepts a task of runs as one (None: never);
        ``admission``: what its steps' calls pass."""
        super().__init__(inner)
        self._admission = admission
        self._tasks = tasks
        self._client_capabilities = client_capabilities or {}
        self._composites = tuple(composites)
        self._aggregation = aggregation
        self._metrics = metrics if metrics is not None else WorkflowMetrics()
        self._view: tuple[Catalog, CompositeView] | None = None
        self._runs_lock = threading.Lock()  # guards _runs (composite runs in flight)
        self._runs: dict[str, pykka.ActorRef[WorkflowRun]] = {}  # run id -> run in flight

    def view(self, identity: Identity | None, deadline: Deadline) -> CompositeView:
        catalog = self._inner.catalog(identity, deadline)
        cached = self._view
        if cached is not None and cached[0] is catalog:
            return cached[1]
        view = build_view(catalog, self._composites, self._aggregation, self._tasks is not None)
        self._view = (catalog, view)  # one atomic assignment; a race only builds it twice
        return view

    def problems(self) -> tuple[str, ...]:
        """Why composites are not advertised, for the catalog last served (admin state)."""
        cached = self._view
        return cached[1].problems if cached is not None else ()

    # -- tools -----------------------------------------------------------------------

    def list_tools(self, identity: Identity | None, deadline: Deadline) -> tuple[dict[str, Any], ...]:
        if not self._composites:
            return self._inner.list_tools(identity, deadline)
        return self.view(identity, deadline).tools

    def describe_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> dict[str, Any] | None:
        if not self._composites:
            return self._inner.describe_tool(identity, name, deadline)
        return self.view(identity, deadline).definitions.get(name)

    def lookup_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> Route | None:
        if self._composites and name in self.view(identity, deadline).advertised:
            return Route("", name, name, composite=True)
        return self._inner.lookup_tool(identity, name, deadline)

    def call_tool(self, identity: Identity | None, name: str, arguments: dict[str, Any] | None,
                  meta: dict[str, Any] | None, deadline: Deadline) -> Exchange:
        if self._composites:
            view = self.view(identity, deadline)
            composite = view.advertised.get(name)
            task = requested_task.get()
            if composite is not None and task is not None and not task.awaited and self._tasks is not None:
                return answered(self._start_task(identity, composite, view, arguments, task))
            if composite is not None:
                return self._run(identity, composite, view, arguments, meta, deadline)
        return self._inner.call_tool(identity, name, arguments, meta, deadline)

    def task_request(self, identity, method, params, modern, deadline):
        """The gateway's own tasks answered here; a backend's go below."""
        tasks = self._tasks
        if tasks is None or method not in (MODERN_TASK_METHODS if modern else LEGACY_TASK_METHODS):
            return self._inner.task_request(identity, method, params, modern, deadline)  # -32601 for the rest
        if method == "tasks/list" and not modern:
            return self._inner.list_tasks(identity, params, deadline, tuple(tasks.listed()))
        task_id = tasks.owns(params) if method != "tasks/list" else None
        if task_id is None:
            return self._inner.task_request(identity, method, params, modern, deadline)
        return tasks.request(method, task_id, params, modern, deadline)

    def _start_task(self, identity: Identity | None, composite: CompositeTool, view: CompositeView,
                    arguments: dict[str, Any] | None, task: TaskRequest) -> dict[str, Any]:
        """Run the composite as a task: recorded, started, and answered at once."""
        assert self._tasks is not None
        user, tasks = self._tasks, self._tasks.tasks
        run = tasks.begin(user.owner, user.user, composite.name, composite.timeout, task.params.get("ttl"), user.hold)
        caller = _StepCaller(self._inner, identity, view.targets, self._client_capabilities, None,
                             ask=lambda step_id, request: tasks.ask(run, step_id, request), admission=self._admission)
        self._metrics.started(composite.name)
        ref = WorkflowRun.start(composite, arguments, caller, run_id=run.record.task_id[:16],
                                deadline=Deadline.after(composite.timeout), on_finish=self._metrics.finished,
                                on_steps=lambda steps: tasks.progressed(run, steps))
        try:
            outcome = ref.proxy().result().get(timeout=ASK_TIMEOUT)
        except (pykka.ActorDeadError, pykka.Timeout):
            outcome = failed(JsonRpcError(INTERNAL_ERROR, "the run ended unexpectedly"))
        tasks.start(run, outcome, lambda: stop_quietly(ref))
        return user.created(run.record, task)

    def resume(self, identity, continuation, deadline):
        """A composite hands out no backend's state (its steps' requests park the call), so
        only unasked input reaches one: ignored, the call runs as usual."""
        if continuation.method == "tools/call" and self._composites \
                and continuation.name in self.view(identity, deadline).advertised:
            if continuation.backend is not None:
                raise continuation.unknown()
            return self.call_tool(identity, continuation.name, dict(continuation.arguments or {}),
                                  dict(continuation.meta) if continuation.meta else None, deadline)
        return super().resume(identity, continuation, deadline)

    def explain_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> Explanation:
        """A composite's own finding, and which composites' steps use a backend tool."""
        below = self._inner.explain_tool(identity, name, deadline)
        if not self._composites:
            return below.with_finding(Finding(self.layer_name, PASSES, "no composite tools are configured"),
                                      listed=below.listed, callable=below.callable)
        view = self.view(identity, deadline)
        composite = view.advertised.get(name)
        if composite is not None:
            steps = ", ".join(f"{step.id} -> {step.tool}" if step.tool else f"{step.id} (elicitation)"
                              for step in composite.steps)
            return below.with_finding(Finding(self.layer_name, ADDS, f"composite tool from the config; steps: {steps}"),
                                      listed=True, callable=True)
        configured = next((c for c in self._composites if c.name == name), None)
        if configured is not None:
            why = next((p for p in view.problems if p.startswith(f"composite tool {name!r}")), "not advertised")
            return below.with_finding(Finding(self.layer_name, ABSENT, why), listed=below.listed,
                                      callable=below.callable)
        users = self._composites_using(identity, name, view, deadline)
        finding = Finding(self.layer_name, USES, "used by composite " + "; ".join(users)) if users else \
            Finding(self.layer_name, PASSES, "passed through unchanged" if below.callable
                    else "nothing to pass: the layers below do not offer it")
        return below.with_finding(finding, listed=below.listed, callable=below.callable)

    def _composites_using(self, identity: Identity | None, name: str, view: CompositeView,
                          deadline: Deadline) -> list[str]:
        target = self._inner.lookup_internal(identity, name, deadline)
        if target is None:  # a name no backend tool answers to directly: match the steps' references
            return [f"{c.name!r} (step {s.id!r})" for c in self._composites for s in c.steps if s.tool == name]
        return [f"{c.name!r} (step {s.id!r})" for c in self._composites if c.name in view.advertised
                for s in c.steps if s.tool is not None and view.targets.get(s.tool) is not None
                and view.targets[s.tool].route == target.route]

    def _run(self, identity: Identity | None, composite: CompositeTool, view: CompositeView,
             arguments: dict[str, Any] | None, meta: dict[str, Any] | None, deadline: Deadline) -> Exchange:
        """Run the composite; this (web) thread relays what the run sends the client
        (progress, elicitations) as it comes, and returns the run's result."""
        progress_token = (meta or {}).get("progressToken")
        events: queue.SimpleQueue[Notification | ServerRequest | None] = queue.SimpleQueue()
        run_id = secrets.token_hex(8)
        self._metrics.started(composite.name)

        def progress(done: int, total: int, message: str) -> None:
            events.put(Notification({"jsonrpc": "2.0", "method": "notifications/progress",
                                     "params": {"progressToken": progress_token, "progress": done, "total": total,
                                                "message": message}}))

        caller = _StepCaller(self._inner, identity, view.targets, self._client_capabilities, events.put,
                             admission=self._admission)
        ref = WorkflowRun.start(
            composite, arguments, caller,
            run_id=run_id,
            # Its own timeout from now, ending in time for the request to answer.
            deadline=Deadline(min(deadline.earlier(ANSWER_MARGIN).at, time.monotonic() + composite.timeout)),
            on_progress=progress if progress_token is not None else None,
            on_finish=self._metrics.finished,
        )
        with self._runs_lock:
            self._runs[run_id] = ref
        try:
            cancelled_by_client = threading.Event()  # set when the client cancels the call

            def cancel(reason: str | None) -> None:
                if reason != SESSION_ENDED:
                    cancelled_by_client.set()
                stop_quietly(ref)

            yield CallOpened(composite.name, cancel)
            pending = ref.proxy().result().get(timeout=deadline.cap(ASK_TIMEOUT))
            pending.add_done_callback(lambda _: events.put(None))
            while True:
                try:
                    event = events.get(timeout=deadline.remaining())
                except queue.Empty:
                    raise JsonRpcError(INTERNAL_ERROR, f"composite tool {composite.name!r} did not finish") from None
                if event is None:
                    break  # settled; every event was queued before this marker
                yield event
            error = pending.exception()
            if isinstance(error, WorkflowCancelled) and cancelled_by_client.is_set():
                raise CallCancelled()  # the client expects no answer
            return pending.result()
        except (pykka.ActorDeadError, pykka.Timeout):
            raise JsonRpcError(INTERNAL_ERROR, f"composite tool {composite.name!r}: the run ended unexpectedly") from None
        finally:
            with self._runs_lock:
                self._runs.pop(run_id, None)
            stop_quietly(ref)  # cancels a run the client walked away from; a no-op once it stopped itself

    # -- operators -------------------------------------------------------------------

    def running(self) -> list[dict[str, Any]]:
        """The status of every run in flight (admin state); runs that end meanwhile are left out."""
        with self._runs_lock:
            refs = list(self._runs.values())
        asked = []
        for ref in refs:
            try:
                asked.append(ref.proxy().status())
            except pykka.ActorDeadError:
                continue
        statuses = []
        for future in asked:
            try:
                statuses.append(future.get(timeout=ASK_TIMEOUT))
            except (pykka.ActorDeadError, pykka.Timeout):
                continue
        return statuses

    def close(self) -> None:
        """Cancel every run still in flight (the session is ending)."""
        with self._runs_lock:
            refs = list(self._runs.values())
            self._runs.clear()
        for ref in refs:
            stop_quietly(ref)
        self._inner.close()
