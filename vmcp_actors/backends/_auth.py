"""Outgoing authentication: the headers each backend request carries for this caller.

Strategies are built once at start from the config and the environment, and shared by
every session: they are thread-safe, and the exchanged-token cache inside them keeps
each user's tokens apart (the key holds the user and a digest of their own token).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Protocol

import requests

from vmcp_actors.config import (
    BackendAuthConfig,
    TokenExchangeConfig,
    VmcpConfig,
    required_env_vars,
)
from vmcp_actors.exceptions import BackendAuthError, ConfigError, ConnectionNeeded
from vmcp_actors.identity import Identity, token_of
from vmcp_actors.shared_cache import SharedCache

logger = logging.getLogger(__name__)

TOKEN_EXCHANGE_GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
# RFC 6749 error codes are short printable ASCII without quote or backslash; anything
# else is not echoed into logs or client errors.
_ERROR_CODE = re.compile(r"^[\x20\x21\x23-\x5B\x5D-\x7E]{1,64}$")
# When the IdP gives no expires_in, an exchanged token is reused this long at most.
DEFAULT_EXCHANGED_LIFETIME = 60.0


class OutgoingAuth(Protocol):
    def headers(self, identity: Identity | None) -> dict[str, str]:
        """The headers that authenticate this caller to the backend; raises BackendAuthError."""


class Unauthenticated:
    def headers(self, identity: Identity | None) -> dict[str, str]:
        return {}

    def __repr__(self) -> str:
        return "Unauthenticated()"


class HeaderInjection:
    """A static header (an API key, a service token) on every request to the backend."""

    def __init__(self, header_name: str, value: str):
        self._header = {header_name: value}
        self._name = header_name

    def headers(self, identity: Identity | None) -> dict[str, str]:
        return dict(self._header)

    def __repr__(self) -> str:  # never the value
        return f"HeaderInjection({self._name!r})"


class PersonalTokens(Protocol):
    """Each person's own tokens for the backends they connected (``outgoingAuth`` type
    ``oauth``); the gateway's connection service implements it."""

    def token(self, identity: Identity | None, backend: str) -> str:
        """The person's access token for ``backend``, refreshed first when due; raises
        ConnectionNeeded when they have none (or it can no longer be refreshed)."""

    def refused(self, identity: Identity | None, backend: str, token: str, status: int,
                challenge: str | None) -> ConnectionNeeded | None:
        """The backend refused ``token`` (401, or 403 for scope): what to ask the person;
        None for a 403 that is the backend's answer to the call, not to the token."""


class PersonalOAuth:
    """The person's own token at the backend, from the connections they made."""

    def __init__(self, backend: str, tokens: PersonalTokens):
        self._backend = backend
        self.tokens = tokens

    def headers(self, identity: Identity | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens.token(identity, self._backend)}"}

    def refused(self, identity: Identity | None, status: int, challenge: str | None,
                sent: Mapping[str, str]) -> ConnectionNeeded | None:
        token = sent.get("Authorization", "")[len("Bearer "):]
        return self.tokens.refused(identity, self._backend, token, status, challenge)

    def __repr__(self) -> str:
        return f"PersonalOAuth({self._backend!r})"


class ExchangedTokenCache:
    """Exchanged tokens until shortly before they expire, never shared between users:
    the key is (backend, issuer, subject, digest of the caller's own token), so a refreshed
    incoming token gets a fresh exchange too. Thread-safe; one exchange per key at a time."""

    def __init__(self, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic,
                 shared: SharedCache | None = None):
        self._shared = shared  # a second level other processes fill too (Redis), read on a local miss
        self._entries: OrderedDict[tuple[str, ...], tuple[str, float]] = OrderedDict()
        # One per token key: held across its exchange so concurrent calls wait for one fetch
        # (taken first; _lock may be taken under it, never the other way round).
        self._locks: dict[tuple[str, ...], threading.Lock] = {}
        self._lock = threading.Lock()  # guards the cached tokens, the per-key locks and the miss count
        self._max = max_entries
        self._clock = clock
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(backend: str, identity: Identity, subject_token: str) -> tuple[str, ...]:
        digest = hashlib.sha256(subject_token.encode()).hexdigest()
        return (backend, identity.issuer, identity.subject, digest)

    def get_or_fetch(self, key: tuple[str, ...], fetch: Callable[[], tuple[str, float]]) -> str:
        cached = self._fresh(key)
        if cached is not None:
            return cached
        with self._lock:
            key_lock = self._locks.get(key)
            if key_lock is None:
                self._prune_idle_locks()
                key_lock = self._locks[key] = threading.Lock()  # one exchange per key at a time
        with key_lock:  # concurrent calls of one user wait for one exchange, not N
            cached = self._fresh(key)
            if cached is not None:
                return cached
            shared = self._shared.get("token", list(key)) if self._shared is not None else None
            if isinstance(shared, dict) and isinstance(shared.get("token"), str) \
                    and isinstance(shared.get("refreshAt"), (int, float)) and shared["refreshAt"] > time.time():
                self._keep(key, shared["token"], shared["refreshAt"] - time.time())
                return shared["token"]
            token, lifetime = fetch()
            # Refresh shortly before expiry: 10 % of the lifetime, at most 30 s.
            fresh_for = lifetime - min(30.0, lifetime * 0.1)
            with self._lock:
                self.misses += 1
            self._keep(key, token, fresh_for)
            if self._shared is not None:
                self._shared.put("token", list(key), {"token": token, "refreshAt": time.time() + fresh_for}, fresh_for)
            return token

    def _keep(self, key: tuple[str, ...], token: str, fresh_for: float) -> None:
        with self._lock:
            self._entries[key] = (token, self._clock() + fresh_for)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                old, _ = self._entries.popitem(last=False)
                self._locks.pop(old, None)

    def _prune_idle_locks(self) -> None:
        """Drop locks whose key has no entry and nobody holds (failed or expired exchanges),
        so the lock map stays about the size of the cache. Called under self._lock."""
        if len(self._locks) <= len(self._entries) + 1000:
            return
        for key in [k for k, lock in self._locks.items() if k not in self._entries and not lock.locked()]:
            del self._locks[key]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._entries), "hits": self.hits, "misses": self.misses}

    def _fresh(self, key: tuple[str, ...]) -> str | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            token, refresh_at = entry
            if self._clock() >= refresh_at:
                del self._entries[key]
                return None
            self.hits += 1
            return token


