"""SessionActor: one MCP session, one user, one BackendConnection per backend."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from collections.abc import Mapping
from typing import Any

import pykka

from vmcp_actors.backends import BackendCapabilities, BackendConnection
from vmcp_actors.concurrency import ASK_TIMEOUT, run_in_thread
from vmcp_actors.config import AggregationConfig, VmcpConfig
from vmcp_actors.exceptions import BackendError
from vmcp_actors.identity import Identity, subject_of
from vmcp_actors.sessions._aggregation import Catalog, build_catalog
from vmcp_actors.sessions._capabilities import AggregatedBackends
from vmcp_actors.sessions._dispatch import McpDispatcher

logger = logging.getLogger(__name__)


def discovery_timeout(config: VmcpConfig) -> float:
    """How long one discovery may take: the handshake and the paged lists of the slowest backend."""
    slowest = max(config.operational.timeouts.for_backend(b.name) for b in config.backends)
    return slowest * 3 + 1.0


class SessionActor(pykka.ThreadingActor):
    def __init__(self, session_id: str, identity: Identity | None, config: VmcpConfig):
        super().__init__()
        self._session_id = session_id
        self._identity = identity
        self._config = config
        self._created = time.time()
        self._catalog: cf.Future[Catalog] | None = None
        self._connections: dict[str, Any] = {}

    def on_start(self) -> None:
        timeouts = self._config.operational.timeouts
        for backend in sorted(self._config.backends, key=lambda b: b.name):
            self._connections[backend.name] = BackendConnection.start(
                backend, timeout=timeouts.for_backend(backend.name)
            ).proxy()
        self._dispatcher = McpDispatcher(
            AggregatedBackends(self.actor_ref.proxy(), dict(self._connections), discovery_timeout(self._config)),
            page_size=self._config.operational.page_size,
            request_timeout=discovery_timeout(self._config) + max(
                timeouts.for_backend(b.name) for b in self._config.backends
            ),
        )

    def on_stop(self) -> None:
        for connection in self._connections.values():
            try:
                connection.actor_ref.stop(block=False)
            except pykka.ActorDeadError:
                pass

    # -- asked by the gateway and by AggregatedBackends (web threads) ------------------

    def dispatcher(self) -> McpDispatcher:
        return self._dispatcher

    def catalog(self, identity: Identity | None) -> cf.Future[Catalog]:
        """The aggregated catalog, discovered on first need. A catalog without any
        working backend is not kept: the next request tries discovery again."""
        stale = self._catalog is not None and self._catalog.done() and (
            self._catalog.exception() is not None or not self._catalog.result().has_backends
        )
        if self._catalog is None or stale:
            # Fan out to every backend at once; the gathering waits off the actor thread.
            discoveries = {name: conn.discover(identity) for name, conn in self._connections.items()}
            pending = {name: future.get(timeout=ASK_TIMEOUT) for name, future in discoveries.items()}
            self._catalog = run_in_thread(
                _gather_catalog,
                pending,
                self._config.aggregation,
                {name: self._config.operational.timeouts.for_backend(name) * 3 for name in pending},
                name="vmcp-gather",
            )
        return self._catalog

    def snapshot(self) -> dict[str, Any]:
        snapshots = {name: conn.snapshot() for name, conn in self._connections.items()}
        backends = []
        for name, future in snapshots.items():
            try:
                backends.append(future.get(timeout=ASK_TIMEOUT).to_dict())
            except (pykka.ActorDeadError, pykka.Timeout):
                backends.append({"backend": name, "state": "unresponsive"})
        return {
            "id": self._session_id,
            "subject": subject_of(self._identity),
            "created": self._created,
            "backends": backends,
        }


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
