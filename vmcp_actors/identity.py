"""Who is calling. Passed explicitly from the web layer down to the actors; never ambient.

``None`` stands for an anonymous caller everywhere an identity is taken. An anonymous
caller whose request carries passthrough headers is an ``Identity`` with an empty issuer
(see ``anonymous_with``): it still counts as anonymous for session binding and display.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Identity:
    """A caller: who (issuer + subject) and what of their request travels to the backends.

    The token, the claims and the forwarded headers change from request to request (a
    refreshed token is still the same person), so they take no part in equality and never
    appear in repr: a logged Identity shows no secret.
    """

    issuer: str
    subject: str
    claims: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), repr=False, compare=False)
    token: str | None = field(default=None, repr=False, compare=False)
    forwarded_headers: tuple[tuple[str, str], ...] = field(default=(), repr=False, compare=False)

    @property
    def is_anonymous(self) -> bool:
        return self.issuer == ""

    @property
    def key(self) -> tuple[str, str] | None:
        """What a session is bound to: the same person across token refreshes."""
        return None if self.is_anonymous else (self.issuer, self.subject)


def anonymous_with(forwarded_headers: tuple[tuple[str, str], ...]) -> Identity | None:
    """The anonymous caller, carrying passthrough headers when there are any."""
    return Identity("", ANONYMOUS, forwarded_headers=forwarded_headers) if forwarded_headers else None


def identity_key(identity: Identity | None) -> tuple[str, str] | None:
    return None if identity is None else identity.key


def subject_of(identity: Identity | None) -> str:
    return ANONYMOUS if identity is None or identity.is_anonymous else identity.subject


def forwarded_headers_of(identity: Identity | None) -> tuple[tuple[str, str], ...]:
    return () if identity is None else identity.forwarded_headers


def token_of(identity: Identity | None) -> str | None:
    return None if identity is None else identity.token
