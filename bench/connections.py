"""Issue 37: people's own connections to backends (``outgoingAuth`` type ``oauth``): what a
call costs with the person's token against a static header, and what a refresh costs.

The gateways are ``vmcp-actors serve`` (gunicorn, 1 worker) subprocesses with ``type: oidc``
callers (tests/idp.py ``LocalIdP`` tokens). The echo backend is the official SDK's
(tests/backends.py ``build_sdk_server``) on uvicorn in its own process, behind a small ASGI
layer that logs the ``Authorization`` value of every POST (the backend itself ignores it),
so the bench checks what each gateway sent. The backend's authorization server is
:class:`TokenEndpoint` (werkzeug, in this process): RFC 8414 metadata, and refresh_token
grants answered after ``--as-delay`` seconds with a rotated refresh token and an access
token of ``--lifetime`` seconds; a refresh token used twice is refused and counted.

The connect itself is a browser flow (tested elsewhere): the bench writes the person's
connection record directly, as ``Connections.finish`` stores it. In Redis
(``sessionStorage.provider: redis``) it writes it from here with ``RedisOAuthRecords`` and
the gateways' key; records in memory live in the served process, so every gateway is
started through :data:`LAUNCHER`, which seeds them there before gunicorn forks. The
launcher also sets ``LOCAL_TOKEN_FOR`` (the in-process token cache) and, for part 2, times
``Connections.token`` and ``Connections._refresh`` in the worker.

1. **echo**: one thread, calls rotating over direct, a static ``Authorization: Bearer``
   (``header_injection``) and ``type: oauth`` gateways (the person's connection present,
   far from expiry), with records in memory and in Redis, and with the in-process token
   cache on (as in production) and defeated (``LOCAL_TOKEN_FOR = 0``: every call reads the
   records); p50 of each, oauth / static and (oauth - direct) / (static - direct). Then
   ``Connections.token`` alone in this process, us per call: cached, memory read, Redis read.
2. **refresh**: two gateways (one worker each) sharing Redis; ``--people`` people, each
   calling from threads on both gateways (``--threads`` in all, each a call every
   ``--interval`` s, or flat out) for ``--duration`` s while their tokens expire (the
   gateway refreshes at half their life). Counts the refreshes the token endpoint received
   (one per expiry per person, none early, no refresh token used twice), what a refresh
   costs (at the token endpoint, in the gateway, for the calls that waited) and how many
   calls it held up.

    .venv/bin/python -m bench.connections [--part echo,refresh] [--calls 400] [--lookups 2000]
                                          [--duration 20] [--people 2] [--threads 8] [--interval 0.1]
                                          [--lifetime 4] [--as-delay 0.02]
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench._common import (
    ROOT,
    Check,
    McpClient,
    interleaved_calls,
    median,
    parse_args,
    percentile,
    print_header,
    record,
    run_benchmark,
    run_threads,
    table,
)
from bench._common import _die_with_parent, _only_child, _stop_process, _tail, _wait_ready

WARMUP = 20
AUDIENCE = "https://bench-connections.example/mcp"
PUBLIC_URL = "https://gw.bench.example"  # only connect links use it: none is made here
BACKEND = "echo"
TOOL = "echo_echo"
CLIENT_ID = "bench-client"
LOGIN_SECRET_ENV = "BENCH37_LOGIN_SECRET"
RECORDS_KEY_ENV = "BENCH37_RECORDS_KEY"
RECORDS_KEY = "bench37-records-key-0123456789abcdef"
FAR = 86400.0  # part 1's tokens expire this far away

# Runs `vmcp-actors` with, from the environment: BENCH37_LOCAL_TOKEN_FOR (the in-process
# token cache's seconds), BENCH37_SEED ({record key: connection} put into the connection
# records when they are in memory) and BENCH37_TOKEN_LOG (a path: each worker appends a
# line per Connections.token call and per refresh to PATH.<pid>). Patched before gunicorn
# forks, so the worker has them.
LAUNCHER = r'''
import json, os, sys, threading, time
import vmcp_actors.oauth
import vmcp_actors.oauth._connections as connections
from vmcp_actors.oauth._records import MemoryOAuthRecords

if os.environ.get("BENCH37_LOCAL_TOKEN_FOR"):
    connections.LOCAL_TOKEN_FOR = float(os.environ["BENCH37_LOCAL_TOKEN_FOR"])

SEED = json.loads(os.environ.get("BENCH37_SEED") or "{}")
if SEED:
    class SeededRecords(MemoryOAuthRecords):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for key, value in SEED.items():
                self.put("connection", key, value, 86400.0)

    vmcp_actors.oauth.MemoryOAuthRecords = SeededRecords

LOG = os.environ.get("BENCH37_TOKEN_LOG")
if LOG:
    Connections = connections.Connections
    files, lock, steps = {}, threading.Lock(), threading.local()

    def write(line):
        with lock:
            out = files.get(os.getpid())
            if out is None:
                out = files[os.getpid()] = open(f"{LOG}.{os.getpid()}", "a", buffering=1)
            out.write(line)

    def timed(kind, original):
        def wrapper(self, identity, backend, *args):
            if kind == "token":
                steps.seen = set()
            started, clock = time.time(), time.perf_counter()
            try:
                return original(self, identity, backend, *args)
            finally:
                ms = (time.perf_counter() - clock) * 1000
                seen = getattr(steps, "seen", set())
                if kind == "token":
                    what = ("refreshed" if "refresh" in seen else "waited" if "wait" in seen
                            else "read" if "read" in seen else "cached")
                else:
                    seen.add(kind)
                    what = "-"
                if kind in ("token", "refresh"):
                    write(f"{kind} {os.getpid()} {getattr(identity, 'subject', '-')} {started:.6f} {ms:.3f} {what}\n")
        return wrapper

    for name, kind in (("token", "token"), ("_fresh", "read"), ("_refresh", "refresh"),
                       ("_refreshed_by_another", "wait")):
        setattr(Connections, name, timed(kind, getattr(Connections, name)))

from vmcp_actors.cli import main
sys.argv[0] = "vmcp-actors"
sys.exit(main())
'''


# --- the backend, its authorization server ---------------------------------------------------


class SeenAuthorization:
    """ASGI layer before the echo backend: each POST's time and Authorization value, one
    line each in ``log`` (the backend itself ignores them)."""

    def __init__(self, app: Any, log: Any) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            value = dict(scope["headers"]).get(b"authorization", b"").decode()
            self.log.write(f"{time.time():.6f} {value}\n")
        await self.app(scope, receive, send)


# The echo backend in its own process (off this process's GIL, which the calling threads
# and the token endpoint use): prints its MCP URL, serves until its stdin closes.
BACKEND_LAUNCHER = """
import sys
from bench.connections import SeenAuthorization
from tests.backends import build_sdk_server
from vmcp_actors.demo._serve import serve_asgi_in_thread

