"""McpHttpClient: MCP streamable HTTP exchanges with one backend (vmcp_actors.backends._http).

The backend is a ScriptedServer (tests/scripted_http.py) on loopback: real sockets, so the
tests hold whichever HTTP library the client is built on."""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.ports import free_port
from tests.scripted_http import ReceivedRequest, ScriptedServer, clear_network_env, unaccepting_port
from vmcp_actors.backends._http import Abort, McpHttpClient, PostResult, _split_lines
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
PATH = "/mcp-url-secret-path?key=url-secret-key"
AUTH = "Bearer sk-live-0123456789abcdefSECRET"
EXTRA = "extra-secret-value-42"
SESSION = "sess-secret-7f3a9c"
SECRETS = ("url-secret", "127.0.0.1", AUTH, "sk-live-0123456789abcdefSECRET", EXTRA, SESSION)
SSE = "text/event-stream"
TIMEOUT = 0.3  # for a backend that never answers: far above a loopback exchange

REQUEST = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "echo", "arguments": {"x": 1}}}
NOTIFICATION = {"jsonrpc": "2.0", "method": "notifications/initialized"}
RESULT = {"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "hi"}]}}


def note(n: int) -> dict:
    return {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "t", "progress": n}}


def sse(*events: dict | str) -> str:
    """An SSE body: dicts become message events, strings are inserted raw."""
    return "".join(e if isinstance(e, str) else encode_sse_event(e) for e in events)


@pytest.fixture(autouse=True)
def no_network_env(monkeypatch):
    clear_network_env(monkeypatch)  # no proxy of the machine's between the client and loopback


@pytest.fixture
def backend() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


@pytest.fixture
def client(backend):
    c = McpHttpClient(NAME, backend.url(PATH), headers={"Authorization": AUTH})
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


def test_json_answer_is_returned(backend, client):
    backend.post(PATH, json=RESULT)
    result = post(client)
    assert result == PostResult(200, None, RESULT)


def test_json_rpc_error_answer_is_returned_not_raised(backend, client):
    error = {"jsonrpc": "2.0", "id": 7, "error": {"code": -32602, "message": "bad params"}}
    backend.post(PATH, json=error)
    assert post(client).message == error


def test_json_answer_with_another_id_raises_protocol_error(backend, client):
    backend.post(PATH, json={**RESULT, "id": 8})
    with pytest.raises(BackendProtocolError):
        post(client)


def test_string_id_does_not_match_integer_id(backend, client):
    backend.post(PATH, json={**RESULT, "id": "7"})
    with pytest.raises(BackendProtocolError):
        post(client)


def test_sse_answer_delivers_notifications_in_order_then_result(backend, client):
    backend.post(PATH, body=sse(note(1), note(2), note(3), RESULT), content_type="text/event-stream")
    seen: list[dict] = []
    result = post(client, on_notification=seen.append)
    assert result.message == RESULT
    assert seen == [note(1), note(2), note(3)]


def test_sse_notifications_ignored_without_callback(backend, client):
    backend.post(PATH, body=sse(note(1), RESULT), content_type="text/event-stream")
    assert post(client).message == RESULT


def test_sse_events_after_the_response_are_not_delivered(backend, client):
    backend.post(PATH, body=sse(RESULT, note(9)), content_type="text/event-stream")
    seen: list[dict] = []
    assert post(client, on_notification=seen.append).message == RESULT
    assert seen == []


def test_sse_priming_event_with_empty_data_is_skipped(backend, client):
    body = "id: prime-1\ndata:\n\n" + ": keep-alive comment\n\n" + sse(RESULT)
    backend.post(PATH, body=body, content_type="text/event-stream")
    assert post(client).message == RESULT


def test_sse_server_to_client_request_is_handed_up_in_order(backend, client):
    server_request = {"jsonrpc": "2.0", "id": "srv-1", "method": "sampling/createMessage", "params": {}}
    backend.post(PATH, body=sse(server_request, note(1), RESULT), content_type="text/event-stream")
    seen: list[dict] = []
    result = post(client, on_notification=seen.append)
    assert result.message == RESULT
    assert seen == [server_request, note(1)]  # the caller answers it under the backend's own id


