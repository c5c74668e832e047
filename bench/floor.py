"""Diagnostic (no target, not in run_all): where the gateway's per-call latency stands
between the direct call and the floor of its web stack.

One thread, one echo call at a time, rotating over three paths to the same official-SDK
backend (in its own process):

* direct: the client straight to the backend;
* floor: a bare Flask view that forwards the POST with requests, under gunicorn with
  the gateway's settings (bench/_floor_app.py): what gunicorn + Flask + requests cost;
* gateway: vmcp-actors serve.

gateway - floor is what the gateway's own machinery (actors, threads, parsing) adds.

    .venv/bin/python -m bench.floor [--calls 400]
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from pathlib import Path

from bench._common import (
    McpClient,
    Stats,
    backend_process,
    gateway,
    parse_args,
    print_header,
    run_benchmark,
    serve_subprocess,
    settle_heap,
    table,
)

WARMUP = 30


def body(calls: int) -> list:
    print_header("floor: direct vs bare Flask+requests proxy vs gateway, one call at a time", "gunicorn",
                 ["backend: tests.backends.sdk_backend('echo') in its own process",
                  "floor: bench/_floor_app.py under gunicorn with vmcp_actors.web.gunicorn_settings.SETTINGS",
                  f"{calls} calls per path, rotating path by path"])
    with contextlib.ExitStack() as stack:
        backend = stack.enter_context(backend_process("sdk", "echo", "echo"))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vmcp-floor-")))
        floor_base, _ = stack.enter_context(serve_subprocess(
            lambda port: [sys.executable, "-m", "bench._floor_app", "--port", str(port), "--backend", backend.mcp_url],
            tmp / "floor.log"))
        gw = stack.enter_context(gateway({"echo": backend.mcp_url}))
        paths = {
            "direct": (stack.enter_context(McpClient(backend.mcp_url)), "echo"),
            "floor (gunicorn + Flask + requests)": (stack.enter_context(McpClient(floor_base + "/mcp")), "echo"),
            "gateway (vmcp-actors serve)": (stack.enter_context(McpClient(gw.url)), "echo_echo"),
        }
        for client, tool in paths.values():
            client.initialize()
            for i in range(WARMUP):
                client.call_tool(tool, {"text": f"w{i}"})
        settle_heap()
        samples: dict[str, list[float]] = {name: [] for name in paths}
        names = list(paths)
        for i in range(calls):
            for name in names[i % 3:] + names[:i % 3]:
                client, tool = paths[name]
                started = time.perf_counter()
                client.call_tool(tool, {"text": f"s{i}"})
                samples[name].append(time.perf_counter() - started)
    stats = {name: Stats.of(values) for name, values in samples.items()}
    direct = stats["direct"].p50
    print(table(["path", "p50", "p99", "p50 - direct"],
                [(name, f"{s.p50:.2f} ms", f"{s.p99:.2f} ms", f"{s.p50 - direct:+.2f} ms") for name, s in stats.items()]))
    floor, through = stats[names[1]].p50, stats[names[2]].p50
    print(f"\ngateway - floor (the gateway's own machinery): {through - floor:+.2f} ms at p50")
    return []


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--calls", type=int, default=400)

    args = parse_args(__doc__.splitlines()[0], extra=extra)
    run_benchmark(lambda: body(args.calls))


if __name__ == "__main__":
    main()
