"""MCP tasks through the gateway: a backend's task reaches the client under a handle of
the gateway's, and the client's ``tasks/*`` requests reach the backend under its own id.

Two revisions name the same thing differently:

* 2025-11-25 (experimental tasks): the client asks for a task with ``params.task`` on
  ``tools/call``; the answer is ``{"task": Task}``; ``tasks/get``, ``tasks/result``
  (blocks until the task ends, and carries the task's requests for the client),
  ``tasks/list`` and ``tasks/cancel``; ``notifications/tasks/status``. A Task has ``ttl``
  and ``pollInterval``.
* 2026-07-28 (the extension ``io.modelcontextprotocol/tasks``): a client that declares the
  extension may get ``{"resultType": "task", ...Task}``; ``tasks/get`` (the result, error
  or ``inputRequests`` inline), ``tasks/update`` (``inputResponses``), ``tasks/cancel``;
  ``notifications/tasks``. A Task has ``ttlMs`` and ``pollIntervalMs``.

``TaskHandles`` makes a handle from (backend, the backend's task id) sealed to one user
(``Signer.seal_handle``: the same text each time, so an answer and a notification about
one task name it alike), and opens one: a forged handle, or one made for another user, is
refused before any backend is asked. ``requested_task`` is the task the client asked of
the call being dispatched, read where the backend request is made.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from vmcp_actors.core._exchange import Exchange, Notification, ServerRequest
from vmcp_actors.protocol import INTERNAL_ERROR, INVALID_PARAMS, JsonRpcError
from vmcp_actors.protocol.mcp import MISSING_REQUIRED_CLIENT_CAPABILITY
from vmcp_actors.signing import Signer, Unsealable

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
RELATED_TASK = "io.modelcontextprotocol/related-task"
LEGACY_TASK_METHODS = frozenset({"tasks/get", "tasks/result", "tasks/list", "tasks/cancel"})
MODERN_TASK_METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})
TASK_STATUS_NOTIFICATIONS = frozenset({"notifications/tasks/status", "notifications/tasks"})
HANDLE_PURPOSE = "task"
# The same fields under each revision's names.
_LEGACY_NAMES = {"ttlMs": "ttl", "pollIntervalMs": "pollInterval"}
_MODERN_NAMES = {legacy: modern for modern, legacy in _LEGACY_NAMES.items()}
TERMINAL = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True)
class TaskRequest:
    """A client's consent to get a task for the call being dispatched: a 2025-11-25
    session's ``params.task`` (``legacy``), or a 2026-07-28 client that declared the
    extension."""

    modern: bool
    params: Mapping[str, Any]  # a 2025 client's params.task ({"ttl": ...}); {} for a 2026 one
    # A 2025 client that asked no task: a 2026-07-28 backend that offers tasks is told the
    # extension (its task-only tools answer then) and its task is waited for.
    awaited: bool = False


requested_task: ContextVar[TaskRequest | None] = ContextVar("requested_task", default=None)


@contextmanager
def task_requested(task: TaskRequest) -> Iterator[None]:
    """``requested_task`` is ``task`` while the call is dispatched (its backend request made)."""
    token = requested_task.set(task)
    try:
        yield
    finally:
        requested_task.reset(token)


def declares_tasks(client_capabilities: Mapping[str, Any]) -> bool:
    """Whether a 2026-07-28 request's capabilities declare the tasks extension."""
    extensions = client_capabilities.get("extensions")
    return isinstance(extensions, Mapping) and TASKS_EXTENSION in extensions


def tasks_extension_required() -> JsonRpcError:
    """What a 2026-07-28 client that did not declare the extension gets for tasks."""
    return JsonRpcError(MISSING_REQUIRED_CLIENT_CAPABILITY, "Missing required client capability",
                        {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}})


