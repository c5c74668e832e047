"""Scripts in pydantic-monty's sandbox: a Rust interpreter of a Python subset, run in worker
subprocesses the pool starts with an empty environment (by default each in bubblewrap too:
no network, no files, only ``PWD=/``; ``codeMode.workerIsolation``).

A script sees ``data`` and one host function, ``call_tool(name, arguments)``; nothing
else of the gateway. It has no files (an ``open`` is refused by the host), no environment,
no network and no imports beyond the interpreter's own modules (json, re, math, datetime,
asyncio, ...); its sleeps are waited for by the host, within its timeout. The engine enforces its limits: the time its code runs
(``max_feed_duration_secs``: waiting on tools does not count), heap, recursion depth and
suspensions; the host adds the wall time, the number of tool calls and how many run at once.

``ScriptRun`` drives one script on a thread of its own: each ``call_tool`` is answered with
a future at once (so ``asyncio.gather`` fans out), started when fewer than
``parallelMaxConcurrency`` calls are under way, and the script resumed with each result as
it lands. Cancelling the run stops it between two steps of the sandbox and cancels its
calls; the sandbox's own step is bounded by ``executionTime``.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import math
import os
import queue
import secrets
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vmcp_actors.backends._sandbox import script_worker_launcher
from vmcp_actors.concurrency import Deadline
from vmcp_actors.config import CodeModeConfig
from vmcp_actors.metrics import METRICS
from vmcp_actors.protocol import INTERNAL_ERROR, REQUEST_TIMEOUT, JsonRpcError

if TYPE_CHECKING:
    import pydantic_monty as monty

logger = logging.getLogger(__name__)

CALL_TOOL = "call_tool"  # the one host function a script may call
ASYNC_SLEEP = "system.async_sleep"
SLEEPS = ("system.sleep", ASYNC_SLEEP)  # the host's only OS functions: waits, within the script's timeout
PRINT_LIMIT = 16 * 1024  # characters of a script's print() output kept for its result
# Suspensions the engine allows per script beyond its tool calls (a call is answered with a
# future, then the future resolved; name lookups count too): a backstop under maxToolCalls.
SUSPENSIONS_PER_CALL, SUSPENSIONS_SPARE = 3, 100
WORKER_GRACE = 5.0  # seconds past executionTime before the pool kills a worker stuck in one step


class ScriptCancelled(JsonRpcError):
    """The run was cancelled (its client cancelled the call or the task)."""

    def __init__(self) -> None:
        super().__init__(INTERNAL_ERROR, "The script was cancelled")


class _Printed:
    """A script's print() output, its first ``PRINT_LIMIT`` characters kept (the rest
    counted, not an error in the script). Written by the pool's reader, read at the end."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._kept = 0
        self._dropped = 0

    def take(self, stream: str, text: str) -> None:
        room = PRINT_LIMIT - self._kept
        if room > 0:
            self._parts.append(text[:room])
            self._kept += min(room, len(text))
        self._dropped += max(0, len(text) - max(room, 0))

    @property
    def text(self) -> str:
        cut = f"\n[{self._dropped} more characters of output not kept]" if self._dropped else ""
        return "".join(self._parts) + cut


class _Stopped(Exception):
    """The host stopped the script at one of its limits: the message says which."""


# A call's answer when it ran out of the script's own time: the script stops at its timeout.
_TIMED_OUT: dict[str, Any] = {"exc_type": "TimeoutError", "message": "codeMode.timeout"}


@dataclass(frozen=True)
class InnerCall:
    """A tool call a script made, under way: its result (a tools/call result, or a
    JsonRpcError) lands in ``outcome``; ``cancel`` ends it at its backend."""

    outcome: cf.Future[dict[str, Any]]
    cancel: Callable[[], None]


# name, arguments, deadline -> the call under way
ToolCaller = Callable[[str, dict[str, Any], Deadline], InnerCall]
ProgressListener = Callable[[Mapping[str, Any]], None]


