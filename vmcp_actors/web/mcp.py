"""The MCP endpoint: streamable HTTP, one JSON-RPC message per POST.

Thin on purpose: HTTP checks, the JSON-RPC envelope, identity; the edge's McpService
runs the request and this writes the Answer it is given, as JSON or SSE, and closes it
however the response ends (the answer's lifetime lets go of what the request held).

A POST to /mcp, the request every tool call is, skips Flask's request machinery
(``McpPosts``, the app's WSGI entry): the same checks, in the same order, by the same
functions, on a werkzeug request.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from collections.abc import Callable, Iterable
from typing import Any

from flask import Blueprint, Flask, Response, g, request
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.wrappers import Request

from vmcp_actors.edge._auth import (
    AuthError,
    IdentityProviderUnavailable,
    www_authenticate,
)
from vmcp_actors.edge._modern import WatchHangup
from vmcp_actors.edge._service import Answer
from vmcp_actors.identity import Identity, anonymous_with
from vmcp_actors.runtime import Runtime
from vmcp_actors.metrics import record_request
from vmcp_actors.protocol import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    JsonRpcError,
    Message,
    error_response,
    parse_message,
)
from vmcp_actors.protocol.mcp import (
    METHOD_HEADER,
    NAME_HEADER,
    PARAM_HEADER_PREFIX,
    PROTOCOL_VERSION_HEADER,
    SESSION_HEADER,
)
from vmcp_actors.tracing import request_span, tracing_on
from vmcp_actors.users._gateway import short_id
from vmcp_actors.web._hangups import process_hangups, request_socket
from vmcp_actors.web._installed import EXTENSION_KEY, current_runtime
from vmcp_actors.web._responses import error_answer, json_response, rpc_error
from vmcp_actors.web._security import host_allowed, origin_allowed
from vmcp_actors.web.wellknown import advertised_scopes, resource_metadata_url

logger = logging.getLogger("vmcp_actors.requests")

bp = Blueprint("mcp", __name__)


# CORS for browser-based hosts at an origin in operational.allowedOrigins (an MCP Apps host
# page, say): what they may send and read. Only listed origins: a browser page anywhere else
# gets no CORS answer, so it cannot read what the gateway says.
CORS_METHODS = "GET, POST, DELETE, OPTIONS"
CORS_HEADERS = ("authorization", "content-type", "accept", "last-event-id", SESSION_HEADER.lower(),
                PROTOCOL_VERSION_HEADER.lower(), METHOD_HEADER.lower(), NAME_HEADER.lower())
CORS_EXPOSED = f"{SESSION_HEADER}, {PROTOCOL_VERSION_HEADER}, WWW-Authenticate, Retry-After"
CORS_MAX_AGE = "600"


def _cors_origin(runtime: Runtime, origin: str | None) -> str | None:
    """The request's Origin when it is one the operator listed for browser hosts."""
    return origin if origin is not None and origin in runtime.config.operational.allowed_origins else None


@bp.before_request
def answer_preflight() -> Response | None:
    """A browser's CORS preflight, before anything asks for credentials (it carries none)."""
    if request.method != "OPTIONS":
        return None
    origin = _cors_origin(current_runtime(), request.headers.get("Origin"))
    response = Response(status=204)
    response.headers["Vary"] = "Origin"
    if origin is None:
        return response  # no CORS headers: the browser refuses the request it asked about
    asked = [name.strip().lower() for name in request.headers.get("Access-Control-Request-Headers", "").split(",")
             if name.strip()]
    allowed = [name for name in asked if name in CORS_HEADERS or name.startswith(PARAM_HEADER_PREFIX.lower())]
    response.headers.update({"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Methods": CORS_METHODS,
                             "Access-Control-Allow-Headers": ", ".join(allowed or CORS_HEADERS),
                             "Access-Control-Max-Age": CORS_MAX_AGE})
    return response


@bp.after_request
def allow_listed_origin(response: Response) -> Response:
    return _with_cors(response, current_runtime(), request.headers.get("Origin"))


def _with_cors(response: Response, runtime: Runtime, origin_header: str | None) -> Response:
    origin = _cors_origin(runtime, origin_header)
    if origin is not None and "Access-Control-Allow-Origin" not in response.headers:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = CORS_EXPOSED
        response.vary.add("Origin")
    return response


@bp.before_request
def protect_from_dns_rebinding() -> Response | None:
    return _rebinding_refusal(current_runtime(), request)


