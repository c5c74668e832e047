"""Shared benchmark helpers: timing and percentiles, tables and targets, a raw MCP client,
and the gateway served the way production serves it.

The gateway runs as ``vmcp-actors serve --config FILE --port P`` in a subprocess (gunicorn,
gthread, 1 worker, 128 threads: vmcp_actors/web/gunicorn_settings.py) over a YAML config
generated in a temp dir that points at test backends served in this process
(tests/backends.py). ``--server werkzeug`` runs tests.gateway.GatewayServer in-process
instead, for comparison.

``VMCP_BENCH_LOG_DIR=DIR`` keeps each gunicorn gateway's log (one INFO line per request
with the gateway's own duration_ms) in DIR.

``VMCP_BENCH_GATEWAY_TREE=DIR`` serves the gateway from the source tree DIR (a checkout or
a ``git archive`` of another commit) instead of the installed package: ``python -c`` with
``PYTHONPATH=DIR`` in DIR, which logs the ``vmcp_actors`` it imported; the harness checks
that it is DIR's. ``VMCP_BENCH_RESULTS=FILE`` writes the targets and recorded metrics of a
run to FILE as JSON (bench/compare.py reads them).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import faulthandler
import itertools
import json
import math
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL_VERSION = "2025-11-25"
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
GUNICORN_LABEL = "gunicorn gthread, 1 worker, 128 threads (vmcp-actors serve, subprocess)"
WERKZEUG_LABEL = "werkzeug threaded server (tests.gateway.GatewayServer, in-process)"
WATCHDOG_SECONDS = 115.0  # every script must finish within 2 minutes
GATEWAY_TREE_ENV = "VMCP_BENCH_GATEWAY_TREE"
RESULTS_ENV = "VMCP_BENCH_RESULTS"
ADMIN_TOKEN_ENV = "VMCP_BENCH_ADMIN_TOKEN"  # set by admin_config() for the gateways this process starts


# ----------------------------------------------------------------------------------
# Numbers
# ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default), ``p`` in 0..100."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    k = (len(ordered) - 1) * p / 100.0
    low = math.floor(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


@dataclass(frozen=True)
class Stats:
    """Latency samples summarized, in milliseconds."""

    n: int
    p50: float
    p99: float
    mean: float
    min: float
    max: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Stats:
        ms = [s * 1000.0 for s in seconds]
        return cls(len(ms), percentile(ms, 50), percentile(ms, 99), sum(ms) / len(ms), min(ms), max(ms))


# ----------------------------------------------------------------------------------
# Output: tables, targets, the run header
# ----------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


@dataclass(frozen=True)
class Check:
    """One target: what was measured against what was wanted."""

    name: str
    measured: str
    target: str
    ok: bool


def report(checks: Sequence[Check]) -> int:
    """Print the targets table; 0 if every target is met, else 1."""
    if not checks:
        print("\n(diagnostic: no targets)")
        return 0
    print()
    print(table(["target", "measured", "wanted", "result"],
                [(c.name, c.measured, c.target, "MET" if c.ok else "MISSED") for c in checks]))
    missed = [c.name for c in checks if not c.ok]
    _write_results(checks)
    if STALE_RETRIES:
        print(f"\nnote: {len(STALE_RETRIES)} request(s) were retried once because the gateway closed the "
              "kept-alive connection as the client reused it (gunicorn keepalive timeout)")
    print()
    print("RESULT:", "all targets met" if not missed else f"MISSED {len(missed)}: {', '.join(missed)}")
    return 0 if not missed else 1


# Numbers a benchmark records for bench/compare.py (written with the targets, see RESULTS_ENV).
METRICS: dict[str, float] = {}


def record(name: str, value: float) -> None:
    METRICS[name] = value


def _write_results(checks: Sequence[Check]) -> None:
    path = os.environ.get(RESULTS_ENV)
    if path:
        Path(path).write_text(json.dumps({"metrics": METRICS, "checks": [vars(c) for c in checks]}, indent=1))


def print_header(title: str, server: str, extra: Sequence[str] = ()) -> None:
    print(f"== {title} ==")
    print(f"date: {datetime.date.today().isoformat()}   python {platform.python_version()}   "
          f"cpus: {os.cpu_count()}   host: {platform.machine()}")
    print(f"code: {code_version()}")
    if os.environ.get(GATEWAY_TREE_ENV):
        print(f"gateway code: the source tree {os.environ[GATEWAY_TREE_ENV]} ({GATEWAY_TREE_ENV})")
    print(f"gateway served by: {server_label(server)}")
    print("test backends: tests/backends.py on uvicorn, in the benchmark's process unless said below")
    for line in extra:
        print(line)
    print()


def code_version() -> str:
    """The commit measured (read-only git), marked when vmcp_actors/ has uncommitted changes."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "vmcp_actors"], cwd=ROOT, capture_output=True,
                               text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    return f"{commit or 'unknown'}{' + uncommitted changes in vmcp_actors/' if dirty else ''}"


