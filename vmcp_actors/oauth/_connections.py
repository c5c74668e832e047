"""Each person's connections to backends that need their own authorization (outgoingAuth
type ``oauth``): the gateway is an OAuth client of each such backend's authorization server.

* **What the server is** is learned once per backend: the backend's 401 challenge
  (``resource_metadata``, ``scope``) or its RFC 9728 metadata, then the authorization
  server's RFC 8414 (or OpenID) metadata. Every URL learned there passes ``UrlGuard``:
  https unless loopback, and a private or loopback address only when the backend's own
  URL is one (a public backend cannot point the gateway into its network).
* **Which client the gateway is** there: the configured one, else its client metadata
  document (CIMD) where the server takes one and the public URL is https, else one it
  registers (RFC 7591), kept in the records for every worker.
* **A connect** starts from a link (``/connect/<ticket>``: random, no personal data, kept
  ``TICKET_TTL``) made for one person and backend. The page checks that the browser's
  person is that person, then sends them to the server with PKCE S256, ``state`` bound to
  the browser, ``resource`` (RFC 8707); the callback checks ``iss`` (RFC 9207), takes the
  flow once, and stores the tokens under (person, backend), never under a session.
* **Tokens** are refreshed before they expire, by one worker at a time (a lock in the
  records; the others wait for its result). A refresh the server refuses, or a 401 from the
  backend, ends that one connection: the person is asked to connect again.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests
from authlib.integrations.base_client.errors import OAuthError as ClientOAuthError
from authlib.integrations.requests_client import OAuth2Session

from vmcp_actors.config import BackendOAuthConfig, VmcpConfig
from vmcp_actors.exceptions import BackendAuthError, ConnectionNeeded
from vmcp_actors.identity import Identity
from vmcp_actors.oauth._clients import LOOPBACK_HOSTS, address_allowed
from vmcp_actors.oauth._records import OAuthRecords, await_renewal

logger = logging.getLogger(__name__)

TICKET_TTL = 600.0  # a connect link works this long
FLOW_TTL = 600.0  # a connect under way (at the authorization server) this long
SERVER_KNOWN_FOR = 3600.0  # a backend's authorization server metadata is read again after this
HTTP_TIMEOUT = 10.0
MAX_METADATA_BYTES = 64 * 1024
EXPIRY_MARGIN = 30.0  # refresh this long before the access token expires
REFRESH_LOCK_TTL = 15.0
REFRESH_WAIT = 12.0
DEFAULT_LIFETIME = 3600.0  # when the server says nothing of expires_in
CONNECTION_TTL = 90 * 86400.0  # a connection with a refresh token is kept this long after its last refresh
LOCAL_TOKEN_FOR = 5.0  # a token read from the records is reused this long by this process
CLIENT_DOCUMENT_PATH = "/connect/client.json"
CALLBACK_PATH = "/connect/callback"
_AUTH_PARAM = re.compile(r'([A-Za-z0-9_-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,]+)')
_ERROR_CODE = re.compile(r"^[\x20\x21\x23-\x5B\x5D-\x7E]{1,64}$")


class ConnectUnavailable(Exception):
    """The backend's authorization server cannot be used now (unreachable, bad metadata,
    refused by the address guard). The message is safe to show: it names no URL."""


class ConnectRefused(Exception):
    """The authorization server refused the code (or it was not for this flow)."""


def parse_challenge(header: str | None) -> dict[str, str]:
    """The auth-params of a ``Bearer`` challenge (RFC 6750 section 3), lower-case names."""
    if not header:
        return {}
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return {}
    found: dict[str, str] = {}
    for name, value in _AUTH_PARAM.findall(rest):
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        found.setdefault(name.lower(), value)
    return found


def person_key(identity: Identity) -> str:
    """Whose connection: the person (issuer and subject), as a digest."""
    return person_digest((identity.issuer, identity.subject))


def secret_key(secret: str) -> str:
    """A record's key for a random secret (a ticket, a state): its digest, so keys reveal none."""
    return hashlib.sha256(secret.encode()).hexdigest()


