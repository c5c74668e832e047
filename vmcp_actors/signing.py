"""Values the gateway hands clients and must trust later, signed or sealed with one key.

A session id is a random nonce and an HMAC-SHA256 tag over it, so a forged or altered
id is refused before any lookup, and another process holding the same key (from
``operational.signingKeyEnv``) can trust an id this one issued. Without a configured key
a random one is generated at start: ids then stop verifying when the process restarts.

A ``requestState`` (MCP 2026-07-28 multi round-trip requests) is sealed: AES-256-GCM with
a key derived from the same one (HKDF, its own purpose), so a client can neither read nor
alter it and another process with the key can open it. The sealed payload carries its
purpose and expiry; ``unseal`` refuses anything else before its contents are looked at.

A handle (a task id the gateway gives for a backend's task) must be the same text every
time the same task is named, in an answer or a notification alike: ``seal_handle`` is
deterministic (AES-256-GCM-SIV under a nonce derived from the payload), so it reveals
only that two handles name the same thing.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import re
import secrets
import time
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESGCMSIV
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

# 16 random bytes and a 16-byte tag, as 64 lowercase hex characters (visible ASCII, as
# MCP requires of session ids).
_NONCE_HEX = 32
_TAG_HEX = 32
MIN_KEY_BYTES = 16
_SESSION_ID = re.compile(r"[0-9a-f]{64}")


_SEAL_NONCE_BYTES = 12
MAX_SEALED_CHARS = 64 * 1024  # a sealed value longer than this was not made here


class Unsealable(ValueError):
    """A sealed value that is not one this key made for this purpose, or has expired.
    The message is for logs only: clients are told no more than that it is invalid."""


class Signer:
    def __init__(self, key: bytes):
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"a signing key needs at least {MIN_KEY_BYTES} bytes")
        self._key = key
        sealing_key = HKDF(SHA256(), 32, salt=None, info=b"vmcp-actors sealed values").derive(key)
        self._aead = AESGCM(sealing_key)
        handle_key = HKDF(SHA256(), 32, salt=None, info=b"vmcp-actors handles").derive(key)
        self._handles = AESGCMSIV(handle_key)
        self._handle_nonce_key = HKDF(SHA256(), 32, salt=None, info=b"vmcp-actors handle nonces").derive(key)

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

    def digest(self, purpose: str, text: str) -> str:
        """A keyed digest of ``text`` (64 hex): names a shared-cache entry without revealing whose it is."""
        return hmac.digest(self._key, f"{purpose}:{text}".encode(), "sha256").hex()

    def encrypt(self, purpose: str, data: bytes) -> bytes:
        """``data`` encrypted and authenticated for ``purpose`` (records at rest in a shared store)."""
        nonce = secrets.token_bytes(_SEAL_NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, data, purpose.encode())

    def decrypt(self, purpose: str, blob: bytes) -> bytes:
        """What ``encrypt`` took; Unsealable when altered, or made by another key or for another purpose."""
        try:
            return self._aead.decrypt(blob[:_SEAL_NONCE_BYTES], blob[_SEAL_NONCE_BYTES:], purpose.encode())
        except Exception as error:  # InvalidTag, or too short to hold a nonce and a tag
            raise Unsealable(f"not a value this key encrypted for {purpose}") from error

    def seal(self, purpose: str, payload: dict[str, Any], ttl: float) -> str:
        """``payload`` sealed for ``purpose`` until ``ttl`` seconds from now (URL-safe text)."""
        plain = json.dumps({"p": purpose, "exp": time.time() + ttl, "v": payload}, separators=(",", ":"))
        nonce = secrets.token_bytes(_SEAL_NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, plain.encode(), purpose.encode())
        return base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")

    def unseal(self, purpose: str, token: object) -> dict[str, Any]:
        """The payload sealed for ``purpose``; Unsealable when it was altered, made by
        another key or for another purpose, or has expired."""
        if not isinstance(token, str) or not token or len(token) > MAX_SEALED_CHARS:
            raise Unsealable("not a sealed value")
        try:
            raw = _canonical_b64(token)
            plain = self._aead.decrypt(raw[:_SEAL_NONCE_BYTES], raw[_SEAL_NONCE_BYTES:], purpose.encode())
            data = json.loads(plain)
        except (binascii.Error, ValueError, InvalidTag):
            raise Unsealable("altered, or sealed with another key or for another purpose") from None
        if not isinstance(data, dict) or data.get("p") != purpose or not isinstance(data.get("v"), dict):
            raise Unsealable("sealed for another purpose")
        if not isinstance(data.get("exp"), (int, float)) or data["exp"] < time.time():
            raise Unsealable("expired")
        return data["v"]

    def seal_handle(self, purpose: str, payload: dict[str, Any]) -> str:
        """``payload`` sealed for ``purpose``, the same text for the same payload (URL-safe)."""
        plain = json.dumps({"p": purpose, "v": payload}, separators=(",", ":"), sort_keys=True).encode()
        nonce = hmac.digest(self._handle_nonce_key, plain, "sha256")[:_SEAL_NONCE_BYTES]
        sealed = self._handles.encrypt(nonce, plain, purpose.encode())
        return base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")

    def open_handle(self, purpose: str, token: object) -> dict[str, Any]:
        """What ``seal_handle`` sealed for ``purpose``; Unsealable otherwise."""
        if not isinstance(token, str) or not token or len(token) > MAX_SEALED_CHARS:
            raise Unsealable("not a handle")
        try:
            raw = _canonical_b64(token)
            data = json.loads(self._handles.decrypt(raw[:_SEAL_NONCE_BYTES], raw[_SEAL_NONCE_BYTES:],
                                                    purpose.encode()))
        except (binascii.Error, ValueError, InvalidTag):
            raise Unsealable("altered, or sealed with another key or for another purpose") from None
        if not isinstance(data, dict) or data.get("p") != purpose or not isinstance(data.get("v"), dict):
            raise Unsealable("sealed for another purpose")
        return data["v"]

    def _tag(self, purpose: str, text: str) -> str:
        # The purpose keeps a tag made for one kind of value from verifying as another.
        return hmac.digest(self._key, f"{purpose}:{text}".encode(), "sha256").hex()[:_TAG_HEX]


def _canonical_b64(token: str) -> bytes:
    """The bytes of URL-safe base64 without padding, written the one way ``seal`` writes
    them: another spelling of the same bytes (padding, the standard alphabet, other unused
    bits) is refused, so a sealed value has one text (a replay check can compare texts)."""
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    if base64.urlsafe_b64encode(raw).decode().rstrip("=") != token:
        raise ValueError("not canonical base64")
    return raw
