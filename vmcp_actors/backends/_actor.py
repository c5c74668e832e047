"""BackendConnection: one backend, one user.

The actor owns the connection's state: the handshake (started once, renewed once when
the backend forgets our session), the state machine, the last error and the discovered
lists. It never waits on the network in its loop: the handshake and the list calls run
as pooled jobs and report back with messages, each step chained on the one before by a
callback (discovery's lists start when the handshake settles), and calls run on the
caller's thread through the connection's BackendChannel, so concurrent calls overlap.

Its handlers never wait, so it is a PooledActor: it holds a thread of the shared actor
pool only while it handles a message, and a live user costs one thread (its UserActor),
not one per backend.

A connection revived from the user record starts from the recorded handshake: the
backend session is used as it is, and a 404 to it re-initializes, as for a restart.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from vmcp_actors.backends._channel import BackendChannel
from vmcp_actors.backends._http import STREAM_OPEN, Abort
from vmcp_actors.backends._models import (
    ConnectionSnapshot,
    ConnectionState,
    DiscoveredBackend,
    Handshake,
)
from vmcp_actors.concurrency import (
    TimerHandle,
    call_later,
    failed,
    on_settled,
    resolved,
    result_or_none,
    run_in_thread,
    settle_from,
    tell_quietly,
    when_all,
)
from vmcp_actors.config import BackendConfig
from vmcp_actors.exceptions import (
    BackendError,
    BackendHTTPError,
    BackendProtocolError,
    BackendRpcError,
    BackendSessionExpired,
    BackendUnavailable,
)
from vmcp_actors.identity import Identity
from vmcp_actors.pooled import PooledActor
from vmcp_actors.protocol import METHOD_NOT_FOUND
from vmcp_actors.protocol.mcp import valid_header_params

logger = logging.getLogger(__name__)

# Lists a backend may advertise without implementing: -32601 on these means "empty".
TOLERATED_LISTS = frozenset({"resources/list", "resources/templates/list", "prompts/list"})
# (capability, method, result key) in the order discovery asks for them.
DISCOVERY_LISTS = (
    ("tools", "tools/list", "tools"),
    ("resources", "resources/list", "resources"),
    ("resources", "resources/templates/list", "resourceTemplates"),
    ("prompts", "prompts/list", "prompts"),
)
MAX_PAGES = 1000

# Told to the owner whenever the backend session changes (None: it ended).
HandshakeObserver = Callable[[str, "Handshake | None"], None]
# Told to the owner for each message on the backend's standalone stream (a notification
# dict or a BackendRequest); called on the listener's thread, so it must only tell.
StreamObserver = Callable[[str, Any], None]
# A standalone stream that drops is opened again after this long, doubling up to the most.
RELISTEN_AFTER = 0.5
RELISTEN_AFTER_MOST = 30.0


def display_url(url: str) -> str:
    """The URL for operator logs: no userinfo, query or fragment, which may carry secrets."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


@dataclass(frozen=True)
class _HandshakeSettled:
    discovery: cf.Future[DiscoveredBackend]
    handshake: cf.Future[Handshake]
    renewed: bool


@dataclass(frozen=True)
class _ListsSettled:
    discovery: cf.Future[DiscoveredBackend]
    handshake: Handshake
    lists: dict[str, cf.Future[tuple[dict[str, Any], ...]]]
    renewed: bool


NO_REFUSAL = object()  # no backend session has refused a standalone stream yet


