"""Fan-out: a fresh client session (initialize + tools/list) over 5 backends that each take
300 ms to answer every POST. Discovery must fan out: the time should be one backend's
handshake + list, not five of them.

    .venv/bin/python -m bench.fanout [--server werkzeug]
"""

from __future__ import annotations

import contextlib
import time

from bench._common import (
    Check,
    McpClient,
    gateway,
    median,
    parse_args,
    print_header,
    run_benchmark,
    table,
)

BACKENDS = 5
DELAY = 0.3
RUNS = 5
DIRECT_RUNS = 3
TARGET = 1.0


def one_session(url: str) -> tuple[float, float, int]:
    """(initialize s, tools/list s, tool count) for a fresh session."""
    with McpClient(url) as client:
        started = time.perf_counter()
        client.initialize()
        initialized = time.perf_counter()
        tools = client.list_tools()
        listed = time.perf_counter()
    return initialized - started, listed - initialized, len(tools)


def body(server: str) -> list[Check]:
    from tests.backends import delayed_backend

    print_header("fanout: fresh session, initialize + tools/list", server,
                 [f"{BACKENDS} delayed_backends, {DELAY * 1000:.0f} ms before every answer "
                  "(initialize, notifications/initialized, tools/list)", f"{RUNS} runs, median reported"])
    with contextlib.ExitStack() as stack:
        backends = [stack.enter_context(delayed_backend(DELAY, name=f"slow{i}")) for i in range(BACKENDS)]

        # The same client code straight to one backend: what one backend's discovery costs.
        direct = [sum(one_session(backends[0].mcp_url)[:2]) for _ in range(DIRECT_RUNS)]
        one_backend = median(direct)

        rows, totals = [], []
        with gateway({b.name: b.mcp_url for b in backends}, server=server) as gw:
            for run in range(1, RUNS + 1):
                init_s, list_s, count = one_session(gw.url)
                if count != 2 * BACKENDS:
                    raise RuntimeError(f"expected {2 * BACKENDS} tools through the gateway, got {count}")
                totals.append(init_s + list_s)
                rows.append((run, f"{init_s * 1000:.1f} ms", f"{list_s * 1000:.1f} ms", f"{(init_s + list_s) * 1000:.1f} ms"))
                time.sleep(0.4)  # let the closed session's backend DELETEs (300 ms each) finish

    print(table(["run", "initialize", "tools/list", "total"], rows))
    through = median(totals)
    sequential = BACKENDS * one_backend
    print()
    print(table(["measure", "value"], [
        (f"gateway: initialize + tools/list, median of {RUNS}", f"{through * 1000:.1f} ms"),
        (f"one backend direct: handshake + tools/list, median of {DIRECT_RUNS}", f"{one_backend * 1000:.1f} ms"),
        (f"sequential lower bound ({BACKENDS} x one backend)", f"{sequential * 1000:.1f} ms"),
        ("gateway / sequential bound", f"{through / sequential:.2f}x"),
        ("gateway - one backend (fan-out overhead)", f"{(through - one_backend) * 1000:.1f} ms"),
    ]))
    return [Check("fan-out session setup (median)", f"{through * 1000:.0f} ms", f"< {TARGET * 1000:.0f} ms",
                  through < TARGET)]


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    run_benchmark(lambda: body(args.server))


if __name__ == "__main__":
    main()
