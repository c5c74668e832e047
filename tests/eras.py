"""Backends of one era only, made from an official-SDK server app (which serves both).

* :class:`ModernOnly`: answers as a server that speaks only 2026-07-28: a POST whose
  ``MCP-Protocol-Version`` header is absent or names a 2025 revision (``initialize``
  included) gets 400 with -32022 UnsupportedProtocolVersion (``supported``: 2026-07-28);
  GET and DELETE get 405.
* :class:`LegacyOnly`: answers as a 2025-11-25 server that never heard of 2026-07-28: a
  POST whose header names any other revision gets 400 with -32600 (no 2026 error code),
  and ``server/discover`` sent with a 2025 header or none is -32601.

ASGI middlewares: wrap the app before serving it (``conformance_backend(era=...)``).
"""

from __future__ import annotations

import json
from typing import Any

LEGACY_VERSIONS = frozenset({"2025-11-25", "2025-06-18", "2025-03-26"})
MODERN_VERSION = "2026-07-28"


async def _answer(send: Any, status: int, body: dict[str, Any] | None) -> None:
    payload = json.dumps(body).encode() if body is not None else b""
    headers = [(b"content-type", b"application/json")] if body is not None else []
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _header(scope: Any, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    """The body read already, then whatever the client sends next (its disconnect)."""
    sent = False

    async def replayed() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


class ModernOnly:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] in ("GET", "DELETE"):
            await _answer(send, 405, None)
            return
        version = _header(scope, b"mcp-protocol-version")
        if version is None or version in LEGACY_VERSIONS:
            await _answer(send, 400, {"jsonrpc": "2.0", "id": None, "error": {
                "code": -32022, "message": "Unsupported protocol version",
                "data": {"supported": [MODERN_VERSION], "requested": version}}})
            return
        await self.app(scope, receive, send)


class LegacyOnly:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        version = _header(scope, b"mcp-protocol-version")
        if version is not None and version not in LEGACY_VERSIONS:
            await _answer(send, 400, {"jsonrpc": "2.0", "id": None, "error": {
                "code": -32600, "message": f"Bad Request: Unsupported protocol version: {version}"}})
            return
        body = await _body(receive)
        try:
            message = json.loads(body)
        except ValueError:
            message = None
        if isinstance(message, dict) and message.get("method") == "server/discover":
            await _answer(send, 200, {"jsonrpc": "2.0", "id": message.get("id"), "error": {
                "code": -32601, "message": "Method not found"}})
            return
        await self.app(scope, _replay(body, receive), send)


ERAS = {"modern": ModernOnly, "legacy": LegacyOnly}