class TaskHandles:
    """Handles of one user's backend tasks (thread-safe: it keeps nothing)."""

    def __init__(self, signer: Signer, owner: str):
        self._signer = signer
        self._owner = owner  # the user the handles are sealed to

    @property
    def owner(self) -> str:
        return self._owner

    def handle(self, backend: str, task_id: Any) -> str:
        return self._signer.seal_handle(HANDLE_PURPOSE, {"b": backend, "t": task_id, "u": self._owner})

    def open(self, handle: Any) -> tuple[str, Any]:
        """(backend, its task id); -32602 for a handle that is not this user's."""
        if not isinstance(handle, str) or not handle:
            raise JsonRpcError(INVALID_PARAMS, "taskId is required and must be a string")
        try:
            sealed = self._signer.open_handle(HANDLE_PURPOSE, handle)
        except Unsealable:
            raise JsonRpcError(INVALID_PARAMS, "Unknown task: not issued by this gateway") from None
        if sealed.get("u") != self._owner or not isinstance(sealed.get("b"), str):
            raise JsonRpcError(INVALID_PARAMS, "Unknown task: it was issued to another caller")
        return sealed["b"], sealed.get("t")

    # -- what goes to the client -----------------------------------------------------------

    def task(self, backend: str, task: Mapping[str, Any], modern: bool) -> dict[str, Any]:
        """A backend's Task (any shape) in the client's revision, under its handle."""
        shaped = to_modern(task) if modern else to_legacy(task)
        if "taskId" in shaped:
            shaped["taskId"] = self.handle(backend, shaped["taskId"])
        return self.related(backend, shaped)

    def created(self, backend: str, result: Mapping[str, Any], modern: bool) -> dict[str, Any] | None:
        """A call's answer when it is a task (either revision's shape), as the client's
        revision says it; None when the answer is not a task."""
        if result.get("resultType") == "task":
            task: Mapping[str, Any] = result
        elif isinstance(result.get("task"), Mapping) and "taskId" in result["task"]:
            task = result["task"]
        else:
            return None
        shaped = self.task(backend, task, modern)
        if modern:
            return {**shaped, "resultType": "task"}
        meta = result.get("_meta")
        return {"task": shaped, **({"_meta": self.related(backend, {"_meta": meta})["_meta"]}
                                   if isinstance(meta, Mapping) else {})}

    def related(self, backend: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with its ``_meta`` related-task id as a handle."""
        copied = dict(params)
        meta = copied.get("_meta")
        if isinstance(meta, Mapping) and isinstance(meta.get(RELATED_TASK), Mapping) \
                and "taskId" in meta[RELATED_TASK]:
            related = dict(meta[RELATED_TASK])
            related["taskId"] = self.handle(backend, related["taskId"])
            copied["_meta"] = {**meta, RELATED_TASK: related}
        return copied

    def events(self, backend: str, exchange: Exchange, modern: bool) -> Exchange:
        """``exchange`` with every task id it streams as a handle: the requests it carries
        for the client (an elicitation of a task waiting for input) and status
        notifications."""
        try:
            while True:
                try:
                    event = next(exchange)
                except StopIteration as answered:
                    return answered.value
                yield self.event(backend, event, modern)
        finally:
            exchange.close()

    def event(self, backend: str, event: Any, modern: bool) -> Any:
        if isinstance(event, ServerRequest):
            return ServerRequest(event.method, self.related(backend, event.params), event.respond, event.origin)
        if isinstance(event, Notification):
            return Notification(self.notification(backend, event.message, modern), event.origin)
        return event

    def notification(self, backend: str, message: Mapping[str, Any], modern: bool) -> dict[str, Any]:
        """A backend notification with its task ids as handles (a status notification
        in the client's revision)."""
        params = message.get("params")
        if not isinstance(params, Mapping):
            return dict(message)
        if message.get("method") in TASK_STATUS_NOTIFICATIONS and "taskId" in params:
            method = "notifications/tasks" if modern else "notifications/tasks/status"
            return {**message, "method": method, "params": self.task(backend, params, modern)}
        return {**message, "params": self.related(backend, params)}


def to_legacy(task: Mapping[str, Any]) -> dict[str, Any]:
    """A Task as 2025-11-25 has it (``ttl``, ``pollInterval``; nothing inline)."""
    shaped = {key: value for key, value in task.items()
              if key not in ("resultType", "result", "error", "inputRequests")}
    for modern, legacy in _LEGACY_NAMES.items():
        if modern in shaped:
            shaped[legacy] = shaped.pop(modern)
    if "ttl" not in shaped:
        shaped["ttl"] = None
    return shaped


def to_modern(task: Mapping[str, Any]) -> dict[str, Any]:
    """A Task as 2026-07-28 has it (``ttlMs``, ``pollIntervalMs``)."""
    shaped = {key: value for key, value in task.items() if key != "resultType"}
    for legacy, modern in _MODERN_NAMES.items():
        if legacy in shaped:
            shaped[modern] = shaped.pop(legacy)
    if "ttlMs" not in shaped:
        shaped["ttlMs"] = None
    return shaped


def task_failure(error: Any, default_message: str) -> JsonRpcError:
    """A failed task's ``error`` object (either revision) as the error its request raises."""
    error = error if isinstance(error, Mapping) else {}
    return JsonRpcError(error.get("code", INTERNAL_ERROR), str(error.get("message", default_message)),
                        error.get("data"))


def task_id_param(params: Mapping[str, Any]) -> Any:
    task_id = params.get("taskId")
    if not isinstance(task_id, str) or not task_id:
        raise JsonRpcError(INVALID_PARAMS, "taskId is required and must be a string")
    return task_id
