"""Not in run_all: 1,000 live composite tasks (issue 24): what they cost the gateway worker
in threads and RSS, how fast they are created, whether ``tasks/get`` slows down with many
of them, and what a backend call in flight per task costs.

A composite tool called by a client that declares the tasks extension answers at once
with a task; the run goes on in a ``WorkflowRun`` actor (one thread each) until it ends.

* Two official-SDK backends, each in its own process (bench/_backend_server.py): ``plain``
  (``echo``, ``sleep``; ``--count``: the ``tools/call`` requests it has received, and
  those it is handling right now from ``/bench/open``, so "in flight at the backend" is
  what the backend saw, not what the gateway thinks) and
  ``probe`` (``echo``, for the probe below, so that only the tasks' calls reach ``plain``).
  ``operational.timeouts.perWorkload.plain: 5m``, so a 120 s sleep is not cut at the
  default 30 s.
* One gateway (``vmcp-actors serve``, one gunicorn worker, a subprocess): its threads and
  VmRSS from /proc/<worker pid>/task and /proc/<worker pid>/status; ``operational.tasks``
  ``maxLivePerUser: 2000``; ``/admin/state`` for its I/O pool (``workers``: pooled threads
  and the jobs queued for them).
* Composites: ``waiting`` (an elicitation step first: the task stays ``input_required``
  with nothing in flight), ``sleeping`` (one step calling ``plain_sleep(120)``: a backend
  call in flight for the whole measurement), ``echoing`` (one ``probe_echo`` step: the
  probe).
* Clients: 2026-07-28 requests declaring the tasks extension and elicitation
  (bench/tasks_get.py ``TaskClient``, one keep-alive connection each), ``--clients``
  threads creating and cancelling. All tasks belong to one (anonymous) user.
* Phases: warm-up (tools/list from every client at once, one probe; the pool's idle
  workers are let go, ``POOL_IDLE_EXIT``); one ``waiting`` task and
  ``tasks/get`` on it (1 live task); N-1 more, every one checked ``input_required``;
  ``tasks/get`` cycling over all N; the probe; every one cancelled (``tasks/cancel``, then
  each read back ``cancelled``) and the runs given time to stop; the same with N
  ``sleeping`` tasks (checked ``working``, running their step), plus the calls the
  backend holds and the pool's queue; the probe again after cancelling them. With
  ``--watch`` (default) the bench then waits until the first sleeps have had their
  ``--sleep`` seconds and counts the ``tools/call`` requests that reach the backend
  after every task was cancelled.
* The probe: an ``echoing`` task polled until it completes (at most ``PROBE_WAIT`` s,
  then cancelled), and a plain ``tools/call probe_echo`` (not a task) timed.
* Footprint points: before any task, with N of a kind live, after cancelling them, each
  with the I/O pool's worker count at that moment (pool workers come and go with pooled
  work; an idle one leaves after 10 s). Per live task: (live - before) / N, in total and
  without the pool's workers. ``tasks/get`` p50 with 1 live task vs with N live.
* Every answer is checked; all tasks are cancelled at the end; the gateway is stopped
  (its stop timed).

    PYTHONPATH=. .venv/bin/python -m bench.composite_tasks [--tasks 1000] [--clients 4] [--gets 300] [--sleep 120] [--no-watch]
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench._common import (
    Check,
    admin_config,
    admin_state,
    backend_counts,
    backend_open,
    backend_process,
    gateway,
    parse_args,
    percentile,
    print_header,
    raise_failures,
    record,
    run_benchmark,
    run_threads,
    table,
)
from bench.tasks_get import TaskClient
from bench.threads import Footprint, worker_pid

WATCHDOG = 600.0  # N x 2 tasks, and the wait for the first sleeps to end
PROBE_WAIT = 10.0  # seconds an echoing probe task may take before it counts as stuck
SETTLE_WAIT = 30.0  # seconds the runs get to stop after being cancelled
STATUS_WAIT = 60.0  # seconds the created tasks get to reach the status wanted
PID_MAX = 32768
LEFT_THREADS = 5  # the runs' threads are gone after a cancel; gunicorn's web threads vary by a few
POOL_IDLE_EXIT = 10.0  # vmcp_actors.concurrency.BoundedPool: an idle worker leaves after this


def composites(sleep: float) -> list[dict[str, Any]]:
    text_param = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    return [
        {"name": "waiting", "description": "asks, then echoes", "parameters": text_param,
         "steps": [
             {"id": "confirm", "type": "elicitation", "message": "Go on with {{ params.text }}?",
              "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
              "timeout": "10m"},
             {"id": "echo", "tool": "plain_echo", "dependsOn": ["confirm"],
              "arguments": {"text": "{{ params.text }}"}}],
         "timeout": "30m"},
        {"name": "sleeping", "description": f"sleeps {sleep:g} s at the backend",
         "steps": [{"id": "sleep", "tool": "plain_sleep", "arguments": {"seconds": sleep}, "timeout": "5m"}],
         "timeout": "30m"},
        {"name": "echoing", "description": "echoes (the probe)", "parameters": text_param,
         "steps": [{"id": "echo", "tool": "probe_echo", "arguments": {"text": "{{ params.text }}"}}],
         "timeout": "5m"},
    ]


# ----------------------------------------------------------------------------------
# Tasks
# ----------------------------------------------------------------------------------


def create(clients: Sequence[TaskClient], tool: str, first: int, count: int,
           arguments: Callable[[int], dict[str, Any]]) -> tuple[list[str], list[float], float]:
    """``count`` tasks of ``tool`` over the clients (task i by client i % len): (handles in
    order, each creation's seconds, wall seconds)."""
    handles: list[str | None] = [None] * count
    took: list[float] = [0.0] * count

    def work(index: int) -> None:
        for i in range(index, count, len(clients)):
            started = time.perf_counter()
            result = clients[index].rpc("tools/call", {"name": tool, "arguments": arguments(first + i)})
            took[i] = time.perf_counter() - started
            if result.get("resultType") != "task" or not isinstance(result.get("taskId"), str) \
                    or result.get("status") not in ("working", "input_required"):
                raise RuntimeError(f"{tool} #{first + i}: not a task: {result}")
            handles[i] = result["taskId"]

    started = time.perf_counter()
    raise_failures(run_threads(len(clients), work, timeout=300))
    wall = time.perf_counter() - started
    if len(set(handles)) != count:
        raise RuntimeError(f"{tool}: {len(set(handles))} distinct handles for {count} tasks")
    return [h for h in handles if h is not None], took, wall


def get(client: TaskClient, handle: str) -> dict[str, Any]:
    result = client.rpc("tasks/get", {"taskId": handle})
    if result.get("taskId") != handle or result.get("resultType") != "complete":
        raise RuntimeError(f"tasks/get: {result}")
    return result


def check_waiting(task: dict[str, Any]) -> None:
    asked = task.get("inputRequests") or {}
    if task.get("status") != "input_required" or "confirm" not in asked \
            or asked["confirm"].get("method") != "elicitation/create":
        raise RuntimeError(f"not waiting for the confirm step: {task}")


def check_sleeping(task: dict[str, Any]) -> None:
    if task.get("status") != "working" or "running step 'sleep'" not in task.get("statusMessage", ""):
        raise RuntimeError(f"not running its sleep step: {task}")


def check_cancelled(task: dict[str, Any]) -> None:
    if task.get("status") != "cancelled":
        raise RuntimeError(f"not cancelled: {task}")


def wait_all(client: TaskClient, handles: Sequence[str], check: Callable[[dict[str, Any]], None],
             timeout: float = STATUS_WAIT) -> float:
    """Until ``check`` passes for every task (each read until it does); seconds waited."""
    started = time.monotonic()
    for handle in handles:
        while True:
            task = get(client, handle)
            try:
                check(task)
                break
            except RuntimeError:
                if time.monotonic() - started > timeout or task.get("status") in ("completed", "failed", "cancelled"):
                    raise
                time.sleep(0.05)
    return time.monotonic() - started


def timed_gets(client: TaskClient, handles: Sequence[str], calls: int,
               check: Callable[[dict[str, Any]], None]) -> list[float]:
    """``calls`` tasks/get cycling over ``handles``, each checked; their seconds."""
    samples = []
    for i in range(calls):
        started = time.perf_counter()
        task = get(client, handles[i % len(handles)])
        samples.append(time.perf_counter() - started)
        check(task)
    return samples


def cancel_all(clients: Sequence[TaskClient], handles: Sequence[str]) -> float:
    """``tasks/cancel`` each (over the clients), then each read back ``cancelled``; wall seconds."""
    def work(index: int) -> None:
        for i in range(index, len(handles), len(clients)):
            result = clients[index].rpc("tasks/cancel", {"taskId": handles[i]})
            if result.get("resultType") != "complete":
                raise RuntimeError(f"tasks/cancel: {result}")
        for i in range(index, len(handles), len(clients)):
            check_cancelled(get(clients[index], handles[i]))

    started = time.perf_counter()
    raise_failures(run_threads(len(clients), work, timeout=300))
    return time.perf_counter() - started


def settle(pid: int, at_most: int, timeout: float = SETTLE_WAIT) -> tuple[Footprint, float]:
    """Wait (at most ``timeout``) until the worker has at most ``at_most`` threads."""
    started = time.monotonic()
    seen = Footprint.of(pid)
    while seen.threads > at_most and time.monotonic() - started < timeout:
        time.sleep(0.25)
        seen = Footprint.of(pid)
    time.sleep(0.5)  # whatever was still unwinding
    return Footprint.of(pid), time.monotonic() - started


# ----------------------------------------------------------------------------------
# The probe, the pool, the backend
# ----------------------------------------------------------------------------------


def probe(client: TaskClient, label: str) -> tuple[str, float | None, float]:
    """An ``echoing`` task polled until it completes (None: still not after PROBE_WAIT s,
    then cancelled), and a plain call of ``probe_echo``: (label, task seconds, call seconds)."""
    text = f"probe-{label}"
    started = time.perf_counter()
    created = client.rpc("tools/call", {"name": "echoing", "arguments": {"text": text}})
    handle = created.get("taskId")
    if created.get("resultType") != "task" or not isinstance(handle, str):
        raise RuntimeError(f"echoing: not a task: {created}")
    finished: float | None = None
    while time.perf_counter() - started < PROBE_WAIT:
        task = get(client, handle)
        if task["status"] == "completed":
            result = task.get("result", {})
            if (result.get("structuredContent") or {}).get("result") != f"probe:{text}" or result.get("isError"):
                raise RuntimeError(f"echoing completed with {task.get('result')}")
            finished = time.perf_counter() - started
            break
        if task["status"] != "working":
            raise RuntimeError(f"echoing: {task}")
        time.sleep(0.02)
    if finished is None:
        client.rpc("tasks/cancel", {"taskId": handle})
        check_cancelled(get(client, handle))
    started = time.perf_counter()
    result = client.rpc("tools/call", {"name": "probe_echo", "arguments": {"text": text}})
    call = time.perf_counter() - started
    if [part.get("text") for part in result.get("content", [])] != [f"probe:{text}"]:
        raise RuntimeError(f"probe_echo: {result}")
    return label, finished, call


def pool(gw: Any) -> dict[str, int]:
    """The gateway's I/O pool: {workers, maxWorkers, queued}."""
    return admin_state(gw)["workers"]


def backend_calls(backend: Any) -> dict[str, int]:
    """``tools/call`` requests at the backend: {"arrived": so far, "open": being handled now}."""
    arrived = sum(backend_counts(backend).get("POST", {}).get("tools/call", {}).values())
    return {"arrived": arrived, "open": backend_open(backend).get("POST", {}).get("tools/call", 0)}


def pool_drained(gw: Any, timeout: float = POOL_IDLE_EXIT + 5.0) -> dict[str, int]:
    """Wait until the pool's idle workers have left (they do after POOL_IDLE_EXIT s)."""
    deadline = time.monotonic() + timeout
    seen = pool(gw)
    while seen["workers"] and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = pool(gw)
    return seen


# ----------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------


def body(n: int, n_clients: int, gets: int, sleep: float, watch: bool) -> list[Check]:
    print_header("composite_tasks: N live composite tasks, the gateway worker's threads and RSS (issue 24)",
                 "gunicorn", [
                     ("backends: tests.backends SDK backends 'plain' (echo, sleep; bench/_backend_server.py --count) "
                      "and 'probe' (echo), each in its own process"),
                     f"composites: waiting (elicitation first), sleeping (plain_sleep {sleep:g} s), echoing (probe)",
                     (f"tasks: {n} waiting, then {n} sleeping, created by {n_clients} client threads "
                      "(2026-07-28, tasks extension), one anonymous user; operational.tasks.maxLivePerUser 2000"),
                     f"tasks/get: {gets} sequential calls with 1 live task and with {n} live tasks",
                 ])
    operational = {"tasks": {"resultTTL": "1h", "maxLivePerUser": 2000, "pollInterval": "1s"},
                   "timeouts": {"default": "30s", "perWorkload": {"plain": "5m"}}}
    points: list[tuple[str, Footprint, int, str]] = []  # (point, footprint, pool workers, note)
    probes: list[tuple[str, float | None, float]] = []
    pools: list[tuple[str, dict[str, int], dict[str, int]]] = []
    with contextlib.ExitStack() as stack:
        backend = stack.enter_context(backend_process("sdk", "plain", "echo", "sleep", count=True))
        prober = stack.enter_context(backend_process("sdk", "probe", "echo"))
        gw = stack.enter_context(gateway({"plain": backend.mcp_url, "probe": prober.mcp_url}, operational=operational,
                                         extra={"compositeTools": composites(sleep), **admin_config()}))
        pid = worker_pid(gw)
        clients = [TaskClient(gw.url) for _ in range(n_clients)]
        for client in clients:
            stack.callback(client.close)
        main = clients[0]

        def listed(index: int) -> set[str]:  # every client at once: the web threads they need exist
            return {tool["name"] for tool in clients[index].rpc("tools/list", {})["tools"]}

        lists = run_threads(n_clients, listed)
        raise_failures(lists)
        missing = {"waiting", "sleeping", "echoing", "plain_echo", "plain_sleep", "probe_echo"} - lists[0]
        if missing:
            raise RuntimeError(f"not advertised: {sorted(missing)}")
        probe(main, "warm-up")  # handshakes, catalog, connections
        probes.append(probe(main, "no task live"))
        pools.append(("no task live", pool_drained(gw), backend_calls(backend)))
        before = Footprint.of(pid)
        points.append(("before any task", before, pool(gw)["workers"], ""))

        # -- waiting ----------------------------------------------------------------------
        one, _, _ = create(clients[:1], "waiting", 0, 1, lambda i: {"text": f"t{i}"})
        wait_all(main, one, check_waiting)
        get_one = timed_gets(main, one, gets, check_waiting)
        rest, took_waiting, wall_waiting = create(clients, "waiting", 1, n - 1, lambda i: {"text": f"t{i}"})
        waiting = one + rest
        waited = wait_all(main, waiting, check_waiting)
        live_waiting = Footprint.of(pid)
        points.append((f"{n} waiting tasks live (input_required)", live_waiting, pool(gw)["workers"],
                       f"created in {wall_waiting:.1f} s; all input_required {waited:.1f} s later"))
        get_waiting = timed_gets(main, waiting, max(gets, n), check_waiting)
        probes.append(probe(main, f"{n} waiting live"))
        pools.append((f"{n} waiting live", pool(gw), backend_calls(backend)))
        cancel_wall = cancel_all(clients, waiting)
        after_waiting, settled = settle(pid, before.threads + pool(gw)["workers"] + 2)
        points.append((f"{n} waiting cancelled", after_waiting, pool(gw)["workers"],
                       f"cancelled and read back in {cancel_wall:.1f} s; threads down {settled:.1f} s later"))
        get_none = timed_gets(main, waiting, gets, check_cancelled)

        # -- sleeping ---------------------------------------------------------------------
        sleeping, took_sleeping, wall_sleeping = create(clients, "sleeping", 0, n, lambda i: {})
        first_sleep = time.monotonic()
        waited = wait_all(main, sleeping, check_sleeping)
        time.sleep(1.0)  # the pool's jobs reach the backend
        live_sleeping = Footprint.of(pid)
        in_flight = backend_calls(backend)
        pool_sleeping = pool(gw)
        points.append((f"{n} sleeping tasks live (running)", live_sleeping, pool_sleeping["workers"],
                       f"created in {wall_sleeping:.1f} s; all running {waited:.1f} s later"))
        pools.append((f"{n} sleeping live", pool_sleeping, in_flight))
        get_sleeping = timed_gets(main, sleeping, max(gets, n), check_sleeping)
        probe_sleeping = probe(main, f"{n} sleeping live")
        probes.append(probe_sleeping)
        cancel_wall = cancel_all(clients, sleeping)
        cancelled_at = backend_calls(backend)
        after_sleeping, settled = settle(pid, before.threads + pool_sleeping["maxWorkers"] + 2)
        points.append((f"{n} sleeping cancelled", after_sleeping, pool(gw)["workers"],
                       f"cancelled and read back in {cancel_wall:.1f} s; threads down {settled:.1f} s later"))
        pools.append((f"{n} sleeping cancelled", pool(gw), cancelled_at))
        probes.append(probe(main, f"{n} sleeping cancelled"))
        sent_after_cancel: int | None = None
        if watch:
            # The first sleeps end `sleep` s after they started; do the calls of cancelled
            # tasks that were queued in the pool go out to the backend then?
            time.sleep(max(0.0, first_sleep + sleep + 5.0 - time.monotonic()))
            later = backend_calls(backend)
            sent_after_cancel = later["arrived"] - cancelled_at["arrived"]
            pools.append((f"{sleep:g} s after the first sleeps began (all cancelled)", pool(gw), later))
            probes.append(probe(main, f"{sleep:g} s after the first sleeps began"))
        for handle in (waiting[0], waiting[-1], sleeping[0], sleeping[-1]):
            check_cancelled(get(main, handle))
        stop_started = time.perf_counter()
        stack.pop_all().close()  # clients, gateway (SIGTERM, waited for), backend
        stopped = time.perf_counter() - stop_started

    # -- report --------------------------------------------------------------------------
    print("gateway worker (gunicorn, 1 worker)")
    print(table(["point", "threads", "of which I/O pool", "RSS", "note"],
                [(p, f.threads, workers, f"{f.rss_mib:.1f} MiB", note) for p, f, workers, note in points]))
    print()
    pool_at = {p: workers for p, _, workers, _ in points}
    base_pool = pool_at["before any task"]

    def threads_per(live: Footprint, workers: int) -> tuple[float, float]:
        """(threads per task, the same without the pool's workers)."""
        return (live.threads - before.threads) / n, (live.threads - workers - before.threads + base_pool) / n

    rows = []
    for (point, live, workers, _), (_, after, after_workers, _) in ((points[1], points[2]), (points[3], points[4])):
        threads, own = threads_per(live, workers)
        left = (after.threads - after_workers) - (before.threads - base_pool)
        rows.append((point, f"{threads:.3f}", f"{own:.3f}", f"{(live.rss_kib - before.rss_kib) / n:.0f} KiB",
                     f"{left:+d}", f"{(after.rss_kib - before.rss_kib) / 1024:+.1f} MiB"))
    print(f"per live task ((live - before) / {n})")
    print(table(["point", "threads per task", "without the pool's", "RSS per task",
                 "threads left after cancel (without the pool's)", "RSS left after cancel"], rows))
    print()

    def rate(took: list[float], wall: float, count: int) -> tuple[str, str, str, str]:
        tenth = max(1, len(took) // 10)
        return (f"{count / wall:.0f}/s", f"{percentile([t * 1000 for t in took], 50):.1f} ms",
                f"{percentile([t * 1000 for t in took[:tenth]], 50):.1f} ms",
                f"{percentile([t * 1000 for t in took[-tenth:]], 50):.1f} ms")

    print(f"creation ({n_clients} client threads)")
    print(table(["kind", "rate", "p50", "p50, first tenth", "p50, last tenth"], [
        ("waiting (tasks 2..N)", *rate(took_waiting, wall_waiting, n - 1)),
        ("sleeping", *rate(took_sleeping, wall_sleeping, n)),
    ]))
    print()

    def ms(samples: list[float], p: float) -> float:
        return percentile([s * 1000 for s in samples], p)

    gets_rows = [("1 live task (waiting)", len(get_one), get_one),
                 (f"{n} live tasks (waiting)", len(get_waiting), get_waiting),
                 (f"0 live, {n} cancelled records", len(get_none), get_none),
                 (f"{n} live tasks (sleeping)", len(get_sleeping), get_sleeping)]
    print("tasks/get, sequential, one client")
    print(table(["live tasks", "calls", "p50", "p90", "ratio p50 to 1 live"],
                [(label, count, f"{ms(s, 50):.2f} ms", f"{ms(s, 90):.2f} ms", f"{ms(s, 50) / ms(get_one, 50):.2f}")
                 for label, count, s in gets_rows]))
    print()
    print("the gateway's I/O pool (/admin/state workers) and the tools/call requests at the backend 'plain'")
    print(table(["point", "pool workers", "jobs queued", "backend: calls being handled", "backend: calls arrived"],
                [(label, f"{p['workers']} of {p['maxWorkers']}", p["queued"], c["open"], c["arrived"])
                 for label, p, c in pools]))
    print()
    print(f"probe: an echoing task (given {PROBE_WAIT:g} s) and a plain tools/call probe_echo")
    print(table(["point", "echoing task completes in", "probe_echo call"],
                [(label, f"{t * 1000:.0f} ms" if t is not None else f"not within {PROBE_WAIT:g} s (cancelled)",
                  f"{c * 1000:.1f} ms") for label, t, c in probes]))
    print()
    if sent_after_cancel is not None:
        print(f"tools/call requests reaching the backend after every task was cancelled: {sent_after_cancel}")
    per_waiting = threads_per(live_waiting, pool_at[points[1][0]])[1]
    budget = PID_MAX / max(per_waiting, 1e-9)
    print(f"pid budget: kernel.pid_max {PID_MAX}: at {per_waiting:.3f} threads per live task, "
          f"at most ~{budget:,.0f} live tasks on the whole machine (every other thread counted against it too)")
    print(f"gateway stopped (SIGTERM to exit) in {stopped:.1f} s; all {2 * n} tasks cancelled and read back cancelled")

    threads_waiting = threads_per(live_waiting, pool_at[points[1][0]])[0]
    threads_sleeping = threads_per(live_sleeping, pool_at[points[3][0]])[0]
    kib_waiting = (live_waiting.rss_kib - before.rss_kib) / n
    kib_sleeping = (live_sleeping.rss_kib - before.rss_kib) / n
    left_waiting = (after_waiting.threads - pool_at[points[2][0]]) - (before.threads - base_pool)
    p50_ratio = ms(get_waiting, 50) / ms(get_one, 50)
    for name, value in (("threads per waiting task", threads_waiting), ("KiB per waiting task", kib_waiting),
                        ("threads per sleeping task", threads_sleeping), ("KiB per sleeping task", kib_sleeping),
                        ("tasks/get p50 ratio N live / 1 live", p50_ratio),
                        ("waiting created per s", (n - 1) / wall_waiting)):
        record(name, round(value, 3))
    in_flight_calls = in_flight["open"]
    stuck = probe_sleeping[1] is None
    return [
        Check(f"tasks/get p50, {n} live / 1 live", f"{p50_ratio:.2f}", "<= 1.25 (a record lookup)", p50_ratio <= 1.25),
        Check(f"threads left after cancelling {n} waiting tasks (without the pool's)", f"{left_waiting:+d}",
              f"<= +{LEFT_THREADS} (web threads vary)", left_waiting <= LEFT_THREADS),
        Check(f"sleeps in flight at the backend, {n} sleeping tasks", str(in_flight_calls),
              f"{n} (one per task)", in_flight_calls == n),
        Check("echoing probe completes while sleeping tasks are live", "no" if stuck else "yes", "yes", not stuck),
        *([Check("tools/call sent to the backend after all tasks were cancelled", str(sent_after_cancel), "0",
                 sent_after_cancel == 0)] if sent_after_cancel is not None else []),
    ]


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--tasks", type=int, default=1000, help="tasks of each kind (default 1000)")
        parser.add_argument("--clients", type=int, default=4, help="client threads creating and cancelling")
        parser.add_argument("--gets", type=int, default=300, help="sequential tasks/get calls per point (at least N)")
        parser.add_argument("--sleep", type=float, default=120.0, help="seconds each sleeping task's step sleeps")
        parser.add_argument("--no-watch", dest="watch", action="store_false",
                            help="do not wait for the first sleeps to end (what reaches the backend after cancel)")

    args = parse_args(__doc__.splitlines()[0], extra=extra,
                      gunicorn_only="bench.composite_tasks reads the gunicorn worker's /proc")
    if args.tasks < 2:
        raise SystemExit("--tasks: at least 2")
    run_benchmark(lambda: body(args.tasks, args.clients, args.gets, args.sleep, args.watch), watchdog=WATCHDOG)


if __name__ == "__main__":
    main()
