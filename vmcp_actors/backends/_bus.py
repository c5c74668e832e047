"""MCP over one message link: a child's stdin and stdout, or a 2024-11-05 SSE stream and
its POST endpoint. Every message of the backend arrives on one reader, so the gateway
routes them itself: an answer to the request whose id it carries (ids on the wire are the
bus's own, so the many channels of a shared child never collide), a progress notification
to the call that gave its token, anything else to the one call in flight when there is
exactly one, else to the listeners (a per-user link) or, for a request, an error at once.

``BusClient`` is one channel's view of a bus, with the HTTP client's interface
(``post``, ``exchange``, ``listen``, ``delete_session``, ``close``), so a
``BackendChannel`` speaks to a process exactly as to an HTTP server.

A link is initialized once: the first ``initialize`` goes out, and every later one (another
user's channel on a shared child, a renewed handshake) is answered with the first one's
result. A link that ends is opened again on the next use, after a back-off, and given the
same ``initialize`` before anything else, so a restart is invisible to the channels.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from vmcp_actors.backends._http import STREAM_OPEN, Abort, PostResult
from vmcp_actors.concurrency import call_later
from vmcp_actors.exceptions import (
    BackendCancelled,
    BackendError,
    BackendProtocolError,
    BackendTimeout,
    BackendUnavailable,
)

logger = logging.getLogger(__name__)

# After a link ends, it is not opened again before this long, doubling up to the most.
RESTART_BACKOFF = 1.0
RESTART_BACKOFF_MOST = 30.0
# A link that stayed up this long is taken as healthy again: the back-off starts over.
HEALTHY_AFTER = 60.0
# How long a response to the backend's own request, or a notification, may wait to be written.
SEND_TIMEOUT = 10.0
# How long a request outside any call waits for its one client's stream to open (a
# child asks for roots right after initialize, before the client's stream is there).
UNCLAIMED_WAIT = 10.0

# Messages of the backend's a call holds that its client has not read yet (the call's web
# thread waits while writing to a client that reads slowly; the link's reader never waits).
# A call's progress and log messages come in tens, not hundreds, between two reads of a
# client that keeps up. Past it a notification is dropped (the client is told how many, in
# a warning where they were), a request refused at once; the answer is always kept.
CALL_BACKLOG = 256

_LOST, _MESSAGE, _DROPPED = "lost", "message", "dropped"
# Requests the gateway makes for itself: what the backend sends outside a call while one
# of these is in flight is not theirs (no client takes part in them).
GATEWAYS_OWN = frozenset({"initialize", "ping", "tools/list", "prompts/list", "resources/list",
                          "resources/templates/list"})


class NotRunning(BackendUnavailable):
    """A probe found no live link: nothing to check, nothing started."""


class Link(Protocol):
    """One live connection: ``send`` writes a message (raising BackendError when it cannot),
    with the headers of the call it is for when there is one (a credential renewed since
    the link opened); the link reports what it reads with ``bus.received`` and its end with
    ``bus.lost``."""

    def send(self, message: dict[str, Any], headers: Mapping[str, str] | None = None) -> None: ...

    def close(self) -> None: ...


# Opens a link for a bus, given the caller's headers (a process's credential comes from
# them): returns it started and reading, or raises BackendError.
LinkOpener = Callable[["MessageBus", Mapping[str, str]], Link]


@dataclass(eq=False)
class _Call:
    """A request of the gateway's in flight on the link."""

    own_id: Any  # the id the channel gave it
    progress_token: Any
    inbox: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    for_a_client: bool = False  # a client's call (not the gateway's own list, ping or initialize)
    unread: int = 0  # the backend's messages in the inbox (under the bus's _lock; at most CALL_BACKLOG)
    dropped: int = 0  # notifications dropped since the last warning was read (under the bus's _lock)


@dataclass(frozen=True)
class _Opening:
    """The first ``initialize``: replayed on every new link, and its answer given to every later one."""

    params: Mapping[str, Any]
    answer: Mapping[str, Any] | None = None


