"""McpHttpClient: MCP streamable HTTP exchanges with one backend (vmcp_actors.backends._http)."""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
import responses

from tests.ports import free_port
from vmcp_actors.backends._http import McpHttpClient, PostResult, _split_lines
from vmcp_actors.exceptions import (
    BackendError,
    BackendHTTPError,
    BackendProtocolError,
    BackendSessionExpired,
    BackendTimeout,
    BackendUnavailable,
)
from vmcp_actors.protocol import encode_sse_event, iter_sse_events

NAME = "alpha"
# Secret-looking URL parts and header values: none may leak into errors or logs.
URL = "http://backend.example.test:8123/mcp-url-secret-path?key=url-secret-key"
AUTH = "Bearer sk-live-0123456789abcdefSECRET"
EXTRA = "extra-secret-value-42"
SESSION = "sess-secret-7f3a9c"
LEAKS = (URL, "url-secret", "backend.example.test", AUTH, "sk-live-0123456789abcdefSECRET", EXTRA, SESSION)

REQUEST = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "echo", "arguments": {"x": 1}}}
NOTIFICATION = {"jsonrpc": "2.0", "method": "notifications/initialized"}
RESULT = {"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "hi"}]}}


def note(n: int) -> dict:
    return {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "t", "progress": n}}


def sse(*events: dict | str) -> str:
    """An SSE body: dicts become message events, strings are inserted raw."""
    return "".join(e if isinstance(e, str) else encode_sse_event(e) for e in events)


@pytest.fixture
def rsps():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


@pytest.fixture
def client():
    c = McpHttpClient(NAME, URL, headers={"Authorization": AUTH})
    yield c
    c.close()


def post(client: McpHttpClient, message: dict = REQUEST, **kwargs) -> PostResult:
    kwargs.setdefault("session_id", None)
    kwargs.setdefault("protocol_version", "2025-11-25")
    kwargs.setdefault("timeout", 5.0)
    return client.post(message, **kwargs)


def closed_port() -> int:
    return free_port()


# --------------------------------------------------------------------------- answers


def test_json_answer_is_returned(rsps, client):
    rsps.post(URL, json=RESULT)
    result = post(client)
    assert result == PostResult(200, None, RESULT)


def test_json_rpc_error_answer_is_returned_not_raised(rsps, client):
    error = {"jsonrpc": "2.0", "id": 7, "error": {"code": -32602, "message": "bad params"}}
    rsps.post(URL, json=error)
    assert post(client).message == error


def test_json_answer_with_another_id_raises_protocol_error(rsps, client):
    rsps.post(URL, json={**RESULT, "id": 8})
    with pytest.raises(BackendProtocolError):
        post(client)


def test_string_id_does_not_match_integer_id(rsps, client):
    rsps.post(URL, json={**RESULT, "id": "7"})
    with pytest.raises(BackendProtocolError):
        post(client)


def test_sse_answer_delivers_notifications_in_order_then_result(rsps, client):
    rsps.post(URL, body=sse(note(1), note(2), note(3), RESULT), content_type="text/event-stream")
    seen: list[dict] = []
    result = post(client, on_notification=seen.append)
    assert result.message == RESULT
    assert seen == [note(1), note(2), note(3)]


def test_sse_notifications_ignored_without_callback(rsps, client):
    rsps.post(URL, body=sse(note(1), RESULT), content_type="text/event-stream")
    assert post(client).message == RESULT


def test_sse_events_after_the_response_are_not_delivered(rsps, client):
    rsps.post(URL, body=sse(RESULT, note(9)), content_type="text/event-stream")
    seen: list[dict] = []
    assert post(client, on_notification=seen.append).message == RESULT
    assert seen == []


def test_sse_priming_event_with_empty_data_is_skipped(rsps, client):
    body = "id: prime-1\ndata:\n\n" + ": keep-alive comment\n\n" + sse(RESULT)
    rsps.post(URL, body=body, content_type="text/event-stream")
    assert post(client).message == RESULT


