"""Code mode: ``execute_tool_script`` runs a model's script over the tools a person may
call, and two helpers find those tools and read their schemas, so a model reads neither
every definition nor every intermediate result (ToolHive's ``execute_tool_script``, in
pydantic-monty's sandbox: ``vmcp_actors.codemode``).

The outermost layer (see ``vmcp_actors.decorators``), over the optimizer when there is
one. Its listing: ``scripts`` lists the script tool and its helpers (with the optimizer,
find_tool and call_tool do the finding and the script tool is added to them); ``all``
lists them beside every tool. A call of any other tool passes through unchanged.

Every ``call_tool`` of a script is a client's call of that tool: it is made on the layer
under the optimizer (``callee``), so Cedar decides it as the caller, the advertising filter,
the rate limits (each call spends tokens) and the backend's bulkhead apply, and it fails
inside the script with the error a client would get. The script tool is itself decided by
Cedar (a policy must permit ``execute_tool_script`` where authz is configured) and spends
a token of the caller's buckets. Each inner call gets an audit line naming its script.

A script whose client accepts tasks becomes a task once it has run ``taskAfter`` (a
2026-07-28 client), or at once (a 2025-11-25 client that asked for one, as its revision
requires), through the composite tasks' records: tasks/get, tasks/result and tasks/cancel
work as for a composite's.
"""

from __future__ import annotations

import concurrent.futures as cf
import fnmatch
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vmcp_actors.backends import CallOpened, InputRequired
from vmcp_actors.codemode import InnerCall, Sandbox, ScriptCancelled, ScriptRun
from vmcp_actors.concurrency import Deadline, run_call
from vmcp_actors.config import CodeModeConfig
from vmcp_actors.config import SCRIPT_TOOL, SEARCH_TOOLS, TOOL_SCHEMAS
from vmcp_actors.core._aggregated import ANSWER_MARGIN
from vmcp_actors.core._catalog import Route
from vmcp_actors.core._exchange import SESSION_ENDED, CallCancelled, Exchange, Notification, ServerRequest, answered
from vmcp_actors.core._explain import ADDS, PASSES, Explanation, Finding
from vmcp_actors.core._interface import CoreLayer, PerList, UnknownTool, UserCore
from vmcp_actors.core._tasks import TaskRequest, requested_task
from vmcp_actors.decorators._cedar import CALL_TOOL as CEDAR_CALL_TOOL, CedarPolicies, audit_denied
from vmcp_actors.decorators._composite import TASK_EXECUTION
from vmcp_actors.decorators._composite_tasks import UserTasks
from vmcp_actors.decorators._search import ToolIndex, as_text
from vmcp_actors.identity import Identity, subject_of
from vmcp_actors.limits import RateLimiter
from vmcp_actors.metrics import METRICS
from vmcp_actors.protocol import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND, JsonRpcError

logger = logging.getLogger(__name__)

SCRIPT_META = "vmcp-actors/script"  # the run's id in the script tool's result (audit lines carry it too)
SUMMARY_LENGTH = 200  # characters of a description search_tools returns
SCRIPT_RETRY_AFTER = 1  # seconds a caller refused for want of a sandbox slot is told to wait

SCRIPT_DESCRIPTION = (
    "Run a short Python script that calls this server's tools and returns only what you need. The "
    "language is a sandboxed Python subset: no files, network or environment; modules json, re, math, "
    "datetime, asyncio, collections, itertools are there. Inside, `await call_tool(name, arguments)` returns "
    "a tool's structured result (a dict) or its text, and raises RuntimeError on a tool error; "
    "`await asyncio.gather(*calls)` runs calls in parallel. The value of the last expression (or a top-level "
    "`return`) is the result. `data` holds the optional data argument. {finding}")
FIND_WITH_HELPERS = "Find tools with search_tools and read their input schemas with get_tool_schema first."
FIND_WITH_OPTIMIZER = "Find tools and their input schemas with find_tool first."


