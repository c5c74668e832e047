"""Backends of one MCP era only, made from an official-SDK server app (which serves both).

The official SDK (``mcp`` 2.3) answers both eras on one endpoint: a request whose
``MCP-Protocol-Version`` header names a 2026 revision goes to its stateless 2026-07-28
handler, anything else to its 2025 (``initialize``, sessions) transport. Real backends are
often of one era only; these ASGI middlewares make an SDK app answer as one would:

* :class:`ModernOnly` - a server that speaks only 2026-07-28. A POST whose
  ``MCP-Protocol-Version`` header is absent or names a handshake-era revision (2024-11-05
  to 2025-11-25) - so every ``initialize`` a 2025 client sends - gets HTTP 400 with the
  JSON-RPC error -32022 UnsupportedProtocolVersion, ``data`` ``{"supported":
  ["2026-07-28"], "requested": R}`` (R: an ``initialize``'s ``protocolVersion``, else the
  header, else ``2025-03-26``, the revision a server assumes without the header), and the
  request's id. ``GET`` and ``DELETE`` get 405 (``Allow: POST``): there are no sessions or
  standalone streams. Everything else, an ``initialize`` sent with the 2026-07-28 header
  included (HTTP 404, -32601: a removed method, as the suite's ``server-stateless``
  checks), reaches the SDK's 2026-07-28 handler unchanged.
* :class:`LegacyOnly` - a 2025-11-25 server that never heard of 2026-07-28. A POST whose
  header names anything but a handshake-era revision gets HTTP 400 with the JSON-RPC error
  -32600 ``Bad Request: Unsupported protocol version: V. Supported versions: ...`` (id
  null, no ``data``, no 2026 error code), and ``server/discover`` sent with a handshake-era
  header or none gets -32601 Method not found (HTTP 200, the request's id). Everything
  else (``initialize``, sessions, ``GET`` streams, ``DELETE``) reaches the SDK's 2025
  transport unchanged; an ``initialize`` that offers 2026-07-28 is answered 2025-11-25.

API, for the conformance tests and the integration tests:

* :func:`wrap` ``(app, era)`` - the ASGI app of ``era`` (``"modern"`` or ``"legacy"``), or
  ``app`` itself for ``None`` (both eras). Lifespan and other non-HTTP scopes pass through.
* :func:`start_in_era` ``(backend, era, ...)`` - start an unstarted
  :class:`tests.backends.SdkBackend` (``SdkBackend(name, build_mrtr_server())``,
  ``AskingBackend(name)``, ...) on a loopback port, serving only ``era``; it returns the
  started backend (``.mcp_url``, ``.stop()``; ``backend_entry`` from tests/gateway.py takes
  it). The conformance fixture has its own: ``conformance_backend(era="legacy")``.
* :data:`ERAS` - era name to middleware class.

    from tests.backends import SdkBackend
    from tests.eras import start_in_era
    from tests.mrtr_backends import build_mrtr_server

    backend = start_in_era(SdkBackend("asker", build_mrtr_server("asker")), "legacy")
    gateway = start_gateway({"backends": [backend_entry("asker", backend)]})  # probes: 2025-11-25
"""

from __future__ import annotations

import json
from typing import Any

from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from tests.asgi_bodies import read_body, replaying

MODERN = "modern"
LEGACY = "legacy"
MODERN_VERSION = "2026-07-28"
LEGACY_VERSIONS = frozenset(HANDSHAKE_PROTOCOL_VERSIONS)  # 2024-11-05 .. 2025-11-25
# A server that gets no MCP-Protocol-Version header (and cannot tell otherwise) assumes this one.
ASSUMED_WITHOUT_HEADER = "2025-03-26"

UNSUPPORTED_PROTOCOL_VERSION = -32022
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601

assert MODERN_VERSION in MODERN_PROTOCOL_VERSIONS, "the SDK no longer serves 2026-07-28"


# -- ASGI plumbing ----------------------------------------------------------------------


async def _answer(send: Any, status: int, body: dict[str, Any] | None,
                  headers: list[tuple[bytes, bytes]] | None = None) -> None:
    payload = json.dumps(body).encode() if body is not None else b""
    extra = [(b"content-type", b"application/json")] if body is not None else []
    await send({"type": "http.response.start", "status": status,
                "headers": [*extra, (b"content-length", str(len(payload)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": payload})


def _header(scope: Any, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return None


def _message(body: bytes) -> dict[str, Any]:
    """The JSON-RPC message in a body; ``{}`` for anything else (a batch, bad JSON)."""
    try:
        message = json.loads(body)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


def _error(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


# -- the two eras -----------------------------------------------------------------------


class ModernOnly:
    """ASGI middleware: ``app`` answers as a server that speaks only 2026-07-28 (module doc)."""

    era = MODERN

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] in ("GET", "DELETE"):
            await _answer(send, 405, None, [(b"allow", b"POST")])
            return
        if scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        version = _header(scope, b"mcp-protocol-version")
        body = await read_body(receive)
        message = _message(body)
        if version is None or version in LEGACY_VERSIONS:
            await _answer(send, 400, _error(message.get("id"), UNSUPPORTED_PROTOCOL_VERSION,
                                            "Unsupported protocol version",
                                            {"supported": [MODERN_VERSION], "requested": _requested(message, version)}))
            return
        await self.app(scope, replaying(body, receive), send)


def _requested(message: dict[str, Any], header: str | None) -> str:
    """The revision a refused request asked for: an initialize's offer, else its header."""
    params = message.get("params")
    offered = params.get("protocolVersion") if isinstance(params, dict) else None
    if message.get("method") == "initialize" and isinstance(offered, str):
        return offered
    return header if header is not None else ASSUMED_WITHOUT_HEADER


class LegacyOnly:
    """ASGI middleware: ``app`` answers as a 2025-11-25 server that never heard of 2026-07-28
    (module doc)."""

    era = LEGACY

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        version = _header(scope, b"mcp-protocol-version")
        if version is not None and version not in LEGACY_VERSIONS:
            supported = ", ".join(HANDSHAKE_PROTOCOL_VERSIONS)
            await _answer(send, 400, _error(None, INVALID_REQUEST, f"Bad Request: Unsupported protocol version: "
                                                                   f"{version}. Supported versions: {supported}"))
            return
        body = await read_body(receive)
        message = _message(body)
        if message.get("method") == "server/discover":
            await _answer(send, 200, _error(message.get("id"), METHOD_NOT_FOUND, "Method not found"))
            return
        await self.app(scope, replaying(body, receive), send)


ERAS: dict[str, type[ModernOnly] | type[LegacyOnly]] = {MODERN: ModernOnly, LEGACY: LegacyOnly}


def wrap(app: Any, era: str | None) -> Any:
    """``app`` serving only ``era`` (``"modern"`` or ``"legacy"``), or as it is for None."""
    if era is None:
        return app
    if era not in ERAS:
        raise ValueError(f"unknown era {era!r}: choose from {sorted(ERAS)} or None")
    return ERAS[era](app)


def start_in_era(backend: Any, era: str | None, *, json_response: bool = False, stateless: bool = False) -> Any:
    """Start ``backend`` (an unstarted :class:`tests.backends.SdkBackend`) on a loopback port,
    its SDK app wrapped for ``era``; returns it started (``.mcp_url``, ``.stop()``)."""
    from vmcp_actors.demo._serve import serve_asgi_in_thread

    app = backend.server.streamable_http_app(json_response=json_response, stateless_http=stateless)
    backend._served = serve_asgi_in_thread(wrap(app, era), name=f"{backend.name}-{era or 'both'}")
    return backend