def server_label(server: str) -> str:
    return GUNICORN_LABEL if server == "gunicorn" else WERKZEUG_LABEL


def parse_args(description: str, argv: Sequence[str] | None = None,
               extra: Callable[[argparse.ArgumentParser], None] | None = None, *,
               parts: Sequence[str] | None = None, default_parts: Sequence[str] | None = None,
               gunicorn_only: str | None = None) -> argparse.Namespace:
    """The options every bench has (``--server``), ``extra``'s, and with ``parts`` a
    ``--part`` list (``args.parts``, each one of ``parts``; ``default_parts``, else all).
    ``gunicorn_only``: what the bench needs gunicorn for; it then refuses ``--server
    werkzeug`` saying so."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--server", choices=("gunicorn", "werkzeug"), default="gunicorn",
                        help="how to serve the gateway (default: gunicorn, as in production)")
    if parts is not None:
        default = ",".join(default_parts if default_parts is not None else parts)
        parser.add_argument("--part", default=default,
                            help=f"a comma-separated list of {', '.join(parts)} (default {default})")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    if gunicorn_only is not None and args.server != "gunicorn":
        raise SystemExit(f"{gunicorn_only}: --server werkzeug is not supported")
    if parts is not None:
        args.parts = [part.strip() for part in args.part.split(",") if part.strip()]
        unknown = sorted(set(args.parts) - set(parts))
        if unknown or not args.parts:
            raise SystemExit(f"--part: unknown {', '.join(unknown) or '(none given)'} (choose from {', '.join(parts)})")
    return args


def settle_heap() -> None:
    """Keep this process's own GC pauses out of the numbers.

    This process hosts the load-generating clients and the test backends (mcp SDK,
    pydantic, starlette: a big heap); a full collection here takes ~90 ms and lands on
    whichever call is in flight. Freezing what exists moves it out of the collector's
    reach. The gateway's process is left alone: its pauses are part of what we measure.
    """
    import gc
    import importlib

    for module in ("mcp.server.mcpserver", "starlette.applications", "uvicorn", "tests.backends", "tests.gateway"):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    gc.collect()
    gc.freeze()


def run_benchmark(body: Callable[[], Sequence[Check]], watchdog: float = WATCHDOG_SECONDS) -> None:
    """Run ``body`` with a watchdog; stop every actor of this process; exit 0 iff all targets met."""
    faulthandler.dump_traceback_later(watchdog, exit=True)
    settle_heap()
    code = 1
    try:
        code = report(body())
    finally:
        import pykka

        pykka.ActorRegistry.stop_all(block=True, timeout=5)
        faulthandler.cancel_dump_traceback_later()
    sys.exit(code)


# ----------------------------------------------------------------------------------
# A raw MCP client (requests, keep-alive), the same code for the gateway and backends
# ----------------------------------------------------------------------------------


class RpcFailure(Exception):
    pass


MODERN_VERSION = "2026-07-28"
MODERN_META = {"io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
               "io.modelcontextprotocol/clientCapabilities": {},
               "io.modelcontextprotocol/clientInfo": {"name": "vmcp-bench", "version": "1"}}


def _modern(message: dict[str, Any], headers: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """A message as a 2026-07-28 client sends it: metadata in ``_meta``, mirrored in headers."""
    params = dict(message.get("params") or {})
    params["_meta"] = {**params.get("_meta", {}), **MODERN_META}
    headers = {**headers, "MCP-Protocol-Version": MODERN_VERSION, "Mcp-Method": message["method"]}
    name = params.get("name", params.get("uri"))
    if isinstance(name, str) and message["method"] in ("tools/call", "prompts/get", "resources/read"):
        headers["Mcp-Name"] = name
    return {**message, "params": params}, headers


class McpClient:
    """One MCP session over one ``requests.Session`` (one keep-alive connection).

    Not thread-safe: use :meth:`fork` for another thread on the same MCP session.
    ``headers`` go with every request (e.g. Authorization); ``http`` shares a
    ``requests.Session`` between MCP sessions used one after the other on one thread.
    """

    def __init__(self, url: str, *, timeout: float = 30.0, session_id: str | None = None,
                 ids: Iterator[int] | None = None, headers: Mapping[str, str] | None = None,
                 http: requests.Session | None = None, modern: bool = False):
        self.modern = modern  # MCP 2026-07-28: no initialize, no session, metadata on every request
        self.url = url
        self.timeout = timeout
        self.session_id = session_id
        self.extra_headers = dict(headers or {})
        self.http = http if http is not None else requests.Session()
        self._ids = ids if ids is not None else itertools.count(1)

    def fork(self) -> McpClient:
        """Another client on the same MCP session, with its own HTTP connection."""
        return McpClient(self.url, timeout=self.timeout, session_id=self.session_id, ids=self._ids,
                         headers=self.extra_headers, modern=self.modern)

    def _headers(self) -> dict[str, str]:
        headers = {**MCP_HEADERS, **self.extra_headers}
        if self.session_id is not None:
            headers["Mcp-Session-Id"] = self.session_id
            headers["MCP-Protocol-Version"] = PROTOCOL_VERSION
        return headers

    def post(self, message: dict[str, Any], timeout: float | None = None) -> requests.Response:
        headers = self._headers()
        if self.modern:
            message, headers = _modern(message, headers)
        body = json.dumps(message, separators=(",", ":"))
        try:
            return self.http.post(self.url, data=body, headers=headers, timeout=timeout or self.timeout)
        except requests.ConnectionError as exc:
            if not _stale_keepalive(exc):
                raise
            # The server closed this kept-alive connection as we reused it (gunicorn's
            # keepalive timeout): nothing reached the application. Retry once, fresh.
            STALE_RETRIES.append(time.monotonic())
            return self.http.post(self.url, data=body, headers=headers, timeout=timeout or self.timeout)

    def initialize(self, capabilities: Mapping[str, Any] | None = None) -> str | None:
        """initialize (declaring ``capabilities``, default none) + notifications/initialized;
        returns the session id (None if stateless or a 2026-07-28 client, which has no handshake)."""
        if self.modern:
            return None
        message = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                   "params": {"protocolVersion": PROTOCOL_VERSION, "capabilities": dict(capabilities or {}),
                              "clientInfo": {"name": "vmcp-bench", "version": "1"}}}
        response = self.post(message)
        if response.status_code != 200:
            raise RpcFailure(f"initialize: HTTP {response.status_code}: {response.text[:200]}")
        answer = _answer(response, 0)
        if "result" not in answer:
            raise RpcFailure(f"initialize failed: {answer}")
        self.session_id = response.headers.get("Mcp-Session-Id")
        note = self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if note.status_code != 202:
            raise RpcFailure(f"notifications/initialized: HTTP {note.status_code}")
        return self.session_id

    def request(self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> dict:
        """One request; its result, or RpcFailure on an HTTP or JSON-RPC error."""
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        response = self.post(message, timeout)
        if response.status_code != 200:
            raise RpcFailure(f"{method}: HTTP {response.status_code}: {response.text[:200]}")
        answer = _answer(response, request_id)
        if "error" in answer:
            raise RpcFailure(f"{method}: {answer['error']}")
        return answer["result"]

    def exchange(self, method: str, params: dict[str, Any] | None = None,
                 timeout: float | None = None) -> tuple[requests.Response, dict[str, Any] | None]:
        """One request, nothing raised for an HTTP or JSON-RPC error: the HTTP response and
        the JSON-RPC answer in it (None when its body holds none)."""
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        response = self.post(message, timeout)
        try:
            answer = _answer(response, request_id)
        except (ValueError, RpcFailure):
            return response, None
        return response, answer if isinstance(answer, dict) else None

    def call_tool(self, name: str, arguments: dict[str, Any] | None = None, timeout: float | None = None) -> dict:
        result = self.request("tools/call", {"name": name, "arguments": arguments or {}}, timeout)
        if result.get("isError"):
            raise RpcFailure(f"tools/call {name}: isError: {result.get('content')}")
        return result

    def list_tools(self) -> list[str]:
        return [tool["name"] for tool in self.request("tools/list")["tools"]]

    def close(self) -> None:
        """End the MCP session (best effort) and close the connection."""
        try:
            if self.session_id is not None:
                self.http.delete(self.url, headers=self._headers(), timeout=2)
        except requests.RequestException:
            pass
        finally:
            self.http.close()

    def __enter__(self) -> McpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Requests retried because the server closed the kept-alive connection as it was reused.
STALE_RETRIES: list[float] = []


def _stale_keepalive(exc: requests.ConnectionError) -> bool:
    """A POST that died on a kept-alive connection the server had just closed."""
    text = repr(exc)
    return "RemoteDisconnected" in text or "ConnectionResetError" in text or "BrokenPipeError" in text


def _answer(response: requests.Response, request_id: Any) -> dict[str, Any]:
    """The JSON-RPC response to ``request_id``: the JSON body, or the matching SSE event."""
    if not response.headers.get("Content-Type", "").startswith("text/event-stream"):
        return response.json()
    data: list[str] = []
    for line in response.text.splitlines() + [""]:
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
        elif not line and data:
            message = json.loads("\n".join(data))
            data = []
            if isinstance(message, dict) and message.get("id") == request_id and "method" not in message:
                return message
    raise RpcFailure(f"no answer to request {request_id} in the event stream")


def run_threads(count: int, work: Callable[[int], Any], timeout: float = 60.0) -> list[Any]:
    """Run ``work(i)`` on ``count`` threads started together; their results (or exceptions)."""
    results: list[Any] = [None] * count
    barrier = threading.Barrier(count)

    def target(index: int) -> None:
        try:
            barrier.wait(timeout)
            results[index] = work(index)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            results[index] = exc

    threads = [threading.Thread(target=target, args=(i,), name=f"bench-client-{i}", daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in threads):
        raise RuntimeError(f"benchmark threads still running after {timeout:g}s")
    return results


def raise_failures(results: Sequence[Any]) -> None:
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(results)} client threads failed; first: {errors[0]!r}") from errors[0]


# ----------------------------------------------------------------------------------
# Backends and the gateway
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunningGateway:
    url: str
    base: str
    server: str
    log_path: Path | None = None
    pid: int | None = None  # the gunicorn worker (None: in this process)
    source: str | None = None  # the vmcp_actors/__init__.py it runs, when served from a source tree

    def client(self, timeout: float = 30.0) -> McpClient:
        return McpClient(self.url, timeout=timeout)

    def cpu_seconds(self) -> float | None:
        """CPU time (user + system) the gunicorn worker has used so far."""
        return process_cpu_seconds(self.pid) if self.pid is not None else None


def process_cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of process ``pid`` (default: this process), from /proc."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class BackendProcess:
    name: str
    mcp_url: str
    pid: int


@contextlib.contextmanager
def backend_process(kind: str, name: str, *tools: str, delay: float = 0.0,
                    count: bool = False) -> Iterator[BackendProcess]:
    """A test backend (``sdk``, ``legacy`` or ``raw``) served in its own process
    (bench/_backend_server.py): ``delay`` seconds before every POST's answer; ``count``:
    what reaches it, read with :func:`backend_counts`."""
    options = [f"--delay={delay:g}"] if delay else []
    if count:
        options.append("--count")
    proc = subprocess.Popen([sys.executable, "-m", "bench._backend_server", *options, kind, name, *tools], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
    try:
        url = proc.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError(f"backend process {name!r} did not start")
        yield BackendProcess(name, url, proc.pid)
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        _stop_process(proc)


def backend_counts(backend: BackendProcess) -> dict[str, dict[str, dict[str, int]]]:
    """What has reached a ``backend_process(..., count=True)`` so far: {HTTP method:
    {JSON-RPC method (POST) or "": {HTTP status or "pending": n}}}."""
    from bench._backend_server import COUNTS_PATH

    response = requests.get(backend.mcp_url.removesuffix("/mcp") + COUNTS_PATH, timeout=10)
    response.raise_for_status()
    return response.json()


def backend_open(backend: BackendProcess) -> dict[str, dict[str, int]]:
    """The requests a ``backend_process(..., count=True)`` is handling right now: {HTTP
    method: {JSON-RPC method (POST) or "": n}} (only those with some open)."""
    from bench._backend_server import OPEN_PATH

    response = requests.get(backend.mcp_url.removesuffix("/mcp") + OPEN_PATH, timeout=10)
    response.raise_for_status()
    return response.json()


def config_mapping(backends: Mapping[str, str], operational: Mapping[str, Any] | None = None,
                   extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A gateway config for ``{backend name: MCP URL}``; ``extra`` adds top-level sections."""
    config: dict[str, Any] = {"name": "bench", "backends": [{"name": n, "url": u} for n, u in backends.items()]}
    if operational:
        config["operational"] = dict(operational)
    config.update(extra or {})
    return config


