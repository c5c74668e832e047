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

# The client capabilities the gateway passes on to backends (it declares to a backend
# what the user's clients declared, so a backend never asks what no client can answer).
# ``extensions`` (MCP Apps' io.modelcontextprotocol/ui, say) change what a backend offers.
RELAYED_CLIENT_CAPABILITIES = ("sampling", "elicitation", "roots", "extensions")
LEGACY_PREFERRED = "legacy"  # a user key's mark: its clients are 2025 sessions that take requests


def relayed_capabilities(client_capabilities: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a client's capabilities that its backends are told about."""
    return {name: client_capabilities[name] for name in RELAYED_CLIENT_CAPABILITIES
            if isinstance(client_capabilities.get(name), Mapping)}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(plain_json(value), sort_keys=True).encode()).hexdigest()[:16] if value else ""


@dataclass(frozen=True)
class UserKey:
    """Whose actors serve a request: the person (issuer + subject; one for every
    anonymous caller), a digest of the passthrough headers, which backends may answer
    by (callers they can tell apart never share a catalog or a backend session), a
    digest of the client capabilities declared to backends (a backend session is told
    one set), whether its clients are 2025 sessions that take requests
    (``prefers_legacy``: a backend that speaks both revisions keeps sessions, and asks
    for sampling, elicitation and roots, only in 2025, so a client session's connections
    speak 2025 to it), and, for a 2025 client session, a digest of that session's id
    (``client``). Every 2025 client session is its own user, so its backend sessions,
    their requests and notifications, its log level and its subscriptions are its own,
    as on a direct connection; 2026-07-28 requests (``client`` empty) share one user
    per caller."""

    issuer: str = ""
    subject: str = ANONYMOUS
    headers: str = ""
    features: str = ""
    prefers_legacy: bool = False
    client: str = ""

    @classmethod
    def of(cls, identity: Identity | None, client_capabilities: Mapping[str, Any] | None = None,
           *, session: str | None = None) -> UserKey:
        """``session``: the id of the 2025 client session served (None: a 2026-07-28 caller)."""
        owner = identity_key(identity)
        headers = _digest(forwarded_headers_of(identity))
        relayed = relayed_capabilities(client_capabilities or {})
        issuer, subject = owner if owner is not None else ("", ANONYMOUS)
        # A 2025 client session's backend sessions speak 2025 where the backend can: what a
        # backend keeps per session (state, roots, levels) is then that client's, as directly.
        return cls(issuer, subject, headers, _digest(relayed), session is not None,
                   _digest(session) if session else "")

    @property
    def person(self) -> UserKey:
        """The key of this caller's 2026-07-28 requests: the same person and headers, no
        client session and no declared capabilities. What is shared across a person's
        client sessions (discovery, task handles, back-off) is keyed by it."""
        return UserKey(self.issuer, self.subject, self.headers)

    @property
    def owner(self) -> tuple[str, str] | None:
        """The identity binding of sessions served by this user (None: anonymous)."""
        return None if not self.issuer else (self.issuer, self.subject)

    @property
    def label(self) -> str:
        """For logs and the admin state: the subject, never a token or header value."""
        return self.subject if self.issuer else ANONYMOUS

    def to_json(self) -> list[str]:
        parts = [self.issuer, self.subject, self.headers, self.features]
        if self.client:
            return [*parts, LEGACY_PREFERRED if self.prefers_legacy else "", self.client]
        return [*parts, LEGACY_PREFERRED] if self.prefers_legacy else parts

    @classmethod
    def from_json(cls, data: Any) -> UserKey:
        if not isinstance(data, list) or len(data) not in (3, 4, 5, 6) or \
                not all(isinstance(part, str) for part in data):
            raise ValueError('a user key is [issuer, subject, headers digest, features digest], then "legacy" '
                             "when its clients are 2025 sessions that take requests, then the client session's "
                             "digest when it serves one")
        if len(data) == 5 and data[4] != LEGACY_PREFERRED:
            raise ValueError(f"a user key's fifth part can only be {LEGACY_PREFERRED!r}")
        if len(data) == 6 and data[4] not in ("", LEGACY_PREFERRED):
            raise ValueError(f"a user key's fifth part can only be {LEGACY_PREFERRED!r} or empty")
        client = data[5] if len(data) == 6 else ""
        return cls(*data[:4], prefers_legacy=len(data) >= 5 and data[4] == LEGACY_PREFERRED, client=client)


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
    subscriptions: frozenset[str] = frozenset()  # resource URIs the client subscribed to

    def __post_init__(self) -> None:
        object.__setattr__(self, "client_capabilities", _frozen(self.client_capabilities))
        object.__setattr__(self, "client_info", _frozen(self.client_info))
        object.__setattr__(self, "subscriptions", frozenset(self.subscriptions))

    @property
    def owner(self) -> tuple[str, str] | None:
        return self.user.owner

    def used_at(self, when: float) -> SessionRecord:
        return replace(self, last_used=when)

    def with_log_level(self, level: str) -> SessionRecord:
        return replace(self, log_level=level)

    def with_subscription(self, uri: str, subscribed: bool) -> SessionRecord:
        return replace(self, subscriptions=self.subscriptions | {uri} if subscribed else self.subscriptions - {uri})

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
            "subscriptions": sorted(self.subscriptions),
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
        subscriptions = data.get("subscriptions", [])
        _require(isinstance(subscriptions, list) and all(isinstance(uri, str) for uri in subscriptions),
                 "subscriptions must be a list of URIs")
        return cls(
            session_id=data["sessionId"],
            user=UserKey.from_json(data.get("user")),
            protocol_version=data["protocolVersion"],
            client_capabilities=data.get("clientCapabilities", {}),
            client_info=data.get("clientInfo", {}),
            log_level=data.get("logLevel"),
            created=float(data.get("created", 0.0)),
            last_used=float(data.get("lastUsed", 0.0)),
            subscriptions=frozenset(subscriptions),
        )


@dataclass(frozen=True)
class UserRecord:
    """One user's backend sessions: per backend, what its initialize negotiated, and the
    client capabilities declared to the backends (those of the user's clients)."""

    key: UserKey
    backends: Mapping[str, Handshake] = field(default_factory=lambda: MappingProxyType({}))
    created: float = 0.0
    client_capabilities: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "backends", MappingProxyType(dict(self.backends)))
        object.__setattr__(self, "client_capabilities", _frozen(self.client_capabilities))

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
            "clientCapabilities": plain_json(self.client_capabilities),
        }

    @classmethod
    def from_json(cls, data: Any) -> UserRecord:
        _require(isinstance(data, Mapping), "a user record must be an object")
        backends = data.get("backends", {})
        _require(isinstance(backends, Mapping), "backends must be an object")
        _require(isinstance(data.get("created", 0.0), (int, float)), "created must be a number")
        _require(isinstance(data.get("clientCapabilities", {}), Mapping), "clientCapabilities must be an object")
        return cls(
            key=UserKey.from_json(data.get("key")),
            backends={str(name): Handshake.from_json(value) for name, value in backends.items()},
            created=float(data.get("created", 0.0)),
            client_capabilities=data.get("clientCapabilities", {}),
        )


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _frozen(value: Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(value, MappingProxyType):
        return value  # already a record's own copy (replace() passes it on): no copy per request
    # A deep copy through JSON: the record shares nothing mutable with its input.
    return MappingProxyType(json.loads(json.dumps(plain_json(value))))

