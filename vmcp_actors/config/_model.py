"""The loaded config: frozen dataclasses, safe to pass between actors as messages."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vmcp_actors.workflows import CompositeTool

DEFAULT_TRANSPORT = "streamable-http"
TRANSPORTS = (DEFAULT_TRANSPORT, "sse", "stdio")
USER_PLACEHOLDER = "{user}"  # in a perUser stdio backend's args, env values and cwd
DEFAULT_ALGORITHMS = ("RS256", "ES256")
DEFAULT_PREFIX_FORMAT = "{workload}_"
WORKLOAD_PLACEHOLDER = "{workload}"


def _freeze_mapping(obj: object, attr: str) -> None:
    # Copy as well as wrap, so that a caller mutating its own dict cannot change the config.
    object.__setattr__(obj, attr, MappingProxyType(dict(getattr(obj, attr))))


def _freeze_sequence(obj: object, attr: str) -> None:
    value: Iterable = getattr(obj, attr)
    object.__setattr__(obj, attr, tuple(value))


SANDBOX_MODES = ("bubblewrap", "none")


@dataclass(frozen=True)
class SandboxConfig:
    """Where a stdio backend's process runs. ``bubblewrap`` (the default): in a sandbox of
    its own (own PID, IPC and user namespaces; the filesystem read-only but for a private
    /tmp, its cwd, the directories its args name and ``writable``; ``hidden`` paths and the
    gateway's config files unseen); ``network`` false also gives it no network. ``none``:
    as the gateway's own user, seeing what it sees."""

    mode: str = "bubblewrap"
    network: bool = True
    writable: tuple[str, ...] = ()  # absolute paths; {user} in perUser and perSession backends
    hidden: tuple[str, ...] = ()  # absolute paths

    def __post_init__(self) -> None:
        _freeze_sequence(self, "writable")
        _freeze_sequence(self, "hidden")

    @property
    def enabled(self) -> bool:
        return self.mode != "none"


@dataclass(frozen=True)
class BackendConfig:
    """One MCP server behind the gateway; ``name`` becomes its tools' prefix. An HTTP
    backend (``streamable-http``, or ``sse``: the 2024-11-05 HTTP+SSE transport) has a
    ``url``; a ``stdio`` backend is a program the gateway starts (``command``, ``args``,
    ``env``, ``cwd``), one for everyone (``scope: shared``), one per user (``perUser``) or
    one per client session (``perSession``: what the backend sees is one client's, as
    when a desktop client starts it), in its ``sandbox``."""

    name: str
    url: str | None = None
    transport: str = DEFAULT_TRANSPORT
    # "auto": a server/discover probe decides (remembered); "modern" (2026-07-28) or
    # "legacy" (initialize, 2025-xx) pin it.
    protocol: str = "auto"
    command: str | None = None
    args: tuple[str, ...] = ()
    # Literal values. Left out of the hash: a mapping proxy is not hashable.
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    cwd: str | None = None
    scope: str = "shared"
    sandbox: SandboxConfig = SandboxConfig()
    # A bulkhead: at most this many tools/call in flight to the backend at once (across
    # workers when records are in Redis); the others queue within their deadline. None: no limit.
    max_concurrent_calls: int | None = None

    def __post_init__(self) -> None:
        _freeze_sequence(self, "args")
        _freeze_mapping(self, "env")

    @property
    def is_process(self) -> bool:
        return self.transport == "stdio"

    @property
    def per_user(self) -> bool:
        """A process of one person's (perUser, or perSession: one client session's)."""
        return self.transport == "stdio" and self.scope in ("perUser", "perSession")

    @property
    def per_session(self) -> bool:
        return self.transport == "stdio" and self.scope == "perSession"


@dataclass(frozen=True)
class ToolOverride:
    """How one backend tool is shown to clients; ``None`` keeps the backend's own value.

    ``annotations`` are merged over the backend's annotations (JSON values; a deep copy, so
    nested values stay plain dicts and lists for JSON output: treat them as read-only).
    """

    name: str | None = None
    description: str | None = None
    # Left out of the hash: a mapping proxy is not hashable, and equal configs still hash equal.
    annotations: Mapping[str, Any] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if self.annotations is not None:
            object.__setattr__(self, "annotations", MappingProxyType(copy.deepcopy(dict(self.annotations))))


@dataclass(frozen=True)
class WorkloadToolsConfig:
    """One backend's tool settings.

    ``overrides`` is keyed by the backend's original tool name; ``filter`` (``None`` = no
    filter) lists the names to advertise after overrides and before conflict resolution.
    Hidden tools stay callable by composite tools.
    """

    workload: str
    filter: tuple[str, ...] | None = None
    exclude_all: bool = False
    # Left out of the hash: a mapping proxy is not hashable, and equal configs still hash equal.
    overrides: Mapping[str, ToolOverride] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.filter is not None:
            _freeze_sequence(self, "filter")
        _freeze_mapping(self, "overrides")

    def renames(self) -> dict[str, str]:
        """Original tool name -> the name its override gives it, for overrides that set a name."""
        return {original: override.name for original, override in self.overrides.items() if override.name is not None}


@dataclass(frozen=True)
class AggregationConfig:
    """How the backends' tools are merged into one list.

    ``priority_order`` is required when ``conflict_resolution`` is priority (ignored, with a
    warning from ``config_warnings``, under the other strategies);
    ``exclude_all_tools`` hides every backend tool from clients (composite tools still call them).
    ``advertised_name`` and ``is_advertised`` are the naming rules of both the gateway's
    catalog and the config's own checks, so the two cannot drift.
    """

    conflict_resolution: str = "prefix"
    prefix_format: str = DEFAULT_PREFIX_FORMAT
    priority_order: tuple[str, ...] = ()
    exclude_all_tools: bool = False
    tools: tuple[WorkloadToolsConfig, ...] = ()

    def __post_init__(self) -> None:
        _freeze_sequence(self, "priority_order")
        _freeze_sequence(self, "tools")
        # The schema reports this with its path; this guards configs built in code too.
        if self.conflict_resolution == "priority" and not self.priority_order:
            raise ValueError("priority_order is required for conflict_resolution priority")

    def prefix_for(self, workload: str) -> str:
        """The prefix that ``prefix_format`` gives the tools of backend ``workload``."""
        return self.prefix_format.replace(WORKLOAD_PLACEHOLDER, workload)

    def tools_for(self, workload: str) -> WorkloadToolsConfig | None:
        """The tool settings of backend ``workload``, or ``None`` if it has none."""
        return next((tools for tools in self.tools if tools.workload == workload), None)

    def advertised_name(self, workload: str, name: str) -> str:
        """The name clients see for tool ``name`` (after overrides) of backend ``workload``
        when no other backend's tool claims it: prefixed under prefix (clash or not, as
        ToolHive does), bare under priority and manual, whose clashes only the discovered
        lists can settle."""
        if self.conflict_resolution == "prefix":
            return self.prefix_for(workload) + name
        return name

    def is_advertised(self, workload: str, name: str, original: str | None = None) -> bool:
        """Whether backend ``workload``'s tool ``name`` (after overrides, before prefixing;
        ``original``: the backend's own name) passes ``exclude_all_tools``, the backend's
        ``exclude_all`` and its ``filter``, whose entries match either name (ToolHive's
        filter matches the backend's own name; this project's, the name after overrides)."""
        if self.exclude_all_tools:
            return False
        tools = self.tools_for(workload)
        if tools is None:
            return True
        return not tools.exclude_all and (tools.filter is None or name in tools.filter
                                          or (original is not None and original in tools.filter))


@dataclass(frozen=True)
class TimeoutsConfig:
    """Seconds to wait for a backend's answer; ``per_workload`` overrides ``default`` by name."""

    default: float = 30.0
    # Left out of the hash: a mapping proxy is not hashable, and equal configs still hash equal.
    per_workload: Mapping[str, float] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        _freeze_mapping(self, "per_workload")

    def for_backend(self, name: str) -> float:
        return self.per_workload.get(name, self.default)


# ToolHive waits up to 10 s for a backend's first answer; a healthy one answers far sooner.
DISCOVERY_BUDGET = 5.0


@dataclass(frozen=True)
class CircuitBreakerConfig:
    """Per backend, across users: after ``failure_threshold`` failed exchanges in a row
    calls fail fast for ``timeout`` seconds, then one probe decides."""

    enabled: bool = False
    failure_threshold: int = 5
    timeout: float = 60.0


@dataclass(frozen=True)
class FailureHandlingConfig:
    """``operational.failureHandling`` (ToolHive's fields): health checks of every backend
    with its static credentials, the partial-failure mode and the circuit breaker."""

    health_check_interval: float = 30.0
    health_check_timeout: float = 10.0
    unhealthy_threshold: int = 3
    partial_failure_mode: str = "best_effort"  # fail | best_effort
    circuit_breaker: CircuitBreakerConfig = field(default_factory=CircuitBreakerConfig)


# What the audit log can record (ToolHive's event type names).
# oauth: the authorization server's sign-ins, consents, tokens, registrations and refusals.
AUDIT_EVENT_TYPES = ("mcp_tool_call", "mcp_resource_read", "mcp_prompt_get", "mcp_task", "oauth", "connection")


@dataclass(frozen=True)
class AuditConfig:
    """``audit`` (ToolHive's fields): one JSON line per tool call, resource read and prompt
    get. Arguments and results only when included, cut to ``max_data_size`` bytes."""

    enabled: bool = False
    component: str = "vmcp-actors"
    event_types: tuple[str, ...] = ()  # empty: every type
    exclude_event_types: tuple[str, ...] = ()
    include_request_data: bool = False
    include_response_data: bool = False
    max_data_size: int = 1024
    log_file: str | None = None  # None: the vmcp_actors.audit logger (the process's log)

    def records(self, event_type: str) -> bool:
        if not self.enabled or event_type in self.exclude_event_types:
            return False
        return not self.event_types or event_type in self.event_types


@dataclass(frozen=True)
class TelemetryConfig:
    """``telemetry`` (ToolHive's fields): OpenTelemetry traces exported with OTLP over HTTP."""

    endpoint: str | None = None  # OTLP/HTTP base URL (…/v1/traces is added), e.g. http://collector:4318
    service_name: str = "vmcp-actors"
    service_version: str | None = None
    tracing_enabled: bool = False
    metrics_enabled: bool = False  # OTLP metrics are not sent: GET /metrics serves Prometheus
    sampling_rate: float = 1.0
    headers: Mapping[str, str] = field(default_factory=dict, repr=False, hash=False)  # to the collector (may hold keys)
    insecure: bool = False
    enable_prometheus_metrics_path: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))


