"""The composition root: builds the process's runtime in dependency order (signing key,
record store, caches, outgoing auth, the Gateway actor, the request service) and stops it
in reverse. The web front end receives the built ``Runtime``; nothing here imports Flask."""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pykka

from vmcp_actors import tracing
from vmcp_actors.backends import ExchangedTokenCache, build_outgoing_auth
from vmcp_actors.backends._sandbox import problems as sandbox_problems
from vmcp_actors.backends._stdio import ChildProcesses
from vmcp_actors.config import VmcpConfig, config_warnings
from vmcp_actors.core._interface import LayerFactory
from vmcp_actors.decorators import CodeModeServices, CompositeTasks, WorkflowMetrics, stack
from vmcp_actors.edge._audit import AuditLog
from vmcp_actors.edge._auth import Authenticator, build_authenticator
from vmcp_actors.edge._service import McpService
from vmcp_actors.exceptions import ConfigError
from vmcp_actors.metrics import METRICS_DIR_ENV, GatewayCollector, ProcessTotals, record_connection, record_oauth
from vmcp_actors.oauth import ConnectService, OAuthService, build_connections, build_oauth, oauth_secrets
from vmcp_actors.oauth._connections import same_person
from vmcp_actors.shared_cache import SharedCache
from vmcp_actors.signing import MIN_KEY_BYTES, Signer
from vmcp_actors.users._actor import SessionServices
from vmcp_actors.users._directory import Directory
from vmcp_actors.users._discovery_cache import DiscoveryCache
from vmcp_actors.users._gateway import Gateway
from vmcp_actors.users._records import UserKey
from vmcp_actors.limits import Bulkheads, MemoryBuckets, RateLimiter, RedisBuckets
from vmcp_actors.users._redis_store import RedisRecordStore
from vmcp_actors.users._store import MemoryRecordStore, RecordStore
from vmcp_actors.users._stream_fanout import StreamFanout
from vmcp_actors.users._task_signals import LocalTaskSignals, RedisTaskSignals

logger = logging.getLogger(__name__)

# The admin page's "recent problems": the last warnings and errors of vmcp_actors' loggers.
RECENT_PROBLEMS = 50
# The page shows no backend URL (the log itself keeps its display URL for operators).
_URL = re.compile(r"\bhttps?://\S+")


@dataclass(frozen=True)
class Problem:
    at: float
    level: str
    logger: str
    message: str


