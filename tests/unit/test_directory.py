"""The Directory's board: taking a session or user out is decided and done in one step
under its lock, and no store round trip is made while that lock is held."""

from __future__ import annotations

import pytest

from vmcp_actors.users._directory import Directory
from vmcp_actors.users._records import SessionRecord, UserKey
from vmcp_actors.users._store import MemoryRecordStore

TTL = 10.0
ALICE = UserKey("https://idp", "alice")
ANYONE = UserKey()  # every anonymous caller


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class LockWatchingStore(MemoryRecordStore):
    """Records in memory that note every call made while the directory's lock is held."""

    def __init__(self, shared: bool = False) -> None:
        super().__init__()
        self.shared = shared
        self.directory: Directory | None = None
        self.under_lock: list[str] = []

    def _watch(self, name: str) -> None:
        if self.directory is not None and self.directory._lock.locked():
            self.under_lock.append(name)

    def session(self, session_id):
        self._watch("session")
        return super().session(session_id)

    def put_session(self, record):
        self._watch("put_session")
        super().put_session(record)

    def delete_session(self, session_id):
        self._watch("delete_session")
        return super().delete_session(session_id)

    def sessions_of(self, key):
        self._watch("sessions_of")
        return super().sessions_of(key)

    def update_session(self, session_id, change):
        self._watch("update_session")
        super().update_session(session_id, change)


def _user(key: UserKey):
    """A stand-in for a live user's handle: the board only keeps and returns it."""
    from types import SimpleNamespace

    return SimpleNamespace(key=key)


def _open(directory: Directory, session_id: str, key: UserKey = ALICE) -> SessionRecord:
    record = SessionRecord(session_id, key, "2025-11-25", {}, created=1.0, last_used=1.0)
    directory.store.put_session(record)
    directory.add_session(record)
    return record


def test_reaping_a_sessionless_user_takes_it_out_so_a_request_after_finds_none():
    clock = Clock()
    directory = Directory(MemoryRecordStore(), clock)
    handle = _user(ALICE)
    directory.add_user(handle)
    directory.seen_sessionless(ALICE)
    clock.now += TTL
    reaped = directory.reap_sessionless_users(TTL)
    assert [(removed.key, removed.user) for removed in reaped] == [(ALICE, handle)]
    assert directory.hold_user(ALICE) is None  # the next request starts the user anew
    assert directory.reap_sessionless_users(TTL) == []


def test_a_sessionless_user_held_by_a_request_is_not_reaped_until_it_is_done():
    clock = Clock()
    directory = Directory(MemoryRecordStore(), clock)
    handle = _user(ALICE)
    directory.add_user(handle)
    directory.seen_sessionless(ALICE)
    assert directory.hold_user(ALICE) is handle
    clock.now += TTL
    assert directory.reap_sessionless_users(TTL) == []
    directory.finish("", ALICE)
    clock.now += TTL - 1
    assert directory.reap_sessionless_users(TTL) == []  # idle from the request's end
    clock.now += 1
    assert [removed.user for removed in directory.reap_sessionless_users(TTL)] == [handle]


def test_a_users_last_session_ending_leaves_it_while_a_request_or_a_sessionless_client_uses_it():
    clock = Clock()
    directory = Directory(MemoryRecordStore(), clock)
    handle = _user(ANYONE)
    directory.add_user(handle)
    _open(directory, "s1", ANYONE)
    assert directory.remove_unused_user(ANYONE) is None  # it has a session
    assert directory.hold_user(ANYONE) is handle  # a request in flight
    assert directory.remove_session("s1", None) is not None
    assert directory.remove_unused_user(ANYONE) is None  # the request still uses it
    directory.finish("", ANYONE)
    assert directory.reap_sessionless_users(TTL) == []
    clock.now += TTL  # no session, nothing in flight: the reaper ends it
    assert [removed.user for removed in directory.reap_sessionless_users(TTL)] == [handle]

    directory.add_user(handle)
    directory.seen_sessionless(ANYONE)  # served a 2026-07-28 request lately
    _open(directory, "s2", ANYONE)
    assert directory.remove_session("s2", None) is not None
    assert directory.remove_unused_user(ANYONE) is None
    assert directory.hold_user(ANYONE) is handle

    other = _user(ALICE)
    directory.add_user(other)  # a user nothing else uses ends with its last session
    removed = directory.remove_unused_user(ALICE)
    assert removed is not None and removed.user is other and directory.hold_user(ALICE) is None


@pytest.mark.parametrize("shared", [False, True])
def test_no_store_round_trip_is_made_under_the_directory_lock(shared):
    clock = Clock()
    store = LockWatchingStore(shared)
    directory = Directory(store, clock, wall=clock)
    store.directory = directory
    for session_id in ("s1", "s2", "s3", "s4"):
        _open(directory, session_id, ANYONE)
        clock.now += 1
    assert directory.begin("s1", None) is not None
    directory.finish("s1", None)
    assert directory.set_log_level("s1", "debug") == "debug"
    evicted = directory.evict_least_recently_used()
    assert evicted is not None and evicted.session_id == "s2"
    assert directory.begin("s2", None) is None  # gone from the board before its record goes
    assert directory.delete_record("s2") is not None
    assert directory.remove_session("s3", None) is not None
    clock.now += TTL
    assert sorted(record.session_id for record in directory.remove_idle_sessions(TTL)) == ["s1", "s4"]
    assert store.session("s1") is None and directory.session_count() == 0
    assert store.under_lock == []


class DeletedAfterTheFirstRead(MemoryRecordStore):
    """A shared store whose session is deleted by another process right after it is first read."""

    shared = True

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def session(self, session_id):
        self.reads += 1
        found = super().session(session_id)
        if self.reads == 1:
            self.delete_session(session_id)
        return found


def test_a_session_deleted_while_it_was_being_adopted_stays_deleted():
    store = DeletedAfterTheFirstRead()
    directory = Directory(store, Clock())
    store.put_session(SessionRecord("s1", ALICE, "2025-11-25", {}, created=1.0, last_used=1.0))
    identity = type("Caller", (), {"key": ("https://idp", "alice")})()
    assert directory.begin("s1", identity) is None  # the DELETE stands
    assert directory.session_count() == 0 and store.session("s1") is None
