"""The clients that may sign people in: registered ones (RFC 7591, kept in the records) and
those whose id is the https URL of their metadata document (CIMD), fetched behind an SSRF
guard.

Redirect URIs follow RFC 8252 and OAuth 2.1: https anywhere, plain http only to a
loopback address (whose port may differ from the registered one, since a native app
picks a free port each time), or a private-use scheme of a native app; never a fragment.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import urllib3
from authlib.oauth2.rfc6749 import ClientMixin

from vmcp_actors.config import CimdConfig
from vmcp_actors.oauth._records import OAuthRecords

logger = logging.getLogger(__name__)

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# Schemes a browser or the OS would run rather than hand to an app.
NEVER_REDIRECT_SCHEMES = frozenset({"javascript", "data", "file", "vbscript", "about", "blob", "ftp", "ws", "wss",
                                    "http", "https", "chrome", "view-source"})
PRIVATE_USE_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
AUTH_METHODS = ("none", "client_secret_basic", "client_secret_post")
MAX_REDIRECT_URIS = 10
MAX_URI_CHARS = 2000
MAX_NAME_CHARS = 200
CIMD_MAX_BYTES = 16 * 1024
CIMD_TIMEOUT = 5.0
CIMD_DEFAULT_CACHE = 300.0
CIMD_MAX_CACHE = 86400.0
CIMD_CACHE_ENTRIES = 1000
CIMD_REFUSED_FOR = 60.0
CIMD_CONCURRENT_FETCHES = 8


class ClientRefused(ValueError):
    """Client metadata that cannot be accepted; the message is safe to show the client."""


def redirect_uri_problem(uri: object) -> str | None:
    if not isinstance(uri, str) or not uri or len(uri) > MAX_URI_CHARS or any(ch.isspace() for ch in uri):
        return "each redirect URI must be a URI without spaces"
    if "\\" in uri:
        # A browser reads it as "/", Python as part of the authority: http://evil.example\@127.0.0.1/
        # would pass as loopback here and take the code to evil.example there.
        return "redirect URIs must not contain a backslash"
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        return "each redirect URI must be a URI"
    if parts.fragment or "#" in uri:
        return "redirect URIs must not have a #fragment"
    scheme = parts.scheme.lower()
    if scheme == "https":
        return None if parts.hostname else "an https redirect URI needs a host"
    if scheme == "http":
        if parts.hostname in LOOPBACK_HOSTS:
            return None
        return "a plain http redirect URI must point at a loopback address (127.0.0.1, [::1] or localhost)"
    if PRIVATE_USE_SCHEME.fullmatch(scheme) and scheme not in NEVER_REDIRECT_SCHEMES:
        return None  # a native app's private-use scheme (RFC 8252 section 7.1)
    return f"the {scheme or 'missing'} scheme is not allowed in a redirect URI"


def redirect_matches(registered: str, requested: str) -> bool:
    """Exact match, except that a loopback http redirect URI may use any port (RFC 8252 7.3)."""
    if requested == registered:
        return True
    if redirect_uri_problem(requested):
        return False  # e.g. a backslash, which sends the browser somewhere urlsplit does not see
    try:
        want, got = urlsplit(registered), urlsplit(requested)
        want_port, got_port = want.port, got.port  # noqa: F841 - raise on a bad port
    except ValueError:
        return False
    if got.username is not None or got.password is not None:
        return False
    return (want.scheme == got.scheme == "http" and want.hostname in LOOPBACK_HOSTS
            and want.hostname == got.hostname and want.path == got.path and want.query == got.query)


def secret_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class GatewayClient(ClientMixin):
    """One client as Authlib sees it. ``kind`` is ``dcr`` or ``cimd``."""

    client_id: str
    redirect_uris: tuple[str, ...]
    kind: str
    client_name: str = ""
    token_endpoint_auth_method: str = "none"
    grant_types: tuple[str, ...] = ("authorization_code", "refresh_token")
    secret_digest: str | None = field(default=None, repr=False)
    client_uri: str | None = None

    @property
    def verified_domain(self) -> str | None:
        """For a CIMD client, the host its metadata came from (what the person can trust)."""
        return urlsplit(self.client_id).hostname if self.kind == "cimd" else None

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        return self.redirect_uris[0] if len(self.redirect_uris) == 1 else None

    def get_allowed_scope(self, scope: str) -> str:
        return scope or ""

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return any(redirect_matches(registered, redirect_uri) for registered in self.redirect_uris)

    def check_client_secret(self, client_secret: str) -> bool:
        if self.secret_digest is None:
            return False
        return hmac.compare_digest(self.secret_digest, secret_digest(client_secret))

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method == self.token_endpoint_auth_method

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code"

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type in self.grant_types

    def record(self) -> dict[str, Any]:
        return {"client_id": self.client_id, "redirect_uris": list(self.redirect_uris), "kind": self.kind,
                "client_name": self.client_name, "token_endpoint_auth_method": self.token_endpoint_auth_method,
                "grant_types": list(self.grant_types), "secret_digest": self.secret_digest,
                "client_uri": self.client_uri}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> GatewayClient:
        return cls(record["client_id"], tuple(record["redirect_uris"]), record["kind"], record.get("client_name", ""),
                   record.get("token_endpoint_auth_method", "none"), tuple(record.get("grant_types", ())),
                   record.get("secret_digest"), record.get("client_uri"))


def checked_metadata(metadata: dict[str, Any], *, kind: str) -> dict[str, Any]:
    """The client metadata the gateway keeps, checked; ClientRefused says what is wrong."""
    redirect_uris = metadata.get("redirect_uris")
    if not isinstance(redirect_uris, list) or not redirect_uris:
        raise ClientRefused("redirect_uris must list at least one redirect URI")
    if len(redirect_uris) > MAX_REDIRECT_URIS:
        raise ClientRefused(f"redirect_uris may list at most {MAX_REDIRECT_URIS} URIs")
    for uri in redirect_uris:
        problem = redirect_uri_problem(uri)
        if problem:
            raise ClientRefused(problem)
    default_method = "none" if kind == "cimd" else "client_secret_basic"  # RFC 7591's default
    method = metadata.get("token_endpoint_auth_method", default_method)
    allowed = ("none",) if kind == "cimd" else AUTH_METHODS
    if method not in allowed:
        raise ClientRefused(f"token_endpoint_auth_method must be one of {', '.join(allowed)}")
    grant_types = metadata.get("grant_types", ["authorization_code"])
    if not isinstance(grant_types, list) or not all(isinstance(grant, str) for grant in grant_types) \
            or "authorization_code" not in grant_types \
            or not set(grant_types) <= {"authorization_code", "refresh_token"}:
        raise ClientRefused("grant_types must include authorization_code and may add refresh_token, nothing else")
    response_types = metadata.get("response_types", ["code"])
    if response_types != ["code"]:
        raise ClientRefused("response_types must be [\"code\"]")
    name = metadata.get("client_name", "")
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS:
        raise ClientRefused(f"client_name must be text of at most {MAX_NAME_CHARS} characters")
    client_uri = metadata.get("client_uri")
    if client_uri is not None and (not isinstance(client_uri, str) or not client_uri.startswith("https://")
                                   or len(client_uri) > MAX_URI_CHARS):
        raise ClientRefused("client_uri must be an https URL")
    return {"redirect_uris": redirect_uris, "token_endpoint_auth_method": method,
            "grant_types": grant_types, "client_name": name.strip(), "client_uri": client_uri}


class RegisteredClients:
    """Clients registered here (DCR), in the records so every worker knows them."""

    def __init__(self, records: OAuthRecords, ttl: float):
        self._records = records
        self._ttl = ttl

    def register(self, metadata: dict[str, Any]) -> tuple[GatewayClient, str | None]:
        """A new client and its secret (None for a public client)."""
        kept = checked_metadata(metadata, kind="dcr")
        secret = secrets.token_urlsafe(32) if kept["token_endpoint_auth_method"] != "none" else None
        client = GatewayClient("dcr_" + secrets.token_urlsafe(24), tuple(kept["redirect_uris"]), "dcr",
                               kept["client_name"], kept["token_endpoint_auth_method"], tuple(kept["grant_types"]),
                               secret_digest(secret) if secret else None, kept["client_uri"])
        self._records.put("client", client.client_id, client.record(), self._ttl)
        return client, secret

    def find(self, client_id: str) -> GatewayClient | None:
        if not client_id.startswith("dcr_") or len(client_id) > 64:
            return None
        record = self._records.get("client", client_id)
        return GatewayClient.from_record(record) if record is not None else None

    def renew(self, client_id: str) -> None:
        """A client in use stays registered: its record lives another ``ttl`` from now."""
        record = self._records.get("client", client_id)
        if record is not None:
            self._records.put("client", client_id, record, self._ttl)


class CimdUnavailable(Exception):
    """The document could not be fetched or is not acceptable; the message is safe to show."""


def address_allowed(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.sixtofour is not None and not address_allowed(str(ip.sixtofour)):
            return False  # 2002:7f00:1:: is 127.0.0.1 through a 6to4 relay, yet is_global
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast and not ip.is_reserved


class CimdClients:
    """Client ID metadata documents: fetched once per cache life, behind the SSRF guard.

    The guard resolves the host once, refuses any private, loopback, link-local or other
    non-global address (unless ``allowedHosts`` names the host), then connects to exactly
    the address it checked (so a second DNS answer cannot point it elsewhere), with TLS
    verified against the host name, no redirects, a time and a size cap."""

    def __init__(self, config: CimdConfig, resolve: Any = socket.getaddrinfo):
        self._config = config
        self._resolve = resolve
        self._lock = threading.Lock()  # guards _cache (url -> (expires, client))
        self._cache: dict[str, tuple[float, GatewayClient | CimdUnavailable]] = {}
        # Fetches under way at once: a flood of client ids naming slow hosts holds this
        # many web threads, not all of them.
        self._fetching = threading.BoundedSemaphore(CIMD_CONCURRENT_FETCHES)
        self.fetches = 0

    @staticmethod
    def is_cimd_id(client_id: str) -> bool:
        return client_id.startswith("https://")

    def find(self, client_id: str) -> GatewayClient:
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(client_id)
        if cached is not None and cached[0] > now:
            if isinstance(cached[1], CimdUnavailable):
                raise cached[1]  # refused a moment ago: not fetched again for CIMD_REFUSED_FOR
            return cached[1]
        if not self._fetching.acquire(blocking=False):
            raise CimdUnavailable("too many client metadata documents are being fetched; try again")
        try:
            client, max_age = self._fetch(client_id)
        except CimdUnavailable as refused:
            self._keep(client_id, now + CIMD_REFUSED_FOR, refused)
            raise
        finally:
            self._fetching.release()
        if max_age > 0:
            self._keep(client_id, now + max_age, client)
        return client

    def _keep(self, client_id: str, until: float, found: GatewayClient | CimdUnavailable) -> None:
        with self._lock:
            if len(self._cache) >= CIMD_CACHE_ENTRIES:
                self._cache.clear()  # many distinct documents cost fetches, not memory
            self._cache[client_id] = (until, found)

    def _fetch(self, url: str) -> tuple[GatewayClient, float]:
        if not self._config.enabled:
            raise CimdUnavailable("this server does not accept client ID metadata documents")
        parts = self._checked_url(url)
        host, port = parts.hostname or "", parts.port or 443
        addresses = self._addresses(host, port)
        deadline = time.monotonic() + CIMD_TIMEOUT
        for index, address in enumerate(addresses):  # each one checked; the next when one refuses connections
            try:
                response, body = self._get(address, port, parts, deadline)
                break
            except urllib3.exceptions.NewConnectionError:
                if index == len(addresses) - 1 or time.monotonic() >= deadline:
                    raise CimdUnavailable("the client metadata document could not be fetched "
                                          "(NewConnectionError)") from None
        self.fetches += 1
        if len(body) > CIMD_MAX_BYTES:
            raise CimdUnavailable(f"the client metadata document is larger than {CIMD_MAX_BYTES} bytes")
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: 16 KiB of "[" nests deeper than json goes
            raise CimdUnavailable("the client metadata document is not JSON") from None
        if not isinstance(document, dict) or document.get("client_id") != url:
            raise CimdUnavailable("the client metadata document's client_id is not its own URL")
        if "client_secret" in document or "client_secret_expires_at" in document:
            raise CimdUnavailable("the client metadata document carries a client secret (it is public)")
        try:
            kept = checked_metadata(document, kind="cimd")
        except ClientRefused as refused:
            raise CimdUnavailable(f"the client metadata document: {refused}") from None
        if not kept["client_name"]:
            raise CimdUnavailable("the client metadata document has no client_name")
        client = GatewayClient(url, tuple(kept["redirect_uris"]), "cimd", kept["client_name"], "none",
                               tuple(kept["grant_types"]), None, kept["client_uri"])
        return client, _max_age(response.headers.get("Cache-Control"))

    def _get(self, address: str, port: int, parts: Any, deadline: float) -> tuple[Any, bytes]:
        """GET the document from exactly ``address`` (TLS checked against the URL's host)."""
        try:
            context = _tls_context(self._config.ca_bundle, deadline)
        except (OSError, ssl.SSLError):
            raise CimdUnavailable("the client metadata document could not be fetched (CA bundle)") from None
        pool = urllib3.HTTPSConnectionPool(
            address, port, server_hostname=parts.hostname, assert_hostname=parts.hostname, cert_reqs="CERT_REQUIRED",
            ssl_context=context, retries=False, timeout=urllib3.Timeout(total=max(0.1, deadline - time.monotonic())),
            maxsize=1)
        try:
            response = pool.urlopen("GET", parts.path + (f"?{parts.query}" if parts.query else ""),
                                    headers={"Host": parts.netloc, "Accept": "application/json"},
                                    redirect=False, preload_content=False)
            try:
                if response.status != 200:
                    raise CimdUnavailable(f"the client metadata document answered HTTP {response.status}")
                return response, response.read(CIMD_MAX_BYTES + 1, decode_content=True)
            finally:
                response.release_conn()
        except urllib3.exceptions.NewConnectionError:
            raise
        except urllib3.exceptions.HTTPError as error:
            raise CimdUnavailable(f"the client metadata document could not be fetched "
                                  f"({error.__class__.__name__})") from None
        finally:
            pool.close()

    def _checked_url(self, url: str) -> Any:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError:
            raise CimdUnavailable("the client_id is not a valid URL") from None
        segments = {unquote(segment) for segment in parts.path.split("/")}
        if len(url) > MAX_URI_CHARS or parts.scheme != "https" or not parts.hostname or parts.username \
                or parts.password or parts.fragment or "#" in url or parts.path in ("", "/") \
                or segments & {".", ".."}:
            raise CimdUnavailable("a client_id URL must be https with a host and a path, without user info, "
                                  "fragment or dot segments")
        return parts

    def _addresses(self, host: str, port: int) -> list[str]:
        try:
            answers = self._resolve(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise CimdUnavailable("the client_id's host does not resolve") from None
        addresses = [answer[4][0] for answer in answers]
        if not addresses:
            raise CimdUnavailable("the client_id's host does not resolve")
        allowed = self._config.allowed_hosts
        if host.lower() in allowed or f"{host.lower()}:{port}" in allowed or f"[{host.lower()}]:{port}" in allowed:
            return list(dict.fromkeys(addresses))
        if not all(address_allowed(address) for address in addresses):
            raise CimdUnavailable("the client_id's host is a private, loopback or link-local address")
        return list(dict.fromkeys(addresses))


def _default_ca_bundle() -> str | None:
    try:
        import certifi

        return certifi.where()
    except ImportError:
        return None


class _DeadlineSocket(ssl.SSLSocket):
    """A TLS socket that waits, at each handshake step and read, only as long as the fetch has
    left (its context's ``deadline``): a socket timeout bounds one read, so a server sending a
    byte at a time would otherwise hold the request thread for hours."""

    def _wait_at_most_what_is_left(self) -> None:
        left = self.context.deadline - time.monotonic()  # type: ignore[attr-defined]
        if left <= 0:
            raise TimeoutError("the client metadata document took too long")
        self.settimeout(left)

    def do_handshake(self, block: bool = False) -> None:
        self._wait_at_most_what_is_left()
        super().do_handshake(block)

    def read(self, len: int = 1024, buffer: Any = None) -> Any:  # noqa: A002 - ssl.SSLSocket's names
        self._wait_at_most_what_is_left()
        return super().read(len, buffer)


def _tls_context(ca_bundle: str | None, deadline: float) -> ssl.SSLContext:
    """One fetch's TLS: the usual CAs plus ``ca_bundle`` (the operator's extra ones), host names
    checked by urllib3 against the certificate's names only, every wait ending by ``deadline``."""
    context = urllib3.util.create_urllib3_context(cert_reqs=ssl.CERT_REQUIRED)
    default = _default_ca_bundle()
    if default:
        context.load_verify_locations(default)
    else:
        context.load_default_certs()
    if ca_bundle:
        context.load_verify_locations(ca_bundle)
    context.hostname_checks_common_name = False
    context.sslsocket_class = _DeadlineSocket
    context.deadline = deadline  # type: ignore[attr-defined]
    return context


def _max_age(cache_control: str | None) -> float:
    """How long a document may be reused, by its Cache-Control (bounded); 0 = not at all."""
    if not cache_control:
        return CIMD_DEFAULT_CACHE
    directives = {part.strip().split("=", 1)[0].lower(): part.strip().partition("=")[2].strip('"')
                  for part in cache_control.split(",")}
    if "no-store" in directives or "no-cache" in directives:
        return 0.0
    try:
        return min(CIMD_MAX_CACHE, max(0.0, float(directives.get("max-age", CIMD_DEFAULT_CACHE))))
    except ValueError:
        return CIMD_DEFAULT_CACHE
