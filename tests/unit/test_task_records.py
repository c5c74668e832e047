"""Task records of the gateway's own tasks, and what ``CompositeTasks`` makes of them
without a run: a record round-trips through JSON, a terminal record never changes again,
the memory store forgets an expired one, and a live task whose runner is gone is written
``failed`` by its next reader (and no longer counts against the per-user cap)."""

from __future__ import annotations

import time

import pytest

from vmcp_actors.config import TasksConfig
from vmcp_actors.core._task_records import TaskRecord
from vmcp_actors.decorators._composite_tasks import RUNNER_GONE, CompositeTasks
from vmcp_actors.protocol import JsonRpcError
from vmcp_actors.users._store import MemoryRecordStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Signals:
    """Task signals where only ``living`` runners are alive, and nothing is delivered."""

    def __init__(self, runner_id: str = "here", living: tuple[str, ...] = ()) -> None:
        self.runner_id = runner_id
        self.living = set(living)
        self.sent: list[tuple[str, dict]] = []

    def start(self, receive) -> None:
        pass

    def send(self, runner: str, signal: dict) -> bool:
        self.sent.append((runner, signal))
        return True

    def alive(self, runner: str) -> bool:
        return runner in self.living

    def stop(self) -> None:
        pass


def record(task_id: str = "t1", runner: str = "elsewhere", **fields) -> TaskRecord:
    values = dict(task_id=task_id, owner="owner", user="alice", tool="careful_echo", runner=runner, status="working",
                  status_message="starting", created=1000.0, updated=1000.0, expires=5000.0, ttl_ms=60_000,
                  poll_interval_ms=1000)
    return TaskRecord(**{**values, **fields})


def test_a_record_round_trips_and_a_malformed_one_is_refused():
    asked = record(status="input_required", input_requests={"confirm": {"method": "elicitation/create", "params": {}}})
    assert TaskRecord.from_json(asked.to_json()) == asked
    for broken in ({**asked.to_json(), "status": "sleeping"}, {**asked.to_json(), "ttlMs": "60s"},
                   {**asked.to_json(), "result": []}, []):
        with pytest.raises(ValueError):
            TaskRecord.from_json(broken)


def test_each_revision_is_told_the_task_its_way():
    errored = record().ended("completed", "finished with an error", 1001.0,
                             result={"content": [], "isError": True})
    modern, legacy = errored.task("H", modern=True), errored.task("H", modern=False)
    assert modern["status"] == "completed" and modern["ttlMs"] == 60_000 and "ttl" not in modern
    assert legacy["status"] == "failed" and legacy["pollInterval"] == 1000 and "ttlMs" not in legacy
    assert modern["createdAt"] == "1970-01-01T00:16:40.000Z"
    assert errored.detailed("H")["result"] == {"content": [], "isError": True}


def test_a_terminal_record_never_changes_again():
    cancelled = record().ended("cancelled", "cancelled by the client", 1001.0)
    assert cancelled.ended("completed", "completed", 1002.0, result={"content": []}) is cancelled
    assert cancelled.progressed("running step 'x'", {}, 1002.0) is cancelled
    assert cancelled.expires == 1061.0  # kept for the TTL from its end


def test_the_memory_store_forgets_an_expired_task():
    clock = Clock()
    store = MemoryRecordStore(wall=clock)
    store.put_task(record(expires=1010.0))
    assert store.task("t1") is not None and [r.task_id for r in store.tasks_of("owner")] == ["t1"]
    clock.now = 1010.0
    assert store.task("t1") is None and store.tasks_of("owner") == []
    assert store.update_task("t1", lambda current: current) is None


def assert_live_tasks_are_indexed_apart(store) -> None:
    """A store's ``live_tasks_of`` lists an owner's tasks until they end, ``tasks_of`` all of
    them (any store: memory here, Redis in tests/integration/test_shared_sessions.py)."""
    for task_id, owner in (("t1", "owner"), ("t2", "owner"), ("t3", "other")):
        store.put_task(record(task_id, owner=owner, created=1000.0 + int(task_id[1]), expires=time.time() + 600))
    assert [r.task_id for r in store.live_tasks_of("owner")] == ["t1", "t2"]
    store.update_task("t1", lambda current: current.ended("completed", "completed", time.time(), result={"content": []}))
    store.update_task("t2", lambda current: current.progressed("running step 'x'", {}, time.time()))
    assert [r.task_id for r in store.live_tasks_of("owner")] == ["t2"]
    assert [r.task_id for r in store.tasks_of("owner")] == ["t1", "t2"]
    assert [r.task_id for r in store.live_tasks_of("other")] == ["t3"] and store.live_tasks_of("nobody") == []


