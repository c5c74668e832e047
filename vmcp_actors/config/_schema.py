"""marshmallow schemas for the YAML config (camelCase keys, as in ToolHive's vMCP).

Every schema raises on unknown keys. Contract fields that are not built yet are declared
as ``NotSupportedYet`` fields, so they are rejected by name instead of as "unknown field".
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from marshmallow import RAISE, Schema, ValidationError, fields, post_load, pre_load, validate, validates_schema
from marshmallow.utils import missing

from ._durations import parse_duration
from ._model import (
    DEFAULT_PREFIX_FORMAT,
    DEFAULT_TRANSPORT,
    AdminConfig,
    AggregationConfig,
    BackendConfig,
    IncomingAuthConfig,
    OperationalConfig,
    TimeoutsConfig,
    VmcpConfig,
)

BACKEND_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
ENV_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Characters a prefix may add to tool names (MCP tool names: letters, digits, _ - .).
PREFIX_TEXT = re.compile(r"[A-Za-z0-9_.-]*")


# --- fields -----------------------------------------------------------------------------


class _PlainMessages:
    """Lower-case messages that read well after a ``path:``."""

    default_error_messages = {
        "required": "is required",
        "null": "must not be null",
        "validator_failed": "invalid value",
    }


class _String(_PlainMessages, fields.String):
    default_error_messages = {"invalid": "must be a string", "invalid_utf8": "must be valid UTF-8"}


class _Integer(_PlainMessages, fields.Integer):
    """An integer written as one: no strings, floats or booleans."""

    default_error_messages = {"invalid": "must be an integer", "too_large": "is too large"}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(strict=True, **kwargs)

    def _validated(self, value: Any) -> int:
        if isinstance(value, bool):  # YAML `true` is an int to Python
            raise self.make_error("invalid", input=value)
        return super()._validated(value)


class _List(_PlainMessages, fields.List):
    default_error_messages = {"invalid": "must be a list"}


class _Nested(_PlainMessages, fields.Nested):
    pass


class _Duration(_PlainMessages, fields.Field):
    """``30s`` -> 30.0 seconds."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> float:
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None


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
            raise ValidationError(errors)
        return result


class NotSupportedYet(fields.Field):
    """A contract field this project has not built yet: any value at all is an error."""

    def deserialize(self, value: Any, attr: str | None = None, data: Any = None, **kwargs: Any) -> Any:
        if value is missing:
            return missing
        raise ValidationError(f"{self.data_key or self.name} is not supported yet")


# --- validators -------------------------------------------------------------------------


class _Choice(validate.Validator):
    """One of ``supported``; values in ``not_yet`` are part of the contract but not built."""

    def __init__(self, supported: Iterable[str], not_yet: Iterable[str] = (), hint: str = "") -> None:
        self.supported = tuple(supported)
        self.not_yet = tuple(not_yet)
        self.hint = hint

    def __call__(self, value: str) -> str:
        if value in self.supported:
            return value
        if value in self.not_yet:
            raise ValidationError(f"{value!r} is not supported yet{self.hint}")
        raise ValidationError(f"must be one of {', '.join(self.supported + self.not_yet)}")


def _not_blank(value: str) -> None:
    if not value.strip():
        raise ValidationError("must not be empty")


def _backend_name(value: str) -> None:
    if not BACKEND_NAME.fullmatch(value):
        raise ValidationError(
            "must be 1-63 letters, digits, '_' or '-', starting with a letter or digit"
        )


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


class _StrictSchema(Schema):
    error_messages = {"unknown": "unknown field", "type": "must be a mapping"}

    class Meta:
        unknown = RAISE

    @pre_load
    def _stringify_keys(self, data: Any, **kwargs: Any) -> Any:
        # YAML allows `1: x`; an int key would later read as a list index in the error path.
        if isinstance(data, Mapping) and not all(isinstance(key, str) for key in data):
            return {str(key): value for key, value in data.items()}
        return data


class BackendSchema(_StrictSchema):
    name = _String(required=True, validate=_backend_name)
    url = _String(required=True, validate=_http_url)
    transport = _String(
        load_default=DEFAULT_TRANSPORT,
        validate=_Choice([DEFAULT_TRANSPORT], ["sse", "stdio"], hint=f" (only {DEFAULT_TRANSPORT})"),
    )

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> BackendConfig:
        return BackendConfig(**data)