class _RecentProblems(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.problems: collections.deque[Problem] = collections.deque(maxlen=RECENT_PROBLEMS)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = _URL.sub("<url>", record.getMessage())
            self.problems.append(Problem(record.created, record.levelname, record.name, message[:500]))
        except Exception:  # noqa: BLE001 - a log line that cannot be formatted is left out
            pass


_PROBLEMS = _RecentProblems()


def recent_problems() -> list[Problem]:
    """Newest first."""
    return list(reversed(_PROBLEMS.problems))


@dataclass(frozen=True)
class Runtime:
    config: VmcpConfig
    gateway: Any  # ActorProxy[Gateway]
    service: McpService  # what the MCP view hands each message to
    authenticator: Authenticator
    admin_token: str | None = field(repr=False)
    allowed_hosts: frozenset[str]
    any_host: bool
    fanout: StreamFanout | None = None
    metrics: GatewayCollector | None = None  # what GET /metrics returns
    metrics_token: str | None = field(default=None, repr=False)
    totals: ProcessTotals | None = None  # this worker's metric totals, for the other workers
    processes: ChildProcesses | None = None  # the stdio backends' children of this worker
    tasks: CompositeTasks | None = None  # the composite tasks this worker runs
    limiter: RateLimiter | None = None  # rateLimiting (None: none configured)
    bulkheads: Bulkheads | None = None  # backends' maxConcurrentCalls (None: none configured)
    oauth: OAuthService | None = None  # incomingAuth.type oauth: the gateway's authorization server
    connect: ConnectService | None = None  # backends of type oauth: people's connections
    code_mode: CodeModeServices | None = None  # codeMode: the sandbox and the scripts running

    def scripts(self) -> list[dict[str, Any]]:
        """The admin state's code mode scripts running in this worker."""
        return self.code_mode.running.snapshot() if self.code_mode is not None else []

    def limits_state(self) -> dict[str, Any]:
        """The admin state's rate limits and bulkheads (this worker's counts; bucket levels
        as the store has them)."""
        return {"rateLimits": self.limiter.state() if self.limiter is not None else None,
                "bulkheads": self.bulkheads.snapshot() if self.bulkheads is not None else {}}

    def drain(self) -> None:
        if not self.service.draining:
            logger.info("draining: new sessions are refused; calls in flight may finish")
        self.service.drain()

    def stop(self, timeout: float = 5.0) -> None:
        """In reverse order of the start: tracing, the metric totals, the service (its
        parked calls end, their backends told), the fanout, then the Gateway (which ends
        or releases every user)."""
        tracing.shutdown()
        if self.totals is not None:
            self.totals.stop()
        if self.tasks is not None:
            self.tasks.stop()  # recorded as failed, so other workers do not wait on them
        self.service.stop()
        if self.fanout is not None:
            self.fanout.stop()
        try:
            self.gateway.actor_ref.stop(block=True, timeout=timeout)
        except (pykka.ActorDeadError, pykka.Timeout):
            pass
        if self.processes is not None:
            self.processes.stop_all()  # what the users' release left: shared children, stragglers
        if self.code_mode is not None:
            self.code_mode.running.cancel_all()
            self.code_mode.sandbox.close()  # its worker processes end


PR_SET_DUMPABLE = 4  # prctl(2)


def _not_dumpable() -> None:
    """The process holding the secrets is made non-dumpable (prctl PR_SET_DUMPABLE 0): a
    process of the same user, such as a stdio child, can then no longer read its
    /proc/<pid>/environ or memory, nor attach to it. Children start dumpable again (exec)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            logger.warning("could not make this process non-dumpable (errno %d)", ctypes.get_errno())
    except (OSError, AttributeError) as error:
        logger.warning("could not make this process non-dumpable: %s", error)


def start_runtime(config: VmcpConfig, bind_host: str = "127.0.0.1", layers: Sequence[LayerFactory] = ()) -> Runtime:
    """``layers``: an embedder's decorators over each user's core (``vmcp_actors.core``)."""
    for warning in config_warnings(config):
        logger.warning("config: %s", warning)
    _not_dumpable()
    unsandboxable = sandbox_problems(config)
    if unsandboxable:
        raise ConfigError(unsandboxable)
    # Every secret the config names is read first: an unset one stops the start, naming
    # its field, before anything is started.
    admin_token = secret_from_env("admin.tokenEnv", config.admin.token_env)
    metrics_token = secret_from_env("admin.metricsTokenEnv", config.admin.metrics_token_env)
    oidc = config.incoming_auth.oidc if config.incoming_auth.type == "oidc" else None
    client_secret = secret_from_env("incomingAuth.oidc.clientSecretEnv", oidc.client_secret_env if oidc else None)
    oauth_held = oauth_secrets(config, secret_from_env) if config.incoming_auth.type == "oauth" else None
    connect_secrets = {name: secret_from_env(f"outgoingAuth.backends.{name}.oauth.clientSecretEnv",
                                             config.outgoing_auth.for_backend(name).oauth.client_secret_env)
                       for name in config.connected_backends}
    signer = _signer(config)
    store = _record_store(config, signer)
    # With records in Redis, the caches get a shared second level there too.
    shared = SharedCache(store.client, signer, config.session_storage.key_prefix) \
        if isinstance(store, RedisRecordStore) else None
    connect = build_connections(
        config, connect_secrets, oauth_held.upstream_client_secret if oauth_held is not None else client_secret or "",
        store.client if isinstance(store, RedisRecordStore) else None, signer, record_connection) \
        if config.connected_backends else None
    outgoing_auth = build_outgoing_auth(config, cache=ExchangedTokenCache(shared=shared),
                                        personal=connect.connections if connect is not None else None)
    extra_hosts = {h.lower() for h in config.operational.allowed_hosts}
    allowed = {"localhost", "127.0.0.1", "::1"} | extra_hosts
    if bind_host not in ("0.0.0.0", "::", ""):
        allowed.add(bind_host.lower().strip("[]"))
    elif not extra_hosts:
        logger.warning(
            "listening on all interfaces but operational.allowedHosts is empty: only localhost Host headers are accepted"
        )
    directory = Directory(store, time.monotonic)
    cache = DiscoveryCache(config.operational.discovery_cache_ttl, shared=shared, aggregation=config.aggregation)
    workflow_metrics = WorkflowMetrics()
    processes = ChildProcesses(config) \
        if any(backend.is_process for backend in config.backends) else None
    signals = RedisTaskSignals(store.client, signer, config.session_storage.key_prefix) \
        if isinstance(store, RedisRecordStore) else LocalTaskSignals()
    tasks = CompositeTasks(store, signals, config.operational.tasks)
    limiter = _rate_limiter(config, store)
    bulkheads = _bulkheads(config, store)
    audit = AuditLog(config.audit)  # the edge's lines and a script's inner calls'

    def hold_user(key: UserKey) -> Callable[[], None]:
        held = directory.hold_user(key) is not None
        return (lambda: directory.finish("", key)) if held else (lambda: None)
    services = SessionServices.for_config(config, shared, outgoing_auth=outgoing_auth, discovery_cache=cache,
                                          processes=processes, signer=signer,
                                          composite_tasks=tasks, hold_user=hold_user,
                                          bulkheads=bulkheads,
                                          store=store, workflow_metrics=workflow_metrics,
                                          decorators=stack(config, layers, workflow_metrics, limiter,
                                                           script_audit=audit.write_script_call),
                                          fanout=StreamFanout(store.client, signer, config.session_storage.key_prefix)
                                          if isinstance(store, RedisRecordStore) else None,
                                          # Below 2**52 (exact in JSON), apart from other processes'.
                                          request_id_base=secrets.randbits(40) << 12 if store.shared else 0)
    gateway = Gateway.start(config, directory, services, signer).proxy()
    if services.fanout is not None:
        services.fanout.start(lambda key, backend, message: _from_other_process(directory, key, backend, message))
    oauth = build_oauth(config, oauth_held, store.client if isinstance(store, RedisRecordStore) else None,
                        signer, record_oauth) if oauth_held is not None else None
    authenticator = oauth.authenticator if oauth is not None else build_authenticator(oidc, client_secret)
    names = [backend.name for backend in config.backends]
    service = McpService(config, gateway, directory, signer, services.live,
                         remembered_instructions=lambda: services.eras.instructions(names), audit=audit)
    if oauth is not None:
        oauth.server.events.audit = service.audit_oauth
    if connect is not None:
        connect.connections.events.audit = service.audit_connection
        connect.connections.on_change = lambda person, backend: _connection_changed(directory, person, backend,
                                                                                   services.fanout)
    package_logger = logging.getLogger("vmcp_actors")
    if _PROBLEMS not in package_logger.handlers:
        package_logger.addHandler(_PROBLEMS)
    totals = ProcessTotals(os.environ.get(METRICS_DIR_ENV))
    totals.start()
    tracing.configure(config.telemetry)
    return Runtime(config, gateway, service, authenticator, admin_token,
                   frozenset(allowed - {"*"}), "*" in extra_hosts, services.fanout,
                   GatewayCollector(totals, lambda: process_gauges(config, directory, services)), metrics_token, totals,
                   processes, tasks, limiter, bulkheads, oauth, connect, services.decorators.code_mode)


# Told to the other processes through the stream fanout: a person's connection changed.
CONNECTION_CHANGED = "vmcp/connectionChanged"


def _from_other_process(directory: Directory, key: UserKey, backend: str, message: dict) -> None:
    if message.get("method") == CONNECTION_CHANGED:
        _connection_changed(directory, (key.issuer, key.subject), backend)
    else:
        _to_live_user(directory, key, backend, message)


def _connection_changed(directory: Directory, person: Any, backend: str, fanout: StreamFanout | None = None) -> None:
    """A person connected or disconnected ``backend``: their live users here list it again,
    and (``fanout``: Redis) the other processes are told to do the same."""
    if fanout is not None:
        fanout.publish(UserKey(person[0], person[1]), backend, {"method": CONNECTION_CHANGED})
    for user in directory.live_users():
        if same_person((user.key.issuer, user.key.subject), person):
            try:
                user.proxy.backend_changed(backend)
            except pykka.ActorDeadError:
                pass


def process_gauges(config: VmcpConfig, directory: Directory, services: SessionServices) -> list[Any]:
    """The gauges of this process for a scrape: (name, help, {labels: value}, label names)."""
    health = services.health.snapshot() if services.health is not None else {}
    circuit_values = {"closed": 0, "half_open": 1, "open": 2}
    cache = services.discovery_cache.stats()
    workflows = services.workflow_metrics.snapshot()
    children = services.processes.snapshot() if services.processes is not None else []
    live: dict[tuple[str, ...], float] = {}
    for child in children:
        live[(child.backend,)] = live.get((child.backend,), 0) + 1
    restarts = services.processes.restarts() if services.processes is not None else {}
    tasks: dict[tuple[str, ...], float] = {}
    ended: dict[tuple[str, str], int] = {}
    if services.composite_tasks is not None:
        for row in services.composite_tasks.running():  # before ended_counts(): a run just ending is in one of them
            tasks[(row["tool"], row["status"])] = tasks.get((row["tool"], row["status"]), 0) + 1
        ended = services.composite_tasks.ended_counts()
    limiter = services.decorators.limiter if services.decorators is not None else None
    refusals = limiter.refusals() if limiter is not None else {}
    bulkheads = services.bulkheads.snapshot() if services.bulkheads is not None else {}
    return [
        ("vmcp_rate_limit_refusals", "Calls refused by a rate limit since this process started, by the bucket that "
                                     "refused (kind: global, perUser, tool, toolPerUser; tool: empty for the "
                                     "server's buckets).", refusals, ("kind", "tool")),
        ("vmcp_rate_limit_store_failures", "Rate limit decisions Redis could not make since start (onStoreError "
                                           "applied).", {(): limiter.store_failures()} if limiter else {}, ()),
        ("vmcp_backend_calls_queued", "Calls waiting for a place at a backend's bulkhead (maxConcurrentCalls).",
         {(name,): row["waiting"] for name, row in bulkheads.items()}, ("backend",)),
        ("vmcp_backend_calls_admitted", "Calls holding a place at a backend's bulkhead.",
         {(name,): row["inFlight"] for name, row in bulkheads.items()}, ("backend",)),
        ("vmcp_backend_calls_queue_timeouts", "Calls whose deadline passed while they waited for a place, since start.",
         {(name,): row["timedOut"] for name, row in bulkheads.items()}, ("backend",)),
        ("vmcp_backend_processes", "Live children of stdio backends in this process.", live, ("backend",)),
        ("vmcp_backend_process_restarts", "Restarts of stdio backends' children since this process started.",
         {(name,): count for name, count in restarts.items()}, ("backend",)),
        ("vmcp_sessions", "Client sessions this process serves.", {(): directory.session_count()}, ()),
        ("vmcp_live_users", "Users whose actors run in this process.", {(): len(directory.live_users())}, ()),
        ("vmcp_threads", "Threads of this process.", {(): threading.active_count()}, ()),
        ("vmcp_discovery_cache_hits", "Discovery cache hits since start.", {(): cache["hits"]}, ()),
        ("vmcp_discovery_cache_misses", "Discovery cache misses since start.", {(): cache["misses"]}, ()),
        ("vmcp_workflow_runs_in_flight", "Composite tool runs under way.",
         {(name, ): counters["running"] for name, counters in workflows.items()}, ("composite",)),
        ("vmcp_composite_tasks", "Composite tool tasks this worker runs, by status.", tasks, ("composite", "status")),
        ("vmcp_composite_tasks_ended", "Composite tool tasks this worker ran that ended since it started, by status.",
         ended, ("composite", "status")),
        ("vmcp_circuit_state", "Each backend's circuit: 0 closed, 1 half-open, 2 open.",
         {(name, ): circuit_values[row["circuit"]["state"]] for name, row in health.items() if "circuit" in row},
         ("backend",)),
        ("vmcp_backend_health", "1 for each backend's current health state (unknown, healthy, degraded, "
                                "unhealthy, unauthenticated).",
         {(name, row["state"]): 1 for name, row in health.items() if "state" in row}, ("backend", "state")),
    ]


def _to_live_user(directory: Directory, key: UserKey, backend: str, message: dict) -> None:
    """Another process's backend stream brought this: for the user, if it is live here."""
    user = directory.user(key)
    if user is not None:
        try:
            user.proxy.from_other_process(backend, message)
        except pykka.ActorDeadError:
            pass


def _rate_limiter(config: VmcpConfig, store: RecordStore) -> RateLimiter | None:
    """The config's rate limits, their buckets where the records are (Redis: one decision
    for every worker)."""
    if config.rate_limiting is None:
        return None
    buckets = RedisBuckets(store.client) if isinstance(store, RedisRecordStore) else MemoryBuckets()
    return RateLimiter(config.rate_limiting, buckets, config.session_storage.key_prefix)


def _bulkheads(config: VmcpConfig, store: RecordStore) -> Bulkheads | None:
    """The backends' maxConcurrentCalls, held in Redis when the records are (every worker's
    calls count)."""
    limits = {backend.name: backend.max_concurrent_calls for backend in config.backends
              if backend.max_concurrent_calls is not None}
    if not limits:
        return None
    shared = store.client if isinstance(store, RedisRecordStore) else None
    return Bulkheads(limits, shared, config.session_storage.key_prefix)


def _record_store(config: VmcpConfig, signer: Signer) -> RecordStore:
    """Where records live: this process's memory, or Redis (``sessionStorage``), shared by
    every process that holds the same signing key."""
    storage = config.session_storage
    if storage.provider == "memory":
        return MemoryRecordStore()
    if config.operational.signing_key_env is None:
        raise ConfigError(["sessionStorage.provider: redis needs operational.signingKeyEnv: every process must "
                           "hold the key that signs session ids and encrypts the records"])
    password = None
    if storage.password_env is not None:
        password = os.environ.get(storage.password_env) or None
        if password is None:
            raise ConfigError([f"sessionStorage.passwordEnv: environment variable {storage.password_env} is not "
                               "set or empty"])
    store = RedisRecordStore.connect(storage.address, storage.db, password, signer, key_prefix=storage.key_prefix,
                                     session_ttl=config.operational.session_ttl)
    if not store.ping():
        logger.warning("session storage (Redis at %s) does not answer yet: requests get 503 until it does",
                       storage.address)
    return store


def _signer(config: VmcpConfig) -> Signer:
    """The key that signs session ids: from the environment when configured (so other
    processes can trust the ids), else generated now (ids die with the process)."""
    name = config.operational.signing_key_env
    if name is None:
        logger.info("session ids are signed with a key generated at start (operational.signingKeyEnv gives "
                    "processes that share records one key)")
        return Signer.generated()
    key = os.environ.get(name, "").encode()
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError([f"operational.signingKeyEnv: environment variable {name} must hold at least "
                           f"{MIN_KEY_BYTES} bytes"])
    return Signer(key)


def secret_from_env(path: str, name: str | None) -> str | None:
    """The value of the variable the config field ``path`` names (None when the field is
    unset); a ConfigError naming the field when the variable is unset or empty."""
    if name is None:
        return None
    value = os.environ.get(name)
    if not value:
        raise ConfigError([f"{path}: environment variable {name} is not set or empty"])
    return value
