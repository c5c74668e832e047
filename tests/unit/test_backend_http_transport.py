"""What McpHttpClient's transport does on real sockets, whichever HTTP library it is built on:
connections kept alive, certificates checked against the CA bundle the environment names,
the environment's proxies (read once, when the client is made; CONNECT tunnels for HTTPS;
NO_PROXY; credentials for the proxy alone), redirects not followed, the headers it sends,
compressed answers decoded.

Servers are tests/scripted_http.py's: the backend a ScriptedServer (HTTPS with a trustme
CA's certificate), the proxy a ForwardingProxy. The machine's proxy and CA variables are
cleared first; each test sets what it needs before the client is made."""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Callable, Iterator

import pytest

from tests.scripted_http import (
    ForwardingProxy,
    LoopbackTls,
    ReceivedRequest,
    ScriptedServer,
    clear_network_env,
    loopback_tls,
)
from vmcp_actors.backends._http import STREAM_OPEN, Abort, McpHttpClient, PostResult
from vmcp_actors.exceptions import BackendHTTPError, BackendProtocolError, BackendUnavailable
from vmcp_actors.protocol import encode_sse_event, wire_bytes

NAME = "alpha"
AUTH = "Bearer sk-transport-SECRET"
SESSION = "sess-transport-1"
VERSION = "2025-11-25"
ACCEPT = "application/json, text/event-stream"
SSE = "text/event-stream"
PROXY_USER, PROXY_PASSWORD = "proxy-user", "proxy-pw-SECRET"
REQUEST = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "echo", "arguments": {}}}
RESULT = {"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "hi"}]}}
NOTE = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "t", "progress": 1}}


@pytest.fixture(autouse=True)
def env(monkeypatch) -> pytest.MonkeyPatch:
    clear_network_env(monkeypatch)
    return monkeypatch


@pytest.fixture
def tls(tmp_path) -> LoopbackTls:
    return loopback_tls(tmp_path)


@pytest.fixture
def backend() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


@pytest.fixture
def tls_backend(tls) -> Iterator[ScriptedServer]:
    with ScriptedServer(tls=tls.server) as server:
        yield server


@pytest.fixture
def proxy() -> Iterator[ForwardingProxy]:
    with ForwardingProxy() as served:
        yield served


@pytest.fixture
def connect() -> Iterator[Callable[..., McpHttpClient]]:
    """Factory: a client made now (reading the environment as it is), closed after the test."""
    clients: list[McpHttpClient] = []

    def make(url: str, **kwargs) -> McpHttpClient:
        clients.append(McpHttpClient(NAME, url, **kwargs))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def post(client: McpHttpClient, message: dict = REQUEST, **kwargs) -> PostResult:
    kwargs.setdefault("session_id", None)
    kwargs.setdefault("protocol_version", VERSION)
    kwargs.setdefault("timeout", 5.0)
    return client.post(message, **kwargs)


def _answer_by_kind(request: ReceivedRequest):
    """A notification gets 202, a request a JSON answer or (odd ids) an event stream."""
    message = request.json()
    if "id" not in message:
        return 202, {}, b""
    answer = {"jsonrpc": "2.0", "id": message["id"], "result": {}}
    if message["id"] % 2:
        return 200, {"Content-Type": SSE}, [encode_sse_event(NOTE), encode_sse_event(answer)]
    return 200, {"Content-Type": "application/json"}, json.dumps(answer)


# -- 1. keep-alive -------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_sequential_posts_share_one_kept_alive_connection(scheme, request, env, tls, connect):
    server = request.getfixturevalue("tls_backend" if scheme == "https" else "backend")
    env.setenv("REQUESTS_CA_BUNDLE", str(tls.ca_file))
    server.add_callback("POST", "/mcp", _answer_by_kind)
    client = connect(server.url())
    for i in range(20):  # JSON answers, event streams and 202s in turn
        if i % 5 == 4:
            assert post(client, {"jsonrpc": "2.0", "method": "notifications/progress"}).status == 202
        else:
            assert post(client, {"jsonrpc": "2.0", "id": i, "method": "ping"}).message == {
                "jsonrpc": "2.0", "id": i, "result": {}}
    assert len(server.calls) == 20
    assert server.connections == 1


# -- 2. TLS --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variable", ["REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"])
def test_an_https_backend_is_verified_against_the_ca_bundle_the_environment_names(variable, env, tls, tls_backend,
                                                                                   connect):
    env.setenv(variable, str(tls.ca_file))
    tls_backend.post(json=RESULT)
    assert post(connect(tls_backend.url())).message == RESULT
    assert [call.path for call in tls_backend.calls] == ["/mcp"]


