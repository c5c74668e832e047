"""Before/after: the same benchmark against the gateway of another commit (``--ref``,
"before") and of the working tree ("after"), interleaved, side by side with ratios.

The ref is extracted with ``git archive REF | tar -x`` into a temp dir; each gateway is
served from its source tree (``vmcp_actors`` first on PYTHONPATH, run in the tree; see
VMCP_BENCH_GATEWAY_TREE in bench/_common.py), and the harness checks from the gateway's
own log that the ``vmcp_actors`` it imported is that tree's. ``--after-ref REF`` takes the
"after" side from a commit too (``--ref HEAD --after-ref HEAD``: identical code, ratios ~1).
The benchmark code, test backends and clients are the working tree's for both sides.

* ``overhead``: one run, one SDK echo backend in its own process, both gateways up at once.
  Concurrent: 16 client threads per mode (direct, before, after), rounds in every order of
  the three modes (each mode in each position alike); sequential: 1 thread, calls rotated
  mode by mode. Targets (T3, issue 9): after/before throughput and p50 overhead.
* any other benchmark (e.g. ``threads``): whole runs of ``python -m bench.NAME``, sides
  alternating (before, after, after, before, ...) for ``--rounds``; the metrics and
  targets each run records (VMCP_BENCH_RESULTS) side by side, medians over rounds. Extra
  arguments are passed on to it (``threads --idle-release 2s``).

    .venv/bin/python -m bench.compare --ref REF [--after-ref REF] [--rounds N] [overhead] [threads ...] [ARGS]
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from bench._common import (
    GATEWAY_TREE_ENV,
    RESULTS_ENV,
    ROOT,
    WATCHDOG_SECONDS,
    Check,
    McpClient,
    Stats,
    _die_with_parent,
    backend_process,
    gateway,
    median,
    print_header,
    raise_failures,
    run_benchmark,
    run_threads,
    settle_heap,
    table,
)
from bench.overhead import SEQUENTIAL_CALLS, WARMUP, echo

SIDES = ("before", "after")
SCRIPT_TIMEOUT = 300.0  # one run of a benchmark script (bench.threads takes up to ~4 min)
# T3: "no worse than before", with room for what this shared 2-vCPU machine adds run to run.
TARGET_THROUGHPUT_RATIO = 0.90  # after / before, gateway calls/s with 16 threads
TARGET_SEQUENTIAL_SLACK_MS = 0.30  # after's sequential p50 overhead at most before's + this


# ----------------------------------------------------------------------------------
# The two source trees
# ----------------------------------------------------------------------------------


def resolve(ref: str) -> str:
    done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise SystemExit(f"not a commit: {ref!r}")
    return done.stdout.strip()


@contextlib.contextmanager
def extracted(commit: str) -> Iterator[Path]:
    """``git archive COMMIT | tar -x`` into a temp dir (removed on exit)."""
    with tempfile.TemporaryDirectory(prefix=f"vmcp-ref-{commit[:8]}-") as tmp:
        archive = subprocess.Popen(["git", "archive", commit], cwd=ROOT, stdout=subprocess.PIPE)
        untar = subprocess.run(["tar", "-x", "-C", tmp], stdin=archive.stdout, timeout=120)
        archive.stdout.close()
        if archive.wait(60) != 0 or untar.returncode != 0:
            raise RuntimeError(f"git archive {commit} | tar -x failed")
        yield Path(tmp)


# ----------------------------------------------------------------------------------
# overhead, both gateways in one run
# ----------------------------------------------------------------------------------


def compare_overhead(trees: Mapping[str, Path], threads: int, calls: int) -> list[Check]:
    modes = ("direct", *SIDES)
    orders = list(itertools.permutations(modes))  # every mode in every position alike
    per_round = max(1, calls // len(orders))
    with contextlib.ExitStack() as stack:
        backend = stack.enter_context(backend_process("sdk", "echo", "echo"))
        gws = {side: stack.enter_context(gateway({"echo": backend.mcp_url}, tree=trees[side])) for side in SIDES}
        for side in SIDES:
            print(f"{side}: gateway worker {gws[side].pid} runs {gws[side].source}")
        targets = {"direct": (backend.mcp_url, "echo"), **{side: (gws[side].url, "echo_echo") for side in SIDES}}
        clients = {mode: [stack.enter_context(McpClient(url)) for _ in range(threads)]
                   for mode, (url, _) in targets.items()}

        def warm(index: int) -> None:
            for mode, (_, tool) in targets.items():
                clients[mode][index].initialize()
                for i in range(WARMUP):
                    echo(clients[mode][index], tool, f"w{i}")

        raise_failures(run_threads(threads, warm))
        settle_heap()

        latencies: dict[str, list[float]] = {mode: [] for mode in modes}
        wall = dict.fromkeys(modes, 0.0)
        cpu = dict.fromkeys(SIDES, 0.0)  # each gateway worker's CPU seconds while it was measured
        for mode in itertools.chain.from_iterable(orders):
            tool = targets[mode][1]

            def work(index: int, mode: str = mode, tool: str = tool) -> list[float]:
                samples = []
                for i in range(per_round):
                    started = time.perf_counter()
                    echo(clients[mode][index], tool, f"{index}-{i}")
                    samples.append(time.perf_counter() - started)
                return samples

            cpu_before = gws[mode].cpu_seconds() if mode in gws else None
            started = time.perf_counter()
            results = run_threads(threads, work, timeout=60)
            wall[mode] += time.perf_counter() - started
            if cpu_before is not None:
                cpu[mode] += gws[mode].cpu_seconds() - cpu_before
            raise_failures(results)
            for samples in results:
                latencies[mode].extend(samples)

        sequential: dict[str, list[float]] = {mode: [] for mode in modes}
        for i in range(SEQUENTIAL_CALLS):
            for mode in orders[i % len(orders)]:
                started = time.perf_counter()
                echo(clients[mode][0], targets[mode][1], f"s{i}")
                sequential[mode].append(time.perf_counter() - started)

    conc = {mode: Stats.of(samples) for mode, samples in latencies.items()}
    seq = {mode: Stats.of(samples) for mode, samples in sequential.items()}
    rate = {mode: len(latencies[mode]) / wall[mode] for mode in modes}
    cpu_ms = {side: cpu[side] / len(latencies[side]) * 1000 for side in SIDES}
    over_conc = {side: conc[side].p50 - conc["direct"].p50 for side in SIDES}
    over_seq = {side: seq[side].p50 - seq["direct"].p50 for side in SIDES}

    print(f"\nconcurrent ({threads} threads, {len(latencies['direct'])} calls per mode, "
          f"{len(orders)} rounds in every order of the modes)")
    print(table(["mode", "p50", "p99", "mean", "throughput", "gateway CPU per call"], [
        (mode, f"{s.p50:.2f} ms", f"{s.p99:.2f} ms", f"{s.mean:.2f} ms", f"{rate[mode]:.0f} calls/s",
         f"{cpu_ms[mode]:.2f} ms" if mode in cpu_ms else "") for mode, s in conc.items()]))
    print(f"\nsequential (1 thread, {SEQUENTIAL_CALLS} calls per mode)")
    print(table(["mode", "p50", "p99", "mean", "min"], [
        (mode, f"{s.p50:.2f} ms", f"{s.p99:.2f} ms", f"{s.mean:.2f} ms", f"{s.min:.2f} ms")
        for mode, s in seq.items()]))
    throughput_ratio = rate["after"] / rate["before"]
    print("\nafter vs before")
    print(table(["measure", "before", "after", "after / before", "after - before"], [
        (f"gateway throughput, {threads} threads", f"{rate['before']:.0f} calls/s", f"{rate['after']:.0f} calls/s",
         f"{throughput_ratio:.2f}", ""),
        ("throughput gateway / direct", f"{rate['before'] / rate['direct']:.2f}",
         f"{rate['after'] / rate['direct']:.2f}", "", ""),
        ("gateway CPU per call", f"{cpu_ms['before']:.2f} ms", f"{cpu_ms['after']:.2f} ms",
         f"{cpu_ms['after'] / cpu_ms['before']:.2f}", f"{cpu_ms['after'] - cpu_ms['before']:+.2f} ms"),
        ("p50 overhead, sequential", f"{over_seq['before']:.2f} ms", f"{over_seq['after']:.2f} ms",
         f"{over_seq['after'] / over_seq['before']:.2f}", f"{over_seq['after'] - over_seq['before']:+.2f} ms"),
        (f"p50 overhead, {threads} threads", f"{over_conc['before']:.2f} ms", f"{over_conc['after']:.2f} ms",
         f"{over_conc['after'] / over_conc['before']:.2f}", f"{over_conc['after'] - over_conc['before']:+.2f} ms"),
    ]))
    slack = over_seq["after"] - over_seq["before"]
    return [
        Check(f"T3: gateway throughput after / before, {threads} threads", f"{throughput_ratio:.2f}",
              f">= {TARGET_THROUGHPUT_RATIO:.2f}", throughput_ratio >= TARGET_THROUGHPUT_RATIO),
        Check("T3: p50 overhead (sequential) after - before", f"{slack:+.2f} ms",
              f"<= +{TARGET_SEQUENTIAL_SLACK_MS:.2f} ms", slack <= TARGET_SEQUENTIAL_SLACK_MS),
    ]


# ----------------------------------------------------------------------------------
# Any other benchmark: whole runs, sides alternating
# ----------------------------------------------------------------------------------


def run_script(name: str, tree: Path, args: Sequence[str], label: str) -> dict | None:
    """One run of ``bench.NAME`` with its gateway from ``tree``; its recorded results (None: failed)."""
    print(f"\n######## bench.{name}: {label} ########\n", flush=True)
    with tempfile.TemporaryDirectory(prefix="vmcp-compare-") as tmp:
        results = Path(tmp) / "results.json"
        env = {**os.environ, GATEWAY_TREE_ENV: str(tree), RESULTS_ENV: str(results)}
        proc = subprocess.Popen([sys.executable, "-m", f"bench.{name}", *args], cwd=ROOT, env=env,
                                stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        try:
            code = proc.wait(SCRIPT_TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        if not results.exists():
            print(f"(bench.{name} {'timed out' if code is None else f'exited {code}'} without results)")
            return None
        return json.loads(results.read_text())


def number(text: str) -> float | None:
    match = re.match(r"\s*([-+]?\d+(?:\.\d+)?)", text)
    return float(match.group(1)) if match else None


def compare_script(name: str, trees: Mapping[str, Path], labels: Mapping[str, str], rounds: int,
                   args: Sequence[str]) -> list[Check]:
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for round_no in range(rounds):
        for side in (SIDES if round_no % 2 == 0 else SIDES[::-1]):
            outcome = run_script(name, trees[side], args, f"{side} ({labels[side]}), round {round_no + 1}")
            if outcome is not None:
                runs[side].append(outcome)
    missing = [side for side in SIDES if not runs[side]]
    if missing:
        return [Check(f"{name}: runs with results", f"none for {', '.join(missing)}", "every side", False)]

    def values(side: str) -> dict[str, list[float]]:
        found: dict[str, list[float]] = {}
        for run in runs[side]:
            for key, value in run["metrics"].items():
                found.setdefault(key, []).append(value)
            for check in run["checks"]:
                value = number(check["measured"])
                if value is not None:
                    found.setdefault(f"target: {check['name']}", []).append(value)
        return found

    before, after = values("before"), values("after")
    rows = []
    for key in sorted(dict.fromkeys([*after, *before]), key=lambda k: k.startswith("target: ")):
        b = median(before[key]) if key in before else None
        a = median(after[key]) if key in after else None
        rows.append((key, "-" if b is None else f"{b:g}", "-" if a is None else f"{a:g}",
                     f"{a / b:.2f}" if a is not None and b else ""))
    print(f"\n{name}: before vs after (median of {rounds} run{'s' if rounds > 1 else ''} per side)")
    print(table(["measure", "before", "after", "after / before"], rows))
    # The targets are the benchmark's own, as the working tree ("after") met them, last round.
    return [Check(f"{name}, after: {c['name']}", c["measured"], c["target"], c["ok"])
            for c in runs["after"][-1]["checks"]]


# ----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--ref", required=True, help="the commit measured as 'before'")
    parser.add_argument("--after-ref", default=None, help="take 'after' from this commit, not the working tree")
    parser.add_argument("--rounds", type=int, default=1, help="whole runs per side, other benchmarks (default 1)")
    parser.add_argument("--threads", type=int, default=16, help="overhead: client threads (default 16)")
    parser.add_argument("--calls", type=int, default=240, help="overhead: calls per thread per mode (default 240)")
    parser.add_argument("benchmarks", nargs="*", metavar="NAME", default=["overhead"],
                        help="overhead (default) and/or any bench.NAME that reports targets, e.g. threads")
    args, passed_on = parser.parse_known_args()
    for name in args.benchmarks:
        if name != "overhead" and not (ROOT / "bench" / f"{name}.py").is_file():
            parser.error(f"no benchmark bench/{name}.py")
    if passed_on and set(args.benchmarks) == {"overhead"}:
        parser.error(f"unrecognized arguments: {' '.join(passed_on)}")

    before = resolve(args.ref)
    after = resolve(args.after_ref) if args.after_ref else None
    labels = {"before": f"{args.ref} = {before[:8]}",
              "after": f"{args.after_ref} = {after[:8]}" if after else "the working tree"}
    print_header("compare: benchmarks against the gateway before vs after", "gunicorn", [
        f"before: {labels['before']} (git archive, served from its extracted tree)",
        f"after: {labels['after']}" + ("" if after else f" ({ROOT}, served from it)"),
        f"benchmarks: {', '.join(args.benchmarks)}" + (f"; passed on: {' '.join(passed_on)}" if passed_on else ""),
    ])

    def body() -> list[Check]:
        checks: list[Check] = []
        with contextlib.ExitStack() as stack:
            trees = {"before": stack.enter_context(extracted(before)),
                     "after": stack.enter_context(extracted(after)) if after else ROOT}
            for name in args.benchmarks:  # each with its own watchdog
                if name == "overhead":
                    faulthandler.dump_traceback_later(WATCHDOG_SECONDS, exit=True)
                    print(f"\n######## overhead: before ({labels['before']}) vs after ({labels['after']}) ########\n")
                    checks += compare_overhead(trees, args.threads, args.calls)
                else:
                    faulthandler.dump_traceback_later(args.rounds * 2 * (SCRIPT_TIMEOUT + 30), exit=True)
                    checks += compare_script(name, trees, labels, args.rounds, passed_on)
        return checks

    run_benchmark(body)


if __name__ == "__main__":
    main()
