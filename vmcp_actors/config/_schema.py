"""marshmallow schemas for the YAML config (camelCase keys, as in ToolHive's vMCP).

Every schema raises on unknown keys. Contract fields that are not built yet are declared
as ``NotSupportedYet`` fields, so they are rejected by name instead of as "unknown field".
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from marshmallow import (
    Schema,
    ValidationError,
    fields,
    post_load,
    validate,
    validates,
    validates_schema,
)

from marshmallow.utils import missing

from ._composite import CompositeToolSchema, composite_reference_problems
from ._rate_limits import unadvertisable_limits
from ._durations import parse_duration
from ._fields import (
    NotSupportedYet,
    _Boolean,
    _Choice,
    _Duration,
    _Integer,
    _JsonMapping,
    _List,
    _loaded,
    _Nested,
    _not_blank,
    _PlainMessages,
    _StrictSchema,
    _String,
    _tool_name,
)
from ._model import (
    AUDIT_EVENT_TYPES,
    DEFAULT_ALGORITHMS,
    DEFAULT_GROUP_ENTITY_TYPE,
    DEFAULT_MAX_TOOLS_TO_RETURN,
    DEFAULT_PREFIX_FORMAT,
    DEFAULT_TRANSPORT,
    DISCOVERY_BUDGET,
    SANDBOX_MODES,
    TRANSPORTS,
    USER_PLACEHOLDER,
    AdminConfig,
    AggregationConfig,
    AuditConfig,
    AuthzConfig,
    BackendAuthConfig,
    BackendOAuthConfig,
    BackendConfig,
    CircuitBreakerConfig,
    CODE_MODE_LISTINGS,
    CODE_MODE_TOOL_NAMES,
    SCRIPT_TOOL,
    WORKER_ISOLATIONS,
    CodeModeConfig,
    SandboxConfig,
    FailureHandlingConfig,
    HeaderInjectionConfig,
    CimdConfig,
    IncomingAuthConfig,
    OAuthServerConfig,
    UpstreamIdpConfig,
    OidcConfig,
    OperationalConfig,
    OptimizerConfig,
    OutgoingAuthConfig,
    RateLimitingConfig,
    SessionStorageConfig,
    TelemetryConfig,
    TasksConfig,
    TimeoutsConfig,
    TokenBucket,
    TokenExchangeConfig,
    ToolOverride,
    ToolRateLimit,
    VmcpConfig,
    WorkloadToolsConfig,
)

BACKEND_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
ENV_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Characters a prefix may add to tool names (MCP tool names: letters, digits, _ - .).
PREFIX_TEXT = re.compile(r"[A-Za-z0-9_.-]*")
# RFC 7230 token: the characters an HTTP header name may have.
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Visible ASCII, inner spaces and tabs only: no line breaks (header injection), no padding.
HEADER_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?")
# RFC 6749 scope-token.
SCOPE_TOKEN = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")

SIGNING_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
_HMAC = "HMAC with a public key would let anyone forge tokens"
# Lower-cased name -> why it is refused.
REFUSED_ALGORITHMS = {
    "none": "unsigned tokens would be accepted from anyone",
    "hs256": _HMAC,
    "hs384": _HMAC,
    "hs512": _HMAC,
}
MAX_CLOCK_SKEW = "5m"

_HOP_BY_HOP = "it is a hop-by-hop header, meant for one connection only"
_GATEWAY_SETS = "the gateway sets it on every request to a backend"
_GATEWAY_SESSION = "the gateway manages the MCP session with each backend"
# Lower-cased header name -> why the gateway will not send it on a config's say-so.
NOT_INJECTABLE_HEADERS = {
    "host": "the gateway sets it from the backend URL",
    "content-length": _GATEWAY_SETS,
    "content-type": _GATEWAY_SETS,
    "accept": _GATEWAY_SETS,
    "mcp-session-id": _GATEWAY_SESSION,
    "mcp-protocol-version": _GATEWAY_SESSION,
    "proxy-authorization": "it carries credentials for a proxy, not for the backend",
    "connection": _HOP_BY_HOP,
    "keep-alive": _HOP_BY_HOP,
    "proxy-authenticate": _HOP_BY_HOP,
    "te": _HOP_BY_HOP,
    "trailer": _HOP_BY_HOP,
    "transfer-encoding": _HOP_BY_HOP,
    "upgrade": _HOP_BY_HOP,
}
NOT_PASSED_THROUGH_HEADERS = {
    **NOT_INJECTABLE_HEADERS,
    "authorization": "it carries the caller's credentials for the gateway (outgoingAuth authenticates to backends)",
    "cookie": "it carries the caller's cookies for the gateway",
    "set-cookie": "it is a response header",
}

# Outgoing auth type -> the block that configures it.
AUTH_BLOCKS = {"header_injection": "headerInjection", "token_exchange": "tokenExchange"}
TOKEN_EXCHANGE_NEEDS_OIDC = ("token_exchange needs incomingAuth.type oidc or oauth (the caller's token, or the "
                             "identity provider's token of the caller, is the subject token)")

CONFLICT_RESOLUTIONS = ("prefix", "priority", "manual")
OVERRIDE_KEYS = ("name", "description", "annotations")


# --- fields -----------------------------------------------------------------------------


class _DurationPerName(_PlainMessages, fields.Field):
    """A mapping of name -> duration; errors are reported under each key."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> dict[str, float]:
        if not isinstance(value, Mapping):
            raise ValidationError("must be a mapping of backend name to duration")
        result: dict[str, float] = {}
        errors: dict[str, list[str]] = {}
        for key, raw in value.items():
            if not isinstance(key, str):
                errors[str(key)] = ["must be a backend name"]
                continue
            try:
                result[key] = parse_duration(raw)
            except ValueError as exc:
                errors[key] = [str(exc)]
        if errors:
            raise ValidationError(errors, valid_data=result)
        return result


class _SchemaPerName(_PlainMessages, fields.Field):
    """A mapping of name -> a mapping loaded with ``schema``; errors are reported under each key."""

    def __init__(self, schema: type[Schema], key_name: str = "backend name", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.schema = schema
        self.key_name = key_name

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ValidationError(f"must be a mapping of {self.key_name} to settings")
        result: dict[str, Any] = {}
        errors: dict[str, Any] = {}
        for key, raw in value.items():
            try:
                result[str(key)] = self.schema().load(raw)
            except ValidationError as err:
                errors[str(key)] = err.messages
                result[str(key)] = err.valid_data  # what loaded of it, for the checks across sections
        if errors:
            raise ValidationError(errors, valid_data=result)
        return result



class _HeaderName(validate.Validator):
    """An HTTP header name that is not in ``refused`` (lower-cased name -> why)."""

    def __init__(self, refused: Mapping[str, str]) -> None:
        self.refused = refused

    def __call__(self, value: str) -> str:
        # Not echoed when malformed: it may be a pasted "Name: secret" line.
        if not HEADER_NAME.fullmatch(value):
            raise ValidationError("must be an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)")
        reason = self.refused.get(value.lower())
        if reason:
            raise ValidationError(f"{value!r} is not allowed: {reason}")
        return value


class _NoDuplicates(validate.Validator):
    """A list validator: each repeat is reported at its own index, pointing at the first one."""

    def __init__(self, what: str, list_name: str, fold: Callable[[str], str] = str) -> None:
        self.what = what
        self.list_name = list_name
        self.fold = fold

    def __call__(self, values: list[str]) -> list[str]:
        first_index: dict[str, int] = {}
        errors: dict[int, list[str]] = {}
        for index, value in enumerate(values):
            key = self.fold(value)
            if key in first_index:
                errors[index] = [f"duplicate {self.what} {value!r} (also {self.list_name}[{first_index[key]}])"]
            else:
                first_index[key] = index
        if errors:
            raise ValidationError(errors)
        return values


def _algorithm(value: str) -> None:
    if value in SIGNING_ALGORITHMS:
        return
    reason = REFUSED_ALGORITHMS.get(value.lower())
    if reason:
        raise ValidationError(f"{value!r} is not allowed: {reason}")
    raise ValidationError(f"must be one of {', '.join(SIGNING_ALGORITHMS)}")


def _header_value(value: str) -> None:
    # Never echoed: this is a secret.
    if not value:
        raise ValidationError("must not be empty")
    if not HEADER_VALUE.fullmatch(value):
        raise ValidationError(
            "must be printable ASCII without line breaks or leading/trailing whitespace (value not shown)"
        )


def _scope(value: str) -> None:
    if not SCOPE_TOKEN.fullmatch(value):
        raise ValidationError("must be an OAuth scope: printable ASCII without spaces, '\"' or '\\'")


def _backend_name(value: str) -> None:
    if not BACKEND_NAME.fullmatch(value):
        raise ValidationError(
            "must be 1-63 letters, digits, '_' or '-', starting with a letter or digit"
        )


def _issuer(value: str) -> None:
    _http_url(value)
    parts = urlsplit(value)
    if parts.query or parts.fragment or "?" in value or "#" in value:
        # Discovery appends /.well-known/openid-configuration to it (OpenID Connect Discovery 4).
        raise ValidationError("must be an http(s) URL without ?query or #fragment")


def _resource_url(value: str) -> None:
    _http_url(value)
    if urlsplit(value).fragment or value.endswith("#"):
        raise ValidationError("must be an http(s) URL without a #fragment (RFC 9728)")


def _http_url(value: str) -> None:
    # The message never repeats the URL: its query string or user info may hold a secret.
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a bad port
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        ok = False
    if not ok or any(ch.isspace() for ch in value):
        raise ValidationError("must be an http(s) URL with a host")


def _host(value: str) -> None:
    if not value or any(ch.isspace() or ch in "/?#@" for ch in value):
        raise ValidationError("must be a host name, optionally with :port (not a URL)")


def _origin(value: str) -> None:
    message = "must be an origin like https://app.example.com (scheme, host, optional port)"
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise ValidationError(message) from None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or "@" in parts.netloc
        or any(ch.isspace() for ch in value)
    ):
        raise ValidationError(message)


