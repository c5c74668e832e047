"""The gateway's own access tokens on ``/mcp``: who is calling, when the gateway is the
authorization server.

A token verifies with the gateway's keys (current or earlier), for this issuer and this
resource; its grant must still be live (checked in the records at most every
``GRANT_RECHECK`` seconds per grant and process, so a revocation reaches every worker
within that time). The identity is the one the identity provider gave (its issuer and
subject), so per-user discovery, Cedar, rate limits and the admin view see the same
person as under ``oidc``. Only when some backend exchanges the caller's token (RFC 8693)
is the provider's token of the grant looked up (and refreshed) and carried along.

A token that verified is remembered (by its digest, until its ``exp``, at most
``VERIFIED_MAX``): a client sends the same token with every request, and its signature
need not be checked again; its grant still is.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from types import MappingProxyType

import jwt

from vmcp_actors.edge._auth import AuthError, IdentityProviderUnavailable, bearer_token, refusal_reason
from vmcp_actors.identity import Identity
from vmcp_actors.oauth._server import GatewayAuthorizationServer
from vmcp_actors.oauth._upstream import UpstreamRefused, UpstreamUnavailable

GRANT_RECHECK = 5.0
GRANT_CACHE_MAX = 10_000
VERIFIED_MAX = 10_000


class GatewayTokenAuthenticator:
    def __init__(self, server: GatewayAuthorizationServer, carries_upstream_token: bool,
                 clock: Callable[[], float] = time.monotonic):
        self.issuer = server.config.issuer
        self._server = server
        self._carries_upstream_token = carries_upstream_token
        self._clock = clock
        self._lock = threading.Lock()  # guards _checked (grant id -> when it was last seen live)
        self._checked: dict[str, float] = {}
        self._verified_lock = threading.Lock()  # guards _verified (token digest -> (exp, claims))
        self._verified: dict[bytes, tuple[float, MappingProxyType]] = {}
        server.grants.ended.append(self._forget)

    def _forget(self, grant_id: str) -> None:
        """A grant this process ended is refused here at once (others: within GRANT_RECHECK)."""
        with self._lock:
            self._checked.pop(grant_id, None)

    def authenticate(self, authorization: str | None) -> Identity:
        token = bearer_token(authorization)
        config = self._server.config
        claims = self._claims(token)
        grant_id, provider = claims.get("grant"), claims.get("idp")
        if not isinstance(grant_id, str) or not isinstance(provider, str):
            raise AuthError("token lacks its grant")
        if not self._live(grant_id):
            raise AuthError("token was revoked")
        upstream_token = None
        if self._carries_upstream_token:
            try:
                upstream_token = self._server.upstream.fresh_tokens(grant_id, config.refresh_token_ttl)["access_token"]
            except UpstreamRefused:
                self._server.grants.end(grant_id, "identity_provider_refused")
                raise AuthError("the identity provider no longer accepts this sign-in") from None
            except UpstreamUnavailable:
                raise IdentityProviderUnavailable() from None
        return Identity(provider, str(claims["sub"]), claims=claims, token=upstream_token)

    def _claims(self, token: str) -> MappingProxyType:
        """The claims of a token the gateway's keys signed for this resource (verified once,
        then remembered until it expires); AuthError otherwise."""
        digest = hashlib.sha256(token.encode()).digest()
        with self._verified_lock:
            known = self._verified.get(digest)
        if known is not None and known[0] > time.time():
            return known[1]
        config = self._server.config
        try:
            claims = self._server.keys.verify(token, issuer=config.issuer, audience=config.resource)
        except jwt.PyJWTError as error:
            raise AuthError(refusal_reason(error)) from None
        except (TypeError, ValueError):
            raise AuthError("malformed token") from None
        frozen = MappingProxyType(claims)
        with self._verified_lock:
            if len(self._verified) >= VERIFIED_MAX:
                self._verified.clear()  # many distinct tokens cost verifications, not memory
            self._verified[digest] = (float(claims["exp"]), frozen)
        return frozen

    def _live(self, grant_id: str) -> bool:
        now = self._clock()
        with self._lock:
            seen = self._checked.get(grant_id)
        if seen is not None and now - seen < GRANT_RECHECK:
            return True
        if not self._server.grants.alive(grant_id):
            with self._lock:
                self._checked.pop(grant_id, None)
            return False
        with self._lock:
            if len(self._checked) >= GRANT_CACHE_MAX:
                self._checked.clear()
            self._checked[grant_id] = now
        return True
