"""Sessions: per-user actors, session and user records, aggregation into a catalog, the
core capability interface, and the MCP protocol semantics of the client edge."""

from vmcp_actors.sessions._aggregation import Catalog, InternalTool, Route, advertised_name, build_catalog
from vmcp_actors.sessions._capabilities import (
    AggregatedBackends,
    Capabilities,
    CapabilitiesLayer,
    ConflictingNames,
    DiscoveryTimedOut,
    NoBackendsAvailable,
)
from vmcp_actors.sessions._discovery_cache import DiscoveryCache, discovery_key
from vmcp_actors.sessions._dispatch import LOGGING_LEVELS, McpDispatcher
from vmcp_actors.sessions._exchange import CallCancelled, Exchange, Notification, ServerRequest, to_jsonrpc_error
from vmcp_actors.sessions._live import RESUME_RETRY_MS, Call, CallStream, ListenStream, LiveSessions, StandaloneStream
from vmcp_actors.sessions._modern import (
    REMOVED_METHODS,
    CacheHints,
    ModernCall,
    ModernRequest,
    ParkedCalls,
    StateSeal,
    complete,
    discover_result,
    is_modern_request,
    modern_error,
    principal_of,
    read_modern,
)
from vmcp_actors.sessions._filter import AdvertisingFilter, is_advertised
from vmcp_actors.sessions._lifecycle import (
    SERVER_CAPABILITIES,
    InitializeOutcome,
    check_header_version,
    initialize,
    is_logged_at,
    RequestDeadlines,
)
from vmcp_actors.sessions._records import SessionRecord, UserKey, UserRecord, relayed_capabilities
from vmcp_actors.sessions._relay import ClientSide, Relay, RelayEvent, error_event
from vmcp_actors.sessions._redis_store import RedisRecordStore
from vmcp_actors.sessions._store import MemoryRecordStore, RecordStore, StoreUnavailable
from vmcp_actors.sessions._stream_fanout import StreamFanout
from vmcp_actors.sessions._uri_template import compile_uri_template, uri_matches_template
from vmcp_actors.sessions._user import (
    LIST_CHANGED,
    RESOURCE_UPDATED,
    RETRY_FAILED_AFTER,
    SessionServices,
    UserActor,
    UserHandle,
    end_released_user,
    start_user,
)

__all__ = [
    "Call",
    "CallStream",
    "CacheHints",
    "ListenStream",
    "ModernCall",
    "ModernRequest",
    "ParkedCalls",
    "REMOVED_METHODS",
    "StateSeal",
    "complete",
    "discover_result",
    "is_modern_request",
    "modern_error",
    "principal_of",
    "read_modern",
    "RESUME_RETRY_MS",
    "CallCancelled",
    "ClientSide",
    "LIST_CHANGED",
    "LiveSessions",
    "RESOURCE_UPDATED",
    "ServerRequest",
    "StandaloneStream",
    "relayed_capabilities",
    "AdvertisingFilter",
    "AggregatedBackends",
    "Capabilities",
    "CapabilitiesLayer",
    "Catalog",
    "ConflictingNames",
    "DiscoveryCache",
    "DiscoveryTimedOut",
    "Exchange",
    "InitializeOutcome",
    "InternalTool",
    "LOGGING_LEVELS",
    "McpDispatcher",
    "MemoryRecordStore",
    "NoBackendsAvailable",
    "Notification",
    "RETRY_FAILED_AFTER",
    "RecordStore",
    "RedisRecordStore",
    "StoreUnavailable",
    "StreamFanout",
    "RequestDeadlines",
    "Relay",
    "RelayEvent",
    "Route",
    "SERVER_CAPABILITIES",
    "SessionRecord",
    "SessionServices",
    "UserActor",
    "UserHandle",
    "UserKey",
    "UserRecord",
    "advertised_name",
    "build_catalog",
    "check_header_version",
    "compile_uri_template",
    "discovery_key",
    "end_released_user",
    "error_event",
    "initialize",
    "is_advertised",
    "is_logged_at",
    "start_user",
    "to_jsonrpc_error",
    "uri_matches_template",
]