def _prefix_format(value: str) -> None:
    if not value:
        raise ValidationError("must not be empty")
    try:
        pieces = list(string.Formatter().parse(value))
    except ValueError:
        raise ValidationError("unbalanced '{' or '}' (only {workload} is allowed)") from None
    for literal, field_name, format_spec, conversion in pieces:
        if not PREFIX_TEXT.fullmatch(literal):
            raise ValidationError(
                "may only contain letters, digits, '_', '-', '.' and the {workload} placeholder"
            )
        if field_name is None:
            continue
        if field_name != "workload" or format_spec or conversion:
            placeholder = "{" + field_name + (f"!{conversion}" if conversion else "")
            placeholder += (f":{format_spec}" if format_spec else "") + "}"
            raise ValidationError(f"unknown placeholder {placeholder} (only {{workload}} is allowed)")


def _env_var_name(value: str | None) -> None:
    # Not echoed: someone may have pasted the token itself here.
    if value is not None and not ENV_VAR_NAME.fullmatch(value):
        raise ValidationError(
            "must be an environment variable name (letters, digits and '_', not starting with a digit)"
        )


# --- schemas ----------------------------------------------------------------------------


def _no_nul(value: str) -> None:
    if "\0" in value:
        raise ValidationError("must not hold a NUL character")


def _not_blank_text(value: str) -> None:
    if not value.strip() or "\0" in value:
        raise ValidationError("must not be blank or hold a NUL character")


def _absolute_path(value: str) -> None:
    if not value.startswith("/") or "\0" in value:
        raise ValidationError("must be an absolute path (starting with /)")


class SandboxSchema(_StrictSchema):
    mode = _String(load_default="bubblewrap", validate=_Choice(list(SANDBOX_MODES), []))
    network = _Boolean(load_default=True)
    writable = _List(_String(validate=_absolute_path), load_default=tuple)
    hidden = _List(_String(validate=_absolute_path), load_default=tuple)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> SandboxConfig:
        return SandboxConfig(**data)


class BackendSchema(_StrictSchema):
    name = _String(required=True, validate=_backend_name)
    url = _String(load_default=None, allow_none=True, validate=_http_url)
    transport = _String(load_default=DEFAULT_TRANSPORT, validate=_Choice(list(TRANSPORTS), []))
    # Which MCP era the backend speaks: probed with server/discover (auto), or pinned.
    protocol = _String(load_default="auto", validate=_Choice(["auto", "modern", "legacy"], []))
    # A stdio backend: the program, looked up on PATH, and how it runs.
    command = _String(load_default=None, allow_none=True, validate=_not_blank_text)
    args = _List(_String(validate=_no_nul), load_default=tuple)
    env = fields.Dict(keys=_String(validate=_env_var_name), values=_String(validate=_no_nul), load_default=dict)
    cwd = _String(load_default=None, allow_none=True, validate=_not_blank_text)
    scope = _String(load_default="shared", validate=_Choice(["shared", "perUser", "perSession"], []))
    sandbox = fields.Nested(SandboxSchema, load_default=SandboxConfig)
    max_concurrent_calls = _Integer(data_key="maxConcurrentCalls", load_default=None, allow_none=True,
                                    validate=validate.Range(1, 10_000, error="must be between 1 and 10000"))

    @validates_schema(pass_original=True, skip_on_field_errors=False)
    def _check_transport_fields(self, data: Any, original_data: Any, **kwargs: Any) -> None:
        if not isinstance(original_data, Mapping):
            return
        transport = original_data.get("transport", DEFAULT_TRANSPORT)
        errors: dict[str, list[str]] = {}
        if transport == "stdio":
            if original_data.get("url") is not None:
                errors["url"] = ["must not be set for transport stdio (it runs command instead)"]
            if not original_data.get("command"):
                errors["command"] = ["is required for transport stdio"]
            if original_data.get("scope", "shared") == "shared":
                errors.update(_user_placeholders(original_data, "only a scope: perUser or perSession backend can use "
                                                 f"{USER_PLACEHOLDER} (a shared process serves every user)"))
        elif transport in TRANSPORTS:
            if original_data.get("url") is None:
                errors["url"] = [f"is required for transport {transport}"]
            for key in ("command", "args", "env", "cwd", "scope", "sandbox"):
                if key in original_data:
                    errors[key] = [f"is for transport stdio only (this backend's transport is {transport})"]
        if errors:
            raise ValidationError(errors)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> BackendConfig:
        return BackendConfig(**data)


def _user_placeholders(original: Mapping[str, Any], message: str) -> dict[str, list[str]]:
    """Where a shared stdio backend's args, env values or cwd use {user}."""
    found: dict[str, Any] = {}
    args = original.get("args")
    if isinstance(args, list):
        at = {index: [message] for index, arg in enumerate(args) if isinstance(arg, str) and USER_PLACEHOLDER in arg}
        if at:
            found["args"] = at
    env = original.get("env")
    if isinstance(env, Mapping):
        at = {name: [message] for name, value in env.items() if isinstance(value, str) and USER_PLACEHOLDER in value}
        if at:
            found["env"] = at
    cwd = original.get("cwd")
    if isinstance(cwd, str) and USER_PLACEHOLDER in cwd:
        found["cwd"] = [message]
    sandbox = original.get("sandbox")
    writable = sandbox.get("writable") if isinstance(sandbox, Mapping) else None
    if isinstance(writable, list):
        at = {index: [message] for index, path in enumerate(writable)
              if isinstance(path, str) and USER_PLACEHOLDER in path}
        if at:
            found["sandbox"] = {"writable": at}
    return found


class OidcSchema(_StrictSchema):
    issuer = _String(required=True, validate=_issuer)
    audience = _String(required=True, validate=_not_blank)
    jwks_url = _String(data_key="jwksUrl", load_default=None, allow_none=True, validate=_http_url)
    algorithms = _List(
        _String(validate=_algorithm),
        load_default=DEFAULT_ALGORITHMS,
        validate=[
            validate.Length(min=1, error="must list at least one algorithm"),
            _NoDuplicates("algorithm", "algorithms"),
        ],
    )
    clock_skew = _Duration(data_key="clockSkew", load_default=30.0, allow_zero=True, at_most=MAX_CLOCK_SKEW)
    resource_url = _String(data_key="resourceUrl", load_default=None, allow_none=True, validate=_resource_url)

    resource = _String(load_default=None, allow_none=True, validate=_resource_url)  # ToolHive's name
    introspection_url = _String(data_key="introspectionUrl", load_default=None, allow_none=True, validate=_http_url)
    client_id = _String(data_key="clientId", load_default=None, allow_none=True, validate=_not_blank)
    client_secret_env = _String(data_key="clientSecretEnv", load_default=None, allow_none=True,
                                validate=_env_var_name)
    scopes = _List(_String(validate=_not_blank), load_default=tuple)

    # ToolHive's fields for features this project has not built.
    insecure_allow_http = NotSupportedYet(data_key="insecureAllowHttp", hint=" (http issuers are accepted)")
    protected_resource_allow_private_ip = NotSupportedYet(data_key="protectedResourceAllowPrivateIp")

    @validates_schema
    def _one_resource(self, data: dict[str, Any], **kwargs: Any) -> None:
        resource, resource_url = data.get("resource"), data.get("resource_url")
        if resource and resource_url and resource != resource_url:
            raise ValidationError({"resource": ["resource and resourceUrl name the same thing: give one"]})
        if data.get("client_secret_env") and not data.get("client_id"):
            raise ValidationError({"clientSecretEnv": ["needs clientId"]})

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> OidcConfig:
        resource = data.pop("resource", None)
        data["resource_url"] = data.get("resource_url") or resource
        data["scopes"] = tuple(data["scopes"])
        return OidcConfig(**data)