def person_digest(person: tuple[str, str] | list[str]) -> str:
    return hashlib.sha256(f"{person[0]}\0{person[1]}".encode()).hexdigest()[:40]


class UrlGuard:
    """The addresses a backend's metadata may send the gateway to: https (http only for
    loopback), and private or loopback addresses only when the backend's own URL has one."""

    def __init__(self, backend_url: str, resolve: Callable[..., Any] = socket.getaddrinfo):
        self._resolve = resolve
        host = urlsplit(backend_url).hostname or ""
        self.private_allowed = host in LOOPBACK_HOSTS or not all(address_allowed(a) for a in self._addresses(host))

    def check(self, url: Any) -> str:
        if not isinstance(url, str) or len(url) > 2000:
            raise ConnectUnavailable("the backend's metadata names an unusable URL")
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.scheme not in ("https", "http") or not host or parts.username or parts.password:
            raise ConnectUnavailable("the backend's metadata names an unusable URL")
        if parts.scheme == "http" and host not in LOOPBACK_HOSTS:
            raise ConnectUnavailable("the backend's metadata names a plain-http URL (https is required)")
        if not self.private_allowed:
            addresses = self._addresses(host)
            if not addresses or not all(address_allowed(address) for address in addresses):
                raise ConnectUnavailable("the backend's metadata points at a private or loopback address")
        return url

    def _addresses(self, host: str) -> list[str]:
        try:
            ipaddress.ip_address(host)
            return [host]
        except ValueError:
            pass
        try:
            return sorted({info[4][0] for info in self._resolve(host, None)})
        except (OSError, UnicodeError):
            return []


