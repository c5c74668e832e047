"""The authorization server: Authlib's grants and endpoints over the gateway's records.

A sign-in goes: the client's ``authorize`` request is validated (client, redirect URI,
PKCE S256, RFC 8707 ``resource``) and kept as a *flow*, bound to the browser by a cookie;
the person signs in at the identity provider (``UpstreamIdp``); back at the callback the
gateway knows who it is and shows its consent page (unless this person already approved
this client); on approval Authlib issues the code, with RFC 9207 ``iss``.

The code is used once (taken from the records atomically; a second use ends the grant
it made). It yields a *grant* (a refresh family): a JWT access token for the resource,
and an opaque refresh token stored only as a digest, rotated on every use. A rotated
token presented again within ``refreshGracePeriod`` still gets a working pair (clients
retry lost answers); after that, its replay ends the grant. Every refresh also checks the
provider's tokens of the grant, refreshing them when needed: a person the provider no
longer accepts gets no new tokens.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

from authlib.oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import (
    AuthorizationCodeMixin,
    InvalidGrantError,
    InvalidRequestError,
    OAuth2Error,
    OAuth2Request,
    TokenMixin,
)
from authlib.oauth2.rfc6749.grants import AuthorizationCodeGrant, RefreshTokenGrant
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oauth2.rfc9207 import IssuerParameter

from vmcp_actors.config import OAuthServerConfig
from vmcp_actors.oauth._clients import CimdClients, CimdUnavailable, GatewayClient, RegisteredClients
from vmcp_actors.oauth._keys import TokenKeys
from vmcp_actors.oauth._records import OAuthRecords
from vmcp_actors.oauth._upstream import ID_TOKEN_CLAIMS, UpstreamIdp, UpstreamRefused, UpstreamUnavailable

logger = logging.getLogger(__name__)

FLOW_TTL = 900.0  # a sign-in must finish within 15 minutes
USED_CODE_TTL = 600.0  # how long a used code is remembered, to end what it made when reused
MAX_SCOPE_CHARS = 1000


def same_resource(given: str, resource: str) -> bool:
    """RFC 8707 resources compare as URLs: scheme and host in any case, no trailing slash."""
    try:
        parts, ours = urlsplit(given.rstrip("/")), urlsplit(resource)
    except ValueError:
        return False
    return (parts.scheme.lower(), (parts.netloc or "").lower(), parts.path, parts.query) == \
        (ours.scheme, ours.netloc.lower(), ours.path, ours.query)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class InvalidTargetError(OAuth2Error):
    error = "invalid_target"  # RFC 8707


class TemporarilyUnavailable(OAuth2Error):
    """Something on the gateway's side (the identity provider, the records) failed: retry."""

    error = "temporarily_unavailable"
    status_code = 503


class TooManyRequests(OAuth2Error):
    error = "temporarily_unavailable"
    status_code = 429


@dataclass(frozen=True)
class Person:
    """Who signed in, as the identity provider said: the gateway's identity of them."""

    issuer: str
    subject: str
    claims: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.issuer}|{self.subject}"

    def record(self) -> dict[str, Any]:
        return {"iss": self.issuer, "sub": self.subject, "claims": self.claims}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Person:
        return cls(record["iss"], record["sub"], dict(record.get("claims") or {}))


@dataclass
class SignIn:
    """The resource owner Authlib is handed at the consent step: the person, the
    provider's tokens of this sign-in, and the resource the client asked for."""

    person: Person
    upstream: dict[str, Any]
    resource: str


@dataclass
class Grant:
    """The resource owner at the token endpoint: one refresh family."""

    grant_id: str
    person: Person
    client_id: str
    resource: str
    scope: str


class StoredCode(AuthorizationCodeMixin):
    def __init__(self, record: dict[str, Any]):
        self.record = record

    def get_redirect_uri(self) -> str:
        return self.record["redirect_uri"]

    def get_scope(self) -> str:
        return self.record.get("scope") or ""

    def get_nonce(self) -> None:
        return None

    def get_auth_time(self) -> None:
        return None


