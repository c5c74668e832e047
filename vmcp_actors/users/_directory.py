"""The directory: what web threads read on every request without asking an actor.

Records (sessions, users) live in the record store; the directory adds what is live in
this process: each user's running actors (a ``UserHandle``) and the activity board
(requests in flight, last use) of sessions and users. The Gateway actor is the only one
that adds sessions and users; web threads look them up and mark activity.
Activity sits behind one lock, and whatever takes a session or user out (end, evict, reap,
release) decides and removes in one step under that lock, returning what it removed: a
session or user a request has just found is never taken out under it, and a request
arriving after no longer finds it (and starts it anew). An actor message per request for
this would cost as much CPU as the rest of a tool call.

The lock guards only this process's board; no store round trip (Redis) is made while it
is held: records are read before and deleted or updated after.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vmcp_actors.core._dispatch import LOGGING_LEVELS
from vmcp_actors.identity import Identity, identity_key
from vmcp_actors.users._actor import UserHandle
from vmcp_actors.users._records import SessionRecord, UserKey
from vmcp_actors.users._store import RecordStore

# How often a busy session's record gets its last use written (the activity board has
# it to the moment; the record is what another process would restore).
RECORD_LAST_USE_EVERY = 1.0


@dataclass
class _Activity:
    last_used: float  # clock()
    record: SessionRecord | None = None  # a session's record as tracked (its user and owner never change)
    in_flight: int = 0
    attached: bool = False  # a session's user actor has seen its first request
    recorded: float = 0.0  # wall time last written to the record's last_used


@dataclass(frozen=True)
class Lease:
    """A request's hold on its session (and on its user's actors, when they are live)."""

    session: SessionRecord
    user: UserHandle | None
    attached: bool  # False: the session's first request here (see UserActor.attach_session)


@dataclass(frozen=True)
class RemovedUser:
    """A user taken off the board: its live actors (None when they were released)."""

    key: UserKey
    user: UserHandle | None


class Directory:
    def __init__(self, store: RecordStore, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.store = store
        self._clock = clock
        self._wall = wall
        # Guards the board below (sessions, users, their activity, sessionless users).
        # Never held across a store round trip; nothing else is taken while it is held.
        self._lock = threading.Lock()
        self._sessions: dict[str, _Activity] = {}  # the sessions this process serves
        self._users: dict[UserKey, UserHandle] = {}  # users whose actors are live
        self._user_activity: dict[UserKey, _Activity] = {}
        self._sessions_of: Counter[UserKey] = Counter()
        self._owner_of: dict[str, tuple[str, str] | None] = {}  # session id -> its identity binding
        self._leaving: set[str] = set()  # sessions taken out whose record is being deleted
        # Users that serve 2026-07-28 requests (no session): when each was last asked.
        self._sessionless_seen: dict[UserKey, float] = {}

    # -- web threads ---------------------------------------------------------------------

    def begin(self, session_id: str, identity: Identity | None) -> Lease | None:
        """The session, if it exists and belongs to this caller, held until ``finish``.
        Another person's session looks exactly like a missing one."""
        record = self.store.session(session_id)
        if record is None or record.owner != identity_key(identity):
            return None
        adopted = False
        with self._lock:
            activity = self._sessions.get(session_id)
            if activity is None:
                if not self.store.shared or session_id in self._leaving:
                    return None  # ended or reaped a moment ago
                # Opened by another process (or by this one before a restart): serve it
                # here from its record; the user's actors are revived on first use.
                activity, adopted = self._track(record), True
            self._touch(activity, +1)
            user = self._users.get(record.user)
            if user is not None:
                self._touch(self._user_activity[record.user], +1)
        if adopted and self.store.session(session_id) is None:
            # Deleted (by another process) between the read above and the adoption: the
            # DELETE stands, and the session is not served here from the old record.
            with self._lock:
                if user is not None and record.user in self._user_activity:
                    self._touch(self._user_activity[record.user], -1)
                self._untrack(session_id)
            return None
        return Lease(record, user, activity.attached)

    def mark_attached(self, session_id: str) -> None:
        with self._lock:
            activity = self._sessions.get(session_id)
            if activity is not None:
                activity.attached = True

    def hold_user(self, key: UserKey) -> UserHandle | None:
        """The user's live actors, held until ``finish``; None when they are not live."""
        with self._lock:
            user = self._users.get(key)
            if user is not None:
                self._touch(self._user_activity[key], +1)
            return user

    def finish(self, session_id: str, user: UserKey | None) -> None:
        """A request is answered: the idle clocks start now, and the record says so."""
        record_use_at = None
        with self._lock:
            if user is not None and user in self._sessionless_seen:
                self._sessionless_seen[user] = self._clock()
            activity = self._sessions.get(session_id)
            if activity is not None:
                self._touch(activity, -1)
                now = self._wall()
                # The record's last use to the second: one store write per second at most.
                if now - activity.recorded >= RECORD_LAST_USE_EVERY:
                    activity.recorded = record_use_at = now
            if user is not None and user in self._user_activity:
                self._touch(self._user_activity[user], -1)
        if record_use_at is not None:  # outside the lock: with Redis it is a round trip
            self.store.update_session(session_id, lambda record: record.used_at(record_use_at))

    def set_log_level(self, session_id: str, level: str) -> str:
        """Record a session's log level; the most verbose level any session of its user
        asked for (what the user's backends must send, each session filtering its own)."""
        # No lock: the board is not involved, and each caller writes its level before it
        # reads them all, so of two sessions setting levels at once the later reader sees both.
        record = self.store.session(session_id)
        if record is None:
            return level
        self.store.update_session(session_id, lambda current: current.with_log_level(level))
        levels = [r.log_level for r in self.store.sessions_of(record.user) if r.log_level]
        return min(levels or [level], key=LOGGING_LEVELS.index)

    def _touch(self, activity: _Activity, delta: int) -> None:
        activity.in_flight = max(0, activity.in_flight + delta)
        activity.last_used = self._clock()

    # -- the Gateway actor only ----------------------------------------------------------

    def add_session(self, record: SessionRecord) -> None:
        """This process serves the new session (its record is written by the caller)."""
        with self._lock:
            self._track(record)

    def live_users(self) -> list[UserHandle]:
        with self._lock:
            return list(self._users.values())

    def sessions_of_owner(self, owner: tuple[str, str] | None) -> int:
        with self._lock:
            return sum(1 for held in self._owner_of.values() if held == owner)

    def evict_least_recently_used(self, owner: Any = ...) -> SessionRecord | None:
        """Take out the session (of ``owner``, when given) used longest ago with no request
        or stream in flight; None when every one is busy. No store I/O: the caller deletes
        its record with ``delete_record`` (off the Gateway's loop)."""
        with self._lock:
            idle = [(activity.last_used, sid) for sid, activity in self._sessions.items()
                    if activity.in_flight == 0 and (owner is ... or self._owner_of.get(sid) == owner)]
            if not idle:
                return None
            return self._drop_session(min(idle)[1])

    def remove_session(self, session_id: str, identity: Identity | None) -> SessionRecord | None:
        record = self.store.session(session_id)
        if record is None or record.owner != identity_key(identity):
            return None
        with self._lock:
            tracked = self._drop_session(session_id)
        if tracked is None and not self.store.shared:
            return None
        # A shared record goes even when another process served the session.
        return self.delete_record(session_id, tracked)

    def remove_idle_sessions(self, ttl: float) -> list[SessionRecord]:
        """Take out every session idle for ``ttl`` with no request in flight. With shared
        records, a session another process used since (its record says) is only forgotten
        here; the process that serves it, or the record's expiry, ends it."""
        now = self._clock()
        with self._lock:
            idle = [sid for sid, a in self._sessions.items() if a.in_flight == 0 and now - a.last_used >= ttl]
            if not self.store.shared:
                dropped = [(sid, tracked) for sid in idle if (tracked := self._drop_session(sid)) is not None]
                idle = []
        if not self.store.shared:
            return [self.delete_record(sid, tracked) for sid, tracked in dropped]
        reaped = []
        for sid in idle:
            record = self.store.session(sid)
            with self._lock:
                activity = self._sessions.get(sid)
                if activity is None or activity.in_flight or now - activity.last_used < ttl:
                    continue  # a request found it meanwhile
                if record is not None and self._wall() - record.last_used < ttl:
                    self._untrack(sid)  # the record stays for the other processes
                    continue
                tracked = self._drop_session(sid)
            if tracked is not None:
                reaped.append(self.delete_record(sid, tracked))
        return reaped

    def user(self, key: UserKey) -> UserHandle | None:
        return self._users.get(key)

    def add_user(self, user: UserHandle) -> None:
        with self._lock:
            self._users[user.key] = user
            self._user_activity[user.key] = _Activity(self._clock())

    def seen_sessionless(self, key: UserKey) -> None:
        """A 2026-07-28 request is served by this user: it lives by its own last use."""
        with self._lock:
            self._sessionless_seen[key] = self._clock()

    def reap_sessionless_users(self, ttl: float) -> list[RemovedUser]:
        """Take out the users that served 2026-07-28 requests, have no session and no
        request in flight, and were last asked ``ttl`` ago (live or released): the Gateway
        ends them. Decided and removed in one step, so a request after finds none."""
        now = self._clock()
        with self._lock:
            idle = [key for key, seen in self._sessionless_seen.items()
                    if now - seen >= ttl and self._sessions_of[key] <= 0
                    and (key not in self._user_activity or self._user_activity[key].in_flight == 0)]
            return [self._remove_user(key) for key in idle]

    def remove_unused_user(self, key: UserKey) -> RemovedUser | None:
        """A session of the user ended: take the user out if nothing uses it (no session
        here, no request in flight, no 2026-07-28 request served lately), else None. A
        user left in use lives by its last use: the reaper ends it after sessionTTL."""
        with self._lock:
            if self._sessions_of[key] > 0:
                return None
            activity = self._user_activity.get(key)
            if key in self._sessionless_seen:
                return None
            if activity is not None and activity.in_flight > 0:
                self._sessionless_seen[key] = self._clock()  # the reaper's, once the requests are done
                return None
            return self._remove_user(key)

    def _remove_user(self, key: UserKey) -> RemovedUser:
        """Under the lock: the user is no longer served here (live or released)."""
        self._sessionless_seen.pop(key, None)
        self._sessions_of.pop(key, None)
        self._user_activity.pop(key, None)
        return RemovedUser(key, self._users.pop(key, None))

    def release_idle_users(self, idle_for: float) -> list[UserHandle]:
        """Take out the live users idle for ``idle_for`` with no request in flight (their
        records stay: the next request revives them)."""
        now = self._clock()
        with self._lock:
            idle = [key for key, a in self._user_activity.items() if a.in_flight == 0 and now - a.last_used >= idle_for]
            for key in idle:
                del self._user_activity[key]
            return [self._users.pop(key) for key in idle]

    def live_user_count(self) -> int:
        return len(self._users)

    def release_least_recently_used_user(self) -> UserHandle | None:
        """Take out the live user used longest ago with no request or stream in flight
        (its records stay); None when every live user is busy."""
        with self._lock:
            idle = [(key, activity) for key, activity in self._user_activity.items() if activity.in_flight == 0]
            if not idle:
                return None
            key = min(idle, key=lambda pair: pair[1].last_used)[0]
            del self._user_activity[key]
            return self._users.pop(key)

    def remove_all_users(self) -> list[UserHandle]:
        with self._lock:
            users = list(self._users.values())
            self._users.clear()
            self._user_activity.clear()
            return users

    def board(self) -> dict[str, Any]:
        """The sessions' ids with their activity and the live users, for the admin state
        (no store I/O: the Gateway answers with it)."""
        now = self._clock()
        with self._lock:
            sessions = [(sid, {"idleSeconds": round(now - a.last_used, 3), "inFlight": a.in_flight})
                        for sid, a in self._sessions.items()]
            users = [(user, round(now - self._user_activity[key].last_used, 3), self._user_activity[key].in_flight)
                     for key, user in self._users.items()]
            sessionless = len(self._sessionless_seen)
        return {"sessions": sessions, "users": users, "sessionlessUsers": sessionless}

    def session_count(self) -> int:
        return len(self._sessions)

    def forget_unwritten(self, session_id: str) -> None:
        """A session admitted whose record could not be written: it never existed, and
        counts against no cap."""
        with self._lock:
            self._untrack(session_id)

    def _drop_session(self, session_id: str) -> SessionRecord | None:
        """Under the lock: forget a session here; its record as tracked (None when this
        process did not serve it). The caller deletes the record after the lock
        (``delete_record``); until then a request for it finds none."""
        tracked = self._untrack(session_id)
        if tracked is not None:
            self._leaving.add(session_id)
        return tracked

    def delete_record(self, session_id: str, tracked: SessionRecord | None = None) -> SessionRecord | None:
        """Outside the lock: the record of a session taken out goes from the store; the
        latest record (or ``tracked``, when the store had none left)."""
        try:
            deleted = self.store.delete_session(session_id)
        finally:
            with self._lock:
                self._leaving.discard(session_id)
        return deleted if deleted is not None else tracked

    def _track(self, record: SessionRecord) -> _Activity:
        """Under the lock: this process serves the session from now on."""
        activity = self._sessions[record.session_id] = _Activity(self._clock(), record)
        self._sessions_of[record.user] += 1
        self._owner_of[record.session_id] = record.owner
        return activity

    def _untrack(self, session_id: str) -> SessionRecord | None:
        """Under the lock: this process no longer serves the session (its user's count
        goes down); the record it was tracked with, None when it was not tracked."""
        activity = self._sessions.pop(session_id, None)
        self._owner_of.pop(session_id, None)
        if activity is None or activity.record is None:
            return None
        user = activity.record.user
        self._sessions_of[user] -= 1
        if self._sessions_of[user] <= 0:
            del self._sessions_of[user]
        return activity.record


def session_records(store: RecordStore,
                    sessions: list[tuple[str, dict[str, Any]]]) -> list[tuple[SessionRecord, dict[str, Any]]]:
    """(record, activity) for each of ``board``'s sessions whose record is still there."""
    return [(record, activity) for session_id, activity in sessions
            if (record := store.session(session_id)) is not None]
