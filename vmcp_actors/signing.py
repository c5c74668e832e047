"""Values the gateway hands clients and must trust later, signed with one key.

A session id is a random nonce and an HMAC-SHA256 tag over it, so a forged or altered
id is refused before any lookup, and another process holding the same key (from
``operational.signingKeyEnv``) can trust an id this one issued. Without a configured key
a random one is generated at start: ids then stop verifying when the process restarts.
"""

from __future__ import annotations

import hmac
import re
import secrets

# 16 random bytes and a 16-byte tag, as 64 lowercase hex characters (visible ASCII, as
# MCP requires of session ids).
_NONCE_HEX = 32
_TAG_HEX = 32
MIN_KEY_BYTES = 16
_SESSION_ID = re.compile(r"[0-9a-f]{64}")


class Signer:
    def __init__(self, key: bytes):
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"a signing key needs at least {MIN_KEY_BYTES} bytes")
        self._key = key

    @classmethod
    def generated(cls) -> Signer:
        return cls(secrets.token_bytes(32))

    def __repr__(self) -> str:  # never the key
        return "Signer()"

    def new_session_id(self) -> str:
        nonce = secrets.token_hex(_NONCE_HEX // 2)
        return nonce + self._tag("session", nonce)

    def is_session_id(self, value: object) -> bool:
        """Whether ``value`` is an id this key issued (constant time in the tag)."""
        if not isinstance(value, str) or not _SESSION_ID.fullmatch(value):
            return False
        return hmac.compare_digest(value[_NONCE_HEX:], self._tag("session", value[:_NONCE_HEX]))

    def _tag(self, purpose: str, text: str) -> str:
        # The purpose keeps a tag made for one kind of value from verifying as another.
        return hmac.digest(self._key, f"{purpose}:{text}".encode(), "sha256").hex()[:_TAG_HEX]