class StoredRefresh(TokenMixin):
    def __init__(self, token_digest: str, record: dict[str, Any]):
        self.digest = token_digest
        self.record = record

    def check_client(self, client: GatewayClient) -> bool:
        return client.client_id == self.record["client_id"]

    def get_scope(self) -> str:
        return self.record.get("scope") or ""

    def get_expires_in(self) -> int:
        return 0

    def is_expired(self) -> bool:
        return False

    def is_revoked(self) -> bool:
        return False

    def get_user(self) -> None:
        return None

    def get_client(self) -> None:
        return None


class S256Only(CodeChallenge):
    """PKCE is required of every client, and only S256 (OAuth 2.1, MCP authorization)."""

    SUPPORTED_CODE_CHALLENGE_METHOD = ["S256"]

    def validate_code_challenge(self, grant: Any, redirect_uri: str) -> None:
        data = grant.request.payload.data
        if not data.get("code_challenge"):
            raise InvalidRequestError("code_challenge is required (PKCE with S256)")
        if data.get("code_challenge_method") != "S256":
            raise InvalidRequestError("code_challenge_method must be S256")
        super().validate_code_challenge(grant, redirect_uri)

    def validate_code_verifier(self, grant: Any, result: Any) -> None:
        if not grant.request.form.get("code_verifier"):
            raise InvalidRequestError("code_verifier is required (PKCE)")
        super().validate_code_verifier(grant, result)

    def get_authorization_code_challenge(self, authorization_code: StoredCode) -> str:
        return authorization_code.record["code_challenge"]

    def get_authorization_code_challenge_method(self, authorization_code: StoredCode) -> str:
        return authorization_code.record["code_challenge_method"]


class GatewayIssuer(IssuerParameter):
    def __init__(self, issuer: str):
        self._issuer = issuer

    def get_issuer(self) -> str:
        return self._issuer


class Events:
    """Metrics and audit lines of the authorization server (and of people's connections):
    what happened, never a token. ``audit`` is set once the service's audit log exists."""

    def __init__(self, count: Callable[[str, str], None] | None = None, family: str = "oauth"):
        self._count = count or (lambda event, outcome: None)
        self._family = family  # what the debug line names: oauth (sign-ins) or connection
        self.audit: Callable[[str, str, dict[str, Any]], None] | None = None

    def __call__(self, event: str, outcome: str = "ok", **details: Any) -> None:
        self._count(event, outcome)
        logger.debug("%s %s: %s", self._family, event, outcome)
        if self.audit is not None:
            self.audit(event, outcome, details)


