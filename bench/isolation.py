"""Isolation: a hanging backend must not slow the others. Two sessions (A, B) over a
hanging backend and a good one. With 4 calls to the hanging backend in flight on session
A, time 50 calls to the good backend on A and 50 on B, and compare with a baseline
taken just before, without the hanging calls.

The hanging backend is tests.backends.hanging_backend(answer_initialize=True) with
``hang`` cleared during discovery (so its tools are advertised), then set again: every
``tools/call`` to it waits until it is cleared at the end (then they complete).

    .venv/bin/python -m bench.isolation [--server werkzeug]
"""

from __future__ import annotations

import contextlib
import threading
import time

from bench._common import (
    Check,
    McpClient,
    Stats,
    gateway,
    parse_args,
    print_header,
    run_benchmark,
    settle_heap,
    table,
)

HANGING_CALLS = 4
CALLS = 50
WARMUP = 10


def sample(client: McpClient, count: int) -> list[float]:
    latencies = []
    for i in range(count):
        started = time.perf_counter()
        result = client.call_tool("good_echo", {"text": f"x{i}"})
        latencies.append(time.perf_counter() - started)
        if result["content"][0]["text"] != f"good:x{i}":
            raise RuntimeError(f"unexpected answer {result}")
    return latencies


def body(server: str) -> list[Check]:
    from tests.backends import hanging_backend, sdk_backend

    print_header("isolation: good-backend latency while a backend hangs", server,
                 ["sessions A and B over backends 'good' (sdk_backend echo) and 'hanging'",
                  f"{CALLS} sequential calls to good_echo per session and phase, after {WARMUP} warm-up calls; "
                  f"{HANGING_CALLS} hanging calls in flight on session A during the second phase"])
    with contextlib.ExitStack() as stack:
        good = stack.enter_context(sdk_backend("good", tools=["echo"]))
        hanging = stack.enter_context(hanging_backend(answer_initialize=True, name="hanging"))
        hanging.hang = False  # let discovery through; the calls will hang
        gw = stack.enter_context(gateway({"good": good.mcp_url, "hanging": hanging.mcp_url}, server=server))
        session_a = stack.enter_context(McpClient(gw.url))
        session_b = stack.enter_context(McpClient(gw.url))
        for client in (session_a, session_b):
            client.initialize()
            tools = client.list_tools()
            if not {"good_echo", "hanging_echo"} <= set(tools):
                raise RuntimeError(f"discovery incomplete: {tools}")
            sample(client, WARMUP)

        settle_heap()
        baseline = {"A": sample(session_a, CALLS), "B": sample(session_b, CALLS)}

        hanging.hang = True
        hanging.clear_received()
        outcomes: list[object] = []
        hang_clients = [session_a.fork() for _ in range(HANGING_CALLS)]

        def hang_call(client: McpClient) -> None:
            try:
                outcomes.append(client.call_tool("hanging_echo", {"text": "stuck"}, timeout=60))
            except Exception as exc:  # noqa: BLE001 - checked below
                outcomes.append(exc)

        threads = [threading.Thread(target=hang_call, args=(c,), daemon=True) for c in hang_clients]
        for thread in threads:
            thread.start()
        try:
            hanging.wait_for("tools/call", count=HANGING_CALLS, timeout=10)
            stuck = {"A": sample(session_a, CALLS), "B": sample(session_b, CALLS)}
            still_hanging = sum(1 for t in threads if t.is_alive())
        finally:
            hanging.hang = False  # release them: they complete normally
            for thread in threads:
                thread.join(15)
            for client in hang_clients:
                client.http.close()
        failures = [o for o in outcomes if isinstance(o, Exception)]
        if still_hanging != HANGING_CALLS or failures or len(outcomes) != HANGING_CALLS:
            raise RuntimeError(f"hanging calls misbehaved: {still_hanging} in flight while measuring, "
                               f"outcomes {outcomes}")

    rows, checks = [], []
    for label, key in (("same session (A)", "A"), ("other session (B)", "B")):
        base, hang = Stats.of(baseline[key]), Stats.of(stuck[key])
        limit = 2 * base.p99 + 20
        rows.append((label, f"{base.p50:.2f} ms", f"{base.p99:.2f} ms", f"{hang.p50:.2f} ms", f"{hang.p99:.2f} ms",
                     f"{hang.p50 / base.p50:.2f}x", f"{hang.p99 / base.p99:.2f}x"))
        checks.append(Check(f"p99 with {HANGING_CALLS} hanging calls, {label}", f"{hang.p99:.2f} ms",
                            f"<= 2 x {base.p99:.2f} + 20 = {limit:.2f} ms", hang.p99 <= limit))
    print(table(["good_echo calls on", "baseline p50", "baseline p99", "hanging p50", "hanging p99",
                 "p50 ratio", "p99 ratio"], rows))
    print(f"\n{HANGING_CALLS} hanging calls were in flight during the whole second phase; released afterwards, "
          "all completed.")
    return checks


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    run_benchmark(lambda: body(args.server))


if __name__ == "__main__":
    main()