def test_sse_response_for_another_id_is_skipped(backend, client):
    other = {"jsonrpc": "2.0", "id": 99, "result": {}}
    backend.post(PATH, body=sse(other, RESULT), content_type="text/event-stream")
    assert post(client).message == RESULT


def test_sse_error_with_null_id_is_taken_as_our_answer(backend, client):
    error = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
    backend.post(PATH, body=sse(error), content_type="text/event-stream")
    assert post(client).message == {**error, "id": 7}


def test_sse_stream_ending_without_response_raises_protocol_error(backend, client):
    backend.post(PATH, body=sse(note(1)), content_type="text/event-stream")
    with pytest.raises(BackendProtocolError):
        post(client)


def test_empty_sse_stream_raises_protocol_error(backend, client):
    backend.post(PATH, body="", content_type="text/event-stream")
    with pytest.raises(BackendProtocolError):
        post(client)


@pytest.mark.parametrize(
    "content_type",
    ["application/json; charset=utf-8", "Application/JSON", "text/event-stream; charset=utf-8"],
)
def test_content_type_parameters_are_tolerated(backend, client, content_type):
    body = json.dumps(RESULT) if "json" in content_type.lower() else sse(RESULT)
    backend.post(PATH, body=body, content_type=content_type)
    assert post(client).message == RESULT


def test_sse_with_crlf_and_multiline_data(backend, client):
    # The data of one event split over two data lines, CRLF line endings.
    text = json.dumps(RESULT)
    half = text.index(", ") + 1  # between two JSON tokens
    body = f"event: message\r\ndata: {text[:half]}\r\ndata: {text[half:]}\r\n\r\n"
    backend.post(PATH, body=body, content_type="text/event-stream")
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


def test_202_for_a_notification(backend, client):
    backend.post(PATH, status=202, body=b"")
    assert post(client, NOTIFICATION) == PostResult(202, None, None)


def test_202_for_a_client_response(backend, client):
    backend.post(PATH, status=202, body=b"")
    response = {"jsonrpc": "2.0", "id": "srv-1", "result": {}}
    assert post(client, response) == PostResult(202, None, None)


@pytest.mark.parametrize("status", [200, 204])
def test_200_or_204_with_empty_body_for_a_notification(backend, client, status):
    backend.post(PATH, status=status, body=b"")
    assert post(client, NOTIFICATION) == PostResult(status, None, None)


def test_202_to_a_request_raises_protocol_error(backend, client):
    backend.post(PATH, status=202, body=b"")
    with pytest.raises(BackendProtocolError):
        post(client)


# --------------------------------------------------------------------------- headers


def test_headers_sent(backend, client):
    backend.post(PATH, json=RESULT)
    post(client, session_id=SESSION, protocol_version="2025-06-18", extra_headers={"X-Extra": EXTRA})
    sent = backend.calls[0]
    assert (sent.method, sent.path) == ("POST", PATH)
    assert sent.headers["Mcp-Session-Id"] == SESSION
    assert sent.headers["MCP-Protocol-Version"] == "2025-06-18"
    assert sent.headers["Accept"] == "application/json, text/event-stream"
    assert sent.headers["Content-Type"] == "application/json"
    assert sent.headers["Authorization"] == AUTH
    assert sent.headers["X-Extra"] == EXTRA
    assert sent.body == json.dumps(REQUEST, separators=(",", ":")).encode()


def test_no_session_or_protocol_header_when_not_given(backend, client):
    backend.post(PATH, json=RESULT)
    post(client, session_id=None, protocol_version=None)
    sent = backend.calls[0]
    assert "Mcp-Session-Id" not in sent.headers
    assert "MCP-Protocol-Version" not in sent.headers


