"""Backend MCP servers for the test suite, each served on an ephemeral loopback port.

Two families:

* :func:`sdk_backend` - a real server built with the official MCP SDK (``MCPServer``).
* Raw JSON-RPC backends (:func:`paged_backend`, :func:`method_not_found_backend`,
  :func:`erroring_lists_backend`, :func:`delayed_backend`, :func:`hanging_backend`,
  :func:`restartable_backend`, :func:`sse_backend`) - small Starlette apps speaking a
  minimal MCP streamable HTTP with full control over the wire. All of them are a
  :class:`RawMcpBackend` configured with a few method handlers.

Every factory returns a started backend: ``.url`` is the base URL (``.mcp_url`` adds
``/mcp``), ``.port``, ``.stop()`` (idempotent; also a context manager). Raw backends
also record what they received in ``.received``.

This module does not use ``from __future__ import annotations`` because the SDK
inspects tool signatures for ``Context`` parameters at registration time.
"""

import asyncio
import base64
import inspect
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vmcp_actors.demo._serve import ServedApp, serve_asgi_in_thread

SESSION_HEADER = "Mcp-Session-Id"
PROTOCOL_VERSION_HEADER = "MCP-Protocol-Version"
DEFAULT_PROTOCOL_VERSION = "2025-06-18"

METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
PARSE_ERROR = -32700
INVALID_REQUEST = -32600


# ----------------------------------------------------------------------------------
# Common served-backend surface
# ----------------------------------------------------------------------------------


class _ServedBackend:
    """``url`` / ``port`` / ``stop()`` / context manager over a :class:`ServedApp`."""

    name: str
    _served: ServedApp | None = None

    @property
    def served(self) -> ServedApp:
        if self._served is None:
            raise RuntimeError(f"backend {self.name!r} is not started")
        return self._served

    @property
    def url(self) -> str:
        return self.served.url

    @property
    def mcp_url(self) -> str:
        return self.served.url + "/mcp"

    @property
    def port(self) -> int:
        return self.served.port

    def stop(self) -> None:
        if self._served is not None:
            self._served.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self._served.url if self._served is not None else "not started"
        return f"<{type(self).__name__} {self.name!r} {where}>"


# ----------------------------------------------------------------------------------
# SDK backend
# ----------------------------------------------------------------------------------

SDK_TOOLS = ("echo", "whoami", "sleep", "fail", "progress", "structured")
SHARED_README_URI = "test://shared/readme"
GREET_CANDIDATES = ("alice", "albert", "bob", "carol", "dave")


class SdkBackend(_ServedBackend):
    """A served official-SDK ``MCPServer``; ``.server`` is the ``MCPServer`` itself."""

    def __init__(self, name: str, server: Any) -> None:
        self.name = name
        self.server = server

    def start(self, *, json_response: bool = False, stateless: bool = False) -> "SdkBackend":
        app = self.server.streamable_http_app(json_response=json_response, stateless_http=stateless)
        self._served = serve_asgi_in_thread(app, name=self.name)
        return self


def build_sdk_server(name: str, tools: Iterable[str] | None = None, extra_tools: Sequence[Callable] = ()) -> Any:
    """The ``MCPServer`` behind :func:`sdk_backend` (usable in-process, too)."""
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import Completion

    from vmcp_actors.demo.servers import log_to_client

    wanted = set(SDK_TOOLS if tools is None else tools)
    unknown = wanted - set(SDK_TOOLS)
    if unknown:
        raise ValueError(f"unknown sdk_backend tools {sorted(unknown)}; choose from {SDK_TOOLS}")
    srv = MCPServer(name, instructions=f"test backend {name}", version="0.0.1", log_level="WARNING")

    def echo(text: str) -> str:
        """Echo the text back, prefixed with the backend name."""
        return f"{name}:{text}"

    def whoami() -> str:
        """The backend's name."""
        return name

    async def sleep(seconds: float) -> str:
        """Sleep, then answer 'slept'."""
        import anyio

        await anyio.sleep(seconds)
        return "slept"

    def fail() -> str:
        """Always fails (isError: true)."""
        raise ToolError(f"{name} failed on purpose")

    async def progress(steps: int, ctx: Context, delay: float = 0.0) -> str:
        """Report progress `steps` times, log once, answer 'done'."""
        import anyio

        for step in range(1, steps + 1):
            await ctx.report_progress(step, steps, f"step {step}/{steps}")
            if delay:
                await anyio.sleep(delay)
        await log_to_client(ctx, f"{name} progress finished")
        return "done"

    def structured() -> dict[str, Any]:
        """Structured output (structuredContent)."""
        return {"backend": name, "ok": True, "items": [1, 2, 3]}

    for fn in (echo, whoami, sleep, fail, progress, structured):
        if fn.__name__ in wanted:
            srv.add_tool(fn)
    for fn in extra_tools:
        srv.add_tool(fn)

    @srv.resource(f"test://{name}/static", mime_type="text/plain")
    def static() -> str:
        return f"static resource of {name}"

    @srv.resource(SHARED_README_URI, mime_type="text/plain", description="present on every sdk backend")
    def shared_readme() -> str:
        return f"shared readme (served by {name})"

    @srv.resource(f"test://{name}/items/{{item}}", mime_type="text/plain")
    def item(item: str) -> str:
        return f"{name} item {item}"

    @srv.prompt()
    def greet(who: str) -> str:
        """Greet someone."""
        return f"Hello {who}, from {name}!"

    @srv.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> Any:
        # By shape, not class: the SDK hands 2026-07-28 requests their own revision's types.
        if getattr(ref, "type", None) == "ref/prompt" and ref.name == "greet" and argument.name == "who":
            values = [w for w in GREET_CANDIDATES if w.startswith(argument.value)]
            return Completion(values=values, total=len(values), has_more=False)
        return None

    return srv


