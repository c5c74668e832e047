"""The gateway's config: YAML (ToolHive vMCP field names) -> validated, frozen dataclasses."""

from ._durations import parse_duration
from ._env import required_env_vars
from ._load import config_from_mapping, load_config
from ._model import (
    AdminConfig,
    AggregationConfig,
    AuditConfig,
    AuthzConfig,
    BackendAuthConfig,
    BackendConfig,
    CircuitBreakerConfig,
    FailureHandlingConfig,
    HeaderInjectionConfig,
    IncomingAuthConfig,
    OidcConfig,
    OperationalConfig,
    OptimizerConfig,
    OutgoingAuthConfig,
    SessionStorageConfig,
    TelemetryConfig,
    TimeoutsConfig,
    TokenExchangeConfig,
    ToolOverride,
    VmcpConfig,
    WorkloadToolsConfig,
)
from ._warnings import config_warnings

__all__ = [
    "TelemetryConfig",
    "AuditConfig",
    "CircuitBreakerConfig",
    "FailureHandlingConfig",
    "SessionStorageConfig",
    "AuthzConfig",
    "OptimizerConfig",
    "AdminConfig",
    "AggregationConfig",
    "BackendAuthConfig",
    "BackendConfig",
    "HeaderInjectionConfig",
    "IncomingAuthConfig",
    "OidcConfig",
    "OperationalConfig",
    "OutgoingAuthConfig",
    "TimeoutsConfig",
    "TokenExchangeConfig",
    "ToolOverride",
    "VmcpConfig",
    "WorkloadToolsConfig",
    "config_from_mapping",
    "config_warnings",
    "load_config",
    "parse_duration",
    "required_env_vars",
]
