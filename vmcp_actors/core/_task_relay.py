"""A user's backends' tasks, relayed (``AggregatedBackends`` delegates here).

A call the client asked a task of (``requested_task``) goes to its backend as that
backend's revision asks: ``params.task`` for a 2025-11-25 backend whose tool takes tasks,
the extension in the request's capabilities for a 2026-07-28 one. A task in the answer
reaches the client under a handle, in the client's revision. ``tasks/*`` requests open the
handle (refused before any backend is asked when it is not this user's), go to the
backend that owns the task under its own id, and come back with handles again.

Translation: a 2025 client's ``tasks/result`` on a 2026-07-28 backend's task polls
``tasks/get`` (at the task's ``pollIntervalMs``, within the request's deadline) and asks
the client for the task's ``inputRequests`` on the result's stream (answered with
``tasks/update``); ``tasks/cancel`` answers the task as it then is. The other way round,
a 2025-11-25 backend asks its task's questions only on the stream of ``tasks/result``, and
once: a 2026-07-28 client's ``tasks/get`` that finds the task ``input_required`` opens that
stream until the questions come, leaves it (the task waits on at the backend), and holds
them in the record store (``AskedStore``) as the task's ``inputRequests`` until
``tasks/update`` answers them, on any worker: the answer is posted to the user's backend
session under the backend's own request id.
"""

from __future__ import annotations

import hashlib
import json
import queue
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from vmcp_actors.backends import BackendChannel, BackendRequest, CallOpened, InputRequired
from vmcp_actors.concurrency import Deadline, run_in_thread
from vmcp_actors.core._catalog import Catalog
from vmcp_actors.core._exchange import Exchange, drained, from_backend, to_jsonrpc_error
from vmcp_actors.core._pagination import paginate
from vmcp_actors.core._tasks import (
    LEGACY_TASK_METHODS,
    MODERN_TASK_METHODS,
    RELATED_TASK,
    TASKS_EXTENSION,
    TaskHandles,
    TaskRequest,
    task_failure,
    task_id_param,
)
from vmcp_actors.exceptions import BackendError
from vmcp_actors.identity import Identity
from vmcp_actors.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
    JsonRpcError,
)
from vmcp_actors.protocol.mcp import META_CLIENT_CAPABILITIES

# How often a 2026-07-28 task is polled for a 2025 client's tasks/result when the backend
# suggests nothing (and never more often than this).
POLL_EVERY = 0.5
POLL_AT_MOST_EVERY = 0.05
# How long a 2026-07-28 client's tasks/get waits for a 2025 backend's task to say what it
# asks (on the stream of its tasks/result), and for more questions after the first.
QUESTIONS_WAIT = 2.0
MORE_QUESTIONS_WAIT = 0.1
# How long questions are held when the task names no ttl (or a longer one).
QUESTIONS_KEPT = 3600.0


class AskedStore(Protocol):
    """Where the questions of 2025 backends' tasks wait for a 2026 client's answers."""

    def asked(self, key: str) -> dict[str, Any] | None: ...
    def put_asked(self, key: str, questions: dict[str, Any], ttl: float) -> None: ...


class _NothingHeld:
    def asked(self, key: str) -> dict[str, Any] | None:
        return None

    def put_asked(self, key: str, questions: dict[str, Any], ttl: float) -> None:
        pass


