"""Issue 23: stdio backends. The official-SDK echo server of bench.overhead
(tests.backends.build_sdk_server, ``python -m bench._backend_server stdio echo echo``) as a
program the gateway starts and speaks to over stdin and stdout, against the same server
over streamable HTTP in its own process; the gateway under gunicorn, as in production.

* ``echo``: one gateway with both backends, ``stdio`` (scope shared: one child) and
  ``http``; 16 client threads per mode after a warm-up, rounds taking the modes in order,
  then reversed, for a 2025-11-25 client (a session) and a 2026-07-28 client: p50, p99 and
  throughput per mode, stdio / http. Then one thread, the modes call by call: p50.
* ``cold``: a perUser ``stdio`` backend, then the ``http`` one, each alone behind an OIDC
  gateway (a user's first call discovers every backend); new users (distinct subjects,
  tests.idp.LocalIdP) one after another, each opening a session and calling the echo twice:
  the first stdio call starts the user's process (spawn, initialize, the lists, the call),
  the first http call makes the user's backend session. The same ``mcp.Client`` over stdio
  directly (spawn, initialize, call) is the floor. With every user's session still open,
  the RSS of each user's process (/proc), and the gateway worker's threads per child: its
  threads with the children, minus its threads once they are killed (SIGKILL from outside,
  the sessions still open), over their number. ``@modelcontextprotocol/server-memory``
  (Node, ``read_graph``) is measured the same way when scripts/install-stdio-servers
  installed it.
* ``crowd``: 100 users on a perUser backend with ``operational.maxProcesses`` 20, from 32
  client threads: each opens a session and calls twice, then each calls once more on its
  session. Per phase: ok, HTTP 503 (and whether each carried ``Retry-After``), JSON-RPC
  errors by message, other errors; the worker's children and threads sampled every 50 ms
  (the most at once, per phase); the worker's threads and RSS, its children and their RSS
  after each phase; at the end its threads per child, as in ``cold``. Targets: the most
  children at once <= maxProcesses, every refusal (503, or an error saying busy or retry)
  with ``Retry-After``, no other failure.

    .venv/bin/python -m bench.stdio_echo [--part echo,cold,crowd] [--threads 16] [--calls 200] [--pin-http legacy]
                                         [--cold-users 10] [--users 100] [--max-processes 20] [--pool 32]
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import (
    ROOT,
    Check,
    McpClient,
    RpcFailure,
    Stats,
    admin_config,
    admin_state,
    backend_process,
    gateway,
    median,
    parse_args,
    print_header,
    process_cpu_seconds,
    raise_failures,
    record,
    run_benchmark,
    run_threads,
    settle_heap,
    table,
)
from bench.overhead import ERAS, SEQUENTIAL_CALLS, WARMUP, echo
from bench.threads import Footprint, per_thread_http, worker_pid

PARTS = ("echo", "cold", "crowd")
ROUNDS = 4
AUDIENCE = "vmcp"
SAMPLE_EVERY = 0.05  # seconds between samples of the worker's children (crowd)
WATCHDOG = 290.0
STDIO_ECHO = [sys.executable, "-m", "bench._backend_server", "stdio", "echo", "echo"]


# ----------------------------------------------------------------------------------
# The gateway's children
# ----------------------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    """The processes ``pid`` started (any of its threads: the gateway forks from one)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                found += [int(child) for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def children_by_kind(pid: int) -> dict[str, list[int]]:
    """The worker's children: ``echo`` (the SDK echo server), ``memory`` (server-memory), other."""
    kinds: dict[str, list[int]] = {}
    for child in children_of(pid):
        line = command_line(child)
        kind = "echo" if "bench._backend_server" in line else "memory" if "server-memory" in line else "other"
        kinds.setdefault(kind, []).append(child)
    return kinds


PF_EXITING = 0x4  # /proc/<pid>/stat flags: the process is in exit
ENDING_SIGNALS = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGKILL - 1))