class IncomingAuthSchema(_StrictSchema):
    type = _String(load_default="anonymous", validate=_Choice(["anonymous"], ["oidc"]))
    oidc = NotSupportedYet()

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> IncomingAuthConfig:
        return IncomingAuthConfig(**data)


class ConflictResolutionConfigSchema(_StrictSchema):
    prefix_format = _String(data_key="prefixFormat", load_default=DEFAULT_PREFIX_FORMAT, validate=_prefix_format)
    priority_order = NotSupportedYet(data_key="priorityOrder")


class AggregationSchema(_StrictSchema):
    conflict_resolution = _String(
        data_key="conflictResolution",
        load_default="prefix",
        validate=_Choice(["prefix"], ["priority", "manual"]),
    )
    conflict_resolution_config = _Nested(
        ConflictResolutionConfigSchema,
        data_key="conflictResolutionConfig",
        load_default=lambda: {"prefix_format": DEFAULT_PREFIX_FORMAT},
    )
    tools = NotSupportedYet()
    exclude_all_tools = NotSupportedYet(data_key="excludeAllTools")

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> AggregationConfig:
        return AggregationConfig(
            conflict_resolution=data["conflict_resolution"],
            prefix_format=data["conflict_resolution_config"]["prefix_format"],
        )


class TimeoutsSchema(_StrictSchema):
    default = _Duration(load_default=30.0)
    per_workload = _DurationPerName(data_key="perWorkload", load_default=dict)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> TimeoutsConfig:
        return TimeoutsConfig(**data)


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
    discovery_cache_ttl = NotSupportedYet(data_key="discoveryCacheTTL")

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> OperationalConfig:
        data["allowed_origins"] = tuple(origin.rstrip("/") for origin in data["allowed_origins"])
        return OperationalConfig(**data)


class AdminSchema(_StrictSchema):
    token_env = _String(data_key="tokenEnv", load_default=None, allow_none=True, validate=_env_var_name)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> AdminConfig:
        return AdminConfig(**data)


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

    composite_tools = NotSupportedYet(data_key="compositeTools")
    composite_tool_refs = NotSupportedYet(data_key="compositeToolRefs")
    outgoing_auth = NotSupportedYet(data_key="outgoingAuth")
    group_ref = NotSupportedYet(data_key="groupRef")
    telemetry = NotSupportedYet()
    audit = NotSupportedYet()
    optimizer = NotSupportedYet()

    # Runs on the raw input even when fields failed, so these lines join the other errors.
    @validates_schema(pass_original=True, skip_on_field_errors=False)
    def _check_backend_references(self, data: Any, original_data: Any, **kwargs: Any) -> None:
        if not isinstance(original_data, Mapping) or not isinstance(original_data.get("backends"), list):
            return
        errors: dict[str, Any] = {}
        first_index: dict[str, int] = {}
        duplicates: dict[int, dict[str, list[str]]] = {}
        for index, backend in enumerate(original_data["backends"]):
            name = backend.get("name") if isinstance(backend, Mapping) else None
            if not isinstance(name, str):
                continue
            if name in first_index:
                message = f"duplicate backend name {name!r} (also backends[{first_index[name]}])"
                duplicates[index] = {"name": [message]}
            else:
                first_index[name] = index
        if duplicates:
            errors["backends"] = duplicates

        per_workload = _dig(original_data, "operational", "timeouts", "perWorkload")
        if isinstance(per_workload, Mapping):
            unknown = {
                key: [f"no backend named {key!r}"]
                for key in per_workload
                if isinstance(key, str) and key not in first_index
            }
            if unknown:
                errors["operational"] = {"timeouts": {"perWorkload": unknown}}
        if errors:
            raise ValidationError(errors)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> VmcpConfig:
        return VmcpConfig(
            name=data["name"],
            backends=tuple(data["backends"]),
            incoming_auth=data["incoming_auth"],
            aggregation=data["aggregation"],
            operational=data["operational"],
            admin=data["admin"],
        )


def _dig(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data