def script_tool(finding: str, takes_tasks: bool) -> dict[str, Any]:
    definition: dict[str, Any] = {
        "name": SCRIPT_TOOL,
        "description": SCRIPT_DESCRIPTION.format(finding=finding),
        "inputSchema": {
            "type": "object",
            "properties": {
                "script": {"type": "string", "description": "The script (Python subset)."},
                "data": {"type": "object", "description": "Optional values the script reads as `data`."},
            },
            "required": ["script"],
        },
        "annotations": {"title": "Run a tool script", "openWorldHint": True},
    }
    if takes_tasks:
        definition["execution"] = dict(TASK_EXECUTION)
    return definition


SEARCH_DEFINITION: dict[str, Any] = {
    "name": SEARCH_TOOLS,
    "description": ("Find the tools a script can call: describe the task in query; the answer lists the best "
                    "matching tool names with a line of description each. Read their input schemas with "
                    "get_tool_schema."),
    "inputSchema": {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What the tools should do, in plain words."},
                       "limit": {"type": "integer", "minimum": 1, "maximum": 50,
                                 "description": "How many tools at most (default 8)."}},
        "required": ["query"],
    },
    "annotations": {"title": "Search tools", "readOnlyHint": True, "openWorldHint": False},
}

SCHEMAS_DEFINITION: dict[str, Any] = {
    "name": TOOL_SCHEMAS,
    "description": "The input (and output) schemas of the named tools, to call them from a script.",
    "inputSchema": {
        "type": "object",
        "properties": {"names": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 50,
                                 "description": "Tool names, as search_tools gave them."}},
        "required": ["names"],
    },
    "annotations": {"title": "Read tool schemas", "readOnlyHint": True, "openWorldHint": False},
}

# (identity, script id, tool, arguments, backend, result or None, error or None, seconds)
InnerAudit = Callable[[Identity | None, str, str, Mapping[str, Any], str | None, Mapping[str, Any] | None,
                       JsonRpcError | None, float], None]


