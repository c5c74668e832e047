"""The MCP endpoint: streamable HTTP, one JSON-RPC message per POST.

Thin on purpose: HTTP and envelope checks, session lookup, identity, forward, then
write the answer as JSON or SSE. MCP semantics live in the sessions package.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pykka
from flask import Blueprint, Response, current_app, g, request
from werkzeug.exceptions import RequestEntityTooLarge

from vmcp_actors import __version__
from vmcp_actors.concurrency import ASK_TIMEOUT
from vmcp_actors.gateway import SessionDirectory, short_id
from vmcp_actors.identity import Identity, anonymous_with
from vmcp_actors.protocol import (
    ACCEPTED_PROTOCOL_HEADER_VERSIONS,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    JsonRpcError,
    encode_sse_event,
    error_response,
    negotiate_protocol_version,
    parse_message,
    result_response,
)
from vmcp_actors.protocol.mcp import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from vmcp_actors.sessions import RelayEvent
from vmcp_actors.web._responses import json_response, rpc_error
from vmcp_actors.web._auth import AuthError, IdentityProviderUnavailable, www_authenticate
from vmcp_actors.web._runtime import current_runtime
from vmcp_actors.web.wellknown import resource_metadata_url
from vmcp_actors.web._security import host_allowed, origin_allowed

logger = logging.getLogger("vmcp_actors.requests")

bp = Blueprint("mcp", __name__)

# What the gateway implements towards clients, whatever the backends turn out to have.
SERVER_CAPABILITIES = {
    "tools": {"listChanged": False},
    "resources": {"subscribe": False, "listChanged": False},
    "prompts": {"listChanged": False},
    "logging": {},
    "completions": {},
}


class Unavailable(Exception):
    """The actor system did not answer: the process is shutting down or overloaded."""


@bp.before_request
def protect_from_dns_rebinding() -> Response | None:
    runtime = current_runtime()
    if not host_allowed(runtime, request.host) or not origin_allowed(runtime, request.headers.get("Origin")):
        return rpc_error(403, INVALID_REQUEST, "Forbidden: Host or Origin not allowed")
    return None


@bp.before_request
def authenticate() -> Response | None:
    """Who is calling, before anything of the request is parsed. The views pass the
    identity on explicitly; nothing below the web layer reads it from here."""
    runtime = current_runtime()
    try:
        identity = runtime.authenticator.authenticate(request.headers.get("Authorization"))
    except AuthError as error:
        response = json_response({"error": error.error or "unauthorized", "error_description": error.reason}, 401)
        response.headers["WWW-Authenticate"] = www_authenticate(resource_metadata_url(), error)
        _log(request.method, request.headers.get(SESSION_HEADER), time.monotonic(), 401)
        return response
    except IdentityProviderUnavailable:
        return rpc_error(503, INTERNAL_ERROR, "Service Unavailable: the identity provider cannot be reached")
    forwarded = tuple(
        (name, request.headers[name]) for name in runtime.config.outgoing_auth.passthrough_headers
        if name in request.headers
    )
    if identity is None:
        g.vmcp_identity = anonymous_with(forwarded)
    else:
        g.vmcp_identity = replace(identity, forwarded_headers=forwarded) if forwarded else identity
    return None


@bp.get("/mcp")
def open_stream() -> Response:
    response = rpc_error(405, INVALID_REQUEST, "Method Not Allowed: this server offers no standalone SSE stream")
    response.headers["Allow"] = "POST, DELETE"
    return response


@bp.delete("/mcp")
def end_session() -> Response:
    session_id = request.headers.get(SESSION_HEADER)
    if not session_id:
        return rpc_error(400, INVALID_REQUEST, f"Bad Request: missing {SESSION_HEADER} header")
    try:
        ended = _ask(current_runtime().gateway.end_session(session_id, _identity()))
    except Unavailable:
        return rpc_error(503, INTERNAL_ERROR, "Service Unavailable: the gateway is shutting down or overloaded")
    if not ended:
        return rpc_error(404, INVALID_REQUEST, "Session not found")
    return Response(status=200)


@dataclass
class _Served:
    """What one POST turned out to be, for its log line and the session's idle clock."""

    started: float
    sessions: SessionDirectory  # captured here: an SSE stream finishes outside the app context
    method: str = "-"
    session_id: str | None = None
    session_found: bool = False

    def finish(self, status: int, streamed: bool = False) -> None:
        if self.session_found:
            self.sessions.finish(self.session_id)
        _log(self.method, self.session_id, self.started, status, streamed)


@bp.post("/mcp")
def post_message() -> Response:
    served = _Served(time.monotonic(), current_runtime().sessions)
    response = _serve_post(served)
    if not response.is_streamed:
        served.finish(response.status_code)
    return response


