"""Gateway: the root actor. Opens, ends and reaps sessions; starts, revives, releases
and ends users' actors; the only one that adds to the directory.

State the actor owns: the caps' counters, the reaper's timer, the health monitor, and
the users being ended (taken out of the directory, their records settling on the I/O
pool). Sessions and users themselves are on the Directory's board (its lock).

Nothing here waits: starting a user's actors returns at once (they are started in this
thread, without asking them anything), so a slow or failing start never holds the loop,
and nothing started is left behind when a caller stops waiting. No store round trip runs
on the loop either: the caller reads the user record it revives and writes the session
record it opened (``admit_session``; ``serve_user``/``revive_user`` with ``user_record``),
and reaping, ending users and deleting records run on the I/O pool, reporting back by
message.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka

from vmcp_actors.backends import HealthMonitor
from vmcp_actors.concurrency import (
    LoopActor,
    TimerHandle,
    call_later,
    pool_stats,
    run_in_thread,
    stop_quietly,
    tell_quietly,
)
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
from vmcp_actors.users._directory import Directory, RemovedUser
from vmcp_actors.users._records import (
    SessionRecord,
    UserKey,
    UserRecord,
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


@dataclass(frozen=True)
class _Reaped:
    """A reaping round's outcome (decided and taken out on the I/O pool)."""

    sessions: tuple[SessionRecord, ...]
    ended: tuple[RemovedUser, ...]
    released: tuple[UserHandle, ...]


@dataclass(frozen=True)
class _UserSettled:
    """A user taken out: whether its records were ended (else released) on the pool."""

    removed: RemovedUser
    outcome: cf.Future[tuple[bool, UserRecord | None]]


