"""What the gateway holds for each client session it serves in this process.

* The session's standalone stream (``GET /mcp``): notifications that belong to no call
  (list changes, resource updates) and requests a backend sends outside a call.
* The requests the gateway sent the client (sampling, elicitation, roots, ping) and awaits
  an answer to. The gateway is the requestor towards every backend and the responder
  towards every client: each request gets an id of the gateway's own, unique on the
  client session, and the client's answer goes back through the request's ``respond``
  (to the backend under its own id, or to a composite run). An answer to an id this
  session was never sent, or one that is malformed, is refused and changes nothing.
* The calls in flight, which the client may cancel (``notifications/cancelled``).

Every wait is bounded: a request the client leaves unanswered is answered with an error
at its call's deadline, and one whose stream closes first is answered with an error then.
So is what waits for a client that reads slowly or not at all: a standalone or listen
stream holds at most STREAM_BACKLOG unread messages (``StandaloneStream``), a resumable
call keeps at most RESUMABLE_EVENTS events and RESUMABLE_BYTES (``CallStream``); each says
what happens past its bound, and nothing is dropped without the client being told.
All of it is in-process and thread-safe; the web threads and actors call it directly.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from vmcp_actors.concurrency import Deadline, TimerHandle, call_later
from vmcp_actors.core._exchange import ServerRequest
from vmcp_actors.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
    JsonRpcError,
    Message,
)
from vmcp_actors.protocol.mcp import (
    META_SUBSCRIPTION_ID,
    check_answer,
    missing_capability,
)

logger = logging.getLogger(__name__)

# Standalone streams open at once in this process: each holds a server thread (gunicorn
# runs 128), so past this a GET /mcp is answered 405, which the specification lets a
# client take as "no stream here" (its calls work as before).
STANDALONE_STREAM_LIMIT = 96
# One identified caller (issuer + subject) holds at most this share of them, so no one
# client can take every stream; anonymous callers cannot be told apart and share the limit.
STREAMS_PER_IDENTITY = STANDALONE_STREAM_LIMIT // 4


class StreamShareReached(Exception):
    """The caller holds its share of this process's streams already (429, Retry-After)."""
# A call's answer stays resumable this long after its last event (GET with Last-Event-ID).
RESUMABLE_FOR = 60.0
# Messages a standalone or listen stream holds that its client has not read. A client that
# reads keeps this near zero; 256 holds a burst in which every resource one listen may name
# (MAX_LISTENED, 100) changes twice, with room to spare, while the process's
# STANDALONE_STREAM_LIMIT streams, full, stay within a few MB. Past it the client is not
# keeping up, and its stream ends (StandaloneStream).
STREAM_BACKLOG = 256
# Events a resumable call keeps for a client that comes back (GET with Last-Event-ID), and
# their size: the newest are kept. A client reconnects within RESUME_RETRY_MS; 1024 events is
# progress 10 times a second for well over a minute, and 4 MiB keeps a call's big answer
# with it. Older ones are dropped, and a resume asking for one gets an error (CallStream).
RESUMABLE_EVENTS = 1024
RESUMABLE_BYTES = 4 * 1024 * 1024
# What the gateway asks clients to wait before resuming a dropped call stream (SSE retry).
RESUME_RETRY_MS = 500
# An SSE comment this often on an idle standalone stream: proxies keep it open, and a
# client that went away is noticed at the next write.
KEEPALIVE_EVERY = 15.0