def test_the_memory_store_indexes_live_tasks_apart_and_sweeps_expired_ones_from_every_index():
    assert_live_tasks_are_indexed_apart(MemoryRecordStore())
    clock = Clock()
    store = MemoryRecordStore(wall=clock)
    store.put_task(record("t1", expires=1010.0))
    store.put_task(record("t2", expires=1020.0))
    store.update_task("t1", lambda current: current.ended("failed", "failed", 1001.0))  # kept 60 s from its end
    clock.now = 1030.0  # t2 expired (never ended: its runner died unseen); t1 is kept until 1061
    assert [r.task_id for r in store.tasks_of("owner")] == ["t1"] and store.live_tasks_of("owner") == []
    store.put_task(record("t3", owner="other", expires=2000.0))  # a write sweeps what expired
    assert store.task("t2") is None and "t2" not in store._tasks
    clock.now = 1061.0
    store.put_task(record("t4", owner="other", expires=2000.0))
    assert set(store._tasks) == {"t3", "t4"} and set(store._owned) == set(store._live) == {"other"}


def test_the_memory_store_holds_asked_questions_for_their_time_and_forgets_answered_ones():
    clock = Clock()
    store = MemoryRecordStore(wall=clock)
    store.put_asked("k", {"request-1": {"id": 1, "request": {"method": "elicitation/create"}}}, 10)
    held = store.asked("k")
    assert held == {"request-1": {"id": 1, "request": {"method": "elicitation/create"}}}
    held["request-1"]["id"] = 2  # a copy: the store shares nothing mutable
    assert store.asked("k")["request-1"]["id"] == 1
    clock.now += 10
    assert store.asked("k") is None
    store.put_asked("k", {"request-1": {}}, 10)
    store.put_asked("k", {}, 10)  # nothing left to ask
    assert store.asked("k") is None


def test_a_task_whose_runner_is_gone_reads_as_failed_and_frees_its_place():
    clock = Clock()
    store = MemoryRecordStore(wall=clock)
    signals = Signals(living=("alive",))
    tasks = CompositeTasks(store, signals, TasksConfig(max_live_per_user=1), wall=clock)
    store.put_task(record("orphan", runner="dead"))
    store.put_task(record("busy", runner="alive"))
    assert tasks.get("owner", "busy").status == "working"
    failed = tasks.get("owner", "orphan")
    assert failed.status == "failed" and failed.error == {"code": -32603, "message": RUNNER_GONE}
    assert store.task("orphan") == failed  # written, so every worker reads the same
    with pytest.raises(JsonRpcError) as refused:  # "busy" holds the one place; "orphan" holds none
        tasks.begin("owner", "alice", "careful_echo", 60.0, None, lambda: lambda: None)
    assert refused.value.data == {"maxLiveTasks": 1}


def test_a_worker_holding_its_cap_of_runs_refuses_the_next_with_503_and_lets_its_user_go():
    store = MemoryRecordStore(wall=Clock())
    tasks = CompositeTasks(store, Signals(), TasksConfig(max_live_per_worker=2), wall=Clock())
    held, released = [], []

    def hold():
        held.append(1)
        return lambda: released.append(1)

    runs = [tasks.begin(f"owner-{n}", f"user-{n}", "careful_echo", 60.0, None, hold) for n in range(2)]
    with pytest.raises(JsonRpcError) as refused:  # another user: the cap is the worker's, not theirs
        tasks.begin("owner-9", "user-9", "careful_echo", 60.0, None, hold)
    assert refused.value.http_status == 503
    assert refused.value.data == {"maxLiveTasksPerWorker": 2, "retryAfterSeconds": 5}
    assert "runs as many tasks as it may (2)" in refused.value.message
    assert len(held) == 3 and len(released) == 1  # the refused call holds its user no longer
    assert tasks.live_count() == 2 and store.tasks_of("owner-9") == []  # nothing recorded for it
    tasks._forget(runs[0])  # a run ends: its place is free again
    tasks.begin("owner-9", "user-9", "careful_echo", 60.0, None, hold)
    assert tasks.live_count() == 2