def test_an_https_backend_whose_ca_is_not_trusted_is_unavailable(tls_backend, connect):
    tls_backend.post(json=RESULT)
    with pytest.raises(BackendUnavailable) as info:  # the default CAs know nothing of the test CA
        post(connect(tls_backend.url()))
    # Unreachable (the circuit counts it as a failure), and the message says why: an operator's fix.
    assert type(info.value) is BackendUnavailable
    assert str(info.value) == f"backend {NAME!r} is unreachable: its TLS certificate is not trusted"
    assert tls_backend.calls == []


def test_requests_ca_bundle_is_read_before_curl_ca_bundle(env, tls, tmp_path, tls_backend, connect):
    other = tmp_path / "other"
    other.mkdir()
    env.setenv("REQUESTS_CA_BUNDLE", str(loopback_tls(other).ca_file))  # another CA's: not the backend's
    env.setenv("CURL_CA_BUNDLE", str(tls.ca_file))
    tls_backend.post(json=RESULT)
    with pytest.raises(BackendUnavailable):
        post(connect(tls_backend.url()))
    assert tls_backend.calls == []


def test_the_ca_bundle_is_read_once_when_the_client_is_made(env, tls, tls_backend, connect):
    tls_backend.post(json=RESULT)
    env.setenv("REQUESTS_CA_BUNDLE", str(tls.ca_file))
    trusting = connect(tls_backend.url())
    env.delenv("REQUESTS_CA_BUNDLE")
    untrusting = connect(tls_backend.url())
    env.setenv("REQUESTS_CA_BUNDLE", str(tls.ca_file))  # too late for it
    with pytest.raises(BackendUnavailable):
        post(untrusting)
    env.delenv("REQUESTS_CA_BUNDLE")  # too late to matter
    assert post(trusting).message == RESULT


# -- 3. proxies ----------------------------------------------------------------------------------


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy", "ALL_PROXY"])
def test_a_plain_http_backend_is_reached_through_the_proxy_the_environment_names(variable, env, proxy, backend,
                                                                                 connect):
    env.setenv(variable, proxy.url())
    backend.post(json=RESULT)
    assert post(connect(backend.url())).message == RESULT
    assert proxy.targets() == [("POST", backend.url())]  # absolute form: the proxy is asked for the URL
    assert [call.path for call in backend.calls] == ["/mcp"]  # and it sent the request on


@pytest.mark.parametrize("trusted", [True, False])
def test_an_https_backend_is_reached_through_a_connect_tunnel_and_its_certificate_still_checked(
        trusted, env, tls, proxy, tls_backend, connect):
    env.setenv("HTTPS_PROXY", proxy.url())
    if trusted:
        env.setenv("REQUESTS_CA_BUNDLE", str(tls.ca_file))
    tls_backend.post(json=RESULT)
    client = connect(tls_backend.url())
    if trusted:
        assert post(client).message == RESULT
        assert [call.path for call in tls_backend.calls] == ["/mcp"]
    else:
        with pytest.raises(BackendUnavailable):
            post(client)
        assert tls_backend.calls == []
    assert proxy.targets() == [("CONNECT", f"127.0.0.1:{tls_backend.port}")]


@pytest.mark.parametrize("variable", ["NO_PROXY", "no_proxy"])
def test_no_proxy_naming_the_backends_host_bypasses_the_proxy(variable, env, proxy, backend, connect):
    env.setenv("HTTP_PROXY", proxy.url())
    env.setenv(variable, "localhost,127.0.0.1")
    backend.post(json=RESULT)
    assert post(connect(backend.url())).message == RESULT
    assert proxy.connections == 0
    assert len(backend.calls) == 1


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_proxy_credentials_reach_the_proxy_only(scheme, request, env, tls, proxy, connect):
    server = request.getfixturevalue("tls_backend" if scheme == "https" else "backend")
    env.setenv(f"{scheme.upper()}_PROXY", proxy.url(f"{PROXY_USER}:{PROXY_PASSWORD}"))
    env.setenv("REQUESTS_CA_BUNDLE", str(tls.ca_file))
    server.post(json=RESULT)
    assert post(connect(server.url(), headers={"Authorization": AUTH})).message == RESULT
    credentials = base64.b64encode(f"{PROXY_USER}:{PROXY_PASSWORD}".encode()).decode()
    (asked,) = proxy.seen
    assert asked.method == ("CONNECT" if scheme == "https" else "POST")
    assert asked.headers.get_all("Proxy-Authorization") == [f"Basic {credentials}"]
    (sent,) = server.calls  # through the tunnel (https), or as the proxy sent it on (http)
    assert sent.headers.get_all("Authorization") == [AUTH]
    assert "Proxy-Authorization" not in sent.headers
    for value in sent.headers.values():
        assert credentials not in value and PROXY_PASSWORD not in value


