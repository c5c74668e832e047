"""Gateway: the root actor. Creates, ends and reaps sessions; owns the session directory."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

import pykka

from vmcp_actors.concurrency import TimerHandle, call_later, stop_quietly
from vmcp_actors.config import VmcpConfig
from vmcp_actors.gateway._directory import SessionDirectory, SessionHandle, SessionRecord
from vmcp_actors.identity import Identity, identity_key
from vmcp_actors.sessions import SessionActor, SessionServices

logger = logging.getLogger(__name__)


class Gateway(pykka.ThreadingActor):
    def __init__(self, config: VmcpConfig, directory: SessionDirectory | None = None,
                 services: SessionServices | None = None, *, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self._config = config
        self._services = services if services is not None else SessionServices()
        self._directory = directory if directory is not None else SessionDirectory(clock)
        self._started = time.time()
        self._reaper: TimerHandle | None = None

    def on_start(self) -> None:
        self._schedule_reaping()

    def on_stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for record in self._directory.remove_all():
            stop_quietly(record.actor)

    # -- sessions ------------------------------------------------------------------------

    def create_session(self, identity: Identity | None, protocol_version: str) -> SessionHandle:
        session_id = secrets.token_hex(16)
        actor = SessionActor.start(session_id, identity, self._config, self._services)
        dispatcher = actor.proxy().dispatcher().get(timeout=5.0)
        handle = SessionHandle(session_id, protocol_version, dispatcher)
        self._directory.add(SessionRecord(handle, actor, identity_key(identity), time.time()))
        logger.info("session %s created", short_id(session_id))
        return handle

    def end_session(self, session_id: str, identity: Identity | None) -> bool:
        record = self._directory.remove(session_id, identity)
        if record is None:
            return False
        stop_quietly(record.actor)
        logger.info("session %s ended by the client", short_id(session_id))
        return True

    def reap_idle(self) -> int:
        ttl = self._config.operational.session_ttl
        reaped = self._directory.remove_idle(ttl)
        for record in reaped:
            stop_quietly(record.actor)
            logger.info("session %s reaped after %gs idle", short_id(record.handle.session_id), ttl)
        self._schedule_reaping()
        return len(reaped)

    # -- operators -----------------------------------------------------------------------

    def overview(self) -> dict[str, Any]:
        """Gateway-level facts plus the session actors to ask for details (asked by the caller,
        so a large registry never holds the gateway's loop)."""
        return {
            "uptime": time.time() - self._started,
            "discoveryCache": self._services.discovery_cache.stats(),
            "workflows": self._services.workflow_metrics.snapshot(),
            "sessions": self._directory.overview(),
        }

    def session_count(self) -> int:
        return len(self._directory)

    # -- internals -----------------------------------------------------------------------

    def _schedule_reaping(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()  # one timer chain, however reap_idle was reached
        interval = min(max(self._config.operational.session_ttl / 4, 0.05), 30.0)
        proxy = self.actor_ref.proxy()

        def tick() -> None:
            try:
                proxy.reap_idle()
            except pykka.ActorDeadError:
                pass

        self._reaper = call_later(interval, tick)


def short_id(session_id: str) -> str:
    """Enough of a session id to correlate log lines, too little to use it."""
    return session_id[:8]
