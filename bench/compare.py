"""Before/after: the same benchmark against the gateway of another commit (``--ref``,
"before") and of the working tree ("after"), interleaved, side by side with ratios.

The ref is extracted with ``git archive REF | tar -x`` into a temp dir; each gateway is
served from its source tree (``vmcp_actors`` first on PYTHONPATH, run in the tree; see
VMCP_BENCH_GATEWAY_TREE in bench/_common.py), and the harness checks from the gateway's
own log that the ``vmcp_actors`` it imported is that tree's. ``--after-ref REF`` takes the
"after" side from a commit too (``--ref HEAD --after-ref HEAD``: identical code, ratios ~1).
The benchmark code, test backends and clients are the working tree's for both sides.

* ``overhead``: one run, one SDK echo backend in its own process, both gateways up at once,
  for a legacy (2025-11-25, a session) and a modern (2026-07-28, no session) client
  (``--eras``, default both): modes direct, before, after per era. Concurrent: 16 client
  threads per mode, rounds in every order of direct/before/after, each with the eras in
  both orders (each mode in each position alike); sequential: 1 thread, calls rotated mode
  by mode in the same orders. Per era: after/before throughput and p50 overhead (T3, issue
  9), gateway/direct throughput and overhead per side; with both eras, modern vs legacy.
  What a config costs: ``--ref HEAD --after-ref HEAD --after-config FILE`` runs the same
  code on both sides and adds FILE's sections to "after" only (``bench/rate_limits.yaml``:
  what a rate-limit decision costs per call). ``--redis`` keeps both sides' records in a
  local redis-server (and so the after side's buckets); ``--users`` puts both behind OIDC
  (a local IdP), each client thread a user of its own, so ``perUser`` buckets decide.
  The peer: when scripts/install-fastmcp's venv exists (``.venv-fastmcp``, or
  $VMCP_FASTMCP_VENV) and without ``--no-peer``, the FastMCP proxy over the same backend
  (bench/_fastmcp_proxy.py, its own process) is a mode too, per era it serves (an era it
  cannot serve is skipped, saying why): the rounds then take each era's four modes in the
  orders of two Williams Latin squares (each mode in each position alike), and it makes
  fewer calls (it is ~20x slower: PEER_CALL_DIVISOR); per era: its throughput / direct, p50
  overhead, CPU per call (its process's, as the gateway worker's), and the after gateway's
  throughput / its.
* any other benchmark (e.g. ``threads``): whole runs of ``python -m bench.NAME``, sides
  alternating (before, after, after, before, ...) for ``--rounds``; the metrics and
  targets each run records (VMCP_BENCH_RESULTS) side by side, medians over rounds. Extra
  arguments are passed on to it (``threads --idle-release 2s``). ``discovery_eras``
  (issue 22) and ``client_sessions`` (issue 34) start and stop their gateways from each
  side's tree the same way.

    .venv/bin/python -m bench.compare --ref REF [--after-ref REF] [--rounds N] [--eras legacy,modern]
                                      [--after-config FILE] [--redis] [--users] [--no-peer]
                                      [overhead] [threads ...] [ARGS]
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import itertools
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

from bench._common import (
    GATEWAY_TREE_ENV,
    RESULTS_ENV,
    ROOT,
    WATCHDOG_SECONDS,
    Check,
    McpClient,
    RunningGateway,
    Stats,
    _die_with_parent,
    admin_config,
    admin_state,
    backend_process,
    gateway,
    median,
    print_header,
    process_cpu_seconds,
    raise_failures,
    record,
    run_benchmark,
    run_threads,
    serve_subprocess,
    settle_heap,
    table,
)
from bench.overhead import ERAS, SEQUENTIAL_CALLS, WARMUP, echo

SIDES = ("before", "after")
SIGNING_KEY_ENV = "VMCP_BENCH_SIGNING_KEY"  # both sides' record key, with --redis
AUDIENCE = "vmcp-bench"
ERA_LABELS = {"legacy": "2025-11-25, a session", "modern": "2026-07-28, no session"}
SCRIPT_TIMEOUT = 300.0  # one run of a benchmark script (bench.threads takes up to ~4 min)
# T3: "no worse than before", with room for what this shared 2-vCPU machine adds run to run.
TARGET_THROUGHPUT_RATIO = 0.90  # after / before, gateway calls/s with 16 threads
TARGET_SEQUENTIAL_SLACK_MS = 0.30  # after's sequential p50 overhead at most before's + this
PEER = "fastmcp"  # overhead's peer: the FastMCP proxy (bench/_fastmcp_proxy.py), mode names fastmcp-ERA
PEER_LABEL = "FastMCP proxy"
FASTMCP_VENV_ENV = "VMCP_FASTMCP_VENV"  # where scripts/install-fastmcp installs (default .venv-fastmcp)
# The FastMCP proxy answers ~20x fewer calls/s than the gateway here (a fresh backend client
# per request), so it makes 1/15 of their calls per round (at least one per thread), warms
# up on 2 calls per thread and joins every 7th sequential rotation: its rounds take about as
# long as theirs and the run ~90 s instead of ~50 s.
PEER_CALL_DIVISOR = 15
PEER_WARMUP = 2
PEER_SEQUENTIAL_EVERY = 7  # coprime with the 8 or 16 orders: it meets each of them


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


def overhead_orders(kinds: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """The rounds' mode orders (mode names ``KIND-ERA``) for ``kinds`` ({era: its kinds,
    e.g. direct, before, after}): round k takes each era's order k (:func:`balanced_orders`,
    cycled when an era has fewer), the eras in both orders (one era: just its orders)."""
    eras = list(kinds)
    per_era = {era: balanced_orders(kinds[era]) for era in eras}
    era_orders = [eras] if len(eras) == 1 else [eras, eras[::-1]]
    return [[f"{kind}-{era}" for era in era_order for kind in per_era[era][k % len(per_era[era])]]
            for k in range(max(len(orders) for orders in per_era.values())) for era_order in era_orders]


def balanced_orders(kinds: Sequence[str]) -> list[list[str]]:
    """Orders of ``kinds`` with each kind in each position equally often: all of them for
    up to three (six), else two Williams Latin squares (2n orders: each kind in each
    position twice, right after each other kind twice), so four kinds take eight rounds,
    not 24."""
    if len(kinds) <= 3:
        return [list(order) for order in itertools.permutations(kinds)]
    n = len(kinds)
    first = [0]  # 0, 1, n-1, 2, n-2, ...
    low, high = 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[kinds[(shift + j) % n] for j in first] for shift in range(n)]
    if n % 2:  # an odd n's square balances the neighbours only with its rows reversed
        return rows + [row[::-1] for row in rows]
    return rows + [[kinds[(shift - j) % n] for j in first] for shift in range(n)]  # the mirrored square


@dataclass(frozen=True)
class Setup:
    """What the two gateways of ``overhead`` run with besides their code: config sections
    for the after side only, records in Redis, callers who are users."""

    after_config: Mapping[str, Any] = field(default_factory=dict)
    redis: bool = False
    users: bool = False

    def describe(self) -> list[str]:
        return [line for line in (
            f"after side only: {', '.join(self.after_config)}" if self.after_config else "",
            "both sides: sessionStorage redis (a local redis-server)" if self.redis else "",
            "both sides: incomingAuth oidc (a local IdP); each client thread is a user of its own" if self.users else "",
        ) if line]


def merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra``'s sections; a section both have as mappings is merged."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = {**out[key], **value} if isinstance(out.get(key), Mapping) and isinstance(value, Mapping) else value
    return out


@contextlib.contextmanager
def side_configs(setup: Setup) -> Iterator[tuple[dict[str, dict[str, Any]], Any]]:
    """Each side's extra config sections, and the IdP that signs the users' tokens (None
    without ``--users``); the Redis server and the IdP stop on exit."""
    from tests.idp import LocalIdP
    from tests.redis_server import RedisServer

    with contextlib.ExitStack() as stack:
        common: dict[str, Any] = admin_config()
        idp = None
        if setup.users:
            idp = stack.enter_context(LocalIdP("bench-compare-idp"))
            common["incomingAuth"] = {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUDIENCE}}
        configs = {side: dict(common) for side in SIDES}
        if setup.redis:
            redis = RedisServer().start()
            stack.callback(redis.close)
            os.environ.setdefault(SIGNING_KEY_ENV, secrets.token_urlsafe(32))
            for side in SIDES:  # a key prefix each: the two gateways share nothing
                configs[side] = merged(configs[side], {
                    "operational": {"signingKeyEnv": SIGNING_KEY_ENV},
                    "sessionStorage": {"provider": "redis", "address": redis.address, "keyPrefix": f"{side}:"}})
        configs["after"] = merged(configs["after"], setup.after_config)
        yield configs, idp


def rate_limit_use(gw: RunningGateway) -> dict[str, Any] | None:
    """The gateway's rate limits as its admin state shows them (None: none configured)."""
    return admin_state(gw).get("rateLimits")


