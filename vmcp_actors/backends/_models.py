"""Immutable values that BackendConnection hands to its parent."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Mapping


class ConnectionState(str, Enum):
    NEW = "new"
    INITIALIZING = "initializing"
    READY = "ready"
    FAILED = "failed"
    CLOSED = "closed"


@dataclass(frozen=True)
class Handshake:
    """What the backend told us in initialize."""

    session_id: str | None
    protocol_version: str
    capabilities: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    server_info: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class BackendCapabilities:
    """One backend's discovered lists, every page followed. The dicts are never mutated."""

    backend: str
    capabilities: Mapping[str, Any]
    tools: tuple[dict[str, Any], ...] = ()
    resources: tuple[dict[str, Any], ...] = ()
    resource_templates: tuple[dict[str, Any], ...] = ()
    prompts: tuple[dict[str, Any], ...] = ()

    def supports(self, capability: str) -> bool:
        return capability in self.capabilities


@dataclass(frozen=True)
class ConnectionSnapshot:
    """The admin view of one BackendConnection. Carries no URL-borne secret and no token."""

    backend: str
    state: str
    protocol_version: str | None
    tools: int
    resources: int
    prompts: int
    last_error: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "state": self.state,
            "protocolVersion": self.protocol_version,
            "tools": self.tools,
            "resources": self.resources,
            "prompts": self.prompts,
            "lastError": self.last_error,
        }