class TokenExchange:
    """RFC 8693: the caller's incoming token, exchanged at the IdP for one meant for this backend."""

    def __init__(self, backend: str, config: TokenExchangeConfig, client_secret: str | None,
                 cache: ExchangedTokenCache, timeout: float):
        self._backend = backend
        self._config = config
        self._client_secret = client_secret
        self._cache = cache
        self._timeout = timeout
        self._http = requests.Session()
        self._http.trust_env = False  # no ~/.netrc credentials, no per-call environment reads

    def __repr__(self) -> str:
        return f"TokenExchange(backend={self._backend!r}, client_id={self._config.client_id!r})"

    def headers(self, identity: Identity | None) -> dict[str, str]:
        subject_token = token_of(identity)
        if identity is None or not subject_token:
            raise BackendAuthError(self._backend, f"backend {self._backend!r} needs the caller's token for token exchange")
        token = self._cache.get_or_fetch(
            ExchangedTokenCache.key(self._backend, identity, subject_token), lambda: self._exchange(subject_token)
        )
        return {"Authorization": f"Bearer {token}"}

    def _exchange(self, subject_token: str) -> tuple[str, float]:
        form = {
            "grant_type": TOKEN_EXCHANGE_GRANT,
            "subject_token": subject_token,
            "subject_token_type": ACCESS_TOKEN_TYPE,
            "requested_token_type": ACCESS_TOKEN_TYPE,
        }
        if self._config.audience:
            form["audience"] = self._config.audience
        if self._config.scopes:
            form["scope"] = " ".join(self._config.scopes)
        auth = None
        if self._client_secret:
            auth = (self._config.client_id, self._client_secret)  # client_secret_basic
        else:
            form["client_id"] = self._config.client_id  # a public client
        try:
            response = self._http.post(
                self._config.token_url, data=form, auth=auth, timeout=self._timeout, allow_redirects=False
            )
        except requests.RequestException:
            raise self._failed("idp_unreachable") from None
        body = _json_or_empty(response)
        if response.status_code != 200:
            code = body.get("error")
            raise self._failed(code if isinstance(code, str) and _ERROR_CODE.match(code) else f"http_{response.status_code}")
        token = body.get("access_token")
        if not isinstance(token, str) or not token:
            raise self._failed("invalid_response")
        lifetime = body.get("expires_in")
        if not isinstance(lifetime, (int, float)) or isinstance(lifetime, bool) or lifetime <= 0:
            lifetime = DEFAULT_EXCHANGED_LIFETIME
        return token, float(lifetime)

    def _failed(self, code: str) -> BackendAuthError:
        return BackendAuthError(
            self._backend, f"token exchange for backend {self._backend!r} failed: {code}", idp_error=code
        )


def _json_or_empty(response: requests.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def build_outgoing_auth(
    config: VmcpConfig, environ: Mapping[str, str] | None = None, cache: ExchangedTokenCache | None = None,
    personal: PersonalTokens | None = None,
) -> dict[str, OutgoingAuth]:
    """One strategy per backend, secrets read from the environment now: an unset variable is
    a startup error naming the variable and the field that refers to it. ``personal``: the
    people's own tokens, for backends of type oauth."""
    environ = os.environ if environ is None else environ
    missing = [f"{path}: environment variable {name} is not set or empty"
               for path, name in required_env_vars(config) if not environ.get(name)]
    if missing:
        raise ConfigError(missing)
    cache = cache if cache is not None else ExchangedTokenCache()
    strategies: dict[str, OutgoingAuth] = {}
    for backend in config.backends:
        auth = config.outgoing_auth.for_backend(backend.name)
        if auth.type == "oauth":
            if personal is None:
                raise ConfigError([f"outgoingAuth.backends.{backend.name}.type: oauth needs the connection "
                                   "service (started by the runtime)"])
            strategies[backend.name] = PersonalOAuth(backend.name, personal)
            continue
        strategies[backend.name] = _strategy(backend.name, auth, environ, cache,
                                             config.operational.timeouts.for_backend(backend.name))
    return strategies


def _strategy(backend: str, auth: BackendAuthConfig, environ: Mapping[str, str], cache: ExchangedTokenCache,
              timeout: float) -> OutgoingAuth:
    if auth.type == "header_injection":
        injection = auth.header_injection
        value = injection.header_value if injection.header_value is not None else environ[injection.header_value_env]
        return HeaderInjection(injection.header_name, value)
    if auth.type == "token_exchange":
        exchange = auth.token_exchange
        secret = environ[exchange.client_secret_env] if exchange.client_secret_env else None
        return TokenExchange(backend, exchange, secret, cache, timeout)
    return Unauthenticated()
