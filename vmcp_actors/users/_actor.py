"""UserActor: one per user, owning that user's BackendConnections and catalog.

A user is an identity (issuer + subject; one for every anonymous caller) as the
``UserKey`` tells it. Every session of the user is served by its one UserActor: they
share its backend sessions and its catalog, and two users never share anything. The
actor is the live cache of the ``UserRecord`` (the backend sessions): it keeps the record
up to date as handshakes finish, stops when the user is idle, and a new one revived from
the record goes on with the same backend sessions.

Discovery never waits in the actor: the connections discover on pooled threads, each
result comes back as a message, and the catalog is built when the last backend answered.
A request whose deadline ends first answers with the catalog so far (``catalog_so_far``)
while discovery goes on for the requests after it.

The actor also routes what backends send outside any call. Their standalone streams are
open while the user has a client stream open or a subscription (and closed when it has
neither); on them arrive resource updates (to every session subscribed to the URI, and
only those), list changes (the backend is listed again, the catalog rebuilt through the
same pipeline, and each session with a stream told once per kind of list that changed,
changes close together making one refresh) and requests for a client (to the session
whose stream opened last).

State the actor owns: the catalog and discovery rounds, the sessions with a stream open,
the subscribers per resource URI, and the order of its record writes. The store is
never called on its loop: the user record's writes run in order on the I/O pool
(``_RecordWrites``), session records are read there (log levels, client capabilities,
subscriptions of a revived user) and what the actor needs comes back by message. So is
the shared discovery cache (Redis): the loop reads only the local level, and a full round
reads the shared one first on the I/O pool (``_SharedCatalogRead``), asking the
connections only when it has none.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pykka

from vmcp_actors.backends import (
    DEGRADED,
    HEALTHY,
    BackendChannel,
    BackendConnection,
    BackendEras,
    BackendHealth,
    BackendRequest,
    DiscoveredBackend,
    Handshake,
    HandshakeBackoff,
    McpHttpClient,
    OutgoingAuth,
    StreamsReady,
    describe_failure,
)
from vmcp_actors.backends._stdio import ChildProcesses
from vmcp_actors.concurrency import (
    ASK_TIMEOUT,
    Deadline,
    LoopActor,
    TimerHandle,
    call_later,
    failed,
    resolved,
    result_or_none,
    run_in_thread,
    stop_quietly,
    tell_quietly,
)
from vmcp_actors.config import BackendConfig, VmcpConfig
from vmcp_actors.core._aggregated import AggregatedBackends, CatalogBoard
from vmcp_actors.core._catalog import RESOURCE_UPDATED, Catalog, build_catalog
from vmcp_actors.core._dispatch import McpDispatcher
from vmcp_actors.core._exchange import ServerRequest
from vmcp_actors.core._interface import UserCore
from vmcp_actors.core._tasks import TASK_STATUS_NOTIFICATIONS, TaskHandles
from vmcp_actors.decorators import DecoratorStack, stack
from vmcp_actors.decorators._composite import CompositeTools, WorkflowMetrics
from vmcp_actors.decorators._composite_tasks import CompositeTasks, UserTasks
from vmcp_actors.exceptions import BackendError, BackendUnavailable, ConnectionNeeded
from vmcp_actors.identity import Identity
from vmcp_actors.metrics import METRICS
from vmcp_actors.limits import Bulkheads
from vmcp_actors.protocol.mcp import is_logged_at
from vmcp_actors.shared_cache import SharedCache
from vmcp_actors.signing import Signer
from vmcp_actors.users._discovery_cache import DiscoveryCache, discovery_key
from vmcp_actors.users._live import LiveSessions
from vmcp_actors.users._records import UserKey, UserRecord
from vmcp_actors.users._store import MemoryRecordStore, RecordStore, StoreUnavailable
from vmcp_actors.users._stream_fanout import StreamFanout

logger = logging.getLogger(__name__)

# A backend that failed discovery is tried again this long after, on the next request.
RETRY_FAILED_AFTER = 10.0
RETRY_WHEN_HEALTHY = 1.0  # a missing backend whose health checks pass again
# List changes this close together make one refresh (and one notification per list).
LIST_CHANGES_SETTLE = 0.2
LIST_CHANGED = {
    "notifications/tools/list_changed": "tools",
    "notifications/prompts/list_changed": "prompts",
    "notifications/resources/list_changed": "resources",
}
# How long a backend's request outside a call waits for its client session's stream.
STREAM_WAIT = 10.0


@dataclass(frozen=True)
class SessionServices:
    """Process-wide, thread-safe services every user uses (built once at start)."""

    outgoing_auth: Mapping[str, OutgoingAuth] = field(default_factory=dict)
    discovery_cache: DiscoveryCache = field(default_factory=lambda: DiscoveryCache(0))
    workflow_metrics: WorkflowMetrics = field(default_factory=WorkflowMetrics)
    store: RecordStore = field(default_factory=MemoryRecordStore)
    live: LiveSessions = field(default_factory=LiveSessions)
    eras: BackendEras = field(default_factory=BackendEras)  # which era each backend speaks (probed once)
    # With shared records: what the user's backend streams bring, to the other processes.
    fanout: StreamFanout | None = None
    # Where this process's JSON-RPC ids on backend sessions start (random when records are
    # shared: other processes use the same backend sessions).
    request_id_base: int = 0
    # How each user's core is decorated (None: as the config alone asks).
    decorators: DecoratorStack | None = None
    # Backend health and circuits (operational.failureHandling); None: neither.
    health: BackendHealth | None = None
    # The stdio backends' children (None: the config has none).
    processes: ChildProcesses | None = None
    # Seals what clients hand back (task handles); the process's signing key.
    signer: Signer = field(default_factory=Signer.generated)
    # Composite tools run as tasks (None: never as tasks), and how a user is kept live
    # while one of its tasks runs: hold_user(key) returns what lets it go.
    composite_tasks: CompositeTasks | None = None
    hold_user: Callable[[UserKey], Callable[[], None]] = field(default=lambda key: lambda: None)
    # backends[].maxConcurrentCalls (None: no backend has one).
    bulkheads: Bulkheads | None = None
    # Failed handshakes, so new client sessions do not each wait out a stuck backend.
    backoff: HandshakeBackoff = field(default_factory=HandshakeBackoff)

    @classmethod
    def for_config(cls, config: VmcpConfig, shared: SharedCache | None = None, **kwargs: Any) -> SessionServices:
        """Services whose backend eras start from the config's pins (and, with ``shared``,
        from what other processes learned), with the config's health board."""
        pinned = {backend.name: backend.protocol for backend in config.backends if backend.protocol != "auto"}
        # A child, and a 2024-11-05 SSE server, are initialized: one link, one handshake.
        pinned.update({backend.name: "legacy" for backend in config.backends
                       if backend.protocol == "auto" and backend.transport != "streamable-http"})
        urls = {backend.name: backend.url for backend in config.backends}
        budgets = config.operational.discovery_budget
        kwargs.setdefault("backoff", HandshakeBackoff(budgets.for_backend))
        return cls(eras=BackendEras(pinned, shared, urls), health=BackendHealth(config), **kwargs)