class Sandbox:
    """This process's sandbox workers, started at the first script (after any fork: a pool
    started before gunicorn forks would serve no worker), and a slot per script run."""

    def __init__(self, settings: CodeModeConfig):
        self.settings = settings
        self._lock = threading.Lock()  # guards _pool and _closed
        self._pool: monty.Monty | None = None
        self._closed = False
        self._launcher_dir: str | None = None  # the bubblewrap launcher's, once written
        self._slots = threading.BoundedSemaphore(settings.max_concurrent_scripts)

    def pool(self) -> monty.Monty:
        import pydantic_monty as monty  # noqa: PLC0415 - 85 ms of imports: only where code mode runs

        with self._lock:
            if self._closed:
                raise JsonRpcError(INTERNAL_ERROR, "the gateway is stopping", http_status=503)
            if self._pool is None:
                pool = monty.Monty(binary_path=self._worker_binary(), min_processes=1,
                                   max_processes=self.settings.max_concurrent_scripts,
                                   request_timeout=self.settings.execution_time + WORKER_GRACE)
                pool.__enter__()
                self._pool = pool
            return self._pool

    def _worker_binary(self) -> str:
        """The worker binary pydantic-monty ships, or (``workerIsolation: bubblewrap``) a
        launcher that runs it in bubblewrap, written to a directory only this process reads."""
        from pydantic_monty._binary import find_monty_binary  # noqa: PLC0415 - as above

        binary = os.path.realpath(find_monty_binary())
        if self.settings.worker_isolation != "bubblewrap":
            return binary
        self._launcher_dir = tempfile.mkdtemp(prefix="vmcp-monty-")  # 0700
        return script_worker_launcher(binary, self._launcher_dir)

    def take_slot(self) -> bool:
        """A place for one more script in this process, if one is free now."""
        return self._slots.acquire(blocking=False)

    def give_slot(self) -> None:
        self._slots.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.__exit__(None, None, None)
        if self._launcher_dir is not None:
            shutil.rmtree(self._launcher_dir, ignore_errors=True)


