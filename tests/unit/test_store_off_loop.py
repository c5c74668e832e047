"""No actor does store I/O on its message loop (DESIGN rule 2), and the suite proves it.

The guard: with the check on (``tests/conftest.py`` turns it on for every test), the record
stores and every Redis command refuse a thread that runs an actor's loop
(``StoreOnActorLoop``). The actors that did such I/O, each shown doing it no more: a
composite task's run (its record's progress and end), a composite step's rate-limit
decision, a user's read of the shared discovery cache, and the Gateway's admin overview
(session records). Each of those is watched by a store stand-in that notes the thread of
every call, so the test says what ran on a loop even where the guard's error is caught."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from typing import Any

import pykka
import pytest

from tests.gateway import wait_until
from vmcp_actors.backends import DiscoveredBackend
from vmcp_actors.concurrency import Deadline, resolved
from vmcp_actors.config import BackendConfig, RateLimitingConfig, TasksConfig, TokenBucket, ToolRateLimit, VmcpConfig
from vmcp_actors.core._catalog import InternalTool, Route
from vmcp_actors.decorators import CompositeTasks
from vmcp_actors.decorators._admission import StepAdmission
from vmcp_actors.limits import MemoryBuckets, RateLimiter
from vmcp_actors.users._store import MemoryRecordStore
from vmcp_actors.users._task_signals import LocalTaskSignals
from vmcp_actors.workflows import CompositeTool, Step
from vmcp_actors.workflows.engine import WorkflowRun

WAIT = 10.0  # every wait on it ends as soon as what it waits for happens
# pykka names a ThreadingActor's thread after its class ("WorkflowRun-3"): these are loops.
LOOPS = ("WorkflowRun", "UserActor", "Gateway")


@pytest.fixture(autouse=True)
def stop_actors():
    yield
    pykka.ActorRegistry.stop_all()


class CallsSeen:
    """A store, cache or set of buckets that notes the thread of every call it is given."""

    def __init__(self, inner: Any):
        self._inner = inner
        self.calls: list[tuple[str, str]] = []  # (method, thread name)
        self._lock = threading.Lock()  # guards calls

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if not callable(found):
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls.append((name, threading.current_thread().name))
            return found(*args, **kwargs)
        return call

    def on_loops(self) -> list[tuple[str, str]]:
        with self._lock:
            return [(name, thread) for name, thread in self.calls if thread.split("-")[0] in LOOPS]


def structured(value: dict[str, Any]) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": "ignored"}], "structuredContent": value}


# -- the guard ----------------------------------------------------------------------------


def test_a_record_store_call_on_an_actors_loop_is_refused():
    from vmcp_actors.concurrency import LoopActor, StoreOnActorLoop
    from vmcp_actors.pooled import PooledActor

    store = MemoryRecordStore()

    class Reader(LoopActor):
        def read(self) -> Any:
            return store.session("s")

    class PooledReader(PooledActor):
        def read(self) -> Any:
            return store.live_tasks_of("owner")

    for actor in (Reader, PooledReader):
        with pytest.raises(StoreOnActorLoop, match="message loop of .*Reader"):
            actor.start().proxy().read().get(timeout=WAIT)
    assert store.session("s") is None and store.live_tasks_of("owner") == []  # any other thread: as usual


def test_a_redis_command_on_an_actors_loop_is_refused_whoever_sends_it(redis_server):
    from vmcp_actors.concurrency import LoopActor, StoreOnActorLoop
    from vmcp_actors.signing import Signer
    from vmcp_actors.users._redis_store import RedisRecordStore

    store = RedisRecordStore.connect(redis_server.address, 0, None, Signer(b"k" * 32), key_prefix="t:",
                                     session_ttl=60)
    client = store.client  # what the shared caches, buckets, bulkheads, fanout and signals use

    class Sender(LoopActor):
        def get(self) -> Any:
            return client.get("t:x")

        def pipelined(self) -> Any:
            return client.pipeline().set("t:x", b"1").execute()

        def record(self) -> Any:
            return store.session("s")

    sender = Sender.start().proxy()
    for sent in (sender.get, sender.pipelined, sender.record):
        with pytest.raises(StoreOnActorLoop):
            sent().get(timeout=WAIT)
    assert client.get("t:x") is None and store.session("s") is None


def test_the_check_costs_nothing_unless_turned_on():
    from vmcp_actors.concurrency import LoopActor, check_store_calls

    store = MemoryRecordStore()

    class Reader(LoopActor):
        def read(self) -> Any:
            return store.session("s")

    check_store_calls(False)  # production's default
    try:
        assert Reader.start().proxy().read().get(timeout=WAIT) is None
    finally:
        check_store_calls(True)


def test_every_actor_of_the_gateway_marks_its_loop():
    """A new actor class is either a LoopActor (a thread of its own) or a PooledActor:
    otherwise its store calls would escape the check."""
    import vmcp_actors.runtime  # noqa: F401 - imports every actor class
    from vmcp_actors.concurrency import LoopActor
    from vmcp_actors.pooled import PooledActor

    def subclasses(cls: type) -> list[type]:
        return [cls, *(found for sub in cls.__subclasses__() for found in subclasses(sub))]

    ours = {cls for cls in subclasses(pykka.Actor) if cls.__module__.startswith("vmcp_actors.")}
    assert {"Gateway", "UserActor", "WorkflowRun", "BackendConnection", "HealthMonitor"} <= {c.__name__ for c in ours}
    assert [cls for cls in ours if not issubclass(cls, (LoopActor, PooledActor))] == []


# -- the actors that did store I/O on their loops -----------------------------------------


class TaskCaller:
    """What the composite layer gives a task's run: a step's question goes to the task's
    record (``CompositeTasks.ask``), a tool answers at once."""

    def __init__(self, tasks: CompositeTasks, run: Any):
        self._tasks = tasks
        self._run = run

    def input_schema(self, tool: str) -> None:
        return None

    def call(self, tool: str, arguments: dict[str, Any], deadline: Deadline) -> cf.Future[dict[str, Any]]:
        return resolved(structured(dict(arguments)))

    def elicit(self, step_id: str, message: str, requested_schema: Any, deadline: Deadline) -> cf.Future[Any]:
        return self._tasks.ask(self._run, step_id, {"method": "elicitation/create", "params": {
            "mode": "form", "message": message, "requestedSchema": dict(requested_schema)}})


CONFIRM = {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]}


def test_a_composite_task_records_its_progress_and_its_end_off_the_runs_loop():
    store = CallsSeen(MemoryRecordStore())
    tasks = CompositeTasks(store, LocalTaskSignals(), TasksConfig())
    run = tasks.begin("owner", "alice", "c", 30.0, None, lambda: lambda: None)
    tool = CompositeTool(name="c", description="test", parameters={"type": "object", "properties": {}}, steps=(
        Step("confirm", None, type="elicitation", message="Deploy?", elicitation_schema=CONFIRM),
        Step("deploy", "deploy", {"approved": "{{ steps.confirm.output.action }}"}, depends_on=("confirm",))))
    ref = WorkflowRun.start(tool, {}, TaskCaller(tasks, run), run_id="r", deadline=Deadline.after(30),
                            on_steps=lambda steps: tasks.progressed(run, steps))
    tasks.start(run, ref.proxy().result().get(timeout=WAIT), lambda: ref.stop(block=False))
    task_id = run.record.task_id

    # The question reaches the record (so any worker's tasks/get shows it), then the answer the run.
    asked = wait_until(lambda: store.task(task_id).input_requests, WAIT)
    assert asked["confirm"]["params"]["message"] == "Deploy?"
    tasks.answer("owner", task_id, {"confirm": {"action": "accept", "content": {"confirm": True}}})
    ended = wait_until(lambda: (record := store.task(task_id)).terminal and record, WAIT)
    assert ended.status == "completed" and ended.result["structuredContent"] == {"approved": "accept"}
    assert wait_until(lambda: tasks.live_count() == 0, WAIT)  # let go once its end is recorded
    assert tasks.ended_counts() == {("c", "completed"): 1}
    assert {"update_task"} <= {name for name, _ in store.calls}
    assert store.on_loops() == []


def test_a_task_end_the_store_refused_is_logged_and_written_again(caplog):
    from vmcp_actors.users._store import StoreUnavailable

    class Flaky(MemoryRecordStore):
        down = 1  # the end's first write finds Redis away

        def update_task(self, task_id: str, change: Any) -> Any:
            if self.down:
                self.down -= 1
                raise StoreUnavailable("session storage (Redis) cannot be reached: ConnectionError")
            return super().update_task(task_id, change)

    store = Flaky()
    tasks = CompositeTasks(store, LocalTaskSignals(), TasksConfig())
    run = tasks.begin("owner", "alice", "c", 30.0, None, lambda: lambda: None)
    outcome: cf.Future[Any] = cf.Future()
    tasks.start(run, outcome, lambda: None)  # settled by the test

    outcome.set_result(structured({"done": True}))

    assert run.ended.result(timeout=WAIT) == "completed"  # tried again, and written
    assert store.task(run.record.task_id).result["structuredContent"] == {"done": True}
    assert "its end not recorded (StoreUnavailable); trying again in 1s" in caplog.text
    assert tasks.live_count() == 0 and tasks.ended_counts() == {("c", "completed"): 1}


def test_a_composite_steps_rate_limit_is_decided_off_the_runs_loop():
    from vmcp_actors.decorators._composite import _StepCaller

    class Backends:
        def submit_route(self, identity: Any, route: Route, arguments: Any, deadline: Deadline) -> cf.Future[Any]:
            return resolved(structured({"called": route.original_name}))

    buckets = CallsSeen(MemoryBuckets())
    limiter = RateLimiter(RateLimitingConfig(tools=(ToolRateLimit("limited", shared=TokenBucket(1, 600)),)), buckets)
    targets = {"limited": InternalTool(Route("b", "limited", "limited"), {"inputSchema": {"type": "object"}},
                                       "limited")}
    caller = _StepCaller(Backends(), None, targets, {}, None, admission=StepAdmission(limiter=limiter))
    tool = CompositeTool(name="c", description="test", parameters={"type": "object", "properties": {}}, steps=(
        Step("one", "limited", {}), Step("two", "limited", {}, depends_on=("one",))))

    outcome = WorkflowRun.start(tool, {}, caller, run_id="r").proxy().result().get(timeout=WAIT).result(timeout=WAIT)

    # The first call spent the only token; the second was refused, as a failed step.
    assert outcome["isError"] and "step 'two' failed: Rate limit exceeded" in outcome["content"][0]["text"]
    assert [name for name, _ in buckets.calls] == ["decide", "decide"]
    assert buckets.on_loops() == []


def test_a_users_shared_discovery_cache_is_read_off_its_loop():
    from vmcp_actors.users._actor import SessionServices, start_user
    from vmcp_actors.users._discovery_cache import DiscoveryCache, capabilities_to_json
    from vmcp_actors.users._records import UserKey, UserRecord

    found = DiscoveredBackend("a", {"tools": {}}, tools=({"name": "hello", "inputSchema": {"type": "object"}},))

    class SharedLevel:  # another process discovered the catalog and shared it
        def get(self, namespace: str, key: Any) -> Any:
            return {"expires": time.time() + 60, "backends": {"a": capabilities_to_json(found)}}

        def put(self, namespace: str, key: Any, value: Any, ttl: float) -> None:
            pass

    shared = CallsSeen(SharedLevel())
    config = VmcpConfig(name="x", backends=(BackendConfig("a", "http://127.0.0.1:9/mcp"),))
    cache = DiscoveryCache(60, shared=shared, aggregation=config.aggregation)
    user = start_user(UserRecord(UserKey(), created=time.time()), None, config,
                      SessionServices(discovery_cache=cache), new=True)

    user.proxy.attach_session("s1", None).get(timeout=WAIT)
    catalog = user.proxy.catalog(None).get(timeout=WAIT).result(timeout=WAIT)

    assert [tool["name"] for tool in catalog.tools] == ["a_hello"]  # from the shared level: nothing discovered
    assert cache.stats()["sharedHits"] == 1
    assert user.proxy.snapshot().get(timeout=WAIT)["sessionCatalogFromCache"] == {"s1": True}
    assert shared.on_loops() == []


def test_the_admin_overview_reads_session_records_off_the_gateways_loop():
    from vmcp_actors.users._admin import collect_admin_state
    from vmcp_actors.users._directory import Directory
    from vmcp_actors.users._gateway import Gateway
    from vmcp_actors.users._actor import SessionServices
    from vmcp_actors.users._records import SessionRecord, UserKey

    store = CallsSeen(MemoryRecordStore())
    directory = Directory(store)
    gateway = Gateway.start(VmcpConfig(name="x", backends=()), directory, SessionServices(store=store)).proxy()
    record = SessionRecord("s1", UserKey.of(None, session="s1"), "2025-11-25", log_level="info", created=time.time())
    store.put_session(record)
    directory.add_session(record)

    state = collect_admin_state(gateway, store=store)

    assert [(row["id"], row["logLevel"]) for row in state["sessions"]] == [("s1", "info")]
    assert store.on_loops() == []
