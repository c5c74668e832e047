"""A 2024-11-05 SSE backend is reached as a streamable HTTP one is (issue 35): through the
environment's CA bundle and proxies, behind the backend's circuit breaker, and within the
configured timeout rather than fixed ones.

The transport server here is a plain ``http.server`` (TLS, a proxy's absolute-form
requests, stalls and 5xx on demand); the SDK's own SSE server from tests/sse_servers.py
serves what needs real MCP answers.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vmcp_actors.backends import BackendChannel, CircuitBreaker, CircuitOpen
from vmcp_actors.backends._sse import LegacySseClient
from vmcp_actors.config import BackendConfig, CircuitBreakerConfig, TimeoutsConfig
from vmcp_actors.exceptions import BackendHTTPError, BackendTimeout
from vmcp_actors.users._actor import backend_client
from tests.sse_servers import SseBackend

NAME = "old"
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
              "no_proxy")
# Far below the 30 s POST and 10 s connect timeouts the client once had, far above a loopback exchange.
CONFIGURED_TIMEOUT = 0.5
WIDE_MARGIN = 8.0


# -- a bare HTTP+SSE transport server ----------------------------------------------------------


class _TransportHandler(BaseHTTPRequestHandler):
    """GET: an event stream naming ``/messages`` as its endpoint, held open; POST: 202."""

    server: _TransportServer
    # Chunked streams, as SSE servers send them (a close-delimited HTTP/1.0 one leaves
    # requests no socket to shut down: closing the link would wait for its read timeout).
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.seen.append(f"GET {self.path}")
        if self.server.stall_streams:
            self._stall()
            return
        if self.server.stream_status != 200:
            self.send_response(self.server.stream_status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        event = b"event: endpoint\ndata: /messages\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.wfile.flush()
        self._stall()  # the stream stays open until the test ends

    def do_POST(self) -> None:
        self.server.seen.append(f"POST {self.path}")
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.server.stall_posts:
            self._stall()
            return
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _stall(self) -> None:
        self.server.released.wait()
        self.close_connection = True


class _TransportServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _TransportHandler)
        self.seen: list[str] = []  # "METHOD request-target", in order
        self.released = threading.Event()  # set at teardown: every held stream or stalled request ends
        self.stream_status = 200
        self.stall_streams = False
        self.stall_posts = False

    @property
    def base(self) -> str:
        return f"127.0.0.1:{self.server_port}"


@pytest.fixture
def transport() -> Iterator[_TransportServer]:
    server = _TransportServer()
    yield from _serving(server)


def _serving(server: _TransportServer) -> Iterator[_TransportServer]:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.released.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def no_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*PROXY_VARS, "CURL_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)


def notify(client: LegacySseClient, timeout: float = 5.0) -> int:
    """A notification: the link opens (GET, endpoint) and it is POSTed. The HTTP status."""
    return client.post({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}, session_id=None,
                       protocol_version=None, timeout=timeout).status


def ask(client: LegacySseClient, method: str, timeout: float = 5.0) -> dict[str, Any]:
    exchange = client.exchange({"jsonrpc": "2.0", "id": 7, "method": method}, session_id=None,
                               protocol_version=None, timeout=timeout)
    try:
        while True:
            next(exchange)
    except StopIteration as answered:
        return answered.value


# -- 1. the environment's CA bundle and proxies --------------------------------------------------


def _issue_ca_and_server_cert(directory: Path) -> tuple[Path, ssl.SSLContext]:
    """A throwaway CA (its PEM file) and a server context with a certificate it issued for 127.0.0.1."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vmcp-actors test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(hours=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_file, cert_file, key_file = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return ca_file, context


def test_an_https_sse_backend_is_verified_against_the_ca_bundle_the_environment_names(
        tmp_path, monkeypatch, no_proxy_settings):
    ca_file, context = _issue_ca_and_server_cert(tmp_path)
    server = _TransportServer()
    server.socket = context.wrap_socket(server.socket, server_side=True)
    for tls_server in _serving(server):
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca_file))
        client = LegacySseClient(NAME, f"https://{tls_server.base}/sse")
        try:
            assert notify(client) == 202
        finally:
            client.close()
        assert tls_server.seen == ["GET /sse", "POST /messages"]