class StandaloneStream:
    """One client session's GET stream: messages pushed by anyone, written by its web thread.

    Bounded, with one overflow rule: at most STREAM_BACKLOG messages wait for the client. A
    list change already waiting is not queued again (it only tells the client to list
    again). When one more message would not fit, the client is not keeping up, and the
    stream ends then: what waits is dropped at once (memory is freed, however long the
    client stays), a backend's request among it is answered with an error (``undelivered``)
    so the backend waits for nothing, and the client's last event says the stream fell
    behind (``farewell``: for a 2025 stream an error log message). The client opens its
    stream again and lists again: what it missed were hints. A stream the client leaves,
    or the gateway ends, drops what waits in the same way."""

    LIST_CHANGES = {
        "notifications/tools/list_changed": "toolsListChanged",
        "notifications/prompts/list_changed": "promptsListChanged",
        "notifications/resources/list_changed": "resourcesListChanged",
    }

    def __init__(self, session_id: str):
        self.session_id = session_id
        self.owner: tuple[str, str] | None = None  # the identified caller holding it (set when opened)
        # Answers a backend's request dropped unread with an error (set when the stream is opened)
        self.undelivered: Callable[[dict[str, Any]], None] | None = None
        self._cond = threading.Condition()  # guards the backlog, closed and fell_behind; wakes the writer; never nested
        self._backlog: deque[dict[str, Any]] = deque()
        self.closed = False
        self.fell_behind = 0  # messages the client lost when the stream ended for falling behind (0: it did not)

    def push(self, message: dict[str, Any]) -> bool:
        """Queue ``message`` for the client; False when it was not taken: the stream has
        ended, or ends now because its client fell behind."""
        method = message.get("method")
        with self._cond:
            if self.closed:
                return False
            if method in self.LIST_CHANGES and any(queued.get("method") == method for queued in self._backlog):
                return True  # the same change waits already: one list is enough
            if len(self._backlog) < STREAM_BACKLOG:
                self._backlog.append(message)
                self._cond.notify()
                return True
            dropped = list(self._backlog)
            self._backlog.clear()
            self.closed = True
            self.fell_behind = len(dropped) + 1
            self._cond.notify_all()
        logger.warning("a client stream (%s) fell %d messages behind: it ends, and its client is told to open it "
                       "again", self.session_id[:16], self.fell_behind)
        self._undelivered(dropped)
        return False

    def close(self) -> None:
        with self._cond:
            self.closed = True
            dropped = list(self._backlog)
            self._backlog.clear()
            self._cond.notify_all()
        self._undelivered(dropped)

    @property
    def waiting(self) -> int:
        """Messages pushed and not yet written."""
        with self._cond:
            return len(self._backlog)

    def messages(self, keepalive: float | None = None) -> Iterator[dict[str, Any] | None]:
        """Each message as it is pushed; None after ``keepalive`` seconds of silence; when
        the stream ended because its client fell behind, the event that says so last."""
        keepalive = KEEPALIVE_EVERY if keepalive is None else keepalive
        while True:
            with self._cond:
                if not self._backlog and not self.closed:
                    self._cond.wait(keepalive)
                message = self._backlog.popleft() if self._backlog else None
                closed = self.closed
            if message is not None:
                yield message
            elif closed:
                break
            else:
                yield None
        if self.fell_behind:
            yield self.farewell()

    def farewell(self) -> dict[str, Any]:
        """The last event of a stream that fell behind: why it ends, and what to do."""
        return {"jsonrpc": "2.0", "method": "notifications/message", "params": {
            "level": "error", "logger": "vmcp-actors", "data": {
                "error": "this stream fell behind and was closed: open it again (GET) and list again, since "
                         f"{self.fell_behind} notifications were dropped", "dropped": self.fell_behind,
                "limit": STREAM_BACKLOG}}}

    def _undelivered(self, dropped: list[dict[str, Any]]) -> None:
        if self.undelivered is None:
            return
        for message in dropped:
            if "id" in message and "method" in message:  # a backend's request: answered, not left waiting
                self.undelivered(message)