@dataclass(frozen=True)
class TasksConfig:
    """Composite tools run as MCP tasks (when the client asks for tasks)."""

    result_ttl: float = 3600.0  # how long a task's result is kept after it ends (a client may ask less)
    max_live_per_user: int = 20  # tasks under way per user at once; the next is refused
    max_live_per_worker: int = 2000  # runs one worker holds at once (a thread each); the next is 503
    poll_interval: float = 1.0  # how often clients are told to poll


@dataclass(frozen=True)
class OperationalConfig:
    """Timeouts and limits of the running gateway."""

    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    session_ttl: float = 1800.0
    page_size: int = 100
    max_request_body_bytes: int = 4 * 1024 * 1024
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    discovery_cache_ttl: float = 30.0  # 0 = no cache
    # A user's actors stop after this long without requests; their records stay, and the
    # next request revives them.
    user_idle_timeout: float = 300.0
    max_sessions: int = 1000  # at the cap the least recently used idle session is evicted
    max_sessions_per_identity: int = 0  # the same per caller (issuer + subject); 0 = no cap of its own
    # Users whose actors run at once (each holds one thread: its UserActor); at the cap the
    # least recently used user with nothing in flight is released (its records stay).
    max_live_users: int = 1000
    # After SIGTERM: how long calls in flight may take before the worker stops anyway.
    shutdown_grace_period: float = 30.0
    # None: no health checks, no circuit breaker, partial failures served (best effort).
    failure_handling: FailureHandlingConfig | None = None
    # NAME of the env var holding the key that signs session ids; None = a random key per start.
    signing_key_env: str | None = None
    # stdio backends: live children of this worker at most (perUser ones are released
    # least recently used first), and how long a shared child may sit idle before it stops.
    max_processes: int = 50
    process_idle_timeout: float = 600.0
    tasks: TasksConfig = field(default_factory=TasksConfig)
    # How long a first discovery waits for each backend before it answers with those that
    # were ready (a late one joins with list_changed); perWorkload per backend.
    discovery_budget: TimeoutsConfig = field(default_factory=lambda: TimeoutsConfig(DISCOVERY_BUDGET))
    # The gateway's public base URL: where connect links and OAuth callbacks point (None:
    # incomingAuth.oauth.issuer; see VmcpConfig.public_url).
    public_url: str | None = None

    def __post_init__(self) -> None:
        _freeze_sequence(self, "allowed_hosts")
        _freeze_sequence(self, "allowed_origins")