def test_static_headers_cannot_override_transport_headers(backend):
    c = McpHttpClient(NAME, backend.url(PATH), headers={"accept": "*/*", "mcp-session-id": "stale"})
    backend.post(PATH, json=RESULT)
    try:
        post(c, session_id=SESSION)
    finally:
        c.close()
    sent = backend.calls[0]
    assert sent.headers.get_all("Accept") == ["application/json, text/event-stream"]
    assert sent.headers.get_all("Mcp-Session-Id") == [SESSION]


def test_session_id_read_from_response(backend, client):
    backend.post(PATH, json=RESULT, headers={"mcp-session-id": "new-session-1"})
    backend.post(PATH, status=202, body=b"", headers={"Mcp-Session-Id": "new-session-2"})
    assert post(client).session_id == "new-session-1"
    assert post(client, NOTIFICATION).session_id == "new-session-2"


def test_concurrent_posts_get_their_own_answers(backend, client):
    def answer(request: ReceivedRequest):
        n = request.json()["id"]
        return 200, {"Content-Type": SSE}, sse(note(n), {"jsonrpc": "2.0", "id": n, "result": {"n": n}})

    backend.add_callback("POST", PATH, answer)

    def call(i: int) -> tuple[int, list[dict]]:
        seen: list[dict] = []
        res = post(client, {"jsonrpc": "2.0", "id": i, "method": "ping"}, on_notification=seen.append)
        return res.message["result"]["n"], seen

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, range(64)))
    assert [n for n, _ in results] == list(range(64))
    assert all(seen == [note(i)] for i, (_, seen) in enumerate(results))


# --------------------------------------------------------------------------- errors


def test_404_with_session_id_raises_session_expired(backend, client):
    backend.post(PATH, status=404, body=b"")
    with pytest.raises(BackendSessionExpired) as info:
        post(client, session_id=SESSION)
    assert info.value.status == 404 and info.value.backend == NAME


def test_404_without_session_id_raises_http_error(backend, client):
    backend.post(PATH, status=404, body=b"")
    with pytest.raises(BackendHTTPError) as info:
        post(client, session_id=None)
    assert not isinstance(info.value, BackendSessionExpired)
    assert info.value.status == 404


def test_500_raises_http_error_with_status(backend, client):
    backend.post(PATH, status=500, body=b"internal error")
    with pytest.raises(BackendHTTPError) as info:
        post(client)
    assert info.value.status == 500
    assert str(info.value) == f"backend {NAME!r} answered HTTP 500"


def test_redirect_is_not_followed(backend, client):
    backend.post(PATH, status=307, headers={"Location": backend.url("/elsewhere")})
    backend.post("/elsewhere", json=RESULT)  # what following it would have been answered
    with pytest.raises(BackendHTTPError) as info:
        post(client)
    assert info.value.status == 307
    assert [call.path for call in backend.calls] == [PATH]


def test_connection_refused_raises_unavailable():
    c = McpHttpClient(NAME, f"http://127.0.0.1:{closed_port()}/mcp")
    try:
        with pytest.raises(BackendUnavailable) as info:
            post(c)
        assert str(info.value) == f"backend {NAME!r} is unreachable"
    finally:
        c.close()


@pytest.mark.parametrize("content_type,body", [(SSE, sse(note(1))), ("application/json", '{"jsonrpc": "2.0", ')])
def test_broken_stream_raises_unavailable(backend, client, content_type, body):
    # The connection ends mid-body: in a chunked stream, or short of the Content-Length.
    if content_type == SSE:
        backend.post(PATH, chunks=[body], content_type=content_type, ending="cut")
    else:
        backend.post(PATH, body=body, headers={"Content-Length": "1000"}, content_type=content_type, ending="cut")
    with pytest.raises(BackendUnavailable):
        post(client)