class MessageBus:
    """One backend link and the requests over it (thread-safe). ``one_client``: every
    view of it serves one client session, so whatever a call cannot take is that
    client's (a request waits up to UNCLAIMED_WAIT for its listener). Otherwise only a
    notification meant for everyone (a list change) goes to every listener; a request
    no call takes is refused and any other notification dropped, never guessed at."""

    def __init__(self, backend: str, open_link: LinkOpener, *, one_client: bool,
                 on_lost: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 opening_params: Mapping[str, Any] | None = None):
        """``opening_params``: the ``initialize`` every link gets (else the first channel's)."""
        self.backend = backend
        self._open_link = open_link
        self._one_client = one_client
        self._on_lost = on_lost  # told why a link ended (a crash, for health and metrics)
        self._clock = clock
        self._lock = threading.Lock()  # guards every field below; never held while sending or opening
        self._opening_lock = threading.Lock()  # one opener at a time; not taken under _lock
        self._link: Link | None = None
        self._generation = 0  # which link the fields below are about
        self._link_ready = False  # the link answered its initialize (or needs none)
        self._calls: dict[int, _Call] = {}  # by wire id
        self._listeners: list[queue.SimpleQueue] = []
        # One client's requests that came before its listener: (link, request, expiry).
        self._unclaimed: list[tuple[Link, dict[str, Any], float]] = []
        self._opening: _Opening | None = _Opening(dict(opening_params)) if opening_params is not None else None
        self._initialized_sent = False
        self._wire_ids = itertools.count(1)
        self._opened_at: float | None = None
        self._closed = False
        self._failures_in_a_row = 0
        self._not_before = 0.0  # no new link before this (the back-off)
        self._last_loss: str | None = None  # why the last link ended or could not be opened
        self.restarts = 0
        self.last_used = clock()

    # -- what views ask --------------------------------------------------------------

    def request(self, message: dict[str, Any], timeout: float, abort: Abort | None = None,
                headers: Mapping[str, str] | None = None, *,
                probe: bool = False) -> Generator[dict[str, Any], None, dict[str, Any]]:
        """Send a request; yield the messages routed to it; return its answer (with the
        channel's own id). ``abort`` ends it from another thread (BackendCancelled).
        ``probe``: a health check's, on the live link only (NotRunning when there is none)
        and not counted as use, so checks keep no link open."""
        deadline = self._clock() + timeout
        if message.get("method") == "initialize":
            return (yield from self._initialize(message, deadline, headers or {}))
        params = message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        call = _Call(message.get("id"), meta.get("progressToken") if isinstance(meta, dict) else None,
                     for_a_client=message.get("method") not in GATEWAYS_OWN)
        while True:
            link, generation = self._live() if probe else self._ready(deadline, headers or {})
            with self._lock:  # the call is registered on the link it found, or that link was retired meanwhile
                if self._link is link and self._generation == generation:
                    wire_id = next(self._wire_ids)
                    self._calls[wire_id] = call
                    if not probe:
                        self.last_used = self._clock()
                    break
        cancelled = threading.Event()
        if abort is not None and not abort.on_abort(lambda: self._cancel(wire_id, call, cancelled)):
            self._forget(wire_id, used=not probe)
            raise BackendCancelled(self.backend, f"the call to backend {self.backend!r} was cancelled")
        try:
            self._send(link, generation, {**message, "id": wire_id}, headers)
            while True:
                left = deadline - self._clock()
                if left <= 0:
                    raise BackendTimeout(self.backend, f"backend {self.backend!r} did not answer "
                                                       f"{message.get('method')} within {timeout:g}s")
                try:
                    kind, value = call.inbox.get(timeout=left)
                except queue.Empty:
                    continue
                if cancelled.is_set():
                    raise BackendCancelled(self.backend, f"the call to backend {self.backend!r} was cancelled")
                if kind == _LOST:
                    raise value
                if kind == _DROPPED:
                    yield self._dropped_warning(call)
                    continue
                if "method" in value:
                    with self._lock:
                        call.unread -= 1
                    yield value
                    continue
                return {**value, "id": call.own_id}
        finally:
            self._forget(wire_id, used=not probe)
            if abort is not None:
                abort.on_abort(None)

    def notify(self, message: dict[str, Any], headers: Mapping[str, str] | None = None) -> None:
        """A notification, or a response to the backend's own request (its id is the
        backend's: sent as it is). ``notifications/initialized`` goes out once per link."""
        method = message.get("method")
        deadline = self._clock() + SEND_TIMEOUT
        if method == "notifications/initialized":
            with self._lock:
                if self._initialized_sent:
                    return
            link, generation = self._ready(deadline, headers or {})
            with self._lock:
                if self._initialized_sent:
                    return
                self._initialized_sent = True
            self._send(link, generation, message, headers)
            return
        if method == "notifications/cancelled":
            return  # a call's cancellation goes through its Abort (which knows its wire id)
        link, generation = self._ready(deadline, headers or {})
        self._send(link, generation, message, headers)

    def listen(self, abort: Abort) -> Iterator[dict[str, Any]]:
        """What the backend sends that no call takes, until ``abort``."""
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        with self._lock:
            self._listeners.append(inbox)
            waiting = [request for link, request, _expiry in self._unclaimed if link is self._link]
            self._unclaimed = []
        for request in waiting:
            inbox.put((_MESSAGE, request))
        stopped = threading.Event()
        if not abort.on_abort(lambda: (stopped.set(), inbox.put((_LOST, None)))):
            self._unlisten(inbox)
            return
        try:
            yield STREAM_OPEN  # registered: nothing the backend sends from now on is missed
            while True:
                kind, value = inbox.get()
                if stopped.is_set() or kind == _LOST:
                    return
                yield value
        finally:
            abort.on_abort(None)
            self._unlisten(inbox)

    def busy(self) -> bool:
        """A call in flight, or a link being opened and initialized."""
        with self._lock:
            return bool(self._calls) or self._opening_lock.locked()

    def retire_if_idle(self, why: str) -> Link | None:
        """End the link on purpose (idle, or making room) when nothing uses it: no call in
        flight and none opening it. Returns the link, for the caller to close; the next use
        opens a new one at once. A call registers only on the link it found still current,
        so one about to start simply opens the next link."""
        with self._lock:
            if self._link is None or self._calls or self._opening_lock.locked():
                return None
            link, self._link = self._link, None
            self._generation += 1
            listeners = list(self._listeners)
        logger.info("backend %r: %s", self.backend, why)
        for inbox in listeners:
            inbox.put((_LOST, None))
        return link

    def close(self) -> None:
        """End the link for good; calls in flight fail."""
        with self._lock:
            self._closed = True
            link, self._link = self._link, None
            self._generation += 1
        if link is not None:
            link.close()
        self._fail_all(BackendUnavailable(self.backend, f"backend {self.backend!r} was stopped"))

    def restarting(self) -> str | None:
        """Why the last link ended, or could not be opened, while the back-off after it
        lasts: a crash loop shows in health checks, and heals with the back-off."""
        with self._lock:
            return self._last_loss if self._link is None and self._clock() < self._not_before else None

    def calls(self) -> int:
        """Requests in flight on the link."""
        with self._lock:
            return len(self._calls)

    # -- what the link reports ---------------------------------------------------------

    def received(self, link: Link, message: dict[str, Any]) -> None:
        with self._lock:
            if link is not self._link:
                return  # an old link's last words
            target = self._route(message)
            listeners = list(self._listeners) if target is None else []
            taken, first_drop = True, False
            if target is not None and "method" in message:  # the backend's request or notification for a call
                taken = target.unread < CALL_BACKLOG
                if taken:
                    target.unread += 1
                elif "id" not in message:
                    target.dropped += 1
                    first_drop = target.dropped == 1
        if target is not None:
            if taken:
                target.inbox.put((_MESSAGE, message))
            elif "id" in message:  # its client is not reading: the backend hears so at once
                self._refuse(link, message, "the client is not reading this call's stream (CALL_BACKLOG messages "
                                            "wait for it)")
            elif first_drop:  # the warning goes where the gap begins
                target.inbox.put((_DROPPED, None))
            return
        if "id" in message and "method" not in message:
            logger.debug("backend %r answered a request no one waits for any more", self.backend)
            return
        is_request = "id" in message
        if listeners and (self._one_client or not is_request and _for_everyone(message)):
            for inbox in listeners:
                inbox.put((_MESSAGE, message))
            return
        if is_request and self._one_client:  # its client's stream is not open yet: it waits a while
            with self._lock:
                self._unclaimed.append((link, message, self._clock() + UNCLAIMED_WAIT))
            call_later(UNCLAIMED_WAIT, self._refuse_unclaimed)
        elif is_request:
            logger.warning("backend %r asked %s outside a call, on a process several client sessions share: "
                           "refused (scope: perSession gives each client session its own)",
                           self.backend, message.get("method"))
            self._refuse(link, message)
        else:
            logger.info("backend %r sent %s outside any call%s: dropped", self.backend, message.get("method"),
                        "" if self._one_client else ", on a process several client sessions share")

    def _refuse_unclaimed(self) -> None:
        """Requests whose client opened no stream within UNCLAIMED_WAIT are refused."""
        now = self._clock()
        with self._lock:
            expired = [entry for entry in self._unclaimed if entry[2] <= now]
            self._unclaimed = [entry for entry in self._unclaimed if entry[2] > now]
        for link, request, _expiry in expired:
            logger.warning("backend %r asked %s outside a call and its client opened no stream to take it: "
                           "refused", self.backend, request.get("method"))
            self._refuse(link, request)

    def lost(self, link: Link, why: str) -> None:
        """The link ended (the child exited, the stream dropped): calls on it fail, and the
        next use opens a new one after a back-off."""
        with self._lock:
            if link is not self._link:
                return
            self._link = None
            self._generation += 1
            lasted = self._clock() - (self._opened_at or self._clock())
            self._failures_in_a_row = 0 if lasted >= HEALTHY_AFTER else self._failures_in_a_row + 1
            backoff = min(RESTART_BACKOFF * 2 ** max(self._failures_in_a_row - 1, 0), RESTART_BACKOFF_MOST)
            self._not_before = self._clock() + backoff
            self._last_loss = why
            listeners = list(self._listeners)
        logger.warning("backend %r: %s; it starts again on its next use (not before %.0fs)", self.backend, why, backoff)
        self._fail_all(BackendUnavailable(self.backend, f"backend {self.backend!r} ended: {why}"))
        for inbox in listeners:
            inbox.put((_LOST, None))
        if self._on_lost is not None:
            self._on_lost(why)

    # -- inside --------------------------------------------------------------------------

    def _route(self, message: dict[str, Any]) -> _Call | None:
        """(Under _lock.) The call a message belongs to, if any."""
        if "method" not in message:
            wire_id = message.get("id")
            return self._calls.get(wire_id) if isinstance(wire_id, int) else None
        params = message.get("params")
        if message.get("method") == "notifications/progress" and isinstance(params, dict):
            token = params.get("progressToken")
            for call in self._calls.values():
                if call.progress_token is not None and call.progress_token == token:
                    return call
            return None
        if _for_everyone(message):  # about the server as a whole: never one call's
            return None
        only = next(iter(self._calls.values())) if len(self._calls) == 1 else None
        return only if only is not None and only.for_a_client else None  # discovery's list has no client to ask

    def _initialize(self, message: dict[str, Any], deadline: float,
                    headers: Mapping[str, str]) -> Generator[dict[str, Any], None, dict[str, Any]]:
        """The first channel's params become the link's initialize (unless given at
        construction); every channel gets the first answer."""
        params = message.get("params")
        with self._lock:
            if self._opening is None:
                self._opening = _Opening(dict(params) if isinstance(params, dict) else {})
        self._ready(deadline, headers)  # opening a link initializes it
        with self._lock:
            opening = self._opening
        if opening is None or opening.answer is None:
            raise BackendUnavailable(self.backend, f"backend {self.backend!r} did not initialize")
        return {**opening.answer, "id": message.get("id")}
        yield  # a generator, like every request

    def _live(self) -> tuple[Link, int]:
        """The live link, initialized; NotRunning when there is none."""
        with self._lock:
            if self._link is None or self._opening_lock.locked():
                raise NotRunning(self.backend, f"backend {self.backend!r} is not running")
            return self._link, self._generation

    def _ready(self, deadline: float, headers: Mapping[str, str]) -> tuple[Link, int]:
        """The live link, opened (and initialized) when there is none."""
        with self._lock:
            if self._closed:
                raise BackendUnavailable(self.backend, f"backend {self.backend!r} was stopped")
            link, generation = (self._link, self._generation) if self._link is not None and self._link_ready \
                else (None, 0)
        if link is not None:
            outdated = getattr(link, "outdated", None)
            if not headers or outdated is None or not outdated(headers):
                return link, generation
            # Its credential was renewed (a person's token): a new process gets the new one
            # as soon as nothing is in flight on this one; until then this one serves.
            retired = self.retire_if_idle("its credential was renewed: starting it again with the new one")
            if retired is None:
                return link, generation
            retired.close()
        # Another caller may be opening and initializing it: wait for that, within the deadline.
        if not self._opening_lock.acquire(timeout=max(0.0, deadline - self._clock())):
            raise BackendTimeout(self.backend, f"backend {self.backend!r} was still starting when the call's "
                                               "time ran out")
        try:
            return self._open_locked(deadline, headers)
        finally:
            self._opening_lock.release()

    def _open_locked(self, deadline: float, headers: Mapping[str, str]) -> tuple[Link, int]:
        """(Under _opening_lock.) The live link, or a new one opened and initialized."""
        with self._lock:
            if self._link is not None and self._link_ready:
                return self._link, self._generation
            wait = self._not_before - self._clock()
        if wait > 0:
            if wait >= deadline - self._clock():
                raise BackendUnavailable(self.backend, f"backend {self.backend!r} is starting again in "
                                                       f"{wait:.0f}s")
            time.sleep(wait)  # the back-off ends within the request's deadline: it waits
        try:
            link = self._open_link(self, headers)
        except BackendError as error:
            with self._lock:
                self._last_loss = str(error)
                self._failures_in_a_row += 1
                self._not_before = self._clock() + min(
                    RESTART_BACKOFF * 2 ** (self._failures_in_a_row - 1), RESTART_BACKOFF_MOST)
            raise
        with self._lock:
            if self._closed:
                link.close()
                raise BackendUnavailable(self.backend, f"backend {self.backend!r} was stopped")
            if self._opened_at is not None:
                self.restarts += 1
            self._link, self._opened_at = link, self._clock()
            self._link_ready = False  # others wait (on the opening lock) for its initialize
            self._generation += 1
            self._initialized_sent = False
            generation, opening = self._generation, self._opening
        if opening is not None:
            try:
                self._initialize_link(link, generation, opening, deadline)
            except BaseException:
                self.lost(link, "it did not answer initialize")
                link.close()
                raise
        with self._lock:
            if self._link is link:
                self._link_ready = True
        return link, generation

    def _initialize_link(self, link: Link, generation: int, opening: _Opening, deadline: float) -> None:
        """Send the first initialize on a new link and wait for its answer (the first answer
        is kept for every later initialize); then ``notifications/initialized``."""
        call = _Call(None, None)
        with self._lock:
            wire_id = next(self._wire_ids)
            self._calls[wire_id] = call
        try:
            self._send(link, generation, {"jsonrpc": "2.0", "id": wire_id, "method": "initialize",
                                          "params": dict(opening.params)})
            while True:
                left = deadline - self._clock()
                if left <= 0:
                    raise BackendTimeout(self.backend, f"backend {self.backend!r} did not answer initialize")
                try:
                    kind, value = call.inbox.get(timeout=left)
                except queue.Empty:
                    continue
                if kind == _LOST:
                    raise value
                if "method" in value:
                    continue  # nothing the backend sends before its answer has a call to go to
                break
        finally:
            self._forget(wire_id)
        if "error" in value or not isinstance(value.get("result"), dict):
            error = value.get("error") if isinstance(value.get("error"), dict) else {}
            raise BackendProtocolError(self.backend, f"backend {self.backend!r} refused initialize: "
                                                     f"{str(error.get('message', 'no result'))[:200]}")
        with self._lock:
            if self._opening is opening and opening.answer is None:
                self._opening = _Opening(opening.params, {"jsonrpc": "2.0", "result": value["result"]})
            already = self._initialized_sent
            self._initialized_sent = True
        if not already:
            self._send(link, generation, {"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _send(self, link: Link, generation: int, message: dict[str, Any],
              headers: Mapping[str, str] | None = None) -> None:
        with self._lock:
            current = self._generation == generation and self._link is link
        if not current:
            raise BackendUnavailable(self.backend, f"backend {self.backend!r} restarted during the call")
        link.send(message, headers)

    def _cancel(self, wire_id: int, call: _Call, cancelled: threading.Event) -> None:
        """The call's Abort: the backend is told (by wire id) and the call ends now."""
        cancelled.set()
        call.inbox.put((_LOST, BackendCancelled(self.backend, f"the call to backend {self.backend!r} was cancelled")))
        with self._lock:
            link, generation = self._link, self._generation
            still = wire_id in self._calls
        if link is None or not still:
            return
        try:
            self._send(link, generation, {"jsonrpc": "2.0", "method": "notifications/cancelled",
                                          "params": {"requestId": wire_id, "reason": "cancelled by the client"}})
        except BackendError:
            pass  # the link is gone: nothing runs the call any more

    def _refuse(self, link: Link, request: dict[str, Any], why: str = "the gateway cannot tie this request to a "
                "client: it came outside any call, or while several calls were in flight") -> None:
        try:
            link.send({"jsonrpc": "2.0", "id": request.get("id"), "error": {"code": -32603, "message": why}})
        except BackendError:
            pass

    def _dropped_warning(self, call: _Call) -> dict[str, Any]:
        """Where a call's notifications were dropped (its client read too slowly): how many."""
        with self._lock:
            dropped, call.dropped = call.dropped, 0
        logger.warning("backend %r: %d notifications of a call were dropped: its client read too slowly",
                       self.backend, dropped)
        return {"jsonrpc": "2.0", "method": "notifications/message", "params": {
            "level": "warning", "logger": "vmcp-actors", "data": {
                "warning": f"{dropped} notifications of this call from backend {self.backend!r} were dropped here: "
                           "the client read the call's stream too slowly", "dropped": dropped}}}

    def _forget(self, wire_id: int, used: bool = True) -> None:
        with self._lock:
            self._calls.pop(wire_id, None)
            if used:
                self.last_used = self._clock()

    def _unlisten(self, inbox: queue.SimpleQueue) -> None:
        with self._lock:
            if inbox in self._listeners:
                self._listeners.remove(inbox)

    def _fail_all(self, error: BackendError) -> None:
        with self._lock:
            calls = list(self._calls.values())
        for call in calls:
            call.inbox.put((_LOST, error))


# Notifications about the server as a whole: never part of a call, even the only one in
# flight, and every listener of a shared link may have them.
_FOR_EVERYONE = frozenset({"notifications/tools/list_changed", "notifications/prompts/list_changed",
                           "notifications/resources/list_changed", "notifications/resources/updated"})


def _for_everyone(message: Mapping[str, Any]) -> bool:
    return message.get("method") in _FOR_EVERYONE


class BusClient:
    """One channel's view of a bus, with the HTTP client's interface. Sessions do not
    exist on a link (``session_id`` is None); headers do not either (credentials of a
    process go into its environment when it starts)."""

    def __init__(self, bus: MessageBus, release: Callable[[BusClient], None] | None = None):
        self._bus = bus
        self._release = release  # told when the channel is done with the bus
        self._closed = False

    def __repr__(self) -> str:
        return f"BusClient(backend={self._bus.backend!r})"

    @property
    def backend_name(self) -> str:
        return self._bus.backend

    @property
    def routes_requests(self) -> bool:
        """The bus ties the backend's requests to calls itself (no reader thread needed)."""
        return True

    def post(self, message: dict, *, session_id: str | None, protocol_version: str | None, timeout: float,
             on_notification: Callable[[dict], None] | None = None,
             extra_headers: Mapping[str, str] | None = None) -> PostResult:
        if not ("method" in message and "id" in message):
            self._bus.notify(message, extra_headers)
            return PostResult(202, None, None)
        exchange = self._bus.request(message, timeout, None, extra_headers)
        while True:
            try:
                streamed = next(exchange)
            except StopIteration as answered:
                return PostResult(200, None, answered.value)
            if on_notification is not None and "id" not in streamed:
                on_notification(streamed)

    def exchange(self, request: dict, *, session_id: str | None, protocol_version: str | None, timeout: float,
                 extra_headers: Mapping[str, str] | None = None,
                 abort: Abort | None = None) -> Generator[dict, None, dict]:
        return self._bus.request(request, timeout, abort, extra_headers)

    def listen(self, *, session_id: str | None, protocol_version: str | None,
               extra_headers: Mapping[str, str] | None = None, abort: Abort, connect_timeout: float,
               request: dict | None = None) -> Iterator[dict]:
        return self._bus.listen(abort)

    def delete_session(self, session_id: str, *, protocol_version: str | None, timeout: float,
                       extra_headers: Mapping[str, str] | None = None) -> None:
        pass  # a link has no session to end; the owner of the bus decides when it stops

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._release is not None:
            self._release(self)

