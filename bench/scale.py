"""Scale (issue 13): many sessions and users, many concurrent callers, and two gateway
processes sharing their records through Redis. Three parts, each against a gunicorn
gateway in its own process, backends each in their own process:

* S1 ``sessions``: 10,000 sessions of 1,000 distinct OIDC users (tests.idp.LocalIdP, one
  token per user) over 5 raw backends (tests.backends.delayed_backend(0)); each session
  calls every backend once and stays open. The worker's threads are sampled throughout
  (peak), then measured once the users have been idle past ``userIdleTimeout`` (2 s) and
  released; then every one of the 1,000 users calls all 5 backends again on one of its
  sessions (revived from the records), and every call must succeed.
* S2 ``throughput``: 1,000 client threads, each with its own MCP session and keep-alive
  connection, calling the echo tool of 5 official-SDK backends in turn as fast as they are
  answered, for a fixed time per round; the same 1,000 clients call the backends directly
  (each with its own backend session per backend) in the other rounds (direct, gateway,
  gateway, direct). Throughput through the gateway over throughput directly.
* S3 ``processes``: two gateway processes sharing ``sessionStorage: redis`` (a real
  redis-server on loopback) and a client whose every request goes to the other process
  than the one before, against one gateway process with the default in-memory records;
  one official-SDK backend; calls rotate over direct, one process, two processes call by
  call. p50 overhead per call of each gateway mode over direct.

    .venv/bin/python -m bench.scale [--part sessions,throughput,processes] [--sessions 10000] [--users 1000]
                                    [--clients 1000] [--seconds 6] [--calls 400]
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from bench._common import (
    Check,
    McpClient,
    Stats,
    backend_process,
    gateway,
    parse_args,
    print_header,
    record,
    run_benchmark,
    table,
)
from bench.threads import (
    Footprint,
    call_every_tool,
    per_thread_http,
    row,
    wait_for_release,
    worker_pid,
)

BACKENDS = 5
AUDIENCE = "vmcp"
IDLE_RELEASE = 2.0  # operational.userIdleTimeout in S1
RELEASE_GRACE = 20.0
TARGET_S1_THREADS = 300
TARGET_S1_RSS_MIB = 500
TARGET_S2_RATIO = 0.60
TARGET_S3_MS = 1.0
WATCHDOG = 1500.0  # S1 at full size sends 70,000 requests: minutes on 2 cores


def _sample_peak(pid: int, stop: threading.Event, peak: list[int]) -> None:
    while not stop.wait(0.2):
        with contextlib.suppress(OSError):
            peak[0] = max(peak[0], Footprint.of(pid).threads)


@contextlib.contextmanager
def peak_threads(pid: int):
    """Samples the worker's thread count every 0.2 s while the block runs; yields [peak]."""
    peak, stop = [0], threading.Event()
    sampler = threading.Thread(target=_sample_peak, args=(pid, stop, peak), daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        stop.set()
        sampler.join(5)


# ----------------------------------------------------------------------------------
# S1: 10,000 sessions of 1,000 users, idle release, everyone back
# ----------------------------------------------------------------------------------


def s1(sessions: int, users: int, pool: int) -> list[Check]:
    from tests.idp import LocalIdP

    with contextlib.ExitStack() as stack:
        served = [stack.enter_context(backend_process("raw", f"b{i}")) for i in range(BACKENDS)]
        backends = {b.name: b.mcp_url for b in served}
        tools = [f"{name}_echo" for name in backends]
        idp = stack.enter_context(LocalIdP("bench-idp"))
        tokens = [idp.issue_token(f"bench-user-{i:04d}", AUDIENCE, expires_in=1800) for i in range(users)]
        operational = {"userIdleTimeout": f"{IDLE_RELEASE:g}s", "maxSessions": max(sessions, 1000),
                       "sessionTTL": "30m"}
        gw = stack.enter_context(gateway(backends, operational=operational, extra={
            "incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUDIENCE}}}))
        pid = worker_pid(gw)
        started = Footprint.of(pid)
        http, made = per_thread_http()
        # Session i belongs to user i % users: each user's sessions are spread over the run.
        session_ids: list[str | None] = [None] * sessions

        def open_one(index: int) -> None:
            client = McpClient(gw.url, http=http(), headers={"Authorization": f"Bearer {tokens[index % users]}"})
            session_ids[index] = client.initialize()
            call_every_tool(client, tools, f"s{index}")

        with peak_threads(pid) as peak:
            begun = time.perf_counter()
            with ThreadPoolExecutor(pool, thread_name_prefix="bench-open") as executor:
                list(executor.map(open_one, range(sessions)))
            took = time.perf_counter() - begun
            opened = Footprint.of(pid)
            last_request = time.monotonic()
            released, waited = wait_for_release(pid, last_request, IDLE_RELEASE, TARGET_S1_THREADS, RELEASE_GRACE)
            failures: list[str] = []

            def again(user: int) -> None:
                client = McpClient(gw.url, http=http(), session_id=session_ids[user],
                                   headers={"Authorization": f"Bearer {tokens[user]}"})
                try:
                    call_every_tool(client, tools, f"again{user}")
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    failures.append(f"user {user}: {exc!r}")

            begun = time.perf_counter()
            with ThreadPoolExecutor(pool, thread_name_prefix="bench-again") as executor:
                list(executor.map(again, range(users)))
            again_took = time.perf_counter() - begun
            back = Footprint.of(pid)
        for session in made:
            session.close()
    if len(set(session_ids)) != sessions:
        raise RuntimeError(f"expected {sessions} distinct session ids, got {len(set(session_ids))}")
    print(f"S1: {sessions} sessions of {users} OIDC users over {BACKENDS} backends, each session calling every "
          f"backend once; userIdleTimeout {IDLE_RELEASE:g}s, maxLiveUsers 500 (default)")
    print(table(["point", "gateway threads", "RSS", "note"], [
        row("after start", started),
        row(f"after {sessions} sessions opened and called", opened,
            f"{sessions * (2 + len(tools))} requests in {took:.1f} s ({sessions * (2 + len(tools)) / took:.0f}/s)"),
        ("peak while opening", str(peak[0]), "", "sampled every 0.2 s"),
        row("after the idle release", released, f"{waited:.1f} s after the last request"),
        row(f"after {users} users called every backend again", back,
            f"{users * len(tools)} calls in {again_took:.1f} s; {len(failures)} failed"),
    ]))
    if failures:
        print("first failures:", *failures[:5], sep="\n  ")
    print()
    released.record("S1 after the idle release")
    record("S1 peak threads", peak[0])
    return [
        Check(f"S1: threads after the idle release ({sessions} sessions, {users} users)", str(released.threads),
              f"< {TARGET_S1_THREADS}", released.threads < TARGET_S1_THREADS),
        Check("S1: RSS after the idle release", f"{released.rss_mib:.0f} MiB", f"< {TARGET_S1_RSS_MIB} MiB",
              released.rss_mib < TARGET_S1_RSS_MIB),
        Check(f"S1: {users} users calling again all succeed", f"{users - len(failures)} of {users}",
              f"{users} of {users}", not failures),
    ]


# ----------------------------------------------------------------------------------
# S2: 1,000 concurrent sessions, gateway throughput over direct
# ----------------------------------------------------------------------------------


def s2(clients: int, seconds: float) -> list[Check]:
    with contextlib.ExitStack() as stack:
        served = [stack.enter_context(backend_process("sdk", f"b{i}", "echo")) for i in range(BACKENDS)]
        gw = stack.enter_context(gateway({b.name: b.mcp_url for b in served},
                                         operational={"maxSessions": max(2 * clients, 1000)}))
        # Each client thread: one MCP session on the gateway, one on each backend.
        through = [McpClient(gw.url) for _ in range(clients)]
        direct = [[McpClient(b.mcp_url, http=through_client.http) for b in served] for through_client in through]
        stack.callback(lambda: [c.close() for c in through])
        with ThreadPoolExecutor(32, thread_name_prefix="bench-open") as executor:
            list(executor.map(lambda c: c.initialize(), through))
            list(executor.map(lambda c: c.initialize(), itertools.chain.from_iterable(direct)))
        gateway_tools = [f"{b.name}_echo" for b in served]
        modes = ("direct", "gateway", "gateway", "direct")
        counts = {"direct": 0, "gateway": 0}
        walls = {"direct": 0.0, "gateway": 0.0}
        latencies: dict[str, list[float]] = {"direct": [], "gateway": []}
        errors: list[str] = []
        for mode in modes:
            stop_at = [0.0]
            done = [0] * clients
            samples: list[list[float]] = [[] for _ in range(clients)]
            barrier = threading.Barrier(clients + 1)

            def work(index: int, mode: str = mode) -> None:
                barrier.wait(60)
                for turn in itertools.count(index):
                    if time.monotonic() >= stop_at[0]:
                        return
                    backend = turn % BACKENDS
                    client = direct[index][backend] if mode == "direct" else through[index]
                    tool = "echo" if mode == "direct" else gateway_tools[backend]
                    text = f"{index}-{turn}"
                    begun = time.perf_counter()
                    try:
                        answer = client.call_tool(tool, {"text": text}, timeout=60)["content"][0]["text"]
                        if not answer.endswith(f":{text}"):
                            raise RuntimeError(f"unexpected answer {answer!r}")
                    except Exception as exc:  # noqa: BLE001 - counted and reported
                        errors.append(f"{mode}: {exc!r}")
                        return
                    if time.monotonic() <= stop_at[0]:  # a call still in flight at the end does not count
                        samples[index].append(time.perf_counter() - begun)
                        done[index] += 1

            threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(clients)]
            for thread in threads:
                thread.start()
            stop_at[0] = time.monotonic() + 3600  # set for real once everyone waits at the barrier
            barrier.wait(60)
            begun = time.monotonic()
            stop_at[0] = begun + seconds
            for thread in threads:
                thread.join(120)
            walls[mode] += seconds
            counts[mode] += sum(done)
            for each in samples:
                latencies[mode].extend(each)
    rate = {mode: counts[mode] / walls[mode] for mode in counts}
    stats = {mode: Stats.of(latencies[mode]) for mode in latencies}
    ratio = rate["gateway"] / rate["direct"]
    print(f"S2: {clients} sessions calling concurrently over {BACKENDS} official-SDK backends, "
          f"{len(modes)} rounds of {seconds:g} s ({', '.join(modes)})")
    print(table(["mode", "calls", "throughput", "p50", "p99"], [
        (mode, str(counts[mode]), f"{rate[mode]:.0f} calls/s", f"{stats[mode].p50:.1f} ms",
         f"{stats[mode].p99:.1f} ms") for mode in counts] + [("gateway / direct", "", f"ratio {ratio:.2f}", "", "")]))
    if errors:
        print(f"{len(errors)} failed calls; first:", *errors[:3], sep="\n  ")
    print()
    record("S2 throughput ratio", round(ratio, 3))
    return [Check(f"S2: throughput gateway / direct, {clients} concurrent sessions", f"{ratio:.2f}",
                  f">= {TARGET_S2_RATIO:g}", ratio >= TARGET_S2_RATIO and not errors),
            Check("S2: failed calls", str(len(errors)), "0", not errors)]


# ----------------------------------------------------------------------------------
# S3: two processes sharing Redis, a client alternating between them
# ----------------------------------------------------------------------------------


def s3(calls: int) -> list[Check]:
    from tests.redis_server import RedisServer

    with contextlib.ExitStack() as stack:
        redis = RedisServer().start()
        stack.callback(redis.close)
        os.environ.setdefault("VMCP_BENCH_SIGNING_KEY", secrets.token_urlsafe(32))
        shared = {"sessionStorage": {"provider": "redis", "address": redis.address, "keyPrefix": "bench:"}}
        signing = {"signingKeyEnv": "VMCP_BENCH_SIGNING_KEY"}
        backend = stack.enter_context(backend_process("sdk", "echo", "echo"))
        backends = {"echo": backend.mcp_url}
        one = stack.enter_context(gateway(backends))
        first = stack.enter_context(gateway(backends, operational=signing, extra=shared))
        second = stack.enter_context(gateway(backends, operational=signing, extra=shared))
        direct_client = stack.enter_context(McpClient(backend.mcp_url))
        one_client = stack.enter_context(McpClient(one.url))
        on_first = stack.enter_context(McpClient(first.url))
        for client in (direct_client, one_client, on_first):
            client.initialize()
        # The same session (and id counter) on the other process, each with its own connection.
        on_second = McpClient(second.url, session_id=on_first.session_id, ids=on_first._ids)
        stack.callback(on_second.close)
        alternating = itertools.cycle((on_second, on_first))
        modes: dict[str, Callable[[], McpClient]] = {
            "direct": lambda: direct_client,
            "one process": lambda: one_client,
            "two processes, alternating": lambda: next(alternating),
        }
        tools = {"direct": "echo", "one process": "echo_echo", "two processes, alternating": "echo_echo"}
        samples: dict[str, list[float]] = {mode: [] for mode in modes}
        for i in range(calls + 20):
            for mode in (modes if i % 2 == 0 else reversed(list(modes))):
                client = modes[mode]()
                text = f"c{i}"
                begun = time.perf_counter()
                answer = client.call_tool(tools[mode], {"text": text})["content"][0]["text"]
                took = time.perf_counter() - begun
                if answer != f"echo:{text}":
                    raise RuntimeError(f"{mode}: unexpected answer {answer!r}")
                if i >= 20:  # after a warm-up
                    samples[mode].append(took)
    stats = {mode: Stats.of(values) for mode, values in samples.items()}
    overhead = {mode: stats[mode].p50 - stats["direct"].p50 for mode in modes if mode != "direct"}
    extra = overhead["two processes, alternating"] - overhead["one process"]
    print(f"S3: one session, {calls} calls per mode, rotating call by call; two gateway processes share "
          "sessionStorage: redis (the client alternates on every request); one process: memory records")
    print(table(["mode", "p50", "p99", "p50 overhead over direct"], [
        (mode, f"{stats[mode].p50:.2f} ms", f"{stats[mode].p99:.2f} ms",
         f"{overhead[mode]:+.2f} ms" if mode in overhead else "") for mode in modes]
        + [("two processes - one process", "", "", f"{extra:+.2f} ms")]))
    print()
    record("S3 two processes minus one, p50 ms", round(extra, 3))
    return [Check("S3: p50 overhead, two processes alternating minus one process", f"{extra:.2f} ms",
                  f"<= {TARGET_S3_MS:g} ms", extra <= TARGET_S3_MS)]


PARTS = ("sessions", "throughput", "processes")


def body(parts: Sequence[str], sessions: int, users: int, pool: int, clients: int, seconds: float,
         calls: int) -> list[Check]:
    print_header("scale: many sessions and users, concurrent callers, two processes (issue 13)", "gunicorn", [
        f"parts: {', '.join(parts)}",
        f"S1: {sessions} sessions of {users} OIDC users, {pool} client threads opening them",
        f"S2: {clients} concurrent client sessions, {seconds:g} s per round",
        f"S3: {calls} calls per mode",
    ])
    checks: list[Check] = []
    if "sessions" in parts:
        checks += s1(sessions, users, pool)
    if "throughput" in parts:
        checks += s2(clients, seconds)
    if "processes" in parts:
        checks += s3(calls)
    return checks


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--sessions", type=int, default=10_000, help="S1: sessions (default 10000)")
        parser.add_argument("--users", type=int, default=1000, help="S1: distinct OIDC users (default 1000)")
        parser.add_argument("--pool", type=int, default=16, help="S1: client threads (default 16)")
        parser.add_argument("--clients", type=int, default=1000, help="S2: concurrent sessions (default 1000)")
        parser.add_argument("--seconds", type=float, default=6.0, help="S2: seconds per round (default 6)")
        parser.add_argument("--calls", type=int, default=400, help="S3: calls per mode (default 400)")

    args = parse_args(__doc__.splitlines()[0], extra=extra, parts=PARTS,
                      gunicorn_only="bench.scale measures gunicorn workers")
    parts = args.parts
    run_benchmark(lambda: body(parts, args.sessions, args.users, args.pool, args.clients, args.seconds, args.calls),
                  watchdog=WATCHDOG)


if __name__ == "__main__":
    main()
