"""A backend MCP server for protocol revision 2026-07-28 with the tasks extension
(``io.modelcontextprotocol/tasks``, SEP-2663), written by hand for the test suite.

The official SDK has no tasks extension, so this server speaks the wire itself (Starlette on
a loopback port, like the raw backends of tests/backends.py), following the spec as written:

* Stateless Streamable HTTP of 2026-07-28: every JSON-RPC request is its own POST; no
  ``initialize``, no sessions (``GET``/``DELETE`` 405). Each request is checked in this order:
  an ``MCP-Protocol-Version`` header naming another revision (or none, on a request without the
  2026 envelope: a 2025 ``initialize``) is -32022 UnsupportedProtocolVersion; ``params._meta``
  without ``io.modelcontextprotocol/protocolVersion`` and ``.../clientCapabilities`` is -32602;
  a missing or disagreeing ``MCP-Protocol-Version``, ``Mcp-Method`` or ``Mcp-Name`` header is
  -32020 HeaderMismatch (``Mcp-Name`` is ``params.name`` for ``tools/call`` and
  ``prompts/get``, ``params.uri`` for ``resources/read`` and ``params.taskId`` for
  ``tasks/get``, ``tasks/update`` and ``tasks/cancel``; ``=?base64?...?=`` values are decoded
  first); an unknown method is -32601 (``tasks/result`` and ``tasks/list`` too: the extension
  removed them). HTTP status: 400 for -32700/-32600/-32602/-32020/-32021/-32022, 404 for
  -32601, 200 otherwise. A present ``Origin`` that is not a loopback host gets 403.
* ``server/discover`` declares ``capabilities.extensions["io.modelcontextprotocol/tasks"] = {}``
  (and ``tools``). Capabilities are read per request from
  ``_meta["io.modelcontextprotocol/clientCapabilities"]``: a request "declares tasks" when its
  ``extensions`` hold the tasks key. No state carries over between requests.
* A tool that supports tasks answers a declaring ``tools/call`` with a ``CreateTaskResult``
  (``resultType: "task"``, the flat Task: ``taskId``, ``status``, ``statusMessage``,
  ``createdAt``/``lastUpdatedAt`` (ISO 8601, UTC), ``ttlMs``, ``pollIntervalMs``); the task
  is stored before the answer is sent, so an immediate ``tasks/get`` finds it. Without the
  declaration the tool runs synchronously if it can (``optional``), or the call is -32021 with
  ``data.requiredCapabilities.extensions["io.modelcontextprotocol/tasks"] = {}``
  (``required``). Tools that ask the user also need ``elicitation`` declared (else -32021
  naming it). The legacy ``task`` param of ``tools/call`` is ignored.
* ``tasks/get`` answers the DetailedTask (``inputRequests`` when ``input_required``,
  ``result`` - the CallToolResult - when ``completed``, ``error`` - a JSON-RPC error object -
  when ``failed``) with ``resultType: "complete"``; ``tasks/update`` (``inputResponses``) and
  ``tasks/cancel`` answer the empty ack ``{"resultType": "complete"}``. The three need the
  tasks declaration on the request (else -32021 with ``requiredCapabilities``); an unknown or
  expired ``taskId`` is -32602. ``tasks/update`` ignores keys that are not outstanding and
  accepts a subset (the task stays ``input_required`` with the keys left); ``tasks/cancel`` of
  a running task settles it to ``cancelled`` (a terminal task is left alone, same ack). A task
  is forgotten ``ttlMs`` after its creation (then -32602 "Task has expired").
* ``subscriptions/listen`` with ``notifications.taskIds`` (needs the tasks declaration, else
  -32021) answers an SSE stream: first ``notifications/subscriptions/acknowledged`` with the
  task ids it agreed to (the known ones) and ``_meta["io.modelcontextprotocol/subscriptionId"]``
  (the request's id), then one ``notifications/tasks`` (a DetailedTask plus that ``_meta``)
  with each agreed task's current state (unless ``announce_on_listen`` is off) and one at
  every later change; SSE comments keep it alive; when the backend stops, the request gets
  its closing result (``resultType: "complete"`` with the subscription id).
* Every result carries ``_meta["io.modelcontextprotocol/serverInfo"]`` (a result inlined in a
  task does not).

Tools (what a call that declares the tasks extension gets; in brackets, a call without it):

* ``greet(name)``: ``Hello, <name>!``, never a task.
* ``echo(text)``: ``<backend>:<text>``, never a task.
* ``slow_compute(seconds=0, label)``: a task, ``working`` for ``seconds`` s (times the
  backend's ``compute_scale``, 1 by default), then ``Computed <label> in <seconds> s``;
  ``cancelled`` when ``tasks/cancel`` comes first [the answer, after the wait].
* ``delayed_echo(text, seconds)``: a task that completes after ``seconds`` s (default: the
  backend's ``delay``) with ``<backend>:<text>`` [the answer, after the wait].
* ``failing_job()``: a task that completes after ``job_seconds`` with ``isError: true`` (a tool
  error is ``completed``, not ``failed``) [-32021: tasks only].
* ``protocol_error_job()``: a task that fails after ``job_seconds``: ``failed`` with ``error``
  ``{"code": -32603, ...}`` [that JSON-RPC error].
* ``confirm_delete(filename)``: a task that goes ``input_required`` with ``inputRequests``
  ``{"confirm": <elicitation/create of a boolean "confirm">}``; once ``tasks/update`` answers
  it, ``Deleted <filename>`` (accepted and confirmed) or ``Kept <filename>`` [the same question
  as a multi round-trip ``input_required`` result; the retry with ``inputResponses`` gets the
  answer].
* ``multi_input()``: a task asking two questions at once, ``name`` and ``confirm``;
  ``name=<name>, confirm=<true|false>`` once both are answered (one ``tasks/update`` each is
  fine) [multi round-trip, both keys].
* ``test_tool_with_task()``: a multi round-trip request first: ``input_required`` asking
  ``user_name``, with a sealed ``requestState``; the retry with the answer and the state gets a
  task that completes after ``delay`` s with ``Hello, <name>!`` [-32021: tasks only].
* ``run_until_cancelled()``: a task that stays ``working`` until ``tasks/cancel``
  [-32021: tasks only].

The ``tasks-*`` scenarios of the conformance suite 0.2.0-alpha.12 call ``greet``,
``slow_compute``, ``failing_job``, ``protocol_error_job``, ``confirm_delete``, ``multi_input``
and ``test_tool_with_task`` (tests/integration/test_task_backend_conformance.py runs them).

Use::

    with task_backend("jobs") as served:          # started on 127.0.0.1:<port>
        served.mcp_url                            # http://127.0.0.1:<port>/mcp
        answer = modern_rpc(served.mcp_url, "tools/call", {"name": "delayed_echo", "arguments": {"text": "hi"}})
        task_id = answer["result"]["taskId"]
        served.wait_for_status(task_id, "completed")
        served.tasks[task_id].result              # {"content": [...], ...}
        served.requests("tasks/get")              # what it received (tests.backends.ReceivedMessage)

Controls (change them while it runs): ``delay``, ``job_seconds``, ``compute_scale``, ``ttl_ms``,
``poll_interval_ms``, ``keepalive``, ``announce_on_listen``, ``eager``. Inspection: ``received``,
``requests(method)``, ``methods()``, ``wait_for(method)``, ``tasks`` (id -> :class:`TaskView`),
``task(id)``, ``wait_for_status(id, status)``, ``subscriptions``. Client helpers for tests:
:func:`modern_rpc` / :func:`modern_post` (a 2026-07-28 request with the envelope and headers),
:func:`poll_task` (``tasks/get`` until a status) and :func:`listen` (a ``subscriptions/listen``
stream).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import itertools
import json
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Self

from tests.backends import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    PROTOCOL_VERSION_HEADER,
    ReceivedMessage,
    RpcError,
    _RecordsReceived,
    _ServedBackend,
)
from tests.gateway import wait_until
from vmcp_actors.demo._serve import serve_asgi_in_thread

PROTOCOL_VERSION = "2026-07-28"
SUPPORTED_VERSIONS = (PROTOCOL_VERSION,)
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"

META_PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
META_CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
META_SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"

METHOD_HEADER = "Mcp-Method"
NAME_HEADER = "Mcp-Name"
ASSUMED_WITHOUT_HEADER = "2025-03-26"  # the revision a request without the version header is taken for

HEADER_MISMATCH = -32020
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021
UNSUPPORTED_PROTOCOL_VERSION = -32022

# HTTP status of a JSON-RPC error answer (2026-07-28 asks 400 for these and 404 for -32601).
ERROR_HTTP_STATUS = {
    PARSE_ERROR: 400, INVALID_REQUEST: 400, INVALID_PARAMS: 400, HEADER_MISMATCH: 400,
    MISSING_REQUIRED_CLIENT_CAPABILITY: 400, UNSUPPORTED_PROTOCOL_VERSION: 400, METHOD_NOT_FOUND: 404,
}

# The body field each method mirrors in Mcp-Name (SEP-2243, and SEP-2663 for tasks/*).
NAME_BEARING = {
    "tools/call": "name", "prompts/get": "name", "resources/read": "uri",
    "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId",
}

WORKING = "working"
INPUT_REQUIRED = "input_required"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED})
STATUSES = (WORKING, INPUT_REQUIRED, COMPLETED, FAILED, CANCELLED)

# How a tool answers a tools/call that declares the extension / one that does not.
FORBIDDEN = "forbidden"  # never a task
OPTIONAL = "optional"  # a task when declared, else synchronous
REQUIRED = "required"  # a task when declared, else -32021

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def iso_now() -> str:
    """Now in ISO 8601, UTC, to the millisecond: ``2026-08-22T10:30:00.123Z``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def call_tool_result(text: str, is_error: bool = False) -> dict[str, Any]:
    """A 2026-07-28 CallToolResult with one text block."""
    return {"content": [{"type": "text", "text": text}], "isError": is_error, "resultType": "complete"}