def admin_config() -> dict[str, Any]:
    """The config section that turns on the gateway's ``/admin`` (for :func:`admin_state`),
    its token a random one in ``$VMCP_BENCH_ADMIN_TOKEN`` (the gunicorn gateway inherits it)."""
    os.environ.setdefault(ADMIN_TOKEN_ENV, secrets.token_urlsafe(24))
    return {"admin": {"tokenEnv": ADMIN_TOKEN_ENV}}


def admin_state(gw: RunningGateway) -> dict[str, Any]:
    """``GET /admin/state`` of a gateway started with :func:`admin_config` in its config."""
    response = requests.get(gw.base + "/admin/state", timeout=10,
                            headers={"Authorization": f"Bearer {os.environ.get(ADMIN_TOKEN_ENV, '')}"})
    response.raise_for_status()
    return response.json()


@contextlib.contextmanager
def gateway(backends: Mapping[str, str], *, server: str = "gunicorn",
            operational: Mapping[str, Any] | None = None,
            extra: Mapping[str, Any] | None = None, tree: str | Path | None = None) -> Iterator[RunningGateway]:
    """The gateway over ``backends`` ({name: MCP URL}), stopped (and its actors) on exit.

    ``tree`` (default: $VMCP_BENCH_GATEWAY_TREE) serves it from that source tree."""
    config = config_mapping(backends, operational, extra)
    tree = tree or os.environ.get(GATEWAY_TREE_ENV) or None
    if server == "werkzeug" and tree is not None:
        raise RuntimeError("a gateway from another source tree runs under gunicorn only (not in-process)")
    if server == "werkzeug":
        import logging

        from tests.gateway import GatewayServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no access log line per request

        served = GatewayServer(config).start()
        try:
            yield RunningGateway(served.url, served.base, WERKZEUG_LABEL)
        finally:
            served.stop()
        return
    with tempfile.TemporaryDirectory(prefix="vmcp-bench-") as tmp:
        config_path = Path(tmp) / "config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        log_path = Path(tmp) / "gateway.log"
        try:
            with _gunicorn(config_path, log_path, tree) as (base, worker):
                source = _tree_source(log_path, tree) if tree is not None else None
                yield RunningGateway(base + "/mcp", base, GUNICORN_LABEL, log_path, worker, source)
        finally:
            keep = os.environ.get("VMCP_BENCH_LOG_DIR")
            if keep and log_path.exists():
                Path(keep).mkdir(parents=True, exist_ok=True)
                # The temp dir's name too: gateways of one run may stop in the same second.
                kept = Path(keep) / f"gateway-{os.getpid()}-{time.strftime('%H%M%S')}-{Path(tmp).name}.log"
                kept.write_bytes(log_path.read_bytes())
                print(f"(gateway log kept: {kept})")


