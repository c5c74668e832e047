"""The directory: what web threads read on every request without asking an actor.

Records (sessions, users) live in the record store; the directory adds what is live in
this process: each user's running actors (a ``UserHandle``) and the activity board
(requests in flight, last use) of sessions and users. The Gateway actor is the only one
that adds and removes sessions and users; web threads look them up and mark activity.
Activity sits behind one lock, and the reaper decides and removes under that same lock:
a session or user a request has just found is never reaped or released under it. An
actor message per request for this would cost as much CPU as the rest of a tool call.
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
    in_flight: int = 0
    attached: bool = False  # a session's user actor has seen its first request
    recorded: float = 0.0  # wall time last written to the record's last_used


@dataclass(frozen=True)
class Lease:
    """A request's hold on its session (and on its user's actors, when they are live)."""

    session: SessionRecord
    user: UserHandle | None
    attached: bool  # False: the session's first request here (see UserActor.attach_session)


class Directory:
    def __init__(self, store: RecordStore, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.store = store
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._sessions: dict[str, _Activity] = {}  # the sessions this process serves
        self._users: dict[UserKey, UserHandle] = {}  # users whose actors are live
        self._user_activity: dict[UserKey, _Activity] = {}
        self._sessions_of: Counter[UserKey] = Counter()
        self._owner_of: dict[str, tuple[str, str] | None] = {}  # session id -> its identity binding
        # Users that serve 2026-07-28 requests (no session): when each was last asked.
        self._sessionless_seen: dict[UserKey, float] = {}

    # -- web threads ---------------------------------------------------------------------

    def begin(self, session_id: str, identity: Identity | None) -> Lease | None:
        """The session, if it exists and belongs to this caller, held until ``finish``.
        Another person's session looks exactly like a missing one."""
        record = self.store.session(session_id)
        if record is None or record.owner != identity_key(identity):
            return None
        with self._lock:
            activity = self._sessions.get(session_id)
            if activity is None:
                if not self.store.shared:
                    return None  # ended or reaped a moment ago
                # Opened by another process (or by this one before a restart): serve it
                # here from its record; the user's actors are revived on first use.
                activity = self._track(record)
            self._touch(activity, +1)
            user = self._users.get(record.user)
            if user is not None:
                self._touch(self._user_activity[record.user], +1)
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
        with self._lock:
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
        self.store.put_session(record)
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
        or stream in flight; None when every one is busy."""
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
            dropped = self._drop_session(session_id)
        # A shared record goes even when another process served the session.
        return dropped if dropped is not None or not self.store.shared else self.store.delete_session(session_id)

    def remove_idle_sessions(self, ttl: float) -> list[SessionRecord]:
        """Take out every session idle for ``ttl`` with no request in flight. With shared
        records, a session another process used since (its record says) is only forgotten
        here; the process that serves it, or the record's expiry, ends it."""
        now = self._clock()
        with self._lock:
            idle = [sid for sid, a in self._sessions.items() if a.in_flight == 0 and now - a.last_used >= ttl]
            if not self.store.shared:
                return [record for sid in idle if (record := self._drop_session(sid)) is not None]
        reaped = []
        for sid in idle:
            record = self.store.session(sid)
            with self._lock:
                activity = self._sessions.get(sid)
                if activity is None or activity.in_flight or now - activity.last_used < ttl:
                    continue  # a request found it meanwhile
                if record is not None and self._wall() - record.last_used < ttl:
                    self._untrack(sid, record)  # the record stays for the other processes
                    continue
                dropped = self._drop_session(sid)
            if dropped is not None:
                reaped.append(dropped)
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

    def idle_sessionless_users(self, ttl: float) -> list[UserKey]:
        """Users that served 2026-07-28 requests, have no session and no request in flight,
        and were last asked ``ttl`` ago: the Gateway ends them (live or released)."""
        now = self._clock()
        with self._lock:
            idle = [key for key, seen in self._sessionless_seen.items()
                    if now - seen >= ttl and self._sessions_of[key] <= 0
                    and (key not in self._user_activity or self._user_activity[key].in_flight == 0)]
            for key in idle:
                del self._sessionless_seen[key]
                self._sessions_of.pop(key, None)
            return idle

    def has_sessions(self, key: UserKey) -> bool:
        with self._lock:
            return self._sessions_of[key] > 0

    def remove_user(self, key: UserKey) -> UserHandle | None:
        with self._lock:
            self._sessionless_seen.pop(key, None)
            self._user_activity.pop(key, None)
            return self._users.pop(key, None)

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

    def overview(self) -> dict[str, Any]:
        """Sessions with their activity and the live users, for the admin state."""
        now = self._clock()
        with self._lock:
            sessions = {sid: (a.last_used, a.in_flight) for sid, a in self._sessions.items()}
            users = [(user, round(now - self._user_activity[key].last_used, 3), self._user_activity[key].in_flight)
                     for key, user in self._users.items()]
        rows = []
        for session_id, (last_used, in_flight) in sessions.items():
            record = self.store.session(session_id)
            if record is not None:
                rows.append((record, {"idleSeconds": round(now - last_used, 3), "inFlight": in_flight}))
        with self._lock:
            sessionless = len(self._sessionless_seen)
        return {"sessions": rows, "users": users, "sessionlessUsers": sessionless}

    def session_count(self) -> int:
        return len(self._sessions)

    def _drop_session(self, session_id: str) -> SessionRecord | None:
        """Under the lock: forget a session here and in the store."""
        if session_id not in self._sessions:
            return None
        record = self.store.delete_session(session_id)
        self._untrack(session_id, record)
        return record

    def _track(self, record: SessionRecord) -> _Activity:
        """Under the lock: this process serves the session from now on."""
        activity = self._sessions[record.session_id] = _Activity(self._clock())
        self._sessions_of[record.user] += 1
        self._owner_of[record.session_id] = record.owner
        return activity

    def _untrack(self, session_id: str, record: SessionRecord | None) -> None:
        """Under the lock: this process no longer serves the session (``record``: its
        record, whose user's count goes down; None when the store had none left)."""
        self._sessions.pop(session_id, None)
        self._owner_of.pop(session_id, None)
        if record is not None:
            self._sessions_of[record.user] -= 1
            if self._sessions_of[record.user] <= 0:
                del self._sessions_of[record.user]