def _entity_type(value: str) -> None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise ValidationError("must be a Cedar entity type name (letters, digits, _; no namespace)")


def _claim_name(value: str) -> None:
    if not value.strip() or value.startswith(".") or value.endswith(".") or ".." in value:
        raise ValidationError("must be a claim name, or a dotted path into nested claims (realm_access.roles)")


class AuthzSchema(_StrictSchema):
    """Policies are parsed here, so a policy that does not parse stops ``validate`` with
    its path and Cedar's own message."""

    type = _String(load_default="cedar", validate=_Choice(["cedar", "none"]))
    policies = _List(_String(), load_default=tuple)
    entities_json = _String(data_key="entitiesJson", load_default="[]")
    group_claim_name = _String(data_key="groupClaimName", load_default=None, allow_none=True, validate=_claim_name)
    role_claim_name = _String(data_key="roleClaimName", load_default=None, allow_none=True, validate=_claim_name)
    group_entity_type = _String(data_key="groupEntityType", load_default=DEFAULT_GROUP_ENTITY_TYPE,
                                validate=_entity_type)
    primary_upstream_provider = NotSupportedYet(
        data_key="primaryUpstreamProvider", hint=" (the principal is the caller of incomingAuth.oidc)")

    @validates_schema(skip_on_field_errors=False)
    def _check_policies(self, data: dict[str, Any], **kwargs: Any) -> None:
        from ._cedar import entities_problem, policy_problem  # cedarpy only when used

        errors: dict[str, Any] = {}
        policy_errors = {index: [problem] for index, policy in enumerate(data.get("policies") or ())
                         if (problem := policy_problem(policy)) is not None}
        if policy_errors:
            errors["policies"] = policy_errors
        if data.get("type") == "cedar" and "policies" in data and not data["policies"]:
            errors["policies"] = ["must list at least one Cedar policy for type cedar (without one, every "
                                  "request is denied)"]
        if isinstance(data.get("entities_json"), str) and (problem := entities_problem(data["entities_json"])):
            errors["entitiesJson"] = [problem]
        if errors:
            raise ValidationError(errors)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> AuthzConfig | None:
        if data["type"] == "none":
            return None
        data["policies"] = tuple(data["policies"])
        return AuthzConfig(**data)


def _https_or_loopback(value: str) -> None:
    """Tokens and codes travel to this URL: plain http only to this machine."""
    _issuer(value)
    parts = urlsplit(value)
    if parts.scheme == "http" and parts.hostname not in ("localhost", "127.0.0.1", "::1"):
        raise ValidationError("must be an https URL (http only for localhost, 127.0.0.1 or [::1])")


class UpstreamIdpSchema(_StrictSchema):
    issuer = _String(required=True, validate=_https_or_loopback)
    client_id = _String(data_key="clientId", required=True, validate=_not_blank)
    client_secret_env = _String(data_key="clientSecretEnv", required=True, validate=_env_var_name)
    scopes = _List(_String(validate=_scope), load_default=("openid",),
                   validate=validate.Length(min=1, error="must list at least one scope (openid)"))

    @validates("scopes")
    def _has_openid(self, value: Any, **kwargs: Any) -> None:
        if "openid" not in value:
            raise ValidationError("must include openid (the gateway reads who signed in from the ID token)")

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> UpstreamIdpConfig:
        data["scopes"] = tuple(data["scopes"])
        return UpstreamIdpConfig(**data)


class CimdSchema(_StrictSchema):
    enabled = _Boolean(load_default=True)
    allowed_hosts = _List(_String(validate=_host), data_key="allowedHosts", load_default=tuple)
    ca_bundle = _String(data_key="caBundle", load_default=None, allow_none=True, validate=_not_blank)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> CimdConfig:
        data["allowed_hosts"] = tuple(host.lower() for host in data["allowed_hosts"])
        return CimdConfig(**data)


# ToolHive's embedded authorization server's names for the same durations: (ToolHive's, ours, attribute).
OAUTH_ALIASES = (("accessTokenLifespan", "accessTokenTtl", "access_token_ttl"),
                 ("refreshTokenLifespan", "refreshTokenTtl", "refresh_token_ttl"),
                 ("authCodeLifespan", "authorizationCodeTtl", "authorization_code_ttl"))


class OAuthServerSchema(_StrictSchema):
    issuer = _String(required=True, validate=_https_or_loopback)
    upstream = _Nested(UpstreamIdpSchema, required=True)
    signing_key_env = _String(data_key="signingKeyEnv", required=True, validate=_env_var_name)
    previous_signing_key_envs = _List(_String(validate=_env_var_name), data_key="previousSigningKeyEnvs",
                                      load_default=tuple)
    access_token_ttl = _Duration(data_key="accessTokenTtl", load_default=3600.0, at_most="24h")
    refresh_token_ttl = _Duration(data_key="refreshTokenTtl", load_default=30 * 86400.0, at_most="8760h")
    refresh_grace_period = _Duration(data_key="refreshGracePeriod", load_default=30.0, allow_zero=True,
                                     at_most="10m")
    authorization_code_ttl = _Duration(data_key="authorizationCodeTtl", load_default=60.0, at_most="10m")
    consent_ttl = _Duration(data_key="consentTtl", load_default=30 * 86400.0, allow_zero=True, at_most="8760h")
    registrations_per_minute = _Integer(data_key="registrationsPerMinute", load_default=20,
                                        validate=validate.Range(min=1, error="must be at least 1"))
    cimd = _Nested(CimdSchema, load_default=CimdConfig)
    # ToolHive's names (errors name the field as written)
    access_token_lifespan = _Duration(data_key="accessTokenLifespan", load_default=None, at_most="24h")
    refresh_token_lifespan = _Duration(data_key="refreshTokenLifespan", load_default=None, at_most="8760h")
    auth_code_lifespan = _Duration(data_key="authCodeLifespan", load_default=None, at_most="10m")

    @validates_schema(pass_original=True, skip_on_field_errors=False)
    def _one_name_each(self, data: Any, original_data: Any, **kwargs: Any) -> None:
        if not isinstance(original_data, Mapping):
            return
        both = {alias: [f"{alias} and {name} name the same thing: give one"]
                for alias, name, _ in OAUTH_ALIASES if alias in original_data and name in original_data}
        if both:
            raise ValidationError(both)

    @validates_schema(skip_on_field_errors=True)
    def _grace_within_life(self, data: dict[str, Any], **kwargs: Any) -> None:
        life = data.get("refresh_token_lifespan") or data["refresh_token_ttl"]
        if data["refresh_grace_period"] >= life:
            raise ValidationError({"refreshGracePeriod": ["must be shorter than refreshTokenTtl"]})

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> OAuthServerConfig:
        for (_, _, attribute), alias in zip(OAUTH_ALIASES, ("access_token_lifespan", "refresh_token_lifespan",
                                                            "auth_code_lifespan")):
            given = data.pop(alias)
            if given is not None:
                data[attribute] = given
        data["issuer"] = data["issuer"].rstrip("/")
        data["previous_signing_key_envs"] = tuple(data["previous_signing_key_envs"])
        return OAuthServerConfig(**data)


INCOMING_AUTH_BLOCKS = {"oidc": "oidc", "oauth": "oauth"}


class IncomingAuthSchema(_StrictSchema):
    type = _String(load_default="anonymous", validate=_Choice(["anonymous", "oidc", "oauth"], ["local"]))
    oidc = _Nested(OidcSchema, load_default=None, allow_none=True)
    authz = _Nested(AuthzSchema, load_default=None, allow_none=True)
    oauth = _Nested(OAuthServerSchema, load_default=None, allow_none=True)

    @validates_schema(pass_original=True, skip_on_field_errors=False)
    def _check_oidc_block(self, data: Any, original_data: Any, **kwargs: Any) -> None:
        if not isinstance(original_data, Mapping):
            return
        kind = original_data.get("type", "anonymous")
        errors: dict[str, list[str]] = {}
        for block_type, key in INCOMING_AUTH_BLOCKS.items():
            has_block = original_data.get(key) is not None
            if kind == block_type and not has_block:
                errors[key] = [f"is required for type {kind}"]
            elif kind != block_type and has_block and kind in ("anonymous", *INCOMING_AUTH_BLOCKS):
                errors[key] = [f"must not be set for type {kind} (it is for type {block_type})"]
        if errors:
            raise ValidationError(errors)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> IncomingAuthConfig:
        return IncomingAuthConfig(**data)