class Gateway(LoopActor):
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
        # Users taken out of the directory whose records are being settled (ended or
        # released) on the I/O pool: a user started meanwhile starts from a new record.
        self._ending: dict[UserKey, _UserSettled] = {}

    def on_start(self) -> None:
        self._schedule_reaping()
        health = self._services.health
        if health is not None and health.monitored:
            self._monitor = HealthMonitor.start(self._config, health, self._services.outgoing_auth,
                                                self._services.eras, self._services.processes)

    def on_stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        if self._monitor is not None:
            stop_quietly(self._monitor)
        self._services.live.end_all()  # streams end now, not at their next keep-alive
        # In-memory records end with this process: end the backend sessions with them.
        for user in self._directory.remove_all_users():
            self._stop_user(user, end=not self._services.store.shared)
        for settling in self._ending.values():
            if settling.removed.user is not None:
                self._stop_user(settling.removed.user, end=not self._services.store.shared)

    # -- sessions ------------------------------------------------------------------------

    def admit_session(self, identity: Identity | None, outcome: InitializeOutcome) -> SessionRecord:
        """A new client session of the caller, served by a user of its own (its own backend
        sessions, opened on first need). Nothing starts now: the session's first request
        starts its user (``revive_user``), so a session that never asks costs no thread.
        The caller writes the returned record to the store before
        answering. At a cap the least recently used idle session goes (its client gets 404
        and initializes again); with none idle, CapReached."""
        self._make_room(identity_key(identity))
        now = time.time()
        session_id = self._signer.new_session_id()
        record = SessionRecord(
            session_id=session_id,
            user=UserKey.of(identity, outcome.client_capabilities, session=session_id),
            protocol_version=outcome.protocol_version,
            client_capabilities=outcome.client_capabilities,
            client_info=outcome.client_info,
            created=now,
            last_used=now,
        )
        self._directory.add_session(record)
        logger.info("session %s opened for %s", short_id(record.session_id), record.user.label)
        return record

    def session_removed(self, record: SessionRecord) -> None:
        """The client ended its session (the caller took it out of the directory with
        ``Directory.remove_session``): its stream closes, and its user ends if nothing
        else uses it."""
        logger.info("session %s ended by the client", short_id(record.session_id))
        self._session_gone(record)

    def serve_user(self, key: UserKey, identity: Identity | None, client_capabilities: dict[str, Any],
                   user_record: UserRecord | None) -> UserHandle:
        """The user a 2026-07-28 request is served by (no session): started, or revived
        from ``user_record`` (read by the caller; None: there is none). It ends once idle
        for ``operational.sessionTTL`` with no session."""
        self._directory.seen_sessionless(key)  # first: from now on no session's end ends it
        return self._live_user(key, identity, client_capabilities, user_record)

    def revive_user(self, key: UserKey, identity: Identity | None, user_record: UserRecord | None,
                    client_capabilities: dict[str, Any] | None = None) -> UserHandle:
        """The user's live actors, revived from ``user_record`` (read by the caller) if
        they were released, or started (told ``client_capabilities``) when there is none."""
        return self._live_user(key, identity, client_capabilities, user_record)

    def reap_idle(self) -> None:
        """Start a reaping round now: decided and taken out on the I/O pool (the store is
        read there), reported back as ``_Reaped``."""
        operational, directory, ref = self._config.operational, self._directory, self.actor_ref

        def reap() -> None:
            sessions: list[SessionRecord] = []
            try:
                sessions = directory.remove_idle_sessions(operational.session_ttl)
            except StoreUnavailable as error:
                logger.warning("sessions not reaped this round: %s", error)
            ended = directory.reap_sessionless_users(operational.session_ttl)
            released = directory.release_idle_users(operational.user_idle_timeout)
            tell_quietly(ref, _Reaped(tuple(sessions), tuple(ended), tuple(released)))

        def reap_or_go_on() -> None:
            try:
                reap()
            except Exception as error:  # the next round tries again
                logger.error("reaping failed: %s", error, exc_info=error)
                tell_quietly(ref, _Reaped((), (), ()))

        run_in_thread(reap_or_go_on)

    def on_receive(self, message: Any) -> None:
        if isinstance(message, _Reaped):
            self._reaped(message)
        elif isinstance(message, _UserSettled):
            self._user_settled(message)

    def _reaped(self, reaped: _Reaped) -> None:
        operational = self._config.operational
        for record in reaped.sessions:
            logger.info("session %s reaped after %gs idle", short_id(record.session_id), operational.session_ttl)
            self._session_gone(record)
        for removed in reaped.ended:
            logger.info("user %s ended after %gs without a request (no session of its own)", removed.key.label,
                        operational.session_ttl)
            self._end_user(removed, others_may_serve=False)
        for user in reaped.released:
            logger.info("user %s released after %gs idle (its record stays)", user.key.label,
                        operational.user_idle_timeout)
            self._stop_user(user, end=False)
        self._schedule_reaping()

    def _make_room(self, owner: tuple[str, str] | None) -> None:
        operational = self._config.operational
        per_identity = operational.max_sessions_per_identity
        if per_identity and self._directory.sessions_of_owner(owner) >= per_identity:
            self._evict("operational.maxSessionsPerIdentity", per_identity, owner)
        if self._directory.session_count() >= operational.max_sessions:
            self._evict("operational.maxSessions", operational.max_sessions)

    def _evict(self, cap: str, limit: int, owner: Any = ...) -> None:
        record = self._directory.evict_least_recently_used(owner)
        if record is not None:
            run_in_thread(self._forget_record, record.session_id)
        if record is None:
            self._limits["refused"] += 1
            logger.warning("new session refused: %s (%d) reached and every session is busy", cap, limit)
            raise CapReached(cap, limit)
        self._limits["evicted"] += 1
        logger.warning("session %s of %s evicted: %s (%d) reached; it was the least recently used idle one",
                       short_id(record.session_id), record.user.label, cap, limit)
        self._session_gone(record)

    # -- operators -----------------------------------------------------------------------

    def user_to_explain(self, session: SessionRecord | None, user_record: UserRecord | None,
                        subject: str | None) -> UserHandle | None:
        """For the admin explain view: the user serving ``session`` (revived from
        ``user_record`` if it was released; both read by the caller), or the live user of
        ``subject``; None when there is none."""
        if session is not None:
            return self._live_user(session.user, None, None, user_record)
        return next((user for user in self._directory.live_users() if user.key.label == subject), None)

    def overview(self) -> dict[str, Any]:
        """Gateway-level facts plus the users to ask for details and the sessions' ids (the
        caller asks the users and reads the records, so neither holds the gateway's loop)."""
        return {
            "uptime": time.time() - self._started,
            "discoveryCache": self._services.discovery_cache.stats(),
            "workflows": self._services.workflow_metrics.snapshot(),
            "workers": pool_stats(),
            "actorWorkers": actor_pool_stats(),
            "clients": self._services.live.counts(),
            "backendEras": self._services.eras.snapshot(),
            "backendBackoff": self._services.backoff.snapshot(),
            "backendHealth": self._services.health.snapshot() if self._services.health is not None else {},
            "sessionLimits": {"maxSessions": self._config.operational.max_sessions,
                              "maxSessionsPerIdentity": self._config.operational.max_sessions_per_identity,
                              **self._limits},
            "liveUserLimits": {"maxLiveUsers": self._config.operational.max_live_users, **self._user_limits},
            **self._directory.board(),
        }

    def session_count(self) -> int:
        return self._directory.session_count()

    # -- internals -----------------------------------------------------------------------

    def _live_user(self, key: UserKey, identity: Identity | None, client_capabilities: dict[str, Any] | None,
                   user_record: UserRecord | None) -> UserHandle:
        live = self._directory.user(key)
        if live is not None:
            return live
        self._make_room_for_user()
        settling = self._ending.get(key)
        if settling is not None:
            user_record = None  # the record read is being ended: start anew, written once it is gone
        if user_record is None:
            record = UserRecord(key, created=time.time(), client_capabilities=client_capabilities or {})
        else:
            record = user_record
            logger.info("user %s revived from its record", key.label)
        user = start_user(record, identity, self._config, self._services, new=user_record is None,
                          write_after=settling.outcome if settling is not None else None)
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
        # Not while a request uses the user or it serves 2026-07-28 requests: the reaper
        # ends it after sessionTTL with no session and nothing in flight.
        removed = self._directory.remove_unused_user(record.user)
        if removed is not None:
            self._end_user(removed, others_may_serve=True)

    def _end_user(self, removed: RemovedUser, *, others_may_serve: bool) -> None:
        """A user taken out of the directory: its records are settled on the I/O pool
        (with shared records, released when ``others_may_serve`` and another process
        serves a session of it; else ended: the user record deleted), then, by message,
        its actors stop and its backend sessions end (or stay, when released)."""
        store, key = self._services.store, removed.key

        def settle() -> tuple[bool, UserRecord | None]:
            if others_may_serve and store.shared and store.sessions_of(key):
                return False, None  # other processes still serve its sessions
            return True, store.delete_user(key)

        settling = _UserSettled(removed, run_in_thread(settle))
        self._ending[key] = settling
        ref = self.actor_ref
        settling.outcome.add_done_callback(lambda _: tell_quietly(ref, settling))

    def _user_settled(self, settled: _UserSettled) -> None:
        removed = settled.removed
        if self._ending.get(removed.key) is settled:
            del self._ending[removed.key]
        try:
            end, record = settled.outcome.result()
        except StoreUnavailable as error:  # the records stay (and expire); the actors go
            logger.warning("user %s released, not ended: %s", removed.key.label, error)
            end, record = False, None
        if removed.user is not None:
            self._stop_user(removed.user, end=end)
        elif end and record is not None:
            end_released_user(record, self._config, self._services)

    def _forget_record(self, session_id: str) -> None:
        """On the I/O pool: an evicted session's record goes."""
        try:
            self._directory.delete_record(session_id)
        except StoreUnavailable as error:  # it expires by itself
            logger.warning("record of session %s not deleted: %s", short_id(session_id), error)

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
                proxy.reap_idle()  # a message: the round itself runs on the I/O pool
            except pykka.ActorDeadError:
                pass

        self._reaper = call_later(interval, tick)


def short_id(session_id: str) -> str:
    """Enough of a session id to correlate log lines, too little to use it."""
    return session_id[:8]
