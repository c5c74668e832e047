"""Composite tools run as MCP tasks: the call answers at once, the run goes on, and any
worker answers ``tasks/*`` about it from the task record.

``CompositeTasks`` is the process's share (one per worker, thread-safe): the runs this
worker holds (each a ``WorkflowRun`` actor, as for a plain call) and every read and write
of task records. The run's record follows it (the step in progress, the questions an
elicitation step waits on, then its result or error); another worker's ``tasks/update``
and ``tasks/cancel`` write the record and signal the runner (``TaskSignals``), which
answers the waiting step or stops the run. A task whose runner is gone (the worker died)
is written ``failed`` by whoever reads it next.

The run tells its changes on its actor's loop, where no store is called: each run's record
is written on the I/O pool by one job at a time (``_write_record``), which writes the run as
it is then, again if it changed meanwhile, and its end last. A progress write that fails is
logged (the next write carries the whole state); an end that fails is tried again until the
record expires, the run held here (alive to readers) until it lands.

``UserTasks`` is one user's view (per user stack): it starts their runs and answers their
``tasks/*`` in either revision, under handles sealed to them (``TaskHandles``, the same as
for backends' tasks, with the gateway as the backend ``GATEWAY``).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from vmcp_actors.concurrency import call_later, run_in_thread
from vmcp_actors.config import TasksConfig
from vmcp_actors.core._exchange import Exchange, ServerRequest
from vmcp_actors.core._task_records import (
    CANCELLED,
    COMPLETED,
    FAILED,
    WORKING,
    TaskRecord,
    TaskStore,
)
from vmcp_actors.core._tasks import (
    LEGACY_TASK_METHODS,
    MODERN_TASK_METHODS,
    RELATED_TASK,
    TaskHandles,
    TaskRequest,
    task_failure,
)
from vmcp_actors.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
    JsonRpcError,
)

logger = logging.getLogger(__name__)

GATEWAY = ""  # the "backend" of a handle to one of the gateway's own tasks (no backend has this name)
RUNNER_GONE = ("The gateway worker that ran this task stopped before it finished; nothing more will come of it. "
               "Call the tool again.")
RESULT_POLL = 0.1  # seconds between reads of the record while a 2025 client's tasks/result waits
WORKER_FULL_RETRY_AFTER = 5  # seconds a client is told to wait when this worker holds all the runs it may
END_RETRY_FIRST, END_RETRY_MAX = 1.0, 30.0  # seconds before a failed end write is tried again (doubling)


class TaskSignals(Protocol):
    runner_id: str

    def start(self, receive: Callable[[dict[str, Any]], None]) -> None: ...
    def send(self, runner: str, signal: dict[str, Any]) -> bool: ...
    def alive(self, runner: str) -> bool: ...
    def stop(self) -> None: ...


class _LocalRun:
    """A task this worker runs: its actor, the questions its steps wait on, and its
    record's writes."""

    def __init__(self, record: TaskRecord, release: Callable[[], None]):
        self.record = record  # as created (the live state is in the store)
        self.release = release  # lets the user's actors go idle again
        self.lock = threading.Lock()  # guards the fields below
        self.stop_run: Callable[[], None] | None = None
        self.message: str | None = None  # what the run says it does (else told by its steps)
        self.cancelled = False
        self.asks: dict[str, tuple[dict[str, Any], cf.Future[dict[str, Any]]]] = {}  # step -> (request, answer)
        self.steps: dict[str, str] = {}  # step id -> state, as the run last reported
        self.writing = False  # a job writes the record (at most one per run)
        self.changed = False  # the run changed since that job read it: it writes again
        self.end: tuple[str, Callable[[TaskRecord], TaskRecord]] | None = None  # (status, change), once it settled
        self.end_tries = 0  # failed end writes (the writing job's own)
        # The status its record ended with, once written (or given up on) and the run let go.
        self.ended: cf.Future[str] = cf.Future()

    def stop(self) -> None:
        with self.lock:
            self.cancelled = True
            stop_run = self.stop_run
        if stop_run is not None:
            stop_run()


