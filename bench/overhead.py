"""Overhead: the same client code calling a trivial echo tool on one official-SDK backend,
(a) directly and (b) through the gateway, side by side in one run.

The backend runs in its own process by default (as backends do in production): in the
clients' process, the 16 client threads and the backend would share one GIL, capping the
direct mode at one core while the gateway mode gets a second process, which flatters the
gateway. ``--backend inprocess`` measures that variant anyway.

* Concurrent: 16 client threads, each with its own MCP session and requests.Session per
  mode; after a warm-up, N calls per thread per mode, in rounds alternating the two modes
  (D G G D D G G D ...) so machine noise lands on both alike. Latency p50/p99 and
  throughput (calls/s over the rounds' wall time) for both, and their ratios.
* Sequential: one thread, calls alternating direct/gateway one by one: the cleanest p50
  overhead.

    .venv/bin/python -m bench.overhead [--server werkzeug] [--calls 200] [--threads 16] [--backend inprocess]
"""

from __future__ import annotations

import contextlib
import time

from bench._common import (
    Check,
    McpClient,
    Stats,
    backend_process,
    gateway,
    parse_args,
    print_header,
    process_cpu_seconds,
    raise_failures,
    run_benchmark,
    run_threads,
    settle_heap,
    table,
)

WARMUP = 20
ROUNDS = 4
SEQUENTIAL_CALLS = 400
TARGET_OVERHEAD_MS = 2.0
TARGET_THROUGHPUT_RATIO = 0.5


def echo(client: McpClient, tool: str, text: str) -> None:
    result = client.call_tool(tool, {"text": text})
    if result["content"][0]["text"] != f"echo:{text}":
        raise RuntimeError(f"unexpected answer {result}")