with open(sys.argv[1], "a", buffering=1) as log:
    served = serve_asgi_in_thread(SeenAuthorization(build_sdk_server("echo", ["echo"]).streamable_http_app(), log))
    print(served.url + "/mcp", flush=True)
    sys.stdin.read()
    served.stop()
"""


@dataclass(frozen=True)
class EchoBackend:
    url: str
    log: Path

    def seen(self) -> list[tuple[float, str]]:
        """(time, Authorization value) of every POST so far."""
        found = []
        for line in self.log.read_text().splitlines():
            at, value = line.split(" ", 1)
            found.append((float(at), value))
        return found

    def counts(self) -> Counter[str]:
        return Counter(value for _, value in self.seen())


@contextlib.contextmanager
def echo_backend(directory: Path, name: str) -> Iterator[EchoBackend]:
    log = directory / f"{name}-authorization.log"
    proc = subprocess.Popen([sys.executable, "-c", BACKEND_LAUNCHER, str(log)], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
    try:
        url = proc.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError("the echo backend did not start")
        yield EchoBackend(url, log)
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        _stop_process(proc)


@dataclass
class Generation:
    """One access token of a person: when it was answered and when the gateway refreshes it."""

    access_token: str
    refresh_token: str
    answered: float
    refresh_at: float
    expires_at: float
    received: float | None = None  # the refresh request that ended it (None: the seeded one)


@dataclass
class Refresh:
    person: str
    received: float
    seconds: float  # at the token endpoint, the delay included


@dataclass
class TokenEndpoint:
    """The backend's authorization server, as much of it as a refresh needs."""

    lifetime: float
    delay: float
    base: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)  # guards what follows
    _current: dict[str, str] = field(default_factory=dict)  # live refresh token -> person
    generations: dict[str, list[Generation]] = field(default_factory=lambda: defaultdict(list))
    refreshes: list[Refresh] = field(default_factory=list)
    reused: int = 0  # refresh tokens presented after they were rotated (a second refresh of one expiry)
    other: int = 0  # anything else refused

    def refresh_at(self, answered: float) -> float:
        """When the gateway refreshes a token answered at ``answered`` (its EXPIRY_MARGIN rule)."""
        from vmcp_actors.oauth._records import EXPIRY_MARGIN

        return answered + self.lifetime - min(EXPIRY_MARGIN, self.lifetime / 2)

    def issue(self, person: str, now: float, refresh_at: float | None = None, lifetime: float | None = None,
              received: float | None = None) -> Generation:
        lifetime = self.lifetime if lifetime is None else lifetime
        generation = Generation(f"at-{person}-{secrets.token_hex(6)}", f"rt-{person}-{secrets.token_hex(6)}", now,
                                self.refresh_at(now) if refresh_at is None else refresh_at, now + lifetime, received)
        with self._lock:
            self._current[generation.refresh_token] = person
            self.generations[person].append(generation)
        return generation

    def reset_counts(self) -> None:
        with self._lock:
            self.refreshes.clear()
            self.reused = self.other = 0

    def app(self, environ: dict[str, Any], start_response: Any) -> Any:
        from werkzeug.wrappers import Request, Response

        request = Request(environ)
        if request.path == "/.well-known/oauth-authorization-server":
            response = Response(json.dumps({
                "issuer": self.base, "authorization_endpoint": f"{self.base}/authorize",
                "token_endpoint": f"{self.base}/token", "response_types_supported": ["code"],
                "grant_types_supported": ["authorization_code", "refresh_token"],
                "token_endpoint_auth_methods_supported": ["none"], "code_challenge_methods_supported": ["S256"]}),
                content_type="application/json")
        elif request.path == "/token" and request.method == "POST":
            response = self._token(request, time.time(), time.perf_counter())
        else:
            response = Response("not found", status=404)
        return response(environ, start_response)

    def _token(self, request: Any, received: float, clock: float) -> Any:
        from werkzeug.wrappers import Response

        form = request.form
        with self._lock:
            person = self._current.pop(form.get("refresh_token", ""), None) \
                if form.get("grant_type") == "refresh_token" and form.get("client_id") == CLIENT_ID else None
            if person is None:
                if form.get("refresh_token", "").startswith("rt-"):
                    self.reused += 1
                else:
                    self.other += 1
        if person is None:
            return Response(json.dumps({"error": "invalid_grant"}), status=400, content_type="application/json")
        time.sleep(self.delay)  # models a real authorization server's work
        generation = self.issue(person, time.time(), received=received)
        with self._lock:
            self.refreshes.append(Refresh(person, received, time.perf_counter() - clock))
        return Response(json.dumps({"access_token": generation.access_token, "token_type": "Bearer",
                                    "expires_in": self.lifetime, "refresh_token": generation.refresh_token}),
                        content_type="application/json", headers={"Cache-Control": "no-store"})


