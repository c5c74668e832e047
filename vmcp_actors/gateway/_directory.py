"""The session directory: what web threads read on every request without asking an actor.

The Gateway actor is the only writer of the registry (it creates, ends and reaps
sessions); web threads only look sessions up. Activity (requests in flight, last use) is
written by web threads, so it sits behind a lock, and the reaper decides and removes
under that same lock: a session that a request has just found is never reaped under it.
An actor message per request for this would cost as much CPU as the rest of a tool call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vmcp_actors.identity import Identity, identity_key
from vmcp_actors.sessions import McpDispatcher


@dataclass(frozen=True)
class SessionHandle:
    """What a web thread needs to serve one request of a session."""

    session_id: str
    protocol_version: str
    dispatcher: McpDispatcher


@dataclass(frozen=True)
class SessionRecord:
    handle: SessionHandle
    actor: Any  # pykka.ActorRef[SessionActor]
    owner: tuple[str, str] | None
    created: float  # time.time()


@dataclass
class _Activity:
    last_used: float  # clock()
    in_flight: int = 0


class SessionDirectory:
    def __init__(self, clock: Callable[[], float]):
        self._clock = clock
        self._records: dict[str, SessionRecord] = {}
        self._activity: dict[str, _Activity] = {}
        self._lock = threading.Lock()

    # -- web threads ---------------------------------------------------------------------

    def find(self, session_id: str, identity: Identity | None) -> SessionHandle | None:
        """The session, if it exists and belongs to this caller; the caller must call
        ``finish`` when done. Another person's session looks exactly like a missing one."""
        record = self._records.get(session_id)
        if record is None or record.owner != identity_key(identity):
            return None
        with self._lock:
            activity = self._activity.get(session_id)
            if activity is None:
                return None  # ended or reaped a moment ago
            activity.in_flight += 1
            activity.last_used = self._clock()
        return record.handle

    def finish(self, session_id: str) -> None:
        """A request found with ``find`` is answered: the idle clock starts now."""
        with self._lock:
            activity = self._activity.get(session_id)
            if activity is not None:
                activity.in_flight = max(0, activity.in_flight - 1)
                activity.last_used = self._clock()

    # -- the Gateway actor only ----------------------------------------------------------

    def add(self, record: SessionRecord) -> None:
        with self._lock:
            self._activity[record.handle.session_id] = _Activity(self._clock())
        self._records[record.handle.session_id] = record

    def remove(self, session_id: str, identity: Identity | None) -> SessionRecord | None:
        record = self._records.get(session_id)
        if record is None or record.owner != identity_key(identity):
            return None
        with self._lock:
            self._activity.pop(session_id, None)
        return self._records.pop(session_id, None)

    def remove_idle(self, ttl: float) -> list[SessionRecord]:
        """Take out every session idle for ``ttl`` with no request in flight."""
        now = self._clock()
        with self._lock:
            idle = [sid for sid, a in self._activity.items() if a.in_flight == 0 and now - a.last_used >= ttl]
            for session_id in idle:
                del self._activity[session_id]
        return [self._records.pop(session_id) for session_id in idle]

    def remove_all(self) -> list[SessionRecord]:
        with self._lock:
            self._activity.clear()
        records = list(self._records.values())
        self._records.clear()
        return records

    def overview(self) -> list[tuple[Any, dict[str, Any]]]:
        """(session actor, facts) for every session, for the admin state."""
        now = self._clock()
        with self._lock:
            activity = {sid: (a.last_used, a.in_flight) for sid, a in self._activity.items()}
        rows = []
        for session_id, record in list(self._records.items()):
            last_used, in_flight = activity.get(session_id, (now, 0))
            rows.append((record.actor, {
                "created": record.created,
                "idleSeconds": round(now - last_used, 3),
                "inFlight": in_flight,
            }))
        return rows

    def __len__(self) -> int:
        return len(self._records)
