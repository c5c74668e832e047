"""The MCP semantics of the 2025 client edge that are not a method call: initialize and
the revision it negotiates, the server's capabilities, the ``MCP-Protocol-Version`` checks, a request's deadline, and which log messages a session
asked for. Pure functions: the web layer only carries their answers over HTTP."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from vmcp_actors import __version__
from vmcp_actors.concurrency import Deadline
from vmcp_actors.config import VmcpConfig
from vmcp_actors.protocol import (
    ACCEPTED_PROTOCOL_HEADER_VERSIONS,
    INVALID_PARAMS,
    INVALID_REQUEST,
    JsonRpcError,
    Message,
    negotiate_protocol_version,
)
from vmcp_actors.protocol.mcp import PROTOCOL_VERSION_HEADER

# What the gateway implements towards clients, whatever the backends turn out to have.
SERVER_CAPABILITIES = MappingProxyType({
    "tools": {"listChanged": True},
    "resources": {"subscribe": True, "listChanged": True},
    "prompts": {"listChanged": True},
    "logging": {},
    "completions": {},
})


@dataclass(frozen=True)
class InitializeOutcome:
    """What a client's initialize settles: the revision, and what the client declared."""

    protocol_version: str
    client_capabilities: Mapping[str, Any] = field(default_factory=dict)
    client_info: Mapping[str, Any] = field(default_factory=dict)

    def result(self, server_name: str) -> dict[str, Any]:
        return {
            "protocolVersion": self.protocol_version,
            "capabilities": {name: dict(value) for name, value in SERVER_CAPABILITIES.items()},
            "serverInfo": {"name": server_name, "version": __version__},
        }


def initialize(params: Any) -> InitializeOutcome:
    """Negotiate a revision from an initialize request's params; -32602 when they are unusable."""
    params = params if isinstance(params, dict) else {}
    if not isinstance(params.get("protocolVersion"), str):
        raise JsonRpcError(INVALID_PARAMS, "protocolVersion is required")
    for key in ("capabilities", "clientInfo"):
        if key in params and not isinstance(params[key], dict):
            raise JsonRpcError(INVALID_PARAMS, f"{key} must be an object")
    return InitializeOutcome(
        protocol_version=negotiate_protocol_version(params["protocolVersion"]),
        client_capabilities=params.get("capabilities", {}),
        client_info=params.get("clientInfo", {}),
    )


def check_header_version(header: str | None, session_version: str | None) -> JsonRpcError | None:
    """A 400 error when the ``MCP-Protocol-Version`` header is unusable: a revision the
    gateway does not serve, or (on a session) one newer than the session negotiated. An
    absent header is fine (the spec says to assume 2025-03-26), and so is an older
    revision than the session's (revisions are dated, so they compare as text)."""
    if header is None:
        return None
    if header not in ACCEPTED_PROTOCOL_HEADER_VERSIONS:
        return JsonRpcError(INVALID_REQUEST, f"Bad Request: unsupported {PROTOCOL_VERSION_HEADER}: {header[:40]}",
                            http_status=400)
    if session_version is not None and header > session_version:
        return JsonRpcError(INVALID_REQUEST, f"Bad Request: {PROTOCOL_VERSION_HEADER} {header} is newer than the "
                                             f"revision this session negotiated ({session_version})", http_status=400)
    return None


class RequestDeadlines:
    """The one deadline of each client request: the longest backend timeout (the most any
    backend may take to answer), and for a composite tool's call its own timeout on top
    (the run's timeout counts from its start, after discovery). Worked out once per config."""

    def __init__(self, config: VmcpConfig):
        timeouts = config.operational.timeouts
        self._longest = max([timeouts.default, *timeouts.per_workload.values()])
        self._composites = {tool.name: self._longest + tool.timeout for tool in config.composite_tools}

    def for_request(self, message: Message) -> Deadline:
        if self._composites and message.method == "tools/call" and isinstance(message.params, dict):
            seconds = self._composites.get(message.params.get("name"))  # type: ignore[arg-type]
            if seconds is not None:
                return Deadline.after(seconds)
        return Deadline.after(self._longest)
