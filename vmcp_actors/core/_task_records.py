"""The gateway's own tasks (composite tools run as tasks), as records any worker can read.

A ``TaskRecord`` is what a client may learn of one task, whichever worker it asks: its
state, a status message naming the step in progress, the questions it waits on, and its
result or error once it ended. The worker that runs the task writes it (``runner`` names
that worker, so another one can tell a task whose runner died from a slow one); a
``tasks/update`` or ``tasks/cancel`` on any worker writes it too. Records live in the
record store (memory, or Redis for several workers) until ``expires``.

The state is kept as 2026-07-28 has it (a tool error is ``completed`` with ``isError``);
``legacy_status`` is what a 2025-11-25 client is told (such a task is ``failed`` there).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Protocol

from vmcp_actors.core._tasks import TERMINAL

WORKING = "working"
INPUT_REQUIRED = "input_required"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
STATUSES = (WORKING, INPUT_REQUIRED, COMPLETED, FAILED, CANCELLED)


def iso(wall: float) -> str:
    """A wall time as MCP's timestamps have it: ISO 8601, UTC, to the millisecond."""
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class TaskRecord:
    task_id: str  # the gateway's own id (clients see it only inside a sealed handle)
    owner: str  # the caller it is sealed to (a digest: person and passthrough headers)
    user: str  # for operators: the subject, never a token
    tool: str  # the composite tool it runs
    runner: str  # the worker process that runs it
    status: str
    status_message: str
    created: float  # time.time()
    updated: float
    expires: float  # the record is gone after this (time.time())
    ttl_ms: int  # what clients are told: the result is kept at least this long
    poll_interval_ms: int
    input_requests: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    result: Mapping[str, Any] | None = None  # the CallToolResult, once completed
    error: Mapping[str, Any] | None = None  # a JSON-RPC error object, once failed

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def legacy_status(self) -> str:
        """2025-11-25 counts a tool error as ``failed``."""
        if self.status == COMPLETED and self.result is not None and self.result.get("isError"):
            return FAILED
        return self.status

    def task(self, handle: str, *, modern: bool) -> dict[str, Any]:
        """The Task a client is told (in its revision), under ``handle``."""
        task: dict[str, Any] = {"taskId": handle, "status": self.status if modern else self.legacy_status}
        if self.status_message:
            task["statusMessage"] = self.status_message
        task.update(createdAt=iso(self.created), lastUpdatedAt=iso(self.updated))
        if modern:
            task.update(ttlMs=self.ttl_ms, pollIntervalMs=self.poll_interval_ms)
        else:
            task.update(ttl=self.ttl_ms, pollInterval=self.poll_interval_ms)
        return task

    def detailed(self, handle: str) -> dict[str, Any]:
        """2026-07-28's DetailedTask: the Task and what its status carries."""
        task = self.task(handle, modern=True)
        if self.status == INPUT_REQUIRED and self.input_requests:
            task["inputRequests"] = _plain(self.input_requests)
        elif self.status == COMPLETED and self.result is not None:
            task["result"] = _plain(self.result)
        elif self.status == FAILED and self.error is not None:
            task["error"] = _plain(self.error)
        return task

    # -- changes (each returns a new record; a terminal record never changes again) ------

    def progressed(self, message: str, input_requests: Mapping[str, Any], now: float) -> TaskRecord:
        if self.terminal:
            return self
        return replace(self, status=INPUT_REQUIRED if input_requests else WORKING, status_message=message,
                       input_requests=input_requests, updated=now)

    def answered(self, keys: set[str], now: float) -> TaskRecord:
        """The questions under ``keys`` are answered (the runner is told separately)."""
        if self.terminal or not keys & set(self.input_requests):
            return self
        left = {key: value for key, value in self.input_requests.items() if key not in keys}
        return replace(self, status=INPUT_REQUIRED if left else WORKING, input_requests=left, updated=now)

    def ended(self, status: str, message: str, now: float, *,
              result: Mapping[str, Any] | None = None, error: Mapping[str, Any] | None = None) -> TaskRecord:
        """Kept ``ttl_ms`` from now."""
        if self.terminal:
            return self
        return replace(self, status=status, status_message=message, input_requests={}, result=result, error=error,
                       updated=now, expires=now + self.ttl_ms / 1000)

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_requests", MappingProxyType(dict(self.input_requests)))

    # -- JSON ---------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"taskId": self.task_id, "owner": self.owner, "user": self.user, "tool": self.tool,
                "runner": self.runner, "status": self.status, "statusMessage": self.status_message,
                "created": self.created, "updated": self.updated, "expires": self.expires, "ttlMs": self.ttl_ms,
                "pollIntervalMs": self.poll_interval_ms, "inputRequests": _plain(self.input_requests),
                "result": _plain(self.result), "error": _plain(self.error)}

    @classmethod
    def from_json(cls, data: Any) -> TaskRecord:
        if not isinstance(data, Mapping) or data.get("status") not in STATUSES:
            raise ValueError("a task record is an object with a known status")
        for name in ("taskId", "owner", "user", "tool", "runner", "statusMessage"):
            if not isinstance(data.get(name), str):
                raise ValueError(f"a task record's {name} must be a string")
        if not all(isinstance(data.get(name), (int, float)) for name in ("created", "updated", "expires")):
            raise ValueError("a task record's times must be numbers")
        if not all(isinstance(data.get(name), int) for name in ("ttlMs", "pollIntervalMs")):
            raise ValueError("a task record's ttlMs and pollIntervalMs must be integers")
        for name in ("inputRequests", "result", "error"):
            if data.get(name) is not None and not isinstance(data[name], Mapping):
                raise ValueError(f"a task record's {name} must be an object")
        return cls(task_id=data["taskId"], owner=data["owner"], user=data["user"], tool=data["tool"],
                   runner=data["runner"], status=data["status"], status_message=data["statusMessage"],
                   created=float(data["created"]), updated=float(data["updated"]), expires=float(data["expires"]),
                   ttl_ms=data["ttlMs"], poll_interval_ms=data["pollIntervalMs"],
                   input_requests=data.get("inputRequests") or {}, result=data.get("result"),
                   error=data.get("error"))


class TaskStore(Protocol):
    """Where task records live (the record store: memory, or Redis shared by workers)."""

    def task(self, task_id: str) -> TaskRecord | None: ...
    def put_task(self, record: TaskRecord) -> None: ...
    def update_task(self, task_id: str, change: Callable[[TaskRecord], TaskRecord]) -> TaskRecord | None: ...
    def tasks_of(self, owner: str) -> list[TaskRecord]: ...
    def live_tasks_of(self, owner: str) -> list[TaskRecord]: ...  # not ended, as their records say


def _plain(value: Any) -> Any:
    """A JSON copy (records share nothing mutable with their readers)."""
    return None if value is None else json.loads(json.dumps(value, default=dict))