class CompositeTasks:
    def __init__(self, store: TaskStore, signals: TaskSignals, settings: TasksConfig,
                 wall: Callable[[], float] = time.time):
        self._store = store
        self._signals = signals
        self.settings = settings
        self._wall = wall
        self._lock = threading.Lock()  # guards _runs and _ended
        self._runs: dict[str, _LocalRun] = {}  # task id -> the run this worker holds
        self._ended: dict[tuple[str, str], int] = {}  # (composite, final status) -> runs ended here

    @property
    def runner_id(self) -> str:
        return self._signals.runner_id

    # -- the worker that got the call --------------------------------------------------------

    def begin(self, owner: str, user: str, tool: str, timeout: float, requested_ttl_ms: Any,
              hold: Callable[[], Callable[[], None]]) -> _LocalRun:
        """Record a new task of ``owner``'s and hold its run's place here; ``start`` gives it
        its actor. Refused at the per-user cap (-32600), and with 503 and Retry-After when
        this worker holds ``maxLivePerWorker`` runs: each is a thread, a budget every task
        of every user shares, and another worker, or this one later, may have room."""
        live = [record for record in self._store.live_tasks_of(owner)
                if not self._ended_if_orphaned(record).terminal]
        cap = self.settings.max_live_per_user
        if len(live) >= cap:
            raise JsonRpcError(INVALID_REQUEST, f"Too many tasks under way: {len(live)} of at most {cap} per user. "
                                                "Wait for one to end, or cancel one.", {"maxLiveTasks": cap})
        now = self._wall()
        keep = self.settings.result_ttl
        if isinstance(requested_ttl_ms, int) and not isinstance(requested_ttl_ms, bool) and requested_ttl_ms > 0:
            keep = min(keep, requested_ttl_ms / 1000)
        record = TaskRecord(task_id=secrets.token_hex(16), owner=owner, user=user, tool=tool, runner=self.runner_id,
                            status=WORKING, status_message="starting", created=now, updated=now,
                            expires=now + timeout + keep, ttl_ms=int(keep * 1000),
                            poll_interval_ms=int(self.settings.poll_interval * 1000))
        run = _LocalRun(record, hold())
        worker_cap = self.settings.max_live_per_worker
        with self._lock:
            room = len(self._runs) < worker_cap
            if room:
                self._runs[record.task_id] = run
        if not room:
            run.release()
            raise JsonRpcError(INTERNAL_ERROR, f"This gateway worker runs as many tasks as it may ({worker_cap}). "
                                               "Try again shortly.",
                               {"maxLiveTasksPerWorker": worker_cap, "retryAfterSeconds": WORKER_FULL_RETRY_AFTER},
                               http_status=503)
        self._signals.start(self._received)  # alive before the record says it runs here
        try:
            self._store.put_task(record)
            self._within_user_cap(record, cap)
        except Exception:
            self._forget(run)
            raise
        return run

    def _within_user_cap(self, record: TaskRecord, cap: int) -> None:
        """Checked again once the record is written, so workers that checked at once cannot
        all pass: of the owner's live tasks, the first ``cap`` by creation (then id) run;
        a later one is ended at once and refused. Every worker ranks the same records."""
        live = sorted((other for other in self._store.live_tasks_of(record.owner)
                       if not self._ended_if_orphaned(other).terminal),
                      key=lambda other: (other.created, other.task_id))
        if record.task_id in [other.task_id for other in live[:cap]]:
            return
        self._store.update_task(record.task_id, lambda current: current.ended(
            FAILED, "refused: too many tasks under way", self._wall()))
        raise JsonRpcError(INVALID_REQUEST, f"Too many tasks under way: at most {cap} per user. Wait for one to "
                                            "end, or cancel one.", {"maxLiveTasks": cap})

    def start(self, run: _LocalRun, outcome: cf.Future[dict[str, Any]], stop: Callable[[], None]) -> None:
        """The run is started (a composite's actor, a script's thread): ``outcome`` settles
        its record, ``stop`` cancels it."""
        with run.lock:
            run.stop_run = stop
            cancelled = run.cancelled
        if cancelled:  # cancelled before it was started
            stop()
        outcome.add_done_callback(lambda done: self._settled(run, done))

    def ask(self, run: _LocalRun, step_id: str, request: dict[str, Any]) -> cf.Future[dict[str, Any]]:
        """A step's question for the client (asked in the run's actor): the task waits for
        input until it is answered."""
        answer: cf.Future[dict[str, Any]] = cf.Future()
        with run.lock:
            run.asks[step_id] = (request, answer)
        self._record(run)
        return answer

    def progressed(self, run: _LocalRun, steps: Mapping[str, str], message: str | None = None) -> None:
        """The run's steps changed (called in the run's actor), or what it says it does
        (``message``: a script's calls under way)."""
        with run.lock:
            run.steps = dict(steps)
            run.message = message
            moved_on = [run.asks.pop(step_id)[1] for step_id in list(run.asks) if steps.get(step_id) != "running"]
        for answer in moved_on:  # the step ended without its answer (timed out): a late one changes nothing
            if not answer.done():
                answer.set_exception(JsonRpcError(INTERNAL_ERROR, "the step ended before it was answered"))
        self._record(run)

    def _record(self, run: _LocalRun, end: tuple[str, Callable[[TaskRecord], TaskRecord]] | None = None) -> None:
        """The run's record is to say what the run does now (or ``end``): written on the
        I/O pool, never here (this may be the run's loop)."""
        with run.lock:
            if end is not None:
                run.end = end
            run.changed = True
            if run.writing:
                return  # the job under way writes it
            run.writing = True
        run_in_thread(self._write_record, run)

    def _write_record(self, run: _LocalRun) -> None:
        """On the I/O pool, the run's one writing job: the run as it is now, again while it
        changed meanwhile; its end last, and the job ends with it."""
        while True:
            with run.lock:
                if not run.changed:
                    run.writing = False
                    return
                run.changed = False
                end = run.end
                waiting = {step_id: request for step_id, (request, answer) in run.asks.items() if not answer.done()}
                message = _status_message(run.steps, waiting, run.message)
            if end is not None:
                self._write_end(run, end)
                return
            try:
                self._store.update_task(run.record.task_id,
                                        lambda record: record.progressed(message, waiting, self._wall()))
            except Exception as error:  # noqa: BLE001 - a store hiccup must not break the run; the next write has it all
                logger.warning("task %s: progress not recorded (%s)", run.record.task_id[:12], type(error).__name__)

    def _write_end(self, run: _LocalRun, end: tuple[str, Callable[[TaskRecord], TaskRecord]]) -> None:
        """The run's end, recorded; then it is counted and let go. One that cannot be
        written is tried again (the run held here, alive to readers) until its record
        expires: then readers write it failed, its runner gone."""
        final, change = end
        try:
            recorded = self._store.update_task(run.record.task_id, change)
            if recorded is not None:
                final = recorded.status  # a tasks/cancel (on any worker) may have ended it first
        except Exception as failure:  # noqa: BLE001 - tried again below
            run.end_tries += 1
            delay = min(END_RETRY_MAX, END_RETRY_FIRST * 2 ** (run.end_tries - 1))
            if self._wall() + delay < run.record.expires:
                logger.warning("task %s: its end not recorded (%s); trying again in %gs", run.record.task_id[:12],
                               type(failure).__name__, delay)
                with run.lock:
                    run.changed = True  # the job after the delay writes the end (writing stays set)
                call_later(delay, lambda: run_in_thread(self._write_record, run))
                return
            logger.error("task %s: its end could not be recorded (%s); readers will find its runner gone",
                         run.record.task_id[:12], type(failure).__name__)
            final = FAILED  # what those readers will make of it
        # Counted before it leaves running(): reading running() then ended_counts() never misses it.
        self._count_ended(run.record.tool, final)
        self._forget(run)
        run.ended.set_result(final)

    def _settled(self, run: _LocalRun, outcome: cf.Future[dict[str, Any]]) -> None:
        """The run's result (on its loop, or the thread that started it): its end is to be
        recorded."""
        from vmcp_actors.codemode import ScriptCancelled  # noqa: PLC0415 - as the engine below
        from vmcp_actors.workflows.engine import WorkflowCancelled  # noqa: PLC0415 - the engine imports the config

        now = self._wall()
        error = outcome.exception() if not outcome.cancelled() else JsonRpcError(INTERNAL_ERROR, "the run was stopped")
        result = outcome.result() if error is None else None
        if result is not None:
            status, message = COMPLETED, "finished with an error" if result.get("isError") else "completed"
        elif isinstance(error, (WorkflowCancelled, ScriptCancelled)):
            status, message, error = CANCELLED, "cancelled", JsonRpcError(INTERNAL_ERROR, "The task was cancelled")
        else:
            error = error if isinstance(error, JsonRpcError) else JsonRpcError(INTERNAL_ERROR, "Internal error")
            status, message = FAILED, error.message[:200]
        shaped = error.to_dict() if isinstance(error, JsonRpcError) else None

        def change(record: TaskRecord) -> TaskRecord:
            return record.ended(status, message, now, result=result, error=shaped)

        self._record(run, end=(status, change))

    def _count_ended(self, tool: str, status: str) -> None:
        with self._lock:
            self._ended[(tool, status)] = self._ended.get((tool, status), 0) + 1

    def _forget(self, run: _LocalRun) -> None:
        with self._lock:
            self._runs.pop(run.record.task_id, None)
        run.release()

    # -- any worker ---------------------------------------------------------------------------

    def get(self, owner: str, task_id: str) -> TaskRecord:
        record = self._store.task(task_id)
        if record is None or record.owner != owner:
            raise JsonRpcError(INVALID_PARAMS, "Unknown task: it has expired or was never created")
        return self._ended_if_orphaned(record)

    def tasks_of(self, owner: str) -> list[TaskRecord]:
        return [self._ended_if_orphaned(record) for record in self._store.tasks_of(owner)]

    def answer(self, owner: str, task_id: str, responses: Mapping[str, Any],
               errors: Mapping[str, str] | None = None) -> TaskRecord:
        """The client's answers (by question key) to a task waiting for input; keys the task
        does not wait on are ignored."""
        record = self.get(owner, task_id)
        keys = (set(responses) | set(errors or ())) & set(record.input_requests)
        if record.terminal or not keys:
            return record
        changed = self._store.update_task(task_id, lambda current: current.answered(keys, self._wall())) or record
        self._signals.send(record.runner, {"op": "input", "task": task_id,
                                           "responses": {key: responses[key] for key in keys if key in responses},
                                           "errors": {key: errors[key] for key in keys if errors and key in errors}})
        return changed

    def cancel(self, owner: str, task_id: str) -> tuple[TaskRecord, bool]:
        """(the task now, whether it was still under way)."""
        record = self.get(owner, task_id)
        if record.terminal:
            return record, False
        now, error = self._wall(), JsonRpcError(INTERNAL_ERROR, "The task was cancelled").to_dict()
        changed = self._store.update_task(
            task_id, lambda current: current.ended(CANCELLED, "cancelled by the client", now, error=error))
        self._signals.send(record.runner, {"op": "cancel", "task": task_id})
        return changed or record, True

    def _ended_if_orphaned(self, record: TaskRecord) -> TaskRecord:
        if record.terminal:
            return record
        if record.runner == self.runner_id:
            with self._lock:
                alive = record.task_id in self._runs
        else:
            alive = self._signals.alive(record.runner)
        if alive:
            return record
        error = JsonRpcError(INTERNAL_ERROR, RUNNER_GONE).to_dict()
        now = self._wall()
        changed = self._store.update_task(record.task_id,
                                          lambda current: current.ended(FAILED, RUNNER_GONE, now, error=error))
        return changed or record

    # -- signals from other workers -----------------------------------------------------------

    def _received(self, signal: dict[str, Any]) -> None:
        with self._lock:
            run = self._runs.get(str(signal.get("task")))
        if run is None:
            return  # ended meanwhile
        if signal.get("op") == "cancel":
            run.stop()
        elif signal.get("op") == "input":
            responses = signal.get("responses") if isinstance(signal.get("responses"), dict) else {}
            errors = signal.get("errors") if isinstance(signal.get("errors"), dict) else {}
            with run.lock:
                answered = [(key, run.asks.pop(key)[1]) for key in list(run.asks) if key in responses or key in errors]
            for key, future in answered:
                if key in responses:
                    future.set_result(responses[key])
                else:
                    future.set_exception(JsonRpcError(INTERNAL_ERROR, str(errors[key])[:200]))

    # -- operators ----------------------------------------------------------------------------

    def running(self) -> list[dict[str, Any]]:
        """The tasks this worker runs (admin state): no handle, only a prefix of the id."""
        with self._lock:
            runs = list(self._runs.values())
        now = self._wall()
        rows = []
        for run in runs:
            with run.lock:
                waiting = sorted(step for step, (_, answer) in run.asks.items() if not answer.done())
                steps = dict(run.steps)
                message = run.message
            rows.append({"task": run.record.task_id[:12], "user": run.record.user, "tool": run.record.tool,
                         "status": "input_required" if waiting else WORKING,
                         "step": _status_message(steps, dict.fromkeys(waiting), message),
                         "ageSeconds": round(now - run.record.created, 3)})
        return sorted(rows, key=lambda row: -row["ageSeconds"])

    def live_count(self) -> int:
        with self._lock:
            return len(self._runs)

    def ended_counts(self) -> dict[tuple[str, str], int]:
        """(composite, status) -> how many of this worker's runs ended with that status
        (``completed``, ``failed``, ``cancelled``) since it started."""
        with self._lock:
            return dict(self._ended)

    def stop(self) -> None:
        """The worker is stopping: its runs end, recorded as failed (not left to look alive)."""
        with self._lock:
            runs = list(self._runs.values())
        now = self._wall()
        error = JsonRpcError(INTERNAL_ERROR, "The gateway worker that ran this task stopped").to_dict()
        for run in runs:
            try:
                self._store.update_task(run.record.task_id, lambda record: record.ended(
                    FAILED, "the gateway worker that ran this task stopped", now, error=error))
            except Exception:  # noqa: BLE001 - stopping: the readers will find the runner gone
                pass
            run.stop()
        self._signals.stop()


