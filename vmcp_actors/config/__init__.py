"""The gateway's config: YAML (ToolHive vMCP field names) -> validated, frozen dataclasses."""

from ._durations import parse_duration
from ._load import config_from_mapping, load_config
from ._model import (
    AdminConfig,
    AggregationConfig,
    BackendConfig,
    IncomingAuthConfig,
    OperationalConfig,
    TimeoutsConfig,
    VmcpConfig,
)

__all__ = [
    "AdminConfig",
    "AggregationConfig",
    "BackendConfig",
    "IncomingAuthConfig",
    "OperationalConfig",
    "TimeoutsConfig",
    "VmcpConfig",
    "config_from_mapping",
    "load_config",
    "parse_duration",
]
