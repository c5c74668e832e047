"""Issue 35: what the stdio sandbox costs. The SDK echo server of bench.stdio_echo
(``python -m bench._backend_server stdio echo echo``) behind the gateway in a bubblewrap
sandbox (``sandbox: {mode: bubblewrap}``, the default) and without one (``sandbox: {mode:
none}``: setpriv sets the parent-death signal and execs it), side by side in one run; the
gateway under gunicorn, as in production.

* ``echo``: one gateway with both as shared backends (``boxed`` and ``plain``, one child
  each); a few client threads (default 4) per mode after a warm-up, rounds taking the modes
  in order, then reversed: p50, p95 and throughput per mode; then one thread, the modes call
  by call: p50, p95. The gateway worker's CPU and the child's (with every process it
  started: bwrap's) per call. Then what each child holds: the admin state's ``rssBytes``
  (the child and what it started) and, per process of its tree, RSS and PSS from /proc.
* ``spawn``: two OIDC gateways, one per mode, each with the echo server as a perUser
  backend; new users (tests.idp.LocalIdP subjects) taking the gateways in turn (ABBA), each
  opening a session and calling once: the call starts the user's child (spawn, initialize,
  the lists, the call), timed from the call to its answer; then a second call, and the
  session is closed (the child stops; the next user waits until it has). p50/p95 per mode.
  The floor: what making the sandbox alone costs, the gateway's own launcher argv (from
  ``_sandbox.launch``) running ``/bin/true``, against setpriv and against ``true`` bare.

Ratios are sandbox / none.

    .venv/bin/python -m bench.stdio_sandbox [--part echo,spawn] [--threads 4] [--calls 400] [--spawns 20]
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._common import (
    ROOT,
    Check,
    McpClient,
    admin_config,
    admin_state,
    gateway,
    parse_args,
    percentile,
    print_header,
    process_cpu_seconds,
    raise_failures,
    record,
    run_benchmark,
    run_threads,
    settle_heap,
    table,
)
from bench.overhead import WARMUP, echo
from bench.stdio_echo import AUDIENCE, STDIO_ECHO, children_of, command_line, oidc, stdio_entry, timed

PARTS = ("echo", "spawn")
MODES = {"boxed": "bubblewrap", "plain": "none"}  # backend name -> sandbox.mode
ROUNDS = 4
SEQUENTIAL_CALLS = 400
FLOOR_RUNS = 20
WATCHDOG = 290.0


def entry(name: str, scope: str) -> dict[str, Any]:
    return {**stdio_entry(name, scope), "sandbox": {"mode": MODES[name]}}


def tree_of(pid: int) -> list[int]:
    """``pid`` and every process below it (a sandboxed child: bwrap, bwrap as the sandbox's
    init, the server)."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        pending += children_of(current)
    return found