class ListenStream(StandaloneStream):
    """A 2026-07-28 client's ``subscriptions/listen`` answer: only the kinds of
    notification it opted in to, each tagged with its subscription id (the JSON-RPC id
    of the listen request); the acknowledgment first, and when the gateway ends it (at
    shutdown) the response to the listen request, so the client knows it ended cleanly."""

    def __init__(self, stream_id: str, subscription_id: Any, wanted: Mapping[str, Any]):
        super().__init__(stream_id)
        self.subscription_id = subscription_id
        self._ended_by_client = False
        self.agree(wanted)

    def agree(self, wanted: Mapping[str, Any]) -> None:
        """What the stream takes from now on (and what its acknowledgment says): the
        stream is opened with what the client asked for, before the subscriptions are
        made, and narrowed to what was agreed before the client hears of it. Each value is
        replaced whole, so a push on another thread reads one or the other."""
        self._uris = frozenset(wanted.get("resourceSubscriptions", ()))
        self._tasks = frozenset(wanted.get("taskIds", ()))
        self.wanted = dict(wanted)

    def push(self, message: dict[str, Any]) -> bool:
        method = message.get("method")
        flag = self.LIST_CHANGES.get(method or "")
        if flag is not None and not self.wanted.get(flag):
            return True
        if flag is None:
            params = message.get("params")
            if not isinstance(params, dict) or not (
                    method == "notifications/resources/updated" and params.get("uri") in self._uris
                    or method == "notifications/tasks" and params.get("taskId") in self._tasks):
                return True  # nothing else belongs on a listen stream
        return super().push(self._tagged(message))

    def client_left(self) -> None:
        self._ended_by_client = True
        self.close()

    def messages(self, keepalive: float | None = None) -> Iterator[dict[str, Any] | None]:
        yield self._tagged({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
                            "params": {"notifications": self.wanted}})
        yield from super().messages(keepalive)
        if not self._ended_by_client and not self.fell_behind:
            yield {"jsonrpc": "2.0", "id": self.subscription_id,
                   "result": {"resultType": "complete", "_meta": {META_SUBSCRIPTION_ID: self.subscription_id}}}

    def farewell(self) -> dict[str, Any]:
        """A listen stream that fell behind ends with the error response to its listen
        request: the client listens again, and lists again what it listens to."""
        return {"jsonrpc": "2.0", "id": self.subscription_id, "error": {
            "code": INTERNAL_ERROR, "message": "this listen stream fell behind and was closed: listen again, and list "
                                              f"again what it listened to ({self.fell_behind} notifications were "
                                              "dropped)",
            "data": {"dropped": self.fell_behind, "limit": STREAM_BACKLOG,
                     "_meta": {META_SUBSCRIPTION_ID: self.subscription_id}}}}

    def _tagged(self, message: dict[str, Any]) -> dict[str, Any]:
        params = dict(message.get("params") or {})
        params["_meta"] = {**(params.get("_meta") or {}), META_SUBSCRIPTION_ID: self.subscription_id}
        return {**message, "params": params}


class CallStream:
    """A call's SSE answer as written (2025-11-25 sessions): event ids ``<stream>-<n>``, the
    priming event being n = 0. When the client's connection drops before the answer, the
    call goes on and its events keep arriving here, so the client resumes with a GET
    carrying the last id it saw and gets the rest.

    Bounded, with one overflow rule: the newest RESUMABLE_EVENTS events, at most
    RESUMABLE_BYTES of them (the newest one always), are kept; older ones are dropped as new
    ones come. A resume that asks for the events after one that is kept, or after the
    last dropped, gets them all; one asking for a dropped event gets ``EventsDropped``
    (which names where the kept events begin), never a silent gap. A replay whose reader
    falls behind the kept events ends without the answer, so its client's next resume gets
    that error too."""

    def __init__(self, session_id: str):
        self.session_id = session_id
        self.stream_id = secrets.token_hex(8)
        self._cond = threading.Condition()  # guards the call stream's events and done flag; wakes its readers; never nested
        self._events: deque[str] = deque()  # encoded SSE events first..n
        self._first = 1  # the index of the oldest event kept
        self._bytes = 0
        self.done = False

    def event_id(self, index: int) -> str:
        return f"{self.stream_id}-{index}"

    def add(self, encoded: str) -> None:
        with self._cond:
            self._events.append(encoded)
            self._bytes += len(encoded)
            while len(self._events) > RESUMABLE_EVENTS or self._bytes > RESUMABLE_BYTES and len(self._events) > 1:
                self._bytes -= len(self._events.popleft())
                self._first += 1
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self.done = True
            self._cond.notify_all()

    @property
    def kept(self) -> tuple[int, int]:
        """The indexes of the oldest and the newest event kept (newest < oldest: none)."""
        with self._cond:
            return self._first, self._first + len(self._events) - 1

    def check_resumable(self, after: int) -> None:
        """EventsDropped when some event after ``after`` is no longer kept."""
        with self._cond:
            first = self._first
        if after + 1 < first:
            raise EventsDropped(self.event_id(after), self.event_id(first - 1), first - 1 - max(after, 0))

    def replay(self, after: int, keepalive: float | None = None) -> Iterator[str | None]:
        """The events after ``after``, then each new one until the answer; None to keep
        alive. Ends early, without the answer, when events it had yet to give were dropped."""
        keepalive = KEEPALIVE_EVERY if keepalive is None else keepalive
        sent = max(after, 0)
        while True:
            with self._cond:
                if self._first + len(self._events) - 1 <= sent and not self.done:
                    self._cond.wait(keepalive)
                behind = sent + 1 < self._first
                fresh = [] if behind else list(itertools.islice(self._events, sent + 1 - self._first, None))
                done = self.done
            if behind:
                logger.info("a resumed call stream fell behind the events kept (RESUMABLE_EVENTS): it ends, and "
                            "its client's next resume is refused")
                return
            if fresh:
                sent += len(fresh)
                yield from fresh
            elif done:
                return
            else:
                yield None


