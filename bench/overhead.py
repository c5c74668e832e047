"""Overhead: the same client code calling a trivial echo tool on one official-SDK backend,
(a) directly and (b) through the gateway, side by side in one run, for a 2025-11-25 client
(a session) and a 2026-07-28 client (no session, metadata on every request): four modes,
direct-legacy, gateway-legacy, direct-modern, gateway-modern. The backend speaks both; the
gateway probes it and speaks 2026-07-28 to it (``--pin-backend legacy`` makes it speak
2025-11-25, the shape measured before issue 11).

The backend runs in its own process by default (as backends do in production): in the
clients' process, the 16 client threads and the backend would share one GIL, capping the
direct mode at one core while the gateway mode gets a second process, which flatters the
gateway. ``--backend inprocess`` measures that variant anyway.

* Concurrent: 16 client threads, each with its own client (an MCP session for a legacy
  client) and requests.Session per mode; after a warm-up, N calls per thread per mode, in
  rounds that take the modes in order, then in reverse (DL GL DM GM, GM DM GL DL, ...) so
  machine noise lands on all alike. Latency p50/p99 and throughput (calls/s over the
  rounds' wall time) per mode, and gateway / direct per client era.
* Sequential: one thread, calls rotating over the modes one by one: the cleanest p50
  overhead.

The gateway's admin state says which era it spoke to the backend (``backendEras``); a
target checks it is the one the run claims to measure (auto: 2026-07-28, this backend
serves both).

    .venv/bin/python -m bench.overhead [--server werkzeug] [--calls 200] [--threads 16] [--backend inprocess]
                                       [--eras legacy,modern] [--pin-backend auto|legacy|modern]
"""

from __future__ import annotations

import contextlib
import time

