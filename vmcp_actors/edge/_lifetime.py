"""A request's lifetime: what it holds, let go in one exit.

``RequestLifetime`` owns the session lease and the user holds a request takes, what it
opened (a call in flight, a stream), and its audit line. ``close()`` runs once, in a fixed
order: what the request opened ends (requests still waiting on its stream fail), the audit
line is written, then the holds are let go (only then may the user be released or the
session reaped).

``Answer`` is what the view writes: a JSON body or a status, or an SSE body it iterates;
the view calls ``Answer.close()`` however the response ends. A call answered as SSE ends
its lifetime when the call ends: a client that drops a 2025-11-25 call's stream may come
back for the rest (GET with ``Last-Event-ID``), so the call goes on alone, still holding
its lease, and its newest events are kept (``users._live.CallStream`` says how many).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from vmcp_actors.edge._driver import OUTCOMES, CallRun, Outcome, Write, response_for
from vmcp_actors.identity import Identity
from vmcp_actors.protocol import encode_sse_event
from vmcp_actors.users import Directory, Lease, UserHandle, UserKey
from vmcp_actors.users._live import RESUME_RETRY_MS, CallStream, LiveSessions

logger = logging.getLogger(__name__)

KEEPALIVE = ": keep-alive\n\n"


class RequestLifetime:
    """Everything one request holds (see the module docstring)."""

    def __init__(self, directory: Directory, session_id: str | None = None):
        self._directory = directory
        self.session_id = session_id
        self._leased: str | None = None  # the session whose lease this request holds
        self._held: list[UserKey] = []  # users held for this request (finish each once)
        self._ending: Callable[[], None] | None = None  # what the request opened, ended first
        self._audit: Callable[[RequestLifetime], None] | None = None
        self.run: CallRun | None = None  # its call, once started (which backend it reached)
        # A tools/call by a backend's own name (an app's): (that name, the advertised one it meant).
        self.own_name: tuple[str, str] | None = None
        self.outcome: tuple[int, dict[str, Any] | None] | None = None  # status and body, once answered
        self._closed = False
        self._lock = threading.Lock()  # guards _closed: the view and a call's own thread may both close

    # -- taking ------------------------------------------------------------------------

    def lease(self, session_id: str, identity: Identity | None) -> Lease | None:
        """The session held for this request (and its user's actors when they are live)."""
        lease = self._directory.begin(session_id, identity)
        if lease is not None:
            self._leased = session_id
            if lease.user is not None:
                self._held.append(lease.user.key)
        return lease

    def hold_user(self, key: UserKey) -> UserHandle | None:
        """The user's live actors held for this request; None when they are not live."""
        user = self._directory.hold_user(key)
        if user is not None:
            self._held.append(key)
        return user

    def ends_with(self, ending: Callable[[], None]) -> None:
        """What to end first when the request is over (its call, its stream)."""
        self._ending = ending

    def audited_by(self, write: Callable[[RequestLifetime], None]) -> None:
        self._audit = write

    # -- letting go ----------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self._ending is not None:
                self._ending()
            if self._audit is not None:
                self._audit(self)
        finally:
            if self._leased is not None:
                self._directory.finish(self._leased, self._held[0] if self._held else None)
                held = self._held[1:]
            else:
                held = self._held
            for key in held:
                self._directory.finish("", key)


@dataclass
class Answer:
    """What the view writes: ``stream`` (SSE text, iterated) or a JSON ``body`` or only a
    status. ``close()`` must run once the response is done, however it ends."""

    status: int = 200
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    session_id: str | None = None
    stream: Iterator[str] | None = None
    lifetime: RequestLifetime | None = None
    on_close: Callable[[], None] | None = None  # an SSE body's own settling, before the lifetime's

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()
        elif self.lifetime is not None:
            self.lifetime.close()


def settled(lifetime: RequestLifetime, status: int, body: dict[str, Any] | None, **fields: Any) -> Answer:
    """A complete answer: the request is over, its lifetime ends now."""
    lifetime.outcome = (status, body)
    lifetime.close()
    return Answer(status, body, session_id=lifetime.session_id, **fields)


def answer_call(events: Iterator[Write | Outcome], lifetime: RequestLifetime, request_id: Any,
                live: LiveSessions | None = None) -> Answer:
    """A driven call as the client gets it: JSON when its first event is the outcome,
    else SSE (resumable when ``live`` is given: the session's revision allows it)."""
    first = next(events)
    if isinstance(first, OUTCOMES):
        events.close()
        status, body = response_for(first, request_id)
        return settled(lifetime, status, body)
    body = StreamedCall(first, events, lifetime, request_id, live.open_call_stream(lifetime.session_id or "")
                        if live is not None else None, live)
    return Answer(session_id=lifetime.session_id, stream=iter(body), lifetime=lifetime, on_close=body.close)


class StreamedCall:
    """A call's SSE answer. Iterating writes its messages and its answer; ``close`` settles
    it however the response ended: answered, the lifetime ends; the client gone with the
    answer still to come, the call is cancelled (its exchange closed), or, when resumable,
    goes on alone on a thread of its own, its events kept, and its lifetime ends with it."""

    def __init__(self, first: Write, events: Iterator[Write | Outcome], lifetime: RequestLifetime, request_id: Any,
                 resumable: CallStream | None, live: LiveSessions | None):
        self._first = first
        self._events = events
        self._lifetime = lifetime
        self._request_id = request_id
        self._resumable = resumable
        self._live = live
        self._sent = 0  # events written (ids 1..n; 0 is the priming event)
        self._done = False

    def __iter__(self) -> Iterator[str]:
        if self._resumable is not None:  # the priming event: where to resume from, and how soon
            yield f"id: {self._resumable.event_id(0)}\nretry: {RESUME_RETRY_MS}\ndata: \n\n"
        yield self._encoded(self._first)
        for event in self._events:
            text = self._encoded(event)
            if text is not None:
                yield text
        self._done = True

    def close(self) -> None:
        if self._done or self._resumable is None:
            self._events.close()  # before the answer: the call is cancelled
            self._finish()
            return
        threading.Thread(target=self._go_on_alone, name="vmcp-resumable", daemon=True).start()

    def _go_on_alone(self) -> None:
        """The client left: drive the call to its end (its deadline bounds every wait),
        keeping its events for a resume."""
        try:
            for event in self._events:
                self._encoded(event)
        except Exception:  # noqa: BLE001 - the driver answers every failure; this only logs
            logger.exception("a call whose client left failed")
        finally:
            self._events.close()
            self._finish()

    def _encoded(self, event: Write | Outcome) -> str | None:
        if isinstance(event, Write):
            message: dict[str, Any] | None = event.message
        else:
            status, message = response_for(event, self._request_id)
            self._lifetime.outcome = (status, message)
            if message is None:  # cancelled: nothing is written
                return None
        self._sent += 1
        text = encode_sse_event(message, event_id=self._resumable.event_id(self._sent) if self._resumable else None)
        if self._resumable is not None:
            self._resumable.add(text)
        return text

    def _finish(self) -> None:
        try:
            if self._resumable is not None and self._live is not None:
                self._live.call_stream_done(self._resumable)
        finally:
            self._lifetime.close()


def sse_text(messages: Iterator[dict[str, Any] | None], opening: str | None = None) -> Iterator[str]:
    """Messages as SSE events (None: a keep-alive comment), after ``opening``."""
    if opening is not None:
        yield opening
    for message in messages:
        yield encode_sse_event(message) if message is not None else KEEPALIVE


def replayed(texts: Iterator[str | None]) -> Iterator[str]:
    for text in texts:
        yield text if text is not None else KEEPALIVE