class HeaderInjectionSchema(_StrictSchema):
    header_name = _String(data_key="headerName", required=True, validate=_HeaderName(NOT_INJECTABLE_HEADERS))
    header_value = _String(data_key="headerValue", load_default=None, allow_none=True, validate=_header_value)
    header_value_env = _String(data_key="headerValueEnv", load_default=None, allow_none=True, validate=_env_var_name)

    @validates_schema(pass_original=True, skip_on_field_errors=False)
    def _check_one_value(self, data: Any, original_data: Any, **kwargs: Any) -> None:
        if not isinstance(original_data, Mapping):
            return
        given = [key for key in ("headerValue", "headerValueEnv") if original_data.get(key) is not None]
        if len(given) == 2:
            raise ValidationError("set only one of headerValue and headerValueEnv")
        if not given:
            raise ValidationError("needs one of headerValueEnv or headerValue")

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> HeaderInjectionConfig:
        return HeaderInjectionConfig(**data)


class TokenExchangeSchema(_StrictSchema):
    token_url = _String(data_key="tokenUrl", required=True, validate=_http_url)
    client_id = _String(data_key="clientId", required=True, validate=_not_blank)
    client_secret_env = _String(data_key="clientSecretEnv", load_default=None, allow_none=True, validate=_env_var_name)
    audience = _String(load_default=None, allow_none=True, validate=_not_blank)
    scopes = _List(_String(validate=_scope), load_default=tuple)

    # ToolHive's fields for features this project has not built.
    client_secret = NotSupportedYet(data_key="clientSecret", hint=" (use clientSecretEnv)")
    subject_token_type = NotSupportedYet(data_key="subjectTokenType")
    subject_provider_name = NotSupportedYet(data_key="subjectProviderName")

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> TokenExchangeConfig:
        return TokenExchangeConfig(**data)


class BackendOAuthSchema(_StrictSchema):
    scopes = _List(_String(validate=_scope), load_default=tuple,
                   validate=_NoDuplicates("scope", "scopes"))
    client_id = _String(data_key="clientId", load_default=None, allow_none=True, validate=_not_blank)
    client_secret_env = _String(data_key="clientSecretEnv", load_default=None, allow_none=True,
                                validate=_env_var_name)
    issuer = _String(load_default=None, allow_none=True, validate=_https_or_loopback)
    resource = _String(load_default=None, allow_none=True, validate=_resource_url)

    @validates_schema(skip_on_field_errors=False)
    def _check_secret_has_client(self, data: dict[str, Any], **kwargs: Any) -> None:
        if data.get("client_secret_env") is not None and data.get("client_id") is None:
            raise ValidationError({"clientSecretEnv": ["needs clientId (the secret of a client registered at the "
                                                       "backend's authorization server)"]})

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> BackendOAuthConfig:
        return BackendOAuthConfig(**data)


class BackendAuthSchema(_StrictSchema):
    type = _String(
        load_default="unauthenticated",
        validate=_Choice(["unauthenticated", *AUTH_BLOCKS, "oauth"], ["upstream_inject", "aws_sts", "obo", "xaa"]),
    )
    header_injection = _Nested(HeaderInjectionSchema, data_key="headerInjection", load_default=None, allow_none=True)
    token_exchange = _Nested(TokenExchangeSchema, data_key="tokenExchange", load_default=None, allow_none=True)
    oauth = _Nested(BackendOAuthSchema, load_default=None, allow_none=True)
    token_env = _String(data_key="tokenEnv", load_default=None, allow_none=True, validate=_env_var_name)

    @validates_schema(pass_original=True, skip_on_field_errors=False)
    def _check_block_matches_type(self, data: Any, original_data: Any, **kwargs: Any) -> None:
        if not isinstance(original_data, Mapping):
            return
        kind = original_data.get("type", "unauthenticated")
        if kind not in ("unauthenticated", "oauth") and kind not in AUTH_BLOCKS:
            return  # the type itself is wrong; that error says enough
        errors: dict[str, list[str]] = {}
        if kind != "oauth" and original_data.get("oauth") is not None:
            errors["oauth"] = [f"must not be set for type {kind} (it is for type oauth)"]
        for block_type, key in AUTH_BLOCKS.items():
            has_block = original_data.get(key) is not None
            if kind == block_type and not has_block:
                errors[key] = [f"is required for type {kind}"]
            elif kind != block_type and has_block:
                errors[key] = [f"must not be set for type {kind} (it is for type {block_type})"]
        if errors:
            raise ValidationError(errors)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> BackendAuthConfig:
        if data["type"] == "oauth" and data["oauth"] is None:
            data["oauth"] = BackendOAuthConfig()
        return BackendAuthConfig(**data)


class OutgoingAuthSchema(_StrictSchema):
    default = _Nested(BackendAuthSchema, load_default=BackendAuthConfig)
    backends = _SchemaPerName(BackendAuthSchema, load_default=dict)
    passthrough_headers = _List(
        _String(validate=_HeaderName(NOT_PASSED_THROUGH_HEADERS)),
        data_key="passthroughHeaders",
        load_default=tuple,
        validate=_NoDuplicates("header", "passthroughHeaders", fold=str.lower),
    )
    # ToolHive's: inline (the config says it all) or discovered (from Kubernetes, not here).
    source = _String(load_default="inline", validate=_Choice(["inline"], ["discovered"],
                                                             hint=" (outside Kubernetes every backend is inline)"))

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> OutgoingAuthConfig:
        data.pop("source", None)
        return OutgoingAuthConfig(**data)


class ToolOverrideSchema(_StrictSchema):
    name = _String(validate=_tool_name)
    description = _String()
    annotations = _JsonMapping()

    @validates_schema(pass_original=True, skip_on_field_errors=False)
    def _check_sets_something(self, data: Any, original_data: Any, **kwargs: Any) -> None:
        if isinstance(original_data, Mapping) and not any(key in original_data for key in OVERRIDE_KEYS):
            raise ValidationError(f"must set at least one of {', '.join(OVERRIDE_KEYS)}")

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> ToolOverride:
        return ToolOverride(**data)


class WorkloadToolsSchema(_StrictSchema):
    workload = _String(required=True)  # must name a backend: checked by VmcpSchema
    filter = _List(_String(validate=_not_blank))
    exclude_all = _Boolean(data_key="excludeAll", load_default=False)
    overrides = _SchemaPerName(ToolOverrideSchema, key_name="tool name", load_default=dict)

    @validates_schema(pass_original=True, skip_on_field_errors=False)
    def _check_filter_or_exclude_all(self, data: Any, original_data: Any, **kwargs: Any) -> None:
        if not isinstance(original_data, Mapping):
            return
        if original_data.get("excludeAll") is True and "filter" in original_data:
            raise ValidationError(
                "filter and excludeAll true contradict each other (excludeAll hides every tool); keep one"
            )

    @validates_schema(pass_original=True, skip_on_field_errors=False)
    def _check_override_keys(self, data: Any, original_data: Any, **kwargs: Any) -> None:
        overrides = original_data.get("overrides") if isinstance(original_data, Mapping) else None
        if isinstance(overrides, Mapping) and "" in overrides:
            # Said of the mapping: an error under the key "" would print as a path ending in a dot.
            raise ValidationError({"overrides": ["keys must be tool names, not empty"]})

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> WorkloadToolsConfig:
        tools = WorkloadToolsConfig(**data)
        problems = _rename_problems(tools)
        if problems:
            raise ValidationError(problems)
        return tools


def _rename_problems(tools: WorkloadToolsConfig) -> dict[str, Any]:
    """Overrides of one backend that rename two tools alike."""
    renames = tools.renames()
    errors: dict[str, Any] = {}
    first_with_name: dict[str, str] = {}
    clashes: dict[str, dict[str, list[str]]] = {}
    for original, new in renames.items():
        if new in first_with_name:
            clashes[original] = {"name": [f"{new!r} is also the new name of {first_with_name[new]!r}"]}
        else:
            first_with_name[new] = original
    if clashes:
        errors["overrides"] = clashes
    return errors


class ConflictResolutionConfigSchema(_StrictSchema):
    prefix_format = _String(data_key="prefixFormat", load_default=DEFAULT_PREFIX_FORMAT, validate=_prefix_format)
    # Entries must name backends: checked by VmcpSchema.
    priority_order = _List(
        _String(), data_key="priorityOrder", load_default=tuple, validate=_NoDuplicates("backend", "priorityOrder")
    )