def body(server: str, threads: int, calls: int, backend_where: str) -> list[Check]:
    from tests.backends import sdk_backend

    per_round = max(1, calls // ROUNDS)
    where = "in its own process" if backend_where == "process" else "in this (the clients') process"
    print_header("overhead: echo tool, direct vs through the gateway", server, [
        f"backend: tests.backends.sdk_backend('echo') (official MCP SDK, stateful, SSE answers), {where}",
        f"concurrent: {threads} threads x {per_round * ROUNDS} calls per mode after {WARMUP} warm-up calls, "
        f"{ROUNDS} rounds alternating modes (D G G D ...)",
        f"sequential: 1 thread, {SEQUENTIAL_CALLS} calls per mode, alternating call by call",
    ])
    with contextlib.ExitStack() as stack:
        if backend_where == "process":
            backend = stack.enter_context(backend_process("sdk", "echo", "echo"))
        else:
            backend = stack.enter_context(sdk_backend("echo", tools=["echo"]))
        gw = stack.enter_context(gateway({"echo": backend.mcp_url}, server=server))
        modes = {"direct": (backend.mcp_url, "echo"), "gateway": (gw.url, "echo_echo")}
        clients = {mode: [stack.enter_context(McpClient(url)) for _ in range(threads)] for mode, (url, _) in modes.items()}

        def warm(index: int) -> None:
            for mode, (_, tool) in modes.items():
                client = clients[mode][index]
                client.initialize()
                for i in range(WARMUP):
                    echo(client, tool, f"w{i}")

        raise_failures(run_threads(threads, warm))
        settle_heap()

        # -- concurrent, rounds alternating the modes -------------------------------------
        latencies: dict[str, list[float]] = {"direct": [], "gateway": []}
        wall = {"direct": 0.0, "gateway": 0.0}
        cpu = {"direct": 0.0, "gateway": 0.0}  # the gateway worker's CPU seconds in each mode
        backend_cpu = {"direct": 0.0, "gateway": 0.0}  # the backend process's, when it has its own
        order = []
        for round_no in range(ROUNDS):
            order.extend(("direct", "gateway") if round_no % 2 == 0 else ("gateway", "direct"))
        for mode in order:
            tool = modes[mode][1]

            def work(index: int, mode: str = mode, tool: str = tool) -> list[float]:
                client = clients[mode][index]
                samples = []
                for i in range(per_round):
                    started = time.perf_counter()
                    echo(client, tool, f"{index}-{i}")
                    samples.append(time.perf_counter() - started)
                return samples

            cpu_before = gw.cpu_seconds()
            backend_before = process_cpu_seconds(backend.pid) if backend_where == "process" else 0.0
            started = time.perf_counter()
            results = run_threads(threads, work, timeout=60)
            wall[mode] += time.perf_counter() - started
            if cpu_before is not None:
                cpu[mode] += gw.cpu_seconds() - cpu_before
            if backend_where == "process":
                backend_cpu[mode] += process_cpu_seconds(backend.pid) - backend_before
            raise_failures(results)
            for samples in results:
                latencies[mode].extend(samples)

        # -- sequential, alternating call by call ------------------------------------------
        sequential: dict[str, list[float]] = {"direct": [], "gateway": []}
        for i in range(SEQUENTIAL_CALLS):
            for mode in (("direct", "gateway") if i % 2 == 0 else ("gateway", "direct")):
                client = clients[mode][0]
                started = time.perf_counter()
                echo(client, modes[mode][1], f"s{i}")
                sequential[mode].append(time.perf_counter() - started)

    conc = {mode: Stats.of(samples) for mode, samples in latencies.items()}
    seq = {mode: Stats.of(samples) for mode, samples in sequential.items()}
    rate = {mode: len(latencies[mode]) / wall[mode] for mode in wall}
    overhead_conc = conc["gateway"].p50 - conc["direct"].p50
    overhead_seq = seq["gateway"].p50 - seq["direct"].p50
    ratio = rate["gateway"] / rate["direct"]

    print(f"concurrent ({threads} threads, {len(latencies['direct'])} calls per mode)")
    calls_per_mode = len(latencies["gateway"])
    if gw.pid is not None:
        print(f"CPU per call: gateway worker {cpu['gateway'] / calls_per_mode * 1000:.2f} ms"
              + (f"; backend process {backend_cpu['direct'] / calls_per_mode * 1000:.2f} ms (direct), "
                 f"{backend_cpu['gateway'] / calls_per_mode * 1000:.2f} ms (through the gateway)"
                 if backend_where == "process" else ""))
    print(table(["mode", "p50", "p99", "mean", "max", "throughput"], [
        (mode, f"{s.p50:.2f} ms", f"{s.p99:.2f} ms", f"{s.mean:.2f} ms", f"{s.max:.1f} ms", f"{rate[mode]:.0f} calls/s")
        for mode, s in conc.items()
    ] + [("gateway - direct", f"{overhead_conc:+.2f} ms", f"{conc['gateway'].p99 - conc['direct'].p99:+.2f} ms",
          f"{conc['gateway'].mean - conc['direct'].mean:+.2f} ms", "", f"ratio {ratio:.2f}")]))
    print()
    print(f"sequential (1 thread, {SEQUENTIAL_CALLS} calls per mode)")
    print(table(["mode", "p50", "p99", "mean", "min"], [
        (mode, f"{s.p50:.2f} ms", f"{s.p99:.2f} ms", f"{s.mean:.2f} ms", f"{s.min:.2f} ms") for mode, s in seq.items()
    ] + [("gateway - direct", f"{overhead_seq:+.2f} ms", f"{seq['gateway'].p99 - seq['direct'].p99:+.2f} ms",
          f"{seq['gateway'].mean - seq['direct'].mean:+.2f} ms", f"{seq['gateway'].min - seq['direct'].min:+.2f} ms")]))
    return [
        Check("p50 overhead, sequential", f"{overhead_seq:.2f} ms", f"< {TARGET_OVERHEAD_MS:g} ms",
              overhead_seq < TARGET_OVERHEAD_MS),
        Check(f"p50 overhead, {threads} threads", f"{overhead_conc:.2f} ms", f"< {TARGET_OVERHEAD_MS:g} ms",
              overhead_conc < TARGET_OVERHEAD_MS),
        Check(f"throughput gateway / direct, {threads} threads", f"{ratio:.2f}", f">= {TARGET_THROUGHPUT_RATIO:g}",
              ratio >= TARGET_THROUGHPUT_RATIO),
    ]


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--threads", type=int, default=16)
        parser.add_argument("--calls", type=int, default=200, help="calls per thread per mode")
        parser.add_argument("--backend", choices=("process", "inprocess"), default="process",
                            help="serve the backend in its own process (default) or in the clients' process")

    args = parse_args(__doc__.splitlines()[0], extra=extra)
    run_benchmark(lambda: body(args.server, args.threads, args.calls, args.backend))


if __name__ == "__main__":
    main()
