"""Incoming authentication: who is calling, from the request's bearer token.

``anonymous`` (the default) lets everyone in as the anonymous caller. ``oidc`` verifies
a JWT with PyJWT against the issuer's JWKS: the signature (allowed algorithms only, never
``none`` or HMAC), ``iss``, ``aud``, ``exp``/``nbf`` with a small leeway. Keys are cached;
an unknown ``kid`` refetches the JWKS once, at most every ``MIN_JWKS_REFETCH`` seconds, so
tokens with made-up key ids cannot hammer the IdP. Nothing is fetched until the first
token arrives.

With ``introspectionUrl``, a token that is not a JWT is asked about (RFC 7662) as the
configured client: it must be ``active``, issued by the issuer (when the answer says),
for the audience and unexpired. An answer is reused for at most ``INTROSPECTION_TTL``
seconds (never past the token's ``exp``), keyed by the token's digest.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, Protocol

import jwt
import requests

from vmcp_actors.config import OidcConfig
from vmcp_actors.identity import Identity

logger = logging.getLogger(__name__)

# The shortest gap between two JWKS fetches caused by unknown key ids.
MIN_JWKS_REFETCH = 30.0
# How long a failed first fetch answers 503 before the IdP is asked again.
JWKS_RETRY_AFTER_FAILURE = 5.0
IDP_TIMEOUT = 10.0
INTROSPECTION_TTL = 60.0
INTROSPECTION_CACHE_MAX = 10_000


class AuthError(Exception):
    """The request is not authenticated: HTTP 401. ``reason`` is safe to show (it never
    contains the token); ``error`` is the RFC 6750 code, None when no credentials came."""

    def __init__(self, reason: str, error: str | None = "invalid_token"):
        super().__init__(reason)
        self.reason = reason
        self.error = error


class IdentityProviderUnavailable(Exception):
    """The IdP's keys could not be fetched: HTTP 503, the caller's token may be fine."""


class Authenticator(Protocol):
    issuer: str | None

    def authenticate(self, authorization: str | None) -> Identity | None: ...


class AnonymousAuthenticator:
    issuer = None

    def authenticate(self, authorization: str | None) -> Identity | None:
        return None


class JwksKeys:
    """The issuer's signing keys by kid, fetched lazily and refetched on an unknown kid."""

    def __init__(self, issuer: str, jwks_url: str | None, http: requests.Session,
                 clock: Callable[[], float] = time.monotonic):
        self._issuer = issuer.rstrip("/")
        self._jwks_url = jwks_url
        self._http = http
        self._clock = clock
        self._keys: dict[str | None, jwt.PyJWK] | None = None
        # Only refetches caused by unknown key ids are rate-limited: a rotation right
        # after the first fetch must still be picked up at once.
        self._last_unknown_kid_refetch = float("-inf")
        self._last_failure = float("-inf")
        self._lock = threading.Lock()  # guards the keys and the refetch clocks

    def key_for(self, kid: str | None) -> jwt.PyJWK:
        with self._lock:
            if self._keys is None:
                if self._clock() - self._last_failure < JWKS_RETRY_AFTER_FAILURE:
                    raise IdentityProviderUnavailable()  # a failing IdP is not asked again at once
                self._refresh()
            elif kid not in self._keys and self._clock() - self._last_unknown_kid_refetch >= MIN_JWKS_REFETCH:
                self._last_unknown_kid_refetch = self._clock()
                self._refresh()  # the IdP may have rotated its keys
            keys = self._keys
        if kid is None and len(keys) == 1:
            return next(iter(keys.values()))
        key = keys.get(kid)
        if key is None:
            raise AuthError("token signed with an unknown key")
        return key

    def _refresh(self) -> None:
        try:
            url = self._jwks_url or self._discover_jwks_url()
            response = self._http.get(url, timeout=IDP_TIMEOUT, allow_redirects=False)
            response.raise_for_status()
            key_set = jwt.PyJWKSet.from_dict(response.json())
        except (requests.RequestException, ValueError, jwt.PyJWKSetError) as error:
            logger.warning("could not fetch the signing keys of issuer %s: %s", self._issuer, error.__class__.__name__)
            self._last_failure = self._clock()
            if self._keys is None:
                raise IdentityProviderUnavailable() from None
            return  # keep serving with the keys we have
        self._keys = {key.key_id: key for key in key_set.keys}
        logger.info("fetched %d signing keys of issuer %s", len(self._keys), self._issuer)

    def _discover_jwks_url(self) -> str:
        response = self._http.get(f"{self._issuer}/.well-known/openid-configuration", timeout=IDP_TIMEOUT,
                                  allow_redirects=False)
        response.raise_for_status()
        jwks_uri = response.json().get("jwks_uri")
        if not isinstance(jwks_uri, str) or not jwks_uri.startswith(("https://", "http://")):
            raise ValueError("no jwks_uri in the discovery document")
        self._jwks_url = jwks_uri
        return jwks_uri


