"""An official-SDK backend for the composite-tool tests: an issue tracker whose tools let a
test see what a workflow did, and steer it deterministically.

:func:`workflow_backend` builds and starts one (a :class:`WorkflowBackend`); ``tools``
picks a subset of :data:`WORKFLOW_TOOLS`. Every tool records its call in
``backend.calls`` before doing anything else, and structured answers name the backend,
so a test proves which backend a step reached and with which (typed) arguments.

Coordination goes through :class:`BackendState` (``backend.state``), never through
sleeps: ``meet`` waits on a barrier the test sets up (so only truly concurrent calls
succeed), ``wait`` blocks until the test releases its key, ``label`` with ``of > 0``
finishes its items in reverse order, ``flaky`` fails twice per key.

This module does not use ``from __future__ import annotations``: the SDK reads the tool
functions' annotations (``Context``, pydantic strict types) at registration time.
"""

import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Strict, StrictBool, StrictFloat, StrictInt

from tests.backends import SdkBackend

WORKFLOW_TOOLS = (
    "get_issue", "shout", "two_texts", "add", "meet", "label", "flaky", "broken", "wait", "strict", "note",
)

# MCP ToolAnnotations for the tools (``note`` and ``strict`` have none: the MCP defaults apply).
READ_ONLY = {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False}
DESTRUCTIVE = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": False}
TOOL_ANNOTATIONS: dict[str, dict[str, bool]] = {
    "get_issue": READ_ONLY, "shout": READ_ONLY, "two_texts": READ_ONLY, "add": READ_ONLY,
    "meet": READ_ONLY, "wait": READ_ONLY, "flaky": READ_ONLY, "broken": READ_ONLY,
    "label": DESTRUCTIVE,
}

BLOCK_LIMIT = 10.0  # longest a tool waits on a test's gate or ordering (released at teardown)


class Spec(BaseModel):
    """The nested argument of ``strict``: no strings where numbers or booleans belong."""

    model_config = ConfigDict(strict=True)
    depth: int
    tags: list[bool]


@dataclass(frozen=True)
class Call:
    tool: str
    arguments: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