@dataclass(frozen=True)
class AdminConfig:
    """``token_env`` is the NAME of the env var holding the admin token, never the token."""

    token_env: str | None = None
    # NAME of the env var holding a token GET /metrics then requires; None = /metrics is open.
    metrics_token_env: str | None = None


@dataclass(frozen=True)
class OidcConfig:
    """Bearer tokens (JWTs) from an OpenID Connect provider.

    Without ``jwks_url`` the keys are found through ``{issuer}/.well-known/openid-configuration``.
    ``clock_skew`` (seconds) is the leeway for ``exp``, ``nbf`` and ``iat``.
    """

    issuer: str
    audience: str
    jwks_url: str | None = None
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    clock_skew: float = 30.0
    resource_url: str | None = None  # advertised as the protected resource (RFC 9728); ToolHive's `resource`
    # RFC 7662: opaque (non-JWT) tokens are asked about here, as this client.
    introspection_url: str | None = None
    client_id: str | None = None
    client_secret_env: str | None = None  # NAME of the env var holding the client secret
    scopes: tuple[str, ...] = ()  # advertised as scopes_supported (RFC 9728)

    def __post_init__(self) -> None:
        _freeze_sequence(self, "algorithms")
        _freeze_sequence(self, "scopes")


DEFAULT_GROUP_ENTITY_TYPE = "THVGroup"