def _rebinding_refusal(runtime: Runtime, asked: Request) -> Response | None:
    if not host_allowed(runtime, asked.host) or not origin_allowed(runtime, asked.headers.get("Origin")):
        return rpc_error(403, INVALID_REQUEST, "Forbidden: Host or Origin not allowed")
    return None


@bp.before_request
def authenticate() -> Response | None:
    """Who is calling, before anything of the request is parsed. The views pass the
    identity on explicitly; nothing below the web layer reads it from here."""
    identity = _caller(current_runtime(), request)
    if isinstance(identity, Response):
        return identity
    g.vmcp_identity = identity
    return None


def _caller(runtime: Runtime, asked: Request) -> Identity | Response:
    """Who is calling, or the refusal to answer (once: checking a token may end its grant)."""
    try:
        identity = runtime.authenticator.authenticate(asked.headers.get("Authorization"))
    except AuthError as error:
        response = json_response({"error": error.error or "unauthorized", "error_description": error.reason}, 401)
        response.headers["WWW-Authenticate"] = www_authenticate(
            resource_metadata_url(runtime, asked.host_url), error, advertised_scopes(runtime))
        _log(asked.method, asked.headers.get(SESSION_HEADER), time.monotonic(), 401)
        return response
    except IdentityProviderUnavailable:
        return rpc_error(503, INTERNAL_ERROR, "Service Unavailable: the identity provider cannot be reached")
    return _with_forwarded(runtime, asked, identity)


def _with_forwarded(runtime: Runtime, asked: Request, identity: Identity | None) -> Identity:
    """The caller, with the headers the config passes through to backends."""
    forwarded = tuple(
        (name, asked.headers[name]) for name in runtime.config.outgoing_auth.passthrough_headers
        if name in asked.headers
    )
    if identity is None:
        return anonymous_with(forwarded)
    return replace(identity, forwarded_headers=forwarded) if forwarded else identity


@bp.get("/mcp")
def open_stream() -> Response:
    """The session's standalone stream: what backends send outside any call."""
    started = time.monotonic()
    if "Accept" not in request.headers or request.accept_mimetypes.quality("text/event-stream") <= 0:
        return rpc_error(406, INVALID_REQUEST, "Not Acceptable: Accept must include text/event-stream")
    answer = current_runtime().service.open_stream(
        request.headers.get(SESSION_HEADER), _identity(), request.headers.get(PROTOCOL_VERSION_HEADER),
        request.headers.get("Last-Event-ID"),
    )
    return _write(answer, "GET", started)


@bp.delete("/mcp")
def end_session() -> Response:
    answer = current_runtime().service.delete(request.headers.get(SESSION_HEADER), _identity(),
                                              request.headers.get(PROTOCOL_VERSION_HEADER))
    return _write(answer, "DELETE", time.monotonic())


@bp.post("/mcp")
def post_message() -> Response:
    return _post(request, current_runtime(), _identity())


class McpPosts:
    """The app's WSGI entry: a POST to /mcp is served here, on a werkzeug request, with the
    checks Flask's hooks make for it (Host and Origin, identity, CORS) and the app's error
    answers; any other request goes to Flask."""

    def __init__(self, app: Flask):
        self._flask = app.wsgi_app
        self._runtime: Runtime = app.extensions[EXTENSION_KEY]
        self._body_limit = app.config["MAX_CONTENT_LENGTH"]

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "POST" or environ.get("PATH_INFO") != "/mcp":
            return self._flask(environ, start_response)
        asked = Request(environ)
        asked.max_content_length = self._body_limit
        runtime = self._runtime
        try:
            response = _rebinding_refusal(runtime, asked)
            if response is None:
                identity = _caller(runtime, asked)
                response = identity if isinstance(identity, Response) else _post(asked, runtime, identity)
        except Exception as error:  # noqa: BLE001 - answered as the app's error handlers answer it
            response = error_answer(error)
        return _with_cors(response, runtime, asked.headers.get("Origin"))(environ, start_response)


def _post(asked: Request, runtime: Runtime, identity: Identity) -> Response:
    started = time.monotonic()
    accept = asked.accept_mimetypes  # quality() honours wildcards and q=0 refusals
    if accept.quality("application/json") <= 0 or accept.quality("text/event-stream") <= 0:
        return rpc_error(406, INVALID_REQUEST, "Not Acceptable: Accept must include application/json and text/event-stream")
    if asked.mimetype != "application/json":
        return rpc_error(415, INVALID_REQUEST, "Unsupported Media Type: Content-Type must be application/json")
    try:
        message = parse_message(_read_body(asked))
    except JsonRpcError as error:
        return _write(Answer(400, error_response(None, error)), "-", started)
    session_id = asked.headers.get(SESSION_HEADER)
    if not tracing_on():
        return _answer(asked, runtime, identity, message, session_id, started)
    params = message.params if isinstance(message.params, dict) else {}
    target = params.get("uri" if message.method == "resources/read" else "name")
    with request_span(message.method or message.kind, asked.headers, {
            "mcp.method.name": message.method, "mcp.session.id": short_id(session_id) if session_id else None,
            "mcp.target": target if isinstance(target, str) else None}):
        return _answer(asked, runtime, identity, message, session_id, started)