@contextlib.contextmanager
def token_endpoint(lifetime: float, delay: float) -> Iterator[TokenEndpoint]:
    import logging

    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    endpoint = TokenEndpoint(lifetime, delay)
    server = make_server("127.0.0.1", 0, endpoint.app, threaded=True)
    endpoint.base = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, name="token-endpoint", daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# --- the gateways -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    url: str
    worker: int | None


def connection(issuer: str, subject: str, generation: Generation) -> dict[str, Any]:
    """A connection record as a connect stores it (``Connections.finish``)."""
    return {"access_token": generation.access_token, "refresh_token": generation.refresh_token,
            "expires_at": generation.expires_at, "refresh_at": generation.refresh_at, "backend": BACKEND,
            "person": [issuer, subject], "client": {"client_id": CLIENT_ID, "client_secret": None, "method": "none"},
            "scopes": [], "since": time.time()}


def record_key(issuer: str, subject: str) -> str:
    from vmcp_actors.oauth._connections import connection_key

    return connection_key((issuer, subject), BACKEND)


def gateway_config(idp: Any, backend_url: str, outgoing: dict[str, Any], redis_address: str | None = None,
                   prefix: str = "") -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": "bench37", "backends": [{"name": BACKEND, "url": backend_url}],
        "incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUDIENCE,
                                                  "clientId": "bench-gateway", "clientSecretEnv": LOGIN_SECRET_ENV}},
        "outgoingAuth": {"backends": {BACKEND: outgoing}},
        "operational": {"publicUrl": PUBLIC_URL}}
    if redis_address is not None:
        config["sessionStorage"] = {"provider": "redis", "address": redis_address, "keyPrefix": prefix}
        config["operational"]["signingKeyEnv"] = RECORDS_KEY_ENV
    return config


def oauth_outgoing(endpoint: TokenEndpoint) -> dict[str, Any]:
    return {"type": "oauth", "oauth": {"issuer": endpoint.base, "clientId": CLIENT_ID}}


@dataclass(frozen=True)
class GatewaySpec:
    name: str
    config: dict[str, Any]
    launch: dict[str, str] = field(default_factory=dict)  # LAUNCHER's BENCH37_* settings, lower case


@contextlib.contextmanager
def gateways(specs: list[GatewaySpec], directory: Path) -> Iterator[list[Served]]:
    """``vmcp-actors serve`` through LAUNCHER for each spec, all started before any is
    waited for (a start is mostly imports), all stopped on exit."""
    from tests.ports import free_port  # below the ephemeral range: chosen now, bound a moment later

    started: list[tuple[GatewaySpec, subprocess.Popen, str]] = []
    try:
        for spec in specs:
            path = directory / f"{spec.name}.yaml"
            path.write_text(yaml.safe_dump(spec.config, sort_keys=False))
            env = {**os.environ, LOGIN_SECRET_ENV: "not-used-here", RECORDS_KEY_ENV: RECORDS_KEY,
                   **{f"BENCH37_{key.upper()}": value for key, value in spec.launch.items()}}
            port = free_port()
            with open(directory / f"{spec.name}.log", "ab") as log:
                proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, "serve", "--config", str(path), "--host",
                                         "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, cwd=ROOT, env=env, preexec_fn=_die_with_parent)
            started.append((spec, proc, f"http://127.0.0.1:{port}"))
        ready = []
        for spec, proc, base in started:
            if not _wait_ready(proc, base, 60.0):
                tail = _tail(directory / f"{spec.name}.log")
                raise RuntimeError(f"gateway {spec.name} did not become ready:\n{tail}")
            ready.append(Served(f"{base}/mcp", _only_child(proc.pid)))
        yield ready
    finally:
        for _, proc, _ in started:  # all told first: each takes a moment to finish
            if proc.poll() is None:
                proc.terminate()
        for _, proc, _ in started:
            _stop_process(proc)