class BackendConnection(PooledActor):
    """One backend MCP session on behalf of one user."""

    def __init__(self, backend: BackendConfig, channel: BackendChannel, *, restored: Handshake | None = None,
                 on_handshake: HandshakeObserver | None = None, on_stream: StreamObserver | None = None):
        super().__init__()
        self._on_stream = on_stream
        self._stream_wanted = False
        self._stream_identity: Identity | None = None
        self._stream_uris: frozenset[str] = frozenset()
        self._listener: _StreamListener | None = None
        self._stream_waiters: list[cf.Future[None]] = []  # stream_ready() asked before there was a listener
        # The backend session that answered 405 to GET (None: a session-less one did);
        # NO_REFUSAL until one does.
        self._no_stream_on: object = NO_REFUSAL
        self._relisten_after = RELISTEN_AFTER
        self._relisten: TimerHandle | None = None
        self._name = backend.name
        self._url = display_url(backend.url)
        self._channel = channel
        self._on_handshake = on_handshake
        self._handshake_identity: Identity | None = None
        self._state = ConnectionState.RESTORED if restored is not None else ConnectionState.NEW
        self._last_error: str | None = None
        self._handshake: cf.Future[Handshake] | None = resolved(restored) if restored is not None else None
        self._ready: cf.Future[Handshake] | None = self._handshake  # the handshake callers are handed
        self._discovery: cf.Future[DiscoveredBackend] | None = None
        self._discovery_identity: Identity | None = None
        self._discovered: DiscoveredBackend | None = None
        self._end_remote = False
        # Attached before the actor runs, so the channel works the moment start() returns.
        channel.attach(self.actor_ref.proxy())
        channel.publish_handshake(self._handshake)

    def on_stop(self) -> None:
        ready, raw = self._ready, self._handshake
        if ready is not None and raw is not None and not ready.done():  # its message will not be read now
            on_settled(raw, lambda done: settle_from(ready, done))
        self._stop_listening()
        self._settle_stream_waiters()
        self._state = ConnectionState.CLOSED
        self._channel.publish_handshake(None)
        handshake = result_or_none(self._handshake)
        if self._end_remote and handshake is not None and handshake.session_id:
            # End the backend session off the actor thread so stopping stays prompt.
            run_in_thread(self._channel.close_remote, handshake, self._handshake_identity)
        else:
            self._channel.close()

    # -- asked by the UserActor and by channels; each answers at once --------------------

    def handshake(self, identity: Identity | None) -> cf.Future[Handshake]:
        """The current handshake, started if there is none or the last one failed."""
        if self._state is ConnectionState.CLOSED:
            return failed(BackendUnavailable(self._name, f"backend {self._name!r} connection is closed"))
        if self._handshake is None or _failed(self._handshake):
            self._state = ConnectionState.INITIALIZING
            self._handshake_identity = identity
            raw, ready = run_in_thread(self._channel.perform_handshake, identity), cf.Future()
            self._handshake, self._ready = raw, ready
            ref = self.actor_ref
            on_settled(raw, lambda done: tell_quietly(ref, _HandshakeFinished(done, ready)))
            self._channel.publish_handshake(ready)
        assert self._ready is not None
        return self._ready

    def renew_handshake(self, identity: Identity | None, expired_session_id: str | None) -> cf.Future[Handshake]:
        """The backend forgot ``expired_session_id``: start one new handshake (once, however many ask)."""
        current = result_or_none(self._handshake)
        if current is not None and current.session_id == expired_session_id:
            logger.info("backend %r forgot its session; re-initializing", self._name)
            self._handshake = None
            self._stop_listening()  # it listens again on the new session
        return self.handshake(identity)

    def want_stream(self, wanted: bool, identity: Identity | None, resource_uris: frozenset[str] = frozenset()) -> None:
        """Keep the backend's standalone stream open while something needs it (a client
        stream, a subscription), and closed when nothing does. ``resource_uris``: the
        subscribed resources a 2026-07-28 backend's ``subscriptions/listen`` must name
        (a change reopens its stream)."""
        self._stream_wanted = wanted
        changed = resource_uris != self._stream_uris
        self._stream_uris = resource_uris
        if wanted:
            self._stream_identity = identity
            handshake = result_or_none(self._handshake)
            if changed and handshake is not None and handshake.is_modern and self._listener is not None:
                self._stop_listening()
            self._listen()
        elif not self._takes_requests():
            self._stop_listening()

    def stream_ready(self) -> cf.Future[None]:
        """Settles once the standalone stream this connection wants is open (the backend
        has it: nothing it sends from then on is lost), or once it will not open now: none
        wanted, the backend offers none, the handshake or the stream failed, or the
        connection closed. Asked after want_stream, so a client's stream or subscription is
        answered only when what the backend sends for it reaches the gateway."""
        listener = self._listener
        if listener is not None:
            return listener.opened
        waiter: cf.Future[None] = cf.Future()
        self._stream_waiters.append(waiter)
        self._hand_over_stream_waiters()
        return waiter

    def discover(self, identity: Identity | None) -> cf.Future[DiscoveredBackend]:
        """The backend's lists, fetched anew (a discovery in flight is shared)."""
        if self._state is ConnectionState.CLOSED:
            return failed(BackendUnavailable(self._name, f"backend {self._name!r} connection is closed"))
        if self._discovery is None or self._discovery.done():
            self._discovery = cf.Future()
            self._discovery_identity = identity
            self._after_handshake(self._discovery, self.handshake(identity), renewed=False)
        return self._discovery

    def close(self, end_remote: bool) -> None:
        """Stop; with ``end_remote`` the backend session is ended (DELETE) as well."""
        self._end_remote = end_remote
        self.actor_ref.stop(block=False)

    def snapshot(self) -> ConnectionSnapshot:
        handshake = result_or_none(self._handshake)
        found = self._discovered
        return ConnectionSnapshot(
            backend=self._name,
            state=self._state.value,
            protocol_version=handshake.protocol_version if handshake else None,
            protocol_reason=self._protocol_reason(handshake),
            tools=len(found.tools) if found else 0,
            resources=len(found.resources) if found else 0,
            prompts=len(found.prompts) if found else 0,
            last_error=self._last_error,
        )

    def _protocol_reason(self, handshake: Handshake | None) -> str | None:
        if handshake is None:
            return None
        if self._channel.era_reason is None:  # no handshake in this process: the record's
            return "restored from the user record (the handshake that opened this backend session said so)"
        return self._channel.era_reason

    # -- told by pooled jobs, callbacks and channels -------------------------------------

    def exchange_failed(self, message: str) -> None:
        self._last_error = message

    def on_receive(self, message: Any) -> None:
        if isinstance(message, _HandshakeFinished):
            self._handshake_finished(message.future, message.ready)
        elif isinstance(message, _ListenerEnded):
            self._listener_ended(message)
        elif isinstance(message, _Relisten):
            self._relisten = None
            self._listen()
        elif isinstance(message, _HandshakeSettled):
            self._lists_after_handshake(message)
        elif isinstance(message, _ListsSettled):
            self._discovery_settled(message)

    # -- internals on the actor thread --------------------------------------------------

    def _handshake_finished(self, future: cf.Future[Handshake], ready: cf.Future[Handshake]) -> None:
        """Callers get the handshake once a session that takes requests has its standalone
        stream open: what the backend asks there during their first call is not lost."""
        if future is not self._handshake or self._state is ConnectionState.CLOSED:
            settle_from(ready, future)
            return  # a stale handshake, replaced by a renewal
        error = future.exception()
        if error is not None:
            self._fail(error)
            settle_from(ready, future)
            return
        self._state = ConnectionState.READY
        if self._on_handshake is not None:
            self._on_handshake(self._name, future.result())
        try:
            self._listen()
        finally:
            listener = self._listener
            if listener is not None and self._takes_requests():
                listener.opened.add_done_callback(lambda _opened: settle_from(ready, future))
            else:
                settle_from(ready, future)

    def on_start(self) -> None:
        self._listen()  # a revived user's backend session may ask outside a call at once

    def _takes_requests(self) -> bool:
        """A 2025 backend session told that the user's clients take sampling, elicitation
        or roots: it may ask for them outside a call, on its standalone stream, which
        therefore stays open for as long as the connection lives (as a direct client's does)."""
        handshake = result_or_none(self._handshake)
        return self._channel.takes_requests and handshake is not None and not handshake.is_modern

    def _listen(self) -> None:
        """Open the standalone stream if it is wanted and not open (after the handshake)."""
        try:
            self._open_listener()
        finally:
            self._hand_over_stream_waiters()

    def _open_listener(self) -> None:
        if not (self._stream_wanted or self._takes_requests()) or self._on_stream is None \
                or self._state is ConnectionState.CLOSED or self._listener is not None or self._relisten is not None:
            return
        handshake = result_or_none(self._handshake)
        if handshake is None:
            self.handshake(self._stream_identity)  # listens once it settles
            return
        if handshake.session_id == self._no_stream_on:
            return
        ref = self.actor_ref
        identity = self._stream_identity if self._stream_wanted else self._handshake_identity
        self._listener = _StreamListener(self._name, self._channel, handshake, identity,
                                         self._on_stream, lambda ended: tell_quietly(ref, ended), self._stream_uris)
        self._listener.start()

    def _hand_over_stream_waiters(self) -> None:
        """Waiters follow the listener's opening; with none, they wait only for a
        handshake under way (it listens once it settles), else they are settled."""
        if not self._stream_waiters:
            return
        if self._listener is not None:
            opened = self._listener.opened
            for waiter in self._stream_waiters:
                opened.add_done_callback(lambda done, waiter=waiter: settle_from(waiter, done))
            self._stream_waiters.clear()
            return
        handshake_pending = self._handshake is not None and not self._handshake.done()
        if not (handshake_pending and self._state is not ConnectionState.CLOSED):
            self._settle_stream_waiters()

    def _settle_stream_waiters(self) -> None:
        waiters, self._stream_waiters = self._stream_waiters, []
        for waiter in waiters:
            _settle(waiter)

    def _stop_listening(self) -> None:
        if self._relisten is not None:
            self._relisten.cancel()
            self._relisten = None
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop()

    def _listener_ended(self, message: _ListenerEnded) -> None:
        if message.listener is not self._listener:
            return  # stopped on purpose, or replaced
        self._listener = None
        if message.outcome == "unsupported":
            logger.debug("backend %r offers no standalone stream", self._name)
            self._no_stream_on = message.listener.session_id
            return
        if message.outcome == "expired":
            self.renew_handshake(self._stream_identity, message.listener.session_id)
            return
        if message.lasted >= RELISTEN_AFTER_MOST:
            self._relisten_after = RELISTEN_AFTER
        ref = self.actor_ref
        self._relisten = call_later(self._relisten_after, lambda: tell_quietly(ref, _Relisten()))
        self._relisten_after = min(self._relisten_after * 2, RELISTEN_AFTER_MOST)

    def _after_handshake(self, discovery: cf.Future[DiscoveredBackend], handshake: cf.Future[Handshake],
                         renewed: bool) -> None:
        on_settled(handshake, self._report(lambda settled: _HandshakeSettled(discovery, settled, renewed)))

    def _lists_after_handshake(self, message: _HandshakeSettled) -> None:
        if message.discovery is not self._discovery:
            return
        error = message.handshake.exception()
        if error is not None:
            self._settle_discovery(error=error)
            return
        handshake = message.handshake.result()
        wanted = [(method, key) for capability, method, key in DISCOVERY_LISTS if capability in handshake.capabilities]
        # All lists at once: discovery takes one round trip after the handshake, not four.
        lists = {method: run_in_thread(self._list_all, self._discovery_identity, handshake, method, key)
                 for method, key in wanted}
        on_settled(when_all(lists), self._report(
            lambda _: _ListsSettled(message.discovery, handshake, lists, message.renewed)))

    def _discovery_settled(self, message: _ListsSettled) -> None:
        if message.discovery is not self._discovery:
            return
        errors = [future.exception() for future in message.lists.values() if future.exception() is not None]
        if any(isinstance(error, BackendSessionExpired) for error in errors) and not message.renewed:
            # The backend forgot the session between the handshake and the lists (or a
            # revived record named a session it no longer knows): renew once, list again.
            renewal = self.renew_handshake(self._discovery_identity, message.handshake.session_id)
            self._after_handshake(message.discovery, renewal, renewed=True)
            return
        if errors:
            self._settle_discovery(error=errors[0])
            return
        results = {method: future.result()[0] for method, future in message.lists.items()}
        if "tools/list" in results:
            results["tools/list"] = self._usable_tools(results["tools/list"])
        hints = [future.result()[1] for future in message.lists.values() if future.result()[1] is not None]
        self._settle_discovery(found=DiscoveredBackend(
            backend=self._name,
            capabilities=message.handshake.capabilities,
            tools=results.get("tools/list", ()),
            resources=results.get("resources/list", ()),
            resource_templates=results.get("resources/templates/list", ()),
            prompts=results.get("prompts/list", ()),
            ttl_ms=min(hints) if hints else None,
        ))

    def _usable_tools(self, tools: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
        """Tools whose ``x-mcp-header`` marks break the specification's rules are left out
        (as a client must), each with a warning; the others stay usable."""
        usable = []
        for tool in tools:
            if valid_header_params(tool.get("inputSchema")):
                usable.append(tool)
            else:
                logger.warning("backend %r: tool %r left out: its inputSchema has an invalid x-mcp-header mark",
                               self._name, str(tool.get("name"))[:128])
        return tuple(usable)

    def _settle_discovery(self, *, found: DiscoveredBackend | None = None, error: BaseException | None = None) -> None:
        discovery = self._discovery
        assert discovery is not None
        if error is not None:
            if self._state is not ConnectionState.CLOSED:
                self._fail(error)
            discovery.set_exception(error)
            return
        self._discovered = found
        if self._state is not ConnectionState.CLOSED:
            self._state = ConnectionState.READY
        discovery.set_result(found)

    def _fail(self, error: BaseException) -> None:
        self._state = ConnectionState.FAILED
        self._last_error = describe_failure(self._name, error)
        self._hand_over_stream_waiters()

    def _report(self, make_message: Callable[[cf.Future[Any]], Any]) -> Callable[[cf.Future[Any]], None]:
        """A done-callback that tells this actor ``make_message(future)`` (never blocks)."""
        ref = self.actor_ref
        return lambda future: tell_quietly(ref, make_message(future))

    # -- list calls, on pooled threads ---------------------------------------------------

    def _list_all(self, identity: Identity | None, handshake: Handshake, method: str,
                  key: str) -> tuple[tuple[dict[str, Any], ...], int | None]:
        """Every item of a list, and the shortest ttlMs its pages carried."""
        try:
            return self._follow_pages(identity, handshake, method, key)
        except BackendRpcError as exc:
            if method in TOLERATED_LISTS and exc.code == METHOD_NOT_FOUND:
                logger.warning(
                    "backend %r at %s advertised the capability but answered %s with -32601; treating the list as empty",
                    self._name,
                    self._url,
                    method,
                )
                return (), None
            raise

    def _follow_pages(self, identity: Identity | None, handshake: Handshake, method: str,
                      key: str) -> tuple[tuple[dict[str, Any], ...], int | None]:
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        seen: set[str] = set()
        ttl_ms: int | None = None
        for _ in range(MAX_PAGES):
            result = self._channel.call_with(identity, handshake, method, {"cursor": cursor} if cursor else None)
            hint = result.get("ttlMs")
            if isinstance(hint, int) and not isinstance(hint, bool):
                ttl_ms = max(0, hint) if ttl_ms is None else min(ttl_ms, max(0, hint))
            page = result.get(key, [])
            if not isinstance(page, list):
                raise BackendProtocolError(self._name, f"backend {self._name!r} answered {method} without a {key} list")
            items.extend(item for item in page if isinstance(item, dict))
            cursor = result.get("nextCursor")
            if not cursor:
                return tuple(items), ttl_ms
            if not isinstance(cursor, str) or cursor in seen:
                raise BackendProtocolError(self._name, f"backend {self._name!r} sent a bad or repeated {method} cursor")
            seen.add(cursor)
        raise BackendProtocolError(self._name, f"backend {self._name!r} paged {method} more than {MAX_PAGES} times")


@dataclass(frozen=True)
class _HandshakeFinished:
    future: cf.Future[Handshake]
    ready: cf.Future[Handshake]  # what callers wait on (see BackendConnection.handshake)


@dataclass(frozen=True)
class _ListenerEnded:
    listener: _StreamListener
    outcome: str  # ended, failed, expired (404), unsupported (405), stopped
    lasted: float


@dataclass(frozen=True)
class _Relisten:
    pass


class _StreamListener:
    """One open standalone stream of a backend session, read on a thread of its own (it
    may stay open for hours: not a pooled job). ``stop`` ends it at once."""

    def __init__(self, backend: str, channel: BackendChannel, handshake: Handshake, identity: Identity | None,
                 deliver: StreamObserver, ended: Callable[[_ListenerEnded], None],
                 resource_uris: frozenset[str] = frozenset()):
        self.backend = backend
        self._resource_uris = resource_uris
        self.session_id = handshake.session_id
        self._channel = channel
        self._handshake = handshake
        self._identity = identity
        self._deliver = deliver
        self._ended = ended
        self._abort = Abort()
        self.opened: cf.Future[None] = cf.Future()  # settled once the backend has the stream, or it ended

    def start(self) -> None:
        threading.Thread(target=self._run, name=f"vmcp-stream-{self.backend}", daemon=True).start()

    def stop(self) -> None:
        self._abort.abort()

    def _run(self) -> None:
        started = time.monotonic()
        outcome = "ended"
        try:
            for message in self._channel.listen(self._identity, self._handshake, self._abort, self._resource_uris):
                if message is STREAM_OPEN:
                    _settle(self.opened)
                else:
                    self._deliver(self.backend, message)
        except BackendSessionExpired:
            outcome = "expired"
        except BackendHTTPError as exc:
            outcome = "unsupported" if exc.status in (405, 406) else "failed"
        except BackendError as exc:
            logger.debug("backend %r stream failed: %s", self.backend, type(exc).__name__)
            outcome = "failed"
        except Exception:  # noqa: BLE001 - a listener never dies silently
            logger.exception("backend %r stream failed", self.backend)
            outcome = "failed"
        finally:
            _settle(self.opened)
            if self._abort.aborted:
                outcome = "stopped"
            self._ended(_ListenerEnded(self, outcome, time.monotonic() - started))


def _settle(future: cf.Future[None]) -> None:
    try:
        future.set_result(None)
    except cf.InvalidStateError:
        pass  # settled already


def _failed(future: cf.Future[Any]) -> bool:
    return future.done() and future.exception() is not None


def describe_failure(backend: str, error: BaseException, what: str = "failed") -> str:
    """An error message fit for admin output and clients: BackendErrors name no URL;
    others get a generic line."""
    if isinstance(error, BackendError):
        return str(error)
    return f"backend {backend!r} {what}: {error.__class__.__name__}"
