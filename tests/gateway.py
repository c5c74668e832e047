"""The gateway on a real HTTP server, and small clients for driving it in tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import requests
from werkzeug.serving import make_server

from vmcp_actors.config import config_from_mapping
from vmcp_actors.runtime import start_runtime
from vmcp_actors.web import create_app, stop_app

MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def backend_entry(name: str, served: Any, protocol: str | None = None) -> dict[str, str]:
    """A config `backends` entry for a served test backend; ``protocol`` pins its era
    (``modern`` or ``legacy``; by default the gateway probes it)."""
    entry = {"name": name, "url": served.url + "/mcp"}
    if protocol is not None:
        entry["protocol"] = protocol
    return entry


class GatewayServer:
    """create_app + a threaded werkzeug server on an ephemeral loopback port."""

    def __init__(self, config: dict, host: str = "127.0.0.1"):
        self.config = config_from_mapping(config)
        self.host = host
        self.app = None
        self._server = None
        self._thread: threading.Thread | None = None

    def start(self) -> GatewayServer:
        self.app = create_app(start_runtime(self.config, self.host))
        self._server = make_server(self.host, 0, self.app, threaded=True)
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="gateway-http", daemon=True)
        self._thread.start()
        return self

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return self.base + "/mcp"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None
        if self.app is not None:
            stop_app(self.app)
            self.app = None

    # -- raw protocol helpers ----------------------------------------------------------

    def post(self, message: Any, session_id: str | None = None, headers: dict | None = None, **kwargs) -> requests.Response:
        sent = dict(MCP_HEADERS)
        if session_id:
            sent["Mcp-Session-Id"] = session_id
        sent.update(headers or {})
        if isinstance(message, (bytes, str)):
            return requests.post(self.url, data=message, headers=sent, timeout=30, **kwargs)
        return requests.post(self.url, json=message, headers=sent, timeout=30, **kwargs)

    def initialize(self, version: str = "2025-11-25") -> str:
        """Open a session the raw way; returns its id."""
        response = self.post(
            {"jsonrpc": "2.0", "id": 0, "method": "initialize",
             "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}
        )
        response.raise_for_status()
        session_id = response.headers["Mcp-Session-Id"]
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session_id)
        return session_id

    def rpc(self, session_id: str, method: str, params: dict | None = None, request_id: int = 1) -> dict:
        """One request on a session; the JSON-RPC answer (JSON, or the last SSE event)."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        response = self.post(message, session_id)
        return answer_of(response)


class BearerSession:
    """One user's MCP session on a gateway, opened the raw way with the user's bearer token
    (``INITIALIZE`` then ``notifications/initialized``); every request carries the token."""

    def __init__(self, gateway: GatewayServer, token: str):
        self.gateway = gateway
        self.headers = {"Authorization": f"Bearer {token}"}
        response = gateway.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}},
            headers=self.headers)
        assert response.status_code == 200, response.text
        self.session = response.headers["Mcp-Session-Id"]
        gateway.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, self.session, headers=self.headers)

    def call(self, tool: str, arguments: dict | None = None) -> requests.Response:
        return self.gateway.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                  "params": {"name": tool, "arguments": arguments or {}}},
                                 self.session, headers=self.headers)


def answer_of(response: requests.Response) -> dict:
    if response.headers.get("Content-Type", "").startswith("text/event-stream"):
        return sse_messages(response)[-1]
    return response.json()


def sse_messages(response: requests.Response) -> list[dict]:
    import json

    from vmcp_actors.protocol.sse import iter_sse_events

    # Events without data (a priming event: an id and a retry) carry no message.
    return [json.loads(event.data) for event in iter_sse_events(response.text.splitlines()) if event.data.strip()]


def run_client(url: str, work: Callable[[Any], Awaitable[Any]], mode: str = "legacy") -> Any:
    """Run ``work(client)`` with the official SDK client connected to ``url``."""
    import mcp

    async def main() -> Any:
        async with mcp.Client(url, mode=mode) as client:
            return await work(client)

    return asyncio.run(main())


# -- small generic helpers (integration tests) -------------------------------------------


def list_all(gateway: GatewayServer, session_id: str, method: str, key: str) -> list[dict]:
    """Every item of a ``*/list`` method, following the gateway's ``nextCursor`` to the end."""
    items: list[dict] = []
    cursor = None
    for _ in range(1000):
        answer = gateway.rpc(session_id, method, {"cursor": cursor} if cursor else {})
        if "error" in answer:
            raise AssertionError(f"{method} failed: {answer['error']}")
        items.extend(answer["result"][key])
        cursor = answer["result"].get("nextCursor")
        if not cursor:
            return items
    raise AssertionError(f"{method} paged too often")


def admin_get(gateway: GatewayServer, path: str = "/admin/state", token: str | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return requests.get(gateway.base + path, headers=headers, timeout=30)


class StreamReader:
    """The messages of a streamed SSE response, read on a thread into ``messages``."""

    def __init__(self, response: requests.Response):
        import queue

        self.response = response
        self.messages: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        import json

        from vmcp_actors.protocol.sse import iter_sse_events

        try:
            for event in iter_sse_events(line.decode() if isinstance(line, bytes) else line
                                         for line in self.response.iter_lines()):
                if event.data.strip():
                    self.messages.put(json.loads(event.data))
        except Exception:  # noqa: BLE001 - the stream was closed by the test
            pass

    def next(self, timeout: float = 10.0) -> dict:
        return self.messages.get(timeout=timeout)

    def close(self) -> None:
        close_stream(self.response)


def close_stream(response: requests.Response) -> None:
    """Close a streamed response that another thread may be reading. A plain close() waits
    for that thread's read to return (the socket's buffer lock), which on a quiet stream is
    the server's next keep-alive, seconds away; shutting the socket down ends the read now."""
    import contextlib
    import os
    import socket

    with contextlib.suppress(OSError, ValueError):  # ValueError: closed already (no file number)
        with socket.socket(fileno=os.dup(response.raw.fileno())) as sock:  # the same socket, its own fd
            sock.shutdown(socket.SHUT_RDWR)
    response.close()


def wait_until(condition: Callable[[], Any], timeout: float = 5.0, interval: float = 0.02) -> Any:
    """Poll ``condition`` until it is truthy; its last value (falsy after the timeout)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


class QuickStopGatewayServer(GatewayServer):
    """A GatewayServer whose serve loop polls every ``poll_interval`` s, so ``stop()`` takes
    milliseconds instead of werkzeug's default 0.5 s (matters for suites starting many gateways)."""

    poll_interval = 0.02

    def start(self) -> QuickStopGatewayServer:
        self.app = create_app(start_runtime(self.config, self.host))
        self._server = make_server(self.host, 0, self.app, threaded=True)
        self.port = self._server.server_port
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": self.poll_interval},
            name="gateway-http",
            daemon=True,
        )
        self._thread.start()
        return self