class EventsDropped(JsonRpcError):
    """A resume asked for events a call no longer keeps (HTTP 410): the client reads the
    call's stream too slowly, or came back too late."""

    def __init__(self, asked_after: str, resume_from: str, dropped: int):
        super().__init__(INVALID_REQUEST, f"Gone: the events after {asked_after} are no longer kept ({dropped} of "
                                          f"them were dropped: a call keeps its last {RESUMABLE_EVENTS}); resume "
                                          f"from {resume_from} to get the rest without them",
                         {"resumeFrom": resume_from, "dropped": dropped}, http_status=410)


@dataclass
class InFlight:
    """A client request in flight: how to cancel it, and the requests sent on its stream."""

    session_id: str
    request_id: Any
    cancels: list[Any] = field(default_factory=list)
    asked: set[Any] = field(default_factory=set)  # ids of the server requests sent on this call's stream
    cancelled: bool = False


@dataclass
class _Pending:
    method: str
    respond: Any
    timer: TimerHandle | None
    call: InFlight | None


class _Session:
    def __init__(self) -> None:
        self.stream: StandaloneStream | None = None
        self.pending: dict[Any, _Pending] = {}
        self.calls: dict[Any, InFlight] = {}
        self.call_streams: dict[str, CallStream] = {}


def _key(request_id: Any) -> tuple[type, Any]:
    # JSON-RPC ids are strings or integers: "1" and 1 are different requests.
    return (type(request_id), request_id)