@dataclass(frozen=True)
class RunningPeer:
    url: str
    pid: int  # the proxy's one process
    version: str  # "fastmcp X.Y.Z", as its /readyz says


def fastmcp_python() -> Path:
    return Path(os.environ.get(FASTMCP_VENV_ENV) or ROOT / ".venv-fastmcp") / "bin" / "python"


@contextlib.contextmanager
def fastmcp_proxy(backend_url: str) -> Iterator[RunningPeer]:
    """bench/_fastmcp_proxy.py over ``backend_url`` on a loopback port, run by the python of
    fastmcp's venv in isolated mode (-I: neither bench/ nor PYTHON* variables on its path, so
    nothing of the project), stopped on exit; like the gateway, it dies with this process."""
    script = ROOT / "bench" / "_fastmcp_proxy.py"
    with tempfile.TemporaryDirectory(prefix="vmcp-fastmcp-") as tmp:
        with serve_subprocess(lambda port: [str(fastmcp_python()), "-I", str(script), backend_url, str(port)],
                              Path(tmp) / "fastmcp.log", worker=lambda pid: pid) as (base, pid):
            yield RunningPeer(base + "/mcp", pid, requests.get(base + "/readyz", timeout=10).text.strip())


def kind_of(mode: str) -> str:
    """direct, before, after or fastmcp, of a mode name ``KIND-ERA``."""
    return mode.split("-", 1)[0]


