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
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pykka

from vmcp_actors.backends import (
    BackendCapabilities,
    BackendChannel,
    BackendConnection,
    Handshake,
    McpHttpClient,
    OutgoingAuth,
    describe_failure,
)
from vmcp_actors.concurrency import ASK_TIMEOUT, resolved, result_or_none, run_in_thread, stop_quietly, tell_quietly
from vmcp_actors.config import BackendConfig, VmcpConfig
from vmcp_actors.exceptions import BackendError
from vmcp_actors.identity import Identity
from vmcp_actors.sessions._aggregation import Catalog, build_catalog
from vmcp_actors.sessions._capabilities import AggregatedBackends, Capabilities, CatalogBoard
from vmcp_actors.sessions._composite import CompositeTools, WorkflowMetrics
from vmcp_actors.sessions._discovery_cache import DiscoveryCache, discovery_key
from vmcp_actors.sessions._dispatch import McpDispatcher
from vmcp_actors.sessions._filter import AdvertisingFilter
from vmcp_actors.sessions._records import UserKey, UserRecord
from vmcp_actors.sessions._store import MemoryRecordStore, RecordStore

logger = logging.getLogger(__name__)

# A backend that failed discovery is tried again this long after, on the next request.
RETRY_FAILED_AFTER = 10.0


@dataclass(frozen=True)
class SessionServices:
    """Process-wide, thread-safe services every user uses (built once at start)."""

    outgoing_auth: Mapping[str, OutgoingAuth] = field(default_factory=dict)
    discovery_cache: DiscoveryCache = field(default_factory=lambda: DiscoveryCache(0))
    workflow_metrics: WorkflowMetrics = field(default_factory=WorkflowMetrics)
    store: RecordStore = field(default_factory=MemoryRecordStore)


@dataclass(frozen=True)
class UserHandle:
    """What a web thread needs to serve a request of this user, built without waiting
    for any actor: the capability stack (thread-safe) and its dispatcher."""

    key: UserKey
    actor: pykka.ActorRef[Any]
    proxy: Any  # ActorProxy[UserActor], made once (a proxy costs an introspection)
    capabilities: Capabilities  # the outermost layer
    dispatcher: McpDispatcher
    composites: CompositeTools

    def close(self) -> None:
        """Cancel composite runs in flight (the user's actors are stopping)."""
        self.composites.close()


def start_user(record: UserRecord, identity: Identity | None, config: VmcpConfig,
               services: SessionServices) -> UserHandle:
    """Start a user's actors from its record (no backend is contacted, nothing waits)."""
    board = CatalogBoard()
    channels = {backend.name: _channel(backend, config, services)
                for backend in sorted(config.backends, key=lambda b: b.name)}
    ref = UserActor.start(record, identity, config, services, channels, board)
    proxy = ref.proxy()
    aggregated = AggregatedBackends(proxy, channels, board)
    # Decorators, outermost first: advertising filter -> composite tools -> backends.
    composites = CompositeTools(aggregated, config.composite_tools, config.aggregation, services.workflow_metrics)
    advertised = AdvertisingFilter(composites, config.aggregation)
    return UserHandle(record.key, ref, proxy, advertised, McpDispatcher(advertised, page_size=config.operational.page_size),
                      composites)


def end_released_user(record: UserRecord, config: VmcpConfig, services: SessionServices) -> None:
    """End the backend sessions of a user whose actors are not live (its last session
    ended while it was idle): one pooled DELETE per backend, no actor started. Without a
    caller's token only static credentials go along; the backend reaps the rest itself."""
    for name, handshake in record.backends.items():
        backend = config.backend(name)
        if backend is not None and handshake.session_id:
            run_in_thread(_channel(backend, config, services).close_remote, handshake, None)


def _channel(backend: BackendConfig, config: VmcpConfig, services: SessionServices) -> BackendChannel:
    return BackendChannel(backend.name, McpHttpClient(backend.name, backend.url),
                          config.operational.timeouts.for_backend(backend.name),
                          services.outgoing_auth.get(backend.name))


@dataclass(frozen=True)
class _BackendDiscovered:
    round_id: int
    backend: str
    outcome: cf.Future[BackendCapabilities]


@dataclass(frozen=True)
class _BackendSessionChanged:
    backend: str
    handshake: Handshake | None


@dataclass
class _Round:
    """One discovery in flight (actor-private): of every backend, or of the failed ones."""

    id: int
    pending: set[str]
    full: bool
    future: cf.Future[Catalog] = field(default_factory=cf.Future)