def test_the_proxy_is_read_once_when_the_client_is_made(env, proxy, backend, connect):
    backend.post(json=RESULT)
    env.setenv("HTTP_PROXY", proxy.url())
    proxied = connect(backend.url())
    env.delenv("HTTP_PROXY")
    direct = connect(backend.url())

    env.setenv("HTTP_PROXY", proxy.url())  # named after `direct` was made
    assert post(direct).message == RESULT
    assert proxy.seen == [] and len(backend.calls) == 1

    env.delenv("HTTP_PROXY")  # gone after `proxied` was made
    assert post(proxied).message == RESULT
    assert proxy.targets() == [("POST", backend.url())] and len(backend.calls) == 2


# -- 4. redirects --------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_not_followed_and_nothing_reaches_where_it_points(status, backend, connect):
    with ScriptedServer() as elsewhere:
        elsewhere.post(json=RESULT)
        elsewhere.get(json=RESULT)
        backend.post(status=status, headers={"Location": elsewhere.url()})
        client = connect(backend.url(), headers={"Authorization": AUTH})
        with pytest.raises(BackendHTTPError) as info:
            post(client, session_id=SESSION)
        assert info.value.status == status
        assert len(backend.calls) == 1
        assert elsewhere.connections == 0 and elsewhere.calls == []


# -- 5. headers and encodings ----------------------------------------------------------------------


def _only(sent: ReceivedRequest, expected: dict[str, str]) -> None:
    for name, value in expected.items():
        assert sent.headers.get_all(name) == [value], (name, sent.headers.get_all(name))


STATIC = {"Authorization": AUTH, "X-Tenant": "tenant-1"}


def test_a_post_carries_the_static_and_transport_headers(backend, connect):
    backend.post("/mcp?tenant=1", json=RESULT)
    client = connect(backend.url("/mcp?tenant=1"), headers=STATIC)
    post(client, session_id=SESSION, extra_headers={"X-Extra": "extra-1"})
    (sent,) = backend.calls
    assert (sent.method, sent.path) == ("POST", "/mcp?tenant=1")
    _only(sent, {**STATIC, "X-Extra": "extra-1", "Accept": ACCEPT, "Content-Type": "application/json",
                 "Mcp-Session-Id": SESSION, "MCP-Protocol-Version": VERSION, "Host": f"127.0.0.1:{backend.port}",
                 "Content-Length": str(len(sent.body))})
    assert sent.body == wire_bytes(REQUEST)


def test_a_stream_get_and_a_session_delete_carry_the_static_and_transport_headers(backend, connect):
    backend.get(body=encode_sse_event(NOTE), content_type=SSE)
    backend.delete(status=200)
    client = connect(backend.url(), headers=STATIC)
    listened = list(client.listen(session_id=SESSION, protocol_version=VERSION, abort=Abort(), connect_timeout=5))
    assert listened == [STREAM_OPEN, NOTE]
    client.delete_session(SESSION, protocol_version=VERSION, timeout=5)
    stream, deleted = backend.calls
    assert (stream.method, deleted.method) == ("GET", "DELETE")
    _only(stream, {**STATIC, "Accept": SSE, "Mcp-Session-Id": SESSION, "MCP-Protocol-Version": VERSION})
    _only(deleted, {**STATIC, "Accept": ACCEPT, "Mcp-Session-Id": SESSION, "MCP-Protocol-Version": VERSION})
    assert "Content-Type" not in stream.headers and "Content-Type" not in deleted.headers
    assert stream.body == deleted.body == b""


@pytest.mark.parametrize("kind", ["json", "event stream"])
def test_a_gzip_encoded_answer_is_decoded(kind, backend, connect):
    if kind == "json":
        backend.post(body=gzip.compress(json.dumps(RESULT).encode()), content_type="application/json",
                     headers={"Content-Encoding": "gzip"})
    else:
        compressed = gzip.compress((encode_sse_event(NOTE) + encode_sse_event(RESULT)).encode())
        half = len(compressed) // 2
        backend.post(chunks=[compressed[:half], compressed[half:]], content_type=SSE,
                     headers={"Content-Encoding": "gzip"})
    seen: list[dict] = []
    assert post(connect(backend.url()), on_notification=seen.append).message == RESULT
    assert seen == ([NOTE] if kind == "event stream" else [])
    # A backend compresses what the client says it can decode.
    assert "gzip" in backend.calls[0].headers["Accept-Encoding"]


def test_a_body_that_does_not_decode_is_a_protocol_error(backend, connect):
    backend.post(body=b"not gzip at all", content_type="application/json", headers={"Content-Encoding": "gzip"})
    with pytest.raises(BackendProtocolError, match="cannot be decoded"):
        post(connect(backend.url()))