@dataclass(frozen=True)
class AuthzConfig:
    """Cedar policies over what each caller may list and call (ToolHive's ``incomingAuth.authz``).

    ``entities_json`` is ToolHive's JSON array of extra entities (group hierarchies, for
    one). Groups come from ``group_claim_name`` (else the first of ``groups``, ``roles``,
    ``cognito:groups`` the token has) plus ``role_claim_name``, each a parent entity of the
    principal of type ``group_entity_type``.
    """

    type: str = "cedar"
    policies: tuple[str, ...] = ()
    entities_json: str = "[]"
    group_claim_name: str | None = None
    role_claim_name: str | None = None
    group_entity_type: str = DEFAULT_GROUP_ENTITY_TYPE

    def __post_init__(self) -> None:
        _freeze_sequence(self, "policies")


@dataclass(frozen=True)
class UpstreamIdpConfig:
    """The OIDC provider people sign in with when the gateway is the authorization server;
    the gateway is one confidential client of it."""

    issuer: str
    client_id: str
    client_secret_env: str  # NAME of the env var holding the client secret
    scopes: tuple[str, ...] = ("openid",)

    def __post_init__(self) -> None:
        _freeze_sequence(self, "scopes")


@dataclass(frozen=True)
class CimdConfig:
    """Client ID metadata documents: a client id that is an https URL is fetched.
    ``allowed_hosts`` (host or host:port) may be private or loopback addresses."""

    enabled: bool = True
    allowed_hosts: tuple[str, ...] = ()
    ca_bundle: str | None = None  # PEM file of extra CAs the documents' hosts may be signed by

    def __post_init__(self) -> None:
        _freeze_sequence(self, "allowed_hosts")