@dataclass(frozen=True)
class AuthServer:
    """What a backend's authorization server offers, as its metadata said."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    resource: str | None  # the backend as a protected resource (RFC 8707's value; None: not asked)
    scopes: tuple[str, ...] = ()  # what the backend asks for (its challenge, else its metadata)
    registration_endpoint: str | None = None
    revocation_endpoint: str | None = None
    auth_methods: tuple[str, ...] = ("client_secret_basic",)
    cimd: bool = False
    sends_iss: bool = False


class BackendAuthorization:
    """One backend's authorization server and the gateway's client there."""

    def __init__(self, backend: str, url: str, config: BackendOAuthConfig, client_secret: str | None,
                 public_url: str, gateway_name: str, records: OAuthRecords, http: requests.Session,
                 guard: UrlGuard | None = None):
        self.backend = backend
        self.url = url
        self.config = config
        self._secret = client_secret
        self.public_url = public_url
        self._name = gateway_name
        self._records = records
        self._http = http
        # The operator's issuer vouches for its own network; else the backend's URL does.
        self.guard = guard if guard is not None else UrlGuard(config.issuer or url)
        self._lock = threading.Lock()  # guards _server and _known_until (metadata is read outside it)
        self._server: AuthServer | None = None
        self._known_until = 0.0

    @property
    def redirect_uri(self) -> str:
        return self.public_url + CALLBACK_PATH

    # -- the server ----------------------------------------------------------------------

    def server(self) -> AuthServer:
        with self._lock:
            if self._server is not None and time.monotonic() < self._known_until:
                return self._server
        found = self._discover()
        with self._lock:
            self._server, self._known_until = found, time.monotonic() + SERVER_KNOWN_FOR
        return found

    def _discover(self) -> AuthServer:
        if self.config.issuer is not None:  # the operator named it: the backend is not asked
            return self._server_from(self.config.issuer.rstrip("/"), self.config.resource or self.url or None, {},
                                     self.config.scopes)
        challenge = self._challenge()
        metadata_url = challenge.get("resource_metadata")
        resource = self._json(self.guard.check(metadata_url)) if metadata_url else self._well_known_resource()
        servers = resource.get("authorization_servers")
        if not isinstance(servers, list) or not servers or not isinstance(servers[0], str):
            raise ConnectUnavailable(f"backend {self.backend!r} names no authorization server")
        issuer = self.guard.check(servers[0]).rstrip("/")
        named = resource.get("resource")
        scopes = challenge.get("scope", "").split() or [s for s in resource.get("scopes_supported") or []
                                                         if isinstance(s, str)]
        return self._server_from(issuer, self.config.resource or (named if isinstance(named, str) and named
                                                                  else self.url), challenge, tuple(scopes))

    def _server_from(self, issuer: str, resource: str | None, challenge: dict[str, str],
                     scopes: tuple[str, ...]) -> AuthServer:
        metadata = self._server_metadata(issuer)
        endpoints = {name: self.guard.check(metadata.get(name)) for name in ("authorization_endpoint", "token_endpoint")}
        optional = {name: self.guard.check(metadata[name]) if isinstance(metadata.get(name), str) else None
                    for name in ("registration_endpoint", "revocation_endpoint")}
        methods = metadata.get("token_endpoint_auth_methods_supported")
        return AuthServer(
            issuer=issuer, resource=resource, scopes=scopes, auth_methods=tuple(m for m in methods if isinstance(m, str))
            if isinstance(methods, list) else ("client_secret_basic",),
            cimd=metadata.get("client_id_metadata_document_supported") is True,
            sends_iss=metadata.get("authorization_response_iss_parameter_supported") is True,
            **endpoints, **optional)

    def _challenge(self) -> dict[str, str]:
        """The backend's answer to an unauthenticated initialize: its 401 says where its metadata is."""
        message = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                   "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                              "clientInfo": {"name": "vmcp-actors", "version": "1"}}}
        try:
            response = self._http.post(self.url, json=message, timeout=HTTP_TIMEOUT, allow_redirects=False,
                                       headers={"Accept": "application/json, text/event-stream"}, stream=True)
            response.close()
        except requests.RequestException:
            raise ConnectUnavailable(f"backend {self.backend!r} is unreachable") from None
        return parse_challenge(response.headers.get("WWW-Authenticate")) if response.status_code == 401 else {}

    def _well_known_resource(self) -> dict[str, Any]:
        parts = urlsplit(self.url)
        origin = f"{parts.scheme}://{parts.netloc}"
        path = parts.path.rstrip("/")
        for candidate in ([f"{origin}/.well-known/oauth-protected-resource{path}"] if path else []) + \
                [f"{origin}/.well-known/oauth-protected-resource"]:
            try:
                return self._json(candidate)
            except ConnectUnavailable:
                continue
        raise ConnectUnavailable(f"backend {self.backend!r} publishes no protected resource metadata")

    def _server_metadata(self, issuer: str) -> dict[str, Any]:
        parts = urlsplit(issuer)
        origin, path = f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")
        candidates = [f"{origin}/.well-known/oauth-authorization-server{path}",
                      f"{origin}/.well-known/openid-configuration{path}"]
        if path:
            candidates.append(f"{origin}{path}/.well-known/openid-configuration")
        for candidate in candidates:
            try:
                metadata = self._json(candidate)
            except ConnectUnavailable:
                continue
            if str(metadata.get("issuer", "")).rstrip("/") != issuer:
                raise ConnectUnavailable(f"backend {self.backend!r}: its authorization server's metadata names "
                                         "another issuer")
            return metadata
        raise ConnectUnavailable(f"backend {self.backend!r}: its authorization server publishes no metadata")

    def _json(self, url: str) -> dict[str, Any]:
        try:
            response = self._http.get(url, timeout=HTTP_TIMEOUT, allow_redirects=False, stream=True,
                                      headers={"Accept": "application/json"})
            with response:
                body = response.raw.read(MAX_METADATA_BYTES + 1, decode_content=True)
                if response.status_code != 200 or len(body) > MAX_METADATA_BYTES:
                    raise ConnectUnavailable(f"backend {self.backend!r}: metadata not found")
            found = json.loads(body)
        except (requests.RequestException, ValueError, OSError):
            raise ConnectUnavailable(f"backend {self.backend!r}: metadata could not be read") from None
        if not isinstance(found, dict):
            raise ConnectUnavailable(f"backend {self.backend!r}: metadata is not an object")
        return found

    # -- the gateway's client there ---------------------------------------------------------

    def client(self, server: AuthServer) -> dict[str, Any]:
        """``{client_id, client_secret, method}``: configured, the metadata document, or registered."""
        if self.config.client_id is not None:
            method = "client_secret_basic" if "client_secret_basic" in server.auth_methods else "client_secret_post"
            return {"client_id": self.config.client_id, "client_secret": self._secret,
                    "method": method if self._secret else "none"}
        if server.cimd and self.public_url.startswith("https://"):
            return {"client_id": self.public_url + CLIENT_DOCUMENT_PATH, "client_secret": None, "method": "none"}
        key = hashlib.sha256(f"{server.issuer}\0{self.redirect_uri}".encode()).hexdigest()
        known = self._records.get("backend-client", key)
        if known is not None:
            return known
        registered = self._register(server)
        if not self._records.add("backend-client", key, registered, CONNECTION_TTL):
            return self._records.get("backend-client", key) or registered  # another worker registered first
        return registered

    def _register(self, server: AuthServer) -> dict[str, Any]:
        if server.registration_endpoint is None:
            raise ConnectUnavailable(f"backend {self.backend!r}: its authorization server takes no registration "
                                     "and no client is configured (outgoingAuth oauth.clientId)")
        method = "none" if "none" in server.auth_methods else "client_secret_basic"
        asked = {"client_name": self._name, "redirect_uris": [self.redirect_uri],
                 "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
                 "token_endpoint_auth_method": method}
        if server.scopes:
            asked["scope"] = " ".join(server.scopes)
        try:
            response = self._http.post(server.registration_endpoint, json=asked, timeout=HTTP_TIMEOUT,
                                       allow_redirects=False)
            answer = response.json()
        except (requests.RequestException, ValueError):
            raise ConnectUnavailable(f"backend {self.backend!r}: registration at its authorization server "
                                     "failed") from None
        if response.status_code not in (200, 201) or not isinstance(answer, dict) \
                or not isinstance(answer.get("client_id"), str):
            raise ConnectUnavailable(f"backend {self.backend!r}: its authorization server refused the "
                                     "gateway's registration")
        secret = answer.get("client_secret") if isinstance(answer.get("client_secret"), str) else None
        granted = answer.get("token_endpoint_auth_method", method)
        return {"client_id": answer["client_id"], "client_secret": secret,
                "method": granted if secret else "none"}

    def client_document(self) -> dict[str, Any]:
        """The gateway's client metadata document (CIMD)."""
        return {"client_id": self.public_url + CLIENT_DOCUMENT_PATH, "client_name": self._name,
                "client_uri": self.public_url, "redirect_uris": [self.redirect_uri],
                "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
                "token_endpoint_auth_method": "none"}

    def session(self, client: dict[str, Any], scopes: tuple[str, ...] = ()) -> OAuth2Session:
        session = OAuth2Session(client["client_id"], client.get("client_secret"),
                                token_endpoint_auth_method=client.get("method", "none"),
                                redirect_uri=self.redirect_uri, scope=" ".join(scopes) or None,
                                code_challenge_method="S256", timeout=HTTP_TIMEOUT)
        session.trust_env = False
        return session

    def token_request(self, send: Callable[[OAuth2Session], Any], client: dict[str, Any]) -> dict[str, Any]:
        try:
            with self.session(client) as session:
                tokens = dict(send(session))
        except ClientOAuthError as error:
            code = error.error if isinstance(error.error, str) and _ERROR_CODE.match(error.error) else "refused"
            logger.info("backend %r: its authorization server refused a token request: %s", self.backend, code)
            raise ConnectRefused(code) from None
        except (requests.RequestException, ValueError) as error:
            logger.warning("backend %r: its token endpoint failed: %s", self.backend, error.__class__.__name__)
            raise ConnectUnavailable(f"backend {self.backend!r}: its authorization server cannot be reached") \
                from None
        if not isinstance(tokens.get("access_token"), str) or not tokens["access_token"]:
            raise ConnectUnavailable(f"backend {self.backend!r}: its authorization server answered no token")
        return tokens