def test_sse_server_to_client_request_is_handed_up_in_order(rsps, client):
    server_request = {"jsonrpc": "2.0", "id": "srv-1", "method": "sampling/createMessage", "params": {}}
    rsps.post(URL, body=sse(server_request, note(1), RESULT), content_type="text/event-stream")
    seen: list[dict] = []
    result = post(client, on_notification=seen.append)
    assert result.message == RESULT
    assert seen == [server_request, note(1)]  # the caller answers it under the backend's own id


def test_sse_response_for_another_id_is_skipped(rsps, client):
    other = {"jsonrpc": "2.0", "id": 99, "result": {}}
    rsps.post(URL, body=sse(other, RESULT), content_type="text/event-stream")
    assert post(client).message == RESULT


def test_sse_error_with_null_id_is_taken_as_our_answer(rsps, client):
    error = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
    rsps.post(URL, body=sse(error), content_type="text/event-stream")
    assert post(client).message == {**error, "id": 7}


def test_sse_stream_ending_without_response_raises_protocol_error(rsps, client):
    rsps.post(URL, body=sse(note(1)), content_type="text/event-stream")
    with pytest.raises(BackendProtocolError):
        post(client)


def test_empty_sse_stream_raises_protocol_error(rsps, client):
    rsps.post(URL, body="", content_type="text/event-stream")
    with pytest.raises(BackendProtocolError):
        post(client)


@pytest.mark.parametrize(
    "content_type",
    ["application/json; charset=utf-8", "Application/JSON", "text/event-stream; charset=utf-8"],
)
def test_content_type_parameters_are_tolerated(rsps, client, content_type):
    body = json.dumps(RESULT) if "json" in content_type.lower() else sse(RESULT)
    rsps.post(URL, body=body, content_type=content_type)
    assert post(client).message == RESULT


def test_sse_with_crlf_and_multiline_data(rsps, client):
    # The data of one event split over two data lines, CRLF line endings.
    text = json.dumps(RESULT)
    half = text.index(", ") + 1  # between two JSON tokens
    body = f"event: message\r\ndata: {text[:half]}\r\ndata: {text[half:]}\r\n\r\n"
    rsps.post(URL, body=body, content_type="text/event-stream")
    # A newline inside JSON (between tokens) is whitespace: still parses.
    assert post(client).message == RESULT


@pytest.mark.parametrize(
    "chunks",
    [
        [b"data: a\r", b"\ndata: b\r\n\r", b"\n"],
        [b"da", b"ta: a\n", b"data", b": b\n", b"\n"],
        [b"data: a\rdata: b\r\r"],
        [b"data: a\n\ndata: b\n"],  # no final blank line
    ],
)
def test_line_splitting_across_chunks(chunks):
    lines = list(_split_lines(iter(chunks)))
    assert "".join(e.data for e in iter_sse_events(lines)) in ("a\nb", "ab")
    assert b"\r" not in b"".join(lines) and b"\n" not in b"".join(lines)


# --------------------------------------------------------------------------- notifications


def test_202_for_a_notification(rsps, client):
    rsps.post(URL, status=202, body=b"")
    assert post(client, NOTIFICATION) == PostResult(202, None, None)


def test_202_for_a_client_response(rsps, client):
    rsps.post(URL, status=202, body=b"")
    response = {"jsonrpc": "2.0", "id": "srv-1", "result": {}}
    assert post(client, response) == PostResult(202, None, None)


@pytest.mark.parametrize("status", [200, 204])
def test_200_or_204_with_empty_body_for_a_notification(rsps, client, status):
    rsps.post(URL, status=status, body=b"")
    assert post(client, NOTIFICATION) == PostResult(status, None, None)


def test_202_to_a_request_raises_protocol_error(rsps, client):
    rsps.post(URL, status=202, body=b"")
    with pytest.raises(BackendProtocolError):
        post(client)


# --------------------------------------------------------------------------- headers


def test_headers_sent(rsps, client):
    rsps.post(URL, json=RESULT)
    post(client, session_id=SESSION, protocol_version="2025-06-18", extra_headers={"X-Extra": EXTRA})
    sent = rsps.calls[0].request
    assert sent.headers["Mcp-Session-Id"] == SESSION
    assert sent.headers["MCP-Protocol-Version"] == "2025-06-18"
    assert sent.headers["Accept"] == "application/json, text/event-stream"
    assert sent.headers["Content-Type"] == "application/json"
    assert sent.headers["Authorization"] == AUTH
    assert sent.headers["X-Extra"] == EXTRA
    assert sent.body == json.dumps(REQUEST, separators=(",", ":")).encode()


