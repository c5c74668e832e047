"""Sessions: the SessionActor, aggregation into a catalog, and the core capability interface."""

from vmcp_actors.sessions._actor import SessionActor, SessionServices, discovery_timeout
from vmcp_actors.sessions._aggregation import Catalog, InternalTool, Route, advertised_name, build_catalog
from vmcp_actors.sessions._capabilities import (
    AggregatedBackends,
    Capabilities,
    CapabilitiesLayer,
    ConflictingNames,
    NoBackendsAvailable,
    to_jsonrpc_error,
)
from vmcp_actors.sessions._filter import AdvertisingFilter, is_advertised
from vmcp_actors.sessions._discovery_cache import DiscoveryCache, discovery_key
from vmcp_actors.sessions._dispatch import McpDispatcher
from vmcp_actors.sessions._relay import Relay, RelayEvent
from vmcp_actors.sessions._uri_template import compile_uri_template, uri_matches_template

__all__ = [
    "AdvertisingFilter",
    "ConflictingNames",
    "InternalTool",
    "is_advertised",
    "AggregatedBackends",
    "Capabilities",
    "CapabilitiesLayer",
    "Catalog",
    "DiscoveryCache",
    "McpDispatcher",
    "NoBackendsAvailable",
    "Relay",
    "RelayEvent",
    "Route",
    "SessionActor",
    "SessionServices",
    "advertised_name",
    "build_catalog",
    "compile_uri_template",
    "discovery_key",
    "discovery_timeout",
    "to_jsonrpc_error",
    "uri_matches_template",
]