def stopping(pid: int) -> bool:
    """A child on its way out: SIGTERM or SIGKILL pending, exiting, or exited and not yet
    reaped (a zombie); or gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X") or int(fields[6]) & PF_EXITING:
        return True
    pending = re.findall(r"^(?:SigPnd|ShdPnd):\s+([0-9a-f]+)$", status, re.MULTILINE)
    return any(int(mask, 16) & ENDING_SIGNALS for mask in pending)


def kill_children(pid: int) -> int:
    """SIGKILL to each child's process group (each leads its own); how many there were."""
    children = children_of(pid)
    for child in children:
        try:
            os.killpg(child, signal.SIGKILL)
        except OSError:
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
    return len(children)


def settled(pid: int, timeout: float = 15.0) -> Footprint:
    """The worker's footprint once it has no children left and its thread count held for 0.5 s."""
    deadline = time.monotonic() + timeout
    last: Footprint | None = None
    while time.monotonic() < deadline:
        seen = Footprint.of(pid)
        if not children_of(pid) and last is not None and seen.threads == last.threads:
            return seen
        last = seen
        time.sleep(0.5)
    return Footprint.of(pid)


@dataclass(frozen=True)
class ThreadCost:
    """The gateway's threads with ``children`` live children, and with none (the same users
    and sessions: the children killed from outside)."""

    children: int
    with_children: int
    without: int

    @property
    def per_child(self) -> float:
        return (self.with_children - self.without) / self.children if self.children else float("nan")

    @classmethod
    def measure(cls, pid: int, seen: Footprint) -> ThreadCost:
        """``seen`` read with the children live; they are killed, and the threads read again."""
        children = kill_children(pid)
        return cls(children, seen.threads, settled(pid).threads)


def rss_mib(pids: Sequence[int]) -> list[float]:
    sizes = []
    for pid in pids:
        with contextlib.suppress(OSError):
            sizes.append(Footprint.of(pid).rss_mib)
    return sizes