class ScriptsRunning:
    """The scripts this process runs, for operators (no script text, no data)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _runs
        self._runs: dict[str, ScriptRun] = {}

    def add(self, run: ScriptRun) -> None:
        with self._lock:
            self._runs[run.id] = run

    def remove(self, run: ScriptRun) -> None:
        with self._lock:
            self._runs.pop(run.id, None)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            runs = list(self._runs.values())
        return sorted((run.status() for run in runs), key=lambda row: -row["ageSeconds"])

    def cancel_all(self) -> None:
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            run.cancel()


@dataclass(frozen=True)
class CodeModeServices:
    """What code mode shares across the process: the sandbox, the decisions a script's own
    call passes, the audit of inner calls, and the scripts running (admin state)."""

    settings: CodeModeConfig
    sandbox: Sandbox
    policies: CedarPolicies | None = None
    limiter: RateLimiter | None = None
    audit: InnerAudit | None = None
    running: ScriptsRunning = field(default_factory=ScriptsRunning)


class CodeMode(CoreLayer):
    """The script tool and its helpers over ``inner`` (what clients list); scripts' calls
    go to ``callee`` (the layer under the optimizer, or ``inner`` itself)."""

    layer_name = "code mode"

    def __init__(self, inner: UserCore, callee: UserCore, services: CodeModeServices, *, optimizer: bool = False,
                 tasks: UserTasks | None = None, user: str = ""):
        super().__init__(inner)
        self._callee = callee
        self._services = services
        self._settings = services.settings
        self._optimizer = optimizer
        self._tasks = tasks
        self._user = user
        self._own = {SCRIPT_TOOL: script_tool(FIND_WITH_OPTIMIZER if optimizer else FIND_WITH_HELPERS,
                                              tasks is not None)}
        if not optimizer:
            self._own.update({SEARCH_TOOLS: SEARCH_DEFINITION, TOOL_SCHEMAS: SCHEMAS_DEFINITION})
        self._covered: PerList[tuple[tuple[dict[str, Any], ...], dict[str, dict[str, Any]]]] = PerList()
        self._index: PerList[ToolIndex] = PerList()  # over the covered tools, built at the first search
        self._lock = threading.Lock()  # guards _runs
        self._runs: dict[str, ScriptRun] = {}  # this user's scripts under way

    # -- tools -----------------------------------------------------------------------------

    def _may_script(self, identity: Identity | None, arguments: Mapping[str, Any] | None = None,
                    audited: bool = False) -> bool:
        policies = self._services.policies
        if policies is None:
            return True
        decision = policies.decide(policies.principal(identity), CEDAR_CALL_TOOL, SCRIPT_TOOL,
                                   self._own[SCRIPT_TOOL]["annotations"], arguments)
        if not decision.allowed and audited:
            audit_denied(identity, CEDAR_CALL_TOOL, SCRIPT_TOOL)
        return decision.allowed

    def _own_tools(self, identity: Identity | None) -> dict[str, dict[str, Any]]:
        return self._own if self._may_script(identity) else {}

    def list_tools(self, identity, deadline):
        own = self._own_tools(identity)
        if self._settings.listing == "scripts" and not self._optimizer:
            return tuple(own.values())
        below = self._inner.list_tools(identity, deadline)
        return tuple(tool for tool in below if tool["name"] not in own) + tuple(own.values())

    def describe_tool(self, identity, name, deadline):
        if name in self._own:
            return self._own_tools(identity).get(name)
        return self._inner.describe_tool(identity, name, deadline)

    def lookup_tool(self, identity, name, deadline):
        if name in self._own:
            return Route("", name, name, composite=True) if self._own_tools(identity) else None
        return self._inner.lookup_tool(identity, name, deadline)

    def call_tool(self, identity, name, arguments, meta, deadline):
        if name not in self._own or not self._may_script(identity, arguments, audited=True):
            # Not offered to this caller (Cedar): the name is what the layers below make of it.
            return self._inner.call_tool(identity, name, arguments, meta, deadline)
        arguments = arguments or {}
        if name == SEARCH_TOOLS:
            return answered(self._search(identity, arguments, deadline))
        if name == TOOL_SCHEMAS:
            return answered(self._schemas(identity, arguments, deadline))
        return self._script(identity, arguments, meta, deadline)

    def resume(self, identity, continuation, deadline):
        """Code mode hands out no backend's state: a continued call of its tools runs again."""
        if continuation.method == "tools/call" and continuation.name in self._own:
            if continuation.backend is not None:
                raise continuation.unknown()
            return self.call_tool(identity, continuation.name, dict(continuation.arguments or {}),
                                  dict(continuation.meta) if continuation.meta else None, deadline)
        return super().resume(identity, continuation, deadline)

    def explain_tool(self, identity, name, deadline) -> Explanation:
        if name in self._own:
            below = self._inner.explain_tool(identity, name, deadline)
            allowed = bool(self._own_tools(identity))
            reason = f"{name} is code mode's own tool" + ("" if allowed else
                                                         "; Cedar forbids this caller execute_tool_script")
            return below.with_finding(Finding(self.layer_name, ADDS, reason), listed=allowed, callable=allowed)
        below = self._inner.explain_tool(identity, name, deadline)
        listed = below.listed and (self._settings.listing == "all" or self._optimizer)
        reason = ("scripts may call it (codeMode.tools)" if self._covers(name)
                  else "codeMode.tools does not cover it: scripts may not call it")
        if not listed and below.listed:
            reason += "; listing: scripts lists only the script tool and its helpers (clients may still call it)"
        return below.with_finding(Finding(self.layer_name, PASSES, reason), listed=listed, callable=below.callable)

    def close(self) -> None:
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            run.cancel()
        self._index.clear()  # its SQLite connection closes with it (as a replaced one's does)
        self._covered.clear()
        super().close()

    # -- the helpers -----------------------------------------------------------------------

    def _covers(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self._settings.tools)

    def _covered_tools(self, identity: Identity | None,
                       deadline: Deadline) -> tuple[tuple[dict[str, Any], ...], dict[str, dict[str, Any]]]:
        """The tools scripts may call and this caller may call, and them by name: derived
        once per list the layer below answers."""
        below = self._callee.list_tools(identity, deadline)

        def covered() -> tuple[tuple[dict[str, Any], ...], dict[str, dict[str, Any]]]:
            tools = tuple(tool for tool in below if self._covers(tool["name"]))
            return tools, {tool["name"]: tool for tool in tools}

        return self._covered.get(below, covered)

    def _search(self, identity: Identity | None, arguments: Mapping[str, Any], deadline: Deadline) -> dict[str, Any]:
        query, limit = arguments.get("query"), arguments.get("limit", 8)
        if not isinstance(query, str) or not query.strip():
            raise JsonRpcError(INVALID_PARAMS, f"{SEARCH_TOOLS}: query must say what the tools should do")
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 50:
            raise JsonRpcError(INVALID_PARAMS, f"{SEARCH_TOOLS}: limit must be an integer from 1 to 50")
        tools, _ = self._covered_tools(identity, deadline)
        index = self._index.get(tools, lambda: ToolIndex(tools))
        found = [{"name": tool["name"], "description": _first_line(tool.get("description"))}
                 for tool, _ in index.search(query, "", limit)]
        return {"content": [{"type": "text", "text": as_text({"tools": found})}],
                "structuredContent": {"tools": found}, "isError": False}

    def _schemas(self, identity: Identity | None, arguments: Mapping[str, Any], deadline: Deadline) -> dict[str, Any]:
        names = arguments.get("names")
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not names or len(names) > 50 \
                or not all(isinstance(name, str) for name in names):
            raise JsonRpcError(INVALID_PARAMS, f"{TOOL_SCHEMAS}: names must list 1 to 50 tool names")
        _, by_name = self._covered_tools(identity, deadline)
        tools, unknown = [], []
        for name in dict.fromkeys(names):
            tool = by_name.get(name)
            if tool is None:
                unknown.append(name)
                continue
            entry = {"name": name, "description": tool.get("description", ""),
                     "inputSchema": tool.get("inputSchema", {"type": "object"})}
            if tool.get("outputSchema") is not None:
                entry["outputSchema"] = tool["outputSchema"]
            tools.append(entry)
        answer: dict[str, Any] = {"tools": tools, **({"unknown": unknown} if unknown else {})}
        return {"content": [{"type": "text", "text": as_text(answer)}], "structuredContent": answer, "isError": False}

    # -- scripts ---------------------------------------------------------------------------

    def _script(self, identity: Identity | None, arguments: Mapping[str, Any], meta: Mapping[str, Any] | None,
                deadline: Deadline) -> Exchange:
        settings = self._settings
        script, data = arguments.get("script"), arguments.get("data")
        if not isinstance(script, str) or not script.strip():
            raise JsonRpcError(INVALID_PARAMS, f"{SCRIPT_TOOL}: script must be the script's text")
        if len(script.encode("utf-8", "surrogatepass")) > settings.max_script_size:
            raise JsonRpcError(INVALID_PARAMS, f"{SCRIPT_TOOL}: the script is longer than codeMode.maxScriptSize "
                                               f"({settings.max_script_size} bytes)")
        if data is not None and not isinstance(data, dict):
            raise JsonRpcError(INVALID_PARAMS, f"{SCRIPT_TOOL}: data must be an object")
        sandbox = self._services.sandbox
        if not sandbox.take_slot():  # before a token is spent: a refused script costs none
            raise JsonRpcError(INTERNAL_ERROR, "This gateway worker runs as many scripts as it may "
                                               f"(codeMode.maxConcurrentScripts: {settings.max_concurrent_scripts}); "
                                               "retry shortly", {"retryAfterSeconds": SCRIPT_RETRY_AFTER},
                               http_status=503)
        try:
            if self._services.limiter is not None:
                self._services.limiter.admit(identity, SCRIPT_TOOL)
        except BaseException:
            sandbox.give_slot()
            raise
        task = requested_task.get()
        takes_task = task is not None and not task.awaited and self._tasks is not None
        ends = time.monotonic() + settings.timeout
        run_deadline = Deadline(ends if takes_task else min(ends, deadline.earlier(ANSWER_MARGIN).at))
        run: ScriptRun | None = None

        def inner_call(tool: str, tool_arguments: dict[str, Any], call_deadline: Deadline) -> InnerCall:
            return self._inner_call(identity, run.id if run is not None else "", tool, tool_arguments, call_deadline)

        try:
            run = ScriptRun(sandbox, script, data, inner_call, run_deadline, self._user or subject_of(identity),
                            on_end=self._ended)
        except BaseException:
            sandbox.give_slot()
            raise
        with self._lock:
            self._runs[run.id] = run
        self._services.running.add(run)
        run.start()
        return self._follow(run, task if takes_task else None, meta, deadline)

    def _ended(self, run: ScriptRun) -> None:
        with self._lock:
            self._runs.pop(run.id, None)
        self._services.running.remove(run)

    def _follow(self, run: ScriptRun, task: TaskRequest | None, meta: Mapping[str, Any] | None, deadline: Deadline) -> Exchange:
        """The call's side of a run: its progress relayed (when the client asked for it),
        its result returned; or, once it has run ``taskAfter`` (at once for a 2025 client
        that asked for a task), a task the run goes on under."""
        events: queue.SimpleQueue[Notification | None] = queue.SimpleQueue()
        token = (meta or {}).get("progressToken")
        cancelled_by_client = threading.Event()

        def cancel(reason: str | None) -> None:
            if reason != SESSION_ENDED:  # the client cancelled: it expects no answer
                cancelled_by_client.set()
            run.cancel()

        sent = [0]  # notifications relayed: MCP wants each one's progress above the last's
        relaying = threading.Lock()  # guards sent and the order of the puts (the run's thread and this one tell)

        def relay(progress: Mapping[str, Any]) -> None:
            with relaying:
                sent[0] += 1
                events.put(Notification({"jsonrpc": "2.0", "method": "notifications/progress",
                                         "params": {"progressToken": token, "progress": sent[0],
                                                    "message": progress["message"]}}))

        handed_over = False
        try:
            yield CallOpened("", cancel)
            if token is not None:
                run.listen(relay)
            run.outcome.add_done_callback(lambda _: events.put(None))
            wait_until = deadline
            if task is not None:
                wait_until = Deadline(time.monotonic() if not task.modern else
                                      min(deadline.at, time.monotonic() + self._settings.task_after))
            while True:
                try:
                    event = events.get(timeout=max(0.0, wait_until.remaining()))
                except queue.Empty:
                    if task is not None and wait_until is not deadline:
                        created = self._as_task(run, task)
                        if created is not None:
                            handed_over = True
                            return created
                        wait_until = deadline  # no room for a task: the call waits for it
                        continue
                    raise JsonRpcError(INTERNAL_ERROR, "the script did not finish in time") from None
                if event is None:
                    break
                yield event
            error = run.outcome.exception()
            if isinstance(error, ScriptCancelled) and cancelled_by_client.is_set():
                raise CallCancelled()
            if error is not None:
                raise error
            return named(run.outcome.result(), run)
        finally:
            if not handed_over:
                run.listen(None)
                run.cancel()  # a no-op once it ended; else the client went away

    def _as_task(self, run: ScriptRun, task: TaskRequest) -> dict[str, Any] | None:
        """The run goes on as a task: its record made, its progress and end written there."""
        assert self._tasks is not None
        user, tasks = self._tasks, self._tasks.tasks
        try:
            local = tasks.begin(user.owner, user.user, SCRIPT_TOOL, max(0.0, run.deadline.remaining()),
                                task.params.get("ttl"), user.hold)
        except JsonRpcError as refused:
            if task.modern:
                logger.info("script %s stays a plain call: %s", run.id, refused.message)
                return None
            run.cancel()
            raise
        run.listen(lambda progress: tasks.progressed(local, {}, progress["message"]))
        shown: cf.Future[dict[str, Any]] = cf.Future()  # the result as the call would have had it
        run.outcome.add_done_callback(lambda done: shown.set_exception(done.exception()) if done.exception()
                                      else shown.set_result(named(done.result(), run)))
        tasks.start(local, shown, run.cancel)
        return named(user.created(local.record, task), run)  # its audit line names the run too

    def _inner_call(self, identity: Identity | None, script: str, tool: str, arguments: dict[str, Any],
                    deadline: Deadline) -> InnerCall:
        """A script's ``call_tool``: a client's call of ``tool`` (on the calls' pool)."""
        cancels: list[Callable[[str | None], None]] = []
        stopped = threading.Event()
        lock = threading.Lock()  # guards cancels and stopped together

        def drive() -> dict[str, Any]:
            began, backend = time.monotonic(), None
            result, error = None, None
            try:
                if not self._covers(tool):
                    raise UnknownTool(tool)  # as for a tool the caller cannot see: codeMode.tools leaves it out
                exchange = self._callee.call_tool(identity, tool, arguments, None, deadline)
                try:
                    while True:
                        try:
                            event = next(exchange)
                        except StopIteration as done:
                            result = done.value
                            return result
                        if isinstance(event, CallOpened):
                            backend = event.backend or backend
                            with lock:
                                cancels.append(event.cancel)
                                stop_now = stopped.is_set()
                            if stop_now:
                                event.cancel(None)
                        elif isinstance(event, ServerRequest):
                            event.respond({"error": {"code": METHOD_NOT_FOUND, "message": (
                                "a script's tool call cannot ask the client (sampling, elicitation, roots)")}})
                        elif isinstance(event, InputRequired):
                            raise JsonRpcError(INTERNAL_ERROR, f"{tool} asked for input, which a script's call "
                                                               "cannot give")
                finally:
                    exchange.close()
            except JsonRpcError as failed:
                error = failed
                raise
            except Exception as failed:  # noqa: BLE001 - the script gets an error, the log the cause
                logger.warning("script %s: call of %r failed: %s", script, tool, type(failed).__name__)
                error = JsonRpcError(INTERNAL_ERROR, "Internal error")
                raise error from None
            finally:
                seconds = time.monotonic() - began
                outcome = "error" if error is not None else "tool_error" if (result or {}).get("isError") else "ok"
                METRICS.observe("script_call", (outcome,), seconds)
                if self._services.audit is not None:
                    self._services.audit(identity, script, tool, arguments, backend or None, result, error, seconds)

        future = run_call(drive)

        def cancel() -> None:
            with lock:
                stopped.set()
                opened = list(cancels)
            for end in opened:
                end(None)
            future.cancel()

        return InnerCall(future, cancel)


def named(result: Mapping[str, Any], run: ScriptRun) -> dict[str, Any]:
    """A script's result naming its run (``_meta``): its audit line and its inner calls' share the id."""
    return {**result, "_meta": {**(result.get("_meta") or {}), SCRIPT_META: {"id": run.id}}}


def _first_line(text: Any) -> str:
    line = str(text or "").strip().split("\n", 1)[0]
    return line if len(line) <= SUMMARY_LENGTH else line[:SUMMARY_LENGTH - 1] + "…"