def elicitation(message: str, properties: dict[str, Any]) -> dict[str, Any]:
    """An ``elicitation/create`` input request (form mode) for ``properties``, all required."""
    return {"method": "elicitation/create", "params": {
        "mode": "form", "message": message,
        "requestedSchema": {"type": "object", "properties": properties, "required": list(properties)}}}


def missing_capability(required: dict[str, Any], what: str) -> RpcError:
    return RpcError(MISSING_REQUIRED_CLIENT_CAPABILITY, f"Missing required client capability: {what}",
                    {"requiredCapabilities": required})


def tasks_required() -> dict[str, Any]:
    return {"extensions": {TASKS_EXTENSION: {}}}


def accepted_content(answer: Any) -> dict[str, Any] | None:
    """The content of an accepted elicitation answer, else None."""
    if isinstance(answer, dict) and answer.get("action") == "accept" and isinstance(answer.get("content"), dict):
        return answer["content"]
    return None


# ----------------------------------------------------------------------------------
# Tasks
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskView:
    """A snapshot of one task the backend holds (for tests)."""

    task_id: str
    tool: str
    arguments: dict[str, Any]
    status: str
    detailed: dict[str, Any]  # what tasks/get would answer now, without resultType and _meta
    history: tuple[str, ...]  # every status it has had, in order (repeats when inputRequests change)
    input_responses: tuple[dict[str, Any], ...]  # the inputResponses of every tasks/update, as sent
    cancel_requested: bool

    @property
    def result(self) -> dict[str, Any] | None:
        return self.detailed.get("result")

    @property
    def error(self) -> dict[str, Any] | None:
        return self.detailed.get("error")

    @property
    def input_requests(self) -> dict[str, Any]:
        return self.detailed.get("inputRequests", {})

    @property
    def text(self) -> str | None:
        """The first text block of a completed task's result."""
        content = (self.result or {}).get("content") or [{}]
        return content[0].get("text")


