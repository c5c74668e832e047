"""SessionActor: one MCP session, one user, one BackendConnection per backend."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pykka

from vmcp_actors.backends import BackendCapabilities, BackendConnection, OutgoingAuth
from vmcp_actors.concurrency import ASK_TIMEOUT, resolved, run_in_thread, stop_quietly
from vmcp_actors.config import AggregationConfig, VmcpConfig
from vmcp_actors.exceptions import BackendError
from vmcp_actors.identity import Identity, subject_of
from vmcp_actors.sessions._aggregation import Catalog, build_catalog
from vmcp_actors.sessions._capabilities import AggregatedBackends
from vmcp_actors.sessions._composite import CompositeTools, WorkflowMetrics
from vmcp_actors.sessions._discovery_cache import DiscoveryCache, discovery_key
from vmcp_actors.sessions._dispatch import McpDispatcher
from vmcp_actors.sessions._filter import AdvertisingFilter

logger = logging.getLogger(__name__)

# A backend that failed discovery is tried again this long after, on the next request.
RETRY_FAILED_AFTER = 10.0


def discovery_timeout(config: VmcpConfig) -> float:
    """How long one discovery may take: the handshake and the paged lists of the slowest backend."""
    slowest = max(config.operational.timeouts.for_backend(b.name) for b in config.backends)
    return slowest * 3 + 1.0


@dataclass(frozen=True)
class SessionServices:
    """Process-wide, thread-safe services every session uses (built once at start)."""

    outgoing_auth: Mapping[str, OutgoingAuth] = field(default_factory=dict)
    discovery_cache: DiscoveryCache = field(default_factory=lambda: DiscoveryCache(0))
    workflow_metrics: WorkflowMetrics = field(default_factory=WorkflowMetrics)


class SessionActor(pykka.ThreadingActor):
    def __init__(self, session_id: str, identity: Identity | None, config: VmcpConfig,
                 services: SessionServices | None = None):
        super().__init__()
        self._session_id = session_id
        self._identity = identity
        self._config = config
        self._services = services if services is not None else SessionServices()
        self._catalog_from_cache = False
        self._created = time.time()
        self._catalog: cf.Future[Catalog] | None = None
        self._catalog_done_at: float | None = None  # when the served catalog was first seen complete
        self._refresh: cf.Future[Catalog] | None = None
        self._connections: dict[str, Any] = {}

    def on_start(self) -> None:
        self._self = self.actor_ref.proxy()
        timeouts = self._config.operational.timeouts
        for backend in sorted(self._config.backends, key=lambda b: b.name):
            self._connections[backend.name] = BackendConnection.start(
                backend, timeout=timeouts.for_backend(backend.name), auth=self._services.outgoing_auth.get(backend.name)
            ).proxy()
        channels = {name: conn.channel() for name, conn in self._connections.items()}
        self._aggregated = AggregatedBackends(
            self._self,
            {name: future.get(timeout=ASK_TIMEOUT) for name, future in channels.items()},
            discovery_timeout(self._config),
        )
        # Decorators, outermost first: advertising filter -> composite tools -> backends.
        self._composites = CompositeTools(self._aggregated, self._config.composite_tools, self._config.aggregation,
                                          self._services.workflow_metrics)
        advertised = AdvertisingFilter(self._composites, self._config.aggregation)
        self._dispatcher = McpDispatcher(advertised, page_size=self._config.operational.page_size)

    def on_stop(self) -> None:
        self._composites.close()  # cancel runs in flight: their steps need these connections
        for connection in self._connections.values():
            stop_quietly(connection.actor_ref)

    # -- asked by the gateway and by AggregatedBackends (web threads) ------------------

    def dispatcher(self) -> McpDispatcher:
        return self._dispatcher

    def catalog(self, identity: Identity | None) -> cf.Future[Catalog]:
        """The aggregated catalog, discovered on first need.

        A catalog without any working backend is not kept: the next request tries again.
        One with name conflicts is kept (the config cannot change under it): every request
        gets the conflict error, logged once. A catalog missing some backends is served as it is while the missing ones are
        retried in the background (at most every RETRY_FAILED_AFTER seconds), so a
        backend that comes back joins the session and a hanging one delays nobody.
        """
        current = self._catalog
        if current is None or (current.done() and not _has_backends(current)):
            cache = self._services.discovery_cache
            key = discovery_key(identity, self._config)
            cached = cache.get(key)
            if cached is not None:
                self._catalog = resolved(cached)
                self._catalog_from_cache = True
            else:
                self._catalog = self._discover(identity)
                self._catalog_from_cache = False
            self._catalog_done_at = None
        elif current.done() and current.result().failures and self._refresh is None:
            if self._catalog_done_at is None:
                self._catalog_done_at = time.monotonic()
            elif time.monotonic() - self._catalog_done_at >= RETRY_FAILED_AFTER:
                self._refresh = self._discover(identity)
                self._refresh.add_done_callback(self._report_refresh)
                self._catalog_from_cache = False
        self._aggregated.publish(self._catalog)
        return self._catalog

    def refresh_finished(self, refresh: cf.Future[Catalog]) -> None:
        if refresh is not self._refresh:
            return
        self._refresh = None
        self._catalog_done_at = time.monotonic()
        if _has_backends(refresh):
            self._catalog = refresh
            self._aggregated.publish(refresh)

    def _discover(self, identity: Identity | None) -> cf.Future[Catalog]:
        # Fan out to every backend at once (a backend already discovered answers from
        # its cache); the gathering waits off the actor thread.
        discoveries = {name: conn.discover(identity) for name, conn in self._connections.items()}
        pending = {name: future.get(timeout=ASK_TIMEOUT) for name, future in discoveries.items()}
        gathered = run_in_thread(
            _gather_catalog,
            pending,
            self._config.aggregation,
            {name: self._config.operational.timeouts.for_backend(name) * 3 for name in pending},
        )
        cache, key = self._services.discovery_cache, discovery_key(identity, self._config)
        # The cache itself refuses catalogs with failures or conflicts.
        gathered.add_done_callback(lambda done: _has_backends(done) and cache.put(key, done.result()))
        return gathered

    def _report_refresh(self, refresh: cf.Future[Catalog]) -> None:
        try:
            self._self.refresh_finished(refresh)  # fire and forget, from the gathering thread
        except pykka.ActorDeadError:
            pass

    def snapshot(self) -> dict[str, Any]:
        snapshots = {name: conn.snapshot() for name, conn in self._connections.items()}
        backends = []
        for name, future in snapshots.items():
            try:
                backends.append(future.get(timeout=ASK_TIMEOUT).to_dict())
            except (pykka.ActorDeadError, pykka.Timeout):
                backends.append({"backend": name, "state": "unresponsive"})
        catalog = self._catalog.result() if self._catalog is not None and _has_backends(self._catalog) else None
        return {
            "id": self._session_id,
            "subject": subject_of(self._identity),
            "created": self._created,
            "catalogFromCache": self._catalog_from_cache,
            "catalogErrors": list(catalog.errors) if catalog else [],
            "catalogProblems": list(catalog.problems) if catalog else [],
            "compositeProblems": list(self._composites.problems()),
            "workflowRuns": self._composites.running(),
            "backends": backends,
        }


def _has_backends(catalog: cf.Future[Catalog]) -> bool:
    """Worth keeping for the session: done, and at least one backend answered."""
    return catalog.done() and catalog.exception() is None and catalog.result().has_backends


def _gather_catalog(
    pending: Mapping[str, cf.Future[BackendCapabilities]],
    aggregation: AggregationConfig,
    deadlines: Mapping[str, float],
) -> Catalog:
    discovered: dict[str, BackendCapabilities] = {}
    failures: dict[str, str] = {}
    for name, future in pending.items():
        try:
            discovered[name] = future.result(timeout=deadlines[name])
        except cf.TimeoutError:
            failures[name] = f"backend {name!r} discovery did not finish within {deadlines[name]:g}s"
        except BackendError as exc:
            failures[name] = str(exc)
        except Exception as exc:  # noqa: BLE001 - one backend's bug must not sink the others
            failures[name] = f"backend {name!r} discovery failed: {exc.__class__.__name__}"
        if name in failures:
            logger.warning("skipping backend %r for this session: %s", name, failures[name])
    return build_catalog(discovered, failures, aggregation)