class BackendState:
    """What the tools share with the test. Thread-safe (sync tools run on worker threads)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._calls: list[Call] = []
        self._barriers: dict[str, threading.Barrier] = {}
        self._gates: dict[str, threading.Event] = {}
        self._entered: dict[str, threading.Event] = {}
        self._attempts: Counter = Counter()
        self._finished_labels: set[int] = set()

    # -- seen by the test ------------------------------------------------------------------

    @property
    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def calls_of(self, tool: str) -> list[Call]:
        return [call for call in self.calls if call.tool == tool]

    def expect_meeting(self, group: str, parties: int, timeout: float = 5.0) -> None:
        """``meet(group)`` succeeds only once ``parties`` calls wait at the same time."""
        with self._lock:
            self._barriers[group] = threading.Barrier(parties, timeout=timeout)

    def wait_entered(self, key: str, timeout: float = 5.0) -> bool:
        """Whether ``wait(key)`` has been called (within ``timeout``)."""
        return self._event(self._entered, key).wait(timeout)

    def release(self, key: str) -> None:
        self._event(self._gates, key).set()

    def reset(self) -> None:
        """Forget calls and counters; let every blocked tool go (between tests)."""
        with self._lock:
            for gate in self._gates.values():
                gate.set()
            for barrier in self._barriers.values():
                barrier.abort()
            self._calls.clear()
            self._barriers.clear()
            self._gates.clear()
            self._entered.clear()
            self._attempts.clear()
            self._finished_labels.clear()
            self._lock.notify_all()

    # -- used by the tools -----------------------------------------------------------------

    def record(self, tool: str, **arguments: Any) -> None:
        with self._lock:
            self._calls.append(Call(tool, arguments))

    def barrier(self, group: str) -> threading.Barrier | None:
        with self._lock:
            return self._barriers.get(group)

    def gate(self, key: str) -> threading.Event:
        self._event(self._entered, key).set()
        return self._event(self._gates, key)

    def attempt(self, key: str) -> int:
        with self._lock:
            self._attempts[key] += 1
            return self._attempts[key]

    def finish_label_in_reverse(self, pos: int, of: int) -> bool:
        """Wait until every later position finished, then mark ``pos`` finished."""
        with self._lock:
            later = set(range(pos + 1, of))
            if not self._lock.wait_for(lambda: later <= self._finished_labels, timeout=BLOCK_LIMIT):
                return False
            self._finished_labels.add(pos)
            self._lock.notify_all()
            return True

    def _event(self, events: dict[str, threading.Event], key: str) -> threading.Event:
        with self._lock:
            return events.setdefault(key, threading.Event())


class WorkflowBackend(SdkBackend):
    """A served workflow backend; ``.state`` is its :class:`BackendState`."""

    def __init__(self, name: str, server: Any, state: BackendState) -> None:
        super().__init__(name, server)
        self.state = state

    @property
    def calls(self) -> list[Call]:
        return self.state.calls

    def stop(self) -> None:
        self.state.reset()  # blocked tools return, so the server stops at once
        super().stop()


def workflow_backend(name: str, tools: Iterable[str] | None = None) -> WorkflowBackend:
    """A started backend with ``tools`` (default: all of :data:`WORKFLOW_TOOLS`):

    * ``get_issue(number)`` -> ``{backend, number, title: "<Backend> issue <n>", state: "open",
      labels: ["bug", "ui"], items: [n, n+1, n+2]}`` (no ``assignee`` key);
    * ``shout(text)`` -> the text ``"TEXT!"`` (unstructured: no structuredContent);
    * ``two_texts(text)`` -> two text contents, ``text`` and ``text`` reversed;
    * ``add(a, b)`` -> ``{backend, sum}``;
    * ``meet(group, value=0)`` -> ``{backend, group, value}`` once the barrier of
      ``state.expect_meeting(group, parties)`` is passed; an error if it breaks;
    * ``label(id, pos, of=0)`` -> ``{backend, id, pos, labelled: true}``; with ``of``, waits
      until positions ``pos+1 .. of-1`` finished (items finish in reverse order);
    * ``flaky(key)`` -> an error on the first two calls per key, then ``{backend, key, attempts}``;
    * ``broken(reason="on purpose")`` -> always an error ``"broken: <reason>"``;
    * ``wait(key)`` -> blocks until ``state.release(key)``, then ``{backend, key}``;
    * ``strict(count, flag, ratio, ids, spec)`` -> the arguments with their Python type
      names; strict pydantic types refuse strings for numbers and booleans;
    * ``note(text)`` -> ``{backend, text}`` (no annotations).
    """
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import TextContent, ToolAnnotations

    wanted = set(WORKFLOW_TOOLS if tools is None else tools)
    unknown = wanted - set(WORKFLOW_TOOLS)
    if unknown:
        raise ValueError(f"unknown workflow tools {sorted(unknown)}; choose from {WORKFLOW_TOOLS}")
    state = BackendState()
    server = MCPServer(name, instructions=f"workflow test backend {name}", version="0.0.1", log_level="WARNING")

    def get_issue(number: int) -> dict[str, Any]:
        """Fetch an issue."""
        state.record("get_issue", number=number)
        return {"backend": name, "number": number, "title": f"{name.capitalize()} issue {number}",
                "state": "open", "labels": ["bug", "ui"], "items": [number, number + 1, number + 2]}

    def shout(text: str):  # no return annotation: unstructured text
        """Upper-case the text and add an exclamation mark."""
        state.record("shout", text=text)
        return f"{text.upper()}!"

    def two_texts(text: str) -> list[TextContent]:
        """Two text contents: the text, then the text reversed."""
        state.record("two_texts", text=text)
        return [TextContent(type="text", text=text), TextContent(type="text", text=text[::-1])]

    def add(a: int, b: int) -> dict[str, Any]:
        """Add two integers."""
        state.record("add", a=a, b=b)
        return {"backend": name, "sum": a + b}

    def meet(group: str, value: int = 0) -> dict[str, Any]:
        """Wait at the test's barrier for `group`."""
        state.record("meet", group=group, value=value)
        barrier = state.barrier(group)
        if barrier is None:
            raise ToolError(f"no meeting expected for group {group!r}")
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            raise ToolError(f"meeting {group!r} broke: the other parties did not arrive in time") from None
        return {"backend": name, "group": group, "value": value}

    def label(id: str, pos: int, of: int = 0) -> dict[str, Any]:
        """Label an item (destructive)."""
        state.record("label", id=id, pos=pos, of=of)
        if of and not state.finish_label_in_reverse(pos, of):
            raise ToolError(f"label {pos}: the later items never finished")
        return {"backend": name, "id": id, "pos": pos, "labelled": True}

    def flaky(key: str) -> dict[str, Any]:
        """Fails twice per key, then succeeds."""
        state.record("flaky", key=key)
        attempt = state.attempt(key)
        if attempt <= 2:
            raise ToolError(f"flaky {key}: attempt {attempt} failed")
        return {"backend": name, "key": key, "attempts": attempt}

    def broken(reason: str = "on purpose") -> dict[str, Any]:
        """Always fails."""
        state.record("broken", reason=reason)
        raise ToolError(f"broken: {reason}")

    def wait(key: str) -> dict[str, Any]:
        """Block until the test releases `key`."""
        state.record("wait", key=key)
        released = state.gate(key).wait(BLOCK_LIMIT)
        return {"backend": name, "key": key, "released": released}

    def strict(count: Annotated[int, Strict()], flag: StrictBool, ratio: StrictFloat, ids: list[StrictInt],
               spec: Spec) -> dict[str, Any]:
        """Strictly typed arguments: strings are refused where numbers or booleans belong."""
        received = {"count": count, "flag": flag, "ratio": ratio, "ids": ids, "spec": spec.model_dump()}
        state.record("strict", **received)
        return {"backend": name, **received,
                "types": [type(count).__name__, type(flag).__name__, type(ratio).__name__]}

    def note(text: str) -> dict[str, Any]:
        """Take a note (no annotations)."""
        state.record("note", text=text)
        return {"backend": name, "text": text}

    for fn in (get_issue, shout, two_texts, add, meet, label, flaky, broken, wait, strict, note):
        if fn.__name__ not in wanted:
            continue
        hints = TOOL_ANNOTATIONS.get(fn.__name__)
        server.add_tool(fn, annotations=ToolAnnotations(**hints) if hints else None,
                        structured_output=False if fn is shout else None)
    backend = WorkflowBackend(name, server, state)
    backend.start()
    return backend


__all__ = [
    "DESTRUCTIVE",
    "READ_ONLY",
    "TOOL_ANNOTATIONS",
    "WORKFLOW_TOOLS",
    "BackendState",
    "Call",
    "Spec",
    "WorkflowBackend",
    "workflow_backend",
]