def test_no_session_or_protocol_header_when_not_given(rsps, client):
    rsps.post(URL, json=RESULT)
    post(client, session_id=None, protocol_version=None)
    sent = rsps.calls[0].request
    assert "Mcp-Session-Id" not in sent.headers
    assert "MCP-Protocol-Version" not in sent.headers


def test_static_headers_cannot_override_transport_headers(rsps):
    c = McpHttpClient(NAME, URL, headers={"accept": "*/*", "mcp-session-id": "stale"})
    rsps.post(URL, json=RESULT)
    post(c, session_id=SESSION)
    sent = rsps.calls[0].request
    assert sent.headers["Accept"] == "application/json, text/event-stream"
    assert sent.headers["Mcp-Session-Id"] == SESSION
    c.close()


def test_session_id_read_from_response(rsps, client):
    rsps.post(URL, json=RESULT, headers={"mcp-session-id": "new-session-1"})
    assert post(client).session_id == "new-session-1"
    rsps.post(URL, status=202, body=b"", headers={"Mcp-Session-Id": "new-session-2"})
    assert post(client, NOTIFICATION).session_id == "new-session-2"


def test_concurrent_posts_get_their_own_answers(rsps, client):
    def answer(request):
        msg = json.loads(request.body)
        return 200, {"Content-Type": "text/event-stream"}, sse(note(msg["id"]), {"jsonrpc": "2.0", "id": msg["id"], "result": {"n": msg["id"]}})

    rsps.add_callback(responses.POST, URL, callback=answer)

    def call(i: int) -> tuple[int, list[dict]]:
        seen: list[dict] = []
        res = post(client, {"jsonrpc": "2.0", "id": i, "method": "ping"}, on_notification=seen.append)
        return res.message["result"]["n"], seen

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, range(64)))
    assert [n for n, _ in results] == list(range(64))
    assert all(seen == [note(i)] for i, (_, seen) in enumerate(results))


# --------------------------------------------------------------------------- errors


def test_404_with_session_id_raises_session_expired(rsps, client):
    rsps.post(URL, status=404, body=b"")
    with pytest.raises(BackendSessionExpired) as info:
        post(client, session_id=SESSION)
    assert info.value.status == 404 and info.value.backend == NAME


def test_404_without_session_id_raises_http_error(rsps, client):
    rsps.post(URL, status=404, body=b"")
    with pytest.raises(BackendHTTPError) as info:
        post(client, session_id=None)
    assert not isinstance(info.value, BackendSessionExpired)
    assert info.value.status == 404


def test_500_raises_http_error_with_status(rsps, client):
    rsps.post(URL, status=500, body=b"internal error")
    with pytest.raises(BackendHTTPError) as info:
        post(client)
    assert info.value.status == 500
    assert str(info.value) == f"backend {NAME!r} answered HTTP 500"


def test_redirect_is_not_followed(rsps, client):
    rsps.post(URL, status=307, headers={"Location": "http://elsewhere.test/mcp"})
    with pytest.raises(BackendHTTPError) as info:
        post(client)
    assert info.value.status == 307
    assert len(rsps.calls) == 1


def test_connection_refused_raises_unavailable():
    c = McpHttpClient(NAME, f"http://127.0.0.1:{closed_port()}/mcp")
    try:
        with pytest.raises(BackendUnavailable) as info:
            post(c)
        assert str(info.value) == f"backend {NAME!r} is unreachable"
    finally:
        c.close()


def test_connection_error_raises_unavailable(rsps, client):
    rsps.post(URL, body=requests.exceptions.ConnectionError(f"Max retries exceeded with url: {URL}"))
    with pytest.raises(BackendUnavailable):
        post(client)