def sdk_backend(
    name: str,
    tools: Iterable[str] | None = None,
    *,
    extra_tools: Sequence[Callable] = (),
    json_response: bool = False,
    stateless: bool = False,
) -> SdkBackend:
    """A started official-SDK backend.

    Tools (``tools`` picks a subset of :data:`SDK_TOOLS`; ``extra_tools`` adds functions):
    ``echo(text)`` -> ``"{name}:{text}"`` (the same tool name on every sdk backend),
    ``whoami()``, ``sleep(seconds)`` -> ``"slept"``, ``fail()`` -> isError,
    ``progress(steps, delay=0)`` -> ``steps`` progress notifications, one log message,
    ``"done"``; ``structured()`` -> structuredContent. Resources ``test://{name}/static``
    and ``test://shared/readme`` (on every sdk backend), template
    ``test://{name}/items/{item}``, prompt ``greet(who)`` with completion for ``who``.
    """
    return SdkBackend(name, build_sdk_server(name, tools, extra_tools)).start(
        json_response=json_response, stateless=stateless
    )


# ----------------------------------------------------------------------------------
# Raw JSON-RPC backends
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReceivedMessage:
    """One JSON-RPC message a raw backend received (recorded before any delay or hang)."""

    method: str | None
    id: Any
    params: Any
    session_id: str | None
    protocol_version: str | None
    headers: dict[str, str]
    payload: Any
    at: float = field(default_factory=time.monotonic)

    @property
    def kind(self) -> str:
        if self.method is None:
            return "response"
        return "notification" if self.id is None else "request"

    @property
    def is_request(self) -> bool:
        return self.kind == "request"


