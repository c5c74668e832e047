"""Remembered revisions (issue 22): what discovering legacy backends costs a new gateway process.

The gateway finds out which MCP revision a backend speaks by posting ``server/discover``
(2026-07-28) and falling back to ``initialize`` (2025-11-25) when the backend refuses. What
it learns is kept per process (``BackendEras``); with ``sessionStorage: redis`` it is to be
remembered in the shared store too, so that a new process does not probe again.

Five legacy-only backends, each in its own process: the official-SDK test backend as a
2025-11-25 server (tests/eras.py ``LegacyOnly``: the probe, sent with the 2026-07-28
header, gets HTTP 400 -32600), each answering every POST after 300 ms and counting what
reaches it by JSON-RPC method (bench/_backend_server.py ``--delay --count``). For each
shared store (Redis, then memory as the control):

* process 1 (a gunicorn gateway): user A's first ``tools/list`` (the process knows nothing),
  then user B's (the process knows the revision already: what a remembered revision
  should cost);
* process 1 is stopped and process 2 started on the same store: user C's first ``tools/list``.

Users are distinct OIDC subjects (tests/idp.py ``LocalIdP``, ``incomingAuth: oidc``): a
user's record carries its backend sessions and the discovery cache is per user, so a new
user is what makes a process discover and hand-shake for real; anonymous callers are all
one user. A last gateway has the backends pinned (``protocol: legacy``): no probe at all,
the floor. Per row: wall time from the client's ``initialize`` to the ``tools/list``
answer (the gateway fetches the IdP's keys on its first request: a few ms, in every
process alike), and the POSTs each backend received in that time, by method.

Target: the second process sends no ``server/discover`` to a legacy backend when Redis
holds the revision, and no more POSTs than with the revision pinned. Control: without
a shared store the second process probes again.

    .venv/bin/python -m bench.discovery_eras [--delay 0.3]
    .venv/bin/python -m bench.compare --ref REF discovery_eras      # before / after
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench._common import (
    BackendProcess,
    Check,
    McpClient,
    RunningGateway,
    admin_config,
    admin_state,
    backend_counts,
    backend_process,
    gateway,
    parse_args,
    print_header,
    record,
    run_benchmark,
    table,
)

BACKENDS = 5
DELAY = 0.3
AUDIENCE = "vmcp"
SIGNING_KEY_ENV = "VMCP_BENCH_SIGNING_KEY"
# The columns, in the order a discovery sends them; any other method gets a column after these.
METHODS = ("server/discover", "initialize", "notifications/initialized", "tools/list", "resources/list",
           "resources/templates/list", "prompts/list")
SECOND_PROCESS = "process 2, user C"


@dataclass(frozen=True)
class Discovery:
    """One client's first ``tools/list``: its times and what each backend received meanwhile."""

    store: str
    phase: str
    initialize_ms: float
    total_ms: float  # initialize sent -> tools/list answered
    tools: int
    received: tuple[Counter[str], ...]  # per backend: POSTs by JSON-RPC method
    other: Counter[str]  # every backend's other requests (GET, DELETE) by HTTP method
    late: Counter[str]  # every backend's POSTs that arrived within a delay after the answer
    discover_statuses: Counter[str]  # how the backends answered server/discover
    eras: Mapping[str, str]  # the gateway's backendEras (admin state) after the answer

    @property
    def label(self) -> str:
        return f"{self.store}: {self.phase}"

    def per_backend(self, method: str) -> str:
        """``n`` when every backend received ``method`` n times, else ``min-max``."""
        counts = [received[method] for received in self.received]
        return str(counts[0]) if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"

    def most(self, method: str) -> int:
        return max(received[method] for received in self.received)

    def posts(self) -> int:
        """POSTs the busiest backend received."""
        return max(sum(received.values()) for received in self.received)