class Introspection:
    """RFC 7662 for opaque tokens, with a short cache of the answers."""

    def __init__(self, oidc: OidcConfig, client_secret: str | None, http: requests.Session):
        self._oidc = oidc
        self._auth = (oidc.client_id, client_secret or "") if oidc.client_id else None
        self._http = http
        self._lock = threading.Lock()  # guards _answers (the introspection cache)
        self._answers: dict[bytes, tuple[float, Identity]] = {}

    def identity(self, token: str) -> Identity:
        digest = hashlib.sha256(token.encode()).digest()
        now = time.time()
        with self._lock:
            cached = self._answers.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        claims = self._ask(token)
        if claims.get("active") is not True:
            raise AuthError("token is not active")
        issuer = claims.get("iss", self._oidc.issuer)
        if issuer != self._oidc.issuer:
            raise AuthError("token was issued by another issuer")
        audience = claims.get("aud")
        audiences = audience if isinstance(audience, list) else [audience] if isinstance(audience, str) else []
        if self._oidc.audience not in audiences:
            raise AuthError("token is not for this audience")
        expires = claims.get("exp")
        if not isinstance(expires, (int, float)) or expires + self._oidc.clock_skew <= now:
            raise AuthError("token expired")
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise AuthError("token has no subject")
        identity = Identity(issuer, subject, claims=MappingProxyType(dict(claims)), token=token)
        with self._lock:
            if len(self._answers) >= INTROSPECTION_CACHE_MAX:
                self._answers.clear()  # a flood of distinct tokens costs lookups, not memory
            self._answers[digest] = (min(now + INTROSPECTION_TTL, float(expires)), identity)
        return identity

    def _ask(self, token: str) -> dict[str, Any]:
        assert self._oidc.introspection_url is not None
        try:
            response = self._http.post(self._oidc.introspection_url, data={
                "token": token, "token_type_hint": "access_token"}, auth=self._auth,
                headers={"Accept": "application/json"}, timeout=IDP_TIMEOUT, allow_redirects=False)
        except requests.RequestException:
            logger.warning("token introspection failed: the identity provider cannot be reached")
            raise IdentityProviderUnavailable() from None
        if response.status_code != 200:
            logger.warning("token introspection answered HTTP %d (is incomingAuth.oidc.clientId registered?)",
                           response.status_code)
            raise IdentityProviderUnavailable()
        try:
            claims = response.json()
        except ValueError:
            raise IdentityProviderUnavailable() from None
        if not isinstance(claims, dict):
            raise IdentityProviderUnavailable()
        return claims


