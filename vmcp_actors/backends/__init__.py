"""The backend edge: one BackendConnection actor per backend per user."""

from vmcp_actors.backends._actor import BackendConnection, describe_failure, display_url
from vmcp_actors.backends._auth import (
    ExchangedTokenCache,
    HeaderInjection,
    OutgoingAuth,
    TokenExchange,
    Unauthenticated,
    build_outgoing_auth,
)
from vmcp_actors.backends._backoff import HandshakeBackoff
from vmcp_actors.backends._channel import (
    BackendChannel,
    BackendEras,
    BackendRequest,
    CallOpened,
    InputRequired,
    drain,
)
from vmcp_actors.backends._health import (
    DEGRADED,
    HEALTHY,
    BackendHealth,
    CircuitBreaker,
    CircuitOpen,
    HealthMonitor,
)
from vmcp_actors.backends._http import Abort, McpHttpClient, PostResult
from vmcp_actors.backends._models import (
    ConnectionSnapshot,
    ConnectionState,
    DiscoveredBackend,
    Handshake,
    StreamsReady,
    plain_json,
)

__all__ = [
    "DEGRADED",
    "HEALTHY",
    "BackendHealth",
    "CircuitBreaker",
    "CircuitOpen",
    "HealthMonitor",
    "Abort",
    "BackendEras",
    "HandshakeBackoff",
    "BackendRequest",
    "InputRequired",
    "CallOpened",
    "DiscoveredBackend",
    "BackendChannel",
    "BackendConnection",
    "ExchangedTokenCache",
    "HeaderInjection",
    "OutgoingAuth",
    "TokenExchange",
    "Unauthenticated",
    "build_outgoing_auth",
    "describe_failure",
    "drain",
    "display_url",
    "ConnectionSnapshot",
    "ConnectionState",
    "Handshake",
    "StreamsReady",
    "McpHttpClient",
    "plain_json",
    "PostResult",
]
