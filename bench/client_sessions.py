"""Per-client backend sessions (issue 34): every 2025 client session is a user of its own,
with its own UserActor and its own backend sessions. What that costs with many sessions
of few people, and how soon a first ``tools/list`` answers when one backend never does.

* C1 ``sessions``: ``--sessions`` (1,000) 2025 client sessions of ``--users`` (100) OIDC
  users (tests/idp.py ``LocalIdP``, one token per user; session *i* belongs to user *i*
  mod 100, so a person's sessions are spread over the run, as in bench.scale S1) over 5
  legacy-only official-SDK backends (2025-11-25 only, each in its own process, counting
  what reaches them: bench/_backend_server.py ``legacy --count``). Each session:
  ``initialize``, ``notifications/initialized``, ``tools/list``, and one ``tools/call`` of
  backend (*i* div 100) mod 5's echo; it stays open (no DELETE) and opens no GET stream.
  ``--declare none`` (default): the clients declare no capability; ``--declare requests``:
  they declare sampling, roots and elicitation, so each of their backend sessions keeps
  its standalone stream open (a ``vmcp-stream`` thread) while the user is live. Measured
  after start, after the sessions are made, and after the idle release
  (``operational.userIdleTimeout``, ``--idle-release``, default 60 s: longer than making
  the sessions takes, so every user is still live at the second point): the gateway
  worker's threads and RSS (/proc), its live users (admin state), and at the backends the
  ``initialize`` requests received (the backend sessions opened), the GET streams open and
  the DELETEs. ``--max-live-users N`` sets ``operational.maxLiveUsers``.
* C2 ``stuck``: 4 such backends and a fifth whose every POST waits an hour (it never
  answers ``initialize``), default ``discoveryBudget`` (5 s) and timeouts (30 s). Wall
  time from ``initialize`` to the first ``tools/list`` answer, then of a ``tools/call`` of
  a working backend, for person A's first session, A's second session right after, and
  person B's first session.

    .venv/bin/python -m bench.client_sessions [--part sessions,stuck] [--declare none|requests]
                                              [--sessions 1000] [--users 100] [--pool 16]
                                              [--idle-release 60s] [--max-live-users N]
    .venv/bin/python -m bench.compare --ref REF client_sessions [ARGS]      # before / after
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from bench._common import (
    GATEWAY_TREE_ENV,
    ROOT,
    BackendProcess,
    Check,
    McpClient,
    RunningGateway,
    admin_config,
    admin_state,
    backend_counts,
    backend_open,
    backend_process,
    gateway,
    parse_args,
    print_header,
    record,
    run_benchmark,
    table,
)
from bench.scale import peak_threads
from bench.threads import Footprint, idle_seconds, per_thread_http, worker_pid

BACKENDS = 5
AUDIENCE = "vmcp"
DECLARED = {"none": {}, "requests": {"sampling": {}, "roots": {"listChanged": True}, "elicitation": {}}}
TARGET_RELEASED_THREADS = 300  # issue 34's goal, after the idle release
TARGET_RELEASED_RSS_MIB = 500
DISCOVERY_BUDGET = 5.0  # the default operational.discoveryBudget
STUCK_DELAY = 3600.0
WATCHDOG = 290.0  # one part in under 5 minutes on the shared 2 cores


def gateway_tree() -> str:
    """The source tree the gateways run: $VMCP_BENCH_GATEWAY_TREE (bench.compare's sides),
    else this checkout, never whatever ``vmcp_actors`` the venv's ``vmcp-actors`` imports
    (an editable install can point at another clone); the harness checks it from the log."""
    return os.environ.get(GATEWAY_TREE_ENV) or str(ROOT)


# ----------------------------------------------------------------------------------
# What the backends have received, and hold open
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AtBackends:
    """Summed over the backends: requests received so far, and GET streams open now."""

    initializes: int
    deletes: int
    gets: int
    streams_open: int

    @classmethod
    def of(cls, backends: Sequence[BackendProcess]) -> AtBackends:
        initializes = deletes = gets = streams = 0
        for backend in backends:
            counts = backend_counts(backend)
            initializes += sum(counts.get("POST", {}).get("initialize", {}).values())
            deletes += sum(sum(statuses.values()) for statuses in counts.get("DELETE", {}).values())
            gets += sum(sum(statuses.values()) for statuses in counts.get("GET", {}).values())
            streams += sum(backend_open(backend).get("GET", {}).values())
        return cls(initializes, deletes, gets, streams)


@dataclass(frozen=True)
class Point:
    """The gateway worker and the backends at one moment."""

    name: str
    footprint: Footprint
    at_backends: AtBackends
    live_users: int | None  # None: not asked (the admin state asks every live user)

    @classmethod
    def of(cls, name: str, gw: RunningGateway, backends: Sequence[BackendProcess], *, users: bool = True) -> Point:
        live = len(admin_state(gw).get("users", [])) if users else None
        return cls(name, Footprint.of(worker_pid(gw)), AtBackends.of(backends), live)

    def row(self, note: str = "") -> tuple[str, ...]:
        f, b = self.footprint, self.at_backends
        return (self.name, str(f.threads), f"{f.rss_mib:.1f} MiB", "" if self.live_users is None else str(self.live_users),
                str(b.initializes), str(b.streams_open), str(b.deletes), note)

    def record(self, prefix: str) -> None:
        self.footprint.record(f"{prefix} {self.name}")
        record(f"{prefix} {self.name}: backend initializes", self.at_backends.initializes)
        record(f"{prefix} {self.name}: backend streams open", self.at_backends.streams_open)
        if self.live_users is not None:
            record(f"{prefix} {self.name}: live users", self.live_users)


def settle_release(gw: RunningGateway, last_request: float, idle: float, grace: float = 30.0) -> float:
    """Wait until a reap has run past the idle timeout (the reaper runs every quarter of
    it), then until the worker's thread count holds still for 3 s (or ``grace`` s more).
    Seconds since the last request."""
    pid = worker_pid(gw)
    time.sleep(max(0.0, last_request + idle * 1.25 + 1.0 - time.monotonic()))
    deadline = time.monotonic() + grace
    seen, still_since = Footprint.of(pid).threads, time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - still_since < 3.0:
        time.sleep(0.5)
        now = Footprint.of(pid).threads
        if now != seen:
            seen, still_since = now, time.monotonic()
    return time.monotonic() - last_request


# ----------------------------------------------------------------------------------
# C1: many client sessions of few people
# ----------------------------------------------------------------------------------


def c1(sessions: int, users: int, pool: int, declare: str, idle_release: str, max_live_users: int | None) -> list[Check]:
    from tests.idp import LocalIdP

    idle = idle_seconds(idle_release)
    capabilities = DECLARED[declare]
    with contextlib.ExitStack() as stack:
        served = [stack.enter_context(backend_process("legacy", f"b{i}", "echo", count=True)) for i in range(BACKENDS)]
        tools = [f"{b.name}_echo" for b in served]
        idp = stack.enter_context(LocalIdP("bench-idp"))
        tokens = [idp.issue_token(f"bench-user-{i:04d}", AUDIENCE, expires_in=1800) for i in range(users)]
        operational: dict[str, Any] = {"userIdleTimeout": idle_release, "maxSessions": max(sessions, 1000),
                                       "sessionTTL": "30m"}
        if max_live_users is not None:
            operational["maxLiveUsers"] = max_live_users
        gw = stack.enter_context(gateway({b.name: b.mcp_url for b in served}, operational=operational, extra={
            "incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUDIENCE}}, **admin_config()},
            tree=gateway_tree()))
        print(f"C1: the gateway runs {gw.source}")
        started = Point.of("after start", gw, served)
        http, made = per_thread_http()
        stack.callback(lambda: [session.close() for session in made])
        session_ids: list[str | None] = [None] * sessions

        def open_one(index: int) -> None:
            client = McpClient(gw.url, http=http(), headers={"Authorization": f"Bearer {tokens[index % users]}"})
            session_ids[index] = client.initialize(capabilities)
            listed = client.list_tools()
            tool = tools[(index // users) % len(tools)]
            if tool not in listed:
                raise RuntimeError(f"session {index}: {tool} not in its tools/list answer {listed}")
            text = f"s{index}"
            answer = client.call_tool(tool, {"text": text})["content"][0]["text"]
            if not answer.endswith(f":{text}"):
                raise RuntimeError(f"session {index}: unexpected answer {answer!r}")

        with peak_threads(worker_pid(gw)) as peak:
            begun = time.perf_counter()
            with ThreadPoolExecutor(pool, thread_name_prefix="bench-open") as executor:
                list(executor.map(open_one, range(sessions)))
            took = time.perf_counter() - begun
            last_request = time.monotonic()
            opened = Point.of("after the sessions", gw, served)
        waited = settle_release(gw, last_request, idle)
        released = Point.of("after the idle release", gw, served)
        limits = admin_state(gw).get("liveUserLimits", {})
    if len(set(session_ids)) != sessions:
        raise RuntimeError(f"expected {sessions} distinct session ids, got {len(set(session_ids))}")

    requests = sessions * 4
    print(f"C1: {sessions} client sessions of {users} OIDC users over {BACKENDS} legacy backends; clients declare "
          f"{', '.join(capabilities) or 'nothing'}; userIdleTimeout {idle_release}, maxLiveUsers "
          f"{max_live_users if max_live_users is not None else '1000 (default)'}")
    print(table(["point", "gateway threads", "RSS", "live users", "backend initializes (total)",
                 "backend GET streams open", "backend DELETEs", "note"], [
        started.row(),
        opened.row(f"{requests} requests in {took:.1f} s ({requests / took:.0f}/s)"),
        ("peak while opening", str(peak[0]), "", "", "", "", "", "sampled every 0.2 s"),
        released.row(f"{waited:.1f} s after the last request"),
    ]))
    opened_sessions = opened.at_backends.initializes - started.at_backends.initializes
    others = opened.footprint.threads - (opened.live_users or 0) - opened.at_backends.streams_open
    print(f"backend sessions opened: {opened_sessions} ({opened_sessions / sessions:.2f} per client session, "
          f"{opened_sessions / users:.1f} per person); threads after the sessions: {opened.live_users} live users "
          f"(a UserActor each) + {opened.at_backends.streams_open} backend streams + {others} others; "
          f"maxLiveUsers releases: {limits.get('released', 'n/a')}, refusals: {limits.get('refused', 'n/a')}")
    print()
    prefix = f"C1 ({declare})"
    for point in (opened, released):
        point.record(prefix)
    record(f"{prefix} peak threads", peak[0])
    record(f"{prefix} backend sessions per client session", round(opened_sessions / sessions, 3))
    record(f"{prefix} requests per second while opening", round(requests / took, 1))
    rel = released.footprint
    return [
        Check(f"C1 ({declare}): gateway threads after the idle release ({sessions} sessions, {users} users)",
              str(rel.threads), f"< {TARGET_RELEASED_THREADS}", rel.threads < TARGET_RELEASED_THREADS),
        Check(f"C1 ({declare}): RSS after the idle release", f"{rel.rss_mib:.0f} MiB", f"< {TARGET_RELEASED_RSS_MIB} MiB",
              rel.rss_mib < TARGET_RELEASED_RSS_MIB),
        Check(f"C1 ({declare}): backend streams open after the idle release", str(released.at_backends.streams_open),
              "0", released.at_backends.streams_open == 0),
    ]


# ----------------------------------------------------------------------------------
# C2: one backend of five never answers initialize
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FirstList:
    label: str
    initialize_ms: float
    total_ms: float  # initialize sent -> tools/list answered
    backends: tuple[str, ...]  # whose tools the answer holds
    call_ms: float  # the tools/call of a working backend's echo right after


def first_list(gw: RunningGateway, token: str, label: str) -> FirstList:
    client = McpClient(gw.url, headers={"Authorization": f"Bearer {token}"}, timeout=90)
    started = time.perf_counter()
    client.initialize()
    initialized = time.perf_counter()
    tools = client.list_tools()
    answered = time.perf_counter()
    answer = client.call_tool("b0_echo", {"text": "x"})["content"][0]["text"]
    called = time.perf_counter()
    if answer != "b0:x":
        raise RuntimeError(f"{label}: unexpected answer {answer!r}")
    client.http.close()  # the session stays open: its user's discovery goes on
    return FirstList(label, (initialized - started) * 1000, (answered - started) * 1000,
                     tuple(sorted({tool.split("_", 1)[0] for tool in tools})), (called - answered) * 1000)


def c2() -> list[Check]:
    from tests.idp import LocalIdP

    with contextlib.ExitStack() as stack:
        good = [stack.enter_context(backend_process("legacy", f"b{i}", "echo")) for i in range(BACKENDS - 1)]
        stuck = stack.enter_context(backend_process("legacy", "stuck", "echo", delay=STUCK_DELAY))
        idp = stack.enter_context(LocalIdP("bench-idp"))
        backends = {**{b.name: b.mcp_url for b in good}, stuck.name: stuck.mcp_url}
        gw = stack.enter_context(gateway(backends, extra={
            "incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUDIENCE}}},
            tree=gateway_tree()))
        print(f"C2: the gateway runs {gw.source}")

        def token(person: str) -> str:
            return idp.issue_token(f"bench-{person}", AUDIENCE, expires_in=600)

        begun = time.perf_counter()
        rows = [first_list(gw, token("a"), "person A, first session")]
        rows.append(first_list(gw, token("a"), "person A, second session (right after)"))
        rows.append(first_list(gw, token("b"), "person B, first session"))
        took = time.perf_counter() - begun
    print(f"C2: {BACKENDS} backends, one ('stuck') never answers a POST; default discoveryBudget and timeouts; "
          "each row a new 2025 client session of an OIDC person, one after the other")
    print(table(["client session", "initialize", "initialize -> first tools/list answer", "backends in the answer",
                 "then tools/call b0_echo"], [
        (row.label, f"{row.initialize_ms:.0f} ms", f"{row.total_ms:.0f} ms",
         f"{len(row.backends)} of {BACKENDS}" + ("" if len(row.backends) == BACKENDS - 1 else f": {row.backends}"),
         f"{row.call_ms:.0f} ms")
        for row in rows]))
    print(f"the three rows took {took:.1f} s")
    print()
    for row in rows:
        record(f"C2 {row.label}: ms to first tools/list", round(row.total_ms))
        record(f"C2 {row.label}: ms of the tools/call after it", round(row.call_ms))
    first, second, other = rows
    budget_ms = DISCOVERY_BUDGET * 1000
    return [
        Check("C2: person A's first tools/list with one backend stuck", f"{first.total_ms:.0f} ms",
              f"<= {budget_ms + 1000:.0f} ms (discoveryBudget + 1 s)", first.total_ms <= budget_ms + 1000),
        Check("C2: person A's second session does not wait for the stuck backend again", f"{second.total_ms:.0f} ms",
              f"< {budget_ms / 2:.0f} ms (half the budget)", second.total_ms < budget_ms / 2),
        Check("C2: person B's first tools/list", f"{other.total_ms:.0f} ms",
              f"<= {budget_ms + 1000:.0f} ms (discoveryBudget + 1 s)", other.total_ms <= budget_ms + 1000),
        Check("C2: every answer holds the 4 working backends' tools",
              ", ".join(str(len(row.backends)) for row in rows), "4, 4, 4",
              all(len(row.backends) == BACKENDS - 1 for row in rows)),
    ]


# ----------------------------------------------------------------------------------

PARTS = ("sessions", "stuck")


def body(parts: Sequence[str], sessions: int, users: int, pool: int, declare: str, idle_release: str,
         max_live_users: int | None) -> list[Check]:
    print_header("client_sessions: per-client backend sessions (issue 34)", "gunicorn", [
        f"parts: {', '.join(parts)}",
        f"backends: {BACKENDS} x the SDK test backend as a 2025-11-25-only server (tests/eras.py LegacyOnly), "
        "each in its own process (bench/_backend_server.py)",
        f"C1: {sessions} client sessions of {users} OIDC users, {pool} client threads; clients declare "
        f"{', '.join(DECLARED[declare]) or 'nothing'}",
        "C2: one backend of five never answers; three new client sessions, one after the other",
    ])
    checks: list[Check] = []
    if "sessions" in parts:
        checks += c1(sessions, users, pool, declare, idle_release, max_live_users)
    if "stuck" in parts:
        checks += c2()
    return checks


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--sessions", type=int, default=1000, help="C1: client sessions (default 1000)")
        parser.add_argument("--users", type=int, default=100, help="C1: distinct OIDC users (default 100)")
        parser.add_argument("--pool", type=int, default=16, help="C1: client threads (default 16)")
        parser.add_argument("--declare", choices=tuple(DECLARED), default="none",
                            help="C1: what the clients declare: none, or requests (sampling, roots, elicitation)")
        parser.add_argument("--idle-release", metavar="DURATION", default="60s",
                            help="C1: operational.userIdleTimeout (default 60s)")
        parser.add_argument("--max-live-users", type=int, default=None, help="C1: operational.maxLiveUsers")

    args = parse_args(__doc__.splitlines()[0], extra=extra, parts=PARTS, default_parts=("sessions",),
                      gunicorn_only="bench.client_sessions measures the gunicorn worker")
    parts = args.parts
    try:
        idle_seconds(args.idle_release)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    run_benchmark(lambda: body(parts, args.sessions, args.users, args.pool, args.declare, args.idle_release,
                               args.max_live_users), watchdog=WATCHDOG * len(parts))


if __name__ == "__main__":
    main()