class UserActor(pykka.ThreadingActor):
    def __init__(self, record: UserRecord, identity: Identity | None, config: VmcpConfig,
                 services: SessionServices, channels: Mapping[str, BackendChannel], board: CatalogBoard):
        super().__init__()
        self._key = record.key
        self._identity = identity  # the latest caller: background work runs with their credentials
        self._config = config
        self._services = services
        self._board = board
        self._created = time.time()
        self._catalog: cf.Future[Catalog] | None = None
        self._catalog_done_at: float | None = None  # when the served catalog settled
        self._round: _Round | None = None
        self._round_ids = itertools.count(1)
        self._discovered: dict[str, BackendCapabilities] = {}
        self._failures: dict[str, str] = {}
        self._session_origins: dict[str, bool] = {}  # session id -> its catalog came from the cache
        self._ending = False
        self._connections: dict[str, Any] = {}
        ref = self.actor_ref

        def handshake_changed(backend: str, handshake: Handshake | None) -> None:
            tell_quietly(ref, _BackendSessionChanged(backend, handshake))  # children only tell

        # Started here, in the caller's thread, so the channels work once start() returns.
        try:
            for name, channel in channels.items():
                backend = config.backend(name)
                assert backend is not None
                self._connections[name] = BackendConnection.start(
                    backend, channel, restored=record.backends.get(name), on_handshake=handshake_changed
                ).proxy()
        except BaseException:
            for connection in self._connections.values():
                stop_quietly(connection.actor_ref)
            raise

    def on_stop(self) -> None:
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
            cached = self._services.discovery_cache.get(self._cache_key(identity))
            if cached is not None:
                self._serve(resolved(cached))
            elif self._round is None or not self._round.full:
                self._serve(self._discover(sorted(self._connections), full=True).future)
            else:
                self._serve(self._round.future)
        elif current.done() and current.result().failures and self._round is None:
            if self._catalog_done_at is None:
                self._catalog_done_at = time.monotonic()
            elif time.monotonic() - self._catalog_done_at >= RETRY_FAILED_AFTER:
                self._discover(sorted(current.result().failures), full=False)
        return self._catalog

    def catalog_so_far(self) -> Catalog | None:
        """For a request whose deadline ends before discovery does: what is known now."""
        if self._round is None:
            return result_or_none(self._catalog)
        failures = dict(self._failures)
        for name in self._round.pending:
            if name not in self._discovered:
                failures[name] = f"backend {name!r} is still being discovered"
        return build_catalog(self._discovered, failures, self._config.aggregation)

    def attach_session(self, session_id: str, identity: Identity | None) -> None:
        """A session's first request: it gets a catalog discovered at most
        discoveryCacheTTL ago (from the cache), else a discovery of its own."""
        cached = self._services.discovery_cache.get(self._cache_key(identity))
        if cached is not None:
            if result_or_none(self._catalog) is not cached:
                self._discovered, self._failures = dict(cached.backends), {}
                self._serve(resolved(cached))
        elif self._catalog is not None and self._catalog.done():
            self._catalog = None  # the next request discovers anew
            self._board.publish(None)
        self._session_origins[session_id] = cached is not None

    def session_ended(self, session_id: str) -> None:
        self._session_origins.pop(session_id, None)

    def end(self) -> None:
        """The user's last session ended: stop, and end every backend session (DELETE)."""
        self._ending = True
        self.stop()

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
            "started": self._created,
            "backends": backends,
            "catalogErrors": list(usable.errors) if usable else [],
            "catalogProblems": list(usable.problems) if usable else [],
            "discovering": self._round is not None,
            "sessionCatalogFromCache": dict(self._session_origins),
        }

    # -- told by connections and discovery callbacks -----------------------------------

    def on_receive(self, message: Any) -> None:
        if isinstance(message, _BackendDiscovered):
            self._backend_discovered(message)
        elif isinstance(message, _BackendSessionChanged):
            self._services.store.update_user(
                self._key, lambda record: record.with_backend(message.backend, message.handshake))

    # -- internals on the actor thread ---------------------------------------------------

    def _serve(self, catalog: cf.Future[Catalog]) -> None:
        self._catalog = catalog
        self._catalog_done_at = None
        self._board.publish(catalog)

    def _cache_key(self, identity: Identity | None) -> Any:
        return discovery_key(identity, self._config)

    def _discover(self, names: list[str], *, full: bool) -> _Round:
        """Ask each named connection to discover; each outcome comes back as a message."""
        round_ = _Round(next(self._round_ids), set(names), full)
        self._round = round_
        asked = {name: self._connections[name].discover(self._identity) for name in names}
        ref = self.actor_ref
        for name, future in asked.items():
            try:
                outcome = future.get(timeout=ASK_TIMEOUT)  # children answer at once
            except (pykka.ActorDeadError, pykka.Timeout):
                outcome = cf.Future()
                outcome.set_exception(BackendError(name, f"backend {name!r} connection is closed"))
            outcome.add_done_callback(
                lambda done, name=name: tell_quietly(ref, _BackendDiscovered(round_.id, name, done)))
        return round_

    def _backend_discovered(self, message: _BackendDiscovered) -> None:
        round_ = self._round
        if round_ is None or round_.id != message.round_id:
            return  # an older round's answer: a newer round speaks for this backend
        name, error = message.backend, message.outcome.exception()
        if error is None:
            self._discovered[name] = message.outcome.result()
            self._failures.pop(name, None)
        else:
            self._discovered.pop(name, None)
            self._failures[name] = describe_failure(name, error, "discovery failed")
            logger.warning("skipping backend %r for user %s: %s", name, self._key.label, self._failures[name])
        round_.pending.discard(name)
        if round_.pending:
            return
        self._round = None
        catalog = build_catalog(self._discovered, self._failures, self._config.aggregation)
        if catalog.has_backends:
            # The cache itself refuses catalogs with failures or conflicts.
            self._services.discovery_cache.put(self._cache_key(self._identity), catalog)
        if round_.full:
            round_.future.set_result(catalog)
            self._catalog_done_at = time.monotonic()
        elif catalog.has_backends:
            self._serve(resolved(catalog))  # a retried backend joins (or still fails)
            self._catalog_done_at = time.monotonic()


def _has_backends(catalog: cf.Future[Catalog]) -> bool:
    """Worth keeping: done, and at least one backend answered."""
    return catalog.done() and catalog.exception() is None and catalog.result().has_backends