def test_connect_timeout_raises_backend_timeout():
    with unaccepting_port() as port:
        c = McpHttpClient(NAME, f"http://127.0.0.1:{port}/mcp")
        try:
            with pytest.raises(BackendTimeout) as info:
                post(c, timeout=TIMEOUT)
        finally:
            c.close()
    assert str(info.value) == f"backend {NAME!r} did not answer within {TIMEOUT:g}s"


@pytest.mark.parametrize("silent", ["before answering", "mid-stream"])
def test_timeout_raises_backend_timeout(backend, client, silent):
    if silent == "before answering":
        backend.stall("POST", PATH)
    else:
        backend.post(PATH, chunks=[sse(note(1))], content_type=SSE, ending="stall")
    with pytest.raises(BackendTimeout) as info:
        post(client, timeout=TIMEOUT)
    assert str(info.value) == f"backend {NAME!r} did not answer within {TIMEOUT:g}s"


def test_expired_deadline_raises_before_sending(backend, client):
    with pytest.raises(BackendTimeout):
        post(client, timeout=0)
    assert backend.calls == [] and backend.connections == 0


@pytest.mark.parametrize(
    "body,content_type",
    [
        ("{not json", "application/json"),
        ("", "application/json"),
        ("[1, 2]", "application/json"),
        (sse() + "data: {not json\n\n", "text/event-stream"),
    ],
)
def test_bad_json_raises_protocol_error(backend, client, body, content_type):
    backend.post(PATH, body=body, content_type=content_type)
    with pytest.raises(BackendProtocolError):
        post(client)


@pytest.mark.parametrize("content_type", ["text/html", "text/plain", ""])
def test_wrong_content_type_raises_protocol_error(backend, client, content_type):
    backend.post(PATH, body=json.dumps(RESULT), content_type=content_type)  # "": no Content-Type at all
    with pytest.raises(BackendProtocolError):
        post(client)


def test_no_error_message_or_log_record_contains_url_or_header_values(backend, client, caplog):
    url = backend.url(PATH)
    leaky_body = f"{url} {AUTH}".encode()  # only ever read for a DEBUG prefix
    scenarios = [  # (how the backend fails, the call's timeout)
        (lambda: backend.post(PATH, status=500, body=b"boom"), 5.0),
        (lambda: backend.post(PATH, status=404, body=b""), 5.0),
        (lambda: backend.post(PATH, status=401, body=b"unauthorized"), 5.0),
        (lambda: backend.drop("POST", PATH), 5.0),
        (lambda: backend.stall("POST", PATH), TIMEOUT),
        (lambda: backend.post(PATH, chunks=[sse(note(1))], content_type=SSE, ending="cut"), 5.0),
        (lambda: backend.post(PATH, body=b"{not json", content_type="application/json"), 5.0),
        (lambda: backend.post(PATH, body=sse(note(1)), content_type=SSE), 5.0),
        (lambda: backend.post(PATH, body=leaky_body, content_type="text/html"), 5.0),
        (lambda: backend.post(PATH, body=sse({"jsonrpc": "2.0", "id": 1, "method": "roots/list"}), content_type=SSE),
         5.0),
    ]
    errors: list[BaseException] = []
    with caplog.at_level(logging.DEBUG):
        for script, timeout in scenarios:
            backend.reset()
            script()
            with pytest.raises(BackendError) as info:
                post(client, session_id=SESSION, extra_headers={"X-Extra": EXTRA}, timeout=timeout)
            errors.append(info.value)
        with unaccepting_port() as port:  # a connect that times out
            unconnected = McpHttpClient(NAME, f"http://127.0.0.1:{port}{PATH}", headers={"Authorization": AUTH})
            try:
                with pytest.raises(BackendError) as info:
                    post(unconnected, session_id=SESSION, extra_headers={"X-Extra": EXTRA}, timeout=TIMEOUT)
            finally:
                unconnected.close()
            errors.append(info.value)
        backend.drop("DELETE", PATH)
        client.delete_session(SESSION, protocol_version="2025-11-25", timeout=1)
    assert len(errors) == len(scenarios) + 1
    texts = [str(e) for e in errors] + ["".join(traceback.format_exception(e)) for e in errors]
    # urllib3's own DEBUG records carry the URL: the gateway raises its logger to WARNING (cli.py).
    records = [r for r in caplog.records if not r.name.startswith("urllib3")]
    texts += [r.getMessage() for r in records] + [repr(client)]
    assert records, "expected some DEBUG records to check"
    for text in texts:
        for secret in (url, *SECRETS):
            assert secret not in text, (secret, text)
    assert all(NAME in str(e) for e in errors)