def test_broken_stream_raises_unavailable(rsps, client):
    rsps.post(URL, body=requests.exceptions.ChunkedEncodingError("Connection broken"))
    with pytest.raises(BackendUnavailable):
        post(client)


@pytest.mark.parametrize(
    "exc", [requests.exceptions.ReadTimeout, requests.exceptions.ConnectTimeout, requests.exceptions.Timeout]
)
def test_timeout_raises_backend_timeout(rsps, client, exc):
    rsps.post(URL, body=exc(f"timed out: {URL}"))
    with pytest.raises(BackendTimeout) as info:
        post(client, timeout=2.5)
    assert str(info.value) == f"backend {NAME!r} did not answer within 2.5s"


def test_expired_deadline_raises_before_sending(rsps, client):
    with pytest.raises(BackendTimeout):
        post(client, timeout=0)
    assert len(rsps.calls) == 0


@pytest.mark.parametrize(
    "body,content_type",
    [
        ("{not json", "application/json"),
        ("", "application/json"),
        ("[1, 2]", "application/json"),
        (sse() + "data: {not json\n\n", "text/event-stream"),
    ],
)
def test_bad_json_raises_protocol_error(rsps, client, body, content_type):
    rsps.post(URL, body=body, content_type=content_type)
    with pytest.raises(BackendProtocolError):
        post(client)


@pytest.mark.parametrize("content_type", ["text/html", "text/plain", ""])
def test_wrong_content_type_raises_protocol_error(rsps, client, content_type):
    rsps.post(URL, body=json.dumps(RESULT), headers={"Content-Type": content_type} if content_type else {})
    with pytest.raises(BackendProtocolError):
        post(client)


def test_no_error_message_or_log_record_contains_url_or_header_values(rsps, client, caplog):
    leaky_body = f"{URL} {AUTH}".encode()  # only ever read for a DEBUG prefix
    scenarios = [
        dict(status=500, body=b"boom"),
        dict(status=404, body=b""),
        dict(status=401, body=b"unauthorized"),
        dict(body=requests.exceptions.ConnectionError(f"HTTPConnectionPool: Max retries exceeded with url: {URL}")),
        dict(body=requests.exceptions.ReadTimeout(f"Read timed out. url={URL} auth={AUTH}")),
        dict(body=requests.exceptions.ConnectTimeout(f"Connect timed out. url={URL}")),
        dict(body=b"{not json", content_type="application/json"),
        dict(body=sse(note(1)), content_type="text/event-stream"),
        dict(body=leaky_body, content_type="text/html"),
        dict(body=sse({"jsonrpc": "2.0", "id": 1, "method": "roots/list"}), content_type="text/event-stream"),
    ]
    errors: list[BaseException] = []
    with caplog.at_level(logging.DEBUG):
        for scenario in scenarios:
            rsps.reset()
            rsps.post(URL, **scenario)
            with pytest.raises(BackendError) as info:
                post(client, session_id=SESSION, extra_headers={"X-Extra": EXTRA})
            errors.append(info.value)
        client.delete_session(SESSION, protocol_version="2025-11-25", timeout=1)
    assert len(errors) == len(scenarios)
    texts = [str(e) for e in errors] + ["".join(traceback.format_exception(e)) for e in errors]
    texts += [r.getMessage() for r in caplog.records] + [repr(client)]
    assert caplog.records, "expected some DEBUG records to check"
    for text in texts:
        for secret in LEAKS:
            assert secret not in text, (secret, text)
    assert all(NAME in str(e) for e in errors)


# --------------------------------------------------------------------------- delete_session


def test_delete_session_sends_session_headers(rsps, client):
    rsps.delete(URL, status=200)
    client.delete_session(SESSION, protocol_version="2025-11-25", timeout=1)
    sent = rsps.calls[0].request
    assert sent.method == "DELETE"
    assert sent.headers["Mcp-Session-Id"] == SESSION
    assert sent.headers["MCP-Protocol-Version"] == "2025-11-25"
    assert sent.headers["Authorization"] == AUTH


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(status=404),
        dict(status=405),
        dict(status=500),
        dict(body=requests.exceptions.ConnectionError("refused")),
        dict(body=requests.exceptions.ReadTimeout("timed out")),
        dict(body=RuntimeError("anything")),
    ],
)
def test_delete_session_swallows_errors(rsps, client, kwargs):
    rsps.delete(URL, **kwargs)
    assert client.delete_session(SESSION, protocol_version=None, timeout=1) is None


