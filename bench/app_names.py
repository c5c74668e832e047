"""Issue 38: what resolving a tools/call's name costs (MCP Apps' own tool names).

An MCP App calls its server's tools by the names its server gave them (``echo``) while the
gateway advertises ``echo_echo``; on every tools/call the edge asks
``McpDispatcher.tool_called`` which advertised tool the name means
(vmcp_actors/core/_dispatch.py), before anything decides on the call.

1. **calls**: the echo tool of one SDK backend in its own process (as bench.overhead),
   one thread, calls rotating mode by mode (the order reversed every other round, each
   mode in the place mirroring its counterpart's: ``rotation``), for a 2025-11-25 client
   (a session) and a 2026-07-28 client (none), each era:

   * ``direct``: the backend itself, ``echo``;
   * ``before``: a gateway served from ``--base`` (default 083bd96, the commit before
     issue 38; ``git archive`` into a temp dir), ``echo_echo``;
   * ``before, second client``: the same gateway, ``echo_echo`` again: a control, what two
     modes on one gateway differ by when nothing differs but their place in the rotation;
   * ``advertised``: a gateway served from this tree, ``echo_echo``;
   * ``own name``: the same gateway, ``echo`` (resolved to ``echo_echo``).

   Each gateway (``vmcp-actors serve``, gunicorn, one worker) serves two modes, in the
   same places of the rotation, so the two are as busy and as warm. p50/p95 per mode; own
   name / advertised next to the control's ratio (own name's place mirrors the control's:
   their difference less the control's is what the own name costs), gateway / direct, and
   the advertised call against ``before`` (the echo overhead before and after issue 38);
   each gateway worker's CPU per call over the phase.
2. **resolve**: ``tool_called`` alone in this process, CPU us per call:

   * on a real user's dispatcher (a gateway in this process, tests.gateway, over the same
     backend: its published catalog, the default layers' ``lookup_tool``): ``echo_echo``,
     ``echo``, a name that is neither;
   * on a dispatcher over ``build_catalog`` of 3 backends x 50 tools (5 tool names all
     three share, ranked by priorityOrder), with a dict lookup for the outer layer's
     ``lookup_tool`` (as tests/unit/test_shared_names.py builds it): an advertised name, a
     name one backend has, a name all three share, a name that is neither.

    .venv/bin/python -m bench.app_names [--part calls,resolve] [--calls 400] [--lookups 10000]
                                        [--eras legacy,modern] [--base REF]
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from types import MappingProxyType
from typing import Any

from bench._common import (
    ROOT,
    Check,
    McpClient,
    admin_config,
    admin_state,
    backend_process,
    gateway,
    interleaved_calls,
    median,
    parse_args,
    percentile,
    print_header,
    record,
    run_benchmark,
    table,
)
from bench.compare import TARGET_SEQUENTIAL_SLACK_MS, extracted, resolve
from bench.overhead import ERAS, WARMUP

BASE = "083bd96"  # the commit before issue 38
CONTROL = "before, second client"
VARIANTS = ("direct", "before", CONTROL, "advertised", "own name")
SIDE = {"before": "before", CONTROL: "before", "advertised": "after", "own name": "after"}  # the gateway
TOOL = {"direct": "echo", "before": "echo_echo", CONTROL: "echo_echo", "advertised": "echo_echo", "own name": "echo"}
ROUNDS = 5  # of the in-process lookups, modes interleaved
BACKENDS, TOOLS_EACH, SHARED = 3, 50, 5  # the synthetic catalog
# An own name's resolution (CPU, in process) against the gateway worker's CPU per call.
TARGET_RESOLUTION_SHARE = 0.01


# --- 1. calls ---------------------------------------------------------------------------


def rotation(eras: tuple[str, ...]) -> list[tuple[str, str]]:
    """The order of the modes in a round (reversed every other round): a mirror, before's
    modes in the first half, this tree's in the second, each in the place mirroring its
    counterpart's (before: advertised; the control: own name), so across forward and
    reversed rounds each follows the same kinds of call as its counterpart (a call right
    after another gateway's answer shares the CPUs with the rest of that gateway's work).
    Direct at the ends (one era: in the middle): where a round turns, its first and last
    mode are called twice in a row, the hottest place, so no compared mode has it."""
    mirror = {CONTROL: "own name", "before": "advertised"}
    first = [(era, variant) for variant in (CONTROL, "before") for era in eras]
    direct = [(era, "direct") for era in eras]
    ends = len(direct) // 2
    return [*direct[:ends], *first, *direct[ends:len(direct) - ends],
            *((era, mirror[variant]) for era, variant in reversed(first)), *direct[len(direct) - ends:]]


def calls_part(backend_url: str, calls: int, eras: tuple[str, ...], base_ref: str) -> tuple[list[Check], float]:
    """The variants per era, interleaved; (checks, this tree's gateway worker's CPU per
    call in ms)."""
    commit = resolve(base_ref)
    with contextlib.ExitStack() as stack:
        trees = {"before": stack.enter_context(extracted(commit)), "after": ROOT}
        gws = {side: stack.enter_context(gateway({"echo": backend_url}, tree=tree, extra=admin_config()))
               for side, tree in trees.items()}
        for side, gw in gws.items():
            print(f"{side}: gateway worker {gw.pid} runs {gw.source}")
        if None in (gw.pid for gw in gws.values()):
            raise RuntimeError("a gateway's gunicorn worker was not found")
        url = {variant: backend_url if variant == "direct" else gws[SIDE[variant]].url for variant in VARIANTS}
        clients = {(era, variant): McpClient(url[variant], modern=era == "modern") for era, variant in rotation(eras)}
        cpu_start = {side: gw.cpu_seconds() for side, gw in gws.items()}
        samples = interleaved_calls(clients, {key: TOOL[key[1]] for key in clients}, calls,
                                    lambda n: f"echo:{n}", WARMUP)
        served = len(eras) * 2 * (calls + WARMUP)  # by each gateway
        cpu_ms = {side: (gw.cpu_seconds() - cpu_start[side]) / served * 1000 for side, gw in gws.items()}
        spoken = {side: admin_state(gw).get("backendEras", {}).get("echo", "unknown") for side, gw in gws.items()}

    p50 = {key: median(values) * 1000 for key, values in samples.items()}
    p95 = {key: percentile(values, 95) * 1000 for key, values in samples.items()}
    print(f"\n### 1. echo, one thread ({calls} calls per mode after {WARMUP} warm-up calls, rotating mode by mode)\n")
    print(f"the gateways spoke to the backend: {', '.join(f'{v} {era}' for v, era in spoken.items())}\n")
    rows = []
    for era, variant in ((era, variant) for era in eras for variant in VARIANTS):
        direct = p50[(era, "direct")]
        rows.append((f"{era}: {variant} ({TOOL[variant]})", f"{p50[(era, variant)]:.3f} ms",
                     f"{p95[(era, variant)]:.3f} ms",
                     "" if variant == "direct" else f"{p50[(era, variant)] - direct:+.3f} ms",
                     "" if variant == "direct" else f"{p50[(era, variant)] / direct:.3f}"))
    print(table(["mode", "p50", "p95", "p50 - direct", "p50 / direct"], rows))

    checks = [Check("the gateways spoke the same era to the backend", ", ".join(spoken.values()), "the same",
                    len(set(spoken.values())) == 1)]
    ratio_rows = []
    for era in eras:
        direct, before, control, advertised, own = (p50[(era, variant)] for variant in VARIANTS)

        def ratio(label: str, a: str, b: str) -> tuple[str, str, str, str]:
            return (f"{era}: {label}", f"{p50[(era, a)] / p50[(era, b)]:.3f}", f"{p50[(era, a)] - p50[(era, b)]:+.3f} ms",
                    f"{p95[(era, a)] / p95[(era, b)]:.3f}")

        net = (own - advertised) - (control - before)  # the places' own difference taken out
        ratio_rows += [
            ratio("own name / advertised (one gateway)", "own name", "advertised"),
            ratio("control: second client / first (one gateway, one name)", CONTROL, "before"),
            (f"{era}: own name - advertised, less control - first", "", f"{net:+.3f} ms", ""),
            ratio("advertised / before", "advertised", "before"),
            (f"{era}: gateway overhead (p50 - direct), advertised / before",
             f"{(advertised - direct) / (before - direct):.3f}", "", ""),
        ]
        for variant in VARIANTS:
            record(f"{era}: {variant}: p50 ms", round(p50[(era, variant)], 3))
        record(f"{era}: own name / advertised p50", round(own / advertised, 4))
        record(f"{era}: own name - advertised less control - first, p50 ms", round(net, 4))
        record(f"{era}: advertised / before p50", round(advertised / before, 4))
        checks += [
            Check(f"{era}: own name p50 - advertised p50", f"{own - advertised:+.3f} ms",
                  f"<= +{TARGET_SEQUENTIAL_SLACK_MS:.2f} ms", own - advertised <= TARGET_SEQUENTIAL_SLACK_MS),
            Check(f"{era}: advertised p50 - before's (issue 38's echo overhead)", f"{advertised - before:+.3f} ms",
                  f"<= +{TARGET_SEQUENTIAL_SLACK_MS:.2f} ms", advertised - before <= TARGET_SEQUENTIAL_SLACK_MS),
        ]
    print()
    print(table(["measure", "p50 ratio", "p50 difference", "p95 ratio"], ratio_rows))
    print(f"\ngateway worker CPU per call over the phase (the warm-up calls counted, the clients' initialize in it): "
          f"before {cpu_ms['before']:.3f} ms, after {cpu_ms['after']:.3f} ms, after / before "
          f"{cpu_ms['after'] / cpu_ms['before']:.3f}")
    for side, value in cpu_ms.items():
        record(f"gateway CPU per call: {side}: ms", round(value, 4))
    return checks, cpu_ms["after"]


# --- 2. resolve ---------------------------------------------------------------------------


def timed(modes: dict[str, Callable[[], Any]], lookups: int) -> dict[str, float]:
    """Each mode ``lookups`` times per round, ROUNDS rounds interleaved (the order reversed
    every other round): this thread's CPU time per call in us (what other processes take
    of the CPUs meanwhile is not counted), the median of the rounds'."""
    per_round: dict[str, list[float]] = {name: [] for name in modes}
    for round_no in range(ROUNDS):
        for name in (list(modes) if round_no % 2 == 0 else list(modes)[::-1]):
            call = modes[name]
            started = time.thread_time()
            for _ in range(lookups):
                call()
            per_round[name].append((time.thread_time() - started) / lookups * 1e6)
    return {name: median(values) for name, values in per_round.items()}