class LiveSessions:
    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the sessions' streams, call streams and pending requests; never nested
        self._sessions: dict[str, _Session] = {}
        self._ids = itertools.count(1)

    # -- the standalone stream -----------------------------------------------------------

    def open_stream(self, session_id: str, stream: StandaloneStream | None = None,
                    owner: tuple[str, str] | None = None) -> StandaloneStream | None:
        """The session's standalone stream (or ``stream``, a listen stream under its own
        id); a newer one replaces (and ends) an older one, so a client that reconnects is
        never refused by a stream it lost. None when the process holds
        STANDALONE_STREAM_LIMIT streams already; StreamShareReached when ``owner`` holds
        STREAMS_PER_IDENTITY."""
        stream = stream if stream is not None else StandaloneStream(session_id)
        stream.owner = owner
        stream.undelivered = lambda request: self._settle(session_id, request["id"], {"error": {
            "code": INVALID_REQUEST, "message": "the client's stream ended before the client read the request"}})
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or session.stream is None:
                if self._open_streams() >= STANDALONE_STREAM_LIMIT:
                    return None
                if owner is not None and sum(1 for held in self._sessions.values() if held.stream is not None
                                             and held.stream.owner == owner) >= STREAMS_PER_IDENTITY:
                    raise StreamShareReached()
            session = self._sessions.setdefault(session_id, _Session())
            older, session.stream = session.stream, stream
        if older is not None:
            older.close()
        return stream

    def close_stream(self, stream: StandaloneStream) -> bool:
        """The stream's client went away; True when it was the session's current stream."""
        stream.close()
        with self._lock:
            session = self._sessions.get(stream.session_id)
            if session is None or session.stream is not stream:
                return False
            session.stream = None
            self._forget_if_empty(stream.session_id, session)
        return True

    def has_stream(self, session_id: str) -> bool:
        with self._lock:
            session = self._sessions.get(session_id)
            return session is not None and session.stream is not None

    def push(self, session_id: str, message: dict[str, Any]) -> bool:
        """A notification on the session's standalone stream; False when it has none open
        or the stream did not take it (it ended: its client fell behind)."""
        with self._lock:
            session = self._sessions.get(session_id)
            stream = session.stream if session is not None else None
        if stream is None:
            return False
        return stream.push(message)

    # -- resumable call streams ----------------------------------------------------------

    def open_call_stream(self, session_id: str) -> CallStream:
        stream = CallStream(session_id)
        with self._lock:
            self._sessions.setdefault(session_id, _Session()).call_streams[stream.stream_id] = stream
        return stream

    def call_stream_done(self, stream: CallStream) -> None:
        """The call answered: it stays resumable for RESUMABLE_FOR, then is forgotten."""
        stream.finish()
        call_later(RESUMABLE_FOR, lambda: self._forget_call_stream(stream))

    def resume(self, session_id: str, last_event_id: str) -> tuple[CallStream, int] | None:
        """The call stream ``last_event_id`` belongs to (this session's only) and the index
        to go on after; EventsDropped when events after it are no longer kept."""
        stream_id, _, index = last_event_id.rpartition("-")
        if not index.isdigit():
            return None
        with self._lock:
            session = self._sessions.get(session_id)
            stream = session.call_streams.get(stream_id) if session is not None else None
        if stream is None:
            return None
        stream.check_resumable(int(index))  # EventsDropped (410), never a silent gap
        return stream, int(index)

    def _forget_call_stream(self, stream: CallStream) -> None:
        with self._lock:
            session = self._sessions.get(stream.session_id)
            if session is not None and session.call_streams.get(stream.stream_id) is stream:
                del session.call_streams[stream.stream_id]
                self._forget_if_empty(stream.session_id, session)

    # -- requests to the client ----------------------------------------------------------

    def ask(self, session_id: str, request: ServerRequest, capabilities: Mapping[str, Any], deadline: Deadline,
            call: InFlight | None = None) -> dict[str, Any] | None:
        """Register ``request`` for the session and return the message to write (on the
        call's stream when ``call`` is given). When the client cannot take it, the request
        is answered with an error at once and None returned."""
        why_not = missing_capability(request.method, request.params, capabilities)
        if why_not is not None:
            logger.debug("refused %s from %s: %s", request.method, request.origin or "-", why_not)
            request.respond({"error": {"code": METHOD_NOT_FOUND, "message": why_not}})
            return None
        if deadline.expired:
            request.respond({"error": {"code": REQUEST_TIMEOUT, "message": "the call's deadline passed"}})
            return None
        request_id = next(self._ids)
        pending = _Pending(request.method, request.respond, None, call)
        with self._lock:
            self._sessions.setdefault(session_id, _Session()).pending[_key(request_id)] = pending
            if call is not None:
                call.asked.add(_key(request_id))
        pending.timer = call_later(deadline.remaining(), lambda: self._expire(session_id, request_id))
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": request.method}
        if request.params:
            message["params"] = dict(request.params)
        return message

    def ask_on_stream(self, session_id: str, request: ServerRequest, capabilities: Mapping[str, Any],
                      deadline: Deadline) -> bool:
        """A request outside any call: on the session's standalone stream. False (nothing
        sent, nothing answered) when the session has no stream open."""
        if not self.has_stream(session_id):
            return False
        message = self.ask(session_id, request, capabilities, deadline)
        if message is not None and not self.push(session_id, message):
            self._settle(session_id, message["id"], {"error": {"code": INVALID_REQUEST,
                                                               "message": "the client's stream closed"}})
        return True

    def answer(self, session_id: str, message: Message) -> JsonRpcError | None:
        """The client's answer to a request the gateway sent it; an error (for HTTP 400)
        when no such request is waiting on this session or the answer is malformed."""
        with self._lock:
            session = self._sessions.get(session_id)
            pending = session.pending.get(_key(message.id)) if session is not None else None
        if pending is None:
            return JsonRpcError(INVALID_REQUEST, f"no request with id {message.id!r} awaits an answer on this session")
        problem = check_answer(pending.method, message)
        if problem is not None:
            return JsonRpcError(INVALID_PARAMS, f"malformed answer to {pending.method}: {problem}")
        answer = {"error": message.params} if message.is_error else {"result": message.params}
        if not self._settle(session_id, message.id, answer):
            return JsonRpcError(INVALID_REQUEST, f"the request with id {message.id!r} was already answered")
        return None

    # -- calls in flight -----------------------------------------------------------------

    def begin_call(self, session_id: str, request_id: Any) -> InFlight:
        call = InFlight(session_id, request_id)
        with self._lock:
            self._sessions.setdefault(session_id, _Session()).calls[_key(request_id)] = call
        return call

    def call_opened(self, call: InFlight, cancel: Any) -> None:
        """A backend exchange (or composite run) of ``call`` started: how to cancel it."""
        with self._lock:
            call.cancels.append(cancel)
            cancelled = call.cancelled
        if cancelled:
            cancel(None)

    def cancel(self, session_id: str, request_id: Any, reason: str | None) -> bool:
        """The client cancelled a request it sent; False when no such call is in flight."""
        with self._lock:
            session = self._sessions.get(session_id)
            call = session.calls.get(_key(request_id)) if session is not None else None
            if call is None or call.cancelled:
                return False
            call.cancelled = True
            cancels = list(call.cancels)
        for cancel in cancels:
            cancel(reason)
        return True

    def cancel_all(self, session_id: str, reason: str) -> int:
        """The client ended its session: each of its calls in flight is cancelled (its
        backend told, a composite run stopped). How many."""
        with self._lock:
            session = self._sessions.get(session_id)
            calls = [call for call in session.calls.values() if not call.cancelled] if session is not None else []
            for call in calls:
                call.cancelled = True
            cancels = [cancel for call in calls for cancel in call.cancels]
        for cancel in cancels:
            cancel(reason)
        return len(calls)

    def end_call(self, call: InFlight) -> None:
        """The call's answer is written or its stream closed: requests still waiting on
        that stream can no longer be answered."""
        with self._lock:
            session = self._sessions.get(call.session_id)
            if session is not None and session.calls.get(_key(call.request_id)) is call:
                del session.calls[_key(call.request_id)]
            asked = [key[1] for key in call.asked if session is not None and key in session.pending]
        for request_id in asked:
            self._settle(call.session_id, request_id, {"error": {"code": INVALID_REQUEST,
                                                                 "message": "the client's stream closed before it answered"}})
        with self._lock:
            session = self._sessions.get(call.session_id)
            if session is not None:
                self._forget_if_empty(call.session_id, session)

    # -- the session ---------------------------------------------------------------------

    def end_session(self, session_id: str) -> None:
        """The session ended: its stream closes and what it was asked fails (calls in
        flight go on: their streams are answered as before)."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is None:
            return
        if session.stream is not None:
            session.stream.close()
        for call_stream in session.call_streams.values():
            call_stream.finish()
        for pending in session.pending.values():
            if pending.timer is not None:
                pending.timer.cancel()
            pending.respond({"error": {"code": INVALID_REQUEST, "message": "the client session ended"}})

    def close_streams(self) -> int:
        """The process drains: every standalone (and listen) stream ends, so its client
        opens it again on another process; calls and what they wait for go on. How many."""
        with self._lock:
            streams = [session.stream for session in self._sessions.values() if session.stream is not None]
        for stream in streams:
            stream.close()
        return len(streams)

    def end_all(self) -> None:
        """The process is stopping: every stream closes, every waiting request fails."""
        with self._lock:
            session_ids = list(self._sessions)
        for session_id in session_ids:
            self.end_session(session_id)

    def counts(self) -> dict[str, int]:
        """For the admin state."""
        with self._lock:
            counts = {
                "standaloneStreams": self._open_streams(),
                "standaloneStreamLimit": STANDALONE_STREAM_LIMIT,
                "awaitingClient": sum(len(s.pending) for s in self._sessions.values()),
                "callsInFlight": sum(len(s.calls) for s in self._sessions.values()),
            }
            streams = [session.stream for session in self._sessions.values() if session.stream is not None]
        # Read after the lock: a stream's own lock is never taken under this one.
        counts["deepestStreamBacklog"] = max((stream.waiting for stream in streams), default=0)
        counts["streamBacklogLimit"] = STREAM_BACKLOG
        # Streams ended for falling behind whose client has not gone yet (holding a thread).
        counts["streamsFellBehind"] = sum(1 for stream in streams if stream.fell_behind)
        return counts

    # -- internals -----------------------------------------------------------------------

    def _settle(self, session_id: str, request_id: Any, answer: dict[str, Any]) -> bool:
        with self._lock:
            session = self._sessions.get(session_id)
            pending = session.pending.pop(_key(request_id), None) if session is not None else None
            if pending is not None and pending.call is not None:
                pending.call.asked.discard(_key(request_id))
        if pending is None:
            return False
        if pending.timer is not None:
            pending.timer.cancel()
        try:
            pending.respond(answer)
        except Exception:  # noqa: BLE001 - one failing receiver must not break the caller
            logger.exception("answering %s failed", pending.method)
        return True

    def _expire(self, session_id: str, request_id: Any) -> None:
        self._settle(session_id, request_id, {"error": {"code": REQUEST_TIMEOUT,
                                                        "message": "the client did not answer within the call's timeout"}})

    def _open_streams(self) -> int:
        return sum(1 for session in self._sessions.values() if session.stream is not None)

    def _forget_if_empty(self, session_id: str, session: _Session) -> None:
        """Under the lock: drop a session entry that holds nothing."""
        if session.stream is None and not session.pending and not session.calls and not session.call_streams:
            self._sessions.pop(session_id, None)