@dataclass(frozen=True)
class UserHandle:
    """What a web thread needs to serve a request of this user, built without waiting
    for any actor: the capability stack (thread-safe) and its dispatcher."""

    key: UserKey
    actor: pykka.ActorRef[Any]
    proxy: Any  # ActorProxy[UserActor], made once (a proxy costs an introspection)
    core: UserCore  # the outermost layer of the user's decorated core
    dispatcher: McpDispatcher
    composites: CompositeTools | None  # None: no composite tools and no code mode (not in the stack)
    backends: AggregatedBackends  # the innermost layer: for what goes to every backend

    def close(self) -> None:
        """Close the whole stack, outermost first: every layer's own resources (the
        optimizer's index, an embedder's), then composite runs in flight are cancelled
        (the user's actors are stopping)."""
        self.core.close()


def start_user(record: UserRecord, identity: Identity | None, config: VmcpConfig,
               services: SessionServices, *, new: bool = False,
               write_after: cf.Future[Any] | None = None) -> UserHandle:
    """Start a user's actors from its record (no backend is contacted, nothing waits).
    ``new``: the record is not in the store yet (the actor writes it first, after
    ``write_after`` settles: the ending of the user's previous record)."""
    board = CatalogBoard()
    channels = {backend.name: _channel(backend, config, services, record.client_capabilities,
                                       record.key.prefers_legacy, record.key)
                for backend in sorted(config.backends, key=lambda b: b.name)}
    writes = _RecordWrites(record.key, write_after)
    if new:
        writes.then(lambda: services.store.put_user(record))
    ref = UserActor.start(record, identity, config, services, channels, board, writes)
    proxy = ref.proxy()
    handling = config.operational.failure_handling
    store = services.store

    def record_subscription(subscriber: str, uri: str, subscribed: bool) -> None:
        store.update_session(subscriber, lambda session: session.with_subscription(uri, subscribed))

    handles = task_handles_of(services, record.key)
    aggregated = AggregatedBackends(proxy, channels, board,
                                    fail_on_partial=handling is not None and handling.partial_failure_mode == "fail",
                                    record_subscription=record_subscription, task_handles=handles,
                                    page_size=config.operational.page_size, asked=store,
                                    discovery_budget=discovery_budget(config),
                                    client_capabilities=record.client_capabilities)
    decorators = services.decorators if services.decorators is not None else \
        stack(config, workflow_metrics=services.workflow_metrics)
    tasks = UserTasks(services.composite_tasks, handles, handles.owner, record.key.label,
                      lambda: services.hold_user(record.key)) if services.composite_tasks is not None else None
    outermost, composites = decorators.build(aggregated, record.client_capabilities, tasks, record.key.label)
    dispatcher = McpDispatcher(outermost, page_size=config.operational.page_size, unavailable=aggregated.unavailable,
                               discovered=aggregated.discovered, own_names=aggregated.own_names)
    return UserHandle(record.key, ref, proxy, outermost, dispatcher, composites, aggregated)