class Grants:
    """Refresh families and their tokens in the records."""

    def __init__(self, records: OAuthRecords, config: OAuthServerConfig, upstream: UpstreamIdp, events: Events,
                 clock: Callable[[], float] = time.time):
        self._records = records
        self._config = config
        self._upstream = upstream
        self._events = events
        self._clock = clock
        self.ended: list[Callable[[str], None]] = []  # told each grant this process ends

    def start(self, person: Person, client_id: str, resource: str, scope: str, upstream: dict[str, Any]) -> Grant:
        grant = Grant("g_" + secrets.token_urlsafe(18), person, client_id, resource, scope)
        ttl = self._config.refresh_token_ttl
        self._records.put("grant", grant.grant_id, {
            "person": person.record(), "client_id": client_id, "resource": resource, "scope": scope,
            "created": self._clock(), "refreshed": self._clock()}, ttl)
        self._records.put("upstream", grant.grant_id, upstream, ttl)
        return grant

    def find(self, grant_id: str) -> Grant | None:
        record = self._records.get("grant", grant_id)
        if record is None:
            return None
        return Grant(grant_id, Person.from_record(record["person"]), record["client_id"], record["resource"],
                     record.get("scope") or "")

    def alive(self, grant_id: str) -> bool:
        return self._records.get("grant", grant_id) is not None

    def end(self, grant_id: str, why: str) -> None:
        record = self._records.take("grant", grant_id)
        self._records.delete("upstream", grant_id)
        for listener in self.ended:
            listener(grant_id)
        if record is not None:
            self._events("grant_ended", why, grant=grant_id, client=record.get("client_id"))

    def keep_refresh_token(self, token: str, grant: Grant) -> None:
        """The new refresh token; the grant (and the IdP's tokens) live ``refreshTokenTtl``
        from now: a sign-in in use does not expire, one left alone does."""
        ttl = self._config.refresh_token_ttl
        self._records.put("refresh", digest(token), {"grant": grant.grant_id, "client_id": grant.client_id,
                                                     "scope": grant.scope, "rotated": None}, ttl)
        self._records.update("grant", grant.grant_id, lambda record: {**record, "refreshed": self._clock()}, ttl)
        self._records.update("upstream", grant.grant_id, lambda record: record, ttl)

    def refresh_token(self, token: str) -> StoredRefresh | None:
        """The stored refresh token, when it may still be used. A rotated one may within
        the grace period; a replay after it ends the grant."""
        token_digest = digest(token)
        record = self._records.get("refresh", token_digest)
        if record is None:
            return None
        if not self.alive(record["grant"]):
            return None
        rotated = record.get("rotated")
        if rotated is not None and self._clock() - rotated > self._config.refresh_grace_period:
            self.end(record["grant"], "refresh_token_replayed")
            return None
        return StoredRefresh(token_digest, record)

    def rotate(self, stored: StoredRefresh) -> None:
        now = self._clock()
        self._records.update("refresh", stored.digest,
                             lambda record: record if record.get("rotated") is not None else {**record, "rotated": now})

    def check_upstream(self, grant_id: str) -> None:
        """The provider still accepts this grant's tokens (refreshed when needed). Without
        a refresh token from it (no ``offline_access``) there is nothing to ask: the grant
        stands on its own."""
        kept = self._records.get("upstream", grant_id)
        if kept is not None and not kept.get("refresh_token"):
            return
        try:
            self._upstream.fresh_tokens(grant_id, self._config.refresh_token_ttl)
        except UpstreamRefused:
            self.end(grant_id, "identity_provider_refused")
            raise InvalidGrantError("the identity provider no longer accepts this sign-in") from None
        except UpstreamUnavailable:
            raise TemporarilyUnavailable("the identity provider cannot be reached") from None

    def of(self, *, person_key: str | None = None, client_id: str | None = None) -> list[dict[str, Any]]:
        """The live grants (never a token), optionally of one person or one client."""
        found = []
        for grant_id in self._records.keys("grant"):
            record = self._records.get("grant", grant_id)
            if record is None:
                continue
            person = Person.from_record(record["person"])
            if person_key is not None and person.key != person_key:
                continue
            if client_id is not None and record["client_id"] != client_id:
                continue
            found.append({"grant": grant_id, "user": person.subject, "issuer": person.issuer,
                          "client_id": record["client_id"], "scope": record.get("scope") or "",
                          "created": record.get("created"), "refreshed": record.get("refreshed")})
        return sorted(found, key=lambda grant: grant.get("created") or 0)