def _vmcp_actors_command() -> list[str]:
    script = Path(sys.executable).parent / "vmcp-actors"
    return [str(script)] if script.exists() else [sys.executable, "-m", "vmcp_actors.cli"]


_SOURCE_MARK = "bench: vmcp_actors imported from "
_TREE_LAUNCHER = ("import sys, vmcp_actors; "
                  f"print({_SOURCE_MARK!r} + vmcp_actors.__file__, file=sys.stderr, flush=True); "
                  "from vmcp_actors.cli import main; sys.argv[0] = 'vmcp-actors'; sys.exit(main())")


@dataclass(frozen=True)
class Invocation:
    """How to run the ``vmcp-actors`` command: argv prefix, working directory, environment."""

    argv: list[str]
    cwd: Path = ROOT
    env: dict[str, str] | None = None  # None: this process's


def vmcp_actors_invocation(tree: str | Path | None = None) -> Invocation:
    """The installed ``vmcp-actors``, or (``tree``) the ``vmcp_actors`` of that source tree:
    run in the tree with it first on PYTHONPATH, so it wins over the editable install."""
    if tree is None:
        return Invocation(_vmcp_actors_command())
    tree = Path(tree).resolve()
    if not (tree / "vmcp_actors" / "__init__.py").is_file():
        raise RuntimeError(f"{tree} has no vmcp_actors package")
    pythonpath = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    return Invocation([sys.executable, "-c", _TREE_LAUNCHER], tree, {**os.environ, "PYTHONPATH": pythonpath})


