"""The identity provider people sign in with: the gateway is one confidential client of it.

Its discovery document is read on first use. Toward it the gateway uses PKCE S256, a
``state`` and a ``nonce``, authenticates as the metadata allows (``client_secret_basic``,
else ``client_secret_post``), checks RFC 9207 ``iss`` when the provider says it sends it,
and verifies the ID token (signature by the provider's keys, issuer, audience, nonce).

The provider's tokens of a grant are kept with the grant (``upstream`` records) and
refreshed when they are about to expire, by one worker at a time: the first takes a lock
in the records, the others wait for its result (bounded) instead of spending the same
refresh token twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import jwt
import requests
from authlib.integrations.requests_client import OAuth2Session
from authlib.integrations.base_client.errors import OAuthError as ClientOAuthError

from vmcp_actors.config import UpstreamIdpConfig
from vmcp_actors.edge._auth import JwksKeys, key_fits
from vmcp_actors.oauth._records import EXPIRY_MARGIN, OAuthRecords, await_renewal, kept_tokens

logger = logging.getLogger(__name__)

IDP_TIMEOUT = 10.0
REFRESH_LOCK_TTL = 15.0
REFRESH_WAIT = 12.0
ID_TOKEN_CLAIMS = ("email", "email_verified", "name", "preferred_username", "groups", "roles")


class UpstreamUnavailable(Exception):
    """The identity provider could not be reached or answered nonsense: retry later (503)."""


class UpstreamRefused(Exception):
    """The identity provider refused (a code, a refresh token): the person must sign in again."""


class UpstreamIdp:
    def __init__(self, config: UpstreamIdpConfig, client_secret: str, redirect_uri: str,
                 records: OAuthRecords, clock: Callable[[], float] = time.time):
        self._config = config
        self._secret = client_secret
        self.redirect_uri = redirect_uri
        self._records = records
        self._clock = clock
        self._http = requests.Session()
        self._http.trust_env = False
        self._lock = threading.Lock()  # guards _metadata (the discovery document, read once)
        self._metadata: dict[str, Any] | None = None
        self._keys: JwksKeys | None = None
        self.refreshes = 0  # refresh grants this process sent (for the admin state and tests)

    @property
    def issuer(self) -> str:
        return self._config.issuer.rstrip("/")

    def metadata(self) -> dict[str, Any]:
        with self._lock:
            if self._metadata is not None:
                return self._metadata
        try:
            response = self._http.get(f"{self.issuer}/.well-known/openid-configuration", timeout=IDP_TIMEOUT,
                                      allow_redirects=False)
            response.raise_for_status()
            metadata = response.json()
        except (requests.RequestException, ValueError):
            logger.warning("the identity provider's discovery document could not be read")
            raise UpstreamUnavailable() from None
        needed = ("authorization_endpoint", "token_endpoint", "jwks_uri")
        if not isinstance(metadata, dict) or not all(isinstance(metadata.get(name), str) for name in needed):
            logger.warning("the identity provider's discovery document lacks %s", ", ".join(needed))
            raise UpstreamUnavailable()
        if metadata.get("issuer", self.issuer).rstrip("/") != self.issuer:
            logger.warning("the identity provider's discovery document names another issuer")
            raise UpstreamUnavailable()
        with self._lock:
            self._metadata = metadata
            self._keys = JwksKeys(self.issuer, metadata["jwks_uri"], self._http)
        return metadata

    def _session(self) -> OAuth2Session:
        supported = self.metadata().get("token_endpoint_auth_methods_supported", ["client_secret_basic"])
        method = "client_secret_basic" if "client_secret_basic" in supported else "client_secret_post"
        session = OAuth2Session(self._config.client_id, self._secret, token_endpoint_auth_method=method,
                                redirect_uri=self.redirect_uri, scope=" ".join(self._config.scopes),
                                code_challenge_method="S256", timeout=IDP_TIMEOUT)
        session.trust_env = False
        return session

    def authorization_url(self, state: str, nonce: str, code_verifier: str) -> str:
        with self._session() as session:
            url, _ = session.create_authorization_url(self.metadata()["authorization_endpoint"], state=state,
                                                      nonce=nonce, code_verifier=code_verifier)
        return url

    def check_issuer(self, iss: str | None) -> bool:
        """RFC 9207: the answer came from this provider (when it says it names itself)."""
        if iss is not None:
            return iss.rstrip("/") == self.issuer
        return not self.metadata().get("authorization_response_iss_parameter_supported", False)

    def exchange(self, code: str, code_verifier: str, nonce: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The provider's tokens for ``code`` and the verified claims of its ID token."""
        tokens = self._token_request(lambda session: session.fetch_token(
            self.metadata()["token_endpoint"], grant_type="authorization_code", code=code,
            code_verifier=code_verifier))
        id_token = tokens.get("id_token")
        if not isinstance(id_token, str):
            logger.warning("the identity provider answered the code without an ID token")
            raise UpstreamUnavailable()
        claims = self._verified_id_token(id_token, nonce)
        return tokens, claims

    def _token_request(self, send: Callable[[OAuth2Session], Any]) -> dict[str, Any]:
        try:
            with self._session() as session:
                tokens = dict(send(session))
        except ClientOAuthError as error:
            logger.info("the identity provider refused a token request: %s", error.error)
            raise UpstreamRefused(error.error or "refused") from None
        except (requests.RequestException, ValueError) as error:
            logger.warning("the identity provider's token endpoint failed: %s", error.__class__.__name__)
            raise UpstreamUnavailable() from None
        if not isinstance(tokens.get("access_token"), str):
            raise UpstreamUnavailable()
        return tokens

    def _verified_id_token(self, id_token: str, nonce: str) -> dict[str, Any]:
        assert self._keys is not None
        try:
            header = jwt.get_unverified_header(id_token)
            key = self._keys.key_for(header.get("kid"))
            algorithm = header.get("alg")
            allowed = self.metadata().get("id_token_signing_alg_values_supported", ["RS256"])
            if algorithm not in allowed or algorithm in ("none", "HS256", "HS384", "HS512") \
                    or not key_fits(key, algorithm):
                raise jwt.InvalidAlgorithmError("ID token algorithm not allowed")
            claims = jwt.decode(id_token, key.key, algorithms=[algorithm], audience=self._config.client_id,
                                issuer=self.issuer, leeway=30, options={"require": ["exp", "iat", "sub"]})
        except Exception as error:  # noqa: BLE001 - every way an ID token can be bad is a refusal
            logger.warning("the identity provider's ID token did not verify: %s", error.__class__.__name__)
            raise UpstreamRefused("invalid ID token") from None
        if claims.get("nonce") != nonce:
            logger.warning("the identity provider's ID token carries another nonce")
            raise UpstreamRefused("invalid ID token")
        return claims

    def kept_tokens(self, tokens: dict[str, Any]) -> dict[str, Any]:
        """What of the provider's answer the gateway keeps (never the ID token)."""
        return kept_tokens(tokens, self._clock())

    def _due(self, kept: dict[str, Any]) -> bool:
        return self._clock() >= min(kept.get("refresh_at", kept["expires_at"] - EXPIRY_MARGIN), kept["expires_at"])

    def fresh_tokens(self, grant: str, ttl: float) -> dict[str, Any]:
        """The provider's tokens of ``grant``, refreshed first when about to expire (one
        worker at a time). UpstreamRefused when the provider no longer accepts them."""
        kept = self._records.get("upstream", grant)
        if kept is None:
            raise UpstreamRefused("no identity provider tokens for this grant")
        if not self._due(kept):
            return kept
        if not kept.get("refresh_token"):
            raise UpstreamRefused("the identity provider's token expired and cannot be refreshed")
        holder = self._records.acquire(f"upstream-refresh:{grant}", REFRESH_LOCK_TTL)
        if holder is None:
            return self._refreshed_by_another(grant, kept, ttl)
        try:
            kept = self._records.get("upstream", grant) or kept
            if not self._due(kept):
                return kept  # refreshed by another worker while this one took the lock
            tokens = self._token_request(lambda session: session.refresh_token(
                self.metadata()["token_endpoint"], refresh_token=kept["refresh_token"]))
            self.refreshes += 1
            renewed = self.kept_tokens(tokens)
            if not renewed["refresh_token"]:
                renewed["refresh_token"] = kept["refresh_token"]  # the provider does not rotate it
            self._records.put("upstream", grant, renewed, ttl)
            return renewed
        finally:
            self._records.release(f"upstream-refresh:{grant}", holder)

    def _refreshed_by_another(self, grant: str, stale: dict[str, Any], ttl: float) -> dict[str, Any]:
        outcome, kept = await_renewal(self._records, "upstream", grant, f"upstream-refresh:{grant}", stale,
                                      REFRESH_WAIT)
        if outcome == "renewed":
            assert kept is not None
            return kept
        if outcome == "gone":
            raise UpstreamRefused("the grant ended")
        if outcome == "late":
            raise UpstreamUnavailable()
        return self.fresh_tokens(grant, ttl)  # the other worker gave up without a result: once more here
