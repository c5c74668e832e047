"""Where records live. In memory by default: one process, records lost with it; the
interface is what a shared store (Redis, for several workers and VMs) implements too.
Values are the frozen records themselves, never live objects.

No actor calls a store on its message loop (DESIGN rule 2): every ``RecordStore`` method
of both stores checks first (``off_actor_loops``), which the test suite turns into a
``StoreOnActorLoop`` error, so a store call that would hold a loop on Redis fails there
even with records in memory."""

from __future__ import annotations

import heapq
import json
import threading
import time
from collections.abc import Callable
from functools import wraps
from typing import Any, Protocol, TypeVar

from vmcp_actors.concurrency import refuse_on_actor_loop
from vmcp_actors.core._task_records import TaskRecord
from vmcp_actors.users._records import SessionRecord, UserKey, UserRecord


class StoreUnavailable(Exception):
    """The shared record store cannot be reached: the request gets 503, nothing is lost."""


class RecordStore(Protocol):
    shared: bool  # other processes read and write these records too

    def session(self, session_id: str) -> SessionRecord | None: ...
    def put_session(self, record: SessionRecord) -> None: ...
    def delete_session(self, session_id: str) -> SessionRecord | None: ...
    def sessions_of(self, key: UserKey) -> list[SessionRecord]: ...
    def update_session(self, session_id: str, change: Callable[[SessionRecord], SessionRecord]) -> None: ...
    def user(self, key: UserKey) -> UserRecord | None: ...
    def put_user(self, record: UserRecord) -> None: ...
    def update_user(self, key: UserKey, change: Callable[[UserRecord], UserRecord]) -> None: ...
    def delete_user(self, key: UserKey) -> UserRecord | None: ...
    # The gateway's own tasks (``vmcp_actors.core._task_records``); gone after their ``expires``.
    def task(self, task_id: str) -> TaskRecord | None: ...
    def put_task(self, record: TaskRecord) -> None: ...
    def update_task(self, task_id: str, change: Callable[[TaskRecord], TaskRecord]) -> TaskRecord | None: ...
    def tasks_of(self, owner: str) -> list[TaskRecord]: ...
    def live_tasks_of(self, owner: str) -> list[TaskRecord]: ...  # not ended, as their records say
    # What a 2025-11-25 backend's task asked (its requests, held for a 2026-07-28 client
    # until answered), under a key the relay derives from the task's handle.
    def asked(self, key: str) -> dict[str, Any] | None: ...
    def put_asked(self, key: str, questions: dict[str, Any], ttl: float) -> None: ...


STORE_METHODS = tuple(name for name, value in vars(RecordStore).items() if callable(value) and not name.startswith("_"))

StoreClass = TypeVar("StoreClass", bound=type)


def off_actor_loops(cls: StoreClass) -> StoreClass:
    """``cls`` with each of its ``RecordStore`` methods refusing an actor's loop first."""
    def checked(method: Callable[..., Any]) -> Callable[..., Any]:
        what = f"{cls.__name__}.{method.__name__}"

        @wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            refuse_on_actor_loop(what)
            return method(*args, **kwargs)
        return call

    for name in STORE_METHODS:
        setattr(cls, name, checked(getattr(cls, name)))
    return cls


