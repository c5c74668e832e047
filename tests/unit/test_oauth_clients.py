"""The authorization server's clients (vmcp_actors.oauth._clients): redirect URIs (RFC 8252,
OAuth 2.1), client metadata, dynamic registration, and client ID metadata documents fetched
behind the SSRF guard from a real HTTPS server on loopback (a trustme CA)."""

from __future__ import annotations

import hashlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest
import trustme

from tests.gateway import wait_until
from vmcp_actors.config import CimdConfig
from vmcp_actors.oauth import _clients
from vmcp_actors.oauth._clients import (
    CIMD_MAX_BYTES,
    CimdClients,
    CimdUnavailable,
    ClientRefused,
    GatewayClient,
    RegisteredClients,
    address_allowed,
    checked_metadata,
    redirect_matches,
    redirect_uri_problem,
)
from vmcp_actors.oauth._records import MemoryOAuthRecords

LOOPBACK_CALLBACK = "http://127.0.0.1/callback"
HOLD = 30.0  # a held answer is sent after this long at most: a fetch without a time cap then succeeds
DRIP_INTERVAL = 0.05  # a dripping server sends a byte this often (time is the behaviour under test)


# --- redirect URIs ---------------------------------------------------------------------------


@pytest.mark.parametrize("uri", [
    "https://app.example/callback",
    "https://app.example:8443/callback?tenant=1",
    "http://127.0.0.1/callback",
    "http://127.0.0.1:33418/callback",
    "http://localhost:8080/callback",
    "http://[::1]:9000/callback",
    "cursor://anysphere.cursor-retrieval/oauth/callback",
    "com.example.app:/oauth2redirect",
    "vscode://vscode.github-authentication/did-authenticate",
])
def test_https_loopback_http_and_private_use_schemes_are_redirect_uris(uri):
    assert redirect_uri_problem(uri) is None


@pytest.mark.parametrize(("uri", "expected"), [
    ("javascript:alert(1)", "the javascript scheme is not allowed"),
    ("JavaScript:alert(1)", "the javascript scheme is not allowed"),
    ("data:text/html,<script>alert(1)</script>", "the data scheme is not allowed"),
    ("file:///etc/passwd", "the file scheme is not allowed"),
    ("vbscript:msgbox", "the vbscript scheme is not allowed"),
    ("about:blank", "the about scheme is not allowed"),
    ("ws://127.0.0.1/callback", "the ws scheme is not allowed"),
    ("/callback", "the missing scheme is not allowed"),
    ("https://app.example/callback#done", "must not have a #fragment"),
    ("https://app.example/callback#", "must not have a #fragment"),
    ("https://app.example/my callback", "without spaces"),
    ("https://app.example/callback\n", "without spaces"),
    ("", "without spaces"),
    (None, "without spaces"),
    (["https://app.example/callback"], "without spaces"),
    ("https://app.example/" + "x" * 2000, "without spaces"),
    ("https:///callback", "needs a host"),
    ("http://app.example/callback", "must point at a loopback address"),
    ("http://localhost.evil.example/callback", "must point at a loopback address"),
    ("http://127.0.0.1.nip.io/callback", "must point at a loopback address"),
    ("http://127.0.0.1:99999/callback", "must be a URI"),
    # A browser reads the backslash as "/" and goes to evil.example; urlsplit sees host 127.0.0.1.
    ("http://evil.example\\@127.0.0.1/callback", "must not contain a backslash"),
])
def test_other_redirect_uris_are_refused_with_the_reason(uri, expected):
    assert expected in (redirect_uri_problem(uri) or "")


@pytest.mark.parametrize(("registered", "requested"), [
    ("https://app.example/callback", "https://app.example/callback"),
    ("cursor://anysphere.cursor-retrieval/oauth/callback", "cursor://anysphere.cursor-retrieval/oauth/callback"),
    ("http://127.0.0.1/callback", "http://127.0.0.1:51234/callback"),
    ("http://127.0.0.1:8080/callback", "http://127.0.0.1:9090/callback"),
    ("http://[::1]/callback", "http://[::1]:5000/callback"),
    ("http://localhost/callback?a=1", "http://localhost:4000/callback?a=1"),
])
def test_a_redirect_uri_matches_exactly_or_on_loopback_with_any_port(registered, requested):
    assert redirect_matches(registered, requested) is True