@dataclass(frozen=True)
class OAuthServerConfig:
    """The gateway as its clients' OAuth 2.1 authorization server, in front of ``upstream``.
    Durations are seconds."""

    issuer: str  # the gateway's public base URL
    upstream: UpstreamIdpConfig
    signing_key_env: str  # NAME of the env var holding the PEM private key that signs access tokens
    # NAMEs of env vars holding earlier keys: their tokens still verify, nothing new is signed with them.
    previous_signing_key_envs: tuple[str, ...] = ()
    access_token_ttl: float = 3600.0
    refresh_token_ttl: float = 30 * 86400.0
    refresh_grace_period: float = 30.0
    authorization_code_ttl: float = 60.0
    consent_ttl: float = 30 * 86400.0  # how long a remembered consent lasts
    registrations_per_minute: int = 20  # dynamic registrations per client address
    cimd: CimdConfig = field(default_factory=CimdConfig)

    def __post_init__(self) -> None:
        _freeze_sequence(self, "previous_signing_key_envs")

    @property
    def resource(self) -> str:
        """The protected resource the gateway's tokens are for (their audience)."""
        return self.issuer.rstrip("/") + "/mcp"

    @property
    def advertised_scopes(self) -> tuple[str, ...]:
        """The scopes clients are told of: the IdP's, without offline_access (a refresh token
        from the gateway needs no scope; MCP clients should not ask for it)."""
        return tuple(scope for scope in self.upstream.scopes if scope != "offline_access")


@dataclass(frozen=True)
class IncomingAuthConfig:
    """How MCP clients authenticate to the gateway; ``oidc`` is set exactly when ``type`` is
    oidc, ``oauth`` when it is oauth (the gateway is the authorization server); ``authz``
    when Cedar policies decide what each caller sees."""

    type: str = "anonymous"
    oidc: OidcConfig | None = None
    authz: AuthzConfig | None = None
    oauth: OAuthServerConfig | None = None

    @property
    def names_callers(self) -> bool:
        return self.type != "anonymous"


DEFAULT_MAX_TOOLS_TO_RETURN = 8


@dataclass(frozen=True)
class SessionStorageConfig:
    """Where session and user records live (ToolHive's ``sessionStorage``): ``memory`` (one
    process) or ``redis`` (any process serves any session)."""

    provider: str = "memory"
    address: str = "127.0.0.1:6379"
    db: int = 0
    key_prefix: str = "vmcp:"
    password_env: str | None = None  # env var holding Redis's password (AUTH)


@dataclass(frozen=True)
class OptimizerConfig:
    """``find_tool`` and ``call_tool`` in place of every tool (ToolHive's ``optimizer``).
    ``ignored`` names the embedding fields set: ranking here is BM25, with no model."""

    max_tools_to_return: int = DEFAULT_MAX_TOOLS_TO_RETURN
    ignored: tuple[str, ...] = ()


