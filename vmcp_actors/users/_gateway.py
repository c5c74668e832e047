"""Gateway: the root actor. Opens, ends and reaps sessions; starts, revives, releases
and ends users' actors; the only writer of the directory.

Nothing here waits: starting a user's actors returns at once (they are started in this
thread, without asking them anything), so a slow or failing start never holds the loop,
and nothing started is left behind when a caller stops waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pykka

from vmcp_actors.backends import HealthMonitor
from vmcp_actors.concurrency import TimerHandle, call_later, pool_stats, stop_quietly
from vmcp_actors.config import VmcpConfig
from vmcp_actors.identity import Identity, identity_key
from vmcp_actors.pooled import actor_pool_stats
from vmcp_actors.protocol.lifecycle import InitializeOutcome
from vmcp_actors.signing import Signer
from vmcp_actors.users._actor import (
    SessionServices,
    UserHandle,
    end_released_user,
    start_user,
)
from vmcp_actors.users._directory import Directory
from vmcp_actors.users._records import (
    SessionRecord,
    UserKey,
    UserRecord,
    relayed_capabilities,
)
from vmcp_actors.users._store import StoreUnavailable

logger = logging.getLogger(__name__)


class CapReached(Exception):
    """A cap (``operational.maxSessions``, ``maxSessionsPerIdentity`` or ``maxLiveUsers``)
    is reached and nothing under it is idle to make room."""

    def __init__(self, cap: str, limit: int):
        super().__init__(f"{cap} ({limit}) reached")
        self.cap = cap
        self.limit = limit


class Gateway(pykka.ThreadingActor):
    def __init__(self, config: VmcpConfig, directory: Directory | None = None,
                 services: SessionServices | None = None, signer: Signer | None = None, *,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self._config = config
        self._services = services if services is not None else SessionServices()
        self._directory = directory if directory is not None else Directory(self._services.store, clock)
        self._signer = signer if signer is not None else Signer.generated()
        self._started = time.time()
        self._reaper: TimerHandle | None = None
        self._monitor: pykka.ActorRef[HealthMonitor] | None = None  # operational.failureHandling
        # Sessions evicted and initializes refused at a session cap; users released and
        # requests refused at the live-user cap.
        self._limits = {"evicted": 0, "refused": 0}
        self._user_limits = {"released": 0, "refused": 0}

    def on_start(self) -> None:
        self._schedule_reaping()
        health = self._services.health
        if health is not None and health.monitored:
            self._monitor = HealthMonitor.start(self._config, health, self._services.outgoing_auth,
                                                self._services.eras)

    def on_stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        if self._monitor is not None:
            stop_quietly(self._monitor)
        self._services.live.end_all()  # streams end now, not at their next keep-alive
        # In-memory records end with this process: end the backend sessions with them.
        for user in self._directory.remove_all_users():
            self._stop_user(user, end=not self._services.store.shared)

    # -- sessions ------------------------------------------------------------------------

    def open_session(self, identity: Identity | None, outcome: InitializeOutcome) -> SessionRecord:
        """A new client session of the caller, its user's actors started if they are not
        live (no backend is contacted). At a cap the least recently used idle session goes
        (its client gets 404 and initializes again); with none idle, CapReached."""
        self._make_room(identity_key(identity))
        now = time.time()
        record = SessionRecord(
            session_id=self._signer.new_session_id(),
            user=UserKey.of(identity, outcome.client_capabilities),
            protocol_version=outcome.protocol_version,
            client_capabilities=outcome.client_capabilities,
            client_info=outcome.client_info,
            created=now,
            last_used=now,
        )
        self._live_user(record.user, identity, relayed_capabilities(outcome.client_capabilities))
        self._directory.add_session(record)
        logger.info("session %s opened for %s", short_id(record.session_id), record.user.label)
        return record

    def end_session(self, session_id: str, identity: Identity | None) -> bool:
        record = self._directory.remove_session(session_id, identity)
        if record is None:
            return False
        logger.info("session %s ended by the client", short_id(session_id))
        self._session_gone(record)
        return True

    def serve_user(self, key: UserKey, identity: Identity | None, client_capabilities: dict[str, Any]) -> UserHandle:
        """The user a 2026-07-28 request is served by (no session): started, or revived
        from its record. It ends once idle for ``operational.sessionTTL`` with no session."""
        user = self._live_user(key, identity, client_capabilities)
        self._directory.seen_sessionless(key)
        return user

    def revive_user(self, key: UserKey, identity: Identity | None) -> UserHandle:
        """The user's live actors, revived from the user record if they were released."""
        return self._live_user(key, identity)

    def reap_idle(self) -> int:
        try:
            return self._reap_idle()
        except StoreUnavailable as error:
            logger.warning("reaping skipped this round: %s", error)
            self._schedule_reaping()
            return 0

    def _reap_idle(self) -> int:
        operational = self._config.operational
        reaped = self._directory.remove_idle_sessions(operational.session_ttl)
        for record in reaped:
            logger.info("session %s reaped after %gs idle", short_id(record.session_id), operational.session_ttl)
            self._session_gone(record)
        for key in self._directory.idle_sessionless_users(operational.session_ttl):
            logger.info("user %s ended after %gs without a request (no session of its own)", key.label,
                        operational.session_ttl)
            self._end_user(key)
        for user in self._directory.release_idle_users(operational.user_idle_timeout):
            logger.info("user %s released after %gs idle (its record stays)", user.key.label,
                        operational.user_idle_timeout)
            self._stop_user(user, end=False)
        self._schedule_reaping()
        return len(reaped)

    def _make_room(self, owner: tuple[str, str] | None) -> None:
        operational = self._config.operational
        per_identity = operational.max_sessions_per_identity
        if per_identity and self._directory.sessions_of_owner(owner) >= per_identity:
            self._evict("operational.maxSessionsPerIdentity", per_identity, owner)
        if self._directory.session_count() >= operational.max_sessions:
            self._evict("operational.maxSessions", operational.max_sessions)

    def _evict(self, cap: str, limit: int, owner: Any = ...) -> None:
        record = self._directory.evict_least_recently_used(owner)
        if record is None:
            self._limits["refused"] += 1
            logger.warning("new session refused: %s (%d) reached and every session is busy", cap, limit)
            raise CapReached(cap, limit)
        self._limits["evicted"] += 1
        logger.warning("session %s of %s evicted: %s (%d) reached; it was the least recently used idle one",
                       short_id(record.session_id), record.user.label, cap, limit)
        self._session_gone(record)

    # -- operators -----------------------------------------------------------------------

    def user_to_explain(self, session_id: str | None, subject: str | None) -> UserHandle | None:
        """For the admin explain view: the user serving ``session_id`` (revived if it was
        released), or the live user of ``subject``; None when there is none."""
        if session_id:
            record = self._services.store.session(session_id)
            return self._live_user(record.user, None) if record is not None else None
        return next((user for user in self._directory.live_users() if user.key.label == subject), None)

    def overview(self) -> dict[str, Any]:
        """Gateway-level facts plus the users to ask for details (asked by the caller,
        so a large registry never holds the gateway's loop)."""
        return {
            "uptime": time.time() - self._started,
            "discoveryCache": self._services.discovery_cache.stats(),
            "workflows": self._services.workflow_metrics.snapshot(),
            "workers": pool_stats(),
            "actorWorkers": actor_pool_stats(),
            "clients": self._services.live.counts(),
            "backendEras": self._services.eras.snapshot(),
            "backendHealth": self._services.health.snapshot() if self._services.health is not None else {},
            "sessionLimits": {"maxSessions": self._config.operational.max_sessions,
                              "maxSessionsPerIdentity": self._config.operational.max_sessions_per_identity,
                              **self._limits},
            "liveUserLimits": {"maxLiveUsers": self._config.operational.max_live_users, **self._user_limits},
            **self._directory.overview(),
        }

    def session_count(self) -> int:
        return self._directory.session_count()

    # -- internals -----------------------------------------------------------------------

    def _live_user(self, key: UserKey, identity: Identity | None,
                   client_capabilities: dict[str, Any] | None = None) -> UserHandle:
        live = self._directory.user(key)
        if live is not None:
            return live
        self._make_room_for_user()
        store = self._services.store
        record = store.user(key)
        if record is None:
            record = UserRecord(key, created=time.time(), client_capabilities=client_capabilities or {})
            store.put_user(record)
        else:
            logger.info("user %s revived from its record", key.label)
        user = start_user(record, identity, self._config, self._services)
        self._directory.add_user(user)
        return user

    def _make_room_for_user(self) -> None:
        """Threads follow live users (one each: its UserActor): at the cap the least
        recently used user with nothing in flight is released; with none, CapReached."""
        limit = self._config.operational.max_live_users
        if self._directory.live_user_count() < limit:
            return
        user = self._directory.release_least_recently_used_user()
        if user is None:
            self._user_limits["refused"] += 1
            logger.warning("request refused: operational.maxLiveUsers (%d) reached and every live user is busy", limit)
            raise CapReached("operational.maxLiveUsers", limit)
        self._user_limits["released"] += 1
        logger.warning("user %s released: operational.maxLiveUsers (%d) reached; it was the least recently used "
                    "idle one (its records stay)", user.key.label, limit)
        self._stop_user(user, end=False)

    def _session_gone(self, record: SessionRecord) -> None:
        self._services.live.end_session(record.session_id)  # its stream closes, what it was asked fails
        user = self._directory.user(record.user)
        if user is not None:
            user.proxy.session_ended(record.session_id)
        if not self._directory.has_sessions(record.user):
            if self._services.store.shared and self._services.store.sessions_of(record.user):
                self._release_user(record.user)  # other processes still serve its sessions
            else:
                self._end_user(record.user)

    def _release_user(self, key: UserKey) -> None:
        """This process stops the user's actors; its records (and backend sessions) stay."""
        user = self._directory.remove_user(key)
        if user is not None:
            self._stop_user(user, end=False)

    def _end_user(self, key: UserKey) -> None:
        """The user's last session ended: its actors stop and its backend sessions end."""
        user = self._directory.remove_user(key)
        record = self._services.store.delete_user(key)
        if user is not None:
            self._stop_user(user, end=True)
        elif record is not None:
            end_released_user(record, self._config, self._services)

    def _stop_user(self, user: UserHandle, *, end: bool) -> None:
        user.close()  # composite runs in flight need the connections
        if end:
            try:
                user.proxy.end()
            except pykka.ActorDeadError:
                pass
        else:
            stop_quietly(user.actor)

    def _schedule_reaping(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()  # one timer chain, however reap_idle was reached
        operational = self._config.operational
        interval = min(max(min(operational.session_ttl, operational.user_idle_timeout) / 4, 0.05), 30.0)
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