@pytest.mark.parametrize(("registered", "requested"), [
    ("https://app.example/callback", "https://app.example:8443/callback"),  # a port only loopback may change
    ("https://app.example/callback", "https://app.example/callback/"),
    ("https://app.example/callback", "https://APP.example/callback"),  # exact means exact
    ("http://127.0.0.1/callback", "http://localhost:5000/callback"),  # another host, if a loopback one
    ("http://127.0.0.1/callback", "http://127.0.0.1:5000/other"),
    ("http://127.0.0.1/callback", "http://127.0.0.1:5000/callback?extra=1"),
    ("http://127.0.0.1/callback", "https://127.0.0.1:5000/callback"),
    ("http://127.0.0.1/callback", "http://127.0.0.1:99999/callback"),
    ("http://127.0.0.1/callback", "http://127.0.0.1:5000/callback#x"),
    ("http://127.0.0.1/callback", "http://user@127.0.0.1:5000/callback"),
    ("http://127.0.0.1/callback", "http://evil.example\\@127.0.0.1/callback"),  # to evil.example in a browser
    ("http://app.example/callback", "http://app.example:81/callback"),  # plain http elsewhere: never
    ("cursor://a/callback", "cursor://b/callback"),
])
def test_a_redirect_uri_does_not_match_otherwise(registered, requested):
    assert redirect_matches(registered, requested) is False


# --- client metadata ---------------------------------------------------------------------------


def test_dcr_metadata_defaults_to_client_secret_basic_and_the_code_grant():
    kept = checked_metadata({"redirect_uris": [LOOPBACK_CALLBACK], "client_name": "  Editor  "}, kind="dcr")
    assert kept == {"redirect_uris": [LOOPBACK_CALLBACK], "token_endpoint_auth_method": "client_secret_basic",
                    "grant_types": ["authorization_code"], "client_name": "Editor", "client_uri": None}


def test_cimd_metadata_defaults_to_no_client_authentication():
    kept = checked_metadata({"redirect_uris": [LOOPBACK_CALLBACK], "client_uri": "https://app.example"},
                            kind="cimd")
    assert kept["token_endpoint_auth_method"] == "none" and kept["client_uri"] == "https://app.example"


@pytest.mark.parametrize(("kind", "metadata", "expected"), [
    ("dcr", {}, "redirect_uris must list at least one"),
    ("dcr", {"redirect_uris": []}, "redirect_uris must list at least one"),
    ("dcr", {"redirect_uris": LOOPBACK_CALLBACK}, "redirect_uris must list at least one"),
    ("dcr", {"redirect_uris": [f"https://app.example/{n}" for n in range(11)]}, "at most 10 URIs"),
    ("dcr", {"redirect_uris": ["javascript:alert(1)"]}, "the javascript scheme is not allowed"),
    ("dcr", {"redirect_uris": [LOOPBACK_CALLBACK], "token_endpoint_auth_method": "private_key_jwt"},
     "token_endpoint_auth_method must be one of none, client_secret_basic, client_secret_post"),
    ("cimd", {"redirect_uris": [LOOPBACK_CALLBACK], "token_endpoint_auth_method": "client_secret_basic"},
     "token_endpoint_auth_method must be one of none"),
    ("dcr", {"redirect_uris": [LOOPBACK_CALLBACK], "grant_types": ["implicit"]}, "grant_types must include"),
    ("dcr", {"redirect_uris": [LOOPBACK_CALLBACK], "grant_types": ["refresh_token"]}, "grant_types must include"),
    ("dcr", {"redirect_uris": [LOOPBACK_CALLBACK], "grant_types": ["authorization_code", "client_credentials"]},
     "grant_types must include"),
    ("dcr", {"redirect_uris": [LOOPBACK_CALLBACK], "grant_types": "authorization_code"}, "grant_types must include"),
    # Not text: refused, not a TypeError (a 500) from putting a dict in a set.
    ("dcr", {"redirect_uris": [LOOPBACK_CALLBACK], "grant_types": ["authorization_code", {}]},
     "grant_types must include"),
    ("dcr", {"redirect_uris": [LOOPBACK_CALLBACK], "response_types": ["token"]}, "response_types must be"),
    ("dcr", {"redirect_uris": [LOOPBACK_CALLBACK], "response_types": ["code", "token"]}, "response_types must be"),
    ("dcr", {"redirect_uris": [LOOPBACK_CALLBACK], "client_name": "x" * 201}, "client_name must be text"),
    ("dcr", {"redirect_uris": [LOOPBACK_CALLBACK], "client_name": ["x"]}, "client_name must be text"),
    ("dcr", {"redirect_uris": [LOOPBACK_CALLBACK], "client_uri": "http://app.example"}, "client_uri must be"),
    ("dcr", {"redirect_uris": [LOOPBACK_CALLBACK], "client_uri": "javascript:alert(1)"}, "client_uri must be"),
])
def test_unacceptable_metadata_is_refused_with_the_reason(kind, metadata, expected):
    with pytest.raises(ClientRefused, match=expected):
        checked_metadata(metadata, kind=kind)


