"""The backend edge: one BackendConnection actor per backend per session."""

from vmcp_actors.backends._actor import BackendConnection
from vmcp_actors.backends._auth import (
    ExchangedTokenCache,
    HeaderInjection,
    OutgoingAuth,
    TokenExchange,
    Unauthenticated,
    build_outgoing_auth,
)
from vmcp_actors.backends._channel import BackendChannel
from vmcp_actors.backends._http import McpHttpClient, PostResult
from vmcp_actors.backends._models import BackendCapabilities, ConnectionSnapshot, ConnectionState, Handshake

__all__ = [
    "BackendCapabilities",
    "BackendChannel",
    "BackendConnection",
    "ExchangedTokenCache",
    "HeaderInjection",
    "OutgoingAuth",
    "TokenExchange",
    "Unauthenticated",
    "build_outgoing_auth",
    "ConnectionSnapshot",
    "ConnectionState",
    "Handshake",
    "McpHttpClient",
    "PostResult",
]
