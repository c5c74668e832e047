"""The authorization server's records (vmcp_actors.oauth._records), in memory and in a real
redis-server: the operations that must be atomic across workers are, expiry, encryption at
rest, and a Redis that is down."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis

from tests.gateway import wait_until
from tests.redis_server import RedisServer
from vmcp_actors.oauth._records import MemoryOAuthRecords, RedisOAuthRecords
from vmcp_actors.signing import Signer
from vmcp_actors.users._redis_store import RedisRecordStore
from vmcp_actors.users._store import StoreUnavailable

KEY = b"oauth-records-test-key-0123456789"
THREADS = 8


class Clock:
    """A clock the memory store reads, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def need_redis_server() -> None:
    if shutil.which("redis-server") is None and not os.path.exists("/usr/bin/redis-server"):
        pytest.fail("redis-server is not installed: run scripts/install-redis (the README's test set-up does)")


@pytest.fixture(scope="module")
def shared_redis():
    """One redis-server for the module's tests (each uses its own key prefix)."""
    need_redis_server()
    server = RedisServer().start()
    yield server
    server.close()


def redis_records(server: RedisServer, prefix: str, key: bytes = KEY) -> RedisOAuthRecords:
    # The client the gateway hands the records (runtime.build_oauth): the session store's, with its retry.
    store = RedisRecordStore.connect(server.address, 0, None, Signer(key), key_prefix=prefix, session_ttl=60)
    return RedisOAuthRecords(store.client, Signer(key), prefix)


def raw(server: RedisServer) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port)


@pytest.fixture(params=["memory", "redis"])
def records(request):
    if request.param == "memory":
        return MemoryOAuthRecords()
    return redis_records(request.getfixturevalue("shared_redis"), f"{request.node.name}:")


def all_at_once(work: Callable[[int], Any], threads: int = THREADS) -> list[Any]:
    """``work(i)`` from ``threads`` threads released together; their results in order."""
    barrier = threading.Barrier(threads)
    results: list[Any] = [None] * threads
    errors: list[BaseException] = []

    def run(index: int) -> None:
        barrier.wait(timeout=10)
        try:
            results[index] = work(index)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    started = [threading.Thread(target=run, args=(index,)) for index in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in started)
    assert errors == []
    return results


# --- both stores -----------------------------------------------------------------------------


def test_put_get_and_delete_a_record(records):
    assert records.get("code", "c1") is None
    records.put("code", "c1", {"client": "a", "scopes": ["x"]}, ttl=60)
    assert records.get("code", "c1") == {"client": "a", "scopes": ["x"]}
    assert records.get("consent", "c1") is None  # kinds do not share keys
    records.put("code", "c1", {"client": "b"}, ttl=60)  # put replaces
    assert records.get("code", "c1") == {"client": "b"}
    records.delete("code", "c1")
    assert records.get("code", "c1") is None
    records.delete("code", "c1")  # deleting what is gone is fine


def test_add_writes_only_when_absent(records):
    assert records.add("flow", "f1", {"n": 1}, ttl=60) is True
    assert records.add("flow", "f1", {"n": 2}, ttl=60) is False
    assert records.get("flow", "f1") == {"n": 1}


def test_of_many_adds_at_once_exactly_one_wins(records):
    won = all_at_once(lambda index: records.add("flow", "race", {"by": index}, ttl=60))
    assert won.count(True) == 1
    assert records.get("flow", "race") == {"by": won.index(True)}


def test_take_returns_the_record_once(records):
    records.put("code", "c1", {"client": "a"}, ttl=60)
    assert records.take("code", "c1") == {"client": "a"}
    assert records.take("code", "c1") is None
    assert records.get("code", "c1") is None


def test_a_code_taken_from_many_threads_at_once_is_given_to_one(records):
    # A code is used once, whichever worker redeems it first.
    for attempt in range(5):
        records.put("code", f"c{attempt}", {"attempt": attempt}, ttl=60)
        taken = all_at_once(lambda index, key=f"c{attempt}": records.take("code", key))
        assert [record for record in taken if record is not None] == [{"attempt": attempt}]