class TaskRelay:
    def __init__(self, channels: Mapping[str, BackendChannel], catalog: Callable[[Identity | None, Deadline], Catalog],
                 handles: TaskHandles, page_size: int = 100, asked: AskedStore | None = None):
        self._channels = channels
        self._catalog = catalog
        self._handles = handles
        self._page_size = page_size
        self._asked = asked if asked is not None else _NothingHeld()

    # -- calls ---------------------------------------------------------------------------

    def call_params(self, backend: str, tool: Mapping[str, Any] | None, params: dict[str, Any],
                    task: TaskRequest) -> dict[str, Any]:
        """A tools/call's params for ``backend`` when the client accepts a task (or waits
        for one: ``task.awaited``)."""
        if task.awaited:
            return self._declared(backend, params) if self.offers_tasks(backend) else params
        if self._channels[backend].speaks_modern():
            meta = dict(params.get("_meta") or {})
            meta[META_CLIENT_CAPABILITIES] = {"extensions": {TASKS_EXTENSION: {}}}
            return {**params, "_meta": meta}
        support = ((tool or {}).get("execution") or {}).get("taskSupport")
        if not task.modern or support in ("optional", "required"):
            return {**params, "task": dict(task.params)}
        return params

    def offers_tasks(self, backend: str) -> bool:
        """Whether ``backend`` speaks 2026-07-28 and declared the tasks extension."""
        extensions = self._channels[backend].capabilities().get("extensions")
        return self._channels[backend].speaks_modern() and isinstance(extensions, Mapping) \
            and TASKS_EXTENSION in extensions

    def unasked(self, identity: Identity | None, backend: str, exchange: Exchange, deadline: Deadline) -> Exchange:
        """A call the client accepted no task of: a backend that answers with a task anyway
        is waited for (within the request's deadline), so the client gets the result. A
        2025-11-25 backend's ``tasks/result`` carries the task's requests on the call's
        stream; a 2026-07-28 one is polled, its input requests asked of the client."""
        result = yield from exchange
        task = result if result.get("resultType") == "task" else result.get("task")
        task_id = task.get("taskId") if isinstance(task, Mapping) else None
        if not isinstance(task_id, str) or not task_id:
            return result
        if self._channels[backend].speaks_modern():
            answer = yield from self._await_result(identity, backend, task_id, deadline)
        else:
            answer = yield from self._request(identity, backend, "tasks/result", {"taskId": task_id}, deadline)
        meta = {key: value for key, value in (answer.get("_meta") or {}).items() if key != RELATED_TASK}
        return {**{key: value for key, value in answer.items() if key != "_meta"}, **({"_meta": meta} if meta else {})}

    def call(self, backend: str, exchange: Exchange, task: TaskRequest) -> Exchange:
        """A call the client accepts a task of: a task in its answer under a handle."""
        result = yield from self._handles.events(backend, exchange, task.modern)
        created = self._handles.created(backend, result, task.modern)
        return created if created is not None else result

    # -- tasks/* -------------------------------------------------------------------------

    def request(self, identity: Identity | None, method: str, params: dict[str, Any], modern: bool,
                deadline: Deadline) -> Exchange | dict[str, Any]:
        if method not in (MODERN_TASK_METHODS if modern else LEGACY_TASK_METHODS):
            raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
        if method == "tasks/list":
            return self.list(identity, params, deadline)
        handle = task_id_param(params)
        backend, task_id = self._handles.open(handle)
        if backend not in self._channels:
            raise JsonRpcError(INVALID_PARAMS, "Unknown task: its backend is not configured here")
        sent = {**params, "taskId": task_id}
        self._handshake(identity, backend, deadline)  # a worker that has not spoken to it yet learns its revision
        try:
            if self._channels[backend].speaks_modern():
                answer = self._modern_backend(identity, backend, method, sent, modern, deadline)
            elif modern:
                answer = self._legacy_backend_for_modern(identity, backend, method, sent, deadline)
            elif method == "tasks/result":
                answer = self._result(backend, self._request(identity, backend, method, sent, deadline))
            else:
                answer = self._answered(backend, self._request(identity, backend, method, sent, deadline), modern)
        except JsonRpcError as error:
            raise _naming(error, task_id, handle) from None
        return answer if isinstance(answer, dict) else _naming_failures(answer, task_id, handle)

    def _result(self, backend: str, exchange: Exchange) -> Exchange:
        result = yield from self._handles.events(backend, exchange, False)
        return self._handles.related(backend, result)

    def _answered(self, backend: str, exchange: Exchange, modern: bool) -> Exchange:
        result = yield from self._handles.events(backend, exchange, modern)
        return self._handles.task(backend, result, modern) if "taskId" in result else dict(result)

    def _modern_backend(self, identity, backend, method, sent, modern, deadline) -> Exchange | dict[str, Any]:
        if modern:  # the same revision: as it is, under handles
            return self._answered(backend, self._request(identity, backend, method, sent, deadline), True)
        if method == "tasks/get":
            return self._handles.task(backend, self._get(identity, backend, sent["taskId"], deadline), False)
        if method == "tasks/cancel":
            self._call(identity, backend, "tasks/cancel", {"taskId": sent["taskId"]}, deadline)
            return self._handles.task(backend, self._get(identity, backend, sent["taskId"], deadline), False)
        return self._await_result(identity, backend, sent["taskId"], deadline)

    def _legacy_backend_for_modern(self, identity, backend, method, sent, deadline) -> dict[str, Any]:
        """A 2026-07-28 client's request about a 2025-11-25 backend's task."""
        task_id = sent["taskId"]
        if method == "tasks/update":
            self._answer(identity, backend, task_id, sent.get("inputResponses"), deadline)
            return {"resultType": "complete"}
        if method == "tasks/cancel":
            self._call(identity, backend, "tasks/cancel", {"taskId": task_id}, deadline)
            self._asked.put_asked(self._asked_key(backend, task_id), {}, 0)
            return {"resultType": "complete"}
        task = self._handles.task(backend, self._call(identity, backend, "tasks/get", {"taskId": task_id}, deadline),
                                  True)
        if task.get("status") == "completed":
            task["result"] = self._handles.related(backend, self._call(identity, backend, "tasks/result",
                                                                       {"taskId": task_id}, deadline))
        elif task.get("status") == "input_required":
            questions = self._questions(identity, backend, task_id, task.get("ttlMs"), deadline)
            if questions:
                task["inputRequests"] = {key: asked["request"] for key, asked in questions.items()}
        return {**task, "resultType": "complete"}

    def _asked_key(self, backend: str, task_id: Any) -> str:
        return hashlib.sha256(json.dumps([self._handles.owner, backend, task_id]).encode()).hexdigest()

    def _questions(self, identity: Identity | None, backend: str, task_id: Any, ttl_ms: Any,
                   deadline: Deadline) -> dict[str, Any]:
        """key -> {"id": the backend's request id, "request": {method, params}}: what the
        task asks, held since it was first heard, or heard now."""
        key = self._asked_key(backend, task_id)
        held = self._asked.asked(key)
        if held:
            return held
        heard = self._hear_questions(identity, backend, task_id, deadline)
        if heard:
            keep = ttl_ms / 1000 if isinstance(ttl_ms, (int, float)) and ttl_ms > 0 else QUESTIONS_KEPT
            self._asked.put_asked(key, heard, min(keep, QUESTIONS_KEPT))
        return heard

    def _hear_questions(self, identity: Identity | None, backend: str, task_id: Any,
                        deadline: Deadline) -> dict[str, Any]:
        """Open the task's tasks/result until its requests come (or a short wait ends),
        then leave the stream: the backend sends each request once, and waits for its
        answer whether or not the stream is still open."""
        events: queue.Queue[Any] = queue.Queue()
        exchange = self._channels[backend].request(identity, "tasks/result", {"taskId": task_id}, deadline)

        def read() -> None:
            try:
                for event in exchange:
                    events.put(event)
            except Exception:  # noqa: BLE001 - the stream ended (left, or failed): nothing more is heard
                pass
            events.put(None)

        run_in_thread(read)
        heard: dict[str, Any] = {}
        opened: CallOpened | None = None
        wait = min(QUESTIONS_WAIT, max(0.0, deadline.remaining() - 1.0))
        try:
            while True:
                try:
                    event = events.get(timeout=MORE_QUESTIONS_WAIT if heard else wait)
                except queue.Empty:
                    return heard
                if event is None:
                    return heard
                if isinstance(event, CallOpened):
                    opened = event
                elif isinstance(event, BackendRequest) and event.id is not None:
                    params = dict(event.params)
                    meta = {name: value for name, value in (params.pop("_meta", None) or {}).items()
                            if name != RELATED_TASK}
                    if meta:
                        params["_meta"] = meta
                    heard[f"request-{event.id}"] = {"id": event.id, "request": {"method": event.method,
                                                                                "params": params}}
        finally:
            if opened is not None:
                opened.leave()

    def _answer(self, identity: Identity | None, backend: str, task_id: Any, responses: Any,
                deadline: Deadline) -> None:
        """A 2026-07-28 client's inputResponses to a 2025 backend's task: each held question
        answered under the backend's request id (keys it does not wait on are ignored)."""
        if not isinstance(responses, Mapping):
            raise JsonRpcError(INVALID_PARAMS, "inputResponses is required and must be an object")
        key = self._asked_key(backend, task_id)
        held = self._asked.asked(key) or {}
        answered = [name for name in responses if name in held]
        for name in answered:
            try:
                self._channels[backend].answer(identity, held[name]["id"], {"result": responses[name]}, deadline)
            except BackendError as error:
                raise to_jsonrpc_error(error) from None
        if answered:
            self._asked.put_asked(key, {name: asked for name, asked in held.items() if name not in answered},
                                  QUESTIONS_KEPT)

    def _await_result(self, identity: Identity | None, backend: str, task_id: Any, deadline: Deadline,
                      asked: frozenset[str] = frozenset()) -> Exchange:
        """A 2025 client's tasks/result of a 2026-07-28 task: poll until it ends; its input
        requests go to the client on this stream (each key once) and back with tasks/update."""
        while True:
            task = self._get(identity, backend, task_id, deadline)
            status = task.get("status")
            if status == "completed":
                return self._handles.related(backend, dict(task.get("result") or {}))
            if status == "failed":
                raise task_failure(task.get("error"), "the task failed")
            if status == "cancelled":
                raise JsonRpcError(INTERNAL_ERROR, "The task was cancelled")
            requests = task.get("inputRequests") if status == "input_required" else None
            fresh = {key: self._related(backend, task_id, value) for key, value in (requests or {}).items()
                     if key not in asked and isinstance(value, Mapping)} if isinstance(requests, Mapping) else {}
            if fresh:
                yield InputRequired(backend, "tasks/update", MappingProxyType({"taskId": task_id}),
                                    MappingProxyType(fresh), None,
                                    self._updater(identity, backend, task_id, deadline, asked | set(fresh)), deadline)
                return {}  # not reached: the client's side drives the retry
            interval = task.get("pollIntervalMs")
            wait = max(interval / 1000, POLL_AT_MOST_EVERY) if isinstance(interval, (int, float)) else POLL_EVERY
            if deadline.remaining() <= wait:
                raise JsonRpcError(REQUEST_TIMEOUT, "Request timed out: the task did not end within the request's "
                                                    "deadline")
            time.sleep(wait)

    def _related(self, backend: str, task_id: Any, request: Mapping[str, Any]) -> dict[str, Any]:
        """An input request of a task as 2025-11-25 asks it: tied to the task by its handle."""
        params = dict(request.get("params") or {})
        params["_meta"] = {**(params.get("_meta") or {}), RELATED_TASK: {"taskId": self._handles.handle(backend, task_id)}}
        return {**request, "params": params}

    def _updater(self, identity, backend, task_id, deadline, asked):
        def update(responses: Mapping[str, Any]) -> Exchange:
            self._call(identity, backend, "tasks/update", {"taskId": task_id, "inputResponses": dict(responses)},
                       deadline)
            return (yield from self._await_result(identity, backend, task_id, deadline, frozenset(asked)))

        return update

    def list(self, identity: Identity | None, params: dict[str, Any], deadline: Deadline,
             first: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
        """A page of ``first`` (the gateway's own tasks) and every task of this user's 2025
        backends that list tasks (all their pages), under handles."""
        catalog = self._catalog(identity, deadline)
        tasks: list[dict[str, Any]] = list(first)
        for backend, found in sorted(catalog.backends.items()):
            capability = found.capabilities.get("tasks")
            if not isinstance(capability, Mapping) or "list" not in capability \
                    or self._channels[backend].speaks_modern():
                continue
            cursor = None
            for _ in range(100):  # pages
                page = self._call(identity, backend, "tasks/list", {"cursor": cursor} if cursor else {}, deadline)
                tasks.extend(self._handles.task(backend, task, False) for task in page.get("tasks") or ()
                             if isinstance(task, Mapping))
                cursor = page.get("nextCursor")
                if not isinstance(cursor, str) or not cursor:
                    break
        return paginate(tuple(tasks), "tasks", params, self._page_size)

    # -- backend requests ------------------------------------------------------------------

    def _get(self, identity: Identity | None, backend: str, task_id: Any, deadline: Deadline) -> dict[str, Any]:
        return self._call(identity, backend, "tasks/get", {"taskId": task_id}, deadline)

    def _call(self, identity, backend, method, params, deadline) -> dict[str, Any]:
        return drained(self._channels[backend].request(identity, method, self._declared(backend, params), deadline))

    def _request(self, identity, backend, method, params, deadline) -> Exchange:
        return from_backend(self._channels[backend].request(identity, method, self._declared(backend, params),
                                                            deadline), backend)

    def _handshake(self, identity: Identity | None, backend: str, deadline: Deadline) -> None:
        try:
            self._channels[backend].handshake(identity, deadline)
        except BackendError as error:
            raise to_jsonrpc_error(error) from None

    def _declared(self, backend: str, params: dict[str, Any]) -> dict[str, Any]:
        """A tasks/* request's params: to a 2026-07-28 backend, with the extension declared."""
        if not self._channels[backend].speaks_modern():
            return params
        meta = dict(params.get("_meta") or {})
        meta[META_CLIENT_CAPABILITIES] = {"extensions": {TASKS_EXTENSION: {}}}
        return {**params, "_meta": meta}


def _naming(error: JsonRpcError, task_id: Any, handle: str) -> JsonRpcError:
    """A backend's error about its task, naming the task as the client knows it."""
    if isinstance(task_id, str) and task_id and task_id in error.message:
        return JsonRpcError(error.code, error.message.replace(task_id, handle), error.data, http_status=error.http_status)
    return error


def _naming_failures(exchange: Exchange, task_id: Any, handle: str) -> Exchange:
    try:
        return (yield from exchange)
    except JsonRpcError as error:
        raise _naming(error, task_id, handle) from None