# --- dynamic registration ----------------------------------------------------------------------


class Clock:
    """A clock the memory records read, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class CountingRecords(MemoryOAuthRecords):
    """Memory records that count reads, to see a lookup was not made."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        self.gets = 0

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        self.gets += 1
        return super().get(kind, key)


def test_a_public_client_gets_no_secret():
    records = CountingRecords()
    client, secret = RegisteredClients(records, ttl=3600).register(
        {"redirect_uris": [LOOPBACK_CALLBACK], "token_endpoint_auth_method": "none",
         "grant_types": ["authorization_code", "refresh_token"]})
    assert secret is None and client.secret_digest is None
    assert client.client_id.startswith("dcr_") and client.kind == "dcr"
    assert client.check_client_secret("") is False
    assert client.check_endpoint_auth_method("none", "token") is True
    assert client.check_grant_type("refresh_token") is True


@pytest.mark.parametrize("method", [None, "client_secret_basic", "client_secret_post"])
def test_a_confidential_client_gets_a_secret_kept_only_as_its_digest(method):
    records = CountingRecords()
    registered = RegisteredClients(records, ttl=3600)
    metadata = {"redirect_uris": [LOOPBACK_CALLBACK], **({"token_endpoint_auth_method": method} if method else {})}
    client, secret = registered.register(metadata)
    assert secret is not None and len(secret) >= 32
    assert client.token_endpoint_auth_method == (method or "client_secret_basic")
    kept = records.get("client", client.client_id)
    assert kept["secret_digest"] == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in json.dumps(kept)
    found = registered.find(client.client_id)
    assert found == client
    assert found.check_client_secret(secret) is True
    assert found.check_client_secret(secret + "x") is False and found.check_client_secret("") is False


def test_each_registration_is_its_own_client():
    registered = RegisteredClients(CountingRecords(), ttl=3600)
    first, first_secret = registered.register({"redirect_uris": [LOOPBACK_CALLBACK]})
    second, second_secret = registered.register({"redirect_uris": [LOOPBACK_CALLBACK]})
    assert first.client_id != second.client_id and first_secret != second_secret
    assert registered.find(first.client_id).check_client_secret(second_secret) is False


def test_registration_refuses_what_checked_metadata_refuses():
    records = CountingRecords()
    with pytest.raises(ClientRefused, match="fragment"):
        RegisteredClients(records, ttl=3600).register({"redirect_uris": ["https://app.example/cb#x"]})
    assert records.keys("client") == []


def test_ids_that_are_not_ours_are_not_looked_up():
    records = CountingRecords()
    registered = RegisteredClients(records, ttl=3600)
    assert registered.find("dcr_unknown") is None and records.gets == 1
    assert registered.find("another-server-client") is None
    assert registered.find("dcr_" + "x" * 61) is None
    assert records.gets == 1


def test_a_registration_lives_its_ttl_and_renew_extends_it():
    clock = Clock()
    registered = RegisteredClients(CountingRecords(clock), ttl=100)
    client, _ = registered.register({"redirect_uris": [LOOPBACK_CALLBACK]})
    clock.now += 60
    registered.renew(client.client_id)
    clock.now += 60  # 120 s after registering, 60 after the renewal
    assert registered.find(client.client_id) == client
    clock.now += 41
    assert registered.find(client.client_id) is None


def test_a_client_survives_its_record():
    client = GatewayClient("https://app.example/client.json", ("http://127.0.0.1/cb",), "cimd", "App",
                           client_uri="https://app.example")
    assert GatewayClient.from_record(json.loads(json.dumps(client.record()))) == client
    assert client.verified_domain == "app.example"
    assert GatewayClient("dcr_x", ("http://127.0.0.1/cb",), "dcr").verified_domain is None


