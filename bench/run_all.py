"""Run every benchmark, each in its own process, and summarize.

    .venv/bin/python -m bench.run_all [--server werkzeug] [only ...]

Exits non-zero if any benchmark missed a target or failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench._common import ROOT, table

BENCHMARKS = ("fanout", "concurrent_calls", "isolation", "overhead", "composite_parallel", "find_tool",
              "discovery_eras")
PER_BENCHMARK_TIMEOUT = 150.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=("gunicorn", "werkzeug"), default="gunicorn")
    parser.add_argument("only", nargs="*", metavar="NAME", help=f"run only these, of {', '.join(BENCHMARKS)}")
    args = parser.parse_args()
    unknown = set(args.only) - set(BENCHMARKS)
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")

    rows, failed = [], []
    for name in args.only or BENCHMARKS:
        print(f"\n######## bench.{name} ########\n", flush=True)
        started = time.monotonic()
        try:
            code = subprocess.run([sys.executable, "-m", f"bench.{name}", "--server", args.server],
                                  cwd=ROOT, timeout=PER_BENCHMARK_TIMEOUT).returncode
            outcome = {0: "targets met", 1: "target missed"}.get(code, f"failed (exit {code})")
        except subprocess.TimeoutExpired:
            code, outcome = -1, f"timed out after {PER_BENCHMARK_TIMEOUT:g}s"
        rows.append((name, outcome, f"{time.monotonic() - started:.0f} s"))
        if code != 0:
            failed.append(name)
    print("\n######## summary ########\n")
    print(table(["benchmark", "outcome", "took"], rows))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