class AggregationSchema(_StrictSchema):
    conflict_resolution = _String(
        data_key="conflictResolution",
        load_default="prefix",
        validate=_Choice(CONFLICT_RESOLUTIONS),
    )
    conflict_resolution_config = _Nested(
        ConflictResolutionConfigSchema,
        data_key="conflictResolutionConfig",
        load_default=lambda: {"prefix_format": DEFAULT_PREFIX_FORMAT, "priority_order": ()},
    )
    exclude_all_tools = _Boolean(data_key="excludeAllTools", load_default=False)
    tools = _List(_Nested(WorkloadToolsSchema), load_default=tuple)

    # The checks below read what loaded (see ``_loaded``), so they run beside field errors.
    @validates_schema(skip_on_field_errors=False)
    def _check_priority_order(self, data: dict[str, Any], **kwargs: Any) -> None:
        # priorityOrder under another strategy is allowed (ToolHive files carry it, as does
        # the contract example) and reported by config_warnings instead.
        order = _loaded(data.get("conflict_resolution_config"), "priority_order")
        if data.get("conflict_resolution") == "priority" and order is not None and not order:
            raise ValidationError(
                {"conflictResolutionConfig": {"priorityOrder": ["is required for conflictResolution priority"]}}
            )

    @validates_schema(skip_on_field_errors=False)
    def _check_workloads(self, data: dict[str, Any], **kwargs: Any) -> None:
        listed = data.get("tools") or ()
        errors: dict[int, Any] = {}
        first_index: dict[str, int] = {}
        for index, entry in enumerate(listed):
            workload = _loaded(entry, "workload")
            if workload is None:
                continue
            if workload in first_index:
                errors[index] = {"workload": [f"duplicate workload {workload!r} (also tools[{first_index[workload]}])"]}
            else:
                first_index[workload] = index

        # Under manual nothing separates two backends' tools, so renames must not collide.
        if data.get("conflict_resolution") == "manual":
            claimed: dict[str, tuple[str, str]] = {}  # new name -> (workload, original tool)
            for workload, index in first_index.items():
                if not isinstance(listed[index], WorkloadToolsConfig):
                    continue  # its own errors come first
                own: dict[str, str] = {}
                for original, new in listed[index].renames().items():
                    if new in claimed:
                        other_workload, other_tool = claimed[new]
                        message = (
                            f"{new!r} clashes with {other_workload}'s override of {other_tool!r} "
                            "(manual conflict resolution)"
                        )
                        errors.setdefault(index, {}).setdefault("overrides", {})[original] = {"name": [message]}
                    own.setdefault(new, original)
                for new, original in own.items():
                    claimed.setdefault(new, (workload, original))
        if errors:
            raise ValidationError({"tools": errors})

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> AggregationConfig:
        settings = data["conflict_resolution_config"]
        return AggregationConfig(
            conflict_resolution=data["conflict_resolution"],
            prefix_format=settings["prefix_format"],
            priority_order=tuple(settings["priority_order"]),
            exclude_all_tools=data["exclude_all_tools"],
            tools=tuple(data["tools"]),
        )


class TimeoutsSchema(_StrictSchema):
    default = _Duration(load_default=30.0)
    per_workload = _DurationPerName(data_key="perWorkload", load_default=dict)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> TimeoutsConfig:
        return TimeoutsConfig(**data)


class DiscoveryBudgetSchema(_StrictSchema):
    default = _Duration(load_default=DISCOVERY_BUDGET)
    per_workload = _DurationPerName(data_key="perWorkload", load_default=dict)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> TimeoutsConfig:
        return TimeoutsConfig(**data)


class CircuitBreakerSchema(_StrictSchema):
    enabled = _Boolean(load_default=False)
    failure_threshold = _Integer(data_key="failureThreshold", load_default=5,
                                 validate=validate.Range(1, 1000, error="must be between 1 and 1000"))
    timeout = _Duration(load_default=60.0)

    @validates_schema
    def _timeout_at_least_a_second(self, data: dict[str, Any], **kwargs: Any) -> None:
        if data.get("timeout", 60.0) < 1.0:
            raise ValidationError({"timeout": ["must be at least 1s (a shorter one makes the circuit thrash)"]})

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> CircuitBreakerConfig:
        return CircuitBreakerConfig(**data)


# ToolHive spells it best_effort; bestEffort is accepted as the same mode.
_PARTIAL_FAILURE_MODES = {"fail": "fail", "best_effort": "best_effort", "bestEffort": "best_effort"}


class FailureHandlingSchema(_StrictSchema):
    health_check_interval = _Duration(data_key="healthCheckInterval", load_default=30.0)
    # Default: 10s, or the interval when that is shorter.
    health_check_timeout = _Duration(data_key="healthCheckTimeout", load_default=None, allow_none=True)
    unhealthy_threshold = _Integer(data_key="unhealthyThreshold", load_default=3,
                                   validate=validate.Range(1, 1000, error="must be between 1 and 1000"))
    # Reported to Kubernetes by ToolHive; accepted so its files load, with a warning.
    status_reporting_interval = _Duration(data_key="statusReportingInterval", load_default=None, allow_none=True)
    partial_failure_mode = _String(data_key="partialFailureMode", load_default="best_effort",
                                   validate=_Choice(list(_PARTIAL_FAILURE_MODES)))
    circuit_breaker = _Nested(CircuitBreakerSchema, data_key="circuitBreaker", load_default=CircuitBreakerConfig)

    @validates_schema
    def _timeout_within_interval(self, data: dict[str, Any], **kwargs: Any) -> None:
        timeout = data.get("health_check_timeout")
        if timeout is not None and timeout > data.get("health_check_interval", 30.0):
            raise ValidationError({"healthCheckTimeout": ["must not be longer than healthCheckInterval "
                                                          "(checks would queue up)"]})

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> FailureHandlingConfig:
        data.pop("status_reporting_interval", None)
        if data["health_check_timeout"] is None:
            data["health_check_timeout"] = min(10.0, data["health_check_interval"])
        data["partial_failure_mode"] = _PARTIAL_FAILURE_MODES[data["partial_failure_mode"]]
        return FailureHandlingConfig(**data)


class AuditSchema(_StrictSchema):
    enabled = _Boolean(load_default=False)
    component = _String(load_default="vmcp-actors", validate=_not_blank)
    event_types = _List(_String(validate=_Choice(AUDIT_EVENT_TYPES)), data_key="eventTypes", load_default=tuple)
    exclude_event_types = _List(_String(validate=_Choice(AUDIT_EVENT_TYPES)), data_key="excludeEventTypes",
                                load_default=tuple)
    include_request_data = _Boolean(data_key="includeRequestData", load_default=False)
    include_response_data = _Boolean(data_key="includeResponseData", load_default=False)
    max_data_size = _Integer(data_key="maxDataSize", load_default=1024,
                             validate=validate.Range(1, 1_048_576, error="must be between 1 and 1048576"))
    log_file = _String(data_key="logFile", load_default=None, allow_none=True, validate=_not_blank)
    # ToolHive's: JSON-RPC errors in 200 answers are always detected here.
    detect_application_errors = _Boolean(data_key="detectApplicationErrors", load_default=True)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> AuditConfig:
        data.pop("detect_application_errors")
        data["event_types"] = tuple(data["event_types"])
        data["exclude_event_types"] = tuple(data["exclude_event_types"])
        return AuditConfig(**data)


class TelemetrySchema(_StrictSchema):
    # A URL, or ToolHive's host:port (http with insecure, else https).
    endpoint = _String(load_default=None, allow_none=True, validate=_not_blank)
    service_name = _String(data_key="serviceName", load_default="vmcp-actors", validate=_not_blank)
    service_version = _String(data_key="serviceVersion", load_default=None, allow_none=True)
    tracing_enabled = _Boolean(data_key="tracingEnabled", load_default=False)
    metrics_enabled = _Boolean(data_key="metricsEnabled", load_default=False)
    sampling_rate = fields.Float(data_key="samplingRate", load_default=1.0,
                                 validate=validate.Range(0.0, 1.0, error="must be between 0 and 1"))
    headers = fields.Dict(keys=_String(validate=_not_blank), values=_String(), load_default=dict)
    insecure = _Boolean(load_default=False)
    enable_prometheus_metrics_path = _Boolean(data_key="enablePrometheusMetricsPath", load_default=True)

    @validates_schema
    def _endpoint_for_traces(self, data: dict[str, Any], **kwargs: Any) -> None:
        endpoint = data.get("endpoint")
        if data.get("tracing_enabled") and not endpoint:
            raise ValidationError({"endpoint": ["tracingEnabled needs the OTLP endpoint to send traces to"]})
        if endpoint:
            try:
                _http_url(_endpoint_url(endpoint, data.get("insecure", False)))
            except ValidationError:
                raise ValidationError({"endpoint": ["must be an http(s) URL or host:port"]}) from None

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> TelemetryConfig:
        if data.get("endpoint"):
            data["endpoint"] = _endpoint_url(data["endpoint"], data["insecure"])
        return TelemetryConfig(**data)


def _endpoint_url(endpoint: str, insecure: bool) -> str:
    """ToolHive's ``host:port`` form as a URL: http when ``insecure``, else https."""
    if "://" in endpoint:
        return endpoint
    return ("http://" if insecure else "https://") + endpoint