@contextlib.contextmanager
def real_dispatcher(backend_url: str) -> Iterator[Any]:
    """A gateway in this process over ``backend_url``; the dispatcher of its one user, while
    a client's session (one call made) keeps that user."""
    import logging

    from tests.gateway import GatewayServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    served = GatewayServer({"name": "bench", "backends": [{"name": "echo", "url": backend_url}]}).start()
    try:
        with McpClient(served.url) as client:
            client.initialize()
            client.call_tool("echo_echo", {"text": "x"})
            users = served.app.extensions["vmcp_actors"].service._directory.live_users()
            if len(users) != 1:
                raise RuntimeError(f"expected one user in the in-process gateway, found {len(users)}")
            yield users[0].dispatcher
    finally:
        served.stop()


def synthetic_dispatcher() -> Any:
    """``McpDispatcher`` over a catalog of BACKENDS x TOOLS_EACH tools (SHARED of each
    backend's names shared by all, ranked by priorityOrder); the outer layer's
    ``lookup_tool`` is the catalog's ``tool_routes.get``."""
    from vmcp_actors.backends import DiscoveredBackend
    from vmcp_actors.config import AggregationConfig
    from vmcp_actors.core._catalog import build_catalog
    from vmcp_actors.core._dispatch import McpDispatcher

    names = [f"b{i}" for i in range(BACKENDS)]
    discovered = {
        name: DiscoveredBackend(name, MappingProxyType({"tools": {}}), tuple(
            {"name": f"shared-{j}" if j < SHARED else f"{name}-tool-{j}", "inputSchema": {"type": "object"}}
            for j in range(TOOLS_EACH)))
        for name in names}
    catalog = build_catalog(discovered, {}, AggregationConfig(priority_order=tuple(names)))

    class Outermost:
        """The outer layer's lookups, as cheap as they come: the catalog's routes."""

        @staticmethod
        def lookup_tool(identity: Any, name: str, deadline: Any) -> Any:
            return catalog.tool_routes.get(name)

        def __getattr__(self, method: str) -> Any:  # the dispatcher's other methods are not used here
            return lambda *args: ()

    return McpDispatcher(Outermost(), page_size=100,
                         own_names=lambda identity, name, deadline: catalog.own_names.get(name, ()))


