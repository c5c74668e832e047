"""MCP streamable HTTP, client side: one thread-safe HTTP client per backend.

The client holds no MCP session state: the BackendConnection actor owns the session id and
the negotiated protocol version and passes them to every call. Many threads call
``McpHttpClient.post`` at once on the same instance, so nothing per call lives on ``self``.

Error messages name the backend, never its URL nor any header value: they may reach MCP
clients. Logs never carry the URL, header values (tokens) or the session id either; failures
are logged by exception class name only, because urllib3's messages embed the URL.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import urllib3
import urllib3.connection
import urllib3.exceptions
from requests.utils import (
    DEFAULT_CA_BUNDLE_PATH,
    get_auth_from_url,
    get_environ_proxies,
    prepend_scheme_if_needed,
    select_proxy,
)
from urllib3 import HTTPResponse
from urllib3.util import make_headers

from vmcp_actors import __version__
from vmcp_actors.exceptions import (
    BackendCancelled,
    BackendError,
    BackendHTTPError,
    BackendProtocolError,
    BackendRpcError,
    BackendSessionExpired,
    BackendTimeout,
    BackendUnavailable,
)
from vmcp_actors.metrics import record_backend
from vmcp_actors.protocol import json_value, wire_bytes
from vmcp_actors.protocol.mcp import (
    MODERN_PROTOCOL_VERSION,
    PROTOCOL_VERSION_HEADER,
    SESSION_HEADER,
)
from vmcp_actors.protocol.sse import iter_sse_events
from vmcp_actors.tracing import backend_span, tracing_on

if TYPE_CHECKING:
    from vmcp_actors.backends._health import CircuitBreaker

logger = logging.getLogger(__name__)
# urllib3 logs each request's target at DEBUG, query string included (a backend's URL may
# carry a key): those lines are never written.
logging.getLogger("urllib3.connectionpool").setLevel(logging.INFO)
# What of a 401 or 403 WWW-Authenticate header is kept (the scopes and metadata it names).
_CHALLENGE_LIMIT = 2048

_JSON = "application/json"
_SSE = "text/event-stream"
_ACCEPT = f"{_JSON}, {_SSE}"

# Largest read from the socket at once. read1() returns what has arrived (up to this), so
# SSE events are handed over as soon as they arrive, whatever their size.
_CHUNK = 64 * 1024
# How much of a body we read only to let the connection go back to the pool (202 answers,
# the tail of an answered SSE stream); beyond it the connection is dropped instead.
_DRAIN_LIMIT = 64 * 1024
# How long we wait for a backend to end an SSE stream after it sent our response (it
# SHOULD end it at once); ending it lets the keep-alive connection be reused.
_DRAIN_GRACE = 0.01
# A backend may end a call's event stream before answering and expect us to resume it
# (GET with Last-Event-ID, 2025-11-25): at most this many resumptions per call in a row
# that bring no event, and never a wait longer than this for its ``retry``.
MAX_EMPTY_RESUMES = 3
MAX_RETRY_WAIT = 5.0
# Body prefix read for the DEBUG log of an unexpected HTTP status.
_ERROR_BODY_PREFIX = 200
_ERROR_BODY_LIMIT = 64 * 1024  # a JSON-RPC error body bigger than this is not read


class _StreamOpen:
    def __repr__(self) -> str:
        return "STREAM_OPEN"


# What a standalone stream yields first, once the backend has it (its GET answered, its
# subscriptions/listen acknowledged, a stdio link listening): from then on nothing the
# backend sends on it is lost.
STREAM_OPEN = _StreamOpen()


class Abort:
    """Ends an exchange or a stream from another thread (a cancelled call, a listener no
    longer needed): its socket is shut down, so a read blocked on it returns at once. Before
    the backend's response has begun, the socket of the request being sent is watched
    (``watch``), so a call the backend has not started answering is ended on the wire too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the watched response or socket and the aborted flag; never nested
        self._resp: HTTPResponse | None = None
        self._sock: socket.socket | None = None
        self._callback: Callable[[], None] | None = None
        self.aborted = False

    def on_abort(self, callback: Callable[[], None] | None) -> bool:
        """Call ``callback`` on abort, instead of a socket shutdown (a link that is not an
        HTTP response); None: no longer. False (and nothing kept) when the abort came first."""
        with self._lock:
            if self.aborted and callback is not None:
                return False
            self._callback = callback
            return True

    def attach(self, resp: HTTPResponse) -> bool:
        """Watch ``resp``; False (and ``resp`` closed) when the abort came first."""
        with self._lock:
            self._sock = None
            if self.aborted:
                close_response(resp)
                return False
            self._resp = resp
            return True

    def watch(self, sock: socket.socket | None) -> None:
        """Watch the socket a request was sent on, until its response begins (None: stop)."""
        with self._lock:
            if not self.aborted or sock is None:
                self._sock = sock
                return
        _shut(sock)

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            resp, self._resp = self._resp, None
            sock, self._sock = self._sock, None
            callback, self._callback = self._callback, None
        if callback is not None:
            callback()
        if resp is not None:
            sock = response_socket(resp)
        if sock is not None:
            _shut(sock)