def redis_records(server: Any, prefix: str) -> Any:
    import redis

    from vmcp_actors.oauth._records import RedisOAuthRecords
    from vmcp_actors.signing import Signer

    return RedisOAuthRecords(redis.Redis(port=server.port), Signer(RECORDS_KEY.encode()), prefix)


# --- 1. echo -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    name: str
    records: str  # "memory", "Redis" or "" (direct)
    authorization: str  # what the backend must receive


def echo_overhead(calls: int, idp: Any, endpoint: TokenEndpoint, redis_server: Any, directory: Path) -> list[Check]:
    issuer = idp.issuer
    key = record_key(issuer, "alice")
    far = time.time() + FAR

    def generation(label: str) -> Generation:
        return Generation(f"at-alice-{label}-{secrets.token_hex(4)}", f"rt-alice-{label}", time.time(), far - 60, far)

    with contextlib.ExitStack() as stack:
        backend = stack.enter_context(echo_backend(directory, "echo-1"))
        backend_url = backend.url
        clients: dict[Mode, McpClient] = {}

        def add(mode: Mode, url: str) -> None:
            headers = {} if url == backend_url else {
                "Authorization": f"Bearer {idp.issue_token('alice', AUDIENCE, expires_in=3600)}"}
            clients[mode] = McpClient(url, headers=headers)

        modes: list[tuple[Mode, GatewaySpec]] = []
        for records in ("memory", "Redis"):
            address = redis_server.address if records == "Redis" else None
            static = f"Bearer static-{records.lower()}-{secrets.token_hex(4)}"
            modes.append((Mode(f"static header, {records}", records, static), GatewaySpec(
                f"static-{records.lower()}", gateway_config(idp, backend_url, {
                    "type": "header_injection", "headerInjection": {"headerName": "Authorization",
                                                                    "headerValue": static}},
                    address, f"b37-static-{records.lower()}:"))))
            for cache in (True, False):
                label = f"{records.lower()}{'' if cache else '-nocache'}"
                token = generation(label)
                prefix = f"b37-{label}:"
                launch = {} if cache else {"local_token_for": "0"}
                if records == "Redis":
                    redis_records(redis_server, prefix).put("connection", key, connection(issuer, "alice", token), FAR)
                else:
                    launch["seed"] = json.dumps({key: connection(issuer, "alice", token)})
                name = f"oauth, {records}" + ("" if cache else ", records read every call")
                modes.append((Mode(name, records, f"Bearer {token.access_token}"), GatewaySpec(
                    f"oauth-{label}", gateway_config(idp, backend_url, oauth_outgoing(endpoint), address, prefix),
                    launch)))
        add(Mode("direct", "", ""), backend_url)
        for (mode, _), gateway in zip(modes, stack.enter_context(gateways([spec for _, spec in modes], directory))):
            add(mode, gateway.url)
        tool = {mode: "echo" if not mode.records else TOOL for mode in clients}
        samples = interleaved_calls(clients, tool, calls, lambda n: f"{BACKEND}:{n}", WARMUP)
        received = backend.counts()
    p50 = {mode.name: median(values) * 1000 for mode, values in samples.items()}
    p99 = {mode.name: percentile(values, 99) * 1000 for mode, values in samples.items()}
    direct = p50["direct"]
    print(f"### 1. echo, one thread ({calls} calls per mode, rotating; the person's token far from expiry)\n")
    rows = []
    for mode in samples:
        static = p50.get(f"static header, {mode.records}")
        ratio = "" if not mode.records or mode.name.startswith("static") else \
            f"{p50[mode.name] / static:.3f} / {(p50[mode.name] - direct) / (static - direct):.2f}"
        rows.append((mode.name, f"{p50[mode.name]:.2f} ms", f"{p99[mode.name]:.2f} ms",
                     "" if mode.name == "direct" else f"+{p50[mode.name] - direct:.2f} ms", ratio))
    print(table(["mode", "p50", "p99", "p50 overhead over direct",
                 "p50 / static, overhead / static's (same records)"], rows))
    for records in ("memory", "Redis"):
        cached, every = p50[f"oauth, {records}"], p50[f"oauth, {records}, records read every call"]
        print(f"\nrecords in {records}: reading the connection on every call adds {every - cached:+.3f} ms to the "
              f"p50 ({every / cached:.3f} x)")
    for name, value in p50.items():
        record(f"echo p50: {name}: ms", round(value, 3))
    wrong = [mode.name for mode in samples if received[mode.authorization] < calls + WARMUP]
    unknown = set(received) - {mode.authorization for mode in samples}
    return [Check("echo: each mode's Authorization reached the backend",
                  f"{len(samples) - len(wrong)} of {len(samples)} modes; {len(unknown)} other values",
                  "all, no other value", not wrong and not unknown)]