def test_update_replaces_deletes_and_leaves_absent_records_absent(records):
    records.put("grant", "g1", {"n": 1}, ttl=60)
    assert records.update("grant", "g1", lambda record: {**record, "n": record["n"] + 1}) == {"n": 2}
    assert records.get("grant", "g1") == {"n": 2}
    assert records.update("grant", "g1", lambda record: None) is None
    assert records.get("grant", "g1") is None
    called: list[dict] = []
    assert records.update("grant", "absent", lambda record: called.append(record) or record) is None
    assert called == [] and records.get("grant", "absent") is None


def test_concurrent_updates_lose_no_change(records):
    records.put("grant", "counter", {"n": 0}, ttl=60)
    per_thread = 20

    def increment(_: int) -> None:
        for _ in range(per_thread):
            records.update("grant", "counter", lambda record: {"n": record["n"] + 1})
    all_at_once(increment)
    assert records.get("grant", "counter") == {"n": THREADS * per_thread}


def test_keys_lists_the_keys_of_one_kind(records):
    records.put("grant", "g1", {}, ttl=60)
    records.put("grant", "g2", {}, ttl=60)
    records.put("refresh", "r1", {}, ttl=60)
    assert sorted(records.keys("grant")) == ["g1", "g2"]
    assert records.keys("refresh") == ["r1"]
    assert records.keys("code") == []


def test_keys_reads_a_key_prefix_with_glob_characters_literally(shared_redis):
    # keyPrefix is free text: "*" or "[" in it must neither hide this gateway's keys nor show another's.
    starred, other = redis_records(shared_redis, "gw[*]:"), redis_records(shared_redis, "gwx:")
    starred.put("grant", "mine", {}, ttl=60)
    other.put("grant", "theirs", {}, ttl=60)
    assert starred.keys("grant") == ["mine"]


def test_one_holder_at_a_time_and_only_the_holder_releases(records):
    holders = all_at_once(lambda _: records.acquire("upstream-refresh:g1", ttl=60))
    held = [holder for holder in holders if holder is not None]
    assert len(held) == 1
    records.release("upstream-refresh:g1", "not-the-holder")
    assert records.acquire("upstream-refresh:g1", ttl=60) is None  # still held
    assert records.acquire("upstream-refresh:g2", ttl=60) is not None  # another name is another lock
    records.release("upstream-refresh:g1", held[0])
    assert records.acquire("upstream-refresh:g1", ttl=60) is not None


def test_hit_counts_per_name_within_a_window(records):
    assert [records.hit("register:10.0.0.1", 60) for _ in range(3)] == [1, 2, 3]
    assert records.hit("register:10.0.0.2", 60) == 1
    # Hits at once each get their own count: none is lost, none counted twice.
    assert sorted(all_at_once(lambda _: records.hit("register:all", 60))) == list(range(1, THREADS + 1))


# --- expiry ------------------------------------------------------------------------------------


def test_memory_records_expire_with_their_ttl():
    clock = Clock()
    records = MemoryOAuthRecords(clock)
    records.put("code", "c1", {"a": 1}, ttl=60)
    records.put("code", "c2", {"a": 2}, ttl=120)
    clock.advance(59)
    assert records.get("code", "c1") == {"a": 1}
    clock.advance(1)
    assert records.get("code", "c1") is None and records.take("code", "c1") is None
    assert records.keys("code") == ["c2"]
    assert records.add("code", "c1", {"a": 3}, ttl=60) is True  # an expired record is absent to add
    assert records.update("code", "c2", lambda record: record) == {"a": 2}
    clock.advance(60)
    assert records.get("code", "c2") is None


def test_memory_update_keeps_the_expiry():
    clock = Clock()
    records = MemoryOAuthRecords(clock)
    records.put("grant", "g1", {"n": 1}, ttl=10)
    clock.advance(6)
    records.update("grant", "g1", lambda record: {"n": 2})
    clock.advance(5)  # 11 s after the put: gone, as if never updated (an update that renewed would keep it)
    assert records.get("grant", "g1") is None


def test_a_memory_lock_expires_and_a_counter_window_ends():
    clock = Clock()
    records = MemoryOAuthRecords(clock)
    assert records.acquire("l", ttl=30) is not None
    assert records.hit("h", 60) == 1 and records.hit("h", 60) == 2
    clock.advance(30)
    assert records.acquire("l", ttl=30) is not None  # a holder that died does not hold it for ever
    clock.advance(30)
    assert records.hit("h", 60) == 1