class OidcAuthenticator:
    def __init__(self, oidc: OidcConfig, http: requests.Session | None = None, client_secret: str | None = None):
        self._oidc = oidc
        self.issuer = oidc.issuer
        session = http if http is not None else requests.Session()
        session.trust_env = False
        self._keys = JwksKeys(oidc.issuer, oidc.jwks_url, session)
        self._introspection = Introspection(oidc, client_secret, session) if oidc.introspection_url else None

    def authenticate(self, authorization: str | None) -> Identity:
        token = bearer_token(authorization)
        if self._introspection is not None and token.count(".") != 2:
            return self._introspection.identity(token)  # opaque: not a JWT
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError:
            raise AuthError("malformed token") from None
        algorithm = header.get("alg")
        if algorithm not in self._oidc.algorithms:
            raise AuthError(f"token algorithm {str(algorithm)[:16]!r} is not allowed")
        key = self._keys.key_for(header.get("kid"))
        if not key_fits(key, algorithm):
            raise AuthError("token algorithm does not match its signing key")
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[algorithm],
                audience=self._oidc.audience,
                issuer=self._oidc.issuer,
                leeway=self._oidc.clock_skew,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as error:
            raise AuthError(refusal_reason(error)) from None
        except (TypeError, ValueError):  # a key PyJWT cannot use with this algorithm
            raise AuthError("token algorithm does not match its signing key") from None
        return Identity(claims["iss"], str(claims["sub"]), claims=MappingProxyType(claims), token=token)


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer`` header; AuthError without one."""
    if not authorization:
        raise AuthError("missing bearer token", error=None)
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthError("the Authorization header must be 'Bearer <token>'", error="invalid_request")
    return token


def key_fits(key: jwt.PyJWK, algorithm: str) -> bool:
    """An RSA key signs RS*/PS*, an EC key ES*, an OKP key EdDSA: a token naming another
    algorithm than its key's family is rejected before PyJWT tries the key."""
    families = {"RSA": ("RS", "PS"), "EC": ("ES",), "OKP": ("EdDSA",)}
    return algorithm.startswith(families.get(key.key_type, ()))


def refusal_reason(error: jwt.PyJWTError) -> str:
    """Which check failed, in words that never include the token."""
    reasons: list[tuple[type[Exception], str]] = [
        (jwt.ExpiredSignatureError, "token expired"),
        (jwt.ImmatureSignatureError, "token not valid yet"),
        (jwt.InvalidAudienceError, "token audience is not this server"),
        (jwt.InvalidIssuerError, "token issuer is not trusted"),
        (jwt.InvalidSignatureError, "token signature does not verify"),
        (jwt.InvalidAlgorithmError, "token algorithm is not allowed"),
        (jwt.MissingRequiredClaimError, "token lacks a required claim"),
        (jwt.DecodeError, "malformed token"),
    ]
    for kind, reason in reasons:
        if isinstance(error, kind):
            if isinstance(error, jwt.MissingRequiredClaimError):
                return f"token lacks the {error.claim!r} claim"
            return reason
    return "token rejected"


def build_authenticator(oidc: OidcConfig | None, client_secret: str | None = None) -> Authenticator:
    return AnonymousAuthenticator() if oidc is None else OidcAuthenticator(oidc, client_secret=client_secret)


def www_authenticate(resource_metadata_url: str, error: AuthError, scopes: tuple[str, ...] = ()) -> str:
    parts = ['Bearer realm="mcp"', f'resource_metadata="{resource_metadata_url}"']
    if scopes:
        parts.append('scope="{}"'.format(" ".join(scopes)))
    if error.error:
        parts.append(f'error="{error.error}"')
        parts.append('error_description="{}"'.format(error.reason.replace('"', "'")))
    return ", ".join(parts)


def protected_resource_metadata(resource: str, issuer: str, name: str,
                                scopes: tuple[str, ...] = ()) -> dict[str, Any]:
    """RFC 9728: where this resource's tokens come from (and, when configured, the scopes)."""
    metadata: dict[str, Any] = {
        "resource": resource,
        "authorization_servers": [issuer],
        "bearer_methods_supported": ["header"],
        "resource_name": name,
    }
    if scopes:
        metadata["scopes_supported"] = list(scopes)
    return metadata