@dataclass
class _Task:
    task_id: str
    tool: str
    arguments: dict[str, Any]
    ttl_ms: int | None
    poll_interval_ms: int | None
    created_at: str = field(default_factory=iso_now)
    created_monotonic: float = field(default_factory=time.monotonic)
    status: str = WORKING
    status_message: str | None = None
    last_updated_at: str = ""
    outstanding: dict[str, Any] = field(default_factory=dict)  # inputRequests not answered yet
    used_keys: set[str] = field(default_factory=set)
    answers: dict[str, Any] = field(default_factory=dict)
    waiter: asyncio.Future[dict[str, Any]] | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    history: list[str] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)
    cancel_requested: bool = False
    worker: asyncio.Task[Any] | None = None

    def __post_init__(self) -> None:
        self.last_updated_at = self.created_at
        self.history.append(self.status)

    def expired(self, now: float) -> bool:
        return self.ttl_ms is not None and (now - self.created_monotonic) * 1000 > self.ttl_ms

    def handle(self) -> dict[str, Any]:
        """The Task fields (a CreateTaskResult is these plus ``resultType: "task"``)."""
        task: dict[str, Any] = {"taskId": self.task_id, "status": self.status}
        if self.status_message is not None:
            task["statusMessage"] = self.status_message
        task.update(createdAt=self.created_at, lastUpdatedAt=self.last_updated_at, ttlMs=self.ttl_ms)
        if self.poll_interval_ms is not None:
            task["pollIntervalMs"] = self.poll_interval_ms
        return task

    def detailed(self) -> dict[str, Any]:
        """The DetailedTask: the Task plus what its status carries."""
        task = self.handle()
        if self.status == INPUT_REQUIRED:
            task["inputRequests"] = json.loads(json.dumps(self.outstanding))
        elif self.status == COMPLETED:
            task["result"] = json.loads(json.dumps(self.result))
        elif self.status == FAILED:
            task["error"] = dict(self.error or {})
        return task

    def view(self) -> TaskView:
        return TaskView(self.task_id, self.tool, dict(self.arguments), self.status, self.detailed(),
                        tuple(self.history), tuple(self.updates), self.cancel_requested)