def response_socket(resp: HTTPResponse) -> socket.socket | None:
    """The socket a response is read from (None once its connection went back to the pool)."""
    return getattr(resp.connection, "sock", None)


def close_response(resp: HTTPResponse) -> None:
    """Done with ``resp``: a body read to its end has already given its connection back
    to the pool (kept alive); one left unread closes the connection first."""
    resp.close()
    resp.release_conn()


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Sending(threading.local):
    abort: Abort | None = None  # the Abort of the request this thread is sending, if any


_SENDING = _Sending()


class StaleConnection(ConnectionResetError):
    """A kept-alive connection that the backend closed as a request went out on it: no
    answer began. Servers close idle connections after their keep-alive timeout (Node's
    and uvicorn's: 5 s), and one that does so as the gateway reuses the connection never
    read the request, so it is sent again, once, on a new connection."""


class _Watched:
    """A connection whose socket the sending thread's Abort watches while the response is
    awaited, and which knows whether it was reused (``answered``: responses it has had)."""

    answered = 0

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        abort = _SENDING.abort
        if abort is not None:
            abort.watch(self.sock)  # type: ignore[attr-defined]
        try:
            response = super().getresponse(*args, **kwargs)  # type: ignore[misc]
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as error:
            if self.answered:
                raise StaleConnection("the backend closed a kept-alive connection without answering") from error
            raise
        finally:
            if abort is not None:
                abort.watch(None)
        self.answered += 1
        return response


class _WatchedHTTPConnection(_Watched, urllib3.connection.HTTPConnection):
    pass


class _WatchedHTTPSConnection(_Watched, urllib3.connection.HTTPSConnection):
    pass


class _WatchedHTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


_WATCHED_POOLS = {"http": _WatchedHTTPPool, "https": _WatchedHTTPSPool}
# Headers of the transport itself: set per request, never taken from a backend's headers.
_TRANSPORT_HEADERS = frozenset(name.lower() for name in ("Accept", "Content-Type", "Last-Event-ID", SESSION_HEADER,
                                                         PROTOCOL_VERSION_HEADER))
# Sent once: a backend that fails is failed, not asked again (a retry is the channel's choice).
_NO_RETRIES = urllib3.Retry(False, redirect=False)
# What every request says unless the backend's headers say otherwise.
_DEFAULT_HEADERS = {
    "User-Agent": f"vmcp-actors/{__version__}",
    "Accept-Encoding": make_headers(accept_encoding=True)["accept-encoding"],
}


class _Route:
    """How requests reach one backend: urllib3's pools, direct or through the proxy the
    environment names, with the CA bundle it names (requests' variables and rules,
    read once here). Per call nothing is looked up, merged or read from the environment:
    a direct request goes straight to the pool of the backend's origin."""

    def __init__(self, url: str, pool_size: int):
        tls = _tls_settings()
        proxy = select_proxy(url, get_environ_proxies(url))
        manager: urllib3.PoolManager
        if proxy is not None and proxy.lower().startswith("socks"):
            from urllib3.contrib.socks import SOCKSProxyManager  # noqa: PLC0415 - needs PySocks, only then

            username, password = get_auth_from_url(proxy)
            manager = SOCKSProxyManager(proxy, username=username or None, password=password or None,
                                        maxsize=pool_size, **tls)
        else:
            if proxy is None:
                manager = urllib3.PoolManager(maxsize=pool_size, **tls)
            else:
                proxy = prepend_scheme_if_needed(proxy, "http")
                username, password = get_auth_from_url(proxy)
                credentials = make_headers(proxy_basic_auth=f"{username}:{password}") if username else None
                manager = urllib3.ProxyManager(proxy, proxy_headers=credentials, maxsize=pool_size, **tls)
            manager.pool_classes_by_scheme = _WATCHED_POOLS
        self._manager = manager
        self._url = url
        # Direct: the origin's pool, asked for the path (a proxy is asked through its manager).
        self._pool = manager.connection_from_url(url) if proxy is None else None
        self._path = urllib3.util.parse_url(url).request_uri

    def open(self, method: str, headers: Mapping[str, str], body: bytes | None, timeout: float,
             url: str | None) -> HTTPResponse:
        options = dict(body=body, headers=headers, retries=_NO_RETRIES, redirect=False,
                       timeout=urllib3.Timeout(connect=timeout, read=timeout), preload_content=False,
                       decode_content=False)
        if self._pool is not None and url is None:
            return self._pool.urlopen(method, self._path, assert_same_host=False, release_conn=False, **options)
        return self._manager.urlopen(method, self._url if url is None else url, **options)

    def close(self) -> None:
        self._manager.clear()