def test_delete_session_swallows_connection_refused():
    c = McpHttpClient(NAME, f"http://127.0.0.1:{closed_port()}/mcp")
    try:
        c.delete_session(SESSION, protocol_version=None, timeout=1)
    finally:
        c.close()


def test_delete_session_swallows_expired_deadline(rsps, client):
    client.delete_session(SESSION, protocol_version=None, timeout=0)
    assert len(rsps.calls) == 0


# --------------------------------------------------------------------------- real sockets


TRICKLE_INTERVAL = 0.1
TRICKLE_EVENTS = 100  # 10 s: a client without a total deadline reads on until then


class _Handler(BaseHTTPRequestHandler):
    connections: list[int] = []  # replaced per server
    stop: threading.Event

    def setup(self):
        super().setup()
        self.connections.append(1)

    def log_message(self, *args):
        pass

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/trickle":
            self._trickle()
        else:
            self._chunked_sse(request)

    def _trickle(self):
        # HTTP/1.0, no length, no chunking: a stream that does not end (for 10 s), one event
        # per 0.1 s, so no single read ever waits long.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        n = 0
        try:
            while not self.stop.is_set() and n < TRICKLE_EVENTS:
                n += 1
                self.wfile.write(encode_sse_event(note(n)).encode())
                self.wfile.flush()
                self.stop.wait(TRICKLE_INTERVAL)
        except OSError:
            pass  # the client went away
        self.close_connection = True

    def _chunked_sse(self, request):
        # HTTP/1.1 keep-alive, chunked SSE: a notification, the answer, then the end.
        self.protocol_version = "HTTP/1.1"
        self.close_connection = False  # parse_request decided with the class's HTTP/1.0
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for msg in (note(1), {"jsonrpc": "2.0", "id": request["id"], "result": {}}):
            data = encode_sse_event(msg).encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


@pytest.fixture
def server():
    handler = type("Handler", (_Handler,), {"connections": [], "stop": threading.Event()})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv, handler
    finally:
        handler.stop.set()
        srv.shutdown()
        srv.server_close()
        thread.join(2)


def test_total_deadline_on_trickling_sse_stream(server):
    srv, _ = server
    c = McpHttpClient(NAME, f"http://127.0.0.1:{srv.server_port}/trickle")
    seen: list[dict] = []
    start = time.monotonic()
    try:
        with pytest.raises(BackendTimeout) as info:
            post(c, timeout=0.6, on_notification=seen.append)
    finally:
        c.close()
    elapsed = time.monotonic() - start
    # Not before the deadline; and well before the 10 s the stream lasts, which a client
    # timing only each read would wait out.
    assert 0.55 <= elapsed < TRICKLE_INTERVAL * TRICKLE_EVENTS / 2, elapsed
    assert str(info.value) == f"backend {NAME!r} did not answer within 0.6s"
    # Events are handed over as they arrive, not when a read buffer fills up.
    assert len(seen) >= 2 and seen[0] == note(1)


def test_answered_sse_stream_keeps_the_connection_alive(server):
    srv, handler = server
    c = McpHttpClient(NAME, f"http://127.0.0.1:{srv.server_port}/sse")
    try:
        for i in range(3):
            seen: list[dict] = []
            result = post(c, {"jsonrpc": "2.0", "id": i, "method": "ping"}, on_notification=seen.append)
            assert result.message == {"jsonrpc": "2.0", "id": i, "result": {}}
            assert seen == [note(1)]
    finally:
        c.close()
    assert len(handler.connections) == 1


# --------------------------------------------------------------------------- exchange generator


def drive(exchange) -> tuple[list[dict], dict]:
    seen: list[dict] = []
    while True:
        try:
            seen.append(next(exchange))
        except StopIteration as answered:
            return seen, answered.value


