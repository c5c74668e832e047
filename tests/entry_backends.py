"""Backends for tests/security/test_entry_points.py: servers that count every ``tools/call``
they receive, so a test can say a refused call never reached them.

* :func:`gate_backend`: an official-SDK server (both eras: 2025 sessions and 2026-07-28
  requests) with the tools ``echo``, ``secret``, ``hidden``, ``limited`` and ``headed``. Each
  answers ``"<tool>:<text>"``; with ``ask: true`` it first asks the client to confirm (an
  ``input_required`` answer to a 2026-07-28 request, an ``elicitation/create`` mid-call on a
  2025 session). ``headed`` also takes ``region``, marked ``x-mcp-header: Region`` (a
  2026-07-28 client mirrors it in ``Mcp-Param-Region``). ``.calls`` lists the ``tools/call``
  names it received, one per POST (so one per round of a continued call), and counts the
  answers to its mid-call requests (``.calls.answers()``).
* :func:`task_jobs_backend`: the 2026-07-28 tasks backend of tests/task_backends.py whose
  ``slow_compute`` marks ``label`` with ``x-mcp-header: Label``; ``.calls.count(name)`` as above.

No ``from __future__ import annotations``: the SDK reads the tools' annotations at
registration, and the resolver markers must be real objects there.
"""

import json
import threading
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from pydantic import BaseModel, Field

from tests.asgi_bodies import read_body, replaying
from tests.backends import SdkBackend
from tests.task_backends import TaskBackend
from vmcp_actors.demo._serve import serve_asgi_in_thread

GATE_TOOLS = ("echo", "secret", "hidden", "limited", "headed")


class Confirmation(BaseModel):
    ok: bool


def _confirm_if_asked(ask: bool = False) -> Any:
    """Asks the client only when the call says ``ask: true``."""
    return Elicit("Go on?", Confirmation) if ask else Confirmation(ok=True)


def _plain_tool(tool: str) -> Any:
    def call(text: str, confirmation: Annotated[Confirmation, Resolve(_confirm_if_asked)], ask: bool = False) -> str:
        return f"{tool}:{text}" if confirmation.ok else f"{tool}: not confirmed"

    call.__doc__ = f"The {tool} tool: answers '{tool}:<text>' (asks first when ask is true)."
    return call


def _headed(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})], text: str,
            confirmation: Annotated[Confirmation, Resolve(_confirm_if_asked)], ask: bool = False) -> str:
    """Answers 'headed:<region>:<text>' (asks first when ask is true)."""
    return f"headed:{region}:{text}" if confirmation.ok else "headed: not confirmed"


class _CallLog:
    """The ``tools/call`` names a backend received, and how many JSON-RPC responses (a
    client's answers to what the backend asked mid-call) were POSTed to it (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: list[str] = []
        self._answers = 0

    def add(self, name: str) -> None:
        with self._lock:
            self._names.append(name)

    def add_answer(self) -> None:
        with self._lock:
            self._answers += 1

    def answers(self) -> int:
        with self._lock:
            return self._answers

    def count(self, name: str) -> int:
        with self._lock:
            return self._names.count(name)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._names)


class _CountingApp:
    """ASGI middleware: reads a POST's body, notes a ``tools/call`` in ``log``, hands the
    same body on to the app."""

    def __init__(self, app: Any, log: _CallLog) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        if isinstance(payload, dict) and payload.get("method") == "tools/call":
            params = payload.get("params") if isinstance(payload.get("params"), dict) else {}
            self.log.add(str(params.get("name")))
        elif isinstance(payload, dict) and "method" not in payload and ("result" in payload or "error" in payload):
            self.log.add_answer()
        await self.app(scope, replaying(body, receive), send)


class CountingSdkBackend(SdkBackend):
    """An SDK backend whose ``calls`` are the ``tools/call`` names it received."""

    def __init__(self, name: str, server: Any) -> None:
        super().__init__(name, server)
        self.calls = _CallLog()

    def start(self, *, json_response: bool = False, stateless: bool = False) -> "CountingSdkBackend":
        app = self.server.streamable_http_app(json_response=json_response, stateless_http=stateless)
        self._served = serve_asgi_in_thread(_CountingApp(app, self.calls), name=self.name)
        return self


def build_gate_server(name: str = "gate") -> Any:
    srv = MCPServer(name, version="0.0.1", log_level="WARNING")
    for tool in GATE_TOOLS:
        srv.add_tool(_headed if tool == "headed" else _plain_tool(tool), name=tool)
    return srv


def gate_backend(name: str = "gate") -> CountingSdkBackend:
    return CountingSdkBackend(name, build_gate_server(name)).start()


class HeaderedTaskBackend(TaskBackend):
    """tests/task_backends.py's backend, ``slow_compute.label`` marked ``x-mcp-header: Label``."""

    @property
    def calls(self) -> "_ReceivedCalls":
        return _ReceivedCalls(self)

    async def _tools_list(self, request_id: Any, params: dict[str, Any]) -> dict[str, Any]:
        listed = await super()._tools_list(request_id, params)
        tools = []
        for tool in listed["tools"]:
            if tool["name"] == "slow_compute":
                schema = tool["inputSchema"]
                label = {**schema["properties"]["label"], "x-mcp-header": "Label"}
                properties = {**schema["properties"], "label": label}
                tool = {**tool, "inputSchema": {**schema, "properties": properties}}
            tools.append(tool)
        return {**listed, "tools": tools}


class _ReceivedCalls:
    """A task backend's ``tools/call`` names, read like ``CountingSdkBackend.calls``."""

    def __init__(self, backend: TaskBackend) -> None:
        self._backend = backend

    def count(self, name: str) -> int:
        return sum(1 for message in self._backend.requests("tools/call")
                   if isinstance(message.params, dict) and message.params.get("name") == name)


def task_jobs_backend(name: str = "jobs", **options: Any) -> HeaderedTaskBackend:
    return HeaderedTaskBackend(name, **options).start()
