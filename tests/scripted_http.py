"""A real HTTP server on loopback answering what a test scripted, for tests of HTTP clients
(McpHttpClient above all). ``responses`` patches requests' adapter only; this is reached
over real sockets, so what a test checks holds whichever HTTP library the client uses.

Its API follows ``responses``': :meth:`ScriptedServer.add` (or ``post``, ``get``,
``delete``, ``add_callback``) registers an answer to a method and path; when several match
a request, the first is used and dropped, so answers go in order and the last one repeats;
``calls`` lists the requests as they arrived. And what only a real server does: a body sent
in the pieces a test gives (an event stream, chunked), an answer held (:meth:`stall`, or
``ending="stall"`` after its first bytes), a connection closed unanswered (:meth:`drop`) or
mid-body (``ending="cut"``), the connections it accepted, HTTPS.

For proxy and TLS tests: :class:`ForwardingProxy` (absolute-form requests and CONNECT
tunnels, noting what it was asked), :func:`loopback_tls` (a trustme CA and a certificate
for 127.0.0.1), :func:`unaccepting_port` (no connection to it ever completes) and
:func:`clear_network_env` (none of the machine's proxy and CA variables).

Every server stops what it started: held answers, connections and their threads.
"""

from __future__ import annotations

import http.client
import json as jsonlib
import selectors
import socket
import socketserver
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import urlsplit

import pytest
import trustme

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
              "no_proxy")
CA_VARS = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR")
STOP_WAIT = 5.0  # how long stop() waits for a connection's thread to end

Ending = Literal["end", "cut", "stall"]
Body = str | bytes
Callback = Callable[["ReceivedRequest"], tuple[int, Mapping[str, str], Body | Iterable[Body]]]


def clear_network_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """None of the machine's proxy and CA bundle variables: a client built afterwards goes
    straight to loopback servers and trusts its library's default CAs only."""
    for var in (*PROXY_VARS, *CA_VARS):
        monkeypatch.delenv(var, raising=False)


@dataclass(frozen=True)
class ReceivedRequest:
    """One request as a server here received it."""

    method: str
    path: str  # the request target: the path and query (a proxy's: the absolute URL)
    headers: http.client.HTTPMessage  # case-insensitive; get_all() gives a repeated header's values
    body: bytes

    def json(self) -> Any:
        return jsonlib.loads(self.body)


# -- serving connections -------------------------------------------------------------------------