def resolve_part(lookups: int, backend_url: str) -> dict[str, float]:
    from vmcp_actors.concurrency import Deadline

    deadline = Deadline.after(600)
    with real_dispatcher(backend_url) as real:
        synthetic = synthetic_dispatcher()
        cases = {  # mode: (dispatcher, name called, the advertised name it must come out as)
            "real user: advertised name (echo_echo)": (real, "echo_echo", "echo_echo"),
            "real user: own name (echo)": (real, "echo", "echo_echo"),
            "real user: neither (no-such-tool)": (real, "no-such-tool", "no-such-tool"),
            "3 x 50 tools: advertised name (b1_b1-tool-27)": (synthetic, "b1_b1-tool-27", "b1_b1-tool-27"),
            "3 x 50 tools: one backend's own name (b1-tool-27)": (synthetic, "b1-tool-27", "b1_b1-tool-27"),
            "3 x 50 tools: own name all 3 share, priorityOrder (shared-2)": (synthetic, "shared-2", "b0_shared-2"),
            "3 x 50 tools: neither (no-such-tool)": (synthetic, "no-such-tool", "no-such-tool"),
        }
        for mode, (dispatcher, name, meant) in cases.items():
            got = dispatcher.tool_called(None, name, deadline)
            if got != meant:
                raise RuntimeError(f"{mode}: tool_called answered {got!r}, not {meant!r}")
        us = timed({mode: (lambda d=dispatcher, n=name: d.tool_called(None, n, deadline))
                    for mode, (dispatcher, name, _) in cases.items()}, lookups)
    print(f"\n### 2. McpDispatcher.tool_called alone, in this process ({lookups} calls x {ROUNDS} rounds per mode, "
          f"interleaved; the median round)\n")
    print(table(["mode", "CPU per call"], [(mode, f"{value:.2f} us") for mode, value in us.items()]))
    for mode, value in us.items():
        record(f"tool_called: {mode}: us", round(value, 3))
    return us


