"""A backend's authorization server, as the gateway learns it, and the gateway's client there.

* **What the server is** is learned once per backend: the backend's 401 challenge
  (``resource_metadata``, ``scope``) or its RFC 9728 metadata, then the authorization
  server's RFC 8414 (or OpenID) metadata; or the issuer the operator named. Every URL
  learned there passes ``UrlGuard``: https unless loopback, and a private or loopback
  address only when the backend's own URL (or the named issuer) is one (a public backend
  cannot point the gateway into its network).
* **Which client the gateway is** there: the configured one, else its client metadata
  document (CIMD) where the server takes one and the public URL is https, else one it
  registers (RFC 7591), kept in the records for every worker.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import re
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

from vmcp_actors.config import BackendOAuthConfig
from vmcp_actors.oauth._clients import LOOPBACK_HOSTS, address_allowed
from vmcp_actors.oauth._records import OAuthRecords

logger = logging.getLogger(__name__)

SERVER_KNOWN_FOR = 3600.0  # a backend's authorization server metadata is read again after this
HTTP_TIMEOUT = 10.0
MAX_METADATA_BYTES = 64 * 1024
CONNECTION_TTL = 90 * 86400.0  # a connection with a refresh token (or a registration) is kept this long
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


def resource_of(server: AuthServer) -> dict[str, str]:
    """RFC 8707: the backend the token is for, when it is known."""
    return {"resource": server.resource} if server.resource else {}