class ScriptRun:
    """One script, run on its own thread: ``outcome`` settles with the tool result
    (``isError`` for the script's own failures and limits) or a JsonRpcError."""

    def __init__(self, sandbox: Sandbox, script: str, data: Mapping[str, Any] | None, call_tool: ToolCaller,
                 deadline: Deadline, user: str, on_end: Callable[[ScriptRun], None] | None = None):
        self.id = secrets.token_hex(6)
        self.user = user
        self.started = time.monotonic()
        self.outcome: cf.Future[dict[str, Any]] = cf.Future()
        self._sandbox = sandbox
        self._settings = sandbox.settings
        self._script = script
        self._data = dict(data) if data is not None else None
        self._call_tool = call_tool
        self._deadline = deadline
        self._on_end = on_end
        self._cancelled = threading.Event()
        self._completions: queue.SimpleQueue[tuple[int, dict[str, Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards the fields below (read by operators and listeners)
        self._listener: ProgressListener | None = None
        self._calls: dict[int, tuple[str, InnerCall]] = {}  # call id -> (tool, call) under way
        self._waiting: deque[tuple[int, str, dict[str, Any]]] = deque()  # made, not yet started
        self._made = 0
        self._done = 0
        self._settled: dict[int, dict[str, Any]] = {}  # results the script has not awaited yet
        self._wakes: dict[int, float] = {}  # asyncio.sleep futures -> when they land (the run's thread only)

    # -- the caller's side ------------------------------------------------------------------

    @property
    def deadline(self) -> Deadline:
        return self._deadline

    def start(self) -> None:
        """Runs the script on a thread of its own (the caller holds a sandbox slot for it)."""
        threading.Thread(target=self._run, name=f"vmcp-script-{self.id}", daemon=True).start()

    def cancel(self) -> None:
        self._cancelled.set()
        self._completions.put(None)  # wakes the run if it waits on its calls

    def listen(self, listener: ProgressListener | None) -> None:
        """Who hears each change of the calls under way (the call's stream, or its task)."""
        with self._lock:
            self._listener = listener
        if listener is not None:
            listener(self.progress())

    def progress(self) -> dict[str, Any]:
        with self._lock:
            running = [tool for tool, _ in self._calls.values()]
            made, done = self._made, self._done
        message = f"calling {', '.join(running)}" if running else "running"
        return {"toolCalls": made, "done": done, "running": running, "message": f"{message} ({done} of {made} "
                                                                               "tool calls done)"}

    def status(self) -> dict[str, Any]:
        """For operators: no script text, no data."""
        progress = self.progress()
        return {"script": self.id, "user": self.user, "ageSeconds": round(time.monotonic() - self.started, 3),
                "toolCalls": progress["toolCalls"], "running": progress["running"]}

    # -- the run's thread -------------------------------------------------------------------

    def _run(self) -> None:
        outcome = "error"
        try:
            result = self._execute()
            if self._cancelled.is_set():
                raise ScriptCancelled()  # cancelled while the sandbox ran a step: whatever it then hit
            outcome = "tool_error" if result.get("isError") else "ok"
            self.outcome.set_result(result)
        except ScriptCancelled as cancelled:
            outcome = "cancelled"
            self.outcome.set_exception(cancelled)
        except JsonRpcError as error:
            self.outcome.set_exception(error)
        except Exception as error:  # noqa: BLE001 - the caller gets an answer whatever happened
            logger.error("script %s failed unexpectedly: %s", self.id, type(error).__name__, exc_info=error)
            self.outcome.set_exception(JsonRpcError(INTERNAL_ERROR, "The script could not be run"))
        finally:
            self._end_calls()
            self._sandbox.give_slot()
            seconds = time.monotonic() - self.started
            METRICS.observe("script", (outcome,), seconds)
            if self._on_end is not None:
                self._on_end(self)

    def _execute(self) -> dict[str, Any]:
        import pydantic_monty as monty  # noqa: PLC0415 - imported by the pool already

        settings = self._settings
        limits: monty.ResourceLimits = {
            "max_feed_duration_secs": settings.execution_time, "max_memory": settings.max_memory,
            "max_recursion_depth": settings.max_recursion_depth,
            "max_suspensions": settings.max_tool_calls * SUSPENSIONS_PER_CALL + SUSPENSIONS_SPARE}
        printed = _Printed()
        try:
            with self._sandbox.pool().checkout(limits=limits, script_name="script.py") as session:
                snapshot = session.feed_start(self._script, inputs={"data": self._data}, print_callback=printed.take)
                while not isinstance(snapshot, monty.MontyComplete):
                    self._check_going()
                    if isinstance(snapshot, monty.FunctionSnapshot):
                        snapshot = self._answer(snapshot)
                    elif isinstance(snapshot, monty.NameLookupSnapshot):
                        # call_tool named, not called (f = call_tool): the host function; else NameError
                        snapshot = snapshot.resume(value=_named_call_tool) \
                            if snapshot.variable_name == CALL_TOOL and snapshot.object_id is None else snapshot.resume()
                    else:
                        snapshot = snapshot.resume(self._results_for(snapshot.pending_call_ids))
                unawaited = self._unawaited()
                return script_result(snapshot.output, printed.text, unawaited)
        except monty.MontySyntaxError as error:
            return failure(error.display("type-msg"), printed.text)
        except monty.MontyRuntimeError as error:
            return failure(_explained(error.display("traceback"), settings), printed.text)
        except monty.MontyCrashedError as error:
            why = (f"its code ran past codeMode.executionTime ({settings.execution_time:g}s)" if error.timed_out
                   else "its sandbox worker crashed (a value nested thousands deep can do that) and was replaced")
            return failure(f"The script was stopped: {why}.", printed.text)
        except _Stopped as stopped:
            return failure(str(stopped), printed.text)

    def _check_going(self) -> None:
        if self._cancelled.is_set():
            raise ScriptCancelled()
        if self._deadline.expired:
            raise self._out_of_time()

    def _out_of_time(self) -> _Stopped:
        return _Stopped(f"The script was stopped: it ran longer than codeMode.timeout "
                        f"({self._settings.timeout:g}s, waiting on tools included).")

    def _answer(self, snapshot: Any) -> Any:  # a pydantic_monty.FunctionSnapshot
        if snapshot.is_os_function:
            if snapshot.function_name in SLEEPS:
                return self._sleep(snapshot)
            return snapshot.resume_not_handled()  # files, environment: none here
        name = snapshot.function_name
        if name != CALL_TOOL:
            return snapshot.resume({"exc_type": "NameError", "message": f"name {name!r} is not defined"})
        tool, arguments, problem = _call_arguments(snapshot.args, snapshot.kwargs)
        if problem is not None:
            return snapshot.resume({"exc_type": "TypeError", "message": problem})
        with self._lock:
            if self._made >= self._settings.max_tool_calls:
                made = self._made
            else:
                made = None
                self._made += 1
                self._waiting.append((snapshot.call_id, tool, arguments))
        if made is not None:
            raise _Stopped(f"The script was stopped: it called tools more than codeMode.maxToolCalls "
                           f"({self._settings.max_tool_calls}) times.")
        self._start_waiting()
        return snapshot.resume({"future": ...})

    def _start_waiting(self) -> None:
        """Starts the calls made and not started, while fewer than parallelMaxConcurrency run."""
        started = False
        while True:
            with self._lock:
                if not self._waiting or len(self._calls) >= self._settings.parallel_max_concurrency:
                    break
                call_id, tool, arguments = self._waiting.popleft()
            own_limit = time.monotonic() + self._settings.tool_call_timeout
            deadline = Deadline(min(self._deadline.at, own_limit))
            by_script = self._deadline.at <= own_limit  # the script's timeout, not toolCallTimeout, bounds it
            try:
                call = self._call_tool(tool, arguments, deadline)
            except JsonRpcError as refused:
                self._completions.put((call_id, _raised(tool, refused)))
                continue
            with self._lock:
                self._calls[call_id] = (tool, call)
            call.outcome.add_done_callback(lambda done, call_id=call_id, tool=tool, by_script=by_script:
                                           self._completions.put((call_id, self._answer_of(tool, done, by_script))))
            started = True
        if started:
            self._tell()

    def _sleep(self, snapshot: Any) -> Any:
        """``time.sleep`` waits here (until the script's deadline at most, a cancel ends it);
        ``asyncio.sleep`` is a future that lands when its time is up, so gathered sleeps overlap."""
        seconds = snapshot.args[0] if snapshot.args else 0
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds >= 0:
            return snapshot.resume({"exc_type": "ValueError", "message": "sleep length must be a non-negative number"})
        wake = time.monotonic() + min(float(seconds), max(0.0, self._deadline.remaining()))
        if snapshot.function_name == ASYNC_SLEEP:
            self._wakes[snapshot.call_id] = wake
            return snapshot.resume({"future": ...})
        self._cancelled.wait(max(0.0, wake - time.monotonic()))
        self._check_going()
        return snapshot.resume({"return_value": None})

    def _answer_of(self, tool: str, done: cf.Future[dict[str, Any]], by_script: bool) -> dict[str, Any]:
        """A finished call as the script gets it; a call that ran out of the script's own time
        is the script's timeout (``_TIMED_OUT``), whichever of the two the clock saw first."""
        answer = _settled_answer(tool, done)
        error = None if done.cancelled() else done.exception()
        if isinstance(error, JsonRpcError) and error.code == REQUEST_TIMEOUT:
            if by_script:
                return _TIMED_OUT
            answer["message"] += f" (codeMode.toolCallTimeout: {self._settings.tool_call_timeout:g}s)"
        return answer

    def _results_for(self, pending: list[int]) -> dict[int, Any]:
        """The results of the pending calls and sleeps that have landed, waiting for at least one."""
        wanted = set(pending)
        ready = {call_id: self._settled.pop(call_id) for call_id in list(self._settled) if call_id in wanted}
        block = not ready
        while True:
            now = time.monotonic()
            for call_id, wake in list(self._wakes.items()):
                if wake <= now:
                    del self._wakes[call_id]
                    if call_id in wanted:
                        ready[call_id] = {"return_value": None}
                        block = False
                    else:
                        self._settled[call_id] = {"return_value": None}
            wait = max(0.0, min([self._deadline.remaining(), *(wake - now for wake in self._wakes.values())]))
            try:
                landed = self._completions.get(timeout=wait) if block else self._completions.get_nowait()
            except queue.Empty:
                if not block:
                    return ready
                self._check_going()  # the deadline passed (or a sleep is up: the loop sees it)
                continue
            if landed is None:
                self._check_going()  # cancelled
                continue
            call_id, answer = landed
            self._finished(call_id, answer)
            if answer is _TIMED_OUT:
                raise self._out_of_time()
            if call_id in wanted:
                ready[call_id] = answer
                block = False
            else:
                self._settled[call_id] = answer

    def _finished(self, call_id: int, answer: Mapping[str, Any]) -> None:
        with self._lock:
            self._calls.pop(call_id, None)
            self._done += 1
        self._start_waiting()
        self._tell()

    def _tell(self) -> None:
        with self._lock:
            listener = self._listener
        if listener is not None:
            try:
                listener(self.progress())
            except Exception:  # noqa: BLE001 - a listener's failure must not stop the script
                logger.warning("script %s: progress not delivered", self.id, exc_info=True)

    def _unawaited(self) -> int:
        """Calls the script made and never awaited (finished or not), at its end: none
        waiting is started now, and those still under way are cancelled when the run ends."""
        with self._lock:
            never_started = len(self._waiting)
            self._waiting.clear()
        while True:
            try:
                landed = self._completions.get_nowait()
            except queue.Empty:
                break
            if landed is not None:
                self._finished(*landed)
                self._settled[landed[0]] = landed[1]
        with self._lock:
            return never_started + len(self._calls) + len(self._settled)

    def _end_calls(self) -> None:
        """The run is over: what it started and never awaited is cancelled at its backend."""
        with self._lock:
            calls = [call for _, call in self._calls.values()]
            self._calls.clear()
            self._waiting.clear()
        for call in calls:
            call.cancel()


def _named_call_tool(*args: Any, **kwargs: Any) -> None:
    """What ``call_tool`` is when a script names it without calling it: the sandbox calls
    it back as the host function ``call_tool``, which the run answers (never run here)."""
    raise AssertionError("answered by ScriptRun")


_named_call_tool.__name__ = CALL_TOOL  # the name the sandbox calls it back by


def _call_arguments(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[str, dict[str, Any], str | None]:
    """``call_tool(name, arguments=None)``'s arguments, or why they are not."""
    given = dict(kwargs)
    positional = list(args)
    unknown = set(given) - {"name", "arguments"}
    if unknown or len(positional) > 2:
        return "", {}, "call_tool(name, arguments) takes a tool's name and a dict of its arguments"
    name = positional.pop(0) if positional else given.pop("name", None)
    arguments = positional.pop(0) if positional else given.pop("arguments", None)
    if not isinstance(name, str) or not name:
        return "", {}, "call_tool: the first argument must be a tool's name (a string)"
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict) or not all(isinstance(key, str) for key in arguments):
        return "", {}, f"call_tool({name!r}, arguments): arguments must be a dict of the tool's arguments"
    return name, arguments, None


def _settled_answer(tool: str, done: cf.Future[dict[str, Any]]) -> dict[str, Any]:
    """A finished call as the script gets it: the tool's structured content or text, or
    an exception (a tool error, or the error a client calling it would get)."""
    if done.cancelled():
        return {"exc_type": "RuntimeError", "message": f"{tool}: the call was cancelled"}
    error = done.exception()
    if error is not None:
        return _raised(tool, error)
    return tool_value(tool, done.result())


def _raised(tool: str, error: BaseException) -> dict[str, Any]:
    if isinstance(error, JsonRpcError):
        return {"exc_type": "RuntimeError", "message": f"{error.message} (error {error.code})"}
    return {"exc_type": "RuntimeError", "message": f"{tool}: the call failed"}


def tool_value(tool: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """A tools/call result as ``call_tool`` returns it to a script."""
    texts = [block.get("text", "") for block in result.get("content") or () if isinstance(block, Mapping)
             and block.get("type") == "text"]
    if result.get("isError") is True:
        return {"exc_type": "RuntimeError", "message": f"{tool} failed: {' '.join(texts)[:2000] or 'tool error'}"}
    structured = result.get("structuredContent")
    if structured is not None:
        return {"return_value": structured}
    if texts:
        return {"return_value": "\n".join(texts)}
    return {"return_value": list(result.get("content") or [])}


def _explained(display: str, settings: CodeModeConfig) -> str:
    """The script's error, with the config field behind a limit it hit."""
    for marker, field in (("memory limit exceeded", f"codeMode.maxMemory ({settings.max_memory} bytes)"),
                          ("time limit exceeded", f"codeMode.executionTime ({settings.execution_time:g}s)"),
                          ("maximum recursion depth", f"codeMode.maxRecursionDepth ({settings.max_recursion_depth})"),
                          ("suspension limit", "its round trips to the gateway (tool calls, their results and "
                                               f"undefined names: 3 x codeMode.maxToolCalls + {SUSPENSIONS_SPARE})")):
        if marker in display:
            return f"{display}\nThe script hit a limit: {field}."
    return display


def failure(message: str, printed: str = "") -> dict[str, Any]:
    return {"content": [{"type": "text", "text": message}, *_printed_block(printed)], "isError": True}


def _printed_block(printed: str) -> list[dict[str, Any]]:
    """What the script printed, as the last text block of its result (none when nothing)."""
    return [{"type": "text", "text": "printed:\n" + printed}] if printed else []


def script_result(value: Any, printed: str = "", unawaited: int = 0) -> dict[str, Any]:
    """The script's final value as a tool result: structured where it is JSON (an object
    as is, anything else under ``result``), its text otherwise."""
    content: list[dict[str, Any]] = []
    result: dict[str, Any] = {"content": content, "isError": False}
    if isinstance(value, str):
        content.append({"type": "text", "text": value})
    elif _is_json(value):
        content.append({"type": "text", "text": json.dumps(value, ensure_ascii=False, separators=(",", ":"))})
        result["structuredContent"] = value if isinstance(value, dict) else {"result": value}
    else:
        content.append({"type": "text", "text": repr(value)})
    if unawaited:
        content.append({"type": "text", "text": f"note: {unawaited} call_tool(...) call(s) were never awaited (write "
                                                "`await call_tool(...)`); those still running were cancelled"})
    content.extend(_printed_block(printed))
    return result


def _is_json(value: Any, depth: int = 0) -> bool:
    if depth > 64:
        return False
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_is_json(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _is_json(item, depth + 1) for key, item in value.items())
    return False
