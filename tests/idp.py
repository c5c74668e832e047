"""A local identity provider for the test suite, speaking the real protocols over HTTP.

:class:`LocalIdP` serves a small Starlette app on an ephemeral loopback port:

* ``GET /.well-known/openid-configuration`` (also ``/.well-known/oauth-authorization-server``):
  OpenID Connect Discovery / RFC 8414 metadata.
* ``GET /jwks``: the public signing keys as an RFC 7517 JWK Set (one RSA 2048 and one
  EC P-256 key at start; :meth:`LocalIdP.rotate_rsa_key` adds more).
* ``POST /token``: RFC 8693 token exchange with client authentication by
  ``client_secret_basic`` or ``client_secret_post``; RFC 6749 section 5.2 error bodies.

Tokens are minted in-process with :meth:`LocalIdP.issue_token` (and the bad-token helpers
next to it); they are signed JWTs, verifiable by any client that fetches the JWKS.

Test controls on the instance: ``exchange_expires_in``, ``deny_audiences``,
``allowed_scopes``, ``require_client_auth``, :meth:`~LocalIdP.fail_next_exchanges`; and
inspection: ``exchanges`` (records without tokens or secrets), ``token_requests``,
``jwks_fetches``, ``discovery_fetches``.

Nothing here logs; neither tokens nor secrets are ever recorded.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, unquote_plus

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from vmcp_actors.demo._serve import ServedApp, serve_asgi_in_thread

TOKEN_EXCHANGE_GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
JWT_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:jwt"
FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"

NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}
_MULTI_VALUED = frozenset({"audience", "resource"})  # RFC 8693 2.1: may repeat

TimeLike = int | float | datetime


# ----------------------------------------------------------------------------------
# Keys
# ----------------------------------------------------------------------------------


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _int_bytes(value: int, length: int | None = None) -> bytes:
    return value.to_bytes(length or max(1, (value.bit_length() + 7) // 8), "big")


@dataclass(frozen=True)
class SigningKey:
    """One signing key pair of the IdP (the private half never leaves this process)."""

    kid: str
    algorithm: str  # "RS256" or "ES256"
    private_key: Any = field(repr=False)

    @property
    def public_key(self) -> Any:
        return self.private_key.public_key()

    def public_pem(self) -> bytes:
        return self.public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def public_jwk(self) -> dict[str, str]:
        """The RFC 7517 JWK of the public key (kty, kid, use, alg, n/e or crv/x/y)."""
        jwk: dict[str, str] = {"kid": self.kid, "use": "sig", "alg": self.algorithm}
        numbers = self.public_key.public_numbers()
        if isinstance(self.private_key, rsa.RSAPrivateKey):
            jwk.update(kty="RSA", n=_b64url(_int_bytes(numbers.n)), e=_b64url(_int_bytes(numbers.e)))
        else:
            jwk.update(kty="EC", crv="P-256",
                       x=_b64url(_int_bytes(numbers.x, 32)), y=_b64url(_int_bytes(numbers.y, 32)))
        return jwk


def _new_rsa(kid: str) -> SigningKey:
    return SigningKey(kid, "RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048))


def _new_ec(kid: str) -> SigningKey:
    return SigningKey(kid, "ES256", ec.generate_private_key(ec.SECP256R1()))


def _hs256(claims: Mapping[str, Any], headers: Mapping[str, Any], secret: bytes) -> str:
    """A hand-made HS256 JWS (PyJWT refuses PEM keys as HMAC secrets, which is the point)."""
    header = {"alg": "HS256", "typ": "JWT", **headers}
    signing_input = (
        _b64url(json.dumps(header, separators=(",", ":")).encode())
        + "."
        + _b64url(json.dumps(dict(claims), separators=(",", ":")).encode())
    )
    signature = hmac.new(secret, signing_input.encode("ascii"), hashlib.sha256).digest()
    return f"{signing_input}.{_b64url(signature)}"


def _epoch(value: TimeLike) -> int:
    return int(value.timestamp()) if isinstance(value, datetime) else int(value)


# ----------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExchangeRecord:
    """One token-endpoint request, as the IdP saw it. Never holds a token or a secret.

    ``client_id`` is the authenticated client (or, for a rejected or failed request,
    the one claimed); ``subject`` is set only once the subject token verified.
    ``outcome`` is ``"issued"`` or the RFC 6749 error code that was answered.
    """

    client_id: str | None
    subject: str | None
    audiences: tuple[str, ...]
    scopes: tuple[str, ...]
    outcome: str
    status: int
    auth_method: str | None = None  # client_secret_basic / client_secret_post / none
    resources: tuple[str, ...] = ()
    grant_type: str | None = None
    at: float = field(default_factory=time.monotonic)

    @property
    def audience(self) -> str | None:
        """The first requested audience (``audiences`` has all of them)."""
        return self.audiences[0] if self.audiences else None

    @property
    def ok(self) -> bool:
        return self.outcome == "issued"


class _TokenError(Exception):
    def __init__(self, error: str, description: str, status: int = 400) -> None:
        super().__init__(description)
        self.error = error
        self.description = description
        self.status = status


# ----------------------------------------------------------------------------------
# The IdP
# ----------------------------------------------------------------------------------


class LocalIdP:
    """A served OpenID provider with discovery, JWKS and RFC 8693 token exchange.

    ``LocalIdP().start()`` (or ``with LocalIdP() as idp:``) generates the keys and
    serves the app; ``stop()`` is idempotent.
    """

    def __init__(self, name: str = "idp") -> None:
        self.name = name
        # Test controls (change them at any time).
        self.exchange_expires_in: int = 300
        self.deny_audiences: set[str] = set()
        self.allowed_scopes: set[str] | None = None  # None: any scope may be requested
        self.require_client_auth: bool = False  # True: unknown/anonymous clients get invalid_client
        self._lock = threading.Lock()
        self._served: ServedApp | None = None
        self._keys: dict[str, SigningKey] = {}  # published, in kid order
        self._retired: dict[str, SigningKey] = {}  # dropped from the JWKS; still usable to mint tokens
        self._rsa_kid: str | None = None
        self._ec_kid: str | None = None
        self._rsa_serial = 0
        self._foreign: SigningKey | None = None
        self._clients: dict[str, str | None] = {}  # client_id -> secret (None: a public client)
        self._exchanges: list[ExchangeRecord] = []
        self._failures: list[tuple[str, int]] = []
        self._jwks_fetches = 0
        self._discovery_fetches = 0
        self._token_requests = 0
        self._opaque: dict[str, dict[str, Any]] = {}  # RFC 7662: opaque token -> its introspection answer
        self._introspections = 0

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> LocalIdP:
        if self._served is not None:
            return self
        if not self._keys:
            self.rotate_rsa_key()
            ec_key = _new_ec("ec-1")
            with self._lock:
                self._keys[ec_key.kid] = ec_key
                self._ec_kid = ec_key.kid
        self._served = serve_asgi_in_thread(self.app(), name=self.name)
        return self

    def stop(self) -> None:
        if self._served is not None:
            self._served.stop()

    def __enter__(self) -> LocalIdP:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self._served.url if self._served is not None else "not started"
        return f"<LocalIdP {self.name!r} {where}>"

    # -- addresses -------------------------------------------------------------------

    @property
    def issuer(self) -> str:
        if self._served is None:
            raise RuntimeError(f"IdP {self.name!r} is not started")
        return self._served.url

    @property
    def port(self) -> int:
        if self._served is None:
            raise RuntimeError(f"IdP {self.name!r} is not started")
        return self._served.port

    @property
    def jwks_url(self) -> str:
        return f"{self.issuer}/jwks"

    @property
    def token_url(self) -> str:
        return f"{self.issuer}/token"

    @property
    def discovery_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    # -- keys ------------------------------------------------------------------------

    def rotate_rsa_key(self, drop_old: bool = False) -> str:
        """Add a new RSA key (``rsa-N``) and make it the default signing key; returns its kid.

        Old keys stay in the JWKS unless ``drop_old`` (then the older RSA keys leave the
        JWKS; the EC key stays). Dropped keys can still mint tokens via ``issue_token(kid=...)``.
        """
        with self._lock:
            self._rsa_serial += 1
            kid = f"rsa-{self._rsa_serial}"
        key = _new_rsa(kid)
        with self._lock:
            if drop_old:
                for old in [k for k in self._keys.values() if k.algorithm.startswith("RS")]:
                    self._retired[old.kid] = self._keys.pop(old.kid)
            self._keys[kid] = key
            self._rsa_kid = kid
        return kid

    @property
    def current_kid(self) -> str:
        """The kid of the default (RSA) signing key."""
        if self._rsa_kid is None:
            raise RuntimeError(f"IdP {self.name!r} has no keys yet (start it first)")
        return self._rsa_kid

    @property
    def ec_kid(self) -> str:
        if self._ec_kid is None:
            raise RuntimeError(f"IdP {self.name!r} has no keys yet (start it first)")
        return self._ec_kid

    @property
    def kids(self) -> list[str]:
        """The kids currently published in the JWKS."""
        with self._lock:
            return list(self._keys)

    def jwks(self) -> dict[str, list[dict[str, str]]]:
        """The JWK Set document served at ``/jwks``."""
        with self._lock:
            keys = list(self._keys.values())
        return {"keys": [key.public_jwk() for key in keys]}

    def public_key_pem(self, kid: str | None = None) -> bytes:
        return self._key(kid or self.current_kid).public_pem()

    def _key(self, kid: str) -> SigningKey:
        with self._lock:
            key = self._keys.get(kid) or self._retired.get(kid)
        if key is None:
            raise KeyError(f"IdP {self.name!r} has no key {kid!r}")
        return key

    # -- clients ---------------------------------------------------------------------

    def register_client(self, client_id: str, secret: str | None = None) -> None:
        """Register a client: confidential with ``secret`` (Basic or form auth), else public."""
        with self._lock:
            self._clients[client_id] = secret

    # -- minting ---------------------------------------------------------------------

    def claims(
        self,
        subject: str,
        audience: str | Sequence[str] | None,
        *,
        expires_in: int = 300,
        not_before: TimeLike | None = None,
        issued_at: TimeLike | None = None,
        issuer: str | None = None,
        scope: str | Sequence[str] | None = None,
        extra_claims: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The claim set :meth:`issue_token` signs."""
        iat = _epoch(issued_at) if issued_at is not None else int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer if issuer is None else issuer,
            "sub": subject,
            "iat": iat,
            "exp": iat + int(expires_in),
            "jti": uuid.uuid4().hex,
        }
        if audience is not None:
            claims["aud"] = audience if isinstance(audience, str) else list(audience)
        if not_before is not None:
            claims["nbf"] = _epoch(not_before)
        if scope is not None:
            claims["scope"] = scope if isinstance(scope, str) else " ".join(scope)
        claims.update(extra_claims or {})
        return claims

    def issue_token(
        self,
        subject: str,
        audience: str | Sequence[str] | None,
        *,
        expires_in: int = 300,
        not_before: TimeLike | None = None,
        issued_at: TimeLike | None = None,
        issuer: str | None = None,
        kid: str | None = None,
        algorithm: str | None = None,
        scope: str | Sequence[str] | None = None,
        extra_claims: Mapping[str, Any] | None = None,
    ) -> str:
        """A JWT signed by one of the IdP's keys (default: the current RSA key, RS256).

        ``algorithm="ES256"`` signs with the EC key; ``kid`` picks any key the IdP has or
        had (its algorithm unless ``algorithm`` says otherwise). ``exp = iat + expires_in``;
        ``issued_at``/``not_before`` take epoch seconds or datetimes.
        """
        if algorithm is not None and not algorithm.startswith(("RS", "PS", "ES")):
            raise ValueError(f"issue_token signs asymmetrically; use the bad-token helpers for {algorithm!r}")
        if kid is None:
            kid = self.ec_kid if algorithm is not None and algorithm.startswith("ES") else self.current_kid
        key = self._key(kid)
        claims = self.claims(
            subject, audience, expires_in=expires_in, not_before=not_before, issued_at=issued_at,
            issuer=issuer, scope=scope, extra_claims=extra_claims,
        )
        return jwt.encode(claims, key.private_key, algorithm=algorithm or key.algorithm,
                          headers={"kid": key.kid, "typ": "JWT"})

    # -- bad tokens ------------------------------------------------------------------

    def token_signed_by_foreign_key(self, subject: str, audience: str | Sequence[str] | None, **kwargs: Any) -> str:
        """RS256 with a key the IdP never published, under the current kid."""
        if self._foreign is None:
            self._foreign = _new_rsa("foreign")
        claims = self.claims(subject, audience, **kwargs)
        return jwt.encode(claims, self._foreign.private_key, algorithm="RS256",
                          headers={"kid": self.current_kid, "typ": "JWT"})

    def token_with_unknown_kid(self, subject: str, audience: str | Sequence[str] | None, **kwargs: Any) -> str:
        """Signed by the current key, but naming a kid that is not in the JWKS."""
        claims = self.claims(subject, audience, **kwargs)
        return jwt.encode(claims, self._key(self.current_kid).private_key, algorithm="RS256",
                          headers={"kid": "unknown-kid", "typ": "JWT"})

    def unsigned_token(self, subject: str, audience: str | Sequence[str] | None, **kwargs: Any) -> str:
        """``alg: none`` (empty signature), naming the current kid."""
        claims = self.claims(subject, audience, **kwargs)
        header = {"alg": "none", "typ": "JWT", "kid": self.current_kid}
        return (_b64url(json.dumps(header, separators=(",", ":")).encode()) + "."
                + _b64url(json.dumps(claims, separators=(",", ":")).encode()) + ".")

    def hmac_token(self, subject: str, audience: str | Sequence[str] | None, secret: str | bytes,
                   **kwargs: Any) -> str:
        """HS256 with ``secret``, naming the current kid (HMAC tokens must be refused)."""
        key = secret.encode() if isinstance(secret, str) else secret
        return _hs256(self.claims(subject, audience, **kwargs), {"kid": self.current_kid}, key)

    def hmac_with_public_key_token(self, subject: str, audience: str | Sequence[str] | None, **kwargs: Any) -> str:
        """The algorithm-confusion attack: HS256 keyed with the PEM of the current RSA public key."""
        return _hs256(self.claims(subject, audience, **kwargs), {"kid": self.current_kid}, self.public_key_pem())

    def expired_token(self, subject: str, audience: str | Sequence[str] | None, **kwargs: Any) -> str:
        """Properly signed, issued an hour ago, expired 50 minutes ago."""
        kwargs.setdefault("issued_at", time.time() - 3600)
        kwargs.setdefault("expires_in", 600)
        return self.issue_token(subject, audience, **kwargs)

    # -- controls and inspection -----------------------------------------------------

    def fail_next_exchanges(self, n: int, error: str = "temporarily_unavailable", status: int = 503) -> None:
        """The next ``n`` token requests answer ``{"error": error}`` with ``status``."""
        with self._lock:
            self._failures.extend([(error, status)] * n)

    @property
    def exchanges(self) -> list[ExchangeRecord]:
        """A snapshot of every token-endpoint request, in arrival order."""
        with self._lock:
            return list(self._exchanges)

    def successful_exchanges(self) -> list[ExchangeRecord]:
        return [record for record in self.exchanges if record.ok]

    @property
    def token_requests(self) -> int:
        with self._lock:
            return self._token_requests

    @property
    def jwks_fetches(self) -> int:
        with self._lock:
            return self._jwks_fetches

    @property
    def discovery_fetches(self) -> int:
        with self._lock:
            return self._discovery_fetches

    def clear_records(self) -> None:
        """Forget exchanges and zero the counters (keys, clients and controls stay)."""
        with self._lock:
            self._exchanges.clear()
            self._jwks_fetches = self._discovery_fetches = self._token_requests = 0

    # -- documents -------------------------------------------------------------------

    def discovery_document(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "jwks_uri": self.jwks_url,
            "token_endpoint": self.token_url,
            "introspection_endpoint": self.introspection_url,
            "grant_types_supported": [TOKEN_EXCHANGE_GRANT],
            "response_types_supported": ["token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256", "ES256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
        }

    # -- ASGI ------------------------------------------------------------------------

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        return Starlette(routes=[
            Route("/.well-known/openid-configuration", self._discovery, methods=["GET"]),
            Route("/.well-known/oauth-authorization-server", self._discovery, methods=["GET"]),
            Route("/jwks", self._jwks, methods=["GET"]),
            Route("/token", self._token, methods=["POST"]),
            Route("/introspect", self._introspect, methods=["POST"]),
        ])

    # -- RFC 7662 introspection of opaque tokens ---------------------------------------

    @property
    def introspection_url(self) -> str:
        return f"{self.issuer}/introspect"

    def issue_opaque_token(self, subject: str, audience: str | None, expires_in: int = 300,
                           **claims: Any) -> str:
        """An opaque (non-JWT) access token, active until it expires or is revoked."""
        token = "opaque-" + secrets.token_urlsafe(24)
        now = int(time.time())
        record = {"active": True, "sub": subject, "iss": self.issuer, "exp": now + expires_in, "iat": now,
                  "token_type": "Bearer", **claims}
        if audience is not None:
            record["aud"] = audience
        with self._lock:
            self._opaque[token] = record
        return token

    def revoke_opaque(self, token: str) -> None:
        with self._lock:
            self._opaque.pop(token, None)

    @property
    def introspections(self) -> int:
        with self._lock:
            return self._introspections

    async def _introspect(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        with self._lock:
            self._introspections += 1
        try:
            form = await self._read_form(request)
            client_id, secrets_given, _method = self._client_credentials(request, form)
            if client_id is None or client_id not in self._clients:
                raise _TokenError("invalid_client", "introspection needs a registered client", 401)
            self._authenticate(client_id, secrets_given)
        except _TokenError as exc:
            return JSONResponse({"error": exc.error, "error_description": exc.description},
                                status_code=exc.status, headers=dict(NO_STORE))
        token = _single(form, "token") or ""
        with self._lock:
            record = dict(self._opaque.get(token) or {})
        if not record or record["exp"] <= time.time():
            return JSONResponse({"active": False}, headers=dict(NO_STORE))
        return JSONResponse(record, headers=dict(NO_STORE))

    async def _discovery(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        with self._lock:
            self._discovery_fetches += 1
        return JSONResponse(self.discovery_document())

    async def _jwks(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        with self._lock:
            self._jwks_fetches += 1
        return JSONResponse(self.jwks(), media_type="application/jwk-set+json")

    async def _token(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        with self._lock:
            self._token_requests += 1
        seen: dict[str, Any] = {"client_id": None, "subject": None, "audiences": (), "scopes": (),
                                "auth_method": None, "resources": (), "grant_type": None}
        try:
            form = await self._read_form(request)
            seen["grant_type"] = _single(form, "grant_type")
            seen["audiences"] = tuple(form.get("audience", ()))
            seen["resources"] = tuple(form.get("resource", ()))
            seen["scopes"] = tuple((_single(form, "scope") or "").split())
            seen["client_id"], secrets, seen["auth_method"] = self._client_credentials(request, form)
            with self._lock:
                failure = self._failures.pop(0) if self._failures else None
            if failure is not None:
                raise _TokenError(failure[0], "simulated failure", failure[1])
            self._authenticate(seen["client_id"], secrets)
            body = self._exchange(form, seen)
        except _TokenError as exc:
            self._remember(seen, exc.error, exc.status)
            headers = dict(NO_STORE)
            if exc.status == 401:
                headers["WWW-Authenticate"] = f'Basic realm="{self.name}"'
            return JSONResponse({"error": exc.error, "error_description": exc.description},
                                status_code=exc.status, headers=headers)
        self._remember(seen, "issued", 200)
        return JSONResponse(body, headers=NO_STORE)

    def _remember(self, seen: dict[str, Any], outcome: str, status: int) -> None:
        record = ExchangeRecord(outcome=outcome, status=status, **seen)
        with self._lock:
            self._exchanges.append(record)

    @staticmethod
    async def _read_form(request: Any) -> dict[str, list[str]]:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != FORM_CONTENT_TYPE:
            raise _TokenError("invalid_request", f"the token request must be {FORM_CONTENT_TYPE}")
        try:
            pairs = parse_qsl((await request.body()).decode("utf-8"), keep_blank_values=True)
        except (UnicodeDecodeError, ValueError):
            raise _TokenError("invalid_request", "malformed form body") from None
        form: dict[str, list[str]] = {}
        for key, value in pairs:
            form.setdefault(key, []).append(value)
        repeated = sorted(k for k, v in form.items() if len(v) > 1 and k not in _MULTI_VALUED)
        if repeated:
            raise _TokenError("invalid_request", f"parameters repeated: {', '.join(repeated)}")
        return form

    @staticmethod
    def _client_credentials(request: Any, form: dict[str, list[str]]) -> tuple[str | None, tuple[str, ...], str]:
        """(client_id, secret candidates, method) from the Basic header or the form (RFC 6749 2.3.1)."""
        form_id, form_secret = _single(form, "client_id"), _single(form, "client_secret")
        authorization = request.headers.get("authorization")
        if authorization is not None:
            scheme, _, credentials = authorization.partition(" ")
            if scheme.lower() != "basic":
                raise _TokenError("invalid_client", "unsupported client authentication scheme", 401)
            try:
                decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                raise _TokenError("invalid_client", "malformed Basic credentials", 401) from None
            raw_id, sep, raw_secret = decoded.partition(":")
            if not sep:
                raise _TokenError("invalid_client", "malformed Basic credentials", 401)
            # RFC 6749 2.3.1 form-encodes both before base64; many clients (requests'
            # auth=(id, secret) among them) do not, so the raw secret is accepted too.
            client_id = unquote_plus(raw_id)
            secret = (unquote_plus(raw_secret), raw_secret)
            if form_secret is not None:
                raise _TokenError("invalid_request", "more than one client authentication method")
            if form_id is not None and form_id != client_id:
                raise _TokenError("invalid_request", "client_id does not match the Basic credentials")
            return client_id, secret, "client_secret_basic"
        if form_secret is not None:
            return form_id, (form_secret,), "client_secret_post"
        return form_id, (), "none"

    def _authenticate(self, client_id: str | None, secrets: tuple[str, ...]) -> None:
        with self._lock:
            registered = client_id in self._clients
            expected = self._clients.get(client_id) if client_id is not None else None
        if client_id is None:
            if self.require_client_auth:
                raise _TokenError("invalid_client", "client authentication required", 401)
            return
        if not registered:
            if self.require_client_auth or secrets:
                raise _TokenError("invalid_client", "unknown client", 401)
            return  # an unregistered public client
        if expected is None:
            if secrets:
                raise _TokenError("invalid_client", "public client presented a secret", 401)
            return
        if not any(hmac.compare_digest(secret.encode(), expected.encode()) for secret in secrets):
            raise _TokenError("invalid_client", "client authentication failed", 401)

    def _exchange(self, form: dict[str, list[str]], seen: dict[str, Any]) -> dict[str, Any]:
        grant_type = _single(form, "grant_type")
        if grant_type is None:
            raise _TokenError("invalid_request", "grant_type is required")
        if grant_type != TOKEN_EXCHANGE_GRANT:
            raise _TokenError("unsupported_grant_type", "only token exchange is supported")
        subject_token = _single(form, "subject_token")
        subject_token_type = _single(form, "subject_token_type")
        if not subject_token or not subject_token_type:
            raise _TokenError("invalid_request", "subject_token and subject_token_type are required")
        if subject_token_type != ACCESS_TOKEN_TYPE:
            raise _TokenError("invalid_request", "unsupported subject_token_type")
        requested = _single(form, "requested_token_type")
        if requested is not None and requested not in (ACCESS_TOKEN_TYPE, JWT_TOKEN_TYPE):
            raise _TokenError("invalid_request", "unsupported requested_token_type")
        subject = self._verify_subject_token(subject_token)
        seen["subject"] = subject
        audiences = list(dict.fromkeys([*seen["audiences"], *seen["resources"]]))
        if not audiences:
            raise _TokenError("invalid_request", "audience or resource is required")
        denied = [audience for audience in audiences if audience in self.deny_audiences]
        if denied:
            raise _TokenError("invalid_target", "the requested audience is not allowed")
        scopes = list(seen["scopes"])
        allowed = self.allowed_scopes
        if allowed is not None and not set(scopes) <= allowed:
            raise _TokenError("invalid_scope", "a requested scope is not allowed")
        expires_in = int(self.exchange_expires_in)
        extra: dict[str, Any] = {}
        client_id = seen["client_id"]
        if client_id is not None:
            extra = {"client_id": client_id, "act": {"sub": client_id}}
        token = self.issue_token(
            subject, audiences[0] if len(audiences) == 1 else audiences, expires_in=expires_in,
            scope=" ".join(scopes) if scopes else None, extra_claims=extra,
        )
        body: dict[str, Any] = {
            "access_token": token,
            "issued_token_type": ACCESS_TOKEN_TYPE,
            "token_type": "Bearer",
            "expires_in": expires_in,
        }
        if scopes:
            body["scope"] = " ".join(scopes)
        return body

    def _verify_subject_token(self, token: str) -> str:
        """The ``sub`` of a token this IdP signed with a published key (else invalid_grant)."""
        try:
            header = jwt.get_unverified_header(token)
            with self._lock:
                key = self._keys.get(header.get("kid"))
            if key is None:
                raise _TokenError("invalid_grant", "subject token signed by an unknown key")
            claims = jwt.decode(
                token, key.public_key, algorithms=[key.algorithm], issuer=self.issuer,
                options={"verify_aud": False, "require": ["exp", "iss", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise _TokenError("invalid_grant", f"subject token rejected ({type(exc).__name__})") from None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise _TokenError("invalid_grant", "subject token has no subject")
        return subject


def _single(form: dict[str, list[str]], key: str) -> str | None:
    values = form.get(key)
    return values[0] if values else None


__all__ = [
    "ACCESS_TOKEN_TYPE",
    "ExchangeRecord",
    "JWT_TOKEN_TYPE",
    "LocalIdP",
    "SigningKey",
    "TOKEN_EXCHANGE_GRANT",
]