def stdio_entry(name: str, scope: str, command: Sequence[str] = STDIO_ECHO,
                env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A stdio backend's config entry (run in the repository, so ``-m bench...`` imports)."""
    return {"name": name, "transport": "stdio", "command": command[0], "args": list(command[1:]),
            "env": dict(env or {}), "cwd": str(ROOT), "scope": scope}


def oidc(idp: Any) -> dict[str, Any]:
    return {"incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUDIENCE}}}


# ----------------------------------------------------------------------------------
# echo: stdio vs streamable HTTP through one gateway
# ----------------------------------------------------------------------------------


def part_echo(server: str, threads: int, calls: int, pin_http: str = "auto") -> list[Check]:
    per_round = max(1, calls // ROUNDS)
    with contextlib.ExitStack() as stack:
        http = stack.enter_context(backend_process("sdk", "echo", "echo"))
        http_entry = {"name": "http", "url": http.mcp_url, **({"protocol": pin_http} if pin_http != "auto" else {})}
        extra = {**admin_config(), "backends": [stdio_entry("stdio", "shared"), http_entry]}
        gw = stack.enter_context(gateway({}, server=server, extra=extra))
        modes = {f"{transport}-{era}": (f"{transport}_echo", era == "modern")
                 for era in ERAS for transport in ("stdio", "http")}
        clients = {mode: [stack.enter_context(McpClient(gw.url, modern=modern)) for _ in range(threads)]
                   for mode, (_, modern) in modes.items()}

        def warm(index: int) -> None:
            for mode, (tool, _) in modes.items():
                clients[mode][index].initialize()
                for i in range(WARMUP):
                    echo(clients[mode][index], tool, f"w{i}")

        raise_failures(run_threads(threads, warm))
        spoken = admin_state(gw).get("backendEras", {})
        pid = gw.pid
        stdio_children = children_by_kind(pid).get("echo", []) if pid is not None else []
        settle_heap()

        names = list(modes)
        latencies: dict[str, list[float]] = {mode: [] for mode in names}
        wall = dict.fromkeys(names, 0.0)
        cpu = dict.fromkeys(names, 0.0)  # gateway worker
        backend_cpu = dict.fromkeys(names, 0.0)  # the stdio child or the HTTP backend process
        order = []
        for round_no in range(ROUNDS):
            order.extend(names if round_no % 2 == 0 else reversed(names))
        for mode in order:
            tool = modes[mode][0]
            serving = stdio_children[0] if mode.startswith("stdio") and stdio_children else http.pid

            def work(index: int, mode: str = mode, tool: str = tool) -> list[float]:
                samples = []
                for i in range(per_round):
                    started = time.perf_counter()
                    echo(clients[mode][index], tool, f"{index}-{i}")
                    samples.append(time.perf_counter() - started)
                return samples

            gateway_before = gw.cpu_seconds()
            backend_before = process_cpu_seconds(serving)
            started = time.perf_counter()
            results = run_threads(threads, work, timeout=90)
            wall[mode] += time.perf_counter() - started
            if gateway_before is not None:
                cpu[mode] += gw.cpu_seconds() - gateway_before
            backend_cpu[mode] += process_cpu_seconds(serving) - backend_before
            raise_failures(results)
            for samples in results:
                latencies[mode].extend(samples)

        sequential: dict[str, list[float]] = {mode: [] for mode in names}
        for i in range(SEQUENTIAL_CALLS):
            for mode in (names if i % 2 == 0 else reversed(names)):
                started = time.perf_counter()
                echo(clients[mode][0], modes[mode][0], f"s{i}")
                sequential[mode].append(time.perf_counter() - started)
        children_after = children_by_kind(pid).get("echo", []) if pid is not None else []

    conc = {mode: Stats.of(samples) for mode, samples in latencies.items()}
    seq = {mode: Stats.of(samples) for mode, samples in sequential.items()}
    rate = {mode: len(latencies[mode]) / wall[mode] for mode in names}
    per_call = {mode: len(latencies[mode]) for mode in names}
    print(f"echo: the gateway spoke to the backends: stdio {spoken.get('stdio', '?')}, http {spoken.get('http', '?')} "
          f"(admin state backendEras); stdio children: {len(stdio_children)} (pid {stdio_children}), "
          f"after the run {children_after}")
    print(f"\nconcurrent ({threads} threads, {per_call[names[0]]} calls per mode, {ROUNDS} rounds in order, "
          "then reversed)")
    print(table(["mode", "p50", "p99", "mean", "throughput", "gateway CPU per call", "backend CPU per call"], [
        (mode, f"{s.p50:.2f} ms", f"{s.p99:.2f} ms", f"{s.mean:.2f} ms", f"{rate[mode]:.0f} calls/s",
         f"{cpu[mode] / per_call[mode] * 1000:.2f} ms", f"{backend_cpu[mode] / per_call[mode] * 1000:.2f} ms")
        for mode, s in conc.items()]))
    print(f"\nsequential (1 thread, {SEQUENTIAL_CALLS} calls per mode, call by call)")
    print(table(["mode", "p50", "p99", "mean", "min"], [
        (mode, f"{s.p50:.2f} ms", f"{s.p99:.2f} ms", f"{s.mean:.2f} ms", f"{s.min:.2f} ms") for mode, s in seq.items()]))
    rows = []
    for era in ERAS:
        stdio, http_mode = f"stdio-{era}", f"http-{era}"
        rows += [
            (f"{era}: throughput, {threads} threads", f"{rate[stdio]:.0f} calls/s", f"{rate[http_mode]:.0f} calls/s",
             f"{rate[stdio] / rate[http_mode]:.2f}"),
            (f"{era}: p50, {threads} threads", f"{conc[stdio].p50:.2f} ms", f"{conc[http_mode].p50:.2f} ms",
             f"{conc[stdio].p50 / conc[http_mode].p50:.2f}"),
            (f"{era}: p50, sequential", f"{seq[stdio].p50:.2f} ms", f"{seq[http_mode].p50:.2f} ms",
             f"{seq[stdio].p50 / seq[http_mode].p50:.2f}"),
            (f"{era}: gateway CPU per call", f"{cpu[stdio] / per_call[stdio] * 1000:.2f} ms",
             f"{cpu[http_mode] / per_call[http_mode] * 1000:.2f} ms", f"{cpu[stdio] / cpu[http_mode]:.2f}"),
        ]
        record(f"echo {era}: throughput stdio / http", round(rate[stdio] / rate[http_mode], 3))
        record(f"echo {era}: sequential p50 stdio ms", round(seq[stdio].p50, 3))
        record(f"echo {era}: sequential p50 http ms", round(seq[http_mode].p50, 3))
    print("\nstdio vs http, through the gateway")
    print(table(["measure", "stdio", "http", "stdio / http"], rows))
    print()
    return [Check("echo: one child serves every user of a shared stdio backend", str(len(stdio_children)), "1",
                  len(stdio_children) == 1 and children_after == stdio_children)]


# ----------------------------------------------------------------------------------
# cold: a new user's first call starts its process
# ----------------------------------------------------------------------------------


def direct_cold(command: Sequence[str], env: Mapping[str, str], tool: str, arguments: dict[str, Any]) -> float:
    """The SDK client over stdio, directly: seconds from spawning to the tool's answer."""
    import mcp

    async def main() -> float:
        started = time.perf_counter()
        params = mcp.StdioServerParameters(command=command[0], args=list(command[1:]), env=dict(env), cwd=str(ROOT))
        async with mcp.Client(params, mode="legacy") as client:
            await client.call_tool(tool, arguments)
            return time.perf_counter() - started

    return asyncio.run(main())


def timed(work: Callable[[], Any]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def cold_users(gw: Any, idp: Any, users: int, tool: str, arguments: dict[str, Any],
               steps: dict[str, list[float]], label: str
               ) -> tuple[dict[str, list[float]], Footprint, ThreadCost | None]:
    """New users one after another, each a session calling ``tool`` twice (timed into
    ``steps``); their sessions stay open while the RSS of the worker's children is read, and
    while the children are killed to count the worker's threads without them. (RSS in MiB
    by kind of child, the worker's footprint, its threads with and without the children)"""
    pid = worker_pid(gw)
    with contextlib.ExitStack() as sessions:
        for i in range(users):
            token = idp.issue_token(f"cold-{label}-{i:03d}", AUDIENCE, expires_in=900)
            client = sessions.enter_context(McpClient(gw.url, headers={"Authorization": f"Bearer {token}"}))
            steps.setdefault("initialize (the gateway alone)", []).append(timed(client.initialize))
            for step in ("first call (cold)", "second call"):
                steps.setdefault(f"{label}: {step}", []).append(timed(lambda client=client: client.call_tool(tool, arguments)))
        sizes = {kind: rss_mib(pids) for kind, pids in children_by_kind(pid).items()}
        seen = Footprint.of(pid)
        cost = ThreadCost.measure(pid, seen) if sizes else None
        return sizes, seen, cost


def part_cold(users: int) -> list[Check]:
    from tests.idp import LocalIdP
    from tests.stdio_servers import memory_server, missing

    memory_why = missing()
    memory_command = [memory_server()[0], *memory_server()[1]] if memory_why is None else []
    steps: dict[str, list[float]] = {}
    sizes: dict[str, list[float]] = {}
    workers: dict[str, Footprint] = {}
    costs: dict[str, ThreadCost] = {}
    with contextlib.ExitStack() as stack:
        idp = stack.enter_context(LocalIdP("bench-idp"))
        http = stack.enter_context(backend_process("sdk", "echo", "echo"))
        files = stack.enter_context(tempfile.TemporaryDirectory(prefix="vmcp-bench-memory-"))
        # Each backend behind a gateway of its own: a user's first call discovers every backend.
        kinds = [("stdio", stdio_entry("stdio", "perUser"), "stdio_echo", {"text": "cold"}),
                 ("http", {"name": "http", "url": http.mcp_url}, "http_echo", {"text": "cold"})]
        if memory_command:
            kinds.append(("memory", stdio_entry("memory", "perUser", memory_command,
                                                {"MEMORY_FILE_PATH": f"{files}/{{user}}.json"}),
                          "memory_read_graph", {}))
        for label, entry, tool, arguments in kinds:
            with gateway({}, extra={**oidc(idp), "backends": [entry]}) as gw:
                found, workers[label], cost = cold_users(gw, idp, users, tool, arguments, steps, label)
            if cost is not None:
                costs[label] = cost
            for kind, mib in found.items():
                sizes.setdefault(kind, []).extend(mib)
    floor = [direct_cold(STDIO_ECHO, {}, "echo", {"text": "x"}) for _ in range(min(users, 5))]
    memory_floor = []
    if memory_command:
        with tempfile.TemporaryDirectory(prefix="vmcp-bench-memory-") as direct_files:
            memory_floor = [direct_cold(memory_command, {"MEMORY_FILE_PATH": f"{direct_files}/direct.json"},
                                        "read_graph", {}) for _ in range(min(users, 3))]

    print(f"cold: {users} new OIDC users one after another per backend (each backend behind a gateway of its own), "
          "each a session and two calls; stdio and memory: scope perUser; http: the SDK server over streamable HTTP")
    rows = [(step, f"{median(samples) * 1000:.0f} ms", f"{min(samples) * 1000:.0f} ms",
             f"{max(samples) * 1000:.0f} ms") for step, samples in steps.items()]
    rows.append(("direct: the SDK client spawns the echo server over stdio, initialize, echo (floor)",
                 f"{median(floor) * 1000:.0f} ms", f"{min(floor) * 1000:.0f} ms", f"{max(floor) * 1000:.0f} ms"))
    if memory_floor:
        rows.append(("direct: the same for server-memory, read_graph", f"{median(memory_floor) * 1000:.0f} ms",
                     f"{min(memory_floor) * 1000:.0f} ms", f"{max(memory_floor) * 1000:.0f} ms"))
    print(table(["step", "median", "min", "max"], rows))
    print()
    names = {"echo": "the SDK echo server (Python)", "memory": "server-memory (Node)"}
    print(table(["process", "count", "RSS each (median)", "min", "max", "total"], [
        *((f"perUser child: {names.get(kind, kind)}", len(found), f"{median(found):.1f} MiB",
           f"{min(found):.1f} MiB", f"{max(found):.1f} MiB", f"{sum(found):.1f} MiB")
          for kind, found in sizes.items() if found),
        *((f"gateway worker ({label} backend, {users} users' sessions open)", 1, f"{seen.rss_mib:.1f} MiB", "", "",
           f"{seen.threads} threads") for label, seen in workers.items()),
    ]))
    if memory_why is not None:
        print(f"(server-memory not measured: {memory_why})")
    print()
    print("the gateway worker's threads per live child: its threads with every user's child live, minus its "
          "threads once the children are killed (SIGKILL from outside; the same users, their sessions still open), "
          "divided by the children")
    print(table(["backend", "children", "threads with them", "threads without", "threads per child"], [
        (label, cost.children, cost.with_children, cost.without, f"{cost.per_child:.2f}")
        for label, cost in costs.items()]))
    print()
    for label, cost in costs.items():
        record(f"cold: {label}: gateway threads per child", round(cost.per_child, 2))
    record("cold: stdio first call ms", round(median(steps["stdio: first call (cold)"]) * 1000, 1))
    record("cold: direct spawn to answer ms", round(median(floor) * 1000, 1))
    if sizes.get("echo"):
        record("cold: RSS per echo child MiB", round(median(sizes["echo"]), 1))
    checks = [Check("cold: one process per user of a perUser backend", str(len(sizes.get("echo", []))), str(users),
                    len(sizes.get("echo", [])) == users)]
    if memory_command:
        checks.append(Check("cold: one server-memory process per user", str(len(sizes.get("memory", []))), str(users),
                            len(sizes.get("memory", [])) == users))
    return checks


# ----------------------------------------------------------------------------------
# crowd: more users than processes
# ----------------------------------------------------------------------------------


REFUSAL_WORDS = ("busy", "try again", "retry")


def is_refusal(kind: str, message: str) -> bool:
    """A call refused for now (to be retried): an HTTP 503, or an error saying so."""
    return kind == "HTTP 503" or any(word in message.lower() for word in REFUSAL_WORDS)


class Outcomes:
    """What the calls got (thread-safe): by kind (ok, HTTP 503, JSON-RPC error, other), and
    by kind, message and the Retry-After header (None: none)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.details: Counter[tuple[str, str, str | None]] = Counter()

    def add(self, kind: str, message: str = "", retry_after: str | None = None) -> None:
        message = re.sub(r"\d{3,}", "N", message)[:160]  # pids and ports: one line per message
        with self._lock:
            self.counts[kind] += 1
            if kind != "ok":
                self.details[kind, message, retry_after] += 1

    def refusals(self) -> int:
        return sum(n for (kind, message, _), n in self.details.items() if is_refusal(kind, message))

    def refusals_without_retry_after(self) -> int:
        return sum(n for (kind, message, retry), n in self.details.items()
                   if is_refusal(kind, message) and retry is None)

    def failures(self) -> int:
        """Calls failing other than by a refusal."""
        return sum(n for (kind, message, _), n in self.details.items() if not is_refusal(kind, message))

    def with_retry_after(self, kind: str) -> int:
        return sum(n for (seen, _, retry), n in self.details.items() if seen == kind and retry is not None)


def crowd_call(client: McpClient, text: str) -> tuple[str, str, str | None]:
    """One echo call, raw: (kind, the error's message, the Retry-After header)."""
    try:
        response, answer = client.exchange("tools/call", {"name": "stdio_echo", "arguments": {"text": text}})
    except OSError as failure:  # requests' errors included
        return "other", f"{type(failure).__name__}: {failure}", None
    retry_after = response.headers.get("Retry-After")
    error = answer.get("error") if answer is not None else None
    message = str(error.get("message")) if isinstance(error, dict) else response.text[:160]
    if response.status_code == 503:
        return "HTTP 503", message, retry_after
    if response.status_code != 200 or answer is None:
        return "other", f"HTTP {response.status_code}: {message}", retry_after
    if error is not None:
        return "JSON-RPC error", f"{error.get('code')} {message}", retry_after
    result = answer.get("result") or {}
    content = result.get("content") or [{}]
    if result.get("isError") or content[0].get("text") != f"echo:{text}":
        return "other", f"unexpected result: {str(result)[:120]}", retry_after
    return "ok", "", None


@dataclass(frozen=True)
class Sample:
    """The worker, once: its children (and how many of them are stopping: see ``stopping``), its threads."""

    at: float
    children: int
    stopping: int
    threads: int

    @property
    def running(self) -> int:
        return self.children - self.stopping


@contextlib.contextmanager
def sampling(pid: int) -> Iterator[list[Sample]]:
    """The worker's children and threads, every SAMPLE_EVERY seconds, while inside."""
    samples: list[Sample] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(SAMPLE_EVERY):
            children = children_of(pid)
            with contextlib.suppress(OSError):
                samples.append(Sample(time.monotonic(), len(children), sum(map(stopping, children)),
                                      len(os.listdir(f"/proc/{pid}/task"))))

    sampler = threading.Thread(target=sample, name="bench-children", daemon=True)
    sampler.start()
    try:
        yield samples
    finally:
        stop.set()
        sampler.join(5)


def part_crowd(users: int, max_processes: int, pool: int) -> list[Check]:
    from tests.idp import LocalIdP

    with contextlib.ExitStack() as stack:
        idp = stack.enter_context(LocalIdP("bench-idp"))
        tokens = [idp.issue_token(f"crowd-user-{i:03d}", AUDIENCE, expires_in=900) for i in range(users)]
        gw = stack.enter_context(gateway({}, extra={**oidc(idp), "backends": [stdio_entry("stdio", "perUser")],
                                                    "operational": {"maxProcesses": max_processes}}))
        pid = worker_pid(gw)
        started = Footprint.of(pid)
        http, connections = per_thread_http()
        first, again = Outcomes(), Outcomes()
        sessions: list[McpClient | None] = [None] * users

        def call(outcomes: Outcomes, client: McpClient, text: str) -> None:
            outcomes.add(*crowd_call(client, text))

        def open_and_call(index: int) -> None:
            client = McpClient(gw.url, headers={"Authorization": f"Bearer {tokens[index]}"}, http=http())
            try:
                client.initialize()
            except (RpcFailure, OSError) as failure:
                first.add("other", f"initialize: {failure}")
                return
            sessions[index] = client
            call(first, client, f"a{index}")
            call(first, client, f"b{index}")

        def call_again(index: int) -> None:
            client = sessions[index]
            if client is not None:
                client.http = http()
                call(again, client, f"c{index}")

        phases = (("each user: a session + 2 calls", open_and_call, first), ("each user: 1 more call", call_again, again))
        took, spans, after = {}, {}, {}  # per phase: seconds; (start, end); (the worker, its children's RSS) after it
        with sampling(pid) as samples:
            for label, work, _ in phases:
                begun = time.monotonic()
                with ThreadPoolExecutor(pool, thread_name_prefix="bench-crowd") as executor:
                    list(executor.map(work, range(users)))
                spans[label] = begun, time.monotonic()
                took[label] = spans[label][1] - begun
                after[label] = Footprint.of(pid), rss_mib(children_of(pid))
            time.sleep(1.0)  # the last exits reaped
        live = children_of(pid)
        before_kill = Footprint.of(pid)
        cost = ThreadCost.measure(pid, before_kill)
        killed = Footprint.of(pid)
        for connection in connections:
            connection.close()

    def during(span: tuple[float, float]) -> list[Sample]:
        return [s for s in samples if span[0] <= s.at <= span[1]] or [Sample(0, 0, 0, 0)]

    peak = max((s.children for s in samples), default=0)
    peak_running = max((s.running for s in samples), default=0)
    over = [s for s in samples if s.children > max_processes]
    print(f"crowd: {users} OIDC users, a perUser stdio backend, operational.maxProcesses {max_processes}, "
          f"{pool} client threads; the worker's children and threads sampled every {SAMPLE_EVERY * 1000:.0f} ms")
    print(table(["phase", "calls", "ok", "HTTP 503", "503 with Retry-After", "JSON-RPC errors", "other errors",
                 "most children at once", "most not stopping", "most threads", "took"], [
        (label, sum(outcomes.counts.values()), outcomes.counts["ok"], outcomes.counts["HTTP 503"],
         outcomes.with_retry_after("HTTP 503"), outcomes.counts["JSON-RPC error"], outcomes.counts["other"],
         max(s.children for s in during(spans[label])), max(s.running for s in during(spans[label])),
         max(s.threads for s in during(spans[label])),
         f"{took[label]:.1f} s")
        for label, _, outcomes in phases]))
    for label, _, outcomes in phases:
        for (kind, message, retry), n in sorted(outcomes.details.items(), key=lambda item: -item[1]):
            header = f"Retry-After: {retry}" if retry is not None else "no Retry-After"
            print(f"  {label}: {n} x {kind} ({header}): {message}")
    print()
    print(table(["point", "gateway threads", "gateway RSS", "children", "children RSS (total)"], [
        ("after start", started.threads, f"{started.rss_mib:.1f} MiB", 0, ""),
        *((f"after: {label}", seen.threads, f"{seen.rss_mib:.1f} MiB", len(sizes), f"{sum(sizes):.1f} MiB")
          for label, (seen, sizes) in after.items()),
        ("1 s later", before_kill.threads, f"{before_kill.rss_mib:.1f} MiB", len(live), ""),
        (f"its children killed ({users} sessions open)", killed.threads, f"{killed.rss_mib:.1f} MiB", 0, ""),
    ]))
    print(f"samples over maxProcesses: {len(over)} of {len(samples)}"
          + (f" (children - stopping in them: {sorted(Counter((s.children, s.stopping) for s in over).items())})"
             if over else ""))
    print(f"most children at once: {peak} ({peak_running} not stopping); most gateway threads: "
          f"{max((s.threads for s in samples), default=0)}; threads per live child: ({cost.with_children} - "
          f"{cost.without}) / {cost.children} = {cost.per_child:.2f}")
    print()
    refused = first.refusals() + again.refusals()
    bare = first.refusals_without_retry_after() + again.refusals_without_retry_after()
    other = first.failures() + again.failures()
    record("crowd: most children at once", peak)
    record("crowd: refused calls", refused)
    record("crowd: refusals without Retry-After", bare)
    record("crowd: other errors", other)
    record("crowd: gateway threads after", after[phases[-1][0]][0].threads)
    record("crowd: gateway threads per child", round(cost.per_child, 2))
    return [Check(f"crowd: children at once <= operational.maxProcesses ({max_processes})", str(peak),
                  f"<= {max_processes}", peak <= max_processes),
            Check("crowd: refusals without Retry-After", f"{bare} of {refused}", "0", bare == 0),
            Check("crowd: calls failing other than by a refusal", str(other), "0", other == 0)]


# ----------------------------------------------------------------------------------


def body(server: str, parts: Sequence[str], threads: int, calls: int, cold_users: int, users: int,
         max_processes: int, pool: int, pin_http: str = "auto") -> list[Check]:
    print_header("stdio_echo: stdio backends (issue 23)", server, [
        f"stdio backend: {' '.join(STDIO_ECHO[1:])} (the SDK echo server of bench.overhead, over stdio)",
        "http backend: the same server over streamable HTTP (bench._backend_server sdk), in its own process",
        f"parts: {', '.join(parts)}",
    ])
    checks: list[Check] = []
    if "echo" in parts:
        checks += part_echo(server, threads, calls, pin_http)
    if "cold" in parts:
        checks += part_cold(cold_users)
    if "crowd" in parts:
        checks += part_crowd(users, max_processes, pool)
    return checks


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--threads", type=int, default=16, help="echo: client threads (default 16)")
        parser.add_argument("--calls", type=int, default=200, help="echo: calls per thread per mode (default 200)")
        parser.add_argument("--pin-http", choices=("auto", "legacy"), default="auto",
                            help="echo: the http backend's protocol (auto: the gateway probes it: 2026-07-28; "
                                 "legacy: 2025-11-25, as the gateway always speaks to a stdio backend)")
        parser.add_argument("--cold-users", type=int, default=10, help="cold: new users (default 10)")
        parser.add_argument("--users", type=int, default=100, help="crowd: users (default 100)")
        parser.add_argument("--max-processes", type=int, default=20, help="crowd: operational.maxProcesses")
        parser.add_argument("--pool", type=int, default=32, help="crowd: client threads (default 32)")

    args = parse_args(__doc__.splitlines()[0], extra=extra, parts=PARTS,
                      gunicorn_only="bench.stdio_echo reads the gunicorn worker's children")
    parts = args.parts
    run_benchmark(lambda: body(args.server, parts, args.threads, args.calls, args.cold_users, args.users,
                               args.max_processes, args.pool, args.pin_http), watchdog=WATCHDOG)


if __name__ == "__main__":
    main()
