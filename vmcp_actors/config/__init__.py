"""The gateway's config: YAML (ToolHive vMCP field names) -> validated, frozen dataclasses."""

from ._durations import parse_duration
from ._env import required_env_vars
from ._load import config_from_mapping, load_config
from ._mcp_servers import McpServersImport, import_mcp_servers, read_mcp_servers
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
    TasksConfig,
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
    "TasksConfig",
    "TimeoutsConfig",
    "TokenExchangeConfig",
    "ToolOverride",
    "VmcpConfig",
    "WorkloadToolsConfig",
    "config_from_mapping",
    "config_warnings",
    "load_config",
    "McpServersImport",
    "import_mcp_servers",
    "read_mcp_servers",
    "parse_duration",
    "required_env_vars",
]