def era_of(mode: str) -> str:
    return mode.split("-", 1)[1]


@contextlib.contextmanager
def peer_for(backend_url: str, eras: Sequence[str],
             targets: dict[str, tuple[str, str, bool]]) -> Iterator[RunningPeer | None]:
    """The FastMCP proxy over the backend, its modes added to ``targets`` for each era it
    serves (one echo call from a fresh client of that era tells); why not, printed, for an
    era it cannot serve or if it does not start (then None)."""
    with contextlib.ExitStack() as stack:
        try:
            proxy = stack.enter_context(fastmcp_proxy(backend_url))
        except (RuntimeError, OSError, requests.RequestException) as exc:
            print(f"{PEER_LABEL}: not measured: it did not start: {exc}")
            proxy = None
        if proxy is None:
            yield None
            return
        print(f"{PEER_LABEL}: {proxy.version}, create_proxy(backend URL) with its defaults, process {proxy.pid}")
        for era in eras:
            try:
                with McpClient(proxy.url, modern=era == "modern") as probe:
                    probe.initialize()
                    echo(probe, "echo", "probe")
            except Exception as exc:  # noqa: BLE001 - reported: the era is skipped, the run goes on
                print(f"{PEER_LABEL}, {era} client ({ERA_LABELS[era]}): not measured: it cannot serve it: {exc!r}")
                continue
            targets[f"{PEER}-{era}"] = (proxy.url, "echo", era == "modern")
        yield proxy