class TasksSchema(_StrictSchema):
    result_ttl = _Duration(data_key="resultTTL", load_default=3600.0, at_most="168h")
    max_live_per_user = _Integer(data_key="maxLivePerUser", load_default=20,
                                 validate=validate.Range(1, 10_000, error="must be between 1 and 10000"))
    max_live_per_worker = _Integer(data_key="maxLivePerWorker", load_default=2000,
                                   validate=validate.Range(1, 20_000, error="must be between 1 and 20000"))
    poll_interval = _Duration(data_key="pollInterval", load_default=1.0, at_most="1m")

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> TasksConfig:
        return TasksConfig(**data)


class TokenBucketSchema(_StrictSchema):
    max_tokens = _Integer(data_key="maxTokens", required=True,
                          validate=validate.Range(1, 1_000_000_000, error="must be between 1 and 1000000000"))
    refill_period = _Duration(data_key="refillPeriod", required=True, at_most="8760h")

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> TokenBucket:
        return TokenBucket(**data)


def _global_or_shared(data: dict[str, Any]) -> TokenBucket | None:
    """ToolHive's ``global``, or ``shared`` (its older name for the same bucket)."""
    if data.get("global_") is not None and data.get("shared") is not None:
        raise ValidationError({"shared": ["is the older name of global: set one of them"]})
    return data.get("global_") if data.get("global_") is not None else data.get("shared")


class ToolRateLimitSchema(_StrictSchema):
    name = _String(required=True, validate=_not_blank)
    global_ = _Nested(TokenBucketSchema, data_key="global", load_default=None, allow_none=True)
    shared = _Nested(TokenBucketSchema, load_default=None, allow_none=True)
    per_user = _Nested(TokenBucketSchema, data_key="perUser", load_default=None, allow_none=True)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> ToolRateLimit:
        shared = _global_or_shared(data)
        if shared is None and data.get("per_user") is None:
            raise ValidationError({"name": ["limits nothing: give it global (or shared), perUser, or both"]})
        return ToolRateLimit(name=data["name"], shared=shared, per_user=data.get("per_user"))


class RateLimitingSchema(_StrictSchema):
    global_ = _Nested(TokenBucketSchema, data_key="global", load_default=None, allow_none=True)
    shared = _Nested(TokenBucketSchema, load_default=None, allow_none=True)
    per_user = _Nested(TokenBucketSchema, data_key="perUser", load_default=None, allow_none=True)
    tools = _List(_Nested(ToolRateLimitSchema), load_default=tuple)
    on_store_error = _String(data_key="onStoreError", load_default="allow", validate=_Choice(["allow", "refuse"]))

    @validates("tools")
    def _check_unique_tools(self, tools: list[Any], **kwargs: Any) -> None:
        seen: dict[str, int] = {}
        errors: dict[int, dict[str, list[str]]] = {}
        for index, tool in enumerate(tools):
            if not isinstance(tool, ToolRateLimit):
                continue
            if tool.name in seen:
                errors[index] = {"name": [f"duplicate tool {tool.name!r} (also tools[{seen[tool.name]}])"]}
            seen.setdefault(tool.name, index)
        if errors:
            raise ValidationError(errors)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> RateLimitingConfig:
        return RateLimitingConfig(shared=_global_or_shared(data), per_user=data.get("per_user"),
                                  tools=tuple(data["tools"]), on_store_error=data["on_store_error"])


class OperationalSchema(_StrictSchema):
    timeouts = _Nested(TimeoutsSchema, load_default=TimeoutsConfig)
    session_ttl = _Duration(data_key="sessionTTL", load_default=1800.0)
    page_size = _Integer(
        data_key="pageSize", load_default=100, validate=validate.Range(1, 10_000, error="must be between 1 and 10000")
    )
    max_request_body_bytes = _Integer(
        data_key="maxRequestBodyBytes",
        load_default=4 * 1024 * 1024,
        validate=validate.Range(min=1024, error="must be at least 1024"),
    )
    allowed_hosts = _List(_String(validate=_host), data_key="allowedHosts", load_default=tuple)
    allowed_origins = _List(_String(validate=_origin), data_key="allowedOrigins", load_default=tuple)
    discovery_cache_ttl = _Duration(data_key="discoveryCacheTTL", load_default=30.0, allow_zero=True)
    user_idle_timeout = _Duration(data_key="userIdleTimeout", load_default=300.0)
    signing_key_env = _String(data_key="signingKeyEnv", load_default=None, allow_none=True, validate=_env_var_name)
    max_sessions = _Integer(data_key="maxSessions", load_default=1000,
                            validate=validate.Range(1, 1_000_000, error="must be between 1 and 1000000"))
    max_sessions_per_identity = _Integer(
        data_key="maxSessionsPerIdentity", load_default=0,
        validate=validate.Range(0, 1_000_000, error="must be between 0 (no cap of its own) and 1000000"))
    shutdown_grace_period = _Duration(data_key="shutdownGracePeriod", load_default=30.0, at_most="1h")
    failure_handling = _Nested(FailureHandlingSchema, data_key="failureHandling", load_default=None,
                               allow_none=True)
    max_live_users = _Integer(data_key="maxLiveUsers", load_default=1000,
                              validate=validate.Range(1, 100_000, error="must be between 1 and 100000"))
    max_processes = _Integer(data_key="maxProcesses", load_default=50,
                             validate=validate.Range(1, 10_000, error="must be between 1 and 10000"))
    process_idle_timeout = _Duration(data_key="processIdleTimeout", load_default=600.0)
    tasks = _Nested(TasksSchema, load_default=TasksConfig)
    discovery_budget = _Nested(DiscoveryBudgetSchema, data_key="discoveryBudget",
                               load_default=lambda: TimeoutsConfig(DISCOVERY_BUDGET))
    public_url = _String(data_key="publicUrl", load_default=None, allow_none=True, validate=_https_or_loopback)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> OperationalConfig:
        data["allowed_origins"] = tuple(origin.rstrip("/") for origin in data["allowed_origins"])
        return OperationalConfig(**data)


class AdminSchema(_StrictSchema):
    token_env = _String(data_key="tokenEnv", load_default=None, allow_none=True, validate=_env_var_name)
    metrics_token_env = _String(data_key="metricsTokenEnv", load_default=None, allow_none=True,
                                validate=_env_var_name)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> AdminConfig:
        return AdminConfig(**data)


def _host_port(value: str) -> None:
    host, colon, port = value.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in value:
        raise ValidationError("must be host:port (127.0.0.1:6379, redis.internal:6379, [::1]:6379)")


class SessionStorageSchema(_StrictSchema):
    provider = _String(load_default="memory", validate=_Choice(["memory", "redis"]))
    address = _String(load_default="127.0.0.1:6379", validate=_host_port)
    db = _Integer(load_default=0, validate=validate.Range(0, 15, error="must be between 0 and 15"))
    key_prefix = _String(data_key="keyPrefix", load_default="vmcp:", validate=_not_blank)
    password_env = _String(data_key="passwordEnv", load_default=None, allow_none=True, validate=_env_var_name)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> SessionStorageConfig:
        return SessionStorageConfig(**data)


EMBEDDING_FIELDS = ("embeddingService", "embeddingServiceTimeout", "embeddingProvider", "embeddingModel",
                    "embeddingHeaders", "hybridSearchSemanticRatio", "semanticDistanceThreshold")


class OptimizerSchema(_StrictSchema):
    """ToolHive's field names. The embedding fields load (ToolHive configs carry them) and
    are reported by ``config_warnings``: ranking here is BM25 over the tools' words."""

    max_tools_to_return = _Integer(data_key="maxToolsToReturn", load_default=DEFAULT_MAX_TOOLS_TO_RETURN,
                                   validate=validate.Range(1, 50, error="must be between 1 and 50"))
    embedding_service = fields.Raw(data_key="embeddingService", load_default=None)
    embedding_service_timeout = fields.Raw(data_key="embeddingServiceTimeout", load_default=None)
    embedding_provider = fields.Raw(data_key="embeddingProvider", load_default=None)
    embedding_model = fields.Raw(data_key="embeddingModel", load_default=None)
    embedding_headers = fields.Raw(data_key="embeddingHeaders", load_default=None)
    hybrid_search_semantic_ratio = fields.Raw(data_key="hybridSearchSemanticRatio", load_default=None)
    semantic_distance_threshold = fields.Raw(data_key="semanticDistanceThreshold", load_default=None)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> OptimizerConfig:
        ignored = tuple(key for key, attribute in zip(EMBEDDING_FIELDS, (
            "embedding_service", "embedding_service_timeout", "embedding_provider", "embedding_model",
            "embedding_headers", "hybrid_search_semantic_ratio", "semantic_distance_threshold"))
            if data.get(attribute) is not None)
        return OptimizerConfig(max_tools_to_return=data["max_tools_to_return"], ignored=ignored)