@dataclass(frozen=True)
class Received:
    """What one backend has received so far."""

    posts: Counter[str]  # by JSON-RPC method
    other: Counter[str]  # by HTTP method
    discover_statuses: Counter[str]  # server/discover, by the HTTP status it was answered with

    @classmethod
    def of(cls, backend: BackendProcess) -> Received:
        counts = backend_counts(backend)
        posts = Counter({method: sum(statuses.values()) for method, statuses in counts.get("POST", {}).items()})
        other = Counter({verb: sum(sum(statuses.values()) for statuses in methods.values())
                         for verb, methods in counts.items() if verb != "POST"})
        return cls(posts, other, Counter(counts.get("POST", {}).get("server/discover", {})))


def snapshot(backends: Sequence[BackendProcess]) -> list[Received]:
    return [Received.of(backend) for backend in backends]


def first_tools_list(gw: RunningGateway, token: str, backends: Sequence[BackendProcess], store: str, phase: str,
                     delay: float) -> Discovery:
    """A new client of a new user: initialize, then tools/list; the backends' counts around it."""
    before = snapshot(backends)
    with McpClient(gw.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        started = time.perf_counter()
        client.initialize()
        initialized = time.perf_counter()
        tools = client.list_tools()
        answered = time.perf_counter()
        at_answer = snapshot(backends)
        eras = admin_state(gw).get("backendEras", {})
        time.sleep(delay + 0.2)  # anything sent right after the answer has arrived by now
        settled = snapshot(backends)
    time.sleep(0.3)  # the client's DELETE: the gateway ends the user's backend sessions before the next row
    if len(tools) != len(backends):
        raise RuntimeError(f"{store}, {phase}: expected {len(backends)} tools, got {tools}")
    return Discovery(
        store=store, phase=phase,
        initialize_ms=(initialized - started) * 1000, total_ms=(answered - started) * 1000, tools=len(tools),
        received=tuple(now.posts - then.posts for now, then in zip(at_answer, before)),
        other=sum((now.other - then.other for now, then in zip(at_answer, before)), Counter()),
        late=sum((later.posts - now.posts for later, now in zip(settled, at_answer)), Counter()),
        discover_statuses=sum((now.discover_statuses - then.discover_statuses
                               for now, then in zip(at_answer, before)), Counter()),
        eras=dict(eras),
    )


def run_store(store: str, backends: Sequence[BackendProcess], incoming: dict, idp, redis_address: str | None,
              delay: float) -> list[Discovery]:
    """Process 1 (users A and B), stopped; process 2 (user C), on the same store."""
    urls = {backend.name: backend.mcp_url for backend in backends}
    extra = {**incoming, **admin_config()}
    if redis_address is not None:
        extra["sessionStorage"] = {"provider": "redis", "address": redis_address, "keyPrefix": "bench22:"}
    operational = {"signingKeyEnv": SIGNING_KEY_ENV}

    def token(user: str) -> str:
        return idp.issue_token(f"bench-{store}-{user}", AUDIENCE, expires_in=600)

    found = []
    with gateway(urls, operational=operational, extra=extra) as first:
        found.append(first_tools_list(first, token("a"), backends, store, "process 1, user A", delay))
        found.append(first_tools_list(first, token("b"), backends, store, "process 1, user B", delay))
    with gateway(urls, operational=operational, extra=extra) as second:
        found.append(first_tools_list(second, token("c"), backends, store, SECOND_PROCESS, delay))
    return found


def run_pinned(backends: Sequence[BackendProcess], incoming: dict, idp, delay: float) -> Discovery:
    """The floor: the revision given in the config (``protocol: legacy``), never probed."""
    urls = {backend.name: backend.mcp_url for backend in backends}
    extra = {**incoming, **admin_config(),
             "backends": [{"name": name, "url": url, "protocol": "legacy"} for name, url in urls.items()]}
    with gateway(urls, operational={"signingKeyEnv": SIGNING_KEY_ENV}, extra=extra) as gw:
        token = idp.issue_token("bench-pinned-a", AUDIENCE, expires_in=600)
        return first_tools_list(gw, token, backends, "pinned", "protocol: legacy, user A", delay)


def body(delay: float) -> list[Check]:
    from tests.idp import LocalIdP
    from tests.redis_server import RedisServer

    print_header("discovery_eras: discovering legacy backends in a new process (issue 22)", "gunicorn", [
        f"backends: {BACKENDS} x the SDK test backend as a 2025-11-25-only server (tests/eras.py LegacyOnly), "
        f"each in its own process, every POST answered after {delay * 1000:g} ms",
        "clients: a new OIDC user per row (tests/idp.py LocalIdP), a 2025-11-25 client: initialize, tools/list",
        "stores: sessionStorage redis (a local redis-server), then memory (the control); then the revision pinned",
    ])
    os.environ.setdefault(SIGNING_KEY_ENV, secrets.token_urlsafe(32))
    with contextlib.ExitStack() as stack:
        backends = [stack.enter_context(backend_process("legacy", f"b{i}", "echo", delay=delay, count=True))
                    for i in range(BACKENDS)]
        idp = stack.enter_context(LocalIdP("bench-idp"))
        incoming = {"incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUDIENCE}}}
        redis = RedisServer().start()
        stack.callback(redis.close)
        rows = run_store("redis", backends, incoming, idp, redis.address, delay)
        rows += run_store("memory", backends, incoming, idp, None, delay)
        rows.append(run_pinned(backends, incoming, idp, delay))
    return report_rows(rows, delay)


def report_rows(rows: Sequence[Discovery], delay: float) -> list[Check]:
    seen = {method for row in rows for received in row.received for method in received}
    methods = [m for m in METHODS if m in seen] + sorted(seen - set(METHODS))
    print(f"first tools/list of a new user; requests per backend ({BACKENDS} backends; 'n-m' where they differ)")
    print(table(["store: process, user", "initialize -> tools/list", f"in {delay * 1000:g} ms round trips", *methods, "POSTs"], [
        (row.label, f"{row.total_ms:.0f} ms", f"{row.total_ms / (delay * 1000):.1f}",
         *(row.per_backend(m) for m in methods), str(row.posts())) for row in rows]))
    print()
    for row in rows:
        statuses = ", ".join(f"HTTP {status} x {n}" for status, n in sorted(row.discover_statuses.items()))
        eras = ", ".join(sorted(set(row.eras.values()))) or "none"
        print(f"{row.label}: initialize {row.initialize_ms:.0f} ms; backendEras after: {eras}"
              + (f"; server/discover answered {statuses}" if statuses else "")
              + (f"; other requests: {dict(row.other)}" if row.other else "")
              + (f"; POSTs after the answer: {dict(row.late)}" if row.late else ""))
    for row in rows:
        record(f"{row.label}: ms to first tools/list", round(row.total_ms, 1))
        record(f"{row.label}: server/discover per backend", row.most("server/discover"))
        record(f"{row.label}: POSTs per backend", row.posts())
    by_label = {row.label: row for row in rows}
    remembered = by_label[f"redis: {SECOND_PROCESS}"]
    control = by_label[f"memory: {SECOND_PROCESS}"]
    floor = next(row for row in rows if row.store == "pinned")
    return [
        Check("second process sends no server/discover to a legacy backend when the revision is remembered in Redis",
              f"{remembered.per_backend('server/discover')} per backend", "0",
              remembered.most("server/discover") == 0),
        Check("second process (Redis): POSTs per legacy backend, at most as with the revision pinned",
              str(remembered.posts()), f"<= {floor.posts()}", remembered.posts() <= floor.posts()),
        Check("control: second process without a shared store (memory) probes again",
              f"{control.per_backend('server/discover')} server/discover per backend", ">= 1",
              min(received["server/discover"] for received in control.received) >= 1),
    ]


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--delay", type=float, default=DELAY,
                            help=f"seconds every backend waits before answering a POST (default {DELAY:g})")

    args = parse_args(__doc__.splitlines()[0], extra=extra,
                      gunicorn_only="bench.discovery_eras starts and stops gateway processes")
    run_benchmark(lambda: body(args.delay))


if __name__ == "__main__":
    main()
