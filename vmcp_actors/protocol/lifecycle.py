"""What a 2025 client's ``initialize`` settles: the revision, what the client declared,
and what the gateway answers (its capabilities and identity)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from vmcp_actors import __version__
from vmcp_actors.protocol.jsonrpc import INVALID_PARAMS, JsonRpcError
from vmcp_actors.protocol.mcp import UI_EXTENSION, negotiate_protocol_version

# What the gateway implements towards clients, whatever the backends turn out to have.
SERVER_CAPABILITIES = MappingProxyType({
    "tools": {"listChanged": True},
    "resources": {"subscribe": True, "listChanged": True},
    "prompts": {"listChanged": True},
    "logging": {},
    "completions": {},
    # MCP Apps: a client's declaration reaches the backends, and their apps work through the
    # gateway (their own tool names resolved, shared ui:// URIs kept apart: core._shared_names).
    "extensions": {UI_EXTENSION: {}},
})

# The first revision with (experimental) tasks: its sessions are told the gateway relays them.
TASKS_SINCE = "2025-11-25"


@dataclass(frozen=True)
class InitializeOutcome:
    """What a client's initialize settles: the revision, and what the client declared."""

    protocol_version: str
    client_capabilities: Mapping[str, Any] = field(default_factory=dict)
    client_info: Mapping[str, Any] = field(default_factory=dict)

    def result(self, server_name: str) -> dict[str, Any]:
        capabilities = {name: dict(value) for name, value in SERVER_CAPABILITIES.items()}
        if self.protocol_version >= TASKS_SINCE:
            capabilities["tasks"] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
        return {
            "protocolVersion": self.protocol_version,
            "capabilities": capabilities,
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