def token_lookups(calls: int, redis_server: Any) -> dict[str, float]:
    """``Connections.token`` in this process, us per call: from the in-process cache, and
    with the cache defeated (``LOCAL_TOKEN_FOR = 0``) reading the records in memory or in
    Redis. Modes interleaved in rounds."""
    from vmcp_actors.config import config_from_mapping
    from vmcp_actors.identity import Identity
    from vmcp_actors.oauth import _connections
    from vmcp_actors.oauth._connections import Connections
    from vmcp_actors.oauth._records import MemoryOAuthRecords

    issuer = "https://idp.bench.example"
    config = config_from_mapping({
        "name": "bench37", "backends": [{"name": BACKEND, "url": "http://127.0.0.1:9/mcp"}],
        "incomingAuth": {"type": "oidc", "oidc": {"issuer": issuer, "audience": AUDIENCE, "clientId": "gw",
                                                  "clientSecretEnv": LOGIN_SECRET_ENV}},
        "outgoingAuth": {"backends": {BACKEND: {"type": "oauth", "oauth": {"issuer": "http://127.0.0.1:9",
                                                                           "clientId": CLIENT_ID}}}},
        "operational": {"publicUrl": PUBLIC_URL}})
    alice = Identity(issuer, "alice")
    far = time.time() + FAR
    token = Generation("at-alice-lookup", "rt-alice-lookup", time.time(), far - 60, far)
    stores = {"memory": MemoryOAuthRecords(), "Redis": redis_records(redis_server, "b37-lookup:")}
    for records in stores.values():
        records.put("connection", record_key(issuer, "alice"), connection(issuer, "alice", token), FAR)
    # One service per mode: each has its own in-process cache.
    modes = {"from the in-process cache (records in memory)":
             (Connections(config, stores["memory"], {}), _connections.LOCAL_TOKEN_FOR),
             "records in memory read every call": (Connections(config, stores["memory"], {}), 0.0),
             "records in Redis read every call": (Connections(config, stores["Redis"], {}), 0.0)}
    wall = dict.fromkeys(modes, 0.0)
    kept = _connections.LOCAL_TOKEN_FOR
    try:
        for round_no in range(4):
            for name in (list(modes) if round_no % 2 == 0 else list(modes)[::-1]):
                service, cache = modes[name]
                _connections.LOCAL_TOKEN_FOR = cache
                assert service.token(alice, BACKEND) == token.access_token
                started = time.perf_counter()
                for _ in range(calls):
                    service.token(alice, BACKEND)
                wall[name] += time.perf_counter() - started
    finally:
        _connections.LOCAL_TOKEN_FOR = kept
    per = {name: wall[name] / (calls * 4) * 1e6 for name in modes}
    print(f"\nConnections.token() in this process ({calls} calls x 4 rounds per mode, interleaved):\n")
    print(table(["mode", "us per call"], [(name, f"{value:.1f}") for name, value in per.items()]))
    for name, value in per.items():
        record(f"token(): {name}: us", round(value, 2))
    return per


# --- 2. refresh ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    person: str
    gateway: int
    started: float  # wall clock
    seconds: float
    ok: bool


@dataclass(frozen=True)
class TokenCall:
    kind: str  # "token" or "refresh"
    gateway: int
    person: str
    started: float
    ms: float
    what: str  # for "token": cached, read, refreshed, waited


def token_log(path: Path, workers: list[int | None]) -> list[TokenCall]:
    found = []
    for part in path.parent.glob(path.name + ".*"):
        for line in part.read_text().splitlines():
            kind, pid, person, started, ms, what = line.split()
            gateway = workers.index(int(pid)) if int(pid) in workers else -1
            found.append(TokenCall(kind, gateway, person, float(started), float(ms), what))
    return found


