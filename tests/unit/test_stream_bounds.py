"""Every queue that holds a client's events is bounded, with a stated overflow rule that
drops nothing without saying so and leaves nothing waiting (issue 35):

* a standalone or listen stream: at most STREAM_BACKLOG unread; list changes coalesce;
  past it the stream ends, what waited is dropped (a backend request in it answered with
  an error) and the client's last event says why;
* a resumable call's events: the newest RESUMABLE_EVENTS (and RESUMABLE_BYTES) kept; a
  resume asking for a dropped one gets 410 naming where the kept ones begin;
* a call's inbox on a stdio or SSE link: at most CALL_BACKLOG unread; past it a
  notification is dropped (a warning where the gap is says how many), a request refused
  at once, the answer always kept;
* a call's mailbox on an HTTP backend session that takes interjected requests: at most
  CALL_MAILBOX; past it the reader waits (the backend's stream with it), nothing dropped.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.gateway import wait_until
from tests.unit.test_backend_attribution import opened_bus
from vmcp_actors.backends._bus import CALL_BACKLOG
from vmcp_actors.backends._channel import CALL_MAILBOX, BackendChannel, BackendRequest
from vmcp_actors.backends._http import Abort, McpHttpClient
from vmcp_actors.concurrency import Deadline
from vmcp_actors.core._exchange import ServerRequest
from vmcp_actors.exceptions import BackendCancelled
from vmcp_actors.protocol import JsonRpcError
from vmcp_actors.users._live import (
    RESUMABLE_BYTES,
    RESUMABLE_EVENTS,
    STREAM_BACKLOG,
    CallStream,
    ListenStream,
    LiveSessions,
)

WAIT = 30.0


def update(n: int, uri: str = "a://x") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri, "_meta": {"n": n}}}


# -- standalone and listen streams ------------------------------------------------------------------


def test_a_stream_whose_client_stops_reading_holds_at_most_its_backlog_then_ends_saying_why():
    live = LiveSessions()
    stream = live.open_stream("s")
    taken = [live.push("s", update(n)) for n in range(STREAM_BACKLOG * 10)]
    assert taken == [True] * STREAM_BACKLOG + [False] * (STREAM_BACKLOG * 9)
    assert stream.waiting == 0 and stream.closed and stream.fell_behind == STREAM_BACKLOG + 1
    assert live.counts()["streamsFellBehind"] == 1
    written = [m for m in stream.messages(keepalive=0.01) if m is not None]
    assert len(written) == 1  # what waited was dropped at once; the last event says so
    assert written[0]["method"] == "notifications/message" and written[0]["params"]["level"] == "error"
    assert written[0]["params"]["data"]["dropped"] == STREAM_BACKLOG + 1
    assert "open it again" in written[0]["params"]["data"]["error"]


def test_a_stream_that_keeps_up_never_falls_behind():
    live = LiveSessions()
    stream = live.open_stream("s")
    written = stream.messages(keepalive=0.01)
    for n in range(STREAM_BACKLOG * 4):
        assert live.push("s", update(n))
        assert next(written) == update(n)
    assert not stream.fell_behind and not stream.closed


def test_list_changes_waiting_coalesce_and_take_no_room():
    live = LiveSessions()
    stream = live.open_stream("s")
    changed = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    for _ in range(STREAM_BACKLOG * 4):
        assert live.push("s", changed)
    assert live.push("s", update(1))
    assert stream.waiting == 2 and not stream.fell_behind
    assert [next(stream.messages(keepalive=0.01)) for _ in range(2)] == [changed, update(1)]


def test_a_backend_request_dropped_with_the_backlog_is_answered_at_once():
    live, answers = LiveSessions(), []
    stream = live.open_stream("s")
    asked = ServerRequest("roots/list", {}, answers.append, "backend")
    assert live.ask_on_stream("s", asked, {"roots": {}}, Deadline.after(WAIT))
    for n in range(STREAM_BACKLOG - 1):
        live.push("s", update(n))
    assert answers == [] and stream.waiting == STREAM_BACKLOG  # still waiting for the client
    assert not live.push("s", update(STREAM_BACKLOG))
    assert stream.fell_behind
    assert answers and answers[0]["error"]["code"] == -32600, answers
    assert "stream ended" in answers[0]["error"]["message"]
    assert live.counts()["awaitingClient"] == 0


def test_a_listen_stream_that_falls_behind_ends_with_the_error_response_to_its_listen():
    stream = ListenStream("listen:1", "sub-7", {"resourceSubscriptions": ["a://x"]})
    for n in range(STREAM_BACKLOG + 1):
        stream.push(update(n))
    written = [m for m in stream.messages(keepalive=0.01) if m is not None]
    assert [m.get("method") for m in written] == ["notifications/subscriptions/acknowledged", None]
    farewell = written[-1]
    assert farewell["id"] == "sub-7" and farewell["error"]["code"] == -32603 and "result" not in farewell
    assert "listen again" in farewell["error"]["message"]
    assert farewell["error"]["data"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "sub-7"


def test_a_listen_stream_narrowed_to_what_was_agreed_takes_only_that():
    stream = ListenStream("listen:2", 1, {"resourceSubscriptions": ["a://x", "a://y"]})
    assert stream.push(update(1, "a://y"))  # asked for: taken while the subscriptions are made
    stream.agree({"resourceSubscriptions": ["a://x"]})
    stream.push(update(2, "a://y"))  # not agreed: not taken
    stream.push(update(3, "a://x"))
    written = stream.messages(keepalive=0.01)
    assert next(written)["params"]["notifications"] == {"resourceSubscriptions": ["a://x"]}
    assert [next(written)["params"]["_meta"]["n"] for _ in range(2)] == [1, 3]


# -- resumable call streams -------------------------------------------------------------------------


def event(n: int, size: int = 10) -> str:
    return f"id: s-{n}\ndata: {'x' * size}\n\n"


def test_a_resumable_call_keeps_its_newest_events_and_refuses_a_resume_into_the_gap():
    live = LiveSessions()
    stream = live.open_call_stream("s")
    total = RESUMABLE_EVENTS * 3
    for n in range(1, total + 1):
        stream.add(event(n))
    first, last = stream.kept
    assert (first, last) == (total - RESUMABLE_EVENTS + 1, total)
    with pytest.raises(JsonRpcError) as gone:
        live.resume("s", stream.event_id(5))
    assert gone.value.http_status == 410 and "no longer kept" in gone.value.message
    assert gone.value.data == {"resumeFrom": stream.event_id(first - 1), "dropped": first - 1 - 5}
    stream.finish()
    resumed, after = live.resume("s", gone.value.data["resumeFrom"])  # the client accepts the gap knowingly
    assert [text for text in resumed.replay(after) if text is not None] == [event(n) for n in range(first, last + 1)]
    kept_stream, kept_after = live.resume("s", stream.event_id(last - 2))
    assert list(kept_stream.replay(kept_after)) == [event(last - 1), event(last)]


def test_a_resumable_call_keeps_at_most_its_bytes_but_always_its_last_event():
    stream = CallStream("s")
    big = RESUMABLE_BYTES // 4
    for n in range(1, 11):
        stream.add(event(n, big))
    first, last = stream.kept
    assert last == 10 and last - first + 1 <= 4
    stream.add(event(11, RESUMABLE_BYTES * 2))  # bigger than the budget alone: still kept (the answer, maybe)
    assert stream.kept == (11, 11)


def test_a_replay_that_falls_behind_the_kept_events_ends_without_the_answer():
    stream = CallStream("s")
    stream.add(event(1))
    replay = stream.replay(0, keepalive=0.01)
    assert next(replay) == event(1)
    for n in range(2, RESUMABLE_EVENTS + 10):  # the reader stalls while the call goes on
        stream.add(event(n))
    stream.finish()
    assert list(replay) == []  # it ends; the client's next resume gets the 410
    with pytest.raises(JsonRpcError):
        stream.check_resumable(1)


# -- a call's inbox on a stdio or SSE link --------------------------------------------------------


def test_a_calls_inbox_on_a_link_holds_at_most_its_backlog_and_says_what_it_dropped():
    bus, link = opened_bus(one_client=True)
    call = bus.request({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "t"}}, WAIT)
    logs = ({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": n}}
            for n in itertools.count())
    first: list[Any] = []
    reader = threading.Thread(target=lambda: first.append(next(call)), daemon=True)
    reader.start()  # the call is sent and waits for what the backend streams
    sent = wait_until(lambda: next((m for m in link.sent if m.get("method") == "tools/call"), None), WAIT)
    link.bus.received(link, next(logs))
    reader.join(WAIT)
    assert first[0]["params"]["data"] == 0
    # The call's web thread reads nothing more (its client is stalled) while the backend floods it.
    for _ in range(CALL_BACKLOG * 4):
        link.bus.received(link, next(logs))
    (queued,) = bus._calls.values()
    assert queued.unread == CALL_BACKLOG and queued.inbox.qsize() == CALL_BACKLOG + 1  # + where the gap begins
    link.bus.received(link, {"jsonrpc": "2.0", "id": "b-1", "method": "roots/list"})  # a request past it
    refused = [m for m in link.sent if m.get("id") == "b-1"]
    assert refused and "not reading" in refused[0]["error"]["message"]
    link.bus.received(link, {"jsonrpc": "2.0", "id": sent["id"], "result": {"content": []}})  # always kept
    read = []
    with pytest.raises(StopIteration) as answered:
        while True:
            read.append(next(call))
    assert answered.value.value == {"jsonrpc": "2.0", "id": 5, "result": {"content": []}}
    assert [m["params"]["data"] for m in read[:CALL_BACKLOG]] == list(range(1, CALL_BACKLOG + 1))
    warning = read[CALL_BACKLOG]
    assert warning["params"]["level"] == "warning" and warning["params"]["data"]["dropped"] == CALL_BACKLOG * 3
    assert len(read) == CALL_BACKLOG + 1


# -- a call's mailbox on an HTTP backend session ----------------------------------------------------


def test_a_calls_mailbox_holds_at_most_its_bound_and_the_backends_stream_waits():
    channel = BackendChannel("b", McpHttpClient("b", "http://127.0.0.1:9/mcp"), 5.0)
    produced, abort, closed = itertools.count(), Abort(), threading.Event()

    def endless() -> Iterator[dict[str, Any]]:
        """A backend streaming for as long as it is read (reading stops at the abort, as HTTP's)."""
        try:
            while not abort.aborted:
                yield {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": next(produced)}}
            raise BackendCancelled("b", "aborted")
        finally:
            closed.set()

    mailbox = channel._calls.open()
    reading = channel._read_with_interjections(endless(), abort, mailbox, 5.0, None, {})
    assert next(reading)["params"]["data"] == 0  # the reader thread runs; this side stalls now
    assert wait_until(lambda: mailbox.qsize() == CALL_MAILBOX, WAIT)
    # The reader holds the next one, waiting for room: the backend's stream is read no further.
    assert next(produced) <= CALL_MAILBOX + 2 and mailbox.qsize() == CALL_MAILBOX
    assert not channel.interject(BackendRequest("b", "roots/list", {}, lambda answer: None, "r1"))  # no room: elsewhere
    reading.close()  # the call ends: the reader is aborted, the mailbox emptied, and it stops
    channel._calls.close(mailbox, "b")
    assert closed.wait(WAIT)