class _Job:
    """What a tool's task body gets: its arguments, and :meth:`ask` for input mid-task."""

    def __init__(self, backend: TaskBackend, task: _Task) -> None:
        self.backend = backend
        self.task = task

    @property
    def arguments(self) -> dict[str, Any]:
        return self.task.arguments

    async def ask(self, requests: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Move to ``input_required`` with ``requests`` (keys unique over the task's life) and
        wait until ``tasks/update`` has answered every one; the answers by key."""
        reused = set(requests) & self.task.used_keys
        assert not reused, f"input request keys {sorted(reused)} were used before in this task"
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        with self.backend._lock:
            self.task.used_keys.update(requests)
            self.task.outstanding.update(requests)
            self.task.waiter = waiter
        self.backend._set_status(self.task, INPUT_REQUIRED, f"waiting for input: {', '.join(requests)}")
        return await waiter


@dataclass
class _Subscription:
    request_id: Any
    task_ids: frozenset[str]
    queue: asyncio.Queue[dict[str, Any] | None]


@dataclass(frozen=True)
class SubscriptionView:
    request_id: Any
    task_ids: frozenset[str]


@dataclass(frozen=True)
class _Tool:
    name: str
    description: str
    properties: dict[str, Any]
    required: tuple[str, ...]
    tasks: str  # FORBIDDEN | OPTIONAL | REQUIRED
    asks: bool = False  # asks the user (needs the elicitation capability)

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "inputSchema": {"type": "object", "properties": self.properties, "required": list(self.required)}}


_STRING = {"type": "string"}
_NUMBER = {"type": "number", "minimum": 0}
_CONFIRM = {"confirm": {"type": "boolean", "description": "true to go ahead"}}
_NAME = {"name": {"type": "string", "description": "your name"}}

TOOLS = (
    _Tool("greet", "Says hello (never a task)", {"name": _STRING}, ("name",), FORBIDDEN),
    _Tool("echo", "Echoes the text, prefixed with the backend's name (never a task)", {"text": _STRING}, ("text",),
          FORBIDDEN),
    _Tool("slow_compute", "Works `seconds` s, then answers (a task when the client declares the tasks extension)",
          {"seconds": _NUMBER, "label": _STRING}, (), OPTIONAL),
    _Tool("delayed_echo", "Echoes the text after `seconds` s (default: the backend's delay); a task when it can",
          {"text": _STRING, "seconds": _NUMBER}, ("text",), OPTIONAL),
    _Tool("failing_job", "A task that completes with a tool error (isError: true); tasks only", {}, (), REQUIRED),
    _Tool("protocol_error_job", "Fails with a JSON-RPC error (a failed task when it is one)", {}, (), OPTIONAL),
    _Tool("confirm_delete", "Asks the user to confirm deleting a file (elicitation), then answers",
          {"filename": _STRING}, ("filename",), OPTIONAL, asks=True),
    _Tool("multi_input", "Asks two questions at once (name and confirm), then answers", {}, (), OPTIONAL, asks=True),
    _Tool("test_tool_with_task", "Asks the user's name (input_required), then greets in a task; tasks only",
          {}, (), REQUIRED, asks=True),
    _Tool("run_until_cancelled", "A task that works until tasks/cancel; tasks only", {}, (), REQUIRED),
)
TOOL_NAMES = tuple(tool.name for tool in TOOLS)


# ----------------------------------------------------------------------------------
# The server
# ----------------------------------------------------------------------------------


class TaskBackend(_RecordsReceived, _ServedBackend):
    """The 2026-07-28 tasks backend (see the module docstring); :func:`task_backend` starts one."""

    def __init__(self, name: str = "tasks", *, delay: float = 0.5, job_seconds: float = 1.0,
                 compute_scale: float = 1.0, ttl_ms: int | None = 60_000, poll_interval_ms: int | None = 100,
                 keepalive: float = 10.0, announce_on_listen: bool = True, eager: bool = False) -> None:
        self.name = name
        # Misbehaving on purpose: a task for every call of a task tool, declared or not.
        self.eager = eager
        self.delay = delay  # delayed_echo's default wait; test_tool_with_task's task length
        self.job_seconds = job_seconds  # how long failing_job and protocol_error_job work
        # slow_compute works seconds * compute_scale (its answer names the seconds asked): the
        # conformance suite asks for 1-2 s tasks and checks their statuses, not how long they took
        self.compute_scale = compute_scale
        self.ttl_ms = ttl_ms  # for tasks created from now on (None: unlimited)
        self.poll_interval_ms = poll_interval_ms
        self.keepalive = keepalive  # seconds between SSE comments on a quiet listen stream
        self.announce_on_listen = announce_on_listen
        self._tasks: dict[str, _Task] = {}
        self._expired: set[str] = set()
        self._subscriptions: list[_Subscription] = []
        self._received: list[ReceivedMessage] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._state_key = secrets.token_bytes(32)
        self._tools = {tool.name: tool for tool in TOOLS}
        self._bodies: dict[str, Callable[[_Job], Awaitable[dict[str, Any]]]] = {
            "slow_compute": self._slow_compute, "delayed_echo": self._delayed_echo,
            "failing_job": self._failing_job, "protocol_error_job": self._protocol_error_job,
            "confirm_delete": self._confirm_delete, "multi_input": self._multi_input,
            "test_tool_with_task": self._greet_later, "run_until_cancelled": self._run_until_cancelled,
        }

    # -- inspection ------------------------------------------------------------------

    @property
    def tasks(self) -> dict[str, TaskView]:
        """The tasks it holds (not expired), by id."""
        now = time.monotonic()
        with self._lock:
            return {task_id: task.view() for task_id, task in self._tasks.items() if not task.expired(now)}

    def task(self, task_id: str) -> TaskView:
        with self._lock:
            return self._tasks[task_id].view()

    def wait_for_status(self, task_id: str, status: str | Iterable[str], timeout: float = 10.0) -> TaskView:
        """Wait until the task's status is ``status`` (or one of several); its snapshot then."""
        wanted = {status} if isinstance(status, str) else set(status)
        seen: list[TaskView | None] = [None]

        def reached() -> bool:
            with self._lock:
                task = self._tasks.get(task_id)
                seen[0] = task.view() if task is not None else None
            return seen[0] is not None and seen[0].status in wanted

        if not wait_until(reached, timeout=timeout, interval=0.01):
            raise AssertionError(f"{self.name}: task {task_id} not {sorted(wanted)} within {timeout} s: {seen[0]}")
        return seen[0]

    @property
    def subscriptions(self) -> list[SubscriptionView]:
        """The open ``subscriptions/listen`` streams."""
        with self._lock:
            return [SubscriptionView(s.request_id, s.task_ids) for s in self._subscriptions]

    # -- lifecycle -------------------------------------------------------------------

    def start(self, port: int = 0) -> TaskBackend:
        self._served = serve_asgi_in_thread(self.app(), port=port, name=self.name)
        return self

    def stop(self) -> None:
        self._stopping.set()  # listen streams answer their closing result and end
        super().stop()

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        return Starlette(routes=[Route("/mcp", self._endpoint, methods=["GET", "POST", "DELETE"])])

    # -- HTTP ------------------------------------------------------------------------

    async def _endpoint(self, request: Any) -> Any:
        from starlette.responses import JSONResponse, Response

        origin = request.headers.get("origin")
        if origin is not None and _origin_host(origin) not in LOOPBACK_HOSTS:
            return JSONResponse(_error_body(None, RpcError(INVALID_REQUEST, "Origin not allowed")), status_code=403)
        if request.method != "POST":
            return Response("this server speaks 2026-07-28 only: POST", status_code=405, headers={"Allow": "POST"})
        try:
            payload = json.loads(await request.body())
        except ValueError:
            return _error_response(None, RpcError(PARSE_ERROR, "Parse error"))
        message = self._record(payload, request)
        if not isinstance(payload, dict) or payload.get("jsonrpc") != "2.0":
            return _error_response(None, RpcError(INVALID_REQUEST, "one JSON-RPC 2.0 message per POST"))
        if message.method is None:
            return _error_response(None, RpcError(INVALID_REQUEST, "clients send no JSON-RPC responses"))
        if not isinstance(message.method, str):
            return _error_response(None, RpcError(INVALID_REQUEST, "method must be a string"))
        if "id" not in payload:
            return Response(status_code=202)  # a notification: nothing here acts on one
        request_id = payload["id"]
        if not isinstance(request_id, (str, int)) or isinstance(request_id, bool):
            return _error_response(None, RpcError(INVALID_REQUEST, "invalid request id"))
        try:
            params = self._check(payload, request)
            handler = self._handlers().get(message.method)
            if handler is None:
                raise RpcError(METHOD_NOT_FOUND, f"Method not found: {message.method}")
            answer = await handler(request_id, params)
        except RpcError as exc:
            return _error_response(request_id, exc)
        if isinstance(answer, Response):
            return answer
        return JSONResponse({"jsonrpc": "2.0", "id": request_id, "result": self._with_server_info(answer)})

    def _record(self, payload: Any, request: Any) -> ReceivedMessage:
        body = payload if isinstance(payload, dict) else {}
        message = ReceivedMessage(
            method=body.get("method"), id=body.get("id"), params=body.get("params"), session_id=None,
            protocol_version=request.headers.get(PROTOCOL_VERSION_HEADER),
            headers={k.lower(): v for k, v in request.headers.items()}, payload=payload)
        with self._lock:
            self._received.append(message)
        return message

    def _check(self, payload: dict[str, Any], request: Any) -> dict[str, Any]:
        """The request's params once its version, envelope and headers check out (raises RpcError)."""
        method = payload["method"]
        params = payload.get("params", {})
        version_header = request.headers.get(PROTOCOL_VERSION_HEADER)
        meta = params.get("_meta") if isinstance(params, dict) else None
        if version_header is not None and version_header.strip() not in SUPPORTED_VERSIONS:
            raise _unsupported(version_header.strip())
        if version_header is None and not isinstance(meta, dict):  # a client of an initialize era
            offered = params.get("protocolVersion") if isinstance(params, dict) and method == "initialize" else None
            raise _unsupported(offered if isinstance(offered, str) else ASSUMED_WITHOUT_HEADER)
        if not isinstance(params, dict) or not isinstance(meta, dict):
            raise RpcError(INVALID_PARAMS, f"Invalid params: params._meta must carry {META_PROTOCOL_VERSION} "
                                           f"and {META_CLIENT_CAPABILITIES}")
        missing = [key for key in (META_PROTOCOL_VERSION, META_CLIENT_CAPABILITIES) if key not in meta]
        if missing:
            raise RpcError(INVALID_PARAMS, f"Invalid params: missing _meta keys: {', '.join(missing)}")
        if not isinstance(meta[META_CLIENT_CAPABILITIES], dict):
            raise RpcError(INVALID_PARAMS, f"Invalid params: {META_CLIENT_CAPABILITIES} must be an object")
        if version_header is None:
            raise RpcError(HEADER_MISMATCH, f"Header mismatch: the {PROTOCOL_VERSION_HEADER} header is missing")
        if version_header.strip() != meta[META_PROTOCOL_VERSION]:
            raise RpcError(HEADER_MISMATCH, f"Header mismatch: {PROTOCOL_VERSION_HEADER} {version_header!r} does not "
                                            f"match _meta protocolVersion {meta[META_PROTOCOL_VERSION]!r}")
        method_header = request.headers.get(METHOD_HEADER)
        if method_header is None or method_header.strip() != method:
            raise RpcError(HEADER_MISMATCH, f"Header mismatch: {METHOD_HEADER} {method_header!r} does not match "
                                            f"body method {method!r}")
        field_name = NAME_BEARING.get(method)
        body_value = params.get(field_name) if field_name else None
        if isinstance(body_value, str):
            raw = request.headers.get(NAME_HEADER)
            decoded = _decode_header_value(raw)
            if decoded != body_value:
                raise RpcError(HEADER_MISMATCH, f"Header mismatch: {NAME_HEADER} {raw!r} does not match body "
                                                f"{field_name} {body_value!r}")
        return params

    def _handlers(self) -> dict[str, Callable[[Any, dict[str, Any]], Awaitable[Any]]]:
        return {"server/discover": self._discover, "tools/list": self._tools_list, "tools/call": self._tools_call,
                "tasks/get": self._tasks_get, "tasks/update": self._tasks_update, "tasks/cancel": self._tasks_cancel,
                "subscriptions/listen": self._listen}

    def _with_server_info(self, result: dict[str, Any]) -> dict[str, Any]:
        meta = dict(result.get("_meta") or {})
        meta.setdefault(META_SERVER_INFO, {"name": self.name, "version": "0.0.1"})
        return {**result, "_meta": meta}

    # -- methods ---------------------------------------------------------------------

    async def _discover(self, request_id: Any, params: dict[str, Any]) -> dict[str, Any]:
        return {"resultType": "complete", "supportedVersions": list(SUPPORTED_VERSIONS),
                "capabilities": {"tools": {}, "extensions": {TASKS_EXTENSION: {}}},
                "instructions": f"test backend {self.name}: tools that answer with tasks (SEP-2663)",
                "ttlMs": 0, "cacheScope": "public"}

    async def _tools_list(self, request_id: Any, params: dict[str, Any]) -> dict[str, Any]:
        return {"resultType": "complete", "tools": [tool.definition() for tool in TOOLS],
                "ttlMs": 0, "cacheScope": "public"}

    async def _tools_call(self, request_id: Any, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("name")
        tool = self._tools.get(name) if isinstance(name, str) else None
        if tool is None:
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {name!r}")
        arguments = params.get("arguments", {})
        if not isinstance(arguments, dict):
            raise RpcError(INVALID_PARAMS, "Invalid params: arguments must be an object")
        capabilities = _capabilities(params)
        declared = _declares_tasks(capabilities)
        required: dict[str, Any] = {}
        needs: list[str] = []
        if tool.tasks == REQUIRED and not declared:
            required.update(tasks_required())
            needs.append(f"the {TASKS_EXTENSION} extension")
        if tool.asks and not _declares_form_elicitation(capabilities):
            required["elicitation"] = {"form": {}}
            needs.append("form elicitation")
        if required:
            raise missing_capability(required, f"{tool.name} needs {' and '.join(needs)}")
        problem = _argument_problem(tool, arguments)
        if problem:
            return call_tool_result(f"invalid arguments for {tool.name}: {problem}", is_error=True)
        if tool.tasks == FORBIDDEN:
            return self._answer_now(tool, arguments)
        if tool.name == "test_tool_with_task":  # MRTR first: the task starts once the name is known
            name_given = self._mrtr_name(params)
            if not isinstance(name_given, str):
                return name_given
            arguments = {**arguments, "user_name": name_given}
        if declared or self.eager:
            return {"resultType": "task", **self._create_task(tool, arguments).handle()}
        return await self._answer_sync(tool, arguments, params)

    def _answer_now(self, tool: _Tool, arguments: dict[str, Any]) -> dict[str, Any]:
        if tool.name == "greet":
            return call_tool_result(f"Hello, {arguments['name']}!")
        return call_tool_result(f"{self.name}:{arguments['text']}")

    async def _answer_sync(self, tool: _Tool, arguments: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        """A tool that could be a task, answered without one (the client did not declare tasks)."""
        if tool.name == "slow_compute":
            await asyncio.sleep(_seconds(arguments, 0.0) * self.compute_scale)
            return call_tool_result(_computed(arguments))
        if tool.name == "delayed_echo":
            await asyncio.sleep(_seconds(arguments, self.delay))
            return call_tool_result(f"{self.name}:{arguments['text']}")
        if tool.name == "protocol_error_job":
            raise RpcError(INTERNAL_ERROR, PROTOCOL_ERROR_MESSAGE)
        answers = _input_responses(params)  # confirm_delete, multi_input: multi round-trip requests
        wanted = _questions(tool.name, arguments)
        missing = {key: request for key, request in wanted.items() if key not in answers}
        if missing:
            return {"resultType": "input_required", "inputRequests": missing}
        return _answer_from(tool.name, arguments, answers)

    def _mrtr_name(self, params: dict[str, Any]) -> str | dict[str, Any]:
        """test_tool_with_task's round 1 (an InputRequiredResult) or, on the retry that brings
        the answer and the state, the user's name."""
        state = params.get("requestState")
        answers = _input_responses(params)
        if state is not None:
            if self._unseal(state) != {"tool": "test_tool_with_task", "asked": "user_name"}:
                raise RpcError(INVALID_PARAMS, "Invalid params: requestState is not one this server issued")
            content = accepted_content(answers.get("user_name"))
            if content is not None and isinstance(content.get("name"), str):
                return content["name"]
        return {"resultType": "input_required",
                "inputRequests": {"user_name": elicitation("What is your name?", _NAME)},
                "requestState": self._seal({"tool": "test_tool_with_task", "asked": "user_name"})}

    async def _tasks_get(self, request_id: Any, params: dict[str, Any]) -> dict[str, Any]:
        task = self._task_for(params, "tasks/get")
        with self._lock:
            detailed = task.detailed()
        return {"resultType": "complete", **detailed}

    async def _tasks_update(self, request_id: Any, params: dict[str, Any]) -> dict[str, Any]:
        task = self._task_for(params, "tasks/update")
        responses = params.get("inputResponses")
        if not isinstance(responses, dict):
            raise RpcError(INVALID_PARAMS, "Invalid params: inputResponses must be an object")
        with self._lock:
            task.updates.append(json.loads(json.dumps(responses)))
            answered = {key: value for key, value in responses.items() if key in task.outstanding}
        for key, value in answered.items():
            if not isinstance(value, dict):
                raise RpcError(INVALID_PARAMS, f"Invalid params: inputResponses[{key!r}] must be an object")
        if not answered or task.status != INPUT_REQUIRED:
            return {"resultType": "complete"}  # nothing outstanding answered: ignored
        with self._lock:
            for key, value in answered.items():
                del task.outstanding[key]
                task.answers[key] = value
            done = not task.outstanding
            waiter = task.waiter if done else None
        if done:
            self._set_status(task, WORKING, f"working on {task.tool}")
            if waiter is not None and not waiter.done():
                waiter.set_result(dict(task.answers))
        else:
            self._set_status(task, INPUT_REQUIRED, f"waiting for input: {', '.join(task.outstanding)}")
        return {"resultType": "complete"}

    async def _tasks_cancel(self, request_id: Any, params: dict[str, Any]) -> dict[str, Any]:
        task = self._task_for(params, "tasks/cancel")
        if task.status not in TERMINAL:
            task.cancel_requested = True
            if task.worker is not None:
                task.worker.cancel()
            self._settle(task, CANCELLED, "cancelled by tasks/cancel")
        return {"resultType": "complete"}

    def _task_for(self, params: dict[str, Any], method: str) -> _Task:
        if not _declares_tasks(_capabilities(params)):
            raise missing_capability(tasks_required(), f"{method} needs the {TASKS_EXTENSION} extension")
        task_id = params.get("taskId")
        if not isinstance(task_id, str):
            raise RpcError(INVALID_PARAMS, "Invalid params: taskId must be a string")
        self._purge()
        with self._lock:
            task = self._tasks.get(task_id)
            expired = task_id in self._expired
        if task is None:
            why = "Task has expired" if expired else "Task not found"
            raise RpcError(INVALID_PARAMS, f"Failed to retrieve task: {why}")
        return task

    async def _listen(self, request_id: Any, params: dict[str, Any]) -> Any:
        from starlette.responses import StreamingResponse

        wanted = params.get("notifications")
        if not isinstance(wanted, dict):
            raise RpcError(INVALID_PARAMS, "Invalid params: notifications must be an object")
        task_ids = wanted.get("taskIds")
        if task_ids is not None and (not isinstance(task_ids, list)
                                     or not all(isinstance(t, str) for t in task_ids)):
            raise RpcError(INVALID_PARAMS, "Invalid params: notifications.taskIds must be an array of strings")
        if task_ids is not None and not _declares_tasks(_capabilities(params)):
            raise missing_capability(tasks_required(), f"task notifications need the {TASKS_EXTENSION} extension")
        self._purge()
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        with self._lock:
            agreed = [t for t in dict.fromkeys(task_ids or []) if t in self._tasks]
            subscription = _Subscription(request_id, frozenset(agreed), queue)
            self._subscriptions.append(subscription)
            if self.announce_on_listen:  # queued now, so no later change can overtake them
                for task_id in agreed:
                    queue.put_nowait(self._tasks[task_id].detailed())
        acknowledged: dict[str, Any] = {} if task_ids is None else {"taskIds": agreed}
        meta = {META_SUBSCRIPTION_ID: request_id}

        async def events() -> Any:
            try:
                yield _sse({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
                            "params": {"_meta": meta, "notifications": acknowledged}})
                quiet_since = time.monotonic()
                while True:
                    if self._stopping.is_set():
                        result = self._with_server_info({"resultType": "complete", "_meta": meta})
                        yield _sse({"jsonrpc": "2.0", "id": request_id, "result": result})
                        return
                    try:
                        detailed = await asyncio.wait_for(queue.get(), timeout=0.1)
                    except TimeoutError:
                        if time.monotonic() - quiet_since >= self.keepalive:
                            quiet_since = time.monotonic()
                            yield ":\n\n"
                        continue
                    quiet_since = time.monotonic()
                    yield _sse({"jsonrpc": "2.0", "method": "notifications/tasks",
                                "params": {**detailed, "_meta": meta}})
            finally:
                with self._lock:
                    if subscription in self._subscriptions:
                        self._subscriptions.remove(subscription)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    # -- the task machinery -------------------------------------------------------------

    def _create_task(self, tool: _Tool, arguments: dict[str, Any]) -> _Task:
        """Store the task (``tasks/get`` finds it from now on), then start its work."""
        task = _Task(secrets.token_urlsafe(24), tool.name, dict(arguments), self.ttl_ms, self.poll_interval_ms,
                     status_message=f"working on {tool.name}")
        with self._lock:
            self._tasks[task.task_id] = task
        task.worker = asyncio.get_running_loop().create_task(self._work(task), name=f"task-{tool.name}")
        return task

    async def _work(self, task: _Task) -> None:
        try:
            result = await self._bodies[task.tool](_Job(self, task))
        except asyncio.CancelledError:
            self._settle(task, CANCELLED, "cancelled")
            raise
        except RpcError as exc:
            self._settle(task, FAILED, f"Tool execution failed: {exc.message}", error=exc.to_dict())
        except Exception as exc:  # noqa: BLE001 - a bug in a body is a failed task, not a dead worker
            self._settle(task, FAILED, f"Tool execution failed: {exc!r}",
                         error={"code": INTERNAL_ERROR, "message": f"internal error: {exc!r}"})
        else:
            summary = "completed with a tool error" if result.get("isError") else "completed"
            self._settle(task, COMPLETED, summary, result=result)

    def _settle(self, task: _Task, status: str, message: str, *, result: dict[str, Any] | None = None,
                error: dict[str, Any] | None = None) -> None:
        """Move a task to a terminal status (a terminal task never changes again)."""
        with self._lock:
            if task.status in TERMINAL:
                return
            task.result, task.error = result, error
            task.outstanding.clear()
        self._set_status(task, status, message)

    def _set_status(self, task: _Task, status: str, message: str | None) -> None:
        """Change the status (or what it carries) and tell the subscribers. On the server's loop."""
        with self._lock:
            task.status = status
            task.status_message = message
            task.last_updated_at = iso_now()
            task.history.append(status)
            detailed = task.detailed()
            queues = [s.queue for s in self._subscriptions if task.task_id in s.task_ids]
        for queue in queues:
            queue.put_nowait(detailed)

    def _purge(self) -> None:
        """Forget the tasks whose ttlMs has passed (their work stops)."""
        now = time.monotonic()
        with self._lock:
            gone = [task for task in self._tasks.values() if task.expired(now)]
            for task in gone:
                del self._tasks[task.task_id]
                self._expired.add(task.task_id)
        for task in gone:
            if task.worker is not None and not task.worker.done():
                task.worker.cancel()

    # -- task bodies: (job) -> CallToolResult; RpcError makes the task failed ------------------

    async def _slow_compute(self, job: _Job) -> dict[str, Any]:
        await asyncio.sleep(_seconds(job.arguments, 0.0) * self.compute_scale)
        return call_tool_result(_computed(job.arguments))

    async def _delayed_echo(self, job: _Job) -> dict[str, Any]:
        await asyncio.sleep(_seconds(job.arguments, self.delay))
        return call_tool_result(f"{self.name}:{job.arguments['text']}")

    async def _failing_job(self, job: _Job) -> dict[str, Any]:
        await asyncio.sleep(self.job_seconds)
        return call_tool_result("failing_job failed on purpose", is_error=True)

    async def _protocol_error_job(self, job: _Job) -> dict[str, Any]:
        await asyncio.sleep(self.job_seconds)
        raise RpcError(INTERNAL_ERROR, PROTOCOL_ERROR_MESSAGE)

    async def _confirm_delete(self, job: _Job) -> dict[str, Any]:
        answers = await job.ask(_questions("confirm_delete", job.arguments))
        return _answer_from("confirm_delete", job.arguments, answers)

    async def _multi_input(self, job: _Job) -> dict[str, Any]:
        answers = await job.ask(_questions("multi_input", job.arguments))
        return _answer_from("multi_input", job.arguments, answers)

    async def _greet_later(self, job: _Job) -> dict[str, Any]:
        await asyncio.sleep(self.delay)
        return call_tool_result(f"Hello, {job.arguments['user_name']}!")

    async def _run_until_cancelled(self, job: _Job) -> dict[str, Any]:
        with self._lock:
            job.task.status_message = "working until tasks/cancel"
        await asyncio.Event().wait()  # nobody sets it: only cancellation ends this
        raise AssertionError("unreachable")

    # -- requestState ------------------------------------------------------------------

    def _seal(self, payload: dict[str, Any]) -> str:
        body = base64.urlsafe_b64encode(json.dumps(payload, sort_keys=True).encode()).decode()
        return body + "." + hmac.new(self._state_key, body.encode(), hashlib.sha256).hexdigest()

    def _unseal(self, state: Any) -> dict[str, Any] | None:
        if not isinstance(state, str) or "." not in state:
            return None
        body, _, tag = state.rpartition(".")
        if not hmac.compare_digest(tag, hmac.new(self._state_key, body.encode(), hashlib.sha256).hexdigest()):
            return None
        try:
            return json.loads(base64.urlsafe_b64decode(body.encode()))
        except (ValueError, binascii.Error):
            return None


PROTOCOL_ERROR_MESSAGE = "protocol_error_job failed with an internal error"


def task_backend(name: str = "tasks", **options: Any) -> TaskBackend:
    """A started :class:`TaskBackend` on a loopback port (``.mcp_url``; ``.stop()`` or ``with``).
    ``options``: ``delay``, ``job_seconds``, ``compute_scale``, ``ttl_ms``, ``poll_interval_ms``,
    ``keepalive``, ``announce_on_listen``, ``eager`` (a task even for a call that did not declare
    the extension)."""
    return TaskBackend(name, **options).start()


# -- tool helpers (shared by the task and the synchronous paths) --------------------------


def _questions(tool: str, arguments: dict[str, Any]) -> dict[str, dict[str, Any]]:
    if tool == "confirm_delete":
        return {"confirm": elicitation(f"Delete {arguments['filename']}?", _CONFIRM)}
    return {"name": elicitation("What is your name?", _NAME),
            "confirm": elicitation("Shall I go ahead?", _CONFIRM)}


def _answer_from(tool: str, arguments: dict[str, Any], answers: dict[str, Any]) -> dict[str, Any]:
    if tool == "confirm_delete":
        filename = arguments["filename"]
        content = accepted_content(answers.get("confirm"))
        if content is None:
            action = answers.get("confirm", {}).get("action") if isinstance(answers.get("confirm"), dict) else None
            return call_tool_result(f"Kept {filename} ({action or 'no answer'})")
        return call_tool_result(f"Deleted {filename}" if content.get("confirm") is True else f"Kept {filename}")
    name = accepted_content(answers.get("name"))
    confirm = accepted_content(answers.get("confirm"))
    return call_tool_result(f"name={(name or {}).get('name', '(declined)')}, "
                            f"confirm={json.dumps((confirm or {}).get('confirm', False))}")


def _computed(arguments: dict[str, Any]) -> str:
    return f"Computed {arguments.get('label') or 'result'} in {_seconds(arguments, 0.0):g} s"


def _seconds(arguments: dict[str, Any], default: float) -> float:
    value = arguments.get("seconds", default)
    return float(value)


def _argument_problem(tool: _Tool, arguments: dict[str, Any]) -> str | None:
    for key in tool.required:
        if key not in arguments:
            return f"{key} is required"
    for key, schema in tool.properties.items():
        if key not in arguments:
            continue
        value = arguments[key]
        if schema["type"] == "string" and not isinstance(value, str):
            return f"{key} must be a string"
        if schema["type"] == "number" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                           or value < 0):
            return f"{key} must be a number >= 0"
    return None


def _input_responses(params: dict[str, Any]) -> dict[str, Any]:
    """A retried request's ``inputResponses`` (MRTR); -32602 when malformed."""
    responses = params.get("inputResponses")
    if responses is None and "inputResponses" not in params:
        return {}
    if not isinstance(responses, dict) or not all(isinstance(value, dict) for value in responses.values()):
        raise RpcError(INVALID_PARAMS, "Invalid params: inputResponses must be an object of objects")
    return responses


def _capabilities(params: dict[str, Any]) -> dict[str, Any]:
    meta = params.get("_meta")
    capabilities = meta.get(META_CLIENT_CAPABILITIES) if isinstance(meta, dict) else None
    return capabilities if isinstance(capabilities, dict) else {}


def _declares_tasks(capabilities: dict[str, Any]) -> bool:
    extensions = capabilities.get("extensions")
    return isinstance(extensions, dict) and isinstance(extensions.get(TASKS_EXTENSION), dict)


def _declares_form_elicitation(capabilities: dict[str, Any]) -> bool:
    """``elicitation: {}`` means form mode; with modes listed, ``form`` must be one."""
    declared = capabilities.get("elicitation")
    if not isinstance(declared, dict):
        return False
    return not declared or "form" in declared


def _unsupported(requested: str) -> RpcError:
    return RpcError(UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version",
                    {"supported": list(SUPPORTED_VERSIONS), "requested": requested})


def _decode_header_value(value: str | None) -> str | None:
    """A header value as the body would hold it: trimmed, ``=?base64?...?=`` decoded; None when
    absent or holding characters a header value may not (or bad base64)."""
    if value is None:
        return None
    value = value.strip(" \t")
    if any(not (" " <= ch <= "~" or ch == "\t") for ch in value):
        return None
    if value.startswith("=?base64?") and value.endswith("?=") and len(value) >= len("=?base64??="):
        try:
            return base64.b64decode(value[len("=?base64?"):-2], validate=True).decode("utf-8")
        except (ValueError, binascii.Error):
            return None
    return value


def _origin_host(origin: str) -> str:
    from urllib.parse import urlsplit

    try:
        return urlsplit(origin).hostname or ""
    except ValueError:
        return ""


def _error_body(request_id: Any, error: RpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": error.to_dict()}


def _error_response(request_id: Any, error: RpcError) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(_error_body(request_id, error), status_code=ERROR_HTTP_STATUS.get(error.code, 200))


def _sse(message: dict[str, Any]) -> str:
    return f"event: message\ndata: {json.dumps(message, separators=(',', ':'))}\n\n"


# ----------------------------------------------------------------------------------
# A small 2026-07-28 client for tests
# ----------------------------------------------------------------------------------

_ids = itertools.count(1)


def client_capabilities(*, tasks: bool = True, elicitation: bool = True, **more: Any) -> dict[str, Any]:
    """Per-request client capabilities: the tasks extension and form elicitation by default."""
    capabilities: dict[str, Any] = dict(more)
    if elicitation:
        capabilities["elicitation"] = {}
    if tasks:
        capabilities["extensions"] = {**capabilities.get("extensions", {}), TASKS_EXTENSION: {}}
    return capabilities


def modern_post(url: str, method: str, params: dict[str, Any] | None = None, *, request_id: Any = None,
                capabilities: dict[str, Any] | None = None, headers: dict[str, str | None] | None = None,
                stream: bool = False, timeout: float | tuple[float, float] = 30.0) -> Any:
    """POST one 2026-07-28 request with the envelope in ``_meta`` and the standard headers
    (``MCP-Protocol-Version``, ``Mcp-Method``, ``Mcp-Name`` from the body); ``capabilities``
    default to :func:`client_capabilities`; ``headers`` override (None drops one). The
    ``requests.Response``."""
    import requests

    body_params = dict(params or {})
    meta = {META_PROTOCOL_VERSION: PROTOCOL_VERSION, META_CLIENT_INFO: {"name": "task-tests", "version": "1"},
            META_CLIENT_CAPABILITIES: client_capabilities() if capabilities is None else capabilities,
            **body_params.get("_meta", {})}
    body_params["_meta"] = meta
    sent: dict[str, str] = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                            PROTOCOL_VERSION_HEADER: PROTOCOL_VERSION, METHOD_HEADER: method}
    name_field = NAME_BEARING.get(method)
    if name_field and isinstance(body_params.get(name_field), str):
        sent[NAME_HEADER] = _encode_header_value(body_params[name_field])
    for key, value in (headers or {}).items():
        for existing in [k for k in sent if k.lower() == key.lower()]:
            del sent[existing]
        if value is not None:
            sent[key] = value
    message = {"jsonrpc": "2.0", "id": next(_ids) if request_id is None else request_id, "method": method,
               "params": body_params}
    return requests.post(url, json=message, headers=sent, stream=stream, timeout=timeout)


def modern_rpc(url: str, method: str, params: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    """:func:`modern_post`, answered as JSON: the whole JSON-RPC response (``result`` or ``error``)."""
    return modern_post(url, method, params, **options).json()


def poll_task(url: str, task_id: str, statuses: str | Iterable[str], *, timeout: float = 30.0,
              interval: float = 0.05, **options: Any) -> dict[str, Any]:
    """``tasks/get`` (2026-07-28) until the task's status is one of ``statuses``: the last task
    answered (after ``timeout`` it has another status: the caller checks). ``options`` as for
    :func:`modern_post`; an answer without a result fails at once."""
    wanted = {statuses} if isinstance(statuses, str) else set(statuses)
    answers: list[dict[str, Any]] = []

    def reached() -> bool:
        answer = modern_rpc(url, "tasks/get", {"taskId": task_id}, **options)
        assert "result" in answer, answer
        answers.append(answer["result"])
        return answers[-1]["status"] in wanted

    wait_until(reached, timeout=timeout, interval=interval)
    return answers[-1]


def _encode_header_value(value: str) -> str:
    plain = all(" " <= ch <= "~" for ch in value) and value == value.strip() and not (
        value.startswith("=?base64?") and value.endswith("?="))
    return value if plain else "=?base64?" + base64.b64encode(value.encode()).decode() + "?="


class ListenStream:
    """A ``subscriptions/listen`` response being read: :meth:`next` returns its next JSON-RPC
    message (SSE comments skipped); ``status`` and ``json()`` for an answer that is not a stream."""

    def __init__(self, response: Any) -> None:
        self.response = response
        self.status = response.status_code
        self.is_stream = response.headers.get("content-type", "").startswith("text/event-stream")
        self._lines = response.iter_lines(decode_unicode=True) if self.is_stream else iter(())

    def json(self) -> Any:
        return self.response.json()

    def next(self) -> dict[str, Any]:
        data: list[str] = []
        for line in self._lines:
            if line.startswith("data:"):
                data.append(line[5:].lstrip())
            elif line == "" and data:
                return json.loads("\n".join(data))
        raise EOFError("the listen stream ended")

    def close(self) -> None:
        self.response.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def listen(url: str, task_ids: list[str] | None = None, *, read_timeout: float = 10.0,
           **options: Any) -> ListenStream:
    """Open ``subscriptions/listen`` for ``task_ids`` (``notifications.taskIds``; None leaves
    it out); ``options`` as for :func:`modern_post`. A read waits at most ``read_timeout`` s."""
    notifications = {} if task_ids is None else {"taskIds": list(task_ids)}
    response = modern_post(url, "subscriptions/listen", {"notifications": notifications}, stream=True,
                           timeout=(5.0, read_timeout), **options)
    return ListenStream(response)