def _answer(asked: Request, runtime: Runtime, identity: Identity, message: Message, session_id: str | None,
            started: float) -> Response:
    answer = runtime.service.post(
        message, identity, session_id, _field(asked, PROTOCOL_VERSION_HEADER),
        _field(asked, METHOD_HEADER), _field(asked, NAME_HEADER),
        # werkzeug's header names, from the environ directly: Mcp-Param-X-Y is HTTP_MCP_PARAM_X_Y
        {key[_PARAM_KEY_LENGTH:].replace("_", "-").lower(): _ows(value) for key, value in asked.environ.items()
         if key.startswith(_PARAM_KEY)},
        _hangup_watch(asked),
    )
    return _write(answer, message.method or message.kind, started)


_PARAM_KEY = "HTTP_" + PARAM_HEADER_PREFIX.upper().replace("-", "_")
_PARAM_KEY_LENGTH = len(_PARAM_KEY)


def _write(answer: Answer, method: str, started: float) -> Response:
    """The Answer as an HTTP response; ``answer.close()`` runs however the response ends
    (for an SSE body, even one never read)."""
    if answer.stream is not None:
        response = Response(answer.stream, mimetype="text/event-stream", headers={"Cache-Control": "no-cache"})
    elif answer.body is not None:
        response = json_response(answer.body, answer.status)
    else:
        response = Response(status=answer.status)
    response.headers.update(answer.headers)
    if answer.status in (429, 503) and "Retry-After" not in response.headers:
        retry_after = _retry_after_of(answer.body)
        if retry_after is not None:
            response.headers["Retry-After"] = str(retry_after)
    status, streamed = response.status_code, answer.stream is not None

    def finished() -> None:
        answer.close()
        _log(method, answer.session_id, started, status, streamed)

    if streamed:
        response.call_on_close(finished)
    else:
        finished()
    return response


def _retry_after_of(body: dict | None) -> int | None:
    """A busy or rate-limited refusal's ``data.retryAfterSeconds``, for its Retry-After header."""
    error = body.get("error") if isinstance(body, dict) else None
    data = error.get("data") if isinstance(error, dict) else None
    seconds = data.get("retryAfterSeconds") if isinstance(data, dict) else None
    return seconds if isinstance(seconds, int) and not isinstance(seconds, bool) and seconds >= 0 else None


def _read_body(asked: Request) -> bytes:
    """The body, refusing more than MAX_CONTENT_LENGTH bytes (413) even without a Content-Length:
    werkzeug's limited stream stops quietly at the limit, which would parse a truncated body."""
    if asked.content_length is not None:
        return asked.get_data(cache=False)
    limit = asked.max_content_length
    chunks: list[bytes] = []
    size = 0
    while chunk := asked.stream.read(65536):
        size += len(chunk)
        if limit is not None and size > limit:
            raise RequestEntityTooLarge()
        chunks.append(chunk)
    if asked.stream.read(1):  # data beyond the limit that the stream held back
        raise RequestEntityTooLarge()
    return b"".join(chunks)


def _hangup_watch(asked: Request) -> WatchHangup | None:
    sock = request_socket(asked.environ)
    if sock is None:
        return None
    hangups = process_hangups()
    return lambda on_hangup: hangups.watch(sock, on_hangup)


def _ows(value: str) -> str:
    return value.strip(" \t")  # RFC 9110 5.5: a field value excludes the whitespace around it


def _field(asked: Request, name: str) -> str | None:
    value = asked.headers.get(name)
    return _ows(value) if value is not None else None


def _identity() -> Identity | None:
    return g.vmcp_identity  # set by authenticate() for every request of this blueprint


def _log(method: str, session_id: str | None, started: float, status: int, streamed: bool = False) -> None:
    record_request(method, status, time.monotonic() - started)
    logger.info(
        "%s session=%s status=%s%s duration_ms=%.1f",
        method,
        short_id(session_id) if session_id else "-",
        status,
        " sse" if streamed else "",
        (time.monotonic() - started) * 1000,
    )