def _serve_post(served: _Served) -> Response:
    accept = request.accept_mimetypes  # quality() honours wildcards and q=0 refusals
    if accept.quality("application/json") <= 0 or accept.quality("text/event-stream") <= 0:
        return rpc_error(406, INVALID_REQUEST, "Not Acceptable: Accept must include application/json and text/event-stream")
    if request.mimetype != "application/json":
        return rpc_error(415, INVALID_REQUEST, "Unsupported Media Type: Content-Type must be application/json")
    try:
        message = parse_message(_read_body())
    except JsonRpcError as error:
        return json_response(error_response(None, error), 400)
    served.method = message.method or message.kind

    if message.is_request and message.method == "server/discover":
        # The stateless revision (2026-07-28) is not served yet: SDK clients in auto mode
        # take this error as the cue to fall back to initialize.
        return json_response(error_response(message.id, JsonRpcError(METHOD_NOT_FOUND, "Method not found: server/discover")))
    header_version = request.headers.get(PROTOCOL_VERSION_HEADER)
    if header_version is not None and header_version not in ACCEPTED_PROTOCOL_HEADER_VERSIONS:
        return rpc_error(400, INVALID_REQUEST, f"Bad Request: unsupported {PROTOCOL_VERSION_HEADER}: {header_version[:40]}")

    identity = _identity()
    try:
        if message.is_request and message.method == "initialize":
            return _initialize(message, identity, served)
        served.session_id = request.headers.get(SESSION_HEADER)
        if not served.session_id:
            return rpc_error(400, INVALID_REQUEST, f"Bad Request: missing {SESSION_HEADER} header", message.id)
        handle = current_runtime().sessions.find(served.session_id, identity)
        if handle is None:
            return rpc_error(404, INVALID_REQUEST, "Session not found", message.id)
        served.session_found = True
        if not message.is_request:
            return Response(status=202)  # notifications and client responses need no answer
        relay = handle.dispatcher.handle(identity, message)
        return _write_relay(relay.events(), served)
    except Unavailable:
        return rpc_error(503, INTERNAL_ERROR, "Service Unavailable: the gateway is shutting down or overloaded", message.id)


def _initialize(message: Any, identity: Identity | None, served: _Served) -> Response:
    params = message.params if isinstance(message.params, dict) else {}
    if not isinstance(params.get("protocolVersion"), str):
        return json_response(error_response(message.id, JsonRpcError(INVALID_PARAMS, "protocolVersion is required")))
    runtime = current_runtime()
    version = negotiate_protocol_version(params["protocolVersion"])
    handle = _ask(runtime.gateway.create_session(identity, version))
    served.session_id = handle.session_id
    result = {
        "protocolVersion": version,
        "capabilities": SERVER_CAPABILITIES,
        "serverInfo": {"name": runtime.config.name, "version": __version__},
    }
    return json_response(result_response(message.id, result), headers={SESSION_HEADER: handle.session_id})


def _write_relay(events: Iterator[RelayEvent], served: _Served) -> Response:
    first = next(events)
    if first.final:
        return json_response(first.message, first.http_status)

    def stream() -> Iterator[str]:
        try:
            yield encode_sse_event(first.message)
            for event in events:
                yield encode_sse_event(event.message)
        finally:  # also when the client goes away mid-stream
            events.close()
            served.finish(200, streamed=True)

    return Response(stream(), mimetype="text/event-stream", headers={"Cache-Control": "no-cache"})


def _read_body() -> bytes:
    """The body, refusing more than MAX_CONTENT_LENGTH bytes (413) even without a Content-Length:
    werkzeug's limited stream stops quietly at the limit, which would parse a truncated body."""
    if request.content_length is not None:
        return request.get_data(cache=False)
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    chunks: list[bytes] = []
    size = 0
    while chunk := request.stream.read(65536):
        size += len(chunk)
        if size > limit:
            raise RequestEntityTooLarge()
        chunks.append(chunk)
    if request.stream.read(1):  # data beyond the limit that the stream held back
        raise RequestEntityTooLarge()
    return b"".join(chunks)


def _identity() -> Identity | None:
    return g.vmcp_identity  # set by authenticate() for every request of this blueprint


def _ask(future: Any) -> Any:
    try:
        return future.get(timeout=ASK_TIMEOUT)
    except (pykka.ActorDeadError, pykka.Timeout):
        raise Unavailable() from None


def _log(method: str, session_id: str | None, started: float, status: int, streamed: bool = False) -> None:
    logger.info(
        "%s session=%s status=%s%s duration_ms=%.1f",
        method,
        short_id(session_id) if session_id else "-",
        status,
        " sse" if streamed else "",
        (time.monotonic() - started) * 1000,
    )