@off_actor_loops
class MemoryRecordStore:
    """Thread-safe dictionaries of records."""

    shared = False

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()  # guards the record dictionaries' writes; never nested (never under the Directory's)
        self._sessions: dict[str, SessionRecord] = {}
        self._users: dict[UserKey, UserRecord] = {}
        self._tasks: dict[str, TaskRecord] = {}
        self._owned: dict[str, set[str]] = {}  # owner -> ids of their tasks
        self._live: dict[str, set[str]] = {}  # owner -> ids of their tasks not ended
        self._task_expiries: list[tuple[float, str]] = []  # a heap: (expires, task id), stale entries skipped
        self._asked: dict[str, tuple[float, dict[str, Any]]] = {}  # key -> (expires, questions)
        self._wall = wall

    def session(self, session_id: str) -> SessionRecord | None:
        return self._sessions.get(session_id)

    def put_session(self, record: SessionRecord) -> None:
        with self._lock:
            self._sessions[record.session_id] = record

    def delete_session(self, session_id: str) -> SessionRecord | None:
        with self._lock:
            return self._sessions.pop(session_id, None)

    def sessions_of(self, key: UserKey) -> list[SessionRecord]:
        with self._lock:
            return [record for record in self._sessions.values() if record.user == key]

    def update_session(self, session_id: str, change: Callable[[SessionRecord], SessionRecord]) -> None:
        """Replace the session's record with ``change(record)``; nothing if it was deleted."""
        with self._lock:
            current = self._sessions.get(session_id)
            if current is not None:
                self._sessions[session_id] = change(current)

    def user(self, key: UserKey) -> UserRecord | None:
        return self._users.get(key)

    def put_user(self, record: UserRecord) -> None:
        with self._lock:
            self._users[record.key] = record

    def update_user(self, key: UserKey, change: Callable[[UserRecord], UserRecord]) -> None:
        """Replace the user's record with ``change(record)``; nothing if it was deleted."""
        with self._lock:
            current = self._users.get(key)
            if current is not None:
                self._users[key] = change(current)

    def delete_user(self, key: UserKey) -> UserRecord | None:
        with self._lock:
            return self._users.pop(key, None)

    def task(self, task_id: str) -> TaskRecord | None:
        record = self._tasks.get(task_id)
        return record if record is not None and record.expires > self._wall() else None

    def put_task(self, record: TaskRecord) -> None:
        with self._lock:
            self._sweep_tasks(self._wall())  # expired: swept as new tasks come
            self._keep_task(record)

    def update_task(self, task_id: str, change: Callable[[TaskRecord], TaskRecord]) -> TaskRecord | None:
        """Replace the task's record with ``change(record)`` and return it; None if it is gone."""
        with self._lock:
            current = self._tasks.get(task_id)
            if current is None or current.expires <= self._wall():
                return None
            changed = change(current)
            self._keep_task(changed)
            return changed

    def _keep_task(self, record: TaskRecord) -> None:
        """Under ``_lock``: the record, its owner's indexes, and when it expires."""
        previous = self._tasks.get(record.task_id)
        self._tasks[record.task_id] = record
        self._owned.setdefault(record.owner, set()).add(record.task_id)
        if record.terminal:
            self._forget_id(self._live, record.owner, record.task_id)
        else:
            self._live.setdefault(record.owner, set()).add(record.task_id)
        if previous is None or previous.expires != record.expires:
            heapq.heappush(self._task_expiries, (record.expires, record.task_id))

    def _sweep_tasks(self, now: float) -> None:
        """Under ``_lock``: drop the records expired by ``now`` (each expiry popped once)."""
        while self._task_expiries and self._task_expiries[0][0] <= now:
            _, task_id = heapq.heappop(self._task_expiries)
            record = self._tasks.get(task_id)
            if record is not None and record.expires <= now:  # else: a later expiry is in the heap
                del self._tasks[task_id]
                self._forget_id(self._owned, record.owner, task_id)
                self._forget_id(self._live, record.owner, task_id)

    @staticmethod
    def _forget_id(index: dict[str, set[str]], owner: str, task_id: str) -> None:
        ids = index.get(owner)
        if ids is not None:
            ids.discard(task_id)
            if not ids:
                del index[owner]

    def tasks_of(self, owner: str) -> list[TaskRecord]:
        return self._owner_tasks(self._owned, owner)

    def live_tasks_of(self, owner: str) -> list[TaskRecord]:
        return self._owner_tasks(self._live, owner)

    def _owner_tasks(self, index: dict[str, set[str]], owner: str) -> list[TaskRecord]:
        now = self._wall()
        with self._lock:
            records = [self._tasks[task_id] for task_id in index.get(owner, ())]
        return sorted((record for record in records if record.expires > now), key=lambda record: record.created)

    def asked(self, key: str) -> dict[str, Any] | None:
        kept = self._asked.get(key)
        return json.loads(json.dumps(kept[1])) if kept is not None and kept[0] > self._wall() else None

    def put_asked(self, key: str, questions: dict[str, Any], ttl: float) -> None:
        """Keep ``questions`` for ``ttl`` seconds; none (or no time): forget the key."""
        with self._lock:
            now = self._wall()
            for gone in [name for name, (expires, _) in self._asked.items() if expires <= now]:
                del self._asked[gone]
            if questions and ttl > 0:
                self._asked[key] = (now + ttl, json.loads(json.dumps(questions)))
            else:
                self._asked.pop(key, None)