def discovery_budget(config: VmcpConfig) -> float:
    """How long a first discovery waits before answering with the backends that were ready:
    the longest budget any backend has."""
    budgets = config.operational.discovery_budget
    return max((budgets.for_backend(backend.name) for backend in config.backends), default=budgets.default)


def backend_client(backend: BackendConfig, breaker: Any, processes: ChildProcesses | None,
                   key: UserKey | None, client_capabilities: Mapping[str, Any] | None) -> Any:
    """How a channel reaches its backend: a view of its child (stdio), or HTTP."""
    if backend.is_process:
        assert processes is not None, "a config with stdio backends has a ChildProcesses"
        return processes.client(backend, key.owner if key is not None else None, key.headers if key else "",
                                client_capabilities, key.client if key is not None else "")
    if backend.transport == "sse":
        from vmcp_actors.backends._sse import LegacySseClient  # noqa: PLC0415 - only configs that use it
        return LegacySseClient(backend.name, backend.url or "", one_client=key is not None and bool(key.client),
                               breaker=breaker)
    return McpHttpClient(backend.name, backend.url or "", breaker=breaker)


def task_handles_of(services: SessionServices, key: UserKey) -> TaskHandles:
    """The handles of ``key``'s backend tasks, sealed to the caller: the person and the
    headers backends may tell callers apart by (not the capabilities a request declares,
    which a client may vary between its call and its tasks/get)."""
    caller = json.dumps([key.issuer, key.subject, key.headers])
    return TaskHandles(services.signer, services.signer.digest("task owner", caller))


def end_released_user(record: UserRecord, config: VmcpConfig, services: SessionServices) -> None:
    """End the backend sessions of a user whose actors are not live (its last session
    ended while it was idle): one pooled DELETE per backend, no actor started. Without a
    caller's token only static credentials go along; the backend reaps the rest itself."""
    for name, handshake in record.backends.items():
        backend = config.backend(name)
        if backend is not None and handshake.session_id and not backend.is_process:
            run_in_thread(_channel(backend, config, services).close_remote, handshake, None)


def _channel(backend: BackendConfig, config: VmcpConfig, services: SessionServices,
             client_capabilities: Mapping[str, Any] | None = None, prefers_legacy: bool = False,
             key: UserKey | None = None) -> BackendChannel:
    breaker = services.health.breaker(backend.name) if services.health is not None else None
    return BackendChannel(backend.name, backend_client(backend, breaker, services.processes, key, client_capabilities),
                          config.operational.timeouts.for_backend(backend.name),
                          services.outgoing_auth.get(backend.name), client_capabilities, services.eras,
                          services.request_id_base, prefers_legacy, services.bulkheads,
                          services.backoff, _backoff_owner(backend, key))


def _backoff_owner(backend: BackendConfig, key: UserKey | None) -> str:
    """Whose failed handshakes a channel shares: everyone's for a shared process, else
    the person's (their credentials, their process)."""
    if key is None or (backend.is_process and not backend.per_user):
        return ""
    return json.dumps(key.person.to_json())


class _RecordWrites:
    """One user's record writes, run in the order asked on the I/O pool (never on an
    actor's loop). Only one thread asks at a time: the Gateway's while it starts the
    user, then the user actor's."""

    def __init__(self, key: UserKey, after: cf.Future[Any] | None = None):
        self._key = key
        self._last: cf.Future[Any] = after if after is not None else resolved(None)

    def then(self, write: Callable[[], None]) -> None:
        previous, done = self._last, cf.Future()
        self._last = done

        def run() -> None:
            try:
                write()
            except StoreUnavailable as error:  # a record not written now is written with the next change
                logger.warning("user %s: %s", self._key.label, error)
            except Exception as error:  # the next write goes on
                logger.error("user %s: record write failed: %s", self._key.label, error, exc_info=error)
            finally:
                done.set_result(None)

        previous.add_done_callback(lambda _: run_in_thread(run))


@dataclass(frozen=True)
class _SessionsRead:
    """Session records read on the I/O pool, and what to do with them on the loop."""

    sessions: tuple[Any, ...]  # SessionRecord
    then: Callable[[tuple[Any, ...]], None]


@dataclass(frozen=True)
class _SharedCatalogRead:
    """What the shared discovery cache holds for a round's caller (None: nothing), read on
    the I/O pool."""

    round_id: int
    catalog: Catalog | None


@dataclass(frozen=True)
class _BackendDiscovered:
    round_id: int
    backend: str
    outcome: cf.Future[DiscoveredBackend]


@dataclass(frozen=True)
class _BackendSessionChanged:
    backend: str
    handshake: Handshake | None


@dataclass(frozen=True)
class _FromBackendStream:
    backend: str
    message: Any  # a notification dict or a BackendRequest


@dataclass(frozen=True)
class _RefreshLists:
    pass


@dataclass(frozen=True)
class _AsksExpired:
    request: Any  # a BackendRequest that waited STREAM_WAIT for its client's stream