def validate_config(config: Mapping[str, Any], tree: str | Path | None = None) -> tuple[bool, str]:
    """``vmcp-actors validate`` on ``config`` (with the gateway code of ``tree``): (ok, its output)."""
    run = vmcp_actors_invocation(tree)
    with tempfile.TemporaryDirectory(prefix="vmcp-bench-") as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        done = subprocess.run([*run.argv, "validate", "--config", str(path)], cwd=run.cwd, env=run.env,
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if not line.startswith(_SOURCE_MARK)]
    return done.returncode == 0, "\n".join(lines)


def _tree_source(log_path: Path, tree: str | Path) -> str:
    """The vmcp_actors the gateway served from ``tree`` imported (from its log); fails unless it is the tree's."""
    marks = [line.split(_SOURCE_MARK, 1)[1].strip() for line in log_path.read_text(errors="replace").splitlines()
             if _SOURCE_MARK in line]
    expected = Path(tree).resolve() / "vmcp_actors" / "__init__.py"
    if not marks or Path(marks[-1]).resolve() != expected:
        imported = marks[-1] if marks else "nothing logged"
        raise RuntimeError(f"the gateway did not run {expected}: it imported {imported}")
    return marks[-1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


try:
    _LIBC: Any = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not Linux
    _LIBC = None


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the benchmark dies (Linux), so no gateway is left behind."""
    if _LIBC is not None:
        with contextlib.suppress(Exception):
            _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def _gunicorn(config_path: Path, log_path: Path, tree: str | Path | None = None) -> Iterator[tuple[str, int | None]]:
    run = vmcp_actors_invocation(tree)
    with serve_subprocess(lambda port: [*run.argv, "serve", "--config", str(config_path),
                                        "--host", "127.0.0.1", "--port", str(port)], log_path,
                          cwd=run.cwd, env=run.env) as served:
        yield served


@contextlib.contextmanager
def serve_subprocess(command: Callable[[int], list[str]], log_path: Path,
                     ready_timeout: float = 30.0, *, cwd: Path = ROOT,
                     env: Mapping[str, str] | None = None,
                     worker: Callable[[int], int | None] | None = None) -> Iterator[tuple[str, int | None]]:
    """Run ``command(port)`` (a gunicorn server, in ``cwd`` with ``env``) until its /readyz
    answers 200; yields (base URL, worker pid); SIGTERM on exit. ``worker`` finds the
    process that serves from the started one's pid (default: gunicorn's one worker)."""
    last_error = "not started"
    for _attempt in range(3):  # the free port may be taken between probing and binding
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(command(port), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=cwd, env=env, preexec_fn=_die_with_parent)
        try:
            if _wait_ready(proc, base, ready_timeout):
                yield base, (worker or _only_child)(proc.pid)
                return
            last_error = _tail(log_path)
        finally:
            _stop_process(proc)
    raise RuntimeError(f"the server did not become ready; log tail:\n{last_error}")


def _wait_ready(proc: subprocess.Popen, base: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            if requests.get(base + "/readyz", timeout=1).status_code == 200:
                return True
        except requests.RequestException:
            pass
        time.sleep(0.05)
    return False


def _only_child(pid: int) -> int | None:
    """The gunicorn master's one worker."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if len(children) == 1 else None


def _stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def interleaved_calls(clients: dict[Any, McpClient], tool: dict[Any, str], calls: int, answer: Callable[[int], str],
                      warmup: int = 20) -> dict[Any, list[float]]:
    """One thread: each client initialized and warmed up, then ``calls`` rounds of one call
    of ``tool[key]`` per client, the order reversed every other round; each call's seconds by
    key. Every answer's text must be ``answer(n)``. The clients are closed afterwards."""
    samples: dict[Any, list[float]] = {key: [] for key in clients}
    try:
        for key, client in clients.items():
            client.initialize()
            for n in range(warmup):
                client.call_tool(tool[key], {"text": f"w{n}"})
        order = list(clients.items())
        for n in range(calls):
            for key, client in (order if n % 2 == 0 else order[::-1]):
                started = time.perf_counter()
                got = client.call_tool(tool[key], {"text": str(n)})
                samples[key].append(time.perf_counter() - started)
                assert got["content"][0]["text"] == answer(n), got
    finally:
        for client in clients.values():
            client.close()
    return samples
