"""Concurrent calls: one session, one backend, 10 concurrent tools/call of a tool that sleeps
500 ms without blocking the backend. They must overlap in the gateway (same session, same
backend connection): all done in about 0.5 s, not 10 x 0.5 s.

Two backends are measured, each in its own gateway: the official-SDK backend (async
``sleep``, answers as SSE) and the raw delayed_backend (``sleep`` tool, JSON answers).

    .venv/bin/python -m bench.concurrent_calls [--server werkzeug]
"""

from __future__ import annotations

import contextlib
import time

from bench._common import (
    Check,
    McpClient,
    Stats,
    gateway,
    median,
    parse_args,
    print_header,
    raise_failures,
    run_benchmark,
    run_threads,
    table,
)

CALLS = 10
SLEEP = 0.5
ROUNDS = 3
TARGET = 1.5


def burst(client: McpClient, tool: str) -> tuple[float, list[float]]:
    """CALLS concurrent calls on ``client``'s session: (wall seconds, per-call seconds)."""
    forks = [client.fork() for _ in range(CALLS)]
    # One warm-up call per connection so the burst does not measure TCP connects.
    for fork in forks:
        fork.request("ping")
    started = time.perf_counter()

    def work(index: int) -> float:
        begun = time.perf_counter()
        result = forks[index].call_tool(tool, {"seconds": SLEEP})
        if result["content"][0]["text"] != "slept":
            raise RuntimeError(f"unexpected answer {result}")
        return time.perf_counter() - begun

    results = run_threads(CALLS, work, timeout=30)
    wall = time.perf_counter() - started
    raise_failures(results)
    for fork in forks:
        fork.http.close()
    return wall, results


def body(server: str) -> list[Check]:
    from tests.backends import delayed_backend, sdk_backend

    print_header("concurrent_calls: 10 x tools/call sleep(0.5) on one session", server,
                 [f"{CALLS} threads, each its own HTTP connection, same MCP session; {ROUNDS} rounds per backend",
                  f"ideal {SLEEP:.1f} s; fully serialized {CALLS * SLEEP:.1f} s"])
    rows, checks = [], []
    for label, factory in (("sdk_backend (SSE answers)", lambda: sdk_backend("sdk", tools=["sleep"])),
                           ("delayed_backend(0) (JSON answers)", lambda: delayed_backend(0, name="raw"))):
        with contextlib.ExitStack() as stack:
            backend = stack.enter_context(factory())
            gw = stack.enter_context(gateway({backend.name: backend.mcp_url}, server=server))
            client = stack.enter_context(McpClient(gw.url))
            client.initialize()
            tool = f"{backend.name}_sleep"
            if tool not in client.list_tools():
                raise RuntimeError(f"{tool} not advertised")
            walls, calls = [], []
            for _ in range(ROUNDS):
                wall, per_call = burst(client, tool)
                walls.append(wall)
                calls.extend(per_call)
        wall = median(walls)
        latency = Stats.of(calls)
        rows.append((label, f"{wall * 1000:.0f} ms", f"{max(walls) * 1000:.0f} ms",
                     f"{latency.min:.0f} ms", f"{latency.p50:.0f} ms", f"{latency.max:.0f} ms",
                     f"{wall / SLEEP:.2f}x", f"{CALLS * SLEEP / wall:.1f}x"))
        checks.append(Check(f"{CALLS} concurrent calls, {label.split()[0]} (median wall)",
                            f"{wall * 1000:.0f} ms", f"<= {TARGET * 1000:.0f} ms", wall <= TARGET))
    print(table(["backend", "wall (median)", "wall (worst)", "call min", "call p50", "call max",
                 "wall / ideal", "speed-up vs serial"], rows))
    return checks


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    run_benchmark(lambda: body(args.server))


if __name__ == "__main__":
    main()