def _tls_settings() -> dict[str, Any]:
    """Certificates are checked against the bundle REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE
    names (a file or a directory), else requests' own (certifi's)."""
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or DEFAULT_CA_BUNDLE_PATH
    where = "ca_cert_dir" if os.path.isdir(bundle) else "ca_certs"
    return {"cert_reqs": "CERT_REQUIRED", where: bundle}


@dataclass(frozen=True)
class PostResult:
    status: int
    """HTTP status (200 or 202)."""
    session_id: str | None
    """The ``Mcp-Session-Id`` response header, if any."""
    message: dict | None
    """The JSON-RPC response (``result`` or ``error``) to a request; None for a 202."""


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps, outermost first: urllib3's ``reason``, an exception among
    the args (requests and urllib3 wrap that way), else ``__cause__`` or ``__context__``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        wrapped = getattr(current, "reason", None)  # urllib3 MaxRetryError
        if not isinstance(wrapped, BaseException):
            wrapped = next((arg for arg in current.args if isinstance(arg, BaseException)), None)
        current = wrapped or current.__cause__ or current.__context__


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    return any(isinstance(cause, kind) for cause in _causes(exc))


def _exc_chain(exc: BaseException) -> str:
    """Class names of an exception and its causes: safe to log (no URL, no header value)."""
    return "/".join(type(cause).__name__ for cause, _ in zip(_causes(exc), range(6)))


def _media_type(resp: HTTPResponse) -> str:
    return resp.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()


