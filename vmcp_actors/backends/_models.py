"""Immutable values that BackendConnection hands to its parent."""

from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Mapping

import pykka


class ConnectionState(str, Enum):
    NEW = "new"
    RESTORED = "restored"  # revived from the user record: the backend session is assumed alive
    INITIALIZING = "initializing"
    READY = "ready"
    FAILED = "failed"
    CLOSED = "closed"


@dataclass(frozen=True)
class Handshake:
    """What the backend told us in initialize: enough to go on using its session from
    another actor or process (it is part of the user record, as JSON)."""

    session_id: str | None
    protocol_version: str
    capabilities: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    server_info: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    instructions: str | None = None  # how to use the server, for the client's model

    @property
    def is_modern(self) -> bool:
        """A 2026-07-28 backend: no session, every request carries its own metadata."""
        return self.protocol_version >= "2026-07-28"

    def to_json(self) -> dict[str, Any]:
        return {
            "sessionId": self.session_id,
            "protocolVersion": self.protocol_version,
            "capabilities": plain_json(self.capabilities),
            "serverInfo": plain_json(self.server_info),
            "instructions": self.instructions,
        }

    @classmethod
    def from_json(cls, data: Any) -> Handshake:
        if not isinstance(data, Mapping):
            raise ValueError("a backend handshake must be an object")
        session_id, version = data.get("sessionId"), data.get("protocolVersion")
        capabilities, server_info = data.get("capabilities", {}), data.get("serverInfo", {})
        if session_id is not None and not isinstance(session_id, str):
            raise ValueError("sessionId must be a string or null")
        if not isinstance(version, str):
            raise ValueError("protocolVersion must be a string")
        if not isinstance(capabilities, Mapping) or not isinstance(server_info, Mapping):
            raise ValueError("capabilities and serverInfo must be objects")
        instructions = data.get("instructions")
        return cls(session_id, version, MappingProxyType(dict(capabilities)), MappingProxyType(dict(server_info)),
                   instructions if isinstance(instructions, str) else None)


def plain_json(value: Any) -> Any:
    """A JSON-ready copy: read-only mapping proxies become dicts, tuples lists."""
    if isinstance(value, Mapping):
        return {key: plain_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(item) for item in value]
    return value


@dataclass(frozen=True)
class DiscoveredBackend:
    """One backend's discovered lists, every page followed. The dicts are never mutated."""

    backend: str
    capabilities: Mapping[str, Any]
    tools: tuple[dict[str, Any], ...] = ()
    resources: tuple[dict[str, Any], ...] = ()
    resource_templates: tuple[dict[str, Any], ...] = ()
    prompts: tuple[dict[str, Any], ...] = ()
    ttl_ms: int | None = None  # the shortest ttlMs a 2026-07-28 backend gave its lists (None: no hint)

    def supports(self, capability: str) -> bool:
        return capability in self.capabilities


@dataclass(frozen=True)
class ConnectionSnapshot:
    """The admin view of one BackendConnection. Carries no URL-borne secret and no token."""

    backend: str
    state: str
    protocol_version: str | None
    protocol_reason: str | None  # why this connection speaks that revision
    tools: int
    resources: int
    prompts: int
    last_error: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "state": self.state,
            "protocolVersion": self.protocol_version,
            "protocolReason": self.protocol_reason,
            "tools": self.tools,
            "resources": self.resources,
            "prompts": self.prompts,
            "lastError": self.last_error,
        }


def compose_instructions(said: Mapping[str, str | None]) -> str | None:
    """Backends' instructions as one text for a client: one backend's as it is, several
    under a heading each, by backend name (the same text whichever answered first)."""
    given = sorted((name, text) for name, text in said.items() if text)
    if len(given) <= 1:
        return given[0][1] if given else None
    return "\n\n".join(f"## {name}\n\n{text}" for name, text in given)


@dataclass(frozen=True)
class StreamsReady:
    """When the backend streams a user's client stream or subscription wants are open:
    one answer per BackendConnection (a pykka future of its stream_ready())."""

    answers: tuple[Any, ...]

    def wait(self, seconds: float) -> bool:
        """Wait at most ``seconds`` for every stream; whether all were open (or will not
        open) in time. A slow backend costs the wait, never a failure: its stream opens later."""
        give_up = time.monotonic() + seconds
        for answer in self.answers:
            try:
                ready = answer.get(timeout=max(0.0, give_up - time.monotonic()))
                ready.result(timeout=max(0.0, give_up - time.monotonic()))
            except (pykka.Timeout, cf.TimeoutError):
                return False
            except pykka.ActorDeadError:
                continue
        return True