# --- CIMD: the URL and the SSRF guard (an injected resolver, nothing fetched) -------------------


class Resolver:
    """socket.getaddrinfo's shape, answering ``answers[host]``; records what it was asked."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def __call__(self, host: str, port: int, type: int = 0) -> list[tuple]:  # noqa: A002 - getaddrinfo's name
        self.asked.append(host)
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))
                for address in self.answers[host]]


@pytest.mark.parametrize("address", [
    "10.0.0.1", "172.16.5.4", "192.168.1.1",  # private
    "127.0.0.1", "127.8.8.8", "::1",  # loopback
    "169.254.169.254", "fe80::1",  # link-local (a cloud's metadata service)
    "::ffff:127.0.0.1", "::ffff:10.0.0.1",  # IPv4-mapped IPv6
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "224.0.0.1", "ff02::1",  # multicast
    "0.0.0.0", "100.64.0.1", "fd00::1", "240.0.0.1",  # unspecified, shared, unique local, reserved
])
def test_a_document_on_a_non_global_address_is_refused_before_connecting(address):
    resolver = Resolver({"client.example": [address]})
    cimd = CimdClients(CimdConfig(), resolve=resolver)
    with pytest.raises(CimdUnavailable, match="private, loopback or link-local"):
        cimd.find("https://client.example/client.json")
    assert resolver.asked == ["client.example"] and cimd.fetches == 0


def test_one_non_global_answer_among_global_ones_is_refused():
    # A name answering a public and a private address could be connected to either.
    cimd = CimdClients(CimdConfig(), resolve=Resolver({"client.example": ["93.184.216.34", "10.0.0.1"]}))
    with pytest.raises(CimdUnavailable, match="private, loopback or link-local"):
        cimd.find("https://client.example/client.json")


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "::ffff:93.184.216.34"])
def test_global_addresses_pass_the_guard(address):
    assert address_allowed(address) is True


def test_allowed_hosts_of_another_host_or_port_do_not_open_the_guard():
    resolver = Resolver({"client.example": ["127.0.0.1"]})
    cimd = CimdClients(CimdConfig(allowed_hosts=("other.example", "client.example:8443")), resolve=resolver)
    with pytest.raises(CimdUnavailable, match="private, loopback or link-local"):
        cimd.find("https://client.example/client.json")  # port 443


def test_a_host_that_does_not_resolve_is_refused():
    cimd = CimdClients(CimdConfig(), resolve=Resolver({"empty.example": []}))
    for host in ("nowhere.example", "empty.example"):
        with pytest.raises(CimdUnavailable, match="does not resolve"):
            cimd.find(f"https://{host}/client.json")


@pytest.mark.parametrize("url", [
    "http://client.example/client.json",
    "https://client.example",
    "https://client.example/",
    "https://user:pass@client.example/client.json",
    "https://user@client.example/client.json",
    "https://client.example/client.json#me",
    "https://client.example/client.json#",
    "https://client.example/./client.json",
    "https://client.example/a/../client.json",
    "https://client.example/a/%2e%2e/client.json",
    "https://client.example:99999/client.json",
    "https:///client.json",
    "https://client.example/" + "x" * 2000,
])
def test_a_client_id_url_that_is_not_a_plain_https_url_with_a_path_is_refused_before_resolving(url):
    resolver = Resolver({"client.example": ["93.184.216.34"]})
    with pytest.raises(CimdUnavailable, match="client_id"):
        CimdClients(CimdConfig(), resolve=resolver).find(url)
    assert resolver.asked == []


def test_with_cimd_disabled_nothing_is_resolved():
    resolver = Resolver({"client.example": ["93.184.216.34"]})
    with pytest.raises(CimdUnavailable, match="does not accept client ID metadata documents"):
        CimdClients(CimdConfig(enabled=False), resolve=resolver).find("https://client.example/client.json")
    assert resolver.asked == []


def test_only_https_client_ids_are_documents():
    assert CimdClients.is_cimd_id("https://app.example/client.json") is True
    assert CimdClients.is_cimd_id("dcr_abc") is False and CimdClients.is_cimd_id("http://app.example/c") is False


# --- CIMD: real fetches from a loopback HTTPS server ------------------------------------------------


Answer = Callable[["_Handler"], None]


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        owner: DocumentServer = self.server.owner  # type: ignore[attr-defined]
        path = urlsplit(self.path).path
        owner.requests.append((path, dict(self.headers.items())))
        answer = owner.routes.get(path)
        if answer is None:
            self.send(404, b"not found")
        else:
            answer(self)

    def send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", "Content-Length": str(len(body)),
                            **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up on a held or dripping answer


class DocumentServer:
    """HTTPS on 127.0.0.1 with a certificate a trustme CA issued for ``names``; ``routes``
    maps a path to what it answers, ``requests`` lists (path, headers) as they came."""

    def __init__(self, ca: trustme.CA, names: tuple[str, ...] = ("127.0.0.1", "localhost", "docs.internal")):
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert(*names).configure_cert(context)
        self.routes: dict[str, Answer] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.release = threading.Event()  # set at close: held and dripping answers end
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._httpd.owner = self  # type: ignore[attr-defined]
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="cimd-document-server", daemon=True)
        self._thread.start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"https://{host}:{self.port}{path}"

    def asked_for(self, path: str) -> int:
        return sum(1 for asked, _ in self.requests if asked == path)

    def close(self) -> None:
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def document(url: str, **extra: Any) -> dict[str, Any]:
    return {"client_id": url, "client_name": "Test client", "redirect_uris": [LOOPBACK_CALLBACK],
            "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
            "token_endpoint_auth_method": "none", **extra}


def serves(body: bytes | dict, status: int = 200, headers: dict[str, str] | None = None) -> Answer:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    return lambda handler: handler.send(status, data, headers)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def ca_file(ca, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("cimd") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture(scope="module")
def server(ca):
    served = DocumentServer(ca)
    yield served
    served.close()


@pytest.fixture
def cimd(ca_file) -> CimdClients:
    return CimdClients(CimdConfig(allowed_hosts=("127.0.0.1",), ca_bundle=ca_file))


def published(server: DocumentServer, path: str, **extra: Any) -> str:
    """The URL of a valid document served at ``path``."""
    url = server.url(path)
    server.routes[path] = serves(document(url, **extra))
    return url


def test_a_document_from_an_allowed_loopback_host_is_the_client(server, cimd):
    url = published(server, "/used.json", client_name="Editor", client_uri="https://editor.example")
    client = cimd.find(url)
    assert (client.client_id, client.kind, client.client_name) == (url, "cimd", "Editor")
    assert client.redirect_uris == (LOOPBACK_CALLBACK,) and client.verified_domain == "127.0.0.1"
    assert client.token_endpoint_auth_method == "none" and client.check_grant_type("refresh_token")
    assert client.check_redirect_uri("http://127.0.0.1:40123/callback")  # a native app's port of the moment
    headers = dict(server.requests[-1][1])
    assert headers["Host"] == f"127.0.0.1:{server.port}" and headers["Accept"] == "application/json"


def test_allowed_hosts_may_name_the_host_and_port(server, ca_file):
    url = published(server, "/host-port.json")
    cimd = CimdClients(CimdConfig(allowed_hosts=(f"127.0.0.1:{server.port}",), ca_bundle=ca_file))
    assert cimd.find(url).client_id == url


def test_a_name_allowed_to_resolve_to_loopback_is_fetched_with_its_name_checked(server, ca_file):
    resolver = Resolver({"docs.internal": ["127.0.0.1"], "evil.internal": ["127.0.0.1"]})
    cimd = CimdClients(CimdConfig(allowed_hosts=("docs.internal", "evil.internal"), ca_bundle=ca_file),
                       resolve=resolver)
    url = server.url("/named.json", host="docs.internal")
    server.routes["/named.json"] = serves(document(url))
    assert cimd.find(url).verified_domain == "docs.internal"
    assert server.requests[-1][1]["Host"] == f"docs.internal:{server.port}"
    # The certificate does not name evil.internal: the address alone is not enough.
    evil = server.url("/named.json", host="evil.internal")
    with pytest.raises(CimdUnavailable, match="could not be fetched"):
        cimd.find(evil)


def test_a_certificate_from_a_ca_not_trusted_is_refused(server):
    url = published(server, "/untrusted.json")
    with pytest.raises(CimdUnavailable, match="could not be fetched"):
        CimdClients(CimdConfig(allowed_hosts=("127.0.0.1",))).find(url)
    assert server.asked_for("/untrusted.json") == 0


def test_the_ca_bundle_adds_to_the_usual_cas(ca_file):
    # caBundle is the operator's extra CAs: documents on public hosts still verify beside it.
    context = _clients._tls_context(ca_file, deadline=0.0)
    subjects = [dict(part[0] for part in cert["subject"]) for cert in context.get_ca_certs()]
    assert any("trustme" in subject.get("organizationName", "") for subject in subjects)
    assert len(subjects) > 10


def test_a_document_naming_another_client_id_is_refused(server, cimd):
    server.routes["/impostor.json"] = serves(document("https://app.example/client.json"))
    with pytest.raises(CimdUnavailable, match="client_id is not its own URL"):
        cimd.find(server.url("/impostor.json"))


@pytest.mark.parametrize(("body", "expected"), [
    (b"<html>not json</html>", "is not JSON"),
    (b"[" * 16000, "is not JSON"),  # nests deeper than json decodes: refused, not a RecursionError
    (b'["a list"]', "client_id is not its own URL"),
])
def test_a_body_that_is_not_a_json_object_is_refused(server, cimd, body, expected):
    server.routes["/odd.json"] = serves(body)
    with pytest.raises(CimdUnavailable, match=expected):
        cimd.find(server.url("/odd.json"))


def test_a_document_with_unacceptable_metadata_is_refused_with_the_reason(server, cimd):
    url = server.url("/confidential.json")
    server.routes["/confidential.json"] = serves(document(url, token_endpoint_auth_method="client_secret_basic"))
    with pytest.raises(CimdUnavailable, match="token_endpoint_auth_method must be one of none"):
        cimd.find(url)


def test_a_document_of_16_kib_is_read_and_a_larger_one_refused(server, cimd):
    at_limit, too_large = server.url("/at-limit.json"), server.url("/too-large.json")
    for url, size in ((at_limit, CIMD_MAX_BYTES), (too_large, CIMD_MAX_BYTES + 1)):
        body = document(url, padding="")
        body["padding"] = "x" * (size - len(json.dumps(body)))
        assert len(json.dumps(body)) == size
        server.routes[urlsplit(url).path] = serves(body)
    assert cimd.find(at_limit).client_id == at_limit
    with pytest.raises(CimdUnavailable, match="larger than 16384 bytes"):
        cimd.find(too_large)


@pytest.mark.parametrize("status", [404, 500, 204])
def test_an_answer_other_than_200_is_refused(server, cimd, status):
    url = server.url(f"/status-{status}.json")
    server.routes[f"/status-{status}.json"] = serves(document(url), status=status)
    with pytest.raises(CimdUnavailable, match=f"answered HTTP {status}"):
        cimd.find(url)


def test_a_redirect_is_not_followed(server, cimd):
    target = published(server, "/target.json")
    server.routes["/moved.json"] = serves(b"", status=302, headers={"Location": target})
    with pytest.raises(CimdUnavailable, match="answered HTTP 302"):
        cimd.find(server.url("/moved.json"))
    assert server.asked_for("/target.json") == 0


def test_cache_control_max_age_is_kept_to(server, cimd):
    url = server.url("/cached.json")
    server.routes["/cached.json"] = serves(document(url), headers={"Cache-Control": "public, max-age=600"})
    first = cimd.find(url)
    assert cimd.find(url) is first
    assert cimd.fetches == 1 and server.asked_for("/cached.json") == 1


@pytest.mark.parametrize("cache_control", ["no-store", "no-cache", "max-age=0"])
def test_a_document_that_may_not_be_kept_is_fetched_each_time(server, cimd, cache_control):
    path = f"/uncached-{cache_control}.json"
    url = server.url(path)
    server.routes[path] = serves(document(url), headers={"Cache-Control": cache_control})
    cimd.find(url)
    cimd.find(url)
    assert cimd.fetches == 2 and server.asked_for(path) == 2


def test_a_cached_document_is_fetched_again_once_its_max_age_is_over(server, cimd):
    url = server.url("/short.json")
    server.routes["/short.json"] = serves(document(url), headers={"Cache-Control": "max-age=1"})
    cimd.find(url)
    assert cimd.fetches == 1
    assert wait_until(lambda: cimd.find(url) and cimd.fetches == 2, timeout=10)  # the max-age is the behaviour


def held(server: DocumentServer, url: str) -> Answer:
    """Answers only once the server closes (or after HOLD): longer than any fetch may wait."""
    def answer(handler: _Handler) -> None:
        server.release.wait(HOLD)
        handler.send(200, json.dumps(document(url)).encode())
    return answer


def dripped(server: DocumentServer, url: str, *, headers_too: bool) -> Answer:
    """A valid document one byte at a time (from the status line on, or after the headers):
    each read is quick, the whole takes seconds."""
    def answer(handler: _Handler) -> None:
        body = json.dumps(document(url, padding="x" * 200)).encode()
        head = (f"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"X-Filler: {'y' * 100}\r\n\r\n").encode()
        handler.wfile.write(b"" if headers_too else head)
        handler.wfile.flush()
        for byte in (head + body if headers_too else body):
            if server.release.wait(DRIP_INTERVAL):
                return
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
    return answer


def test_a_server_that_does_not_answer_in_time_is_refused(server, cimd, monkeypatch):
    monkeypatch.setattr(_clients, "CIMD_TIMEOUT", 0.5)
    url = server.url("/held.json")
    server.routes["/held.json"] = held(server, url)
    with pytest.raises(CimdUnavailable, match="could not be fetched"):
        cimd.find(url)
    assert server.asked_for("/held.json") == 1


@pytest.mark.parametrize("headers_too", [False, True], ids=["body", "headers"])
def test_a_server_sending_a_byte_at_a_time_is_cut_off_at_the_time_cap(server, cimd, monkeypatch, headers_too):
    # Each byte comes well within a read timeout; the whole takes over 20 s against a 0.5 s cap.
    monkeypatch.setattr(_clients, "CIMD_TIMEOUT", 0.5)
    path = f"/dripped-{headers_too}.json"
    url = server.url(path)
    server.routes[path] = dripped(server, url, headers_too=headers_too)
    with pytest.raises(CimdUnavailable, match="could not be fetched"):
        cimd.find(url)


def test_a_refused_document_is_not_fetched_again_for_a_while(server, cimd):
    url = server.url("/refused-once.json")
    server.routes["/refused-once.json"] = serves({"client_id": "https://elsewhere.example/c.json"})
    for _ in range(3):  # a client retrying a bad id costs one fetch, not three
        with pytest.raises(CimdUnavailable, match="not its own URL"):
            cimd.find(url)
    assert server.asked_for("/refused-once.json") == 1


def test_fetches_under_way_at_once_are_bounded(server, cimd, monkeypatch):
    monkeypatch.setattr(_clients, "CIMD_TIMEOUT", 5.0)
    url = server.url("/slow-for-all.json")
    server.routes["/slow-for-all.json"] = held(server, url)
    for _ in range(_clients.CIMD_CONCURRENT_FETCHES):  # every place taken, as a flood of slow ids would
        assert cimd._fetching.acquire(blocking=False)
    try:
        with pytest.raises(CimdUnavailable, match="too many"):
            cimd.find(url)
        assert server.asked_for("/slow-for-all.json") == 0
    finally:
        for _ in range(_clients.CIMD_CONCURRENT_FETCHES):
            cimd._fetching.release()


def test_an_address_that_refuses_connections_is_followed_by_the_next_one(server, ca_file):
    # a name answering first an address where nothing listens on the port (as localhost's ::1 may), then one that does
    resolver = Resolver({"localhost": ["127.0.0.2", "127.0.0.1"]})
    cimd = CimdClients(CimdConfig(allowed_hosts=("localhost",), ca_bundle=ca_file), resolve=resolver)
    url = server.url("/second-address.json", host="localhost")
    server.routes["/second-address.json"] = serves(document(url))
    assert cimd.find(url).client_id == url
    assert server.asked_for("/second-address.json") == 1


@pytest.mark.parametrize(("extra", "expected"), [
    ({"client_name": ""}, "has no client_name"),
    ({"client_secret": "s3cret"}, "carries a client secret"),
])
def test_a_document_without_a_name_or_with_a_secret_is_refused(server, cimd, extra, expected):
    path = f"/odd-{sorted(extra)[0]}.json"
    url = server.url(path)
    server.routes[path] = serves(document(url, **extra))
    with pytest.raises(CimdUnavailable, match=expected):
        cimd.find(url)