class RpcError(Exception):
    """Raise from a handler to answer with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        error = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


@dataclass(frozen=True)
class RpcCall:
    """What a method handler gets: the request, its backend and the HTTP request."""

    backend: "RawMcpBackend"
    message: ReceivedMessage
    request: Any  # starlette.requests.Request

    @property
    def params(self) -> dict[str, Any]:
        return self.message.params if isinstance(self.message.params, dict) else {}

    @property
    def id(self) -> Any:
        return self.message.id

    @property
    def progress_token(self) -> Any:
        meta = self.params.get("_meta")
        return meta.get("progressToken") if isinstance(meta, dict) else None


Handler = Callable[[RpcCall], Any]


def _envelope(request_id: Any, result: Any = None, error: RpcError | None = None) -> dict[str, Any]:
    if error is not None:
        return {"jsonrpc": "2.0", "id": request_id, "error": error.to_dict()}
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _sse(message: dict[str, Any]) -> str:
    return f"event: message\ndata: {json.dumps(message, separators=(',', ':'))}\n\n"


def text_result(text: str, is_error: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if is_error:
        result["isError"] = True
    return result


def tool_def(name: str, description: str = "", **properties: str) -> dict[str, Any]:
    """A tool definition; ``properties`` maps argument name to JSON type (all required)."""
    return {
        "name": name,
        "description": description or f"the {name} tool",
        "inputSchema": {
            "type": "object",
            "properties": {arg: {"type": kind} for arg, kind in properties.items()},
            "required": list(properties),
        },
    }


def encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"offset:{offset}".encode()).decode()


def decode_cursor(cursor: Any) -> int:
    try:
        prefix, _, number = base64.urlsafe_b64decode(str(cursor).encode()).decode().partition(":")
        if prefix != "offset" or not number.isdigit():
            raise ValueError(cursor)
        return int(number)
    except ValueError:
        raise RpcError(INVALID_PARAMS, f"invalid cursor {cursor!r}") from None


def paged_list(key: str, items: Sequence[dict[str, Any]], page_size: int) -> Handler:
    """A ``*/list`` handler paging ``items`` under ``key`` with opaque base64 cursors."""

    def handle(call: RpcCall) -> dict[str, Any]:
        cursor = call.params.get("cursor")
        start = 0 if cursor is None else decode_cursor(cursor)
        if start > len(items):
            raise RpcError(INVALID_PARAMS, f"cursor {cursor!r} is past the end")
        result: dict[str, Any] = {key: list(items[start : start + page_size])}
        if start + page_size < len(items):
            result["nextCursor"] = encode_cursor(start + page_size)
        return result

    return handle


def static_result(result: Any) -> Handler:
    return lambda call: result


class _RecordsReceived:
    """What a hand-written backend POSTed to it keeps (``_received`` under ``_lock``), and
    how a test reads it."""

    name: str
    _received: list[ReceivedMessage]
    _lock: threading.Lock

    @property
    def received(self) -> list[ReceivedMessage]:
        """A snapshot of every JSON-RPC message received so far, in arrival order."""
        with self._lock:
            return list(self._received)

    def requests(self, method: str | None = None) -> list[ReceivedMessage]:
        return [m for m in self.received if m.is_request and (method is None or m.method == method)]

    def methods(self) -> list[str | None]:
        return [m.method for m in self.received]

    def clear_received(self) -> None:
        with self._lock:
            self._received.clear()

    def wait_for(self, method: str, count: int = 1, timeout: float = 5.0) -> list[ReceivedMessage]:
        """Wait until ``count`` messages of ``method`` arrived; returns them."""
        deadline = time.monotonic() + timeout
        while True:
            found = [m for m in self.received if m.method == method]
            if len(found) >= count:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: {count} x {method} not received within {timeout} s: {found}")
            time.sleep(0.01)


class RawMcpBackend(_RecordsReceived, _ServedBackend):
    """Minimal MCP streamable HTTP over Starlette, without the SDK.

    * ``initialize`` opens a session (``Mcp-Session-Id`` response header), echoes the
      client's ``protocolVersion`` (or ``protocol_version`` if set), advertises
      ``capabilities`` and counts ``initialize_count``.
    * Other POSTs need a known session: none -> 400, unknown -> 404.
      Notifications and client responses -> 202; ``ping`` -> ``{}``; other requests go
      to ``handlers[method]`` (missing -> -32601). A handler returns a result (dict),
      raises :class:`RpcError`, or returns a Starlette ``Response`` (sent as is).
    * ``DELETE`` ends a session (200; unknown 404); ``GET`` -> 405 (no standalone stream).

    Controls, changeable while running: ``delay`` (seconds every POST waits first,
    without blocking others), ``hang`` (POSTs wait until ``hang`` is cleared or the
    backend stops, then get 503) with ``hang_exempt`` methods, ``forget_sessions()``.
    """

    def __init__(
        self,
        name: str,
        handlers: dict[str, Handler] | None = None,
        *,
        capabilities: dict[str, Any] | None = None,
        protocol_version: str | None = None,
        delay: float = 0.0,
        hang: bool = False,
        hang_exempt: Iterable[str] = (),
    ) -> None:
        self.name = name
        self.handlers: dict[str, Handler] = {"ping": static_result({}), **(handlers or {})}
        self.capabilities = {"tools": {}} if capabilities is None else capabilities
        self.protocol_version = protocol_version
        self.delay = delay
        self.hang = hang
        self.hang_exempt = frozenset(hang_exempt)
        self.initialize_count = 0
        self.deleted_sessions: list[str] = []
        self._sessions: dict[str, str] = {}
        self._received: list[ReceivedMessage] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    # -- controls and inspection (and what _RecordsReceived reads) -------------------

    @property
    def sessions(self) -> dict[str, str]:
        """Live sessions: session id -> negotiated protocol version."""
        with self._lock:
            return dict(self._sessions)

    def forget_sessions(self) -> None:
        """Simulate a restart: every session id known so far now gets 404."""
        with self._lock:
            self._sessions.clear()

    restart = forget_sessions

    def start(self) -> "RawMcpBackend":
        self._served = serve_asgi_in_thread(self.app(), name=self.name)
        return self

    def stop(self) -> None:
        self._stopping.set()  # releases hanging requests so shutdown is prompt
        super().stop()

    # -- ASGI ------------------------------------------------------------------------

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        return Starlette(routes=[Route("/mcp", self._endpoint, methods=["GET", "POST", "DELETE"])])

    async def _endpoint(self, request: Any) -> Any:
        from starlette.responses import Response

        if request.method == "POST":
            return await self._post(request)
        session_id = request.headers.get(SESSION_HEADER)
        if request.method == "DELETE":
            with self._lock:
                known = self._sessions.pop(session_id, None) is not None if session_id else False
                if known:
                    self.deleted_sessions.append(session_id)
            return Response(status_code=200 if known else (404 if session_id else 400))
        return Response("no standalone SSE stream", status_code=405, headers={"Allow": "POST, DELETE"})

    def _record(self, payload: Any, request: Any) -> ReceivedMessage:
        payload_dict = payload if isinstance(payload, dict) else {}
        message = ReceivedMessage(
            method=payload_dict.get("method"),
            id=payload_dict.get("id"),
            params=payload_dict.get("params"),
            session_id=request.headers.get(SESSION_HEADER),
            protocol_version=request.headers.get(PROTOCOL_VERSION_HEADER),
            headers={k.lower(): v for k, v in request.headers.items()},
            payload=payload,
        )
        with self._lock:
            self._received.append(message)
        return message

    async def _post(self, request: Any) -> Any:
        from starlette.responses import JSONResponse, Response

        try:
            payload = json.loads(await request.body())
        except ValueError:
            return JSONResponse(_envelope(None, error=RpcError(PARSE_ERROR, "parse error")), status_code=400)
        message = self._record(payload, request)
        if self.delay:
            await asyncio.sleep(self.delay)
        while self.hang and message.method not in self.hang_exempt:
            if self._stopping.is_set():
                return Response("backend stopped", status_code=503)
            await asyncio.sleep(0.02)
        if not isinstance(payload, dict):
            return JSONResponse(_envelope(None, error=RpcError(INVALID_REQUEST, "one message per POST")), 400)
        if message.method == "initialize":
            return self._initialize(message)
        with self._lock:
            known = message.session_id in self._sessions
        if not known:
            return Response("missing Mcp-Session-Id" if message.session_id is None else "unknown session",
                            status_code=400 if message.session_id is None else 404)
        if message.kind != "request":
            return Response(status_code=202)
        return await self._dispatch(RpcCall(self, message, request))

    def _initialize(self, message: ReceivedMessage) -> Any:
        from starlette.responses import JSONResponse

        params = message.params if isinstance(message.params, dict) else {}
        version = self.protocol_version or params.get("protocolVersion") or DEFAULT_PROTOCOL_VERSION
        session_id = uuid.uuid4().hex
        with self._lock:
            self._sessions[session_id] = version
            self.initialize_count += 1
        result = {
            "protocolVersion": version,
            "capabilities": self.capabilities,
            "serverInfo": {"name": self.name, "version": "0.0.1"},
        }
        return JSONResponse(_envelope(message.id, result), headers={SESSION_HEADER: session_id})

    async def _dispatch(self, call: RpcCall) -> Any:
        from starlette.responses import JSONResponse, Response

        handler = self.handlers.get(call.message.method or "")
        try:
            if handler is None:
                raise RpcError(METHOD_NOT_FOUND, f"Method not found: {call.message.method}")
            result = handler(call)
            if inspect.isawaitable(result):
                result = await result
        except RpcError as exc:
            return JSONResponse(_envelope(call.id, error=exc))
        if isinstance(result, Response):
            return result
        return JSONResponse(_envelope(call.id, result))

    def sse_response(self, call: RpcCall, notifications: Sequence[dict[str, Any]], result: Any,
                     event_delay: float = 0.0) -> Any:
        """Answer ``call`` as ``text/event-stream``: the notifications, then the result."""
        from starlette.responses import StreamingResponse

        async def events():
            for params in notifications:
                yield _sse({"jsonrpc": "2.0", **params})
                if event_delay:
                    await asyncio.sleep(event_delay)
            yield _sse(_envelope(call.id, result))

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _echo_tools(name: str) -> dict[str, Handler]:
    """tools/list + tools/call for ``echo(text)`` -> ``"{name}:{text}"`` and ``sleep(seconds)``."""

    async def call_tool(call: RpcCall) -> dict[str, Any]:
        arguments = call.params.get("arguments") or {}
        tool = call.params.get("name")
        if tool == "echo":
            return text_result(f"{name}:{arguments.get('text', '')}")
        if tool == "sleep":
            await asyncio.sleep(float(arguments.get("seconds", 0)))
            return text_result("slept")
        return text_result(f"unknown tool {tool}", is_error=True)

    tools = [tool_def("echo", "Echo text back", text="string"), tool_def("sleep", "Sleep a while", seconds="number")]
    return {"tools/list": static_result({"tools": tools}), "tools/call": call_tool}


def paged_backend(
    total: int = 23,
    page_size: int = 5,
    *,
    prompts: int = 7,
    prompt_page_size: int = 3,
    resources: int = 6,
    resource_page_size: int = 4,
    name: str = "paged",
) -> RawMcpBackend:
    """``tools/list`` pages ``tool_00``..``tool_{total-1}``; ``tools/call`` answers the tool's name.

    ``prompts/list`` (``prompt_00``..) and ``resources/list`` (``paged://{name}/resource_00``..)
    page too; each is advertised only when its count is > 0. ``nextCursor`` is an
    opaque base64 offset; a bad cursor gets -32602.
    """
    width = max(2, len(str(max(total, prompts, resources) - 1)))
    tools = [tool_def(f"tool_{i:0{width}d}") for i in range(total)]
    prompt_defs = [{"name": f"prompt_{i:0{width}d}", "description": f"prompt {i}"} for i in range(prompts)]
    resource_defs = [
        {"uri": f"paged://{name}/resource_{i:0{width}d}", "name": f"resource_{i:0{width}d}", "mimeType": "text/plain"}
        for i in range(resources)
    ]
    capabilities: dict[str, Any] = {"tools": {}}
    handlers: dict[str, Handler] = {
        "tools/list": paged_list("tools", tools, page_size),
        "tools/call": lambda call: text_result(str(call.params.get("name"))),
    }
    if prompts:
        capabilities["prompts"] = {}
        handlers["prompts/list"] = paged_list("prompts", prompt_defs, prompt_page_size)
        handlers["prompts/get"] = lambda call: {
            "messages": [{"role": "user", "content": {"type": "text", "text": str(call.params.get("name"))}}]
        }
    if resources:
        capabilities["resources"] = {}
        handlers["resources/list"] = paged_list("resources", resource_defs, resource_page_size)
        handlers["resources/templates/list"] = static_result({"resourceTemplates": []})
        handlers["resources/read"] = lambda call: {
            "contents": [{"uri": call.params.get("uri"), "mimeType": "text/plain", "text": str(call.params.get("uri"))}]
        }
    return RawMcpBackend(name, handlers, capabilities=capabilities).start()


def method_not_found_backend(name: str = "mnf") -> RawMcpBackend:
    """Advertises tools, resources and prompts, but every resources/prompts list is -32601.

    ``tools/list`` has one tool, ``still_here``; calling it answers ``"still here"``.
    """
    handlers: dict[str, Handler] = {
        "tools/list": static_result({"tools": [tool_def("still_here", "Proves the backend still works")]}),
        "tools/call": lambda call: text_result("still here"),
    }
    return RawMcpBackend(name, handlers, capabilities={"tools": {}, "resources": {}, "prompts": {}}).start()


def erroring_lists_backend(
    code: int = INTERNAL_ERROR,
    http_status: int | None = None,
    *,
    methods: Iterable[str] = ("resources/list",),
    name: str = "erroring",
) -> RawMcpBackend:
    """Advertises tools and resources; ``methods`` (default ``resources/list``) fail.

    They answer the JSON-RPC error ``code``, or, if ``http_status`` is set, a bare HTTP
    response with that status. ``resources/templates/list`` (unless listed) answers
    an empty list; ``tools/list`` has ``echo`` and ``sleep``.
    """

    def failing(call: RpcCall) -> Any:
        if http_status is not None:
            from starlette.responses import Response

            return Response(f"simulated HTTP {http_status}", status_code=http_status)
        raise RpcError(code, f"{call.message.method} failed on purpose")

    handlers = {"resources/templates/list": static_result({"resourceTemplates": []}), **_echo_tools(name)}
    handlers.update({method: failing for method in methods})
    return RawMcpBackend(name, handlers, capabilities={"tools": {}, "resources": {}}).start()


def delayed_backend(delay: float = 0.3, name: str = "delayed") -> RawMcpBackend:
    """Every POST (requests and notifications) first waits ``delay`` s (non-blocking).

    Tools ``echo(text)`` -> ``"{name}:{text}"`` and ``sleep(seconds)`` -> ``"slept"``;
    JSON answers. Change ``backend.delay`` at any time.
    """
    return RawMcpBackend(name, _echo_tools(name), delay=delay).start()


def hanging_backend(answer_initialize: bool = False, name: str = "hanging") -> RawMcpBackend:
    """Accepts connections and never answers a POST (until stopped: then 503).

    With ``answer_initialize`` the handshake (initialize, notifications/initialized)
    still works and everything after it hangs. Clear ``backend.hang`` to let requests
    through.
    """
    exempt = ("initialize", "notifications/initialized") if answer_initialize else ()
    return RawMcpBackend(name, _echo_tools(name), hang=True, hang_exempt=exempt).start()


def restartable_backend(name: str = "restartable") -> RawMcpBackend:
    """Echo/sleep tools; ``forget_sessions()`` (alias ``restart()``) makes old session ids 404.

    ``initialize_count`` counts handshakes, so a test can assert one re-initialize.
    """
    return RawMcpBackend(name, _echo_tools(name)).start()


def sse_backend(name: str = "sse", event_delay: float = 0.02) -> RawMcpBackend:
    """``tools/call`` answers as ``text/event-stream``: two ``notifications/progress``
    (with the request's ``_meta.progressToken``; skipped when there is none), one
    ``notifications/message``, then the result ``"{name}:{text}"``. Everything else is JSON.
    """
    handlers = _echo_tools(name)

    def streamed_call(call: RpcCall) -> Any:
        arguments = call.params.get("arguments") or {}
        token = call.progress_token
        notifications = []
        if token is not None:
            notifications = [
                {"method": "notifications/progress",
                 "params": {"progressToken": token, "progress": step, "total": 2, "message": f"step {step}/2"}}
                for step in (1, 2)
            ]
        notifications.append(
            {"method": "notifications/message",
             "params": {"level": "info", "logger": name, "data": f"{name} is answering {call.params.get('name')}"}}
        )
        result = text_result(f"{name}:{arguments.get('text', '')}")
        return call.backend.sse_response(call, notifications, result, event_delay)

    handlers["tools/call"] = streamed_call
    return RawMcpBackend(name, handlers).start()


__all__ = [
    "DEFAULT_PROTOCOL_VERSION",
    "GREET_CANDIDATES",
    "PROTOCOL_VERSION_HEADER",
    "RawMcpBackend",
    "ReceivedMessage",
    "RpcCall",
    "RpcError",
    "SDK_TOOLS",
    "SESSION_HEADER",
    "SHARED_README_URI",
    "SdkBackend",
    "build_sdk_server",
    "decode_cursor",
    "delayed_backend",
    "encode_cursor",
    "erroring_lists_backend",
    "hanging_backend",
    "method_not_found_backend",
    "paged_backend",
    "paged_list",
    "restartable_backend",
    "sdk_backend",
    "sse_backend",
    "text_result",
    "tool_def",
]


# ----------------------------------------------------------------------------------
# Backends that require a real user (bearer JWTs) or a given client header
# ----------------------------------------------------------------------------------

import hmac as _hmac  # noqa: E402
from collections.abc import Mapping  # noqa: E402

REDACTED = "<redacted>"


class HeaderDict(dict):
    """Lower-cased header names; lookups (``[]``, ``get``, ``in``) ignore case."""

    def __init__(self, headers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__((k.lower(), v) for k, v in headers)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key.lower() if isinstance(key, str) else key)

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)


@dataclass(frozen=True)
class AuthedReceivedMessage(ReceivedMessage):
    """A :class:`ReceivedMessage` from a guarded backend: ``headers`` is a :class:`HeaderDict`
    (credentials redacted where configured) and, once a bearer token verified, its claims.

    ``subject`` / ``audience`` / ``scope`` come from the verified token; the raw token is
    never kept.
    """

    subject: str | None = None
    audience: Any = None  # str, or a list when the token has several audiences
    scope: str | None = None
    claims: dict[str, Any] | None = None


@dataclass(frozen=True)
class Rejection:
    """A request a guarded backend refused before handling it (no credentials recorded)."""

    http_method: str
    status: int
    reason: str
    at: float = field(default_factory=time.monotonic)


class Unauthorized(Exception):
    """Raise from an ``authorize`` hook to refuse a request (default HTTP 401)."""

    def __init__(self, reason: str, *, status: int = 401, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.headers = dict(headers or {})


class GuardedMcpBackend(RawMcpBackend):
    """A :class:`RawMcpBackend` with an ``authorize(request)`` hook run before EVERY request.

    The hook (sync hooks run in a worker thread, async ones on the loop) returns a claims
    mapping or ``None`` to let the request through, or raises :class:`Unauthorized`
    (answered as ``{"error": ..., "error_description": reason}`` with its status/headers and
    recorded in ``.rejections``, never in ``.received``). Returned claims land on the
    request's ``.received`` entries (:class:`AuthedReceivedMessage`). Header values named in
    ``redact_headers`` are recorded as ``<redacted>`` (scheme kept, e.g. ``Bearer <redacted>``).
    """

    def __init__(
        self,
        name: str,
        handlers: dict[str, Handler] | None = None,
        *,
        authorize: Callable[[Any], Any] | None = None,
        redact_headers: Iterable[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(name, handlers, **kwargs)
        self.authorize = authorize
        self.redact_headers = frozenset(h.lower() for h in redact_headers)
        self._rejections: list[Rejection] = []

    @property
    def rejections(self) -> list[Rejection]:
        with self._lock:
            return list(self._rejections)

    async def _endpoint(self, request: Any) -> Any:
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import JSONResponse

        if self.authorize is not None:
            try:
                if inspect.iscoroutinefunction(self.authorize):
                    claims = await self.authorize(request)
                else:
                    claims = await run_in_threadpool(self.authorize, request)
            except Unauthorized as exc:
                with self._lock:
                    self._rejections.append(Rejection(request.method, exc.status, exc.reason))
                error = "invalid_token" if exc.status == 401 else "forbidden"
                return JSONResponse({"error": error, "error_description": exc.reason},
                                    status_code=exc.status, headers=exc.headers)
            request.state.claims = dict(claims) if claims is not None else None
        return await super()._endpoint(request)

    def _redacted(self, name: str, value: str) -> str:
        if name.lower() not in self.redact_headers:
            return value
        scheme, sep, _ = value.partition(" ")
        return f"{scheme} {REDACTED}" if sep else REDACTED

    def _record(self, payload: Any, request: Any) -> ReceivedMessage:
        payload_dict = payload if isinstance(payload, dict) else {}
        claims = getattr(request.state, "claims", None)
        message = AuthedReceivedMessage(
            method=payload_dict.get("method"),
            id=payload_dict.get("id"),
            params=payload_dict.get("params"),
            session_id=request.headers.get(SESSION_HEADER),
            protocol_version=request.headers.get(PROTOCOL_VERSION_HEADER),
            headers=HeaderDict((k, self._redacted(k, v)) for k, v in request.headers.items()),
            payload=payload,
            subject=claims.get("sub") if claims else None,
            audience=claims.get("aud") if claims else None,
            scope=claims.get("scope") if claims else None,
            claims=claims,
        )
        with self._lock:
            self._received.append(message)
        return message


# Asymmetric algorithms only: HS* (incl. the RSA-public-key-as-HMAC-secret confusion) and
# "none" are refused whatever the token header says.
ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


class BearerJwtVerifier:
    """``authorize`` hook: ``Authorization: Bearer <JWT>`` checked against an IdP's JWKS.

    The JWKS is fetched over HTTP (PyJWT's ``PyJWKClient``), cached for ``jwks_cache_seconds``
    and refetched at once when a token names an unknown kid. Checks signature (asymmetric
    algorithms only, and the algorithm of the matching JWK), ``iss``, ``aud``, ``exp``,
    ``nbf``; requires ``sub``. Failures raise :class:`Unauthorized` with
    ``WWW-Authenticate: Bearer realm=..., error="invalid_token"`` (also when the token is
    missing, so clients always see the same challenge).
    """

    def __init__(self, jwks_url: str, issuer: str, audience: str, *, realm: str = "mcp",
                 jwks_cache_seconds: float = 300.0, leeway: float = 0.0) -> None:
        import jwt

        self.issuer = issuer
        self.audience = audience
        self.realm = realm
        self.leeway = leeway
        self._jwks = jwt.PyJWKClient(jwks_url, cache_keys=False, cache_jwk_set=True, lifespan=jwks_cache_seconds,
                                     timeout=5, cooldown_duration=0)

    def refresh_jwks(self) -> None:
        """Drop the cached JWKS (e.g. after ``rotate_rsa_key(drop_old=True)``)."""
        self._jwks.get_jwk_set(refresh=True)

    def _refuse(self, description: str) -> Unauthorized:
        challenge = f'Bearer realm="{self.realm}", error="invalid_token", error_description="{description}"'
        return Unauthorized(description, headers={"WWW-Authenticate": challenge})

    def __call__(self, request: Any) -> dict[str, Any]:
        import jwt

        header = request.headers.get("authorization")
        if not header:
            raise self._refuse("missing bearer token")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise self._refuse("not a bearer token")
        try:
            key = self._jwks.get_signing_key_from_jwt(token)
            if key.algorithm_name not in ASYMMETRIC_ALGORITHMS:
                raise self._refuse("signing key algorithm not accepted")
            claims = jwt.decode(
                token, key.key, algorithms=[key.algorithm_name], audience=self.audience, issuer=self.issuer,
                leeway=self.leeway, options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise self._refuse(f"token rejected ({type(exc).__name__})") from None
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            raise self._refuse("token has no subject")
        return claims


class AuthedBackend(GuardedMcpBackend):
    """A guarded backend whose ``authorize`` is a :class:`BearerJwtVerifier` (``.verifier``)."""

    verifier: BearerJwtVerifier

    def refresh_jwks(self) -> None:
        self.verifier.refresh_jwks()


def authed_backend(
    name: str,
    idp: Any,
    audience: str,
    tools_by_subject: Mapping[str, Sequence[str]],
    default_tools: Sequence[str] = (),
    *,
    jwks_cache_seconds: float = 300.0,
) -> AuthedBackend:
    """A started raw backend that requires a valid bearer JWT from ``idp`` on every request.

    ``idp`` is anything with ``.jwks_url`` and ``.issuer`` (e.g. ``tests.idp.LocalIdP``).
    Every request, ``initialize`` included, needs ``Authorization: Bearer <JWT>`` signed by
    a key in the IdP's JWKS (fetched over HTTP), with ``iss == idp.issuer``,
    ``aud`` containing ``audience`` and not expired; otherwise HTTP 401 with
    ``WWW-Authenticate: Bearer error="invalid_token"`` (see ``.rejections``).

    ``tools/list`` lists ``tools_by_subject[sub]`` (else ``default_tools``) for the token's
    ``sub``; ``tools/call`` of one of those answers ``"{name}:{tool}:{sub}"``, of any other
    tool -32602. ``.received`` entries carry ``.subject``, ``.audience``, ``.scope`` and
    ``.claims`` of the verified token; the ``Authorization`` header is recorded redacted.
    """
    visible = {subject: tuple(tools) for subject, tools in tools_by_subject.items()}
    default = tuple(default_tools)

    def tools_of(call: RpcCall) -> tuple[str, ...]:
        subject = getattr(call.message, "subject", None)
        return visible.get(subject, default) if subject is not None else default

    def list_tools(call: RpcCall) -> dict[str, Any]:
        return {"tools": [tool_def(tool, f"{tool} on {name}") for tool in tools_of(call)]}

    def call_tool(call: RpcCall) -> dict[str, Any]:
        tool = call.params.get("name")
        if tool not in tools_of(call):
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {tool}")
        return text_result(f"{name}:{tool}:{call.message.subject}")

    verifier = BearerJwtVerifier(idp.jwks_url, idp.issuer, audience, realm=name,
                                 jwks_cache_seconds=jwks_cache_seconds)
    backend = AuthedBackend(name, {"tools/list": list_tools, "tools/call": call_tool},
                            authorize=verifier, redact_headers=("authorization",))
    backend.verifier = verifier
    return backend.start()


def header_backend(
    name: str = "headers",
    required_header: str | None = None,
    expected_value: str | None = None,
) -> GuardedMcpBackend:
    """A started raw backend with ``echo(text)`` -> ``"{name}:{text}"`` and ``whoami()`` -> ``name``.

    With ``required_header``, every request (``initialize`` included) lacking that header
    - or, with ``expected_value``, carrying another value - gets HTTP 401 (see
    ``.rejections``). ``.received[i].headers`` holds every request header, unredacted,
    with case-insensitive lookups, so tests can assert what a client passed through.
    """

    def authorize(request: Any) -> None:
        if required_header is None:
            return None
        value = request.headers.get(required_header)
        challenge = {"WWW-Authenticate": f'Bearer realm="{name}"'} if required_header.lower() == "authorization" else {}
        if value is None:
            raise Unauthorized(f"missing header {required_header}", headers=challenge)
        if expected_value is not None and not _hmac.compare_digest(value.encode(), expected_value.encode()):
            raise Unauthorized(f"wrong value for header {required_header}", headers=challenge)
        return None

    async def call_tool(call: RpcCall) -> dict[str, Any]:
        arguments = call.params.get("arguments") or {}
        tool = call.params.get("name")
        if tool == "echo":
            return text_result(f"{name}:{arguments.get('text', '')}")
        if tool == "whoami":
            return text_result(name)
        raise RpcError(INVALID_PARAMS, f"Unknown tool: {tool}")

    tools = [tool_def("echo", "Echo text back", text="string"), tool_def("whoami", "The backend's name")]
    handlers: dict[str, Handler] = {"tools/list": static_result({"tools": tools}), "tools/call": call_tool}
    return GuardedMcpBackend(name, handlers, authorize=authorize).start()


__all__ += [
    "ASYMMETRIC_ALGORITHMS",
    "AuthedBackend",
    "AuthedReceivedMessage",
    "BearerJwtVerifier",
    "GuardedMcpBackend",
    "HeaderDict",
    "Rejection",
    "Unauthorized",
    "authed_backend",
    "header_backend",
]