# --------------------------------------------------------------------------- delete_session


def test_delete_session_sends_session_headers(backend, client):
    backend.delete(PATH, status=200)
    client.delete_session(SESSION, protocol_version="2025-11-25", timeout=1)
    sent = backend.calls[0]
    assert (sent.method, sent.path) == ("DELETE", PATH)
    assert sent.headers["Mcp-Session-Id"] == SESSION
    assert sent.headers["MCP-Protocol-Version"] == "2025-11-25"
    assert sent.headers["Authorization"] == AUTH


@pytest.mark.parametrize("failure", ["404", "405", "500", "closed unanswered", "never answered"])
def test_delete_session_swallows_errors(backend, client, failure):
    if failure == "closed unanswered":
        backend.drop("DELETE", PATH)
    elif failure == "never answered":
        backend.stall("DELETE", PATH)
    else:
        backend.delete(PATH, status=int(failure))
    assert client.delete_session(SESSION, protocol_version=None, timeout=TIMEOUT) is None
    assert [call.method for call in backend.calls] == ["DELETE"]  # it did go out, and failed


class _ExplodingHeaders(Mapping):
    """Extra headers that raise when read: a failure that is no HTTP error."""

    def __getitem__(self, name):
        raise RuntimeError("anything")

    def __iter__(self):
        raise RuntimeError("anything")

    def __len__(self):
        return 1


def test_delete_session_swallows_any_exception(backend, client):
    assert client.delete_session(SESSION, protocol_version=None, timeout=1, extra_headers=_ExplodingHeaders()) is None


def test_delete_session_swallows_connection_refused():
    c = McpHttpClient(NAME, f"http://127.0.0.1:{closed_port()}/mcp")
    try:
        c.delete_session(SESSION, protocol_version=None, timeout=1)
    finally:
        c.close()


def test_delete_session_swallows_expired_deadline(backend, client):
    client.delete_session(SESSION, protocol_version=None, timeout=0)
    assert backend.calls == [] and backend.connections == 0


# --------------------------------------------------------------------------- connections and deadlines


TRICKLE_INTERVAL = 0.1
TRICKLE_EVENTS = 100  # 10 s: a client without a total deadline reads on until then


def test_total_deadline_on_trickling_sse_stream(backend):
    pace = threading.Event()  # never set: the stream's pace, one event per interval

    def trickle() -> Iterator[str]:
        for n in range(1, TRICKLE_EVENTS + 1):
            yield encode_sse_event(note(n))
            pace.wait(TRICKLE_INTERVAL)

    backend.post("/trickle", chunks=trickle(), content_type=SSE)
    c = McpHttpClient(NAME, backend.url("/trickle"))
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


def _note_then_answer(request: ReceivedRequest):
    # Chunked SSE: a notification, the answer, then the end.
    answer = {"jsonrpc": "2.0", "id": request.json()["id"], "result": {}}
    return 200, {"Content-Type": SSE}, [encode_sse_event(note(1)), encode_sse_event(answer)]


def test_answered_sse_stream_keeps_the_connection_alive(backend):
    backend.add_callback("POST", "/sse", _note_then_answer)
    c = McpHttpClient(NAME, backend.url("/sse"))
    try:
        for i in range(3):
            seen: list[dict] = []
            result = post(c, {"jsonrpc": "2.0", "id": i, "method": "ping"}, on_notification=seen.append)
            assert result.message == {"jsonrpc": "2.0", "id": i, "result": {}}
            assert seen == [note(1)]
    finally:
        c.close()
    assert backend.connections == 1