@dataclass
class _Round:
    """One discovery in flight (actor-private): of every backend, or of the failed ones."""

    id: int
    pending: set[str]
    full: bool
    future: cf.Future[Catalog] = field(default_factory=cf.Future)
    first: cf.Future[None] = field(default_factory=cf.Future)  # set when a backend is first found
    started: float = field(default_factory=time.monotonic)


class UserActor(LoopActor):
    def __init__(self, record: UserRecord, identity: Identity | None, config: VmcpConfig,
                 services: SessionServices, channels: Mapping[str, BackendChannel], board: CatalogBoard,
                 writes: _RecordWrites | None = None):
        super().__init__()
        self._writes = writes if writes is not None else _RecordWrites(record.key)
        self._key = record.key
        self._identity = identity  # the latest caller: background work runs with their credentials
        self._config = config
        self._services = services
        self._board = board
        self._created = time.time()
        self._started = time.monotonic()
        self._catalog: cf.Future[Catalog] | None = None
        self._catalog_done_at: float | None = None  # when the served catalog settled
        self._round: _Round | None = None
        self._round_ids = itertools.count(1)
        self._answered_early: Catalog | None = None  # served before the round ended: changes get told
        self._discovered: dict[str, DiscoveredBackend] = {}
        self._failures: dict[str, str] = {}
        self._unconnected: set[str] = set()  # backends the person has not connected (type oauth)
        self._session_origins: dict[str, bool] = {}  # session id -> its catalog came from the cache
        # Sessions attached on a local cache miss: from the cache too if the next full round's
        # shared read has their catalog.
        self._origins_pending: set[str] = set()
        self._ending = False
        self._connections: dict[str, Any] = {}
        self._channels = dict(channels)
        self._live = services.live
        self._task_handles = task_handles_of(services, record.key)
        # Who hears what arrives outside a call: sessions with a stream open (latest
        # last) and, per resource URI, the sessions subscribed to it (also from their
        # records, read once the actor runs, so a revived user goes on delivering).
        self._streams: dict[str, None] = {}
        self._subscribers: dict[str, set[str]] = {}
        self._stream_wanted = False
        self._stream_uris: dict[str, set[str]] = {}
        self._changed: set[str] = set()  # backends whose lists changed, refreshed together
        self._asks_waiting: list[tuple[str, BackendRequest]] = []  # for the client's stream to open
        self._streamed = False  # a client stream opened once
        self._refresh_timer: TimerHandle | None = None
        ref = self.actor_ref

        def handshake_changed(backend: str, handshake: Handshake | None) -> None:
            tell_quietly(ref, _BackendSessionChanged(backend, handshake))  # children only tell

        def from_stream(backend: str, message: Any) -> None:
            tell_quietly(ref, _FromBackendStream(backend, message))

        # Started here, in the caller's thread, so the channels work once start() returns.
        try:
            for name, channel in channels.items():
                backend = config.backend(name)
                assert backend is not None
                self._connections[name] = BackendConnection.start(
                    backend, channel, restored=record.backends.get(name), on_handshake=handshake_changed,
                    on_stream=from_stream,
                ).proxy()
        except BaseException:
            for connection in self._connections.values():
                stop_quietly(connection.actor_ref)
            raise

    def on_start(self) -> None:
        self._update_streams()
        self._read_sessions(self._subscriptions_read)

    def _read_sessions(self, then: Callable[[tuple[Any, ...]], None]) -> None:
        """Read the user's session records on the I/O pool; ``then(records)`` on the loop."""
        store, key, ref = self._services.store, self._key, self.actor_ref

        def read() -> None:
            try:
                sessions = tuple(store.sessions_of(key))
            except StoreUnavailable as error:
                logger.warning("user %s: subscriptions not read from the records: %s", key.label, error)
                return
            tell_quietly(ref, _SessionsRead(sessions, then))

        run_in_thread(read)

    def _subscriptions_read(self, sessions: tuple[Any, ...]) -> None:
        """Subscriptions the records hold (a revived user's, another process's)."""
        for session in sessions:
            for uri in session.subscriptions:
                self._subscribers.setdefault(uri, set()).add(session.session_id)
        self._update_streams()

    def on_stop(self) -> None:
        if self._refresh_timer is not None:
            self._refresh_timer.cancel()
        for connection in self._connections.values():
            try:
                connection.close(self._ending)
            except pykka.ActorDeadError:
                pass

    # -- asked by the gateway and by AggregatedBackends (web threads) ------------------

    def catalog(self, identity: Identity | None) -> cf.Future[Catalog]:
        """The aggregated catalog, discovered on first need.

        A catalog without any working backend is not kept: the next request tries again.
        One with name conflicts is kept (the config cannot change under it): every request
        gets the conflict error, logged once. A catalog missing some backends is served as
        it is while the missing ones are retried in the background (at most every
        RETRY_FAILED_AFTER seconds), so a backend that comes back joins and a hanging
        one delays nobody.
        """
        self._identity = identity
        current = self._catalog
        if current is None or (current.done() and not _has_backends(current)):
            cached = self._services.discovery_cache.local(self._cache_key(identity))
            if cached is not None:
                self._discovered, self._failures, self._unconnected = dict(cached.backends), {}, set()
                self._serve(resolved(cached))
            elif self._round is None or not self._round.full:
                self._serve(self._discover(sorted(self._connections), full=True, shared_first=True).future)
            else:
                self._serve(self._round.future)
        else:
            self.retry_failed(identity)
        return self._catalog

    def retry_failed(self, identity: Identity | None) -> None:
        """The backends the served catalog misses are retried in the background once their
        time has come. Web threads that read that catalog from the board remind the actor
        of them (at most every REMIND_RETRY_EVERY, never waiting for the answer)."""
        self._identity = identity
        current = result_or_none(self._catalog)
        if current is None or not current.has_backends or not current.missing or self._round is not None:
            return
        if self._catalog_done_at is None:
            self._catalog_done_at = time.monotonic()
        elif time.monotonic() - self._catalog_done_at >= self._retry_after(current.failures):
            self._discover(list(current.missing), full=False)

    def _retry_after(self, failures: Mapping[str, str]) -> float:
        """How long a catalog missing ``failures`` is served before they are retried:
        sooner once the health checks see one of them answer again."""
        health = self._services.health
        if health is not None and any(health.state(name) in (HEALTHY, DEGRADED) for name in failures):
            return RETRY_WHEN_HEALTHY
        return RETRY_FAILED_AFTER

    def catalog_so_far(self) -> Catalog | None:
        """For a request whose deadline ends before discovery does: what is known now."""
        if self._round is None:
            return result_or_none(self._catalog)
        failures = dict(self._failures)
        for name in self._round.pending:
            if name not in self._discovered:
                failures[name] = f"backend {name!r} is still being discovered"
        catalog = build_catalog(self._discovered, failures, self._config.aggregation, frozenset(self._unconnected))
        if self._round.full and catalog.has_backends:
            self._answered_early = catalog
        return catalog

    def first_backend(self) -> cf.Future[None]:
        """Settles once the discovery under way has found a backend (at once when none is
        under way, or one was found already)."""
        if self._round is None or self._discovered:
            return resolved(None)
        return self._round.first

    def attach_session(self, session_id: str, identity: Identity | None) -> None:
        """A session's first request: it gets a catalog discovered at most
        discoveryCacheTTL ago (from the cache), else a discovery of its own (whose round
        reads the shared level of the cache first)."""
        cache = self._services.discovery_cache
        cached = cache.local(self._cache_key(identity))
        if cached is not None:
            if result_or_none(self._catalog) is not cached:
                self._discovered, self._failures, self._unconnected = dict(cached.backends), {}, set()
                self._serve(resolved(cached))
        else:
            if self._catalog is not None and self._catalog.done():
                self._catalog = None  # the next request discovers anew
                self._board.publish(None)
            if cache.shares:
                self._origins_pending.add(session_id)
        self._session_origins[session_id] = cached is not None

    def session_ended(self, session_id: str) -> None:
        self._streamed = True  # its client has gone: what waited for its stream is refused now
        self._ask_waiting(lambda request: True, ())
        self._session_origins.pop(session_id, None)
        self._streams.pop(session_id, None)
        for uri in [uri for uri, sessions in self._subscribers.items() if session_id in sessions]:
            self._unsubscribe(session_id, uri)
        self._update_streams()

    # -- outside any call: streams, subscriptions, list changes ------------------------

    def stream_opened(self, session_id: str, identity: Identity | None) -> StreamsReady:
        self._identity = identity
        self._streams.pop(session_id, None)
        self._streams[session_id] = None  # the latest stream last
        self._streamed = True
        self._update_streams()
        self._ask_waiting(lambda request: True, tuple(reversed(self._streams)))
        return self._streams_ready()

    def stream_closed(self, session_id: str) -> None:
        self._streams.pop(session_id, None)
        self._update_streams()

    def subscribed(self, session_id: str, uri: str) -> StreamsReady:
        """(The caller wrote it to the session's record.)"""
        self._subscribers.setdefault(uri, set()).add(session_id)
        self._update_streams()
        return self._streams_ready()

    def unsubscribed(self, session_id: str, uri: str) -> bool:
        """True when no session of the user is subscribed to ``uri`` any more."""
        last = self._unsubscribe(session_id, uri)
        self._update_streams()
        return last

    def backend_changed(self, backend: str) -> None:
        """A backend said a list of its changed: refresh it soon, with any others that do too."""
        if backend not in self._connections:
            return
        self._changed.add(backend)
        if self._refresh_timer is None:
            ref = self.actor_ref
            self._refresh_timer = call_later(LIST_CHANGES_SETTLE, lambda: tell_quietly(ref, _RefreshLists()))

    def resource_updated(self, message: dict[str, Any], except_session: str | None = None) -> None:
        """To the stream of every session subscribed to the URI (but ``except_session``,
        which got it on its call's stream)."""
        params = message.get("params")
        uri = params.get("uri") if isinstance(params, dict) else None
        for session_id in self._subscribers.get(uri, ()) if isinstance(uri, str) else ():
            if session_id != except_session and not self._live.push(session_id, message):
                logger.debug("resource update for session %s dropped: it has no stream open", session_id[:8])

    def end(self) -> None:
        """The user's last session ended: stop, and end every backend session (DELETE)."""
        self._ending = True
        self.stop()

    def caller(self) -> Identity | None:
        """The latest caller's identity (the admin explain view asks as them)."""
        return self._identity

    def snapshot(self) -> dict[str, Any]:
        asked = {name: conn.snapshot() for name, conn in self._connections.items()}
        backends = []
        for name, future in asked.items():
            try:
                backends.append(future.get(timeout=ASK_TIMEOUT).to_dict())
            except (pykka.ActorDeadError, pykka.Timeout):
                backends.append({"backend": name, "state": "unresponsive"})
        catalog = result_or_none(self._catalog)
        usable = catalog if catalog is not None and catalog.has_backends else None
        return {
            "user": self._key.label,
            # its clients are 2025 sessions that take requests: backends are spoken 2025 first
            "prefersLegacy": self._key.prefers_legacy,
            "started": self._created,
            "backends": backends,
            "catalogErrors": list(usable.errors) if usable else [],
            "catalogProblems": list(usable.problems) if usable else [],
            "catalogClashes": [clash.to_json() for clash in usable.clashes] if usable else [],
            "discovering": self._round is not None,
            "standaloneStreams": len(self._streams),
            "subscriptions": {uri: len(sessions) for uri, sessions in sorted(self._subscribers.items())},
            "backendStreamsOpen": self._stream_wanted,
            "sessionCatalogFromCache": dict(self._session_origins),
        }

    # -- told by connections and discovery callbacks -----------------------------------

    def on_receive(self, message: Any) -> None:
        if isinstance(message, _BackendDiscovered):
            self._backend_discovered(message)
        elif isinstance(message, _SharedCatalogRead):
            self._shared_catalog_read(message)
        elif isinstance(message, _FromBackendStream):
            if self._services.fanout is not None and isinstance(message.message, dict):
                run_in_thread(self._services.fanout.publish, self._key, message.backend, message.message)  # Redis: off the loop
            self._from_backend_stream(message.backend, message.message)
        elif isinstance(message, _RefreshLists):
            self._refresh_lists()
        elif isinstance(message, _BackendSessionChanged):
            store, key = self._services.store, self._key
            self._writes.then(lambda: store.update_user(
                key, lambda record: record.with_backend(message.backend, message.handshake)))
        elif isinstance(message, _SessionsRead):
            message.then(message.sessions)
        elif isinstance(message, _AsksExpired):  # refused: no client stream to ask on
            self._ask_waiting(lambda request: request is message.request, ())

    # -- internals on the actor thread ---------------------------------------------------

    def _update_streams(self) -> None:
        """Backend streams open exactly while a client stream or a subscription needs them."""
        wanted = bool(self._streams or self._subscribers)
        catalog = result_or_none(self._catalog)
        uris: dict[str, set[str]] = {}  # per backend: the subscribed resources it owns (2026-07-28 listens name them)
        for uri in self._subscribers:
            owner = catalog.route_resource(uri) if catalog is not None else None
            if owner is not None:
                uris.setdefault(owner, set()).add(uri)
        if wanted != self._stream_wanted or uris != self._stream_uris:
            self._stream_wanted, self._stream_uris = wanted, uris
            for name, connection in self._connections.items():
                connection.want_stream(wanted, self._identity, frozenset(uris.get(name, ())))

    def _streams_ready(self) -> StreamsReady:
        """When the backend streams wanted now are open (asked after want_stream: each
        connection's inbox takes the two in that order)."""
        if not self._stream_wanted:
            return StreamsReady(())
        return StreamsReady(tuple(connection.stream_ready() for connection in self._connections.values()))

    def _unsubscribe(self, session_id: str, uri: str) -> bool:
        sessions = self._subscribers.get(uri)
        if sessions is None:
            return True
        sessions.discard(session_id)
        if sessions:
            return False
        del self._subscribers[uri]
        return True

    def from_other_process(self, backend: str, message: dict[str, Any]) -> None:
        """A notification another process's backend stream brought (see StreamFanout):
        delivered to this process's client streams, never published again."""
        if message.get("method") == RESOURCE_UPDATED:
            # Subscriptions made in other processes since this user started: from the
            # records (read on the I/O pool), then delivered.
            def deliver(sessions: tuple[Any, ...]) -> None:
                self._subscriptions_read(sessions)
                self._from_backend_stream(backend, message)

            self._read_sessions(deliver)
            return
        self._from_backend_stream(backend, message)

    def _uri_shown(self, backend: str, update: dict[str, Any]) -> dict[str, Any]:
        """A backend's resource update with its URI as the clients see it (a shared ui://
        URI is shown rewritten)."""
        catalog = result_or_none(self._catalog)
        return update if catalog is None else catalog.shown_update(backend, update)

    def _from_backend_stream(self, backend: str, message: Any) -> None:
        if isinstance(message, BackendRequest):
            self._request_for_client(backend, message)
            return
        method = message.get("method")
        if method in LIST_CHANGED:
            self.backend_changed(backend)
        elif method == RESOURCE_UPDATED:
            self.resource_updated(self._uri_shown(backend, message))
        elif method == "notifications/progress":
            logger.debug("backend %r sent progress outside a call; not relayed", backend)
        elif not self._key.client:
            # Several clients share this backend session (2026-07-28 requests): whose it is
            # cannot be told, and one client's message never reaches another.
            logger.info("backend %r sent %s outside a call, on a backend session several clients share: dropped",
                        backend, method)
        elif method == "notifications/message":
            # The session's level is in its record: read on the I/O pool, pushed from there.
            run_in_thread(self._push_logged, tuple(self._streams), message)
        else:  # task status, elicitation completions and the like: to the client session's stream
            if method in TASK_STATUS_NOTIFICATIONS:
                message = self._task_handles.notification(backend, message, modern=False)
            for session_id in self._streams:
                self._live.push(session_id, message)

    def _push_logged(self, session_ids: tuple[str, ...], message: dict[str, Any]) -> None:
        """On the I/O pool: a log message to each of ``session_ids`` whose level takes it."""
        for session_id in session_ids:
            try:
                session = self._services.store.session(session_id)
            except StoreUnavailable as error:
                logger.warning("log message not relayed: %s", error)
                return
            if session is not None and is_logged_at(message, session.log_level):
                self._live.push(session_id, message)

    def _request_for_client(self, backend: str, request: BackendRequest) -> None:
        """A backend asks a client outside any call. The user's one call in flight on that
        backend session takes it, as if it came on the call's stream (a 2025 client sees
        it there, a 2026-07-28 one gets input_required); failing that, the session whose
        stream opened last (chosen on the I/O pool, where the session records are read);
        failing both, the backend is refused at once."""
        channel = self._channels.get(backend)
        if channel is not None and channel.interject(request):
            return
        waited = time.monotonic() - self._started
        if self._key.client and not self._streams and not self._streamed and waited < STREAM_WAIT:
            # Its client has not opened its stream yet (a backend asks for roots right
            # after initialize): the request waits for it, until STREAM_WAIT after the
            # session's start. A client that closed its stream, or opened none by then,
            # is not coming: refused at once.
            self._asks_waiting.append((backend, request))
            ref = self.actor_ref
            call_later(STREAM_WAIT - waited, lambda: tell_quietly(ref, _AsksExpired(request)))
            return
        # Only a user that serves one client session knows whose stream to ask on.
        streams = tuple(reversed(self._streams)) if self._key.client else ()
        run_in_thread(self._ask_a_client, backend, request, streams)

    def _ask_waiting(self, chosen: Callable[[BackendRequest], bool], session_ids: tuple[str, ...]) -> None:
        """The ``chosen`` requests that waited for the client's stream, asked on
        ``session_ids``' streams now (none: refused)."""
        asked = [(backend, request) for backend, request in self._asks_waiting if chosen(request)]
        self._asks_waiting = [entry for entry in self._asks_waiting if not chosen(entry[1])]
        for backend, request in asked:
            run_in_thread(self._ask_a_client, backend, request, session_ids)

    def _ask_a_client(self, backend: str, request: BackendRequest, session_ids: tuple[str, ...]) -> None:
        timeout = self._config.operational.timeouts.for_backend(backend)
        for session_id in session_ids:
            try:
                session = self._services.store.session(session_id)
            except StoreUnavailable:
                break
            if session is None:
                continue
            asked = ServerRequest(request.method, request.params, request.reply, backend)
            if self._live.ask_on_stream(session_id, asked, session.client_capabilities, Deadline.after(timeout)):
                return
        logger.warning("backend %r asked user %s for %s outside a call, with no call of that user in flight on it "
                       "(or more than one) and no client stream open: refused", backend, self._key.label,
                       request.method)
        request.reply({"error": {"code": -32603, "message": f"{request.method}: no call of this user is in flight "
                                                             "on this backend session (or more than one is) and no "
                                                             "client has a stream open to take it"}})

    def _refresh_lists(self) -> None:
        self._refresh_timer = None
        if self._round is not None:  # one round at a time: refresh after it
            ref = self.actor_ref
            self._refresh_timer = call_later(LIST_CHANGES_SETTLE, lambda: tell_quietly(ref, _RefreshLists()))
            return
        names, self._changed = sorted(self._changed), set()
        if names and result_or_none(self._catalog) is not None:
            self._discover(names, full=False)

    def _tell_list_changes(self, before: Catalog | None, after: Catalog) -> None:
        """Each session with a stream hears once per kind of list that changed."""
        if before is None or not self._streams:
            return
        changed = [kind for kind, (old, new) in {
            "tools": ((before.tools, dict(before.internal_tools)), (after.tools, dict(after.internal_tools))),
            "resources": ((before.resources, before.resource_templates), (after.resources, after.resource_templates)),
            "prompts": (before.prompts, after.prompts),
        }.items() if old != new]
        for session_id in self._streams:
            for kind in changed:
                self._live.push(session_id, {"jsonrpc": "2.0", "method": f"notifications/{kind}/list_changed"})

    def _serve(self, catalog: cf.Future[Catalog]) -> None:
        self._catalog = catalog
        self._catalog_done_at = None
        self._board.publish(catalog)

    def _cache_key(self, identity: Identity | None) -> Any:
        return discovery_key(identity, self._config, self._key.features)

    def _discover(self, names: list[str], *, full: bool, shared_first: bool = False) -> _Round:
        """Ask each named connection to discover; each outcome comes back as a message.
        ``shared_first``: the shared discovery cache is read first, on the I/O pool, and
        the connections are asked only when it has nothing."""
        round_ = _Round(next(self._round_ids), set(names), full)
        self._round = round_
        cache = self._services.discovery_cache
        if shared_first and cache.shares:
            key, ref, label = self._cache_key(self._identity), self.actor_ref, self._key.label

            def read() -> None:
                try:
                    found = cache.shared(key)
                except Exception as error:  # noqa: BLE001 - a help, never a dependency: discover instead
                    logger.warning("user %s: shared discovery cache not read: %s", label, error)
                    found = None
                tell_quietly(ref, _SharedCatalogRead(round_.id, found))

            run_in_thread(read)
        else:
            self._ask_to_discover(round_, names)
        return round_

    def _shared_catalog_read(self, message: _SharedCatalogRead) -> None:
        """A round's shared read: its catalog (nothing discovered), else discovery."""
        round_ = self._round
        if round_ is None or round_.id != message.round_id:
            return  # a newer round speaks for the backends
        if message.catalog is None:
            self._ask_to_discover(round_, sorted(round_.pending))
            return
        self._round = None
        self._discovered, self._failures, self._unconnected = dict(message.catalog.backends), {}, set()
        for session_id in self._origins_pending & self._session_origins.keys():
            self._session_origins[session_id] = True
        self._origins_pending.clear()
        if not round_.first.done():
            round_.first.set_result(None)
        round_.future.set_result(message.catalog)  # the round's future: already served
        self._catalog_done_at = time.monotonic()

    def _ask_to_discover(self, round_: _Round, names: list[str]) -> None:
        """The round's connections discover (pooled work): each outcome comes back as a message."""
        health = self._services.health
        skipped = {name: reason for name in names
                   if health is not None and (reason := health.skip_reason(name)) is not None}
        asked = {name: self._connections[name].discover(self._identity) for name in names if name not in skipped}
        ref = self.actor_ref
        for name in names:
            if name in skipped:  # known to be down: no waiting for its timeout
                outcome = failed(BackendUnavailable(name, skipped[name]))
            else:
                try:
                    outcome = asked[name].get(timeout=ASK_TIMEOUT)  # children answer at once
                except (pykka.ActorDeadError, pykka.Timeout):
                    outcome = failed(BackendError(name, f"backend {name!r} connection is closed"))
            outcome.add_done_callback(
                lambda done, name=name: tell_quietly(ref, _BackendDiscovered(round_.id, name, done)))

    def _backend_discovered(self, message: _BackendDiscovered) -> None:
        round_ = self._round
        if round_ is None or round_.id != message.round_id:
            return  # an older round's answer: a newer round speaks for this backend
        name, error = message.backend, message.outcome.exception()
        METRICS.observe("discovery", (name, "ok" if error is None else "failed"), time.monotonic() - round_.started)
        if error is None:
            self._discovered[name] = message.outcome.result()
            self._failures.pop(name, None)
            self._unconnected.discard(name)
            if not round_.first.done():
                round_.first.set_result(None)
        elif isinstance(error, ConnectionNeeded):  # its connect tool stands in until the person connects
            self._discovered.pop(name, None)
            self._failures.pop(name, None)
            self._unconnected.add(name)
        else:
            self._discovered.pop(name, None)
            self._unconnected.discard(name)
            self._failures[name] = describe_failure(name, error, "discovery failed")
            logger.warning("skipping backend %r for user %s: %s", name, self._key.label, self._failures[name])
        round_.pending.discard(name)
        if round_.pending:
            return
        self._round = None
        if not round_.first.done():
            round_.first.set_result(None)
        catalog = build_catalog(self._discovered, self._failures, self._config.aggregation,
                                frozenset(self._unconnected))
        if catalog.has_backends:
            # The cache itself refuses catalogs with failures or conflicts.
            self._services.discovery_cache.put(self._cache_key(self._identity), catalog)
        if round_.full:
            self._origins_pending.clear()
            round_.future.set_result(catalog)
            self._catalog_done_at = time.monotonic()
            if self._answered_early is not None:  # late backends join: clients list again
                self._tell_list_changes(self._answered_early, catalog)
                self._answered_early = None
        elif catalog.has_backends:
            before = result_or_none(self._catalog)
            self._serve(resolved(catalog))  # a retried or changed backend joins (or still fails)
            self._catalog_done_at = time.monotonic()
            self._tell_list_changes(before, catalog)


def _has_backends(catalog: cf.Future[Catalog]) -> bool:
    """Worth keeping: done, and at least one backend answered."""
    return catalog.done() and catalog.exception() is None and catalog.result().has_backends

