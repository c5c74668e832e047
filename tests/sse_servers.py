"""An official-SDK ``MCPServer`` on the 2024-11-05 HTTP+SSE transport (``sse_app``: the
event stream at ``/sse``, messages POSTed to ``/messages/?session_id=...``) under uvicorn
on a loopback port, behind a recorder that notes every request as the server gets it.

What tests do to it: :meth:`SseBackend.restart` (stopped, then served again on the same
port: every stream ends, every session is forgotten) and :meth:`SseBackend.end_streams`
(the running server ends the sessions of its open event streams, and the streams end
cleanly, or break the connection, or go silent: the connection stays open and carries
nothing more, as a stream cut off by the network looks to the client).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Self
from urllib.parse import parse_qs

import anyio

from tests.asgi_bodies import read_body, replaying
from vmcp_actors.demo._serve import ServedApp, serve_asgi_in_thread

_SESSION_IN_ENDPOINT = re.compile(rb"session_id=([0-9a-f]+)")


@dataclass
class SeenRequest:
    """One HTTP request the server got: its event stream's GET or a message's POST."""

    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    session: str | None = None  # the stream's session (a GET's: from its endpoint event)
    message: dict[str, Any] = field(default_factory=dict)  # a POST's JSON-RPC message

    @property
    def rpc_method(self) -> str | None:
        return self.message.get("method")


class _Recorder:
    """ASGI middleware: notes each request (a POST's body read first and handed on as it
    came), and runs each event stream in a cancel scope :meth:`end_streams` can cancel."""

    def __init__(self) -> None:
        self.app: Any = None
        self.seen: list[SeenRequest] = []  # appended on the server's loop only
        self._streams: set[anyio.CancelScope] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._how = "end"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self._loop = asyncio.get_running_loop()
        seen = SeenRequest(scope["method"], scope["path"],
                           {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]})
        if scope["method"] == "POST":
            seen.session = parse_qs(scope["query_string"].decode()).get("session_id", [None])[0]
            body = await read_body(receive)
            try:
                seen.message = json.loads(body)
            except ValueError:
                pass
            self.seen.append(seen)
            await self.app(scope, replaying(body, receive), send)
            return
        if scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        self.seen.append(seen)
        await self._stream(seen, scope, receive, send)

    async def _stream(self, seen: SeenRequest, scope: Any, receive: Any, send: Any) -> None:
        complete = False

        async def noting_send(message: Any) -> None:
            nonlocal complete
            if message["type"] == "http.response.body":
                found = _SESSION_IN_ENDPOINT.search(message.get("body", b""))
                if seen.session is None and found:
                    seen.session = found.group(1).decode()
                complete = not message.get("more_body", False)
            await send(message)

        with anyio.CancelScope() as stream:
            self._streams.add(stream)
            try:
                await self.app(scope, receive, noting_send)
            finally:
                self._streams.discard(stream)
        if stream.cancelled_caught and not complete:
            if self._how == "break":  # uvicorn closes the connection mid-stream on an app's error
                raise ConnectionAbortedError("the test broke this event stream")
            if self._how == "silence":
                await anyio.sleep_forever()  # until the server stops
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    def end_streams(self, how: str) -> None:
        """(From any thread.) End the SDK's session of every open event stream, and the
        stream as ``how`` says (see :meth:`SseBackend.end_streams`)."""
        loop = self._loop
        if loop is None:
            return
        done = threading.Event()

        def cancel() -> None:
            self._how = how
            for stream in list(self._streams):
                stream.cancel()
            done.set()

        loop.call_soon_threadsafe(cancel)
        done.wait(5)


class SseBackend:
    """``server`` (an ``MCPServer``) served with ``sse_app()`` on a loopback port.

    ``.sse_url`` is its event stream; ``.seen`` every request it got, in order."""

    def __init__(self, server: Any, name: str = "sse") -> None:
        self.server = server
        self.name = name
        self._recorder = _Recorder()
        self._served: ServedApp | None = None
        self.port = 0

    def start(self) -> Self:
        self._recorder.app = self.server.sse_app()  # a new transport: no session of before
        self._served = serve_asgi_in_thread(self._recorder, port=self.port, name=self.name)
        self.port = self._served.port
        return self

    def stop(self) -> None:
        if self._served is not None:
            self._served.stop()
            self._served = None

    def restart(self) -> None:
        """Stop (open streams end) and serve again on the same port, knowing no session."""
        self.stop()
        self.start()

    def end_streams(self, how: str = "end") -> None:
        """The running server ends the sessions of its open event streams (a message for
        one is answered 404) and ``how`` the streams go: ``"end"`` (the response ends),
        ``"break"`` (the connection breaks mid-stream) or ``"silence"`` (the connection
        stays open and carries nothing more, until the server stops)."""
        assert how in ("end", "break", "silence"), how
        self._recorder.end_streams(how)

    @property
    def sse_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/sse"

    @property
    def seen(self) -> list[SeenRequest]:
        return list(self._recorder.seen)

    def streams(self) -> list[SeenRequest]:
        """The event streams' GETs."""
        return [seen for seen in self.seen if seen.method == "GET"]

    def posted(self, rpc_method: str | None = None) -> list[SeenRequest]:
        """The POSTed messages (of ``rpc_method`` only, when given)."""
        return [seen for seen in self.seen
                if seen.method == "POST" and (rpc_method is None or seen.rpc_method == rpc_method)]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
