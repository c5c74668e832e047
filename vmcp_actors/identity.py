"""Who is calling. Passed explicitly from the web layer down to the actors; never ambient."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Identity:
    """An authenticated caller. ``None`` stands for anonymous everywhere an identity is taken."""

    issuer: str
    subject: str

    @property
    def key(self) -> tuple[str, str]:
        """What a session is bound to: the same person across token refreshes."""
        return (self.issuer, self.subject)


def identity_key(identity: Identity | None) -> tuple[str, str] | None:
    return None if identity is None else identity.key


def subject_of(identity: Identity | None) -> str:
    return "anonymous" if identity is None else identity.subject
