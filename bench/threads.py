"""Thread budget (issue 9): the gateway worker's threads and RSS with many client sessions
open, read from /proc/<worker pid>/task and /proc/<worker pid>/status (VmRSS).

* T1: 1,000 anonymous sessions over 5 backends; each session calls every backend's echo
  tool once and stays open (no DELETE) while the gateway is measured.
* T2: 100 OIDC users (distinct subjects, tokens from tests/idp.py's LocalIdP, incomingAuth
  oidc), one session each calling every backend once. With ``--idle-release DURATION``
  the gateway is configured with ``operational.userIdleTimeout: DURATION`` and measured
  again once that long has passed without requests. A gateway that refuses the key (the
  config schema before issue 9) is run without it, and the release phase reports "not
  supported by this gateway".

Sessions are opened with raw JSON-RPC (initialize, notifications/initialized, tools/call
per backend) from a small pool of client threads, one keep-alive connection each. The 5
backends are tests.backends.delayed_backend(0) (raw MCP, JSON answers), each in its own
process, so the clients' CPU does not slow them down.

    .venv/bin/python -m bench.threads [--idle-release 2s] [--sessions 1000] [--users 100] [--pool 16]
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import requests

from bench._common import (
    GATEWAY_TREE_ENV,
    Check,
    McpClient,
    RunningGateway,
    backend_process,
    config_mapping,
    gateway,
    parse_args,
    print_header,
    record,
    run_benchmark,
    table,
    validate_config,
)

BACKENDS = 5
AUDIENCE = "vmcp"
TARGET_T0_THREADS = 300  # issue 13: 5,000 bare initializes
TARGET_T1_THREADS = 100
TARGET_T2_RELEASED_THREADS = 50
RELEASE_GRACE = 15.0  # how long past the idle timeout the release may take before we give up
WATCHDOG = 230.0  # 1,000 sessions on the old shape take a while; stay under 4 minutes


# ----------------------------------------------------------------------------------
# What the gateway worker holds
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Footprint:
    threads: int
    rss_kib: int

    @classmethod
    def of(cls, pid: int) -> Footprint:
        threads = len(os.listdir(f"/proc/{pid}/task"))
        status = Path(f"/proc/{pid}/status").read_text()
        rss = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        return cls(threads, int(rss.group(1)) if rss else -1)

    @property
    def rss_mib(self) -> float:
        return self.rss_kib / 1024

    def record(self, point: str) -> None:
        """Keep these numbers for bench/compare.py."""
        record(f"{point}: threads", self.threads)
        record(f"{point}: RSS MiB", round(self.rss_mib, 1))


def worker_pid(gw: RunningGateway) -> int:
    if gw.pid is None:
        raise RuntimeError("the gunicorn worker's pid is unknown (not exactly one child of the master)")
    return gw.pid


def row(point: str, seen: Footprint, note: str = "") -> tuple[str, str, str, str]:
    return point, str(seen.threads), f"{seen.rss_mib:.1f} MiB", note


def growth(opened: Footprint, started: Footprint, sessions: int) -> str:
    return (f"{(opened.threads - started.threads) / sessions:.2f} threads and "
            f"{(opened.rss_kib - started.rss_kib) / sessions:.0f} KiB per session")


# ----------------------------------------------------------------------------------
# Sessions
# ----------------------------------------------------------------------------------


def per_thread_http() -> tuple[Callable[[], requests.Session], list[requests.Session]]:
    """``http()``: the calling thread's keep-alive connection (made on first use), and the
    list of every one made, for closing them."""
    local, made = threading.local(), []

    def http() -> requests.Session:
        if not hasattr(local, "http"):
            local.http = requests.Session()
            made.append(local.http)
        return local.http

    return http, made


def call_every_tool(client: McpClient, tools: Sequence[str], text: str) -> None:
    """Each echo tool once with ``text``; an answer that does not echo it is an error."""
    for tool in tools:
        answer = client.call_tool(tool, {"text": text})["content"][0]["text"]
        if not answer.endswith(f":{text}"):
            raise RuntimeError(f"{tool}: unexpected answer {answer!r}")


def open_sessions(url: str, count: int, tools: Sequence[str], pool: int,
                  headers: Callable[[int], Mapping[str, str]] = lambda i: {}) -> float:
    """Open ``count`` sessions, each calling every tool once; they stay open. Wall seconds."""
    http, connections = per_thread_http()

    def one(index: int) -> str | None:
        client = McpClient(url, headers=headers(index), http=http())
        session_id = client.initialize()
        call_every_tool(client, tools, f"s{index}")
        return session_id

    started = time.perf_counter()
    executor = ThreadPoolExecutor(pool, thread_name_prefix="bench-client")
    try:
        session_ids = list(executor.map(one, range(count)))
    finally:
        executor.shutdown(wait=True, cancel_futures=True)  # on a failure or Ctrl-C: no more sessions
        for http in connections:
            http.close()  # the connections only: the MCP sessions stay open
    took = time.perf_counter() - started
    if len(set(session_ids)) != count:
        raise RuntimeError(f"expected {count} distinct session ids, got {len(set(session_ids))}")
    return took


# ----------------------------------------------------------------------------------
# T1 and T2
# ----------------------------------------------------------------------------------


def t0(backends: Mapping[str, str], tools: Sequence[str], flood: int, pool: int) -> list[Check]:
    """Issue 13: ``flood`` bare initializes in a row (nothing after them), then a new client."""
    with gateway(backends) as gw:
        pid = worker_pid(gw)
        started = Footprint.of(pid)
        http, _connections = per_thread_http()

        def bare(index: int) -> None:
            McpClient(gw.url, http=http()).initialize()

        begun = time.perf_counter()
        with ThreadPoolExecutor(pool, thread_name_prefix="bench-flood") as executor:
            list(executor.map(bare, range(flood)))
        took = time.perf_counter() - begun
        flooded = Footprint.of(pid)
        with McpClient(gw.url) as client:
            client.initialize()
            served = all(client.call_tool(tool, {"text": "after"})["content"][0]["text"].endswith(":after")
                         for tool in tools)
    print(f"T0: {flood} bare initialize requests (default operational.maxSessions 1000), then a new client")
    print(table(["point", "gateway threads", "RSS", "note"], [
        row("after start", started),
        row(f"after {flood} bare initializes", flooded, f"{flood} requests in {took:.1f} s"),
    ]))
    print()
    flooded.record("T0 after the flood")
    return [Check(f"T0: gateway threads after {flood} bare initializes", str(flooded.threads),
                  f"< {TARGET_T0_THREADS}", flooded.threads < TARGET_T0_THREADS),
            Check("T0: a new client is served after the flood", "yes" if served else "no", "yes", served)]


def t1(backends: Mapping[str, str], tools: Sequence[str], sessions: int, pool: int) -> list[Check]:
    with gateway(backends) as gw:
        pid = worker_pid(gw)
        started = Footprint.of(pid)
        took = open_sessions(gw.url, sessions, tools, pool)
        opened = Footprint.of(pid)
    print(f"T1: {sessions} anonymous sessions over {len(backends)} backends, each calling every backend once")
    print(table(["point", "gateway threads", "RSS", "note"], [
        row("after start", started),
        row(f"after {sessions} sessions opened and called", opened,
            f"{sessions * (2 + len(tools))} requests in {took:.1f} s; {growth(opened, started, sessions)}"),
    ]))
    print()
    started.record("T1 after start")
    opened.record("T1 after the sessions")
    return [Check(f"T1: gateway threads, {sessions} anonymous sessions x {len(backends)} backends",
                  str(opened.threads), f"< {TARGET_T1_THREADS}", opened.threads < TARGET_T1_THREADS)]


def t2(backends: Mapping[str, str], tools: Sequence[str], users: int, pool: int,
       idle_release: str | None) -> list[Check]:
    from tests.idp import LocalIdP

    with contextlib.ExitStack() as stack:
        idp = stack.enter_context(LocalIdP("bench-idp"))
        incoming = {"incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUDIENCE}}}
        operational = {"userIdleTimeout": idle_release} if idle_release else None
        refused = ""
        if operational is not None:
            accepted, output = validate_config(config_mapping(backends, operational, incoming),
                                               os.environ.get(GATEWAY_TREE_ENV) or None)
            if not accepted:
                refused = output.strip().splitlines()[0] if output.strip() else "config refused"
                operational = None
        tokens = [idp.issue_token(f"bench-user-{i:04d}", AUDIENCE, expires_in=900) for i in range(users)]
        gw = stack.enter_context(gateway(backends, operational=operational, extra=incoming))
        pid = worker_pid(gw)
        started = Footprint.of(pid)
        took = open_sessions(gw.url, users, tools, pool, lambda i: {"Authorization": f"Bearer {tokens[i]}"})
        last_request = time.monotonic()
        opened = Footprint.of(pid)
        released: Footprint | None = None
        if operational is not None:
            released, waited = wait_for_release(pid, last_request, idle_seconds(idle_release))

    print(f"T2: {users} OIDC users (distinct subjects) over {len(backends)} backends, one session each "
          "calling every backend once")
    rows = [
        row("after start", started),
        row(f"after {users} users' sessions opened and called", opened,
            f"{users * (2 + len(tools))} requests in {took:.1f} s; {growth(opened, started, users)}"),
    ]
    if released is not None:
        rows.append(row(f"after the idle release (userIdleTimeout {idle_release})", released,
                        f"{waited:.1f} s after the last request"))
    elif refused:
        rows.append(("after the idle release", "not supported by this gateway", "", f"validate: {refused}"))
    else:
        rows.append(("after the idle release", "not measured", "", "run with --idle-release 2s"))
    print(table(["point", "gateway threads", "RSS", "note"], rows))
    print()
    started.record("T2 after start")
    opened.record("T2 after the sessions")
    name = f"T2: gateway threads after the idle release, {users} users"
    if released is None:
        measured = "not supported by this gateway" if refused else "not measured (no --idle-release)"
        return [Check(name, measured, f"< {TARGET_T2_RELEASED_THREADS}", False)]
    released.record("T2 after the idle release")
    return [Check(name, str(released.threads), f"< {TARGET_T2_RELEASED_THREADS}",
                  released.threads < TARGET_T2_RELEASED_THREADS)]


def idle_seconds(duration: str) -> float:
    """"2s", "500ms", "1m" -> seconds (the forms the config accepts that a benchmark wants)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", duration.strip())
    if match is None:
        raise ValueError(f"--idle-release: not a duration like 2s, 500ms or 1m: {duration!r}")
    return float(match.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[match.group(2)]


def wait_for_release(pid: int, last_request: float, idle: float, below: int = TARGET_T2_RELEASED_THREADS,
                     grace: float = RELEASE_GRACE) -> tuple[Footprint, float]:
    """Wait past the idle timeout, then until the threads drop under ``below`` (or give up
    ``grace`` s later). The footprint then, and the seconds since the last request."""
    time.sleep(max(0.0, last_request + idle + 1.0 - time.monotonic()))
    deadline = last_request + idle + grace
    seen = Footprint.of(pid)
    while seen.threads >= below and time.monotonic() < deadline:
        time.sleep(0.25)
        seen = Footprint.of(pid)
    return seen, time.monotonic() - last_request


def body(sessions: int, users: int, pool: int, idle_release: str | None, flood: int = 0) -> list[Check]:
    print_header("threads: the gateway worker's threads and RSS with many sessions open (issue 9)", "gunicorn", [
        f"backends: {BACKENDS} x tests.backends.delayed_backend(0) (raw MCP, JSON answers), each in its own process",
        f"clients: {pool} threads, one keep-alive connection each; sessions stay open (no DELETE) while measured",
        f"T1: {sessions} anonymous sessions; T2: {users} OIDC users (tests.idp.LocalIdP, in this process)",
        f"idle release: {'operational.userIdleTimeout ' + idle_release if idle_release else 'off (--idle-release)'}",
    ])
    with contextlib.ExitStack() as stack:
        served = [stack.enter_context(backend_process("raw", f"b{i}")) for i in range(BACKENDS)]
        backends = {b.name: b.mcp_url for b in served}
        tools = [f"{name}_echo" for name in backends]
        checks = t0(backends, tools, flood, pool) if flood else []
        checks += t1(backends, tools, sessions, pool)
        checks += t2(backends, tools, users, pool, idle_release)
    return checks


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--sessions", type=int, default=1000, help="T1: anonymous sessions (default 1000)")
        parser.add_argument("--users", type=int, default=100, help="T2: OIDC users, one session each (default 100)")
        parser.add_argument("--flood", type=int, default=0, help="T0 (issue 13): bare initializes first (e.g. 5000)")
        parser.add_argument("--pool", type=int, default=16, help="client threads opening sessions (default 16)")
        parser.add_argument("--idle-release", metavar="DURATION", default=None,
                            help="set operational.userIdleTimeout (e.g. 2s) and measure T2 after it; "
                                 "gateways before issue 9 refuse the key")

    args = parse_args(__doc__.splitlines()[0], extra=extra,
                      gunicorn_only="bench.threads counts the gunicorn worker's threads")
    if args.idle_release:
        try:
            idle_seconds(args.idle_release)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
    run_benchmark(lambda: body(args.sessions, args.users, args.pool, args.idle_release, args.flood),
                  watchdog=WATCHDOG)


if __name__ == "__main__":
    main()