@dataclass(frozen=True)
class UserTasks:
    """One user's composite tasks: what their stack's composite layer uses."""

    tasks: CompositeTasks
    handles: TaskHandles
    owner: str  # what the user's handles are sealed to
    user: str  # for operators
    hold: Callable[[], Callable[[], None]]  # keeps the user's actors live while a run needs them

    def created(self, record: TaskRecord, task: TaskRequest) -> dict[str, Any]:
        """A call's answer: the task, as the client's revision has it."""
        shaped = record.task(self.handles.handle(GATEWAY, record.task_id), modern=task.modern)
        return {**shaped, "resultType": "task"} if task.modern else {"task": shaped}

    def owns(self, params: Mapping[str, Any]) -> str | None:
        """The task id of a ``tasks/*`` request about one of the gateway's own tasks."""
        handle = params.get("taskId")
        if not isinstance(handle, str) or not handle:
            return None
        backend, task_id = self.handles.open(handle)
        return task_id if backend == GATEWAY and isinstance(task_id, str) else None

    def request(self, method: str, task_id: str, params: Mapping[str, Any], modern: bool,
                deadline: Any) -> dict[str, Any] | Exchange:
        if method not in (MODERN_TASK_METHODS if modern else LEGACY_TASK_METHODS):
            raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
        handle = params["taskId"]
        if method == "tasks/get":
            record = self.tasks.get(self.owner, task_id)
            return {**record.detailed(handle), "resultType": "complete"} if modern else record.task(handle, modern=False)
        if method == "tasks/cancel":
            record, was_live = self.tasks.cancel(self.owner, task_id)
            if modern:
                return {"resultType": "complete"}
            if not was_live:
                raise JsonRpcError(INVALID_PARAMS, f"Cannot cancel a task in status {record.legacy_status!r}")
            return record.task(handle, modern=False)
        if method == "tasks/update":
            responses = params.get("inputResponses")
            if not isinstance(responses, Mapping):
                raise JsonRpcError(INVALID_PARAMS, "inputResponses is required and must be an object")
            self.tasks.answer(self.owner, task_id, responses)
            return {"resultType": "complete"}
        return self._result(task_id, handle, deadline)

    def listed(self) -> list[dict[str, Any]]:
        """Every task of the user's, for a 2025 client's tasks/list."""
        return [record.task(self.handles.handle(GATEWAY, record.task_id), modern=False)
                for record in self.tasks.tasks_of(self.owner)]

    def _result(self, task_id: str, handle: str, deadline: Any) -> Exchange:
        """A 2025 client's tasks/result: waits for the end, asking the client (on this
        stream) each question the task waits on."""
        asked: set[str] = set()
        related = {RELATED_TASK: {"taskId": handle}}
        while True:
            record = self.tasks.get(self.owner, task_id)
            if record.terminal:
                if record.status == COMPLETED and record.result is not None:
                    return {**dict(record.result), "_meta": {**(record.result.get("_meta") or {}), **related}}
                raise task_failure(record.error, record.status_message)
            for key, request in record.input_requests.items():
                if key in asked or not isinstance(request, Mapping):
                    continue
                asked.add(key)
                params = dict(request.get("params") or {})
                params["_meta"] = {**(params.get("_meta") or {}), **related}
                yield ServerRequest(str(request.get("method")), params, self._responder(task_id, key),
                                    f"composite step {key!r}")
            if deadline.remaining() <= RESULT_POLL:
                raise JsonRpcError(REQUEST_TIMEOUT, "Request timed out: the task did not end within the request's "
                                                    "deadline; call tasks/result again")
            time.sleep(RESULT_POLL)

    def _responder(self, task_id: str, key: str) -> Callable[[dict[str, Any]], None]:
        def respond(answer: dict[str, Any]) -> None:
            if "result" in answer:
                self.tasks.answer(self.owner, task_id, {key: answer["result"]})
            else:
                error = answer.get("error") if isinstance(answer.get("error"), Mapping) else {}
                self.tasks.answer(self.owner, task_id, {}, {key: str(error.get("message", "no answer"))})
        return respond


def _status_message(steps: Mapping[str, str], waiting: Mapping[str, Any], said: str | None = None) -> str:
    """What a client is told the task is doing: the step in progress (``said``: what a run
    that has no steps says it does, a script's calls under way)."""
    if waiting:
        return "waiting for input: step " + ", ".join(repr(step) for step in waiting)
    if said is not None:
        return said
    running = [step for step, state in steps.items() if state == "running"]
    done = sum(1 for state in steps.values() if state in ("completed", "failed", "skipped"))
    if not running:
        return "starting" if not done else f"{done} of {len(steps)} steps done"
    return f"running step {', '.join(repr(step) for step in running)} ({done} of {len(steps)} steps done)"