def tree_cpu_seconds(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += process_cpu_seconds(pid)
    return total


def memory_kib(pid: int) -> tuple[int, int | None]:
    """(RSS, PSS) of one process in KiB (PSS None when /proc does not show it)."""
    rss = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    pss = None
    with contextlib.suppress(OSError):
        found = re.search(r"^Pss:\s+(\d+) kB", Path(f"/proc/{pid}/smaps_rollup").read_text(), re.MULTILINE)
        pss = int(found.group(1)) if found else None
    return (int(rss.group(1)) if rss else 0), pss


def program(pid: int) -> str:
    words = command_line(pid).split()
    if not words:
        return "?"
    name = os.path.basename(words[0])
    return f"{name} {' '.join(words[-5:])}" if "python" in name else name


def p95(samples: Sequence[float]) -> float:
    return percentile(samples, 95)


def p50(samples: Sequence[float]) -> float:
    return percentile(samples, 50)


# ----------------------------------------------------------------------------------
# echo: calls to a running child, sandboxed or not
# ----------------------------------------------------------------------------------


def wait_ready(url: str, tools: Sequence[str], timeout: float = 60.0) -> float:
    """Seconds until one session lists every tool in ``tools``: both children started and
    discovered (on a loaded machine, one child's start can outlast the discovery budget;
    the next list tries it again)."""
    started = time.perf_counter()
    with McpClient(url) as client:
        client.initialize()
        while not set(tools) <= set(client.list_tools()):
            if time.perf_counter() - started > timeout:
                raise RuntimeError(f"{tools} not all listed after {timeout:g} s")
            time.sleep(0.5)
    return time.perf_counter() - started


def part_echo(server: str, threads: int, calls: int) -> list[Check]:
    per_round = max(1, calls // ROUNDS)
    with contextlib.ExitStack() as stack:
        extra = {**admin_config(), "backends": [entry(name, "shared") for name in MODES]}
        gw = stack.enter_context(gateway({}, server=server, extra=extra))
        clients = {mode: [stack.enter_context(McpClient(gw.url)) for _ in range(threads)] for mode in MODES}
        ready = wait_ready(gw.url, [f"{mode}_echo" for mode in MODES])

        def warm(index: int) -> None:
            for mode in MODES:
                clients[mode][index].initialize()
                for i in range(WARMUP):
                    echo(clients[mode][index], f"{mode}_echo", f"w{i}")

        raise_failures(run_threads(threads, warm))
        processes = {p["backend"]: p for p in admin_state(gw).get("processes", [])}
        trees = {mode: tree_of(processes[mode]["pid"]) for mode in MODES if processes.get(mode, {}).get("pid")}
        settle_heap()

        latencies: dict[str, list[float]] = {mode: [] for mode in MODES}
        wall = dict.fromkeys(MODES, 0.0)
        cpu = dict.fromkeys(MODES, 0.0)  # the gateway worker's
        child_cpu = dict.fromkeys(MODES, 0.0)  # the child's process tree
        order: list[str] = []
        for round_no in range(ROUNDS):
            order.extend(MODES if round_no % 2 == 0 else reversed(MODES))
        for mode in order:

            def work(index: int, mode: str = mode) -> list[float]:
                samples = []
                for i in range(per_round):
                    started = time.perf_counter()
                    echo(clients[mode][index], f"{mode}_echo", f"{index}-{i}")
                    samples.append(time.perf_counter() - started)
                return samples

            gateway_before, child_before = gw.cpu_seconds(), tree_cpu_seconds(trees.get(mode, []))
            started = time.perf_counter()
            results = run_threads(threads, work, timeout=90)
            wall[mode] += time.perf_counter() - started
            if gateway_before is not None:
                cpu[mode] += gw.cpu_seconds() - gateway_before
            child_cpu[mode] += tree_cpu_seconds(trees.get(mode, [])) - child_before
            raise_failures(results)
            for samples in results:
                latencies[mode].extend(samples)

        sequential: dict[str, list[float]] = {mode: [] for mode in MODES}
        for i in range(SEQUENTIAL_CALLS):
            for mode in (MODES if i % 2 == 0 else reversed(MODES)):
                started = time.perf_counter()
                echo(clients[mode][0], f"{mode}_echo", f"s{i}")
                sequential[mode].append(time.perf_counter() - started)

        after = {p["backend"]: p for p in admin_state(gw).get("processes", [])}
        memory = {mode: [(pid, program(pid), *memory_kib(pid)) for pid in trees.get(mode, [])] for mode in MODES}

    ms = {mode: [s * 1000 for s in samples] for mode, samples in latencies.items()}
    seq = {mode: [s * 1000 for s in samples] for mode, samples in sequential.items()}
    rate = {mode: len(latencies[mode]) / wall[mode] for mode in MODES}
    n = {mode: len(latencies[mode]) for mode in MODES}
    print(f"echo: one gateway, two shared stdio backends: boxed (sandbox.mode bubblewrap), plain (none); "
          f"children: boxed {trees.get('boxed')}, plain {trees.get('plain')} (pid trees); both listed after "
          f"{ready:.1f} s")
    print(f"\nconcurrent ({threads} threads, {n['boxed']} calls per mode, {ROUNDS} rounds in order, then reversed)")
    print(table(["mode", "p50", "p95", "max", "throughput", "gateway CPU per call", "child CPU per call"], [
        (mode, f"{p50(ms[mode]):.2f} ms", f"{p95(ms[mode]):.2f} ms", f"{max(ms[mode]):.1f} ms",
         f"{rate[mode]:.0f} calls/s", f"{cpu[mode] / n[mode] * 1000:.3f} ms",
         f"{child_cpu[mode] / n[mode] * 1000:.3f} ms") for mode in MODES]))
    print(f"\nsequential (1 thread, {SEQUENTIAL_CALLS} calls per mode, call by call)")
    print(table(["mode", "p50", "p95", "min"], [
        (mode, f"{p50(seq[mode]):.2f} ms", f"{p95(seq[mode]):.2f} ms", f"{min(seq[mode]):.2f} ms") for mode in MODES]))
    print("\nwhat each child holds (after the run): the admin state's rssBytes (the child and every process it "
          "started), and per process RSS and PSS (/proc status, smaps_rollup)")
    rows = []
    for mode in MODES:
        for pid, name, rss, pss in memory[mode]:
            rows.append((mode, pid, name, f"{rss / 1024:.1f} MiB", f"{pss / 1024:.1f} MiB" if pss is not None else "?"))
        rss_total = sum(m[2] for m in memory[mode])
        pss_total = sum(m[3] or 0 for m in memory[mode])
        admin_rss = (after.get(mode) or {}).get("rssBytes")
        rows.append((f"{mode}: total", "", f"admin rssBytes {admin_rss / 2**20:.1f} MiB" if admin_rss else "admin: ?",
                     f"{rss_total / 1024:.1f} MiB", f"{pss_total / 1024:.1f} MiB"))
    print(table(["mode", "pid", "process", "RSS", "PSS"], rows))

    def total(mode: str, column: int) -> float:
        return sum(m[column] or 0 for m in memory[mode]) / 1024

    box, plain = "boxed", "plain"
    summary = [
        (f"throughput, {threads} threads", f"{rate[box]:.0f} calls/s", f"{rate[plain]:.0f} calls/s",
         f"{rate[box] / rate[plain]:.2f}"),
        (f"p50, {threads} threads", f"{p50(ms[box]):.2f} ms", f"{p50(ms[plain]):.2f} ms",
         f"{p50(ms[box]) / p50(ms[plain]):.2f}"),
        (f"p95, {threads} threads", f"{p95(ms[box]):.2f} ms", f"{p95(ms[plain]):.2f} ms",
         f"{p95(ms[box]) / p95(ms[plain]):.2f}"),
        ("p50, sequential", f"{p50(seq[box]):.2f} ms", f"{p50(seq[plain]):.2f} ms",
         f"{p50(seq[box]) / p50(seq[plain]):.2f}"),
        ("p95, sequential", f"{p95(seq[box]):.2f} ms", f"{p95(seq[plain]):.2f} ms",
         f"{p95(seq[box]) / p95(seq[plain]):.2f}"),
        ("gateway CPU per call", f"{cpu[box] / n[box] * 1000:.3f} ms", f"{cpu[plain] / n[plain] * 1000:.3f} ms",
         f"{cpu[box] / cpu[plain]:.2f}" if cpu[plain] else "?"),
        ("child CPU per call", f"{child_cpu[box] / n[box] * 1000:.3f} ms",
         f"{child_cpu[plain] / n[plain] * 1000:.3f} ms",
         f"{child_cpu[box] / child_cpu[plain]:.2f}" if child_cpu[plain] else "?"),
        ("child processes", len(memory[box]), len(memory[plain]), ""),
        ("child RSS (sum over its processes)", f"{total(box, 2):.1f} MiB", f"{total(plain, 2):.1f} MiB",
         f"{total(box, 2) / total(plain, 2):.2f}" if total(plain, 2) else "?"),
        ("child PSS (sum over its processes)", f"{total(box, 3):.1f} MiB", f"{total(plain, 3):.1f} MiB",
         f"{total(box, 3) / total(plain, 3):.2f}" if total(plain, 3) else "?"),
    ]
    print("\nsandbox (boxed) vs none (plain), calls to a running child")
    print(table(["measure", "sandbox", "none", "sandbox / none"], summary))
    print()
    record("echo: throughput sandbox / none", round(rate[box] / rate[plain], 3))
    record("echo: concurrent p50 sandbox / none", round(p50(ms[box]) / p50(ms[plain]), 3))
    record("echo: concurrent p95 sandbox / none", round(p95(ms[box]) / p95(ms[plain]), 3))
    record("echo: sequential p50 sandbox / none", round(p50(seq[box]) / p50(seq[plain]), 3))
    record("echo: child RSS sandbox MiB", round(total(box, 2), 1))
    record("echo: child RSS none MiB", round(total(plain, 2), 1))
    boxed_names = [m[1] for m in memory[box]]
    plain_names = [m[1] for m in memory[plain]]
    return [Check("echo: the boxed child runs under bwrap", ", ".join(boxed_names), "bwrap above the server",
                  boxed_names[:1] == ["bwrap"]),
            Check("echo: the plain child runs without bwrap", ", ".join(plain_names), "the server alone",
                  len(plain_names) == 1 and "bwrap" not in plain_names)]


# ----------------------------------------------------------------------------------
# spawn: a new user's first call starts a child, sandboxed or not
# ----------------------------------------------------------------------------------


def wait_childless(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while children_of(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def launcher_floor(runs: int) -> dict[str, list[float]]:
    """Seconds to run ``/bin/true`` through the gateway's launchers (``_sandbox.launch``
    of a bubblewrap and of a none backend) and bare, interleaved."""
    from vmcp_actors.backends import _sandbox
    from vmcp_actors.config import BackendConfig
    from vmcp_actors.config._model import SandboxConfig

    true = shutil.which("true") or "/bin/true"
    argvs = {}
    for label, mode in (("bwrap launcher", "bubblewrap"), ("setpriv launcher", "none")):
        backend = BackendConfig(name="floor", transport="stdio", command=true, cwd=str(ROOT),
                                sandbox=SandboxConfig(mode=mode))
        argvs[label] = _sandbox.launch(backend, [true], dict(os.environ), str(ROOT), None)
    argvs["bare"] = ([true], dict(os.environ))
    seconds: dict[str, list[float]] = {label: [] for label in argvs}
    for i in range(runs):
        for label in (list(argvs) if i % 2 == 0 else reversed(list(argvs))):
            argv, env = argvs[label]
            started = time.perf_counter()
            subprocess.run(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, check=True)
            seconds[label].append(time.perf_counter() - started)
    return seconds


def part_spawn(spawns: int) -> list[Check]:
    from tests.idp import LocalIdP

    first: dict[str, list[float]] = {mode: [] for mode in MODES}
    second: dict[str, list[float]] = {mode: [] for mode in MODES}
    lingering = dict.fromkeys(MODES, 0)
    with contextlib.ExitStack() as stack:
        idp = stack.enter_context(LocalIdP("bench-idp"))
        gateways = {mode: stack.enter_context(gateway({}, extra={**oidc(idp), "backends": [entry(mode, "perUser")]}))
                    for mode in MODES}
        workers = {mode: gw.pid for mode, gw in gateways.items()}
        order = [mode for i in range(spawns + 1) for mode in (MODES if i % 2 == 0 else reversed(MODES))]
        for index, mode in enumerate(order):  # the first of each mode is a warm-up, not counted
            token = idp.issue_token(f"spawn-{mode}-{index:03d}", AUDIENCE, expires_in=900)
            with McpClient(gateways[mode].url, headers={"Authorization": f"Bearer {token}"}) as client:
                client.initialize()
                cold = timed(lambda client=client, mode=mode: echo(client, f"{mode}_echo", "cold"))
                warm = timed(lambda client=client, mode=mode: echo(client, f"{mode}_echo", "warm"))
            if index >= len(MODES):
                first[mode].append(cold)
                second[mode].append(warm)
            worker = workers[mode]
            if worker is not None and not wait_childless(worker):
                lingering[mode] += 1
    floor = launcher_floor(FLOOR_RUNS)

    ms = {mode: [s * 1000 for s in samples] for mode, samples in first.items()}
    warm_ms = {mode: [s * 1000 for s in samples] for mode, samples in second.items()}
    floor_ms = {label: [s * 1000 for s in samples] for label, samples in floor.items()}
    print(f"spawn: two OIDC gateways (a perUser stdio backend each: boxed, sandbox.mode bubblewrap; plain, none); "
          f"{spawns} new users per mode taking the gateways in turn (ABBA, after one warm-up user each), each a "
          "session, a first call (the child cold) and a second; the session closed and its child gone before the next")
    print(table(["call", "mode", "p50", "p95", "min", "max"], [
        (label, mode, f"{p50(samples[mode]):.0f} ms", f"{p95(samples[mode]):.0f} ms", f"{min(samples[mode]):.0f} ms",
         f"{max(samples[mode]):.0f} ms")
        for label, samples in (("first call (cold)", ms), ("second call", warm_ms)) for mode in MODES]))
    print(f"\nthe launcher alone: /bin/true, {FLOOR_RUNS} runs each, interleaved")
    print(table(["how", "p50", "p95", "min"], [
        (label, f"{p50(samples):.2f} ms", f"{p95(samples):.2f} ms", f"{min(samples):.2f} ms")
        for label, samples in floor_ms.items()]))
    box, plain = "boxed", "plain"
    print("\nsandbox (boxed) vs none (plain), a new child")
    print(table(["measure", "sandbox", "none", "sandbox - none", "sandbox / none"], [
        ("first call (cold), p50", f"{p50(ms[box]):.0f} ms", f"{p50(ms[plain]):.0f} ms",
         f"{p50(ms[box]) - p50(ms[plain]):+.0f} ms", f"{p50(ms[box]) / p50(ms[plain]):.2f}"),
        ("first call (cold), p95", f"{p95(ms[box]):.0f} ms", f"{p95(ms[plain]):.0f} ms",
         f"{p95(ms[box]) - p95(ms[plain]):+.0f} ms", f"{p95(ms[box]) / p95(ms[plain]):.2f}"),
        ("launcher running /bin/true, p50", f"{p50(floor_ms['bwrap launcher']):.2f} ms",
         f"{p50(floor_ms['setpriv launcher']):.2f} ms",
         f"{p50(floor_ms['bwrap launcher']) - p50(floor_ms['setpriv launcher']):+.2f} ms",
         f"{p50(floor_ms['bwrap launcher']) / p50(floor_ms['setpriv launcher']):.2f}"),
    ]))
    print()
    record("spawn: first call p50 sandbox ms", round(p50(ms[box]), 1))
    record("spawn: first call p50 none ms", round(p50(ms[plain]), 1))
    record("spawn: first call p50 sandbox / none", round(p50(ms[box]) / p50(ms[plain]), 3))
    record("spawn: bwrap launcher p50 ms", round(p50(floor_ms["bwrap launcher"]), 2))
    return [Check(f"spawn: {mode}: each child gone within 10 s of its user's session closing",
                  f"{lingering[mode]} of {spawns + 1} not", "0 not", lingering[mode] == 0) for mode in MODES]


# ----------------------------------------------------------------------------------


def body(server: str, parts: Sequence[str], threads: int, calls: int, spawns: int) -> list[Check]:
    print_header("stdio_sandbox: the stdio sandbox's cost (issue 35)", server, [
        f"stdio backend: {' '.join(STDIO_ECHO[1:])} (the SDK echo server of bench.overhead, over stdio), "
        "sandbox.mode bubblewrap (boxed) and none (plain)",
        f"bwrap: {shutil.which('bwrap')}; parts: {', '.join(parts)}; load average before: "
        f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}",
    ])
    checks: list[Check] = []
    if "echo" in parts:
        checks += part_echo(server, threads, calls)
    if "spawn" in parts:
        checks += part_spawn(spawns)
    print(f"load average after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    return checks


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--threads", type=int, default=4, help="echo: client threads (default 4)")
        parser.add_argument("--calls", type=int, default=400, help="echo: calls per thread per mode (default 400)")
        parser.add_argument("--spawns", type=int, default=20, help="spawn: new users per mode (default 20)")

    args = parse_args(__doc__.splitlines()[0], extra=extra, parts=PARTS,
                      gunicorn_only="bench.stdio_sandbox reads the gunicorn worker's children")
    parts = args.parts
    run_benchmark(lambda: body(args.server, parts, args.threads, args.calls, args.spawns), watchdog=WATCHDOG)


if __name__ == "__main__":
    main()