def test_an_sse_backend_is_reached_through_the_proxy_the_environment_names(transport, monkeypatch, no_proxy_settings):
    monkeypatch.setenv("HTTP_PROXY", f"http://{transport.base}")  # the transport server plays the proxy
    client = LegacySseClient(NAME, "http://sse-backend.invalid/sse")
    try:
        assert notify(client) == 202
    finally:
        client.close()
    # A proxy is asked for absolute URLs: both the stream's GET and the message's POST went through it.
    assert transport.seen == ["GET http://sse-backend.invalid/sse", "POST http://sse-backend.invalid/messages"]


# -- 2. the backend's circuit breaker -------------------------------------------------------------


def _breaker(threshold: int = 2) -> CircuitBreaker:
    return CircuitBreaker(NAME, CircuitBreakerConfig(True, failure_threshold=threshold, timeout=60))


def test_after_failed_stream_gets_the_next_users_call_fails_fast_without_reaching_the_backend(transport):
    transport.stream_status = 503
    breaker = _breaker(threshold=2)
    backend = BackendConfig(NAME, url=f"http://{transport.base}/sse", transport="sse")
    for _user in range(2):  # each user's channel has a client (and a stream) of its own; the circuit is shared
        client = backend_client(backend, breaker, None, None, None)
        try:
            with pytest.raises(BackendHTTPError) as failed:
                ask(client, "ping")
            assert failed.value.status == 503
        finally:
            client.close()
    assert breaker.state == "open"

    client = backend_client(backend, breaker, None, None, None)
    try:
        with pytest.raises(CircuitOpen, match=f"backend {NAME!r} is unavailable: its circuit is open"):
            ask(client, "ping")
    finally:
        client.close()
    assert transport.seen == ["GET /sse", "GET /sse"]  # the third never went out


def echo_server() -> Any:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(NAME, log_level="WARNING")

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text."""
        return f"echo:{text}"

    return server


@pytest.fixture
def sse_backend() -> Iterator[SseBackend]:
    with SseBackend(echo_server()).start() as backend:
        yield backend


def test_answered_exchanges_close_the_count_and_an_open_circuit_stops_the_next_post(sse_backend):
    breaker = _breaker(threshold=2)
    breaker.failed()  # another user's exchange failed
    client = LegacySseClient(NAME, sse_backend.sse_url, breaker=breaker)
    try:
        BackendChannel(NAME, client, 5.0, prefers_legacy=True).perform_handshake(None)
        assert breaker.failures == 0  # the stream's GET and the POSTs answered: reported as successes
        posted = len(sse_backend.posted())

        breaker.failed()
        breaker.failed()  # other users' exchanges failed: the circuit opens for everyone
        with pytest.raises(CircuitOpen):
            ask(client, "ping")
    finally:
        client.close()
    assert len(sse_backend.posted()) == posted and sse_backend.posted("ping") == []


# -- 3. the configured timeout and the call's deadline ---------------------------------------------


def _handshake_within_the_configured_timeout(url: str) -> tuple[type[BaseException], float]:
    """A 2025 handshake (initialize) by a channel given the backend's configured timeout, as
    the gateway builds it: what it raised and after how long."""
    configured = TimeoutsConfig(default=30.0, per_workload={NAME: CONFIGURED_TIMEOUT}).for_backend(NAME)
    client = LegacySseClient(NAME, url)
    started = time.monotonic()
    try:
        BackendChannel(NAME, client, configured, prefers_legacy=True).perform_handshake(None)
    except Exception as error:  # noqa: BLE001 - the test looks at which
        return type(error), time.monotonic() - started
    finally:
        client.close()
    raise AssertionError("the handshake was answered")


def test_a_stream_get_that_never_answers_ends_with_the_configured_timeout(transport):
    transport.stall_streams = True
    raised, took = _handshake_within_the_configured_timeout(f"http://{transport.base}/sse")
    assert raised is BackendTimeout
    assert took < WIDE_MARGIN, took  # not the fixed 10 s connect timeout
    assert transport.seen == ["GET /sse"]


def test_a_post_that_never_answers_ends_with_the_configured_timeout(transport):
    transport.stall_posts = True
    raised, took = _handshake_within_the_configured_timeout(f"http://{transport.base}/sse")
    assert raised is BackendTimeout
    assert took < WIDE_MARGIN, took  # not the fixed 30 s POST timeout
    assert transport.seen == ["GET /sse", "POST /messages"]