class _TrackedServer(socketserver.TCPServer):
    """127.0.0.1 on a port the system picks, a thread per connection; it keeps the threads
    and the sockets, so :meth:`stop` ends them all (and fails if a thread outlives it)."""

    # Many clients connect at once in some tests: socketserver's backlog of 5 would refuse
    # some under load, which is not what they test.
    request_queue_size = 128

    def __init__(self, handler: type[socketserver.BaseRequestHandler], owner: Any,
                 tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        if tls is not None:
            # The handshake happens in the connection's thread, not in the accepting one.
            self.socket = tls.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.owner = owner
        self.connections = 0  # accepted so far
        self.errors: list[BaseException] = []  # raised while serving, other than a client's hang-up
        self._lock = threading.Lock()  # guards connections, errors, _open and _threads
        self._open: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._wake_reader, self._wake_writer = socket.socketpair()  # written once, by stop()
        self._stopped = False
        self._serving = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                         name=f"loopback-{self.server_address[1]}", daemon=True)
        self._serving.start()

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, address = super().get_request()
        with self._lock:
            self.connections += 1
            self._open.add(conn)
        return conn, address

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(target=self._serve_connection, args=(request, client_address), daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _serve_connection(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            with self._lock:
                self._open.discard(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):  # a client that hung up or refused the certificate is its business
            with self._lock:
                self.errors.append(error)

    @contextmanager
    def tracking(self, sock: socket.socket) -> Iterator[socket.socket]:
        """``sock`` (an upstream connection) is shut down by stop() too, and closed after."""
        with self._lock:
            self._open.add(sock)
        try:
            with sock:
                yield sock
        finally:
            with self._lock:
                self._open.discard(sock)

    def hold(self, conn: socket.socket) -> bool:
        """Wait until stop() or until the client closes ``conn``; True: the client did."""
        with selectors.DefaultSelector() as selector:
            selector.register(conn, selectors.EVENT_READ)
            selector.register(self._wake_reader, selectors.EVENT_READ)
            ready = {key.fileobj for key, _ in selector.select()}
        if self._wake_reader in ready:
            return False
        try:
            return not conn.recv(1)
        except (OSError, ValueError):
            return True

    def pump(self, one: socket.socket, other: socket.socket) -> None:
        """Copy bytes both ways until either side closes, or stop()."""
        with selectors.DefaultSelector() as selector:
            selector.register(one, selectors.EVENT_READ, other)
            selector.register(other, selectors.EVENT_READ, one)
            selector.register(self._wake_reader, selectors.EVENT_READ, None)
            while True:
                for key, _ in selector.select():
                    if key.data is None:
                        return
                    try:
                        data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                        if not data:
                            return
                        key.data.sendall(data)
                    except OSError:
                        return

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._wake_writer.send(b"x")  # every hold() and pump() returns
        self.shutdown()
        self.server_close()
        self._serving.join(STOP_WAIT)
        with self._lock:
            still_open, threads = list(self._open), list(self._threads)
        for conn in still_open:  # kept-alive connections: their threads wait for a next request
            try:
                socket.socket.shutdown(conn, socket.SHUT_RDWR)  # the plain socket's, even under TLS
            except OSError:
                pass
        deadline = time.monotonic() + STOP_WAIT
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._wake_reader.close()
        self._wake_writer.close()
        alive = sum(thread.is_alive() for thread in threads)
        if alive:
            raise AssertionError(f"{alive} connection thread(s) of the loopback server did not end")


class _Stoppable:
    """A context manager around a _TrackedServer: stopped at exit, which fails (when
    nothing else did) on an error raised while serving."""

    _server: _TrackedServer

    @property
    def connections(self) -> int:
        """The connections accepted so far."""
        return self._server.connections

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.stop()
        if exc_type is None:
            self.check()

    def check(self) -> None:
        assert not self._server.errors, f"the loopback server failed: {self._server.errors!r}"


# -- the scripted server -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes | None  # sent whole, with a Content-Length (unless the headers name one)
    chunks: Iterable[Body] | None  # else sent chunked, each piece as the iterable gives it
    ending: Ending  # after the bytes: "end", "cut" (the connection closed), "stall" (held)

    def send(self, handler: _ScriptedHandler) -> None:
        handler.send_response(self.status)
        for name, value in self.headers:
            handler.send_header(name, value)
        if self.chunks is not None:
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            for piece in _framed(self.chunks, b"0\r\n\r\n" if self.ending == "end" else b""):
                handler.wfile.write(piece)
        else:
            body = self.body or b""
            if self.status not in (204, 304) and not any(n.lower() == "content-length" for n, _ in self.headers):
                handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
        if self.ending != "end":
            handler.close_connection = True
            if self.ending == "stall":
                handler.hold()


def _as_bytes(data: Body) -> bytes:
    return data.encode() if isinstance(data, str) else data


def _framed(chunks: Iterable[Body], last: bytes) -> Iterator[bytes]:
    """``chunks`` framed for a chunked body, a write each, then ``last``: in the same write as
    the last piece when the pieces are known beforehand (a list), as a server holding them
    sends them (a client reading the answer then finds the body's end with it)."""
    pieces = (b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in map(_as_bytes, chunks) if chunk)
    if isinstance(chunks, (list, tuple)):
        known = list(pieces)
        yield from known[:-1]
        yield b"".join(known[-1:]) + last
    else:
        yield from pieces
        yield last


def _answer(status: int, headers: Mapping[str, str] | None, body: Body | Iterable[Body] | None,
            content_type: str | None, default_type: str, ending: Ending = "end",
            chunks: Iterable[Body] | None = None) -> _Answer:
    if body is not None and not isinstance(body, (str, bytes)):
        body, chunks = None, body  # a callback's pieces
    named = dict(headers or {})
    if not any(name.lower() == "content-type" for name in named):
        if content_type is None and (body or chunks is not None):
            content_type = default_type
        if content_type:  # "": none at all
            named["Content-Type"] = content_type
    return _Answer(status, tuple(named.items()), None if body is None else _as_bytes(body), chunks, ending)


@dataclass
class _Script:
    method: str
    path: str  # matched with the query when it has one, else against the path alone
    match_headers: Mapping[str, str]
    respond: Callable[[_ScriptedHandler, ReceivedRequest], None]
    used: bool = False

    def matches(self, request: ReceivedRequest) -> bool:
        target = request.path if "?" in self.path else request.path.split("?", 1)[0]
        return (request.method == self.method and target == self.path
                and all(request.headers.get(name) == value for name, value in self.match_headers.items()))


class _ScriptedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept alive; bodies with a Content-Length or chunked
    disable_nagle_algorithm = True  # a body written after its head goes at once, not after a delayed ACK
    server: _ScriptedHttpd

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def _receive(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        request = ReceivedRequest(self.command, self.path, self.headers, self.rfile.read(length))
        self.server.owner.answer(self, request)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _receive

    def hold(self) -> None:
        """No more of the answer until the client leaves or the server stops."""
        self.close_connection = True
        if self.server.hold(self.connection):
            self.server.owner.client_left.set()


class _ScriptedHttpd(_TrackedServer, HTTPServer):
    pass


class ScriptedServer(_Stoppable):
    """An HTTP (``tls``: HTTPS) server on 127.0.0.1 answering what the test registered. A
    request nothing matches gets a 501 and is listed in ``unmatched``; leaving the ``with``
    block fails when there is one (or when a callback raised), as a scripting mistake."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.calls: list[ReceivedRequest] = []
        self.unmatched: list[ReceivedRequest] = []
        self.client_left = threading.Event()  # set when a client closed a connection whose answer was held
        self._scripts: list[_Script] = []
        self._lock = threading.Lock()  # guards calls, unmatched and _scripts
        self._server = _ScriptedHttpd(_ScriptedHandler, self, tls)
        self.port: int = self._server.server_address[1]
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"

    def url(self, path: str = "/mcp") -> str:
        return self.base + path

    # -- what to answer

    def add(self, method: str, path: str = "/mcp", *, status: int = 200, body: Body | None = None, json: Any = None,
            headers: Mapping[str, str] | None = None, content_type: str | None = None,
            chunks: Iterable[Body] | None = None, ending: Ending = "end",
            match_headers: Mapping[str, str] | None = None) -> None:
        """Answer ``method`` ``path`` (or a full URL's path) with ``body``, or ``json``
        serialized, or the ``chunks`` of a chunked body; then ``ending``. The Content-Type
        is ``content_type``, else application/json for ``json``, text/plain for other
        content, none for no content ("": none at all). ``match_headers``: only requests
        carrying these header values."""
        if json is not None:
            body = jsonlib.dumps(json)
        answer = _answer(status, headers, body, content_type, "application/json" if json is not None else "text/plain",
                         ending, chunks)
        self._register(method, path, match_headers, lambda handler, _request: answer.send(handler))

    def post(self, path: str = "/mcp", **answer: Any) -> None:
        self.add("POST", path, **answer)

    def get(self, path: str = "/mcp", **answer: Any) -> None:
        self.add("GET", path, **answer)

    def delete(self, path: str = "/mcp", **answer: Any) -> None:
        self.add("DELETE", path, **answer)

    def add_callback(self, method: str, path: str, callback: Callback, *, content_type: str | None = None,
                     match_headers: Mapping[str, str] | None = None) -> None:
        """Answer with what ``callback(request)`` returns: (status, headers, body), the body
        text or bytes, or an iterable of pieces sent chunked."""

        def respond(handler: _ScriptedHandler, request: ReceivedRequest) -> None:
            status, headers, body = callback(request)
            _answer(status, headers, body, content_type, "text/plain").send(handler)

        self._register(method, path, match_headers, respond)

    def drop(self, method: str, path: str = "/mcp") -> None:
        """Close the connection without a byte of answer (once the request is read)."""
        self._register(method, path, None, lambda handler, _request: setattr(handler, "close_connection", True))

    def stall(self, method: str, path: str = "/mcp") -> None:
        """Never answer: the request is read, then held until the client leaves or the server stops."""
        self._register(method, path, None, lambda handler, _request: handler.hold())

    def _register(self, method: str, path: str, match_headers: Mapping[str, str] | None,
                  respond: Callable[[_ScriptedHandler, ReceivedRequest], None]) -> None:
        if "://" in path:
            at = urlsplit(path)
            path = at.path + (f"?{at.query}" if at.query else "")
        with self._lock:
            self._scripts.append(_Script(method.upper(), path, dict(match_headers or {}), respond))

    # -- rounds, as responses' RequestsMock

    def reset(self) -> None:
        """Forget the answers registered and the requests received."""
        with self._lock:
            self._scripts.clear()
            self.calls.clear()
            self.unmatched.clear()
        self.client_left.clear()

    def assert_all_used(self) -> None:
        with self._lock:
            unused = [f"{script.method} {script.path}" for script in self._scripts if not script.used]
        assert not unused, f"scripted answers never asked for: {unused}"

    @contextmanager
    def script(self) -> Iterator[Self]:
        """A round as in ``with responses.RequestsMock():`` answers registered afresh, each
        of them asked for by the end of the block."""
        self.reset()
        yield self
        self.assert_all_used()

    # -- serving

    def answer(self, handler: _ScriptedHandler, request: ReceivedRequest) -> None:
        with self._lock:
            self.calls.append(request)
            matching = [script for script in self._scripts if script.matches(request)]
            script = matching[0] if matching else None
            if script is None:
                self.unmatched.append(request)
            else:
                script.used = True
                if len(matching) > 1:
                    self._scripts.remove(script)  # the next one answers the next request; the last repeats
        if script is None:
            refusal = f"no scripted answer to {request.method} {request.path}"
            _answer(501, None, refusal, None, "text/plain").send(handler)
        else:
            script.respond(handler, request)  # what it raises ends the connection, and check() fails

    def check(self) -> None:
        super().check()
        unmatched = [(request.method, request.path) for request in self.unmatched]
        assert not unmatched, f"requests no scripted answer matched: {unmatched}"


# -- a proxy ----------------------------------------------------------------------------------------


_NOT_FORWARDED = {"proxy-authorization", "proxy-connection", "connection", "keep-alive"}


class _ProxyHandler(socketserver.StreamRequestHandler):
    rbufsize = 0  # unbuffered: what follows the request's head stays in the socket for the tunnel
    disable_nagle_algorithm = True
    server: _ProxyServer

    def handle(self) -> None:
        line = self.rfile.readline(65537).decode("latin-1").rstrip("\r\n")
        if not line:
            return
        method, target, _version = line.split(" ", 2)
        headers = http.client.parse_headers(self.rfile)  # type: ignore[arg-type]
        self.server.owner.record(ReceivedRequest(method, target, headers, b""))
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            with self.server.tracking(socket.create_connection((host, int(port)), timeout=STOP_WAIT)) as upstream:
                upstream.settimeout(None)
                self.connection.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                self.server.pump(self.connection, upstream)
        else:
            self._forward(method, target, headers)

    def _forward(self, method: str, target: str, headers: http.client.HTTPMessage) -> None:
        """One absolute-form request, sent on in origin form without the proxy's headers; its
        answer comes back marked Connection: close (one request per connection)."""
        at = urlsplit(target)
        length = int(headers.get("Content-Length") or 0)
        body = b""
        while len(body) < length and (more := self.rfile.read(length - len(body))):
            body += more
        head = [f"{method} {at.path or '/'}{f'?{at.query}' if at.query else ''} HTTP/1.1"]
        head += [f"{name}: {value}" for name, value in headers.items() if name.lower() not in _NOT_FORWARDED]
        head.append("Connection: close")
        upstream_socket = socket.create_connection((at.hostname, at.port or 80), timeout=STOP_WAIT)
        with self.server.tracking(upstream_socket) as upstream:
            upstream.sendall("\r\n".join([*head, "", ""]).encode("latin-1") + body)
            answered = b""
            while b"\r\n\r\n" not in answered and (more := upstream.recv(65536)):
                answered += more
            answer_head, _, rest = answered.partition(b"\r\n\r\n")
            kept = [line for line in answer_head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
            self.connection.sendall(b"\r\n".join([*kept, b"Connection: close", b"", b""]) + rest)
            upstream.settimeout(None)
            self.server.pump(self.connection, upstream)


class _ProxyServer(_TrackedServer):
    pass


class ForwardingProxy(_Stoppable):
    """An HTTP proxy on 127.0.0.1: absolute-form requests are sent on (one per connection,
    the Proxy-* headers left out, as a proxy does) and CONNECT opens a tunnel. ``seen``
    lists what each connection asked of it: the method, the target as sent (an absolute
    URL, or host:port for CONNECT) and the headers."""

    def __init__(self) -> None:
        self.seen: list[ReceivedRequest] = []
        self._lock = threading.Lock()  # guards seen
        self._server = _ProxyServer(_ProxyHandler, self)
        self.port: int = self._server.server_address[1]

    def url(self, userinfo: str = "") -> str:
        """The proxy's URL, with ``user:password@`` credentials when given."""
        return f"http://{userinfo}{'@' if userinfo else ''}127.0.0.1:{self.port}"

    def record(self, request: ReceivedRequest) -> None:
        with self._lock:
            self.seen.append(request)

    def targets(self) -> list[tuple[str, str]]:
        with self._lock:
            return [(request.method, request.path) for request in self.seen]


# -- TLS and unreachable ports ----------------------------------------------------------------------


@dataclass(frozen=True)
class LoopbackTls:
    ca_file: Path  # the CA's certificate (PEM): what a client must trust
    server: ssl.SSLContext  # serves a certificate the CA issued for 127.0.0.1 and localhost


def loopback_tls(directory: Path) -> LoopbackTls:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    ca_file = directory / "loopback-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return LoopbackTls(ca_file, context)


@contextmanager
def unaccepting_port() -> Iterator[int]:
    """A loopback port that listens and never completes a connection: its accept queue (of
    one) is full, so the kernel drops new connection attempts and a client's connect times out."""
    with socket.create_server(("127.0.0.1", 0), backlog=0) as listener:
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=STOP_WAIT):  # fills the queue
            yield port