def test_another_callers_task_and_an_unknown_one_are_the_same_refusal():
    store = MemoryRecordStore(wall=Clock())
    tasks = CompositeTasks(store, Signals(living=("elsewhere",)), TasksConfig(), wall=Clock())
    store.put_task(record())
    for owner, task_id in (("someone else", "t1"), ("owner", "nope")):
        with pytest.raises(JsonRpcError) as refused:
            tasks.get(owner, task_id)
        assert refused.value.code == -32602 and "Unknown task" in refused.value.message


def test_answers_go_to_the_runner_only_for_the_questions_it_waits_on():
    store = MemoryRecordStore(wall=Clock())
    signals = Signals(living=("elsewhere",))
    tasks = CompositeTasks(store, signals, TasksConfig(), wall=Clock())
    store.put_task(record(status="input_required", input_requests={"a": {}, "b": {}}))
    assert tasks.answer("owner", "t1", {"zzz": {"action": "accept"}}).status == "input_required"
    assert signals.sent == []  # nothing it waits on
    partly = tasks.answer("owner", "t1", {"a": {"action": "accept", "content": {}}, "zzz": {}})
    assert partly.status == "input_required" and set(partly.input_requests) == {"b"}
    assert signals.sent == [("elsewhere", {"op": "input", "task": "t1", "responses": {"a": {
        "action": "accept", "content": {}}}, "errors": {}})]
    assert tasks.answer("owner", "t1", {"b": {"action": "decline"}}).status == "working"


def test_the_tasks_settings_load_and_a_bad_one_names_its_field():
    from vmcp_actors.config._load import config_from_mapping
    from vmcp_actors.exceptions import ConfigError

    base = {"name": "t", "backends": [{"name": "b", "url": "http://127.0.0.1:1/mcp"}]}
    loaded = config_from_mapping({**base, "operational": {"tasks": {"resultTTL": "10m", "maxLivePerUser": 5,
                                                                     "maxLivePerWorker": 300, "pollInterval": "500ms"}}})
    assert loaded.operational.tasks == TasksConfig(result_ttl=600.0, max_live_per_user=5, max_live_per_worker=300,
                                                   poll_interval=0.5)
    assert config_from_mapping(base).operational.tasks == TasksConfig()
    with pytest.raises(ConfigError) as refused:
        config_from_mapping({**base, "operational": {"tasks": {"maxLivePerUser": 0, "resultTTL": "30d", "ttl": 1,
                                                                "maxLivePerWorker": 50_000}}})
    lines = "\n".join(refused.value.errors)
    for path in ("operational.tasks.maxLivePerUser", "operational.tasks.resultTTL", "operational.tasks.ttl",
                 "operational.tasks.maxLivePerWorker"):
        assert path in lines, lines


class AnotherWorkerWritesBetween(MemoryRecordStore):
    """Records shared with another worker, which writes a task of the same owner right
    after this worker's cap check read the owner's live tasks (both saw room)."""

    def __init__(self, wall) -> None:
        super().__init__(wall=wall)
        self.reads = 0

    def live_tasks_of(self, owner):
        self.reads += 1
        found = super().live_tasks_of(owner)
        if self.reads == 1:  # the other worker's task is created a moment before this one
            self.put_task(record("theirs", runner="alive", owner=owner, created=999.0))
        return found


def test_two_workers_checking_at_once_do_not_both_pass_the_per_user_cap():
    clock = Clock()
    store = AnotherWorkerWritesBetween(clock)
    tasks = CompositeTasks(store, Signals(living=("alive", "here")), TasksConfig(max_live_per_user=1), wall=clock)
    with pytest.raises(JsonRpcError) as refused:
        tasks.begin("owner", "alice", "careful_echo", 60.0, None, lambda: lambda: None)
    assert refused.value.data == {"maxLiveTasks": 1}
    assert [r.task_id for r in store.live_tasks_of("owner")] == ["theirs"]  # the earlier one runs, alone
    assert tasks.live_count() == 0