CODE_MODE_LISTINGS = ("scripts", "all")
WORKER_ISOLATIONS = ("bubblewrap", "none")
# The script tool and its two search helpers: the names code mode lists.
SCRIPT_TOOL, SEARCH_TOOLS, TOOL_SCHEMAS = "execute_tool_script", "search_tools", "get_tool_schema"
CODE_MODE_TOOL_NAMES = (SCRIPT_TOOL, SEARCH_TOOLS, TOOL_SCHEMAS)


@dataclass(frozen=True)
class CodeModeConfig:
    """``execute_tool_script``: one tool that runs a model's script over the tools a
    person may call, in pydantic-monty's sandbox (``vmcp_actors.codemode``).

    ``listing``: ``scripts`` lists only the script tool and its two search helpers (with
    the optimizer: find_tool, call_tool and the script tool); ``all`` lists them beside
    every tool. ``tools``: the tool names (``fnmatch`` patterns) scripts may call and
    search. Limits: ``timeout`` the script's wall time, ``executionTime`` the time its
    own code runs (not waiting on tools), ``toolCallTimeout`` each inner call,
    ``maxToolCalls`` calls per script, ``parallelMaxConcurrency`` calls at once,
    ``maxMemory`` its heap in bytes, ``maxRecursionDepth``, ``maxScriptSize`` characters
    of script, ``maxConcurrentScripts`` sandbox workers of this process, ``taskAfter``
    how long a call of a client that accepts tasks runs before it becomes a task;
    ``workerIsolation``: ``bubblewrap`` runs each sandbox worker process in its own
    namespaces too (no network, no files but its binary's), ``none`` as the gateway's user."""

    enabled: bool = False
    listing: str = "scripts"
    tools: tuple[str, ...] = ("*",)
    timeout: float = 60.0
    execution_time: float = 5.0
    tool_call_timeout: float = 30.0
    max_tool_calls: int = 100
    parallel_max_concurrency: int = 8
    max_memory: int = 64 * 1024 * 1024
    max_recursion_depth: int = 200
    max_script_size: int = 64 * 1024
    max_concurrent_scripts: int = 4
    task_after: float = 2.0
    worker_isolation: str = "bubblewrap"


@dataclass(frozen=True)
class HeaderInjectionConfig:
    """A static header added to every request to a backend; one of value / env var NAME is set."""

    header_name: str
    header_value: str | None = field(default=None, repr=False)  # a secret: never in repr or errors
    header_value_env: str | None = None


@dataclass(frozen=True)
class TokenExchangeConfig:
    """RFC 8693 token exchange; the subject token is the caller's incoming token."""

    token_url: str
    client_id: str
    client_secret_env: str | None = None  # env var NAME; public clients have no secret
    audience: str | None = None
    scopes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _freeze_sequence(self, "scopes")


@dataclass(frozen=True)
class BackendOAuthConfig:
    """``type: oauth``: each person authorizes the gateway at the backend's own
    authorization server. Without ``client_id`` the gateway registers itself there (its
    client metadata document where the server takes one, else dynamic registration)."""

    scopes: tuple[str, ...] = ()
    client_id: str | None = None
    client_secret_env: str | None = None  # env var NAME; a pre-registered confidential client
    # The authorization server's issuer, when the backend does not say it (a stdio backend
    # has no URL to ask), and the RFC 8707 resource to ask tokens for (default: its URL).
    issuer: str | None = None
    resource: str | None = None

    def __post_init__(self) -> None:
        _freeze_sequence(self, "scopes")


@dataclass(frozen=True)
class BackendAuthConfig:
    """How the gateway authenticates to one backend; the block matching ``type`` is set
    (``oauth`` may be omitted: every setting of it is optional)."""

    type: str = "unauthenticated"
    header_injection: HeaderInjectionConfig | None = None
    token_exchange: TokenExchangeConfig | None = None
    oauth: BackendOAuthConfig | None = None
    # For a stdio backend: the environment variable of the child that carries the
    # credential (the injected header's value, or the exchanged token) instead of a header.
    token_env: str | None = None