# --- the run ------------------------------------------------------------------------------


def body(args: Any) -> list[Check]:
    print_header("app_names: a tools/call by a backend's own tool name (issue 38)", "gunicorn", [
        "backend: tests.backends.sdk_backend('echo') (official MCP SDK, both eras), in its own process",
        f"gateways: before = {args.base} (git archive, served from its extracted tree), after = {ROOT}",
        f"client eras: {', '.join(args.eras)}",
    ])
    checks: list[Check] = []
    gateway_cpu_ms = None
    with backend_process("sdk", "echo", "echo") as backend:
        if "calls" in args.parts:
            checks, gateway_cpu_ms = calls_part(backend.mcp_url, args.calls, args.eras, args.base)
        if "resolve" in args.parts:
            us = resolve_part(args.lookups, backend.mcp_url)
            if gateway_cpu_ms is not None:
                advertised, own = us["real user: advertised name (echo_echo)"], us["real user: own name (echo)"]
                share = own / (gateway_cpu_ms * 1000)
                print(f"\nagainst the gateway worker's CPU per call ({gateway_cpu_ms:.2f} ms): resolving an advertised "
                      f"name {advertised / (gateway_cpu_ms * 1000):.2%}, an own name {share:.2%} (real user)")
                checks.append(Check("own name's tool_called CPU (real user) / the gateway's CPU per call",
                                    f"{own:.1f} us = {share:.2%}", f"<= {TARGET_RESOLUTION_SHARE:.0%}",
                                    share <= TARGET_RESOLUTION_SHARE))
    return checks


def main() -> None:
    def extra(parser: Any) -> None:
        parser.add_argument("--calls", type=int, default=400, help="sequential calls per mode in part 1")
        parser.add_argument("--lookups", type=int, default=10000, help="tool_called calls per mode and round")
        parser.add_argument("--eras", default="legacy,modern",
                            help="client eras: legacy (2025-11-25), modern (2026-07-28), or both")
        parser.add_argument("--base", default=BASE, help=f"the 'before' gateway's commit (default {BASE})")

    args = parse_args(__doc__.splitlines()[0], extra=extra, parts=("calls", "resolve"),
                      gunicorn_only="bench.app_names serves its 'before' gateway from another tree, under gunicorn")
    args.eras = tuple(dict.fromkeys(era.strip() for era in args.eras.split(",") if era.strip()))
    if not args.eras or set(args.eras) - set(ERAS):
        raise SystemExit(f"--eras: a comma-separated list of {', '.join(ERAS)} (got {args.eras!r})")
    run_benchmark(lambda: body(args))


if __name__ == "__main__":
    main()
