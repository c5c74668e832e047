"""Composite tools run their steps as a DAG: three independent steps that each take 500 ms
finish in about 500 ms, not 1.5 s.

One backend (official SDK, async ``sleep``), one session. Measured side by side in one
run: a direct call of ``sleep(0.5)`` through the gateway (the floor), a composite of three
independent ``sleep(0.5)`` steps, and a composite of the same three steps chained with
``dependsOn`` (the serial reference).

    .venv/bin/python -m bench.composite_parallel [--server werkzeug]
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

SLEEP = 0.5
ROUNDS = 5
TARGET_RATIO = 1.2  # three parallel steps vs one direct call


def _sleep_step(step_id: str, after: str | None = None) -> dict:
    step = {"id": step_id, "tool": "slow.sleep", "arguments": {"seconds": SLEEP}}
    if after is not None:
        step["dependsOn"] = [after]
    return step


COMPOSITES = [
    {"name": "three_parallel", "description": "three independent 500 ms steps",
     "steps": [_sleep_step("a"), _sleep_step("b"), _sleep_step("c")]},
    {"name": "three_chained", "description": "the same steps, one after another",
     "steps": [_sleep_step("a"), _sleep_step("b", "a"), _sleep_step("c", "b")]},
]


def timed(client: McpClient, tool: str, arguments: dict | None = None) -> float:
    started = time.perf_counter()
    result = client.call_tool(tool, arguments or {})
    elapsed = time.perf_counter() - started
    if result.get("isError"):
        raise RuntimeError(f"{tool} failed: {result}")
    return elapsed


def body(server: str) -> list[Check]:
    from tests.backends import sdk_backend

    print_header("composite_parallel: three independent 500 ms steps", server,
                 [f"{ROUNDS} rounds, interleaved; one session; ideal {SLEEP * 1000:.0f} ms, "
                  f"serial {3 * SLEEP * 1000:.0f} ms"])
    with contextlib.ExitStack() as stack:
        backend = stack.enter_context(sdk_backend("slow", tools=["sleep"]))
        gw = stack.enter_context(gateway({"slow": backend.mcp_url}, server=server,
                                         extra={"compositeTools": COMPOSITES}))
        client = stack.enter_context(McpClient(gw.url))
        client.initialize()
        advertised = client.list_tools()
        missing = {"slow_sleep", "three_parallel", "three_chained"} - set(advertised)
        if missing:
            raise RuntimeError(f"not advertised: {sorted(missing)}")
        timed(client, "three_parallel")  # warm-up: discovery, connections, template compilation
        samples: dict[str, list[float]] = {"direct": [], "three_parallel": [], "three_chained": []}
        for _ in range(ROUNDS):
            samples["direct"].append(timed(client, "slow_sleep", {"seconds": SLEEP}))
            samples["three_parallel"].append(timed(client, "three_parallel"))
            samples["three_chained"].append(timed(client, "three_chained"))
    direct = median(samples["direct"])
    parallel = median(samples["three_parallel"])
    chained = median(samples["three_chained"])
    rows = [(name, f"{median(values) * 1000:.0f} ms", f"{min(values) * 1000:.0f} ms",
             f"{max(values) * 1000:.0f} ms", f"{median(values) / direct:.2f}")
            for name, values in (("direct call sleep(0.5)", samples["direct"]),
                                 ("composite, 3 independent steps", samples["three_parallel"]),
                                 ("composite, 3 chained steps", samples["three_chained"]))]
    print(table(["call", "median", "min", "max", "ratio to direct"], rows))
    return [
        Check("3 independent 500 ms steps vs one direct 500 ms call (median ratio)",
              f"{parallel / direct:.2f} ({parallel * 1000:.0f} ms)", f"<= {TARGET_RATIO}",
              parallel / direct <= TARGET_RATIO),
        Check("3 chained steps vs 3 independent steps (median ratio, shows the DAG overlap)",
              f"{chained / parallel:.2f}", ">= 2.5", chained / parallel >= 2.5),
    ]


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    run_benchmark(lambda: body(args.server))


if __name__ == "__main__":
    main()