@dataclass(frozen=True)
class OutgoingAuthConfig:
    """Per-backend outgoing auth (``backends`` overrides ``default`` by name) and the
    client headers forwarded to every backend."""

    default: BackendAuthConfig = field(default_factory=BackendAuthConfig)
    # Left out of the hash: a mapping proxy is not hashable, and equal configs still hash equal.
    backends: Mapping[str, BackendAuthConfig] = field(default_factory=dict, hash=False)
    passthrough_headers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _freeze_mapping(self, "backends")
        _freeze_sequence(self, "passthrough_headers")

    def for_backend(self, name: str) -> BackendAuthConfig:
        return self.backends.get(name, self.default)


@dataclass(frozen=True)
class TokenBucket:
    """``max_tokens`` calls at once (the burst), refilled at ``max_tokens / refill_period``
    per second."""

    max_tokens: int
    refill_period: float  # seconds

    @property
    def rate(self) -> float:
        return self.max_tokens / self.refill_period


@dataclass(frozen=True)
class ToolRateLimit:
    """The buckets of one advertised tool (either may be None)."""

    name: str
    shared: TokenBucket | None = None  # one bucket for every caller of the tool
    per_user: TokenBucket | None = None  # one bucket per caller, for the tool


@dataclass(frozen=True)
class RateLimitingConfig:
    """ToolHive's ``rateLimiting``: a call passes every bucket that applies, or none is spent."""

    shared: TokenBucket | None = None  # one bucket for every tools/call (ToolHive's global, or shared)
    per_user: TokenBucket | None = None  # one bucket per caller
    tools: tuple[ToolRateLimit, ...] = ()
    # With records in Redis and Redis unreachable: "allow" (fail open, logged) or "refuse" (503).
    on_store_error: str = "allow"

    def __post_init__(self) -> None:
        _freeze_sequence(self, "tools")

    def tool(self, name: str) -> ToolRateLimit | None:
        return next((tool for tool in self.tools if tool.name == name), None)


@dataclass(frozen=True)
class VmcpConfig:
    """A whole virtual MCP server: its name, its backends, how they are served, and the
    composite tools (declarative workflows over the backends' tools) it adds."""

    name: str
    backends: tuple[BackendConfig, ...]
    incoming_auth: IncomingAuthConfig = field(default_factory=IncomingAuthConfig)
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    operational: OperationalConfig = field(default_factory=OperationalConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    outgoing_auth: OutgoingAuthConfig = field(default_factory=OutgoingAuthConfig)
    # Left out of the hash: a composite's parameters and arguments are plain JSON mappings.
    composite_tools: tuple[CompositeTool, ...] = field(default=(), hash=False)
    optimizer: OptimizerConfig | None = None
    code_mode: CodeModeConfig = field(default_factory=CodeModeConfig)
    session_storage: SessionStorageConfig = field(default_factory=SessionStorageConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    rate_limiting: RateLimitingConfig | None = None

    def __post_init__(self) -> None:
        _freeze_sequence(self, "backends")
        _freeze_sequence(self, "composite_tools")

    def backend(self, name: str) -> BackendConfig | None:
        return next((b for b in self.backends if b.name == name), None)

    @property
    def public_url(self) -> str | None:
        """Where people's browsers reach the gateway (connect links, OAuth callbacks):
        ``operational.publicUrl``, else the authorization server's issuer."""
        if self.operational.public_url is not None:
            return self.operational.public_url.rstrip("/")
        oauth = self.incoming_auth.oauth
        return oauth.issuer.rstrip("/") if oauth is not None else None

    @property
    def connected_backends(self) -> tuple[str, ...]:
        """The backends each person connects with their own authorization (type oauth)."""
        return tuple(b.name for b in self.backends if self.outgoing_auth.for_backend(b.name).type == "oauth")
