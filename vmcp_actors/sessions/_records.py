"""What a session and a user ARE, as plain immutable values that serialize to JSON.

Actors are the live, evictable cache of these records: a user's actors stop when idle
and are revived from the user record (reusing its backend sessions); a client session is
nothing but its record, pointing at its user. No actor, future or lock lives in a record,
so a record can be written down, moved to another process and read back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from vmcp_actors.backends import Handshake, plain_json
from vmcp_actors.identity import ANONYMOUS, Identity, forwarded_headers_of, identity_key


@dataclass(frozen=True)
class UserKey:
    """Whose actors serve a request: the person (issuer + subject; one for every
    anonymous caller), and a digest of the passthrough headers, which backends may answer
    by (callers they can tell apart never share a catalog or a backend session)."""

    issuer: str = ""
    subject: str = ANONYMOUS
    headers: str = ""

    @classmethod
    def of(cls, identity: Identity | None) -> UserKey:
        owner = identity_key(identity)
        forwarded = forwarded_headers_of(identity)
        digest = hashlib.sha256(json.dumps(forwarded).encode()).hexdigest()[:16] if forwarded else ""
        return cls(*owner, digest) if owner is not None else cls(headers=digest)

    @property
    def owner(self) -> tuple[str, str] | None:
        """The identity binding of sessions served by this user (None: anonymous)."""
        return None if not self.issuer else (self.issuer, self.subject)

    @property
    def label(self) -> str:
        """For logs and the admin state: the subject, never a token or header value."""
        return self.subject if self.issuer else ANONYMOUS

    def to_json(self) -> list[str]:
        return [self.issuer, self.subject, self.headers]

    @classmethod
    def from_json(cls, data: Any) -> UserKey:
        if not isinstance(data, list) or len(data) != 3 or not all(isinstance(part, str) for part in data):
            raise ValueError("a user key is [issuer, subject, headers digest]")
        return cls(*data)


@dataclass(frozen=True)
class SessionRecord:
    """One legacy (2025-xx) client session: what must stay per client session."""

    session_id: str
    user: UserKey
    protocol_version: str  # the revision negotiated in initialize
    client_capabilities: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    client_info: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    log_level: str | None = None  # set by logging/setLevel; None: everything is relayed
    created: float = 0.0  # time.time()
    last_used: float = 0.0  # time.time()

    def __post_init__(self) -> None:
        object.__setattr__(self, "client_capabilities", _frozen(self.client_capabilities))
        object.__setattr__(self, "client_info", _frozen(self.client_info))

    @property
    def owner(self) -> tuple[str, str] | None:
        return self.user.owner

    def used_at(self, when: float) -> SessionRecord:
        return replace(self, last_used=when)

    def with_log_level(self, level: str) -> SessionRecord:
        return replace(self, log_level=level)

    def to_json(self) -> dict[str, Any]:
        return {
            "sessionId": self.session_id,
            "user": self.user.to_json(),
            "protocolVersion": self.protocol_version,
            "clientCapabilities": plain_json(self.client_capabilities),
            "clientInfo": plain_json(self.client_info),
            "logLevel": self.log_level,
            "created": self.created,
            "lastUsed": self.last_used,
        }

    @classmethod
    def from_json(cls, data: Any) -> SessionRecord:
        _require(isinstance(data, Mapping), "a session record must be an object")
        _require(isinstance(data.get("sessionId"), str), "sessionId must be a string")
        _require(isinstance(data.get("protocolVersion"), str), "protocolVersion must be a string")
        _require(isinstance(data.get("clientCapabilities", {}), Mapping), "clientCapabilities must be an object")
        _require(isinstance(data.get("clientInfo", {}), Mapping), "clientInfo must be an object")
        _require(data.get("logLevel") is None or isinstance(data["logLevel"], str), "logLevel must be a string")
        _require(all(isinstance(data.get(k, 0.0), (int, float)) for k in ("created", "lastUsed")),
                 "created and lastUsed must be numbers")
        return cls(
            session_id=data["sessionId"],
            user=UserKey.from_json(data.get("user")),
            protocol_version=data["protocolVersion"],
            client_capabilities=data.get("clientCapabilities", {}),
            client_info=data.get("clientInfo", {}),
            log_level=data.get("logLevel"),
            created=float(data.get("created", 0.0)),
            last_used=float(data.get("lastUsed", 0.0)),
        )


@dataclass(frozen=True)
class UserRecord:
    """One user's backend sessions: per backend, what its initialize negotiated."""

    key: UserKey
    backends: Mapping[str, Handshake] = field(default_factory=lambda: MappingProxyType({}))
    created: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "backends", MappingProxyType(dict(self.backends)))

    def with_backend(self, name: str, handshake: Handshake | None) -> UserRecord:
        backends = dict(self.backends)
        if handshake is None:
            backends.pop(name, None)
        else:
            backends[name] = handshake
        return replace(self, backends=backends)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key.to_json(),
            "backends": {name: handshake.to_json() for name, handshake in sorted(self.backends.items())},
            "created": self.created,
        }

    @classmethod
    def from_json(cls, data: Any) -> UserRecord:
        _require(isinstance(data, Mapping), "a user record must be an object")
        backends = data.get("backends", {})
        _require(isinstance(backends, Mapping), "backends must be an object")
        _require(isinstance(data.get("created", 0.0), (int, float)), "created must be a number")
        return cls(
            key=UserKey.from_json(data.get("key")),
            backends={str(name): Handshake.from_json(value) for name, value in backends.items()},
            created=float(data.get("created", 0.0)),
        )


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _frozen(value: Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(value, MappingProxyType):
        return value  # already a record's own copy (replace() passes it on): no copy per request
    # A deep copy through JSON: the record shares nothing mutable with its input.
    return MappingProxyType(json.loads(json.dumps(plain_json(value))))