from bench._common import (
    Check,
    McpClient,
    Stats,
    admin_config,
    admin_state,
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
ERAS = ("legacy", "modern")  # 2025-11-25 (initialize, a session) and 2026-07-28 (no session)
SEQUENTIAL_CALLS = 400
TARGET_OVERHEAD_MS = 2.0
TARGET_THROUGHPUT_RATIO = 0.5


def echo(client: McpClient, tool: str, text: str) -> None:
    result = client.call_tool(tool, {"text": text})
    if result["content"][0]["text"] != f"echo:{text}":
        raise RuntimeError(f"unexpected answer {result}")


def body(server: str, threads: int, calls: int, backend_where: str, eras: tuple[str, ...] = ERAS,
         pin: str = "auto") -> list[Check]:
    from tests.backends import sdk_backend

    per_round = max(1, calls // ROUNDS)
    where = "in its own process" if backend_where == "process" else "in this (the clients') process"
    print_header("overhead: echo tool, direct vs through the gateway", server, [
        f"backend: tests.backends.sdk_backend('echo') (official MCP SDK: 2025-11-25 with sessions and SSE "
        f"answers, and 2026-07-28), {where}",
        f"client eras: {', '.join(eras)}; the gateway's backend entry: protocol: {pin}",
        f"concurrent: {threads} threads x {per_round * ROUNDS} calls per mode after {WARMUP} warm-up calls, "
        f"{ROUNDS} rounds taking the modes in order, then reversed",
        f"sequential: 1 thread, {SEQUENTIAL_CALLS} calls per mode, rotating call by call",
    ])
    with contextlib.ExitStack() as stack:
        if backend_where == "process":
            backend = stack.enter_context(backend_process("sdk", "echo", "echo"))
        else:
            backend = stack.enter_context(sdk_backend("echo", tools=["echo"]))
        extra = admin_config()
        if pin != "auto":
            extra["backends"] = [{"name": "echo", "url": backend.mcp_url, "protocol": pin}]
        gw = stack.enter_context(gateway({"echo": backend.mcp_url}, server=server, extra=extra))
        modes = {}
        for era in eras:
            modes[f"direct-{era}"] = (backend.mcp_url, "echo", era == "modern")
            modes[f"gateway-{era}"] = (gw.url, "echo_echo", era == "modern")
        clients = {mode: [stack.enter_context(McpClient(url, modern=modern)) for _ in range(threads)]
                   for mode, (url, _, modern) in modes.items()}

        def warm(index: int) -> None:
            for mode, (_, tool, _modern) in modes.items():
                client = clients[mode][index]
                client.initialize()
                for i in range(WARMUP):
                    echo(client, tool, f"w{i}")

        raise_failures(run_threads(threads, warm))
        spoken = admin_state(gw).get("backendEras", {}).get("echo", "unknown")
        settle_heap()

        # -- concurrent, rounds alternating the modes -------------------------------------
        names = list(modes)
        latencies: dict[str, list[float]] = {mode: [] for mode in names}
        wall = {mode: 0.0 for mode in names}
        cpu = {mode: 0.0 for mode in names}  # the gateway worker's CPU seconds in each mode
        backend_cpu = {mode: 0.0 for mode in names}  # the backend process's, when it has its own
        order = []
        for round_no in range(ROUNDS):
            order.extend(names if round_no % 2 == 0 else reversed(names))
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
            try:
                raise_failures(results)
            except RuntimeError as exc:
                raise RuntimeError(f"{mode}, concurrent round {len(latencies[mode]) // (threads * per_round) + 1}: "
                                   f"{exc}") from exc.__cause__
            for samples in results:
                latencies[mode].extend(samples)

        # -- sequential, alternating call by call ------------------------------------------
        sequential: dict[str, list[float]] = {mode: [] for mode in names}
        for i in range(SEQUENTIAL_CALLS):
            for mode in (names if i % 2 == 0 else reversed(names)):
                client = clients[mode][0]
                started = time.perf_counter()
                try:
                    echo(client, modes[mode][1], f"s{i}")
                except Exception as exc:
                    raise RuntimeError(f"{mode}, sequential call {i + 1}: {exc!r}") from exc
                sequential[mode].append(time.perf_counter() - started)

    conc = {mode: Stats.of(samples) for mode, samples in latencies.items()}
    seq = {mode: Stats.of(samples) for mode, samples in sequential.items()}
    rate = {mode: len(latencies[mode]) / wall[mode] for mode in wall}

    expected = "modern" if pin == "auto" else pin
    print(f"the gateway spoke to the backend: {spoken} (backend entry: protocol: {pin}; admin state backendEras)")
    print()
    print(f"concurrent ({threads} threads, {len(latencies[names[0]])} calls per mode)")
    if gw.pid is not None:
        for era in eras:
            mode = f"gateway-{era}"
            calls_per_mode = len(latencies[mode])
            print(f"CPU per call, {era} client: gateway worker {cpu[mode] / calls_per_mode * 1000:.2f} ms"
                  + (f"; backend process {backend_cpu[f'direct-{era}'] / calls_per_mode * 1000:.2f} ms (direct), "
                     f"{backend_cpu[mode] / calls_per_mode * 1000:.2f} ms (through the gateway)"
                     if backend_where == "process" else ""))
    rows = [(mode, f"{s.p50:.2f} ms", f"{s.p99:.2f} ms", f"{s.mean:.2f} ms", f"{s.max:.1f} ms",
             f"{rate[mode]:.0f} calls/s") for mode, s in conc.items()]
    checks = [Check("the era the gateway spoke to the backend", spoken, expected, spoken == expected)]
    seq_rows = [(mode, f"{s.p50:.2f} ms", f"{s.p99:.2f} ms", f"{s.mean:.2f} ms", f"{s.min:.2f} ms")
                for mode, s in seq.items()]
    for era in eras:
        direct, through = f"direct-{era}", f"gateway-{era}"
        overhead_conc = conc[through].p50 - conc[direct].p50
        overhead_seq = seq[through].p50 - seq[direct].p50
        ratio = rate[through] / rate[direct]
        rows.append((f"{era}: gateway - direct, per call", f"{overhead_conc:+.2f} ms",
                     f"{conc[through].p99 - conc[direct].p99:+.2f} ms",
                     f"{conc[through].mean - conc[direct].mean:+.2f} ms", "", f"ratio {ratio:.2f}"))
        seq_rows.append((f"{era}: gateway - direct, per call", f"{overhead_seq:+.2f} ms",
                         f"{seq[through].p99 - seq[direct].p99:+.2f} ms",
                         f"{seq[through].mean - seq[direct].mean:+.2f} ms",
                         f"{seq[through].min - seq[direct].min:+.2f} ms"))
        checks += [
            Check(f"{era} client: p50 overhead, sequential", f"{overhead_seq:.2f} ms", f"< {TARGET_OVERHEAD_MS:g} ms",
                  overhead_seq < TARGET_OVERHEAD_MS),
            Check(f"{era} client: p50 overhead, {threads} threads", f"{overhead_conc:.2f} ms",
                  f"< {TARGET_OVERHEAD_MS:g} ms", overhead_conc < TARGET_OVERHEAD_MS),
            Check(f"{era} client: throughput gateway / direct, {threads} threads", f"{ratio:.2f}",
                  f">= {TARGET_THROUGHPUT_RATIO:g}", ratio >= TARGET_THROUGHPUT_RATIO),
        ]
    print(table(["mode", "p50", "p99", "mean", "max", "throughput"], rows))
    print()
    print(f"sequential (1 thread, {SEQUENTIAL_CALLS} calls per mode)")
    print(table(["mode", "p50", "p99", "mean", "min"], seq_rows))
    return checks


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--threads", type=int, default=16)
        parser.add_argument("--calls", type=int, default=200, help="calls per thread per mode")
        parser.add_argument("--backend", choices=("process", "inprocess"), default="process",
                            help="serve the backend in its own process (default) or in the clients' process")
        parser.add_argument("--eras", default="legacy,modern",
                            help="client eras to measure: legacy (2025-11-25), modern (2026-07-28), or both")
        parser.add_argument("--pin-backend", choices=("auto", "legacy", "modern"), default="auto",
                            help="the era the gateway speaks to the backend (auto: it probes: modern)")

    args = parse_args(__doc__.splitlines()[0], extra=extra)
    eras = tuple(dict.fromkeys(era.strip() for era in args.eras.split(",") if era.strip()))
    if not eras or set(eras) - set(ERAS):
        raise SystemExit(f"--eras: a comma-separated list of {', '.join(ERAS)} (got {args.eras!r})")
    run_benchmark(lambda: body(args.server, args.threads, args.calls, args.backend, eras, args.pin_backend))


if __name__ == "__main__":
    main()