def compare_overhead(trees: Mapping[str, Path], threads: int, calls: int,
                     eras: Sequence[str] = ("legacy",), setup: Setup = Setup(), peer: bool = False) -> list[Check]:
    """``peer``: the FastMCP proxy over the same backend too (each era it can serve)."""
    with contextlib.ExitStack() as stack:
        backend = stack.enter_context(backend_process("sdk", "echo", "echo"))
        configs, idp = stack.enter_context(side_configs(setup))
        gws = {side: stack.enter_context(gateway({"echo": backend.mcp_url}, tree=trees[side], extra=configs[side]))
               for side in SIDES}
        for side in SIDES:
            print(f"{side}: gateway worker {gws[side].pid} runs {gws[side].source}")
        for line in setup.describe():
            print(line)
        servers = {side: gws[side].pid for side in SIDES}  # kind: the process whose CPU is measured
        targets = {}  # mode: (url, tool, a 2026-07-28 client)
        for era in eras:
            targets[f"direct-{era}"] = (backend.mcp_url, "echo", era == "modern")
            for side in SIDES:
                targets[f"{side}-{era}"] = (gws[side].url, "echo_echo", era == "modern")
        proxy = stack.enter_context(peer_for(backend.mcp_url, eras, targets)) if peer else None
        if proxy is not None:
            servers[PEER] = proxy.pid
        kinds = {era: [kind for kind in ("direct", *SIDES, PEER) if f"{kind}-{era}" in targets] for era in eras}
        modes = [f"{kind}-{era}" for era in eras for kind in kinds[era]]
        orders = overhead_orders(kinds)  # every mode in every position alike
        per_round = max(1, calls // len(orders))
        peer_per_round = max(1, per_round // PEER_CALL_DIVISOR)

        def headers(mode: str, index: int) -> dict[str, str]:
            """Thread ``index``'s user, the same one on both sides and in both eras."""
            if idp is None or kind_of(mode) not in SIDES:
                return {}
            return {"Authorization": f"Bearer {idp.issue_token(f'bench-user-{index}', AUDIENCE, expires_in=3600)}"}

        clients = {mode: [stack.enter_context(McpClient(url, modern=modern, headers=headers(mode, index)))
                          for index in range(threads)]
                   for mode, (url, _, modern) in targets.items()}

        def warm(index: int) -> None:
            for mode, (_, tool, _modern) in targets.items():
                clients[mode][index].initialize()
                for i in range(PEER_WARMUP if kind_of(mode) == PEER else WARMUP):
                    echo(clients[mode][index], tool, f"w{i}")

        raise_failures(run_threads(threads, warm))
        spoken = {side: admin_state(gws[side]).get("backendEras", {}).get("echo", "unknown") for side in SIDES}
        print("the era each gateway spoke to the backend (admin state backendEras): "
              + ", ".join(f"{side} {spoken[side]}" for side in SIDES))
        limits_before_run = rate_limit_use(gws["after"])
        settle_heap()

        latencies: dict[str, list[float]] = {mode: [] for mode in modes}
        wall = dict.fromkeys(modes, 0.0)
        cpu = dict.fromkeys(modes, 0.0)  # each gateway worker's (or proxy's) CPU seconds while its mode was measured
        backend_cpu = dict.fromkeys(modes, 0.0)  # the backend process's, each mode
        for mode in itertools.chain.from_iterable(orders):
            tool = targets[mode][1]
            count = peer_per_round if kind_of(mode) == PEER else per_round

            def work(index: int, mode: str = mode, tool: str = tool, count: int = count) -> list[float]:
                samples = []
                for i in range(count):
                    started = time.perf_counter()
                    echo(clients[mode][index], tool, f"{index}-{i}")
                    samples.append(time.perf_counter() - started)
                return samples

            server = servers.get(kind_of(mode))
            cpu_before = process_cpu_seconds(server) if server is not None else None
            backend_before = process_cpu_seconds(backend.pid)
            started = time.perf_counter()
            results = run_threads(threads, work, timeout=60)
            wall[mode] += time.perf_counter() - started
            if cpu_before is not None:
                cpu[mode] += process_cpu_seconds(server) - cpu_before
            backend_cpu[mode] += process_cpu_seconds(backend.pid) - backend_before
            try:
                raise_failures(results)
            except RuntimeError as exc:  # say which side and era failed
                raise RuntimeError(f"{mode}: {exc}") from exc.__cause__
            for samples in results:
                latencies[mode].extend(samples)

        sequential: dict[str, list[float]] = {mode: [] for mode in modes}
        for i in range(SEQUENTIAL_CALLS):
            for mode in orders[i % len(orders)]:
                if kind_of(mode) == PEER and i % PEER_SEQUENTIAL_EVERY:
                    continue
                started = time.perf_counter()
                echo(clients[mode][0], targets[mode][1], f"s{i}")
                sequential[mode].append(time.perf_counter() - started)
        limits_after_run = rate_limit_use(gws["after"])

    conc = {mode: Stats.of(samples) for mode, samples in latencies.items()}
    seq = {mode: Stats.of(samples) for mode, samples in sequential.items()}
    rate = {mode: len(latencies[mode]) / wall[mode] for mode in modes}
    proxied = [mode for mode in modes if kind_of(mode) != "direct"]
    cpu_ms = {mode: cpu[mode] / len(latencies[mode]) * 1000 for mode in proxied}
    backend_ms = {mode: backend_cpu[mode] / len(latencies[mode]) * 1000 for mode in modes}
    over_conc = {mode: conc[mode].p50 - conc[f"direct-{era_of(mode)}"].p50 for mode in proxied}
    over_seq = {mode: seq[mode].p50 - seq[f"direct-{era_of(mode)}"].p50 for mode in proxied}
    ratio = {mode: rate[mode] / rate[f"direct-{era_of(mode)}"] for mode in proxied}
    peer_modes = [mode for mode in modes if kind_of(mode) == PEER]

    print(f"\nconcurrent ({threads} threads, {len(latencies[modes[0]])} calls per mode"
          + "".join(f", {mode} {len(latencies[mode])}" for mode in peer_modes) + f"; {len(orders)} rounds per mode: "
          + ("each era's modes in the orders of two Williams Latin squares" if peer_modes
             else "every order of direct/before/after")
          + (", the eras in both orders)" if len(eras) > 1 else ")"))
    print(table(["mode", "p50", "p99", "mean", "throughput", "gateway CPU per call", "backend CPU per call"], [
        (mode, f"{s.p50:.2f} ms", f"{s.p99:.2f} ms", f"{s.mean:.2f} ms", f"{rate[mode]:.0f} calls/s",
         f"{cpu_ms[mode]:.2f} ms" if mode in cpu_ms else "", f"{backend_ms[mode]:.2f} ms")
        for mode, s in conc.items()]))
    print(f"\nsequential (1 thread, {SEQUENTIAL_CALLS} calls per mode"
          + "".join(f", {mode} {len(sequential[mode])}" for mode in peer_modes) + ")")
    print(table(["mode", "p50", "p99", "mean", "min"], [
        (mode, f"{s.p50:.2f} ms", f"{s.p99:.2f} ms", f"{s.mean:.2f} ms", f"{s.min:.2f} ms")
        for mode, s in seq.items()]))
    after_calls = sum(len(latencies[mode]) + len(sequential[mode]) for mode in modes if mode.startswith("after-"))
    checks: list[Check] = limits_checks(limits_before_run, limits_after_run, setup, after_calls)
    if len(set(spoken.values())) > 1:
        checks.append(Check("both gateways spoke the same era to the backend", ", ".join(spoken.values()),
                            "the same", False))
    for era in eras:
        b, a = f"before-{era}", f"after-{era}"
        throughput_ratio = rate[a] / rate[b]
        print(f"\nafter vs before, {era} client ({ERA_LABELS[era]})")
        print(table(["measure", "before", "after", "after / before", "after - before"], [
            (f"gateway throughput, {threads} threads", f"{rate[b]:.0f} calls/s", f"{rate[a]:.0f} calls/s",
             f"{throughput_ratio:.2f}", ""),
            ("throughput gateway / direct", f"{ratio[b]:.2f}", f"{ratio[a]:.2f}", f"{ratio[a] / ratio[b]:.2f}",
             f"{ratio[a] - ratio[b]:+.2f}"),
            ("gateway CPU per call", f"{cpu_ms[b]:.2f} ms", f"{cpu_ms[a]:.2f} ms",
             f"{cpu_ms[a] / cpu_ms[b]:.2f}", f"{cpu_ms[a] - cpu_ms[b]:+.2f} ms"),
            ("p50 overhead, sequential", f"{over_seq[b]:.2f} ms", f"{over_seq[a]:.2f} ms",
             f"{over_seq[a] / over_seq[b]:.2f}", f"{over_seq[a] - over_seq[b]:+.2f} ms"),
            (f"p50 overhead, {threads} threads", f"{over_conc[b]:.2f} ms", f"{over_conc[a]:.2f} ms",
             f"{over_conc[a] / over_conc[b]:.2f}", f"{over_conc[a] - over_conc[b]:+.2f} ms"),
        ]))
        record(f"{era}: throughput after / before", round(throughput_ratio, 3))
        for side, mode in (("before", b), ("after", a)):
            record(f"{era}, {side}: p50 overhead sequential ms", round(over_seq[mode], 3))
            record(f"{era}, {side}: throughput gateway / direct", round(ratio[mode], 3))
        slack = over_seq[a] - over_seq[b]
        prefix = "T3: " if era == "legacy" else f"T3 ({era} client): "
        checks += [
            Check(f"{prefix}gateway throughput after / before, {threads} threads", f"{throughput_ratio:.2f}",
                  f">= {TARGET_THROUGHPUT_RATIO:.2f}", throughput_ratio >= TARGET_THROUGHPUT_RATIO),
            Check(f"{prefix}p50 overhead (sequential) after - before", f"{slack:+.2f} ms",
                  f"<= +{TARGET_SEQUENTIAL_SLACK_MS:.2f} ms", slack <= TARGET_SEQUENTIAL_SLACK_MS),
        ]
    if "legacy" in eras and "modern" in eras:
        print("\nmodern (2026-07-28) client vs legacy (2025-11-25) client, each side")
        rows = []
        for side in SIDES:
            legacy, modern = f"{side}-legacy", f"{side}-modern"
            rows += [
                (f"{side}: gateway p50, sequential", f"{seq[legacy].p50:.2f} ms", f"{seq[modern].p50:.2f} ms",
                 f"{seq[modern].p50 - seq[legacy].p50:+.2f} ms"),
                (f"{side}: p50 overhead, sequential", f"{over_seq[legacy]:.2f} ms", f"{over_seq[modern]:.2f} ms",
                 f"{over_seq[modern] - over_seq[legacy]:+.2f} ms"),
                (f"{side}: p50 overhead, {threads} threads", f"{over_conc[legacy]:.2f} ms",
                 f"{over_conc[modern]:.2f} ms", f"{over_conc[modern] - over_conc[legacy]:+.2f} ms"),
                (f"{side}: throughput gateway / direct", f"{ratio[legacy]:.2f}", f"{ratio[modern]:.2f}",
                 f"{ratio[modern] - ratio[legacy]:+.2f}"),
                (f"{side}: gateway throughput", f"{rate[legacy]:.0f} calls/s", f"{rate[modern]:.0f} calls/s",
                 f"x {rate[modern] / rate[legacy]:.2f}"),
                (f"{side}: gateway CPU per call", f"{cpu_ms[legacy]:.2f} ms", f"{cpu_ms[modern]:.2f} ms",
                 f"{cpu_ms[modern] - cpu_ms[legacy]:+.2f} ms"),
            ]
        rows += [
            ("direct: p50, sequential", f"{seq['direct-legacy'].p50:.2f} ms", f"{seq['direct-modern'].p50:.2f} ms",
             f"{seq['direct-modern'].p50 - seq['direct-legacy'].p50:+.2f} ms"),
            ("direct: backend CPU per call", f"{backend_ms['direct-legacy']:.2f} ms",
             f"{backend_ms['direct-modern']:.2f} ms",
             f"{backend_ms['direct-modern'] - backend_ms['direct-legacy']:+.2f} ms"),
        ]
        print(table(["measure", "legacy", "modern", "modern - legacy"], rows))
        gap = over_seq["after-modern"] - over_seq["after-legacy"]
        checks.append(Check("after: modern p50 overhead (sequential) minus legacy's", f"{gap:+.2f} ms",
                            "<= +0.00 ms", gap <= 0.0))
    for mode in peer_modes:
        era = era_of(mode)
        a = f"after-{era}"
        print(f"\n{PEER_LABEL} ({proxy.version}) vs the gateway (after), {era} client ({ERA_LABELS[era]})")
        print(table(["measure", PEER_LABEL, "gateway (after)", "after / FastMCP"], [
            (f"throughput, {threads} threads", f"{rate[mode]:.1f} calls/s", f"{rate[a]:.0f} calls/s",
             f"{rate[a] / rate[mode]:.1f}"),
            ("throughput / direct", f"{ratio[mode]:.3f}", f"{ratio[a]:.2f}", ""),
            ("p50 overhead over direct, sequential", f"{over_seq[mode]:.2f} ms", f"{over_seq[a]:.2f} ms",
             f"{over_seq[a] / over_seq[mode]:.3f}"),
            (f"p50 overhead over direct, {threads} threads", f"{over_conc[mode]:.2f} ms", f"{over_conc[a]:.2f} ms",
             f"{over_conc[a] / over_conc[mode]:.3f}"),
            ("CPU per call (its process)", f"{cpu_ms[mode]:.2f} ms", f"{cpu_ms[a]:.2f} ms",
             f"{cpu_ms[a] / cpu_ms[mode]:.3f}"),
            ("backend CPU per call", f"{backend_ms[mode]:.2f} ms", f"{backend_ms[a]:.2f} ms",
             f"{backend_ms[a] / backend_ms[mode]:.3f}"),
        ]))
        record(f"{era}, {PEER}: throughput proxy / direct", round(ratio[mode], 4))
        record(f"{era}, {PEER}: p50 overhead sequential ms", round(over_seq[mode], 3))
        record(f"{era}, {PEER}: CPU per call ms", round(cpu_ms[mode], 3))
        record(f"{era}: throughput after / {PEER}", round(rate[a] / rate[mode], 2))
    return checks


def limits_checks(start: dict | None, end: dict | None, setup: Setup, calls: int) -> list[Check]:
    """With rate limits on the after side (its admin state's ``rateLimits`` before and after
    the measured calls): that they decided the ``calls`` measured there (the global
    bucket's level went down by about as many: bench/rate_limits.yaml refills a third of a
    token a second) and refused none, in the store the run claims."""
    if "rateLimiting" not in setup.after_config:
        return []
    if start is None or end is None:
        return [Check("after: rate limits configured", "none in the admin state", "rateLimits", False)]
    store = "redis" if setup.redis else "memory"
    spent = (start["globalTokens"] or 0) - (end["globalTokens"] or 0)
    refused = sum(row["count"] for row in end["refusals"])
    print(f"\nafter: rate limits in {end['store']}; global bucket level {start['globalTokens']:.0f} -> "
          f"{end['globalTokens']:.0f} over the measured calls; refusals {refused}; store failures {end['storeFailures']}")
    record("after: global tokens spent while measured", round(spent))
    return [
        Check("after: the rate limits' store", end["store"], store, end["store"] == store),
        Check("after: global tokens spent while measured (one per call decided)", f"{spent:.0f}",
              f">= 0.95 x {calls} calls", spent >= 0.95 * calls),
        Check("after: calls refused or undecided (store failures)", str(refused + end["storeFailures"]), "0",
              refused + end["storeFailures"] == 0),
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
    parser.add_argument("--eras", default="legacy,modern",
                        help="overhead: client eras, legacy (2025-11-25) and/or modern (2026-07-28); "
                             "default both, interleaved in one run")
    parser.add_argument("--after-config", type=Path, default=None,
                        help="overhead: a YAML file of config sections added to the after side only "
                             "(e.g. bench/rate_limits.yaml)")
    parser.add_argument("--redis", action="store_true",
                        help="overhead: both sides keep their records in a local redis-server")
    parser.add_argument("--users", action="store_true",
                        help="overhead: both sides behind OIDC (a local IdP), a user per client thread")
    parser.add_argument("--no-peer", action="store_true",
                        help="overhead: leave out the FastMCP proxy (measured when scripts/install-fastmcp's "
                             "venv exists)")
    parser.add_argument("benchmarks", nargs="*", metavar="NAME", default=["overhead"],
                        help="overhead (default) and/or any bench.NAME that reports targets, e.g. threads, "
                             "discovery_eras")
    args, passed_on = parser.parse_known_args()
    for name in args.benchmarks:
        if name != "overhead" and not (ROOT / "bench" / f"{name}.py").is_file():
            parser.error(f"no benchmark bench/{name}.py")
    if passed_on and set(args.benchmarks) == {"overhead"}:
        parser.error(f"unrecognized arguments: {' '.join(passed_on)}")

    eras = tuple(dict.fromkeys(era.strip() for era in args.eras.split(",") if era.strip()))
    if not eras or set(eras) - set(ERAS):
        parser.error(f"--eras: a comma-separated list of {', '.join(ERAS)} (got {args.eras!r})")

    after_config = yaml.safe_load(args.after_config.read_text()) if args.after_config else {}
    if not isinstance(after_config, dict):
        parser.error(f"--after-config: {args.after_config} holds no mapping of config sections")
    setup = Setup(after_config, args.redis, args.users)
    if (after_config or args.redis or args.users) and set(args.benchmarks) != {"overhead"}:
        parser.error("--after-config, --redis and --users are options of overhead only")

    peer = "overhead" in args.benchmarks and not args.no_peer and fastmcp_python().exists()
    peer_lines = []
    if "overhead" in args.benchmarks and not args.no_peer:
        venv = fastmcp_python().parents[1]
        peer_lines.append(f"peer in overhead: the {PEER_LABEL}, run by {venv}" if peer else
                          f"peer in overhead: the {PEER_LABEL} skipped: no {venv} "
                          "(scripts/install-fastmcp installs it)")

    before = resolve(args.ref)
    after = resolve(args.after_ref) if args.after_ref else None
    labels = {"before": f"{args.ref} = {before[:8]}",
              "after": f"{args.after_ref} = {after[:8]}" if after else "the working tree"}
    print_header("compare: benchmarks against the gateway before vs after", "gunicorn", [
        f"before: {labels['before']} (git archive, served from its extracted tree)",
        f"after: {labels['after']}" + ("" if after else f" ({ROOT}, served from it)"),
        f"benchmarks: {', '.join(args.benchmarks)}" + (f"; passed on: {' '.join(passed_on)}" if passed_on else ""),
        *([f"--after-config {args.after_config}"] if args.after_config else []), *setup.describe(),
        *peer_lines,
    ])

    def body() -> list[Check]:
        checks: list[Check] = []
        with contextlib.ExitStack() as stack:
            trees = {"before": stack.enter_context(extracted(before)),
                     "after": stack.enter_context(extracted(after)) if after else ROOT}
            for name in args.benchmarks:  # each with its own watchdog
                if name == "overhead":
                    faulthandler.dump_traceback_later(WATCHDOG_SECONDS * (len(eras) + peer), exit=True)
                    print(f"\n######## overhead: before ({labels['before']}) vs after ({labels['after']}) ########\n")
                    checks += compare_overhead(trees, args.threads, args.calls, eras, setup, peer)
                else:
                    faulthandler.dump_traceback_later(args.rounds * 2 * (SCRIPT_TIMEOUT + 30), exit=True)
                    checks += compare_script(name, trees, labels, args.rounds, passed_on)
        return checks

    run_benchmark(body)


if __name__ == "__main__":
    main()