class _ByteSize(fields.Field):
    """Bytes: an integer, or a string with a binary unit (``64Mi``, ``512Ki``, ``1Gi``)."""

    UNITS = {"": 1, "Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3}

    def __init__(self, *, least: int, most: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.least, self.most = least, most

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        size = None
        if isinstance(value, int) and not isinstance(value, bool):
            size = value
        elif isinstance(value, str):
            found = re.fullmatch(r"\s*(\d+)\s*(Ki|Mi|Gi)?B?\s*", value)
            if found:
                size = int(found.group(1)) * self.UNITS[found.group(2) or ""]
        if size is None:
            raise ValidationError("must be a size in bytes: an integer, or a number with Ki, Mi or Gi (64Mi)")
        if not self.least <= size <= self.most:
            raise ValidationError(f"must be between {self.least} and {self.most} bytes")
        return size


class _Refused(fields.Field):
    """A field some configs carry that means nothing here: any value is an error saying why."""

    def __init__(self, why: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.why = why

    def deserialize(self, value: Any, attr: str | None = None, data: Any = None, **kwargs: Any) -> Any:
        if value is missing:
            return missing
        raise ValidationError(self.why)


def _tool_pattern(value: str) -> None:
    if not value.strip() or any(ch.isspace() for ch in value):
        raise ValidationError("must be a tool name or an fnmatch pattern (github_*), without spaces")


class CodeModeSchema(_StrictSchema):
    """ToolHive's field names where they fit (``parallelMaxConcurrency``,
    ``toolCallTimeout``); the sandbox's own limits beside them."""

    enabled = _Boolean(load_default=False)
    listing = _String(load_default="scripts", validate=_Choice(CODE_MODE_LISTINGS))
    tools = _List(_String(validate=_tool_pattern), load_default=lambda: ["*"],
                  validate=validate.Length(min=1, error="must name at least one tool or pattern"))
    timeout = _Duration(load_default=60.0, at_most="1h")
    execution_time = _Duration(data_key="executionTime", load_default=5.0, at_most="10m")
    tool_call_timeout = _Duration(data_key="toolCallTimeout", load_default=30.0, at_most="1h")
    max_tool_calls = _Integer(data_key="maxToolCalls", load_default=100,
                              validate=validate.Range(1, 10_000, error="must be between 1 and 10000"))
    parallel_max_concurrency = _Integer(data_key="parallelMaxConcurrency", load_default=8,
                                        validate=validate.Range(1, 64, error="must be between 1 and 64"))
    max_memory = _ByteSize(data_key="maxMemory", load_default=64 * 1024 ** 2, least=1024 ** 2, most=4 * 1024 ** 3)
    max_recursion_depth = _Integer(data_key="maxRecursionDepth", load_default=200,
                                   validate=validate.Range(10, 10_000, error="must be between 10 and 10000"))
    max_script_size = _ByteSize(data_key="maxScriptSize", load_default=64 * 1024, least=64, most=1024 ** 2)
    max_concurrent_scripts = _Integer(data_key="maxConcurrentScripts", load_default=4,
                                      validate=validate.Range(1, 256, error="must be between 1 and 256"))
    task_after = _Duration(data_key="taskAfter", load_default=2.0, allow_zero=True, at_most="1h")
    worker_isolation = _String(data_key="workerIsolation", load_default="bubblewrap",
                               validate=_Choice(WORKER_ISOLATIONS))
    step_limit = _Refused("the sandbox counts no steps: its code's running time is limited by "
                          "codeMode.executionTime (and memory by maxMemory)", data_key="stepLimit")

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> CodeModeConfig:
        data.pop("step_limit", None)
        return CodeModeConfig(**{**data, "tools": tuple(data["tools"])})


class VmcpSchema(_StrictSchema):
    name = _String(required=True, validate=_not_blank)
    backends = _List(
        _Nested(BackendSchema),
        required=True,
        validate=validate.Length(min=1, error="must list at least one backend"),
    )
    incoming_auth = _Nested(IncomingAuthSchema, data_key="incomingAuth", load_default=IncomingAuthConfig)
    aggregation = _Nested(AggregationSchema, load_default=AggregationConfig)
    operational = _Nested(OperationalSchema, load_default=OperationalConfig)
    admin = _Nested(AdminSchema, load_default=AdminConfig)
    outgoing_auth = _Nested(OutgoingAuthSchema, data_key="outgoingAuth", load_default=OutgoingAuthConfig)

    composite_tools = _List(_Nested(CompositeToolSchema), data_key="compositeTools", load_default=tuple)
    composite_tool_refs = NotSupportedYet(data_key="compositeToolRefs")
    # ToolHive's operator resolves an MCPGroup in Kubernetes; here backends are listed.
    group_ref = NotSupportedYet(data_key="groupRef", hint=" outside ToolHive's Kubernetes operator: list the "
                                                           "group's servers under backends (name and url each)")
    telemetry = _Nested(TelemetrySchema, load_default=TelemetryConfig)
    optimizer = _Nested(OptimizerSchema, load_default=None, allow_none=True)
    code_mode = _Nested(CodeModeSchema, data_key="codeMode", load_default=CodeModeConfig)
    session_storage = _Nested(SessionStorageSchema, data_key="sessionStorage", load_default=SessionStorageConfig)
    audit = _Nested(AuditSchema, load_default=AuditConfig)
    rate_limiting = _Nested(RateLimitingSchema, data_key="rateLimiting", load_default=None, allow_none=True)

    # These read what the sections loaded (see ``_loaded``), so they run even when fields
    # failed and their lines join the other errors.
    @validates_schema(skip_on_field_errors=False)
    def _check_backend_references(self, data: dict[str, Any], **kwargs: Any) -> None:
        names = _backend_names(data)
        if names is None:
            return
        errors: dict[str, Any] = {}
        first_index: dict[str, int] = {}
        duplicates: dict[int, dict[str, list[str]]] = {}
        for index, name in enumerate(names):
            if name is None:
                continue
            if name in first_index:
                message = f"duplicate backend name {name!r} (also backends[{first_index[name]}])"
                duplicates[index] = {"name": [message]}
            else:
                first_index[name] = index
        if duplicates:
            errors["backends"] = duplicates
        # A backend whose name did not load may be the one a reference means: judge none then.
        if None not in names:
            errors.update(_unknown_backend_references(data, set(first_index)))
        if errors:
            raise ValidationError(errors)

    @validates_schema(skip_on_field_errors=False)
    def _check_token_exchange_has_a_subject_token(self, data: dict[str, Any], **kwargs: Any) -> None:
        if _loaded(data.get("incoming_auth"), "type") != "anonymous":
            return  # oidc provides the subject token; a wrong type is reported by itself
        outgoing = data.get("outgoing_auth")
        errors: dict[str, Any] = {}
        if _loaded(_loaded(outgoing, "default"), "type") == "token_exchange":
            errors["default"] = {"type": [TOKEN_EXCHANGE_NEEDS_OIDC]}
        offending = {
            name: {"type": [TOKEN_EXCHANGE_NEEDS_OIDC]}
            for name, auth in (_loaded(outgoing, "backends") or {}).items()
            if _loaded(auth, "type") == "token_exchange"
        }
        if offending:
            errors["backends"] = offending
        if errors:
            raise ValidationError({"outgoingAuth": errors})

    @validates_schema(skip_on_field_errors=False)
    def _check_personal_oauth(self, data: dict[str, Any], **kwargs: Any) -> None:
        """``type: oauth`` stores each person's authorization: it needs callers who are
        people, a public URL for connect links, and a way to sign the browser's person in."""
        outgoing = data.get("outgoing_auth")
        if not isinstance(outgoing, OutgoingAuthConfig):
            return
        named = [name for name, auth in outgoing.backends.items() if auth.type == "oauth"]
        if outgoing.default.type == "oauth":
            named.append("")
        if not named:
            return
        incoming = data.get("incoming_auth")
        kind = _loaded(incoming, "type")
        errors: dict[str, Any] = {}
        if kind == "anonymous":
            message = ["type oauth needs incomingAuth.type oidc or oauth: with anonymous callers every caller "
                       "would act as the one person who connected"]
            for name in named:
                if name:
                    errors.setdefault("outgoingAuth", {}).setdefault("backends", {})[name] = {"type": message}
                else:
                    errors.setdefault("outgoingAuth", {})["default"] = {"type": message}
        elif kind == "oidc" and isinstance(incoming, IncomingAuthConfig) and incoming.oidc is not None:
            if incoming.oidc.client_id is None or incoming.oidc.client_secret_env is None:
                errors["incomingAuth"] = {"oidc": {"clientId": [
                    "clientId and clientSecretEnv are required when a backend's outgoingAuth is type oauth: the "
                    "connect page signs the browser's person in at the identity provider, to check they are the "
                    "caller who asked"]}}
            operational = data.get("operational")
            if isinstance(operational, OperationalConfig) and operational.public_url is None:
                errors["operational"] = {"publicUrl": [
                    "is required when a backend's outgoingAuth is type oauth and incomingAuth is oidc: connect "
                    "links and the OAuth callback point there"]}
        if errors:
            raise ValidationError(errors)

    @validates_schema(skip_on_field_errors=False)
    def _check_process_credentials(self, data: dict[str, Any], **kwargs: Any) -> None:
        """A stdio backend's credential goes into its child's environment (tokenEnv), a
        user's own one only into a perUser child; tokenEnv is for stdio backends only."""
        outgoing = data.get("outgoing_auth")
        if not isinstance(outgoing, OutgoingAuthConfig):
            return
        errors: dict[str, Any] = {}
        for backend in data.get("backends") or ():
            if not isinstance(backend, BackendConfig):
                continue
            auth = outgoing.for_backend(backend.name)
            where = backend.name in outgoing.backends
            problem = _process_credential_problem(backend, auth, where)
            if problem is not None:
                key, message = problem
                if where:
                    errors.setdefault("backends", {})[backend.name] = {key: [message]}
                else:  # the default applies to it
                    errors.setdefault("default", {}).setdefault(key, []).append(message)
        if errors:
            raise ValidationError({"outgoingAuth": errors})

    @validates_schema(skip_on_field_errors=False)
    def _check_composite_tools(self, data: dict[str, Any], **kwargs: Any) -> None:
        aggregation = data.get("aggregation")
        errors = composite_reference_problems(
            data.get("composite_tools") or (),
            aggregation if isinstance(aggregation, AggregationConfig) else None,
            {name for name in _backend_names(data) or () if name is not None},
        )
        if errors:
            raise ValidationError(errors)

    @validates_schema(skip_on_field_errors=False)
    def _check_code_mode_combinations(self, data: dict[str, Any], **kwargs: Any) -> None:
        """The combinations that cannot mean what they say (docs/configuration.md lists all)."""
        code_mode = data.get("code_mode")
        if not isinstance(code_mode, CodeModeConfig) or not code_mode.enabled:
            return
        errors: dict[str, Any] = {}
        if code_mode.listing == "all" and data.get("optimizer") is not None:
            errors["codeMode"] = {"listing": ["'all' lists every tool, which the optimizer replaces with find_tool "
                                              "and call_tool: use listing: scripts (scripts then call the tools "
                                              "find_tool names), or drop the optimizer"]}
        taken = {index: {"name": [f"{name!r} is code mode's own tool (codeMode.enabled): rename the composite"]}
                 for index, composite in enumerate(data.get("composite_tools") or ())
                 if (name := _loaded(composite, "name")) in CODE_MODE_TOOL_NAMES}
        if taken:
            errors["compositeTools"] = taken
        if errors:
            raise ValidationError(errors)

    @validates_schema(skip_on_field_errors=False)
    def _check_per_user_limits_have_users(self, data: dict[str, Any], **kwargs: Any) -> None:
        """A perUser bucket needs callers told apart: incoming auth that names them."""
        limits = data.get("rate_limiting")
        if not isinstance(limits, RateLimitingConfig) or _loaded(data.get("incoming_auth"), "type") != "anonymous":
            return
        message = "needs incomingAuth that names callers (type oidc or oauth): anonymous callers are one user"
        errors: dict[str, Any] = {}
        if limits.per_user is not None:
            errors["perUser"] = [message]
        tools = {index: {"perUser": [message]} for index, tool in enumerate(limits.tools) if tool.per_user is not None}
        if tools:
            errors["tools"] = tools
        if errors:
            raise ValidationError({"rateLimiting": errors})

    @validates_schema(skip_on_field_errors=False)
    def _check_limited_tools_can_be_advertised(self, data: dict[str, Any], **kwargs: Any) -> None:
        limits, aggregation = data.get("rate_limiting"), data.get("aggregation")
        backends = _backend_names(data)
        if not isinstance(limits, RateLimitingConfig) or not isinstance(aggregation, AggregationConfig) \
                or backends is None or None in backends:
            return
        composites = [_loaded(composite, "name") for composite in data.get("composite_tools") or ()]
        if None in composites:
            return  # a composite whose name did not load may be the one a limit means
        outgoing = data.get("outgoing_auth")
        code_mode = data.get("code_mode")
        if isinstance(code_mode, CodeModeConfig) and code_mode.enabled:  # its script tool is a client's call
            composites.append(SCRIPT_TOOL)  # (its two helpers ask no backend and spend nothing)
        if isinstance(outgoing, OutgoingAuthConfig):  # the gateway's own connect tools are named too
            composites += [f"connect_{name}" for name in backends if outgoing.for_backend(name).type == "oauth"]
        problems = unadvertisable_limits(limits.tools, aggregation, backends, composites)
        if problems:
            raise ValidationError({"rateLimiting": {"tools": {
                index: {"name": [message]} for index, message in problems.items()}}})

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> VmcpConfig:
        return VmcpConfig(
            name=data["name"],
            backends=tuple(data["backends"]),
            incoming_auth=data["incoming_auth"],
            aggregation=data["aggregation"],
            operational=data["operational"],
            admin=data["admin"],
            outgoing_auth=data["outgoing_auth"],
            composite_tools=tuple(data["composite_tools"]),
            optimizer=data.get("optimizer"),
            code_mode=data["code_mode"],
            session_storage=data["session_storage"],
            audit=data["audit"],
            telemetry=data["telemetry"],
            rate_limiting=data.get("rate_limiting"),
        )


def _process_credential_problem(backend: BackendConfig, auth: BackendAuthConfig,
                                named: bool) -> tuple[str, str] | None:
    if backend.is_process and auth.type == "oauth" and (auth.oauth is None or auth.oauth.issuer is None):
        return "oauth", (f"stdio backend {backend.name!r} has no URL to say where people authorize: set "
                         "oauth.issuer (its authorization server) and, if it asks one, oauth.resource")
    if not backend.is_process:
        if auth.token_env is not None and named:
            return "tokenEnv", f"is for stdio backends only (backend {backend.name!r} is {backend.transport})"
        return None
    if auth.type == "unauthenticated":
        return None
    if auth.token_env is None:
        return "tokenEnv", (f"is required for stdio backend {backend.name!r}: its credential goes into the "
                            "child's environment under this name (a process takes no headers)")
    if auth.type in ("token_exchange", "oauth") and not backend.per_user:
        return "tokenEnv", (f"stdio backend {backend.name!r} is shared by every user: a user's own token "
                            "needs scope: perUser")
    return None


def _backend_names(data: Mapping[str, Any]) -> list[str | None] | None:
    """The name of each loaded backend, in order (None where a name did not load); None if
    the backends list did not load at all."""
    backends = data.get("backends")
    return None if backends is None else [_loaded(backend, "name") for backend in backends]


def _unknown_backend_references(data: Mapping[str, Any], backends: set[str]) -> dict[str, Any]:
    """Names of no backend where loaded sections name backends, as nested messages."""

    def unknown(referenced: Iterable[tuple[Any, Any]]) -> dict[Any, list[str]]:
        # (where in its section, the backend name there) -> a message per unknown name
        return {where: [f"no backend named {name!r}"] for where, name in referenced if name not in backends}

    errors: dict[str, Any] = {}
    per_workload = _loaded(_loaded(data.get("operational"), "timeouts"), "per_workload") or {}
    if found := unknown((name, name) for name in per_workload):
        errors["operational"] = {"timeouts": {"perWorkload": found}}
    budgets = _loaded(_loaded(data.get("operational"), "discovery_budget"), "per_workload") or {}
    if found := unknown((name, name) for name in budgets):
        errors.setdefault("operational", {})["discoveryBudget"] = {"perWorkload": found}
    auth_backends = _loaded(data.get("outgoing_auth"), "backends") or {}
    if found := unknown((name, name) for name in auth_backends):
        errors["outgoingAuth"] = {"backends": found}

    aggregation = data.get("aggregation")
    in_aggregation: dict[str, Any] = {}
    if found := unknown(enumerate(_priority_order(aggregation))):
        in_aggregation["conflictResolutionConfig"] = {"priorityOrder": found}
    workloads = [(index, _loaded(tools, "workload")) for index, tools in enumerate(_loaded(aggregation, "tools") or ())]
    if found := unknown((index, name) for index, name in workloads if name is not None):
        in_aggregation["tools"] = {index: {"workload": messages} for index, messages in found.items()}
    if in_aggregation:
        errors["aggregation"] = in_aggregation
    return errors


def _priority_order(aggregation: Any) -> tuple[str, ...]:
    """``priority_order`` of a loaded aggregation section, which keeps it nested under
    ``conflict_resolution_config`` until the section is built."""
    if isinstance(aggregation, AggregationConfig):
        return aggregation.priority_order
    return tuple(_loaded(_loaded(aggregation, "conflict_resolution_config"), "priority_order") or ())