class CodeGrant(AuthorizationCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["none", "client_secret_basic", "client_secret_post"]

    def save_authorization_code(self, code: str, request: Any) -> None:
        sign_in: SignIn = request.user
        payload = request.payload.data
        self.server.records.put("code", digest(code), {
            "client_id": request.client.client_id, "redirect_uri": payload.get("redirect_uri"),
            "scope": (payload.get("scope") or "")[:MAX_SCOPE_CHARS],
            "code_challenge": payload["code_challenge"], "code_challenge_method": payload["code_challenge_method"],
            "resource": sign_in.resource, "person": sign_in.person.record(), "upstream": sign_in.upstream,
        }, self.server.config.authorization_code_ttl)

    def query_authorization_code(self, code: str, client: GatewayClient) -> StoredCode | None:
        server = self.server
        code_digest = digest(code)
        record = server.records.take("code", code_digest)  # used once, by whichever worker is first
        if record is None:
            used = server.records.get("used_code", code_digest)
            if used is not None:
                server.grants.end(used["grant"], "code_reused")
            return None
        if record["client_id"] != client.client_id:
            return None
        return StoredCode(record)

    def validate_token_request(self) -> None:
        super().validate_token_request()
        resources = self.request.payload.datalist.get("resource") or []
        code = self.request.authorization_code
        if any(not same_resource(resource, code.record["resource"]) for resource in resources):
            raise InvalidTargetError("the resource is not the one this code was issued for")

    def delete_authorization_code(self, authorization_code: StoredCode) -> None:
        pass  # taken when it was read

    def authenticate_user(self, authorization_code: StoredCode) -> Grant:
        record = authorization_code.record
        grant = self.server.grants.start(Person.from_record(record["person"]), record["client_id"],
                                         record["resource"], record["scope"], record["upstream"])
        self.server.records.put("used_code", digest(self.request.form["code"]), {"grant": grant.grant_id},
                                USED_CODE_TTL)
        return grant


class RefreshGrant(RefreshTokenGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["none", "client_secret_basic", "client_secret_post"]
    INCLUDE_NEW_REFRESH_TOKEN = True

    def authenticate_refresh_token(self, refresh_token: str) -> StoredRefresh | None:
        return self.server.grants.refresh_token(refresh_token)

    def validate_token_request(self) -> None:
        super().validate_token_request()
        resources = self.request.payload.datalist.get("resource") or []
        grant = self.server.grants.find(self.request.refresh_token.record["grant"])
        if grant is not None and any(not same_resource(resource, grant.resource) for resource in resources):
            raise InvalidTargetError("the resource is not the one this grant is for")

    def authenticate_user(self, refresh_token: StoredRefresh) -> Grant:
        grants = self.server.grants
        grant = grants.find(refresh_token.record["grant"])
        if grant is None:
            raise InvalidGrantError()
        grants.check_upstream(grant.grant_id)
        return grant

    def revoke_old_credential(self, refresh_token: StoredRefresh) -> None:
        self.server.grants.rotate(refresh_token)


class Revocation(RevocationEndpoint):
    """RFC 7009: a refresh token or an access token ends its whole grant."""

    CLIENT_AUTH_METHODS = ["none", "client_secret_basic", "client_secret_post"]

    def query_token(self, token_string: str, token_type_hint: str | None) -> StoredRefresh | None:
        server = self.server
        token_digest = digest(token_string)
        record = server.records.get("refresh", token_digest)
        if record is not None:
            return StoredRefresh(token_digest, record)
        claims = server.access_token_claims(token_string)
        if claims is not None and isinstance(claims.get("grant"), str):
            return StoredRefresh("", {"grant": claims["grant"], "client_id": claims.get("client_id")})
        return None

    def revoke_token(self, token: StoredRefresh, request: Any) -> None:
        self.server.grants.end(token.record["grant"], "revoked")


class GatewayAuthorizationServer(AuthorizationServer):
    def __init__(self, config: OAuthServerConfig, records: OAuthRecords, keys: TokenKeys, upstream: UpstreamIdp,
                 events: Events):
        super().__init__()
        self.config = config
        self.records = records
        self.keys = keys
        self.upstream = upstream
        self.events = events
        self.grants = Grants(records, config, upstream, events)
        self.registered = RegisteredClients(records, max(config.refresh_token_ttl, 90 * 86400.0))
        self.cimd = CimdClients(config.cimd)
        self.register_grant(CodeGrant, [S256Only()])
        self.register_grant(RefreshGrant)
        self.register_endpoint(Revocation)
        self.register_extension(GatewayIssuer(config.issuer))
        self.register_token_generator("default", self._tokens)

    # --- Authlib's hooks -------------------------------------------------------------

    def query_client(self, client_id: str) -> GatewayClient | None:
        if not isinstance(client_id, str) or not client_id:
            return None
        if CimdClients.is_cimd_id(client_id):
            try:
                return self.cimd.find(client_id)
            except CimdUnavailable as problem:
                self.events("cimd", "refused", reason=str(problem))
                raise InvalidClientMetadata(str(problem)) from None
        return self.registered.find(client_id)

    def save_token(self, token: dict[str, Any], request: Any) -> None:
        grant: Grant = request.user
        if token.get("refresh_token"):
            self.grants.keep_refresh_token(token["refresh_token"], grant)
        self.events("token", "ok", grant_type=request.payload.grant_type, client=grant.client_id,
                    grant=grant.grant_id)

    def create_oauth2_request(self, request: Any) -> OAuth2Request:
        if isinstance(request, OAuth2Request):
            return request
        # The views hand Authlib the request they built (web/oauth.py: PublicRequest, the
        # gateway's public URL); nothing here reads the framework's request itself.
        raise TypeError("the authorization server is given OAuth2Request objects, built by its views")

    def create_json_request(self, request: Any) -> Any:
        raise NotImplementedError("registration is served by the gateway's own view")

    def handle_response(self, status: int, body: Any, headers: Any) -> Answer:
        return Answer(status, body, list(headers))

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        pass

    # --- tokens ----------------------------------------------------------------------

    def _tokens(self, grant_type: str, client: GatewayClient, user: Grant, scope: str | None,
                expires_in: int | None = None, include_refresh_token: bool = True) -> dict[str, Any]:
        person = user.person
        claims = {"iss": self.config.issuer, "sub": person.subject, "aud": user.resource,
                  "client_id": client.client_id, "grant": user.grant_id, "idp": person.issuer,
                  **({"scope": scope} if scope else {}),
                  **{name: person.claims[name] for name in ID_TOKEN_CLAIMS if name in person.claims}}
        token = {"token_type": "Bearer", "access_token": self.keys.sign(claims, self.config.access_token_ttl),
                 "expires_in": int(self.config.access_token_ttl)}
        if scope:
            token["scope"] = scope
        if include_refresh_token and client.check_grant_type("refresh_token"):
            token["refresh_token"] = secrets.token_urlsafe(32)
        return token

    def access_token_claims(self, token: str) -> dict[str, Any] | None:
        import jwt

        try:
            return self.keys.verify(token, issuer=self.config.issuer, audience=self.config.resource)
        except (jwt.PyJWTError, ValueError, TypeError):
            return None

    # --- the authorization step --------------------------------------------------------

    def stored_request(self, params: dict[str, str]) -> OAuth2Request:
        """The client's authorization request as it was, for the step that answers it."""
        request = OAuth2Request("GET", f"{self.config.issuer}/oauth/authorize?{urlencode(params)}")
        request.payload = BasicOAuth2Payload(params)
        return request

    def answer(self, params: dict[str, str], sign_in: SignIn | None) -> Answer:
        """The redirect to the client: a code for ``sign_in``, or access_denied for None."""
        request = self.stored_request(params)
        grant = self.get_consent_grant(request, end_user=sign_in)
        return self.create_authorization_response(request, grant_user=sign_in, grant=grant)


@dataclass
class Answer:
    """What an endpoint answers; ``location`` is the redirect (RFC 9207 adds ``iss`` to it)."""

    status: int
    body: Any
    headers: list[tuple[str, str]]

    @property
    def location(self) -> str | None:
        return dict(self.headers).get("Location")

    @location.setter
    def location(self, value: str) -> None:
        self.headers = [(name, text) for name, text in self.headers if name != "Location"] + [("Location", value)]


class InvalidClientMetadata(OAuth2Error):
    error = "invalid_client"
    status_code = 400


def flow_params(values: Any) -> dict[str, str]:
    """The authorization request's parameters, one value each (repeated ones are refused
    by Authlib's checks before this is kept)."""
    return {name: values.get(name) for name in values if isinstance(values.get(name), str)}


def new_flow_id() -> str:
    return secrets.token_urlsafe(32)