ECHOED = {"echoed": True}


def _echo(request: ReceivedRequest):
    return 200, {"Content-Type": "application/json"}, json.dumps({"jsonrpc": "2.0", "id": request.json()["id"],
                                                                   "result": ECHOED})


def test_a_kept_alive_connection_the_backend_closed_as_a_request_went_out_is_sent_again_once(backend, client):
    backend.add_callback("POST", PATH, _echo)
    backend.drop("POST", PATH)  # the next request: read, then its kept-alive connection closed unanswered
    backend.add_callback("POST", PATH, _echo)
    assert post(client).message["result"] == ECHOED  # a new connection, kept alive
    assert post(client).message["result"] == ECHOED  # reused: closed unanswered, sent again
    assert (backend.connections, len(backend.calls)) == (2, 3)


def test_a_new_connection_closed_unanswered_is_not_sent_again(backend, client):
    backend.drop("POST", PATH)
    with pytest.raises(BackendUnavailable):
        post(client)  # the backend may have read it: never twice
    assert (backend.connections, len(backend.calls)) == (1, 1)


# --------------------------------------------------------------------------- exchange generator


def drive(exchange) -> tuple[list[dict], dict]:
    seen: list[dict] = []
    while True:
        try:
            seen.append(next(exchange))
        except StopIteration as answered:
            return seen, answered.value


def test_exchange_yields_streamed_notifications_then_returns_the_response(backend, client):
    backend.post(PATH, body=sse(note(1), note(2), RESULT), content_type=SSE)
    seen, answer = drive(client.exchange(REQUEST, session_id=None, protocol_version="2025-11-25", timeout=5))
    assert seen == [note(1), note(2)]
    assert answer == RESULT


def test_exchange_of_a_json_answer_yields_nothing(backend, client):
    backend.post(PATH, json=RESULT)
    seen, answer = drive(client.exchange(REQUEST, session_id=None, protocol_version="2025-11-25", timeout=5))
    assert seen == [] and answer == RESULT


def test_closing_an_exchange_early_closes_the_http_response(backend, client):
    # The rest of the stream never comes: the backend sees the exchange end when its
    # connection closes. The call's Abort (as the gateway gives one) keeps the response
    # referenced, so only closing it ends the connection.
    backend.post(PATH, chunks=[sse(note(1)), sse(note(2))], content_type=SSE, ending="stall")
    abort = Abort()
    exchange = client.exchange(REQUEST, session_id=None, protocol_version="2025-11-25", timeout=5, abort=abort)
    assert next(exchange) == note(1)
    exchange.close()  # the client went away mid-stream
    assert backend.client_left.wait(5), "the response's connection was not closed"


def test_exchange_errors_are_raised_before_anything_is_yielded(backend, client):
    backend.post(PATH, status=404)
    with pytest.raises(BackendSessionExpired):
        next(client.exchange(REQUEST, session_id=SESSION, protocol_version="2025-11-25", timeout=5))


def test_a_stream_ended_before_the_answer_is_resumed_from_its_last_event_id(backend, client):
    first = "id: e-1\nretry: 1\ndata:\n\n" + "id: e-2\n" + sse(note(1))
    backend.post(PATH, body=first, content_type=SSE)
    backend.get(PATH, body="id: e-3\n" + sse(RESULT), content_type=SSE, match_headers={"Last-Event-ID": "e-2"})
    seen: list[dict] = []
    assert post(client, on_notification=seen.append).message == RESULT
    assert seen == [note(1)]
    assert [call.method for call in backend.calls] == ["POST", "GET"]


def test_a_stream_ended_without_event_ids_is_not_resumed(backend, client):
    backend.post(PATH, body=sse(note(1)), content_type=SSE)
    with pytest.raises(BackendProtocolError, match="without answering"):
        post(client)
    assert [call.method for call in backend.calls] == ["POST"]