def _same_id(a: Any, b: Any) -> bool:
    # JSON-RPC ids are strings or integers; True == 1 in Python but not in JSON-RPC.
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _split_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Lines of a byte stream without terminators (CR, LF or CRLF, even across chunks).

    Partial lines are kept as a list of parts, so a multi-megabyte data line arriving in
    many chunks is joined once, not copied once per chunk.
    """
    parts: list[bytes] = []
    skip_lf = False
    for chunk in chunks:
        if skip_lf:
            skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if not chunk:
            continue
        lines = chunk.splitlines()
        terminated = chunk[-1] in (0x0A, 0x0D)
        tail = b"" if terminated else lines.pop()
        if lines:
            if parts:
                parts.append(lines[0])
                lines[0] = b"".join(parts)
                parts = []
            yield from lines
        if terminated:
            skip_lf = chunk[-1] == 0x0D
        else:
            parts.append(tail)
    if parts:
        yield b"".join(parts)


class McpHttpClient:
    """MCP streamable HTTP exchanges with one backend; thread-safe, no per-call state."""

    def __init__(
        self,
        backend_name: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        pool_size: int = 64,
        breaker: CircuitBreaker | None = None,
    ):
        self._name = backend_name
        self._breaker = breaker  # the backend's circuit, shared by every user (None: no breaker)
        # The headers every request carries, by their lower-case name (the last given wins),
        # without the transport's own, which each request sets.
        merged = {name.lower(): (name, value) for name, value in {**_DEFAULT_HEADERS, **(headers or {})}.items()}
        self._static_headers = {name: value for lowered, (name, value) in merged.items()
                                if lowered not in _TRANSPORT_HEADERS}
        self._static_names = {lowered: name for lowered, (name, _) in merged.items()}
        # Proxy and CA settings are read once (requests re-read them and ~/.netrc on every
        # call; netrc credentials would go to any backend listed there). No cookie jar:
        # MCP carries its session in a header, and a cookie is not replayed.
        self._route = _Route(url, pool_size)

    def __repr__(self) -> str:  # never the URL nor the headers
        return f"McpHttpClient(backend={self._name!r})"

    @property
    def backend_name(self) -> str:
        return self._name

    # ------------------------------------------------------------------ public API

    def post(
        self,
        message: dict,
        *,
        session_id: str | None,
        protocol_version: str | None,
        timeout: float,
        on_notification: Callable[[dict], None] | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> PostResult:
        """POST one JSON-RPC message; for a request, return its response.

        ``timeout`` bounds the whole exchange, SSE stream included. A JSON-RPC error
        response is returned, not raised. Raises a BackendError subclass otherwise.
        """
        deadline = time.monotonic() + timeout
        resp = self._open(message, session_id, protocol_version, extra_headers, deadline, timeout)
        try:
            new_session = resp.headers.get(SESSION_HEADER)
            if not ("method" in message and "id" in message):
                self._drain(resp, deadline, timeout)
                return PostResult(resp.status, new_session, None)
            reopen = self._reopener(session_id, protocol_version, extra_headers, deadline, timeout, None)
            messages = self._messages(resp, message["id"], deadline, timeout, reopen)
            while True:
                try:
                    notification = next(messages)
                except StopIteration as answered:
                    return PostResult(resp.status, new_session, answered.value)
                if on_notification is not None:
                    on_notification(notification)
        finally:
            close_response(resp)

    def exchange(
        self,
        request: dict,
        *,
        session_id: str | None,
        protocol_version: str | None,
        timeout: float,
        extra_headers: Mapping[str, str] | None = None,
        abort: Abort | None = None,
    ) -> Generator[dict, None, dict]:
        """POST one request; yield each message the backend streams as it arrives
        (notifications, and requests it sends us), then return its response (a JSON-RPC
        error response is returned, not raised).

        The caller drives it, so whoever waits for the answer also relays the stream:
        no thread hand-off. Closing the generator early closes the HTTP response;
        ``abort`` ends it from another thread (raising BackendCancelled here).
        """
        deadline = time.monotonic() + timeout
        resp = self._open(request, session_id, protocol_version, extra_headers, deadline, timeout, abort)
        try:
            if abort is not None and not abort.attach(resp):
                raise self._cancelled()
            reopen = self._reopener(session_id, protocol_version, extra_headers, deadline, timeout, abort)
            try:
                return (yield from self._messages(resp, request["id"], deadline, timeout, reopen))
            except BackendError:
                if abort is not None and abort.aborted:
                    raise self._cancelled() from None
                raise
        finally:
            close_response(resp)

    def listen(
        self,
        *,
        session_id: str | None,
        protocol_version: str | None,
        extra_headers: Mapping[str, str] | None = None,
        abort: Abort,
        connect_timeout: float,
        request: dict | None = None,
    ) -> Iterator[dict]:
        """Open the backend's standalone stream (GET), or with ``request`` its answer to
        that POST (``subscriptions/listen`` on a 2026-07-28 backend), and yield each
        message on it until the backend ends it or ``abort`` is called (a GET's
        STREAM_OPEN first, once the backend answered it). A backend that
        offers no stream answers 405: BackendHTTPError with that status."""
        deadline = time.monotonic() + connect_timeout
        if request is None:
            resp = self._get_stream(session_id, protocol_version, extra_headers, deadline, connect_timeout)
        else:
            resp = self._open(request, session_id, protocol_version, extra_headers, deadline, connect_timeout)
            if _media_type(resp) != _SSE:
                answer = self._read_json(resp, request.get("id"), deadline, connect_timeout)
                close_response(resp)
                if "error" in answer:  # refused: as if it offered no stream
                    raise BackendHTTPError(self._name, f"backend {self._name!r} refused to open a stream", status=405)
                return  # answered at once: the subscription ended
        try:
            if not abort.attach(resp):
                return
            if request is None:
                yield STREAM_OPEN  # a 2026-07-28 listen is open once acknowledged (BackendChannel.listen)
            self._set_read_timeout(resp, None)  # waits for events as long as it is wanted
            for event in iter_sse_events(_split_lines(self._iter_stream(resp))):
                if event.data.strip():
                    msg = self._parse(event.data)
                    if self._is_for_client(msg):
                        yield msg
        except UnicodeDecodeError:
            raise BackendProtocolError(self._name, f"backend {self._name!r} sent an event that is not UTF-8") from None
        except BackendError:
            if abort.aborted:
                return
            raise
        finally:
            close_response(resp)

    def delete_session(
        self,
        session_id: str,
        *,
        protocol_version: str | None,
        timeout: float,
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        """End a backend session (HTTP DELETE), best effort: every failure is swallowed."""
        deadline = time.monotonic() + timeout
        try:
            headers = self._headers(session_id, protocol_version, extra_headers)
            resp = self._send("DELETE", headers, None, deadline, timeout)
            try:
                logger.debug("backend %r answered HTTP %d to the session DELETE", self._name, resp.status)
                if 200 <= resp.status < 300:
                    self._drain(resp, deadline, timeout)
            finally:
                close_response(resp)
        except Exception as exc:  # best effort by contract
            logger.debug("deleting the session on backend %r failed: %s", self._name, _exc_chain(exc))

    def close(self) -> None:
        """Close the pooled connections."""
        self._route.close()

    # ------------------------------------------------------------------ HTTP

    def _open(
        self,
        message: dict,
        session_id: str | None,
        protocol_version: str | None,
        extra_headers: Mapping[str, str] | None,
        deadline: float,
        timeout: float,
        abort: Abort | None = None,
    ) -> HTTPResponse:
        headers = self._headers(session_id, protocol_version, extra_headers)
        headers["Content-Type"] = _JSON
        if not tracing_on():
            return self._post(message, headers, session_id, deadline, timeout, abort)
        with backend_span(self._name, message.get("method"), headers) as span:
            if span is not None and protocol_version is not None and protocol_version >= MODERN_PROTOCOL_VERSION:
                message = _with_traceparent(message, headers["traceparent"])  # 2026-07-28: in _meta too
            return self._post(message, headers, session_id, deadline, timeout, abort, span)

    def _post(self, message: dict, headers: Mapping[str, str], session_id: str | None, deadline: float,
              timeout: float, abort: Abort | None, span: Any = None) -> HTTPResponse:
        resp = self._send("POST", headers, wire_bytes(message), deadline, timeout, abort)
        if span is not None:
            span.set_attribute("http.response.status_code", resp.status)
        try:
            self._check_status(resp, session_id, deadline, timeout)
        except BaseException:
            close_response(resp)
            raise
        return resp

    def _reopener(self, session_id: str | None, protocol_version: str | None,
                  extra_headers: Mapping[str, str] | None, deadline: float, timeout: float,
                  abort: Abort | None) -> Callable[[str], HTTPResponse]:
        """How to resume a call's event stream after ``last_event_id`` (a GET)."""

        def reopen(last_event_id: str) -> HTTPResponse:
            resp = self._get_stream(session_id, protocol_version, extra_headers, deadline, timeout, last_event_id)
            if abort is not None and not abort.attach(resp):
                raise self._cancelled()
            return resp

        return reopen

    def _get_stream(self, session_id: str | None, protocol_version: str | None,
                    extra_headers: Mapping[str, str] | None, deadline: float, timeout: float,
                    last_event_id: str | None = None) -> HTTPResponse:
        """GET an event stream: the standalone one, or a call's resumed after ``last_event_id``."""
        headers = self._headers(session_id, protocol_version, extra_headers)
        headers["Accept"] = _SSE
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        resp = self._send("GET", headers, None, deadline, timeout)
        try:
            self._check_status(resp, session_id, deadline, timeout)
            if _media_type(resp) != _SSE:
                raise BackendProtocolError(self._name, f"backend {self._name!r} answered a stream request "
                                                       "without an event stream")
        except BaseException:
            close_response(resp)
            raise
        return resp

    def _messages(
        self, resp: HTTPResponse, request_id: Any, deadline: float, timeout: float,
        reopen: Callable[[str], HTTPResponse] | None = None,
    ) -> Generator[dict, None, dict]:
        """The notifications streamed before the response to ``request_id``; returns the response."""
        if resp.status in (202, 204):
            raise BackendProtocolError(
                self._name, f"backend {self._name!r} answered HTTP {resp.status} to a request"
            )
        media = _media_type(resp)
        if media == _JSON:
            return self._read_json(resp, request_id, deadline, timeout)
        if media == _SSE:
            return (yield from self._read_sse(resp, request_id, deadline, timeout, reopen))
        raise BackendProtocolError(self._name, f"backend {self._name!r} answered with unexpected content type {media!r}")

    def _headers(
        self, session_id: str | None, protocol_version: str | None, extra: Mapping[str, str] | None
    ) -> dict[str, str]:
        headers = self._static_headers.copy()
        if extra:
            given: dict[str, str] = {}  # lower-case name -> the name it was last given as
            for name, value in extra.items():
                lowered = name.lower()
                if lowered in _TRANSPORT_HEADERS:
                    continue  # the transport's own headers are not the caller's to set
                shadowed = given.get(lowered, self._static_names.get(lowered))
                if shadowed is not None and shadowed != name:
                    headers.pop(shadowed, None)
                given[lowered] = name
                headers[name] = value
        headers["Accept"] = _ACCEPT
        if session_id is not None:
            headers[SESSION_HEADER] = session_id
        if protocol_version is not None:
            headers[PROTOCOL_VERSION_HEADER] = protocol_version
        return headers

    def _remaining(self, deadline: float, timeout: float) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise self._timeout_error(timeout)
        return remaining

    def _timeout_error(self, timeout: float) -> BackendTimeout:
        return BackendTimeout(self._name, f"backend {self._name!r} did not answer within {timeout:g}s")

    def _send(
        self, method: str, headers: Mapping[str, str], body: bytes | None, deadline: float, timeout: float,
        abort: Abort | None = None, url: str | None = None,
    ) -> HTTPResponse:
        """``abort`` (a call's): aborted before the response begins, the send ends with
        BackendCancelled and its socket is shut, so the backend sees the request end.
        ``url``: another URL of the backend's than its own (a 2024-11-05 SSE message endpoint)."""
        remaining = self._remaining(deadline, timeout)
        if abort is not None and abort.aborted:
            raise self._cancelled()  # cancelled before it was sent: nothing goes out, no circuit probe taken
        breaker = self._breaker
        if breaker is not None:
            try:
                breaker.admit()  # an open circuit: fail now, send nothing
            except BackendError:
                record_backend(self._name, "circuit_open", 0.0)
                raise
        started = time.monotonic()
        _SENDING.abort = abort
        try:
            try:
                resp = self._request(method, headers, body, remaining, url)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if not _caused_by(exc, StaleConnection) or (abort is not None and abort.aborted):
                    raise
                logger.debug("backend %r closed a kept-alive connection as a request went out; sent again",
                             self._name)
                resp = self._request(method, headers, body, self._remaining(deadline, timeout), url)
        except Exception as exc:
            if abort is not None and abort.aborted:
                raise self._cancelled() from None  # we ended it: nothing against the backend
            mapped = self._map_exception(exc, timeout)
            record_backend(self._name, _outcome_of(mapped), time.monotonic() - started)
            if breaker is not None:
                # Unreachable or silent counts against the backend; anything else answered.
                (breaker.failed if isinstance(mapped, (BackendUnavailable, BackendTimeout)) else breaker.succeeded)()
            # `from None`: urllib3's messages carry the URL; keep it out of tracebacks.
            raise mapped from None
        finally:
            _SENDING.abort = None
        record_backend(self._name, "ok" if resp.status < 500 else "http_5xx", time.monotonic() - started)
        if breaker is not None:
            (breaker.failed if resp.status >= 500 else breaker.succeeded)()
        return resp

    def _request(self, method: str, headers: Mapping[str, str], body: bytes | None, remaining: float,
                 url: str | None) -> HTTPResponse:
        # No redirect is followed: it would replay our headers (tokens) to wherever it points.
        return self._route.open(method, headers, body, remaining, url)

    def _map_exception(self, exc: Exception, timeout: float) -> Exception:
        """Translate a requests/urllib3 failure; other exceptions pass through unchanged."""
        if isinstance(exc, BackendError):
            return exc
        logger.debug("exchange with backend %r failed: %s", self._name, _exc_chain(exc))
        if isinstance(exc, urllib3.exceptions.NewConnectionError):  # a ConnectTimeoutError subclass, but refused
            return BackendUnavailable(self._name, f"backend {self._name!r} is unreachable")
        if isinstance(exc, (urllib3.exceptions.TimeoutError, TimeoutError)):
            return self._timeout_error(timeout)
        if _caused_by(exc, ssl.SSLCertVerificationError):  # an operator's fix, not an outage: say which
            return BackendUnavailable(self._name, f"backend {self._name!r} is unreachable: its TLS certificate "
                                                  "is not trusted")
        if isinstance(exc, urllib3.exceptions.DecodeError):
            return BackendProtocolError(self._name, f"backend {self._name!r} sent a body that cannot be decoded")
        if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):
            return BackendUnavailable(self._name, f"backend {self._name!r} is unreachable")
        return exc

    def _check_status(
        self, resp: HTTPResponse, session_id: str | None, deadline: float, timeout: float
    ) -> None:
        status = resp.status
        if 200 <= status < 300:
            return
        if status == 404 and session_id is not None:
            raise BackendSessionExpired(
                self._name, f"backend {self._name!r} no longer knows our session (HTTP 404)", status=404
            )
        if 400 <= status < 500 and status not in (401, 403) and _media_type(resp) == _JSON:
            # A 2026-07-28 backend answers refused requests with a status and a JSON-RPC
            # error (unknown method 404, bad params 400, unsupported revision 400).
            error = self._error_body(resp, deadline)
            if error is not None:
                code = error.get("code")
                raise BackendRpcError(self._name, code if isinstance(code, int) else -32603,
                                      str(error.get("message", ""))[:500], error.get("data"), status=status)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "backend %r answered HTTP %d; body starts %r",
                self._name,
                status,
                self._body_prefix(resp, deadline),
            )
        challenge = resp.headers.get("WWW-Authenticate", "")[:_CHALLENGE_LIMIT] if status in (401, 403) else None
        raise BackendHTTPError(self._name, f"backend {self._name!r} answered HTTP {status}", status=status,
                               challenge=challenge)

    def _error_body(self, resp: HTTPResponse, deadline: float) -> dict | None:
        """The JSON-RPC error object of a small JSON error body, or None."""
        try:
            self._set_read_timeout(resp, max(0.05, min(deadline - time.monotonic(), 2.0)))
            body = resp.read(_ERROR_BODY_LIMIT + 1, decode_content=True) or b""
            if len(body) > _ERROR_BODY_LIMIT:
                return None
            message = json.loads(body)
        except Exception:  # noqa: BLE001 - not an error body we can read: the status says it
            return None
        error = message.get("error") if isinstance(message, dict) else None
        return error if isinstance(error, dict) else None

    def _body_prefix(self, resp: HTTPResponse, deadline: float) -> bytes:
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return b""
            self._set_read_timeout(resp, min(remaining, 1.0))
            return resp.read1(_ERROR_BODY_PREFIX, decode_content=True) or b""
        except Exception:
            return b""

    # ------------------------------------------------------------------ bodies

    @staticmethod
    def _set_read_timeout(resp: HTTPResponse, seconds: float | None) -> None:
        # Narrow the socket timeout to what is left of the deadline, so one stalled read
        # cannot overrun it (None: no limit, for a standalone stream). urllib3 resets the
        # timeout when it reuses the connection.
        sock = response_socket(resp)
        if sock is not None:
            try:
                sock.settimeout(None if seconds is None else max(seconds, 0.001))
            except OSError:
                pass

    def _iter_chunks(self, resp: HTTPResponse, deadline: float, timeout: float) -> Iterator[bytes]:
        """Body bytes as they arrive, checking the deadline before every read."""
        try:
            while True:
                self._set_read_timeout(resp, self._remaining(deadline, timeout))
                chunk = resp.read1(_CHUNK, decode_content=True)
                if not chunk:
                    return
                yield chunk
        except Exception as exc:
            raise self._map_exception(exc, timeout) from None

    def _iter_stream(self, resp: HTTPResponse) -> Iterator[bytes]:
        """A standalone stream's bytes as they arrive, with no deadline."""
        try:
            while chunk := resp.read1(_CHUNK, decode_content=True):
                yield chunk
        except Exception as exc:
            raise self._map_exception(exc, 0) from None

    def _cancelled(self) -> BackendCancelled:
        return BackendCancelled(self._name, f"the call to backend {self._name!r} was cancelled")

    def _drain(self, resp: HTTPResponse, deadline: float, timeout: float) -> None:
        """Read a short body to its end so the connection returns to the pool."""
        read = 0
        try:
            for chunk in self._iter_chunks(resp, deadline, timeout):
                read += len(chunk)
                if read > _DRAIN_LIMIT:
                    return  # close_response() drops the connection instead
        except BackendError:
            pass

    def _read_json(self, resp: HTTPResponse, request_id: Any, deadline: float, timeout: float) -> dict:
        body = b"".join(self._iter_chunks(resp, deadline, timeout))
        msg = self._parse(body)
        answer = self._as_answer(msg, request_id)
        if answer is None:
            raise BackendProtocolError(
                self._name, f"backend {self._name!r} answered with something else than the response to our request"
            )
        return answer

    def _read_sse(
        self, resp: HTTPResponse, request_id: Any, deadline: float, timeout: float,
        reopen: Callable[[str], HTTPResponse] | None = None,
    ) -> Generator[dict, None, dict]:
        """The stream's messages until the answer; a stream the backend ends first is
        resumed from its last event id (its ``retry`` later), when it gave ids."""
        last_id: str | None = None
        retry: float | None = None
        empty_resumes = 0
        current = resp
        try:
            while True:
                progressed = False
                try:
                    for event in iter_sse_events(_split_lines(self._iter_chunks(current, deadline, timeout))):
                        if event.id is not None:
                            last_id, progressed = event.id, True
                        if event.retry is not None:
                            retry = event.retry / 1000
                        if not event.data.strip():
                            continue  # priming event (carries only an event id) or keep-alive
                        progressed = True
                        msg = self._parse(event.data)
                        answer = self._as_answer(msg, request_id)
                        if answer is not None:
                            self._finish_stream(current, deadline)
                            return answer
                        if self._is_for_client(msg):
                            yield msg
                            self._remaining(deadline, timeout)  # relaying it may have taken a while
                except UnicodeDecodeError:
                    raise BackendProtocolError(self._name, f"backend {self._name!r} sent an event that is not "
                                                           "UTF-8") from None
                empty_resumes = 0 if progressed else empty_resumes + 1
                if last_id is None or reopen is None or empty_resumes > MAX_EMPTY_RESUMES:
                    raise BackendProtocolError(
                        self._name, f"backend {self._name!r} ended the event stream without answering the request"
                    )
                wait = min(retry if retry is not None else 0.0, MAX_RETRY_WAIT, self._remaining(deadline, timeout))
                if wait > 0:
                    time.sleep(wait)
                logger.debug("backend %r ended a call's stream early; resuming it", self._name)
                if current is not resp:
                    close_response(current)
                current = reopen(last_id)
        finally:
            if current is not resp:
                close_response(current)

    def _finish_stream(self, resp: HTTPResponse, deadline: float) -> None:
        """Briefly wait for the end of an answered stream, to keep the connection alive."""
        if resp.connection is None:
            return
        grace_deadline = min(deadline, time.monotonic() + _DRAIN_GRACE)
        self._drain(resp, grace_deadline, _DRAIN_GRACE)

    # ------------------------------------------------------------------ messages

    def _parse(self, data: bytes | str) -> dict:
        try:
            msg = json_value(data)
        except ValueError:  # includes UnicodeDecodeError
            raise BackendProtocolError(self._name, f"backend {self._name!r} sent invalid JSON") from None
        if not isinstance(msg, dict):
            raise BackendProtocolError(self._name, f"backend {self._name!r} sent a JSON-RPC batch or a non-object")
        return msg

    def _as_answer(self, msg: dict, request_id: Any) -> dict | None:
        """``msg`` if it is the response to our request, else None."""
        if "method" in msg or ("result" not in msg and "error" not in msg):
            return None
        msg_id = msg.get("id")
        if _same_id(msg_id, request_id):
            return msg
        if msg_id is None and "error" in msg:
            # An error the backend could not tie to an id (e.g. it failed to parse our
            # body): one request per POST, so it is ours. Give it our id back.
            logger.debug("backend %r answered an error with a null id", self._name)
            return {**msg, "id": request_id}
        return None

    def _is_for_client(self, msg: dict) -> bool:
        """A notification or a request the backend sends us (not a stray response)."""
        if not isinstance(msg.get("method"), str):
            logger.debug("backend %r sent a response for another request id; skipped", self._name)
            return False
        return True


def _outcome_of(error: Exception) -> str:
    """A failed exchange's outcome label in the metrics."""
    if isinstance(error, BackendTimeout):
        return "timeout"
    if isinstance(error, BackendUnavailable):
        return "unreachable"
    return "error"


def _with_traceparent(message: dict, traceparent: str) -> dict:
    """A copy of a request whose ``params._meta`` carries ``traceparent`` (2026-07-28)."""
    if "id" not in message:
        return message
    params = dict(message.get("params") or {})
    params["_meta"] = {**(params.get("_meta") or {}), "traceparent": traceparent}
    return {**message, "params": params}