def test_redis_records_expire_with_their_ttl(shared_redis):
    records = redis_records(shared_redis, "expiry:")
    records.put("code", "c1", {"a": 1}, ttl=1.0)  # time is the behaviour under test
    records.put("code", "c2", {"a": 2}, ttl=60)
    assert records.get("code", "c1") == {"a": 1}
    assert wait_until(lambda: records.get("code", "c1") is None)
    assert records.get("code", "c2") == {"a": 2} and records.keys("code") == ["c2"]
    assert records.add("code", "c1", {"a": 3}, ttl=60) is True


def test_redis_update_keeps_the_ttl(shared_redis):
    records = redis_records(shared_redis, "keepttl:")
    records.put("grant", "g1", {"n": 1}, ttl=60)
    records.update("grant", "g1", lambda record: {"n": 2})
    assert 0 < raw(shared_redis).pttl("keepttl:oa:grant:g1") <= 60_000  # -1 would be: kept for ever


def test_a_redis_lock_expires_and_a_counter_window_ends(shared_redis):
    records = redis_records(shared_redis, "windows:")
    # Time is the behaviour under test: a lock and a window of a second.
    assert records.acquire("l", ttl=1.0) is not None
    assert records.acquire("l", ttl=1.0) is None
    assert wait_until(lambda: records.acquire("l", ttl=60) is not None)
    assert records.hit("h", 1.0) == 1 and records.hit("h", 1.0) == 2
    assert wait_until(lambda: records.hit("h", 1.0) == 1)  # a new window starts at one


# --- Redis: at rest and down -----------------------------------------------------------------


def test_redis_values_are_encrypted_under_their_named_keys(shared_redis):
    records = redis_records(shared_redis, "rest:")
    records.put("upstream", "g1", {"refresh_token": "plain-upstream-refresh-token"}, ttl=60)
    stored = raw(shared_redis).get("rest:oa:upstream:g1")
    assert stored is not None and b"plain-upstream-refresh-token" not in stored and b"refresh_token" not in stored
    assert records.get("upstream", "g1") == {"refresh_token": "plain-upstream-refresh-token"}


def test_a_redis_record_written_under_another_key_reads_as_absent(shared_redis):
    records = redis_records(shared_redis, "rekeyed:")
    records.put("grant", "g1", {"n": 1}, ttl=60)
    other = redis_records(shared_redis, "rekeyed:", key=b"another-operator-key-0123456789ab")
    assert other.get("grant", "g1") is None and other.take("grant", "g1") is None
    records.put("grant", "g2", {"n": 1}, ttl=60)
    assert other.update("grant", "g2", lambda record: {"n": 99}) is None
    assert records.get("grant", "g2") == {"n": 1}  # the update did not write over it


def test_a_redis_record_moved_to_another_kind_reads_as_absent(shared_redis):
    # Each kind has its own purpose: a code's record copied under a consent's key is not a consent.
    records = redis_records(shared_redis, "kinds:")
    records.put("code", "x", {"client": "a"}, ttl=60)
    client = raw(shared_redis)
    client.set("kinds:oa:consent:x", client.get("kinds:oa:code:x"))
    assert records.get("consent", "x") is None


def test_redis_down_is_store_unavailable_for_every_operation(redis_server):
    records = redis_records(redis_server, "down:")
    records.put("grant", "g1", {"n": 1}, ttl=60)
    redis_server.stop()
    operations = {
        "get": lambda: records.get("grant", "g1"),
        "put": lambda: records.put("grant", "g1", {}, 60),
        "add": lambda: records.add("grant", "g2", {}, 60),
        "take": lambda: records.take("grant", "g1"),
        "delete": lambda: records.delete("grant", "g1"),
        "update": lambda: records.update("grant", "g1", lambda record: record),
        "keys": lambda: records.keys("grant"),
        "acquire": lambda: records.acquire("l", 60),
        "release": lambda: records.release("l", "h"),
        "hit": lambda: records.hit("h", 60),
    }
    answered = []
    for name, operation in operations.items():
        try:
            operation()
        except StoreUnavailable as error:
            assert "Redis" in str(error)
        else:
            answered.append(name)
    assert answered == []
    redis_server.start()
    assert records.get("grant", "g1") is None  # the server started afresh; the store serves again