def test_exchange_yields_streamed_notifications_then_returns_the_response(rsps, client):
    rsps.post(URL, body=sse(note(1), note(2), RESULT), content_type="text/event-stream")
    seen, answer = drive(client.exchange(REQUEST, session_id=None, protocol_version="2025-11-25", timeout=5))
    assert seen == [note(1), note(2)]
    assert answer == RESULT


def test_exchange_of_a_json_answer_yields_nothing(rsps, client):
    rsps.post(URL, json=RESULT)
    seen, answer = drive(client.exchange(REQUEST, session_id=None, protocol_version="2025-11-25", timeout=5))
    assert seen == [] and answer == RESULT


def test_closing_an_exchange_early_closes_the_http_response(rsps, client, monkeypatch):
    rsps.post(URL, body=sse(note(1), note(2), RESULT), content_type="text/event-stream")
    closed: list[bool] = []
    original_close = requests.Response.close
    monkeypatch.setattr(requests.Response, "close", lambda self: (closed.append(True), original_close(self)))
    exchange = client.exchange(REQUEST, session_id=None, protocol_version="2025-11-25", timeout=5)
    assert next(exchange) == note(1)
    exchange.close()  # the client went away mid-stream
    assert closed


def test_exchange_errors_are_raised_before_anything_is_yielded(rsps, client):
    rsps.post(URL, status=404)
    with pytest.raises(BackendSessionExpired):
        next(client.exchange(REQUEST, session_id=SESSION, protocol_version="2025-11-25", timeout=5))


def test_a_stream_ended_before_the_answer_is_resumed_from_its_last_event_id(rsps, client):
    first = "id: e-1\nretry: 1\ndata:\n\n" + "id: e-2\n" + sse(note(1))
    rsps.post(URL, body=first, content_type="text/event-stream")
    rsps.get(URL, body="id: e-3\n" + sse(RESULT), content_type="text/event-stream",
             match=[responses.matchers.header_matcher({"Last-Event-ID": "e-2"})])
    seen: list[dict] = []
    assert post(client, on_notification=seen.append).message == RESULT
    assert seen == [note(1)]


def test_a_stream_ended_without_event_ids_is_not_resumed(rsps, client):
    rsps.post(URL, body=sse(note(1)), content_type="text/event-stream")
    with pytest.raises(BackendProtocolError, match="without answering"):
        post(client)



class _ClosingServer:
    """A raw HTTP/1.1 server on a loopback port that closes some connections without
    answering a request they carried: the ``close_at``-th request of a connection (1: its
    first; 2: the next one on a kept-alive connection, as a server does whose keep-alive
    timeout ends as the request arrives), ``closes`` times in all; it answers the others."""

    RESULT = {"echoed": True}

    def __init__(self, close_at: int, closes: int = 1) -> None:
        import socket

        self.connections = 0
        self.requests = 0
        self._close_at, self._closes = close_at, closes
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/mcp"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn) -> None:
        with conn, conn.makefile("rb") as reader:
            for number in range(1, 100):
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline()
                    if not line:
                        return
                    head += line
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                request = json.loads(reader.read(length))
                self.requests += 1
                body = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": self.RESULT}).encode()
                if number == self._close_at and self._closes > 0:
                    self._closes -= 1
                    return  # closed without a byte of answer
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)

    def stop(self) -> None:
        self._sock.close()


def test_a_kept_alive_connection_the_backend_closed_as_a_request_went_out_is_sent_again_once():
    server = _ClosingServer(close_at=2)
    c = McpHttpClient(NAME, server.url)
    try:
        assert post(c).message["result"] == _ClosingServer.RESULT  # a new connection, kept alive
        assert post(c).message["result"] == _ClosingServer.RESULT  # reused: closed unanswered, sent again
        assert (server.connections, server.requests) == (2, 3)
    finally:
        c.close()
        server.stop()


def test_a_new_connection_closed_unanswered_is_not_sent_again():
    server = _ClosingServer(close_at=1)
    c = McpHttpClient(NAME, server.url)
    try:
        with pytest.raises(BackendUnavailable):
            post(c)  # the backend may have read it: never twice
        assert (server.connections, server.requests) == (1, 1)
    finally:
        c.close()
        server.stop()