def refresh_load(idp: Any, endpoint: TokenEndpoint, redis_server: Any, directory: Path, people: int, threads: int,
                 duration: float, interval: float) -> list[Check]:
    issuer = idp.issuer
    prefix = "b37-refresh:"
    records = redis_records(redis_server, prefix)
    persons = [f"person-{n}" for n in range(people)]
    log = directory / "token-calls"
    half = endpoint.refresh_at(0.0)
    with contextlib.ExitStack() as stack:
        backend = stack.enter_context(echo_backend(directory, "echo-2"))
        config = gateway_config(idp, backend.url, oauth_outgoing(endpoint), redis_server.address, prefix)
        served = stack.enter_context(gateways([GatewaySpec(f"refresh-{n}", config, {"token_log": str(log)})
                                               for n in range(2)], directory))
        workers = [gateway.worker for gateway in served]
        # Warm each worker: its first refresh reads the server's metadata (once an hour).
        for n, gateway in enumerate(served):
            warm = endpoint.issue(f"warm-{n}", time.time(), refresh_at=time.time() - 1, lifetime=60)
            records.put("connection", record_key(issuer, f"warm-{n}"), connection(issuer, f"warm-{n}", warm), 3600)
            with McpClient(gateway.url, headers={
                    "Authorization": f"Bearer {idp.issue_token(f'warm-{n}', AUDIENCE, expires_in=3600)}"}) as client:
                client.initialize()
                client.call_tool(TOOL, {"text": "warm"})
        endpoint.reset_counts()
        # The people's first tokens: due after the sessions open, the people's expiries spread.
        now = time.time()
        for index, person in enumerate(persons):
            first = endpoint.issue(person, now, refresh_at=now + 2.0 + index * half / people)
            first.expires_at = first.refresh_at + (endpoint.lifetime - half)
            records.put("connection", record_key(issuer, person), connection(issuer, person, first), 3600)
        slots = [(persons[n % people], (n // people) % 2) for n in range(threads)]
        clients = [McpClient(served[gateway].url, headers={
            "Authorization": f"Bearer {idp.issue_token(person, AUDIENCE, expires_in=3600)}"})
            for person, gateway in slots]
        for client in clients:
            client.initialize()
            for n in range(5):
                client.call_tool(TOOL, {"text": f"w{n}"})
        warm_refreshes = sum(1 for line in token_log(log, workers)
                             if line.kind == "refresh" and line.person.startswith("warm-"))
        start = time.time() + 0.2
        end = start + duration

        def work(index: int) -> list[Call]:
            person, gateway = slots[index]
            client, done, n = clients[index], [], 0
            pause = threading.Event()
            at = start + index / threads * interval  # the threads' calls spread over an interval
            while True:
                pause.wait(max(0.0, at - time.time()))  # the schedule, not a stand-in for an event
                if (started := time.time()) >= end:
                    break
                at = max(at, started) + interval  # a late call is not made up for
                clock = time.perf_counter()
                try:
                    ok = client.call_tool(TOOL, {"text": str(n)})["content"][0]["text"] == f"{BACKEND}:{n}"
                except Exception:  # noqa: BLE001 - counted as a failed call
                    ok = False
                done.append(Call(person, gateway, started, time.perf_counter() - clock, ok))
                n += 1
            return done

        results = run_threads(threads, work, timeout=duration + 60)
        for client in clients:
            client.close()
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:
            raise RuntimeError(f"{len(failures)} load threads failed") from failures[0]
        calls = [call for done in results for call in done]
        logged = token_log(log, workers)
        received = backend.seen()
    return refresh_report(endpoint, persons, calls, logged, received, start, end, threads, duration, interval,
                          warm_refreshes)


def expiries(endpoint: TokenEndpoint, person: str, calls: list[Call]) -> tuple[int, int, int]:
    """(refreshes due: tokens whose refresh time passed well before the person's last call,
    those it passed just before, refreshes received early: before their token's refresh time)."""
    mine = [call for call in calls if call.person == person]
    last = max(call.started for call in mine)
    generations = endpoint.generations[person]
    due = sum(1 for g in generations if g.refresh_at < last - 0.1)
    borderline = sum(1 for g in generations if last - 0.1 <= g.refresh_at <= last)
    early = sum(1 for previous, g in zip(generations, generations[1:])
                if g.received is not None and g.received < previous.refresh_at - 0.001)
    return due, borderline, early


def match_calls(blocked: list[TokenCall], calls: list[Call]) -> dict[TokenCall, Call]:
    """Each blocked Connections.token call with the client call it was part of (same person
    and gateway, the call's span holding it)."""
    by_slot: dict[tuple[str, int], list[Call]] = defaultdict(list)
    for call in calls:
        by_slot[(call.person, call.gateway)].append(call)
    taken: set[int] = set()
    matched = {}
    for line in sorted(blocked, key=lambda line: line.started):
        for call in by_slot[(line.person, line.gateway)]:
            if id(call) not in taken and call.started - 0.002 <= line.started \
                    and line.started + line.ms / 1000 <= call.started + call.seconds + 0.002:
                matched[line] = call
                taken.add(id(call))
                break
    return matched


def spread(values: list[float], digits: int = 2) -> tuple[int, str, str]:
    """n, p50 and max of milliseconds, for a table row."""
    if not values:
        return 0, "-", "-"
    return len(values), f"{median(values):.{digits}f} ms", f"{max(values):.{digits}f} ms"


def describe(values: list[float]) -> str:
    n, p50, top = spread(values)
    return f"p50 {p50}, max {top} (n {n})" if n else "none"


def by_kind(lines: list[TokenCall], what: str) -> list[TokenCall]:
    return [line for line in lines if line.what == what]


def waiting_lag(waiters: list[TokenCall], refreshes: list[TokenCall]) -> tuple[list[float], list[float]]:
    """How long after the refresh it waited for ended each waiting token() call returned, in
    ms: waiters in the refreshing worker, waiters in the other one."""
    same: list[float] = []
    other: list[float] = []
    for waiter in waiters:
        ends = waiter.started + waiter.ms / 1000
        held = [r for r in refreshes if r.person == waiter.person and r.started <= ends
                and r.started + r.ms / 1000 >= waiter.started]
        if held:
            refresh = max(held, key=lambda r: r.started)
            (same if refresh.gateway == waiter.gateway else other).append(
                (ends - (refresh.started + refresh.ms / 1000)) * 1000)
    return same, other


def refresh_report(endpoint: TokenEndpoint, persons: list[str], calls: list[Call], logged: list[TokenCall],
                   received: list[tuple[float, str]], start: float, end: float, threads: int, duration: float,
                   interval: float, warm_refreshes: int) -> list[Check]:
    ours = set(persons)
    tokens = [line for line in logged if line.kind == "token" and line.person in ours and start <= line.started < end]
    refreshes_logged = [line for line in logged if line.kind == "refresh" and line.person in ours]
    by_what = defaultdict(list)
    for line in tokens:
        by_what[line.what].append(line.ms)
    blocked = [line for line in tokens if line.what in ("refreshed", "waited")]
    matched = match_calls(blocked, calls)
    refreshers = [call.seconds * 1000 for line, call in matched.items() if line.what == "refreshed"]
    waiters = [call.seconds * 1000 for line, call in matched.items() if line.what == "waited"]
    matched_ids = {id(call) for call in matched.values()}
    ok = [call for call in calls if call.ok]
    plain = [call.seconds * 1000 for call in ok if id(call) not in matched_ids]
    plain_p99 = percentile(plain, 99)
    refreshes = [r for r in endpoint.refreshes if r.person in ours]
    per_person = Counter(r.person for r in refreshes)
    per_worker = Counter(line.gateway for line in refreshes_logged)
    accounting = {person: expiries(endpoint, person, calls) for person in persons}
    due = sum(a[0] for a in accounting.values())
    borderline = sum(a[1] for a in accounting.values())
    early = sum(a[2] for a in accounting.values())
    exact = all(accounting[p][0] <= per_person[p] <= accounting[p][0] + accounting[p][1] for p in persons)
    # Every token the backend received was one the token endpoint gave, and still alive then.
    life = {g.access_token: g for person in persons for g in endpoint.generations[person]}
    sent = [(at, value.removeprefix("Bearer ")) for at, value in received if start <= at < end]
    expired = sum(1 for at, token in sent if token in life and at >= life[token].expires_at)
    foreign = sum(1 for _, token in sent if token not in life)
    failed = len(calls) - len(ok)
    pace = f"a call every {interval * 1000:g} ms each" if interval else "flat out"
    print(f"\n### 2. refreshes: {len(persons)} people x 2 gateways (1 worker each, Redis), {threads} threads "
          f"({pace}), {duration:g} s; tokens live {endpoint.lifetime:g} s (refreshed after "
          f"{endpoint.refresh_at(0):g} s), the token endpoint answers after {endpoint.delay * 1000:g} ms\n")
    rate = len(calls) / duration
    print(table(["measure", "value"], [
        ("calls (all threads)", f"{len(calls)} ({rate:.0f}/s), failed: {failed}"),
        ("call latency p50 / p99, calls no refresh held up", f"{median(plain):.2f} / {plain_p99:.2f} ms"),
        ("refresh requests at the token endpoint (per person)",
         f"{len(refreshes)} ({', '.join(f'{p}: {per_person[p]}' for p in persons)})"),
        ("expiries passed during the calls (due; just before the last call)", f"{due}; {borderline}"),
        ("refreshes per gateway (worker's _refresh)", " + ".join(str(per_worker[n]) for n in range(2))),
        ("refresh tokens presented twice / early refreshes / other refusals", f"{endpoint.reused} / {early} / "
                                                                                f"{endpoint.other}"),
        ("tokens reaching the backend: expired / not issued", f"{expired} / {foreign} of {len(sent)}"),
    ]))
    endpoint_ms = [r.seconds * 1000 for r in refreshes]
    refresh_ms = [line.ms for line in refreshes_logged]
    print("\nwhat a refresh costs:\n")
    print(table(["step", "n", "p50", "max"], [
        ("token endpoint, request to answer (its delay included)", *spread(endpoint_ms)),
        ("gateway: Connections._refresh (lock held: HTTP, records write)", *spread(refresh_ms)),
        *[(f"gateway: Connections.token, {what}", *spread(values, 3))
          for what, values in sorted(by_what.items(), key=lambda item: -len(item[1]))],
        ("client: the call that refreshed", *spread(refreshers)),
        ("client: a call that waited for another's refresh", *spread(waiters)),
    ]))
    fraction = len(blocked) / len(tokens)
    print(f"\ncalls blocked by a refresh: {len(blocked)} of {len(tokens)} token() calls in the load = {fraction:.2%} "
          f"({len(blocked) / max(1, len(refreshes)):.1f} per refresh: {len(by_what['refreshed'])} refreshing, "
          f"{len(by_what['waited'])} waiting); matched to client calls: {len(matched)}")
    held = [call.seconds * 1000 for call in matched.values()]
    if held:
        print(f"client view: a call held up by a refresh took {median(held):.1f} ms at p50, the others "
              f"{median(plain):.1f} ms: {median(held) - median(plain):+.1f} ms")
    same, other = waiting_lag(by_kind(tokens, "waited"), refreshes_logged)
    print(f"a waiter's lag after the refresh was stored (it polls the records every 20 ms): same worker "
          f"{describe(same)}, the other worker {describe(other)}")
    print(f"(warm-up: {warm_refreshes} refreshes before the load, one per gateway, not counted)")
    record("refresh: calls", len(calls))
    record("refresh: blocked fraction", round(fraction, 5))
    record("refresh: token endpoint p50 ms", round(median(endpoint_ms), 2))
    record("refresh: waiter p50 ms", round(median(waiters), 2) if waiters else float("nan"))
    return [
        Check("refresh: no call failed", f"{failed} of {len(calls)}", "0", failed == 0),
        Check("refresh: one refresh per expiry per person", f"{len(refreshes)} for {due} (+{borderline} borderline); "
              f"{endpoint.reused} reused, {early} early", "== expiries, 0 reused, 0 early",
              exact and endpoint.reused == 0 and early == 0 and endpoint.other == 0 and due > 0),
        Check("refresh: no expired token sent", f"{expired} expired, {foreign} not issued", "0 and 0",
              expired == 0 and foreign == 0 and len(sent) > 0),
    ]


# --- the run ------------------------------------------------------------------------------------


def body(args: Any) -> list[Check]:
    from tests.idp import LocalIdP
    from tests.redis_server import RedisServer

    print_header("connections: people's own tokens for backends (issue 37)", "gunicorn", [
        "echo backend: the SDK's (tests/backends.py build_sdk_server), uvicorn in its own process",
        "gateways: `vmcp-actors serve` through bench/connections.py's LAUNCHER (records seeded, token cache set)",
        "callers: type oidc, tests/idp.py LocalIdP tokens; Redis: a local redis-server",
        f"backend's authorization server: werkzeug in this process, refresh answered after {args.as_delay * 1000:g} "
        f"ms, tokens live {args.lifetime:g} s",
    ])
    checks: list[Check] = []
    with contextlib.ExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vmcp-bench-connections-")))
        redis_server = RedisServer().start()
        stack.callback(redis_server.close)
        idp = stack.enter_context(LocalIdP("bench-idp"))
        endpoint = stack.enter_context(token_endpoint(args.lifetime, args.as_delay))
        if "echo" in args.parts:
            checks += echo_overhead(args.calls, idp, endpoint, redis_server, directory)
            token_lookups(args.lookups, redis_server)
        if "refresh" in args.parts:
            checks += refresh_load(idp, endpoint, redis_server, directory, args.people, args.threads, args.duration,
                                   args.interval)
    return checks


def main() -> None:
    def extra(parser: Any) -> None:
        parser.add_argument("--calls", type=int, default=400, help="sequential echo calls per mode in part 1")
        parser.add_argument("--lookups", type=int, default=2000, help="Connections.token calls per mode and round")
        parser.add_argument("--duration", type=float, default=20.0, help="seconds of calls in part 2")
        parser.add_argument("--people", type=int, default=2, help="people calling in part 2")
        parser.add_argument("--threads", type=int, default=8, help="calling threads in part 2 (over both gateways)")
        parser.add_argument("--interval", type=float, default=0.1,
                            help="seconds between the starts of one thread's calls in part 2 (0: flat out)")
        parser.add_argument("--lifetime", type=float, default=4.0, help="the backend's access tokens' life, s")
        parser.add_argument("--as-delay", type=float, default=0.02, help="the token endpoint's time per refresh, s")

    args = parse_args(__doc__.splitlines()[0], extra=extra, parts=("echo", "refresh"),
                      gunicorn_only="bench.connections serves its gateways with gunicorn only (through its launcher)")
    if args.threads < 2 * args.people:
        raise SystemExit("--threads must be at least 2 x --people: each person calls through both gateways")
    run_benchmark(lambda: body(args), watchdog=max(115.0, args.duration + 90.0))


if __name__ == "__main__":
    main()