def kept_tokens(tokens: dict[str, Any], now: float) -> dict[str, Any]:
    """What of a token answer is kept: the tokens, when to refresh, what was granted."""
    expires_in = tokens.get("expires_in")
    lifetime = float(expires_in) if isinstance(expires_in, (int, float)) and not isinstance(expires_in, bool) \
        and expires_in > 0 else DEFAULT_LIFETIME
    kept = {"access_token": tokens["access_token"], "refresh_token": tokens.get("refresh_token"),
            "expires_at": now + lifetime, "refresh_at": now + lifetime - min(EXPIRY_MARGIN, lifetime / 2)}
    if isinstance(tokens.get("scope"), str):
        kept["scope"] = tokens["scope"]
    return kept


class Events:
    """Counts (metrics) and audit lines of connects, refreshes and failures; never a token."""

    def __init__(self, count: Callable[[str, str], None] | None = None):
        self._count = count
        self.audit: Callable[[str, str, dict[str, Any]], None] | None = None

    def __call__(self, step: str, outcome: str, **fields: Any) -> None:
        if self._count is not None:
            self._count(step, outcome)
        if self.audit is not None:
            self.audit(step, outcome, fields)


class Connections:
    """The people's connections (implements backends' ``PersonalTokens``)."""

    def __init__(self, config: VmcpConfig, records: OAuthRecords, secrets_by_backend: dict[str, str | None],
                 events: Events | None = None, clock: Callable[[], float] = time.time,
                 guard_for: Callable[[str], UrlGuard] | None = None):
        public_url = config.public_url
        assert public_url is not None, "the config checks a public URL is known"
        self.public_url = public_url
        self.records = records
        self.events = events if events is not None else Events()
        self._clock = clock
        self._http = requests.Session()
        self._http.trust_env = False
        self.backends: dict[str, BackendAuthorization] = {}
        for name in config.connected_backends:
            backend = config.backend(name)
            auth = config.outgoing_auth.for_backend(name)
            assert backend is not None and auth.oauth is not None
            url = backend.url or ""
            self.backends[name] = BackendAuthorization(
                name, url, auth.oauth, secrets_by_backend.get(name), public_url, config.name, records, self._http,
                guard_for(url) if guard_for is not None and backend.url else None)
        self._tokens_lock = threading.Lock()  # guards _tokens (tokens this process read lately)
        self._tokens: dict[tuple[str, str], tuple[str, float]] = {}
        self._changed = threading.Condition()  # wakes waiters when this process stores a connection
        self.on_change: Callable[[Identity | tuple[str, str], str], None] | None = None
        self.refreshes = 0

    # -- tokens (PersonalTokens) ------------------------------------------------------------

    def token(self, identity: Identity | None, backend: str) -> str:
        if identity is None:
            raise ConnectionNeeded(backend, f"backend {backend!r} needs a signed-in person")
        key = (person_key(identity), backend)
        now = time.monotonic()
        with self._tokens_lock:
            kept = self._tokens.get(key)
            if kept is not None and now < kept[1]:
                return kept[0]
        connection = self._fresh(identity, backend)
        until = min(now + LOCAL_TOKEN_FOR, now + max(0.0, connection["refresh_at"] - self._clock()))
        with self._tokens_lock:
            if len(self._tokens) > 10_000:
                self._tokens.clear()
            self._tokens[key] = (connection["access_token"], until)
        return connection["access_token"]

    def refused(self, identity: Identity | None, backend: str, token: str, status: int,
                challenge: str | None) -> ConnectionNeeded | None:
        """A 401, or a 403 for scope, asks the person to connect (again); another 403 is the
        backend's answer to this call (None), and the connection stays."""
        asked = parse_challenge(challenge)
        if status == 403 and asked.get("error") != "insufficient_scope":
            return None
        if identity is None:
            return ConnectionNeeded(backend, f"backend {backend!r} needs a signed-in person")
        key = person_key(identity)
        connection = self.records.get("connection", f"{key}|{backend}") or {}
        scopes = tuple(connection.get("scopes", ()))
        if status == 403 and asked.get("error") == "insufficient_scope":
            wanted = tuple(dict.fromkeys([*scopes, *asked.get("scope", "").split()]))
            self.events("call", "insufficient_scope", backend=backend, user=identity.subject)
            return ConnectionNeeded(backend, f"backend {backend!r} needs more of your authorization "
                                             f"({' '.join(wanted)}): connect again", wanted)
        self._forget(identity, backend, only_token=token)
        self.events("call", "token_refused", backend=backend, user=identity.subject)
        return ConnectionNeeded(backend, f"backend {backend!r} no longer accepts your authorization: connect "
                                         "again", scopes)

    def connected(self, identity: Identity | None, backend: str) -> bool:
        return identity is not None and self.records.get("connection", f"{person_key(identity)}|{backend}") \
            is not None

    def _fresh(self, identity: Identity, backend: str) -> dict[str, Any]:
        record_key = f"{person_key(identity)}|{backend}"
        connection = self.records.get("connection", record_key)
        if connection is None:
            raise ConnectionNeeded(backend, f"backend {backend!r} needs your authorization: connect it first")
        if self._clock() < connection["refresh_at"]:
            return connection
        if not connection.get("refresh_token"):
            if self._clock() < connection["expires_at"]:
                return connection
            self._forget(identity, backend)
            raise ConnectionNeeded(backend, f"your authorization at backend {backend!r} expired: connect again",
                                   tuple(connection.get("scopes", ())))
        holder = self.records.acquire(f"connection-refresh:{record_key}", REFRESH_LOCK_TTL)
        if holder is None:
            return self._refreshed_by_another(identity, backend, connection)
        try:
            current = self.records.get("connection", record_key)
            if current is None:
                raise ConnectionNeeded(backend, f"backend {backend!r} needs your authorization: connect it first")
            if self._clock() < current["refresh_at"]:
                return current  # another worker refreshed it meanwhile
            return self._refresh(identity, backend, current)
        finally:
            self.records.release(f"connection-refresh:{record_key}", holder)

    def _refresh(self, identity: Identity, backend: str, current: dict[str, Any]) -> dict[str, Any]:
        authorization = self.backends[backend]
        try:
            server = authorization.server()
            client = current["client"]
            tokens = authorization.token_request(lambda session: session.refresh_token(
                server.token_endpoint, refresh_token=current["refresh_token"], **_resource(server)), client)
        except ConnectRefused as refused:
            self.events("refresh", "refused", backend=backend, user=identity.subject, error=str(refused))
            self._forget(identity, backend)
            raise ConnectionNeeded(backend, f"backend {backend!r} no longer accepts your authorization: connect "
                                            "again", tuple(current.get("scopes", ()))) from None
        except ConnectUnavailable as down:
            self.events("refresh", "unavailable", backend=backend, user=identity.subject)
            if self._clock() < current["expires_at"]:
                return current  # still valid: try again on a later call
            raise BackendAuthError(backend, str(down)) from None
        self.refreshes += 1
        renewed = {**current, **kept_tokens(tokens, self._clock())}
        if not renewed.get("refresh_token"):
            renewed["refresh_token"] = current["refresh_token"]  # the server does not rotate it
        self.records.put("connection", f"{person_key(identity)}|{backend}", renewed, CONNECTION_TTL)
        self.events("refresh", "ok", backend=backend, user=identity.subject)
        return renewed

    def _refreshed_by_another(self, identity: Identity, backend: str, stale: dict[str, Any]) -> dict[str, Any]:
        record_key = f"{person_key(identity)}|{backend}"
        outcome, kept = await_renewal(self.records, "connection", record_key, f"connection-refresh:{record_key}",
                                      stale, REFRESH_WAIT)
        if outcome == "renewed":
            assert kept is not None
            return kept
        if outcome == "gone":
            raise ConnectionNeeded(backend, f"backend {backend!r} no longer accepts your authorization: connect "
                                            "again", tuple(stale.get("scopes", ())))
        if outcome == "late":
            raise BackendAuthError(backend, f"backend {backend!r}: your authorization is being renewed; retry")
        return self._fresh(identity, backend)  # the other worker gave up without a result: once more here

    def _forget(self, identity: Identity, backend: str, only_token: str | None = None) -> None:
        record_key = f"{person_key(identity)}|{backend}"
        if only_token is None:
            self.records.delete("connection", record_key)
        else:  # not one a refresh put there meanwhile
            self.records.update("connection", record_key,
                                lambda record: None if record.get("access_token") == only_token else record)
        with self._tokens_lock:
            self._tokens.pop((person_key(identity), backend), None)

    # -- connect links -----------------------------------------------------------------------

    def link(self, identity: Identity, backend: str, scopes: tuple[str, ...] = ()) -> tuple[str, str]:
        """A new connect link for this person and backend: ``(url, elicitation id)``."""
        ticket = secrets.token_urlsafe(24)
        elicitation = secrets.token_urlsafe(12)
        self.records.put("connect-ticket", secret_key(ticket), {"person": [identity.issuer, identity.subject],
                                                                "backend": backend, "scopes": list(scopes),
                                                                "elicitation": elicitation}, TICKET_TTL)
        self.events("link", "made", backend=backend, user=identity.subject)
        return f"{self.public_url}/connect/{ticket}", elicitation

    def ticket(self, ticket: str) -> dict[str, Any] | None:
        return self.records.get("connect-ticket", secret_key(ticket)) if 10 <= len(ticket) <= 100 else None

    def authorization_url(self, ticket: dict[str, Any], ticket_id: str, browser: str) -> str:
        """Where the person goes to authorize: the flow is kept under its ``state``."""
        backend = ticket["backend"]
        authorization = self.backends[backend]
        server = authorization.server()
        client = authorization.client(server)
        # The operator's choice, else what the backend asks for; plus what a 403 asked for since.
        asked = authorization.config.scopes or server.scopes
        scopes = tuple(dict.fromkeys([*asked, *ticket.get("scopes", ())]))
        state, verifier = secrets.token_urlsafe(24), secrets.token_urlsafe(48)
        with authorization.session(client, scopes) as session:
            url, _ = session.create_authorization_url(server.authorization_endpoint, state=state,
                                                      code_verifier=verifier, **_resource(server))
        self.records.put("connect-flow", secret_key(state), {"ticket": ticket_id, "browser": browser, "verifier": verifier,
                                                 "backend": backend, "person": ticket["person"],
                                                 "issuer": server.issuer, "client": client,
                                                 "scopes": list(scopes), "elicitation": ticket["elicitation"]},
                         FLOW_TTL)
        self.events("authorize", "sent", backend=backend)
        return url

    def take_flow(self, state: str) -> dict[str, Any] | None:
        """The connect under way that ``state`` names, taken (a callback uses it once)."""
        return self.records.take("connect-flow", secret_key(state)) if 10 <= len(state) <= 100 else None

    def finish(self, state: str, code: str, iss: str | None, browser: str) -> dict[str, Any]:
        """The callback: the flow of ``state`` (taken once), its code exchanged, the tokens
        stored for its person. ConnectRefused when anything does not match."""
        flow = self.take_flow(state)
        if flow is None:
            self.events("callback", "expired")
            raise ConnectRefused("this connect has expired or was already finished")
        backend = flow["backend"]
        if not secrets.compare_digest(flow["browser"], browser):
            self.events("callback", "other_browser", backend=backend)
            raise ConnectRefused("this connect was started in another browser")
        authorization = self.backends.get(backend)
        if authorization is None:
            raise ConnectRefused("this backend no longer takes connections")
        server = authorization.server()
        if (iss is not None and iss.rstrip("/") != flow["issuer"]) or (iss is None and server.sends_iss):
            self.events("callback", "issuer_mismatch", backend=backend)
            raise ConnectRefused("the answer came from another authorization server")
        try:
            tokens = authorization.token_request(lambda session: session.fetch_token(
                server.token_endpoint, grant_type="authorization_code", code=code, code_verifier=flow["verifier"],
                **_resource(server)), flow["client"])
        except ConnectRefused as refused:
            self.events("callback", "code_refused", backend=backend, error=str(refused))
            raise ConnectRefused("the authorization server did not accept the answer") from None
        now = self._clock()
        kept = kept_tokens(tokens, now)
        granted = kept.pop("scope", None)
        issuer, subject = flow["person"]
        connection = {**kept, "backend": backend, "person": [issuer, subject], "client": flow["client"],
                      "scopes": granted.split() if granted else flow["scopes"], "since": now}
        ttl = CONNECTION_TTL if kept["refresh_token"] else max(1.0, kept["expires_at"] - now)
        key = person_digest((issuer, subject))
        self.records.put("connection", f"{key}|{backend}", connection, ttl)
        self.records.delete("connect-ticket", secret_key(flow["ticket"]))
        with self._tokens_lock:
            self._tokens.pop((key, backend), None)
        with self._changed:
            self._changed.notify_all()
        self.events("connect", "ok", backend=backend, user=subject)
        if self.on_change is not None:
            self.on_change((issuer, subject), backend)
        return {"backend": backend, "elicitation": flow["elicitation"], "person": [issuer, subject]}

    def now(self) -> float:
        return self._clock()

    def wait_connected(self, identity: Identity, backend: str, timeout: float, since: float = 0.0) -> bool:
        """Whether the person has connected ``backend`` (at ``since`` or later: a connect asked
        for more scopes replaces one already there), waiting up to ``timeout`` for it (woken
        by a connect in this process; another worker's is seen within a second)."""
        deadline = time.monotonic() + timeout
        record_key = f"{person_key(identity)}|{backend}"
        while True:
            connection = self.records.get("connection", record_key)
            if connection is not None and connection.get("since", 0.0) >= since:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with self._changed:
                self._changed.wait(min(1.0, left))

    # -- the person's own view -----------------------------------------------------------------

    def of(self, person: tuple[str, str]) -> list[dict[str, Any]]:
        """Their connections, without tokens."""
        key = person_digest(person)
        found = []
        for backend in sorted(self.backends):
            connection = self.records.get("connection", f"{key}|{backend}")
            found.append({"backend": backend, "connected": connection is not None,
                          "scopes": list(connection.get("scopes", ())) if connection else [],
                          "since": connection.get("since") if connection else None,
                          "state": _state(connection, self._clock())})
        return found

    def disconnect(self, person: tuple[str, str], backend: str) -> bool:
        """Forget the connection and revoke its tokens where the server offers revocation."""
        key = person_digest(person)
        connection = self.records.take("connection", f"{key}|{backend}")
        with self._tokens_lock:
            self._tokens.pop((key, backend), None)
        if connection is None:
            return False
        authorization = self.backends.get(backend)
        if authorization is not None:
            self._revoke(authorization, connection)
        self.events("disconnect", "ok", backend=backend, user=person[1])
        if self.on_change is not None:
            self.on_change(person, backend)
        return True

    def _revoke(self, authorization: BackendAuthorization, connection: dict[str, Any]) -> None:
        try:
            server = authorization.server()
            if server.revocation_endpoint is None:
                return
            for token, hint in ((connection.get("refresh_token"), "refresh_token"),
                                (connection.get("access_token"), "access_token")):
                if token:
                    with authorization.session(connection["client"]) as session:
                        session.revoke_token(server.revocation_endpoint, token, token_type_hint=hint)
        except (ConnectUnavailable, requests.RequestException, ClientOAuthError) as error:
            logger.warning("backend %r: revoking a disconnected person's tokens failed: %s",
                           authorization.backend, error.__class__.__name__)

    def overview(self) -> dict[str, Any]:
        """For operators: every person's connections (backend, scopes, since, state), no token."""
        rows = []
        for record_key in sorted(self.records.keys("connection")):
            connection = self.records.get("connection", record_key)
            if connection is None:
                continue
            rows.append({"backend": connection["backend"], "issuer": connection["person"][0],
                         "user": connection["person"][1], "scopes": list(connection.get("scopes", ())),
                         "since": connection.get("since"), "state": _state(connection, self._clock())})
        return {"connections": rows, "refreshes": self.refreshes}


def _resource(server: AuthServer) -> dict[str, str]:
    """RFC 8707: the backend the token is for, when it is known."""
    return {"resource": server.resource} if server.resource else {}


def _state(connection: dict[str, Any] | None, now: float) -> str:
    if connection is None:
        return "not connected"
    if now < connection["expires_at"]:
        return "connected"
    return "expired (renewed on next use)" if connection.get("refresh_token") else "expired"

