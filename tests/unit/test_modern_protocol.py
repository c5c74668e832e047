"""MCP 2026-07-28 pieces in isolation: the envelope checks and their order, header value
encoding, sealed values, result shaping both ways, listen streams, the discovery cache
bounded by backends' hints, and the backend era probe (a ScriptedServer on loopback for its
HTTP answers)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from tests.scripted_http import ReceivedRequest, ScriptedServer, clear_network_env
from vmcp_actors.backends import (
    BackendChannel,
    BackendEras,
    DiscoveredBackend,
    Handshake,
    McpHttpClient,
)
from vmcp_actors.backends._channel import ERA_REMEMBERED_FOR
from vmcp_actors.config import config_from_mapping
from vmcp_actors.core._catalog import Catalog, build_catalog
from vmcp_actors.edge._modern import (
    CacheHints,
    complete,
    is_modern_request,
    legacy_result,
    read_modern,
)
from vmcp_actors.exceptions import BackendHTTPError, BackendRpcError
from vmcp_actors.protocol import JsonRpcError, Message
from vmcp_actors.protocol.mcp import (
    ACCEPTED_PROTOCOL_HEADER_VERSIONS,
    decode_header_value,
    encode_header_value,
)
from vmcp_actors.signing import Signer, Unsealable
from vmcp_actors.users._discovery_cache import DiscoveryCache
from vmcp_actors.users._live import ListenStream

MODERN = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
URL = "http://backend.test/mcp"


def request(method: str = "tools/call", params: dict | None = None, meta: dict | None = None) -> Message:
    body = {"name": "echo", "arguments": {}} if params is None else dict(params)
    body["_meta"] = META if meta is None else meta
    return Message("request", method, 1, body)


def headers(**changed: str | None) -> dict[str, str | None]:
    return {"version": MODERN, "method": "tools/call", "name": "echo", **changed}


# -- the envelope ---------------------------------------------------------------------------


def test_a_good_request_reads_its_metadata_and_keeps_its_own_meta():
    meta = {**META, "io.modelcontextprotocol/logLevel": "info", "progressToken": "p",
            "io.modelcontextprotocol/clientInfo": {"name": "c"}}
    read = read_modern(request(meta=meta), headers())
    assert read.version == MODERN and read.log_level == "info" and read.client_info == {"name": "c"}
    assert read.meta == {"progressToken": "p"}
    dispatched = read.params_for_dispatch({"name": "echo", "_meta": meta, "requestState": "s"})
    assert dispatched == {"name": "echo", "_meta": {"progressToken": "p", "io.modelcontextprotocol/logLevel": "info"}}


@pytest.mark.parametrize("message, sent, code", [
    (request(meta={}), headers(), -32602),  # missing envelope comes first
    (request(meta={"io.modelcontextprotocol/protocolVersion": MODERN}), headers(), -32602),
    (request(), headers(version=None), -32020),
    (request(), headers(version="2025-11-25"), -32020),
    (request(), headers(method="tools/list"), -32020),
    (request(), headers(name="other"), -32020),
    (request(), headers(name=None), -32020),
    (request(meta={**META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}),
     headers(version="2099-01-01"), -32022),
    (request(meta={**META, "io.modelcontextprotocol/clientCapabilities": []}), headers(), -32602),
    (request(params={"name": "echo", "inputResponses": []}), headers(), -32602),
    (request("tools/list", params={"requestState": "x"}), headers(method="tools/list", name=None), -32602),
])
def test_bad_envelopes_get_the_specifications_codes_in_its_order(message, sent, code):
    with pytest.raises(JsonRpcError) as refused:
        read_modern(message, sent)
    assert refused.value.code == code
    assert refused.value.http_status == 400


def test_unsupported_version_lists_what_is_supported():
    with pytest.raises(JsonRpcError) as refused:
        read_modern(request(meta={**META, "io.modelcontextprotocol/protocolVersion": "1999-01-01"}),
                    headers(version="1999-01-01"))
    assert refused.value.data == {"supported": [MODERN, "2025-11-25", "2025-06-18"], "requested": "1999-01-01"}


@pytest.mark.parametrize("value", ["echo", "Hello, 世界", " padded ", "line1\nline2", "=?base64?literal?="])
def test_header_values_round_trip_and_unsafe_ones_are_base64(value):
    encoded = encode_header_value(value)
    assert all(0x20 <= ord(c) <= 0x7E for c in encoded)
    assert decode_header_value(encoded) == value
    assert (encoded == value) == (value == "echo")


def test_malformed_base64_header_is_refused():
    assert decode_header_value("=?base64?***?=") is None


def test_which_requests_are_modern():
    legacy = ACCEPTED_PROTOCOL_HEADER_VERSIONS
    assert is_modern_request(MODERN, legacy, None)
    assert is_modern_request(MODERN, legacy, "a-session")  # the session id is ignored
    assert not is_modern_request("2025-11-25", legacy, None)
    assert not is_modern_request(None, legacy, None)
    assert is_modern_request("1999-01-01", legacy, None)  # the modern ladder refuses it
    assert not is_modern_request("1999-01-01", legacy, "a-session")  # a 2025 session's bad header


# -- sealed values --------------------------------------------------------------------------


def test_sealed_values_open_only_with_the_key_purpose_and_in_time():
    signer, other = Signer(b"k" * 32), Signer(b"o" * 32)
    token = signer.seal("requestState", {"b": "alpha", "s": "secret"}, 60)
    assert "alpha" not in token and "secret" not in token
    assert signer.unseal("requestState", token) == {"b": "alpha", "s": "secret"}
    assert Signer(b"k" * 32).unseal("requestState", token)  # another process with the key
    flipped = token[:10] + ("A" if token[10] != "A" else "B") + token[11:]
    for bad, who in ((token, other), (flipped, signer), ("", signer), ("x" * 70_000, signer), (5, signer)):
        with pytest.raises(Unsealable):
            who.unseal("requestState", bad)
    with pytest.raises(Unsealable):
        signer.unseal("session", token)
    with pytest.raises(Unsealable, match="expired"):
        signer.unseal("requestState", signer.seal("requestState", {}, -1))


# -- results both ways ------------------------------------------------------------------------


def test_results_for_modern_clients_carry_result_type_identity_and_cache_hints():
    hints = CacheHints(30_000, "private")
    listed = complete({"tools": []}, "tools/list", "gw", hints)
    assert listed == {"tools": [], "resultType": "complete", "ttlMs": 30_000, "cacheScope": "private",
                      "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "gw", "version": listed["_meta"][
                          "io.modelcontextprotocol/serverInfo"]["version"]}}}
    read = complete({"contents": [], "ttlMs": 5000, "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "b"}}},
                    "resources/read", "gw", hints)
    assert read["ttlMs"] == 5000 and read["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "gw"
    public = CacheHints(30_000, "public")
    private_read = complete({"contents": [], "ttlMs": 5, "cacheScope": "private"}, "resources/read", "gw", public)
    assert private_read["cacheScope"] == "private"  # the backend's answer is for its caller only
    assert complete({"contents": [], "cacheScope": "public"}, "resources/read", "gw", hints)["cacheScope"] == "private"
    # A backend that says nothing (a 2025 one) may answer per session: private, as the SDK assumes.
    assert complete({"contents": []}, "resources/read", "gw", public)["cacheScope"] == "private"
    assert complete({"contents": [], "cacheScope": "public"}, "resources/read", "gw", public)["cacheScope"] == "public"
    called = complete({"content": []}, "tools/call", "gw", hints)
    assert "ttlMs" not in called and called["resultType"] == "complete"
    interim = complete({"resultType": "input_required", "requestState": "s"}, "tools/call", "gw", hints)
    assert "ttlMs" not in interim


def test_results_for_legacy_clients_lose_the_2026_fields():
    result = {"content": [], "resultType": "complete", "ttlMs": 1, "cacheScope": "public",
              "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "b"}, "trace": "t"}}
    assert legacy_result(result) == {"content": [], "_meta": {"trace": "t"}}
    plain = {"content": []}
    assert legacy_result(plain) is plain


# -- listen streams -----------------------------------------------------------------------------


def test_a_listen_stream_acknowledges_filters_tags_and_ends_gracefully():
    stream = ListenStream("listen:1", 7, {"toolsListChanged": True, "resourceSubscriptions": ["a://x"]})
    stream.push({"jsonrpc": "2.0", "method": "notifications/prompts/list_changed"})  # not asked for
    stream.push({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    stream.push({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "a://y"}})
    stream.push({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "a://x"}})
    stream.push({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info"}})
    written = stream.messages(keepalive=0.01)
    messages = [next(written) for _ in range(3)]
    stream.close()  # the gateway ends it
    messages += [m for m in written if m is not None]
    assert [m.get("method", "response") for m in messages] == [
        "notifications/subscriptions/acknowledged", "notifications/tools/list_changed",
        "notifications/resources/updated", "response"]
    assert all(m.get("params", m.get("result", {}))["_meta"]["io.modelcontextprotocol/subscriptionId"] == 7
               for m in messages)
    assert messages[-1] == {"jsonrpc": "2.0", "id": 7, "result": {
        "resultType": "complete", "_meta": {"io.modelcontextprotocol/subscriptionId": 7}}}


def test_a_listen_stream_the_client_left_sends_no_closing_response():
    stream = ListenStream("listen:2", "s", {})
    stream.client_left()
    assert [m for m in stream.messages(keepalive=0.01) if m is not None][-1]["method"].endswith("acknowledged")


# -- the discovery cache and backends' hints ---------------------------------------------------


def _catalog(ttl_ms: int | None) -> Catalog:
    config = config_from_mapping({"name": "t", "backends": [{"name": "a", "url": URL}]})
    found = DiscoveredBackend("a", {"tools": {}}, tools=({"name": "echo", "inputSchema": {"type": "object"}},),
                                ttl_ms=ttl_ms)
    return build_catalog({"a": found}, {}, config.aggregation)


def test_a_backends_ttl_hint_bounds_how_long_its_catalog_is_cached():
    now = [0.0]
    cache = DiscoveryCache(60, clock=lambda: now[0])
    cache.put("long", _catalog(None))
    cache.put("short", _catalog(2000))
    cache.put("never", _catalog(0))
    now[0] = 3.0
    assert cache.get("long") is not None
    assert cache.get("short") is None
    assert cache.get("never") is None


# -- the backend era probe ---------------------------------------------------------------------


@pytest.fixture
def backend(monkeypatch) -> Iterator[ScriptedServer]:
    clear_network_env(monkeypatch)  # the client goes straight to loopback
    with ScriptedServer() as server:
        yield server


@pytest.fixture
def channel(backend) -> Iterator[Callable[..., BackendChannel]]:
    """Factory: a channel to the backend, for a user whose clients take sampling, or (with
    ``prefers_legacy``) one whose 2025 clients take roots; their HTTP clients closed after."""
    clients: list[McpHttpClient] = []

    def make(eras: BackendEras | None = None, prefers_legacy: bool = False) -> BackendChannel:
        clients.append(McpHttpClient("b", backend.url()))
        capabilities = {"roots": {}} if prefers_legacy else {"sampling": {}}
        return BackendChannel("b", clients[-1], 5.0, client_capabilities=capabilities, eras=eras,
                              prefers_legacy=prefers_legacy)

    yield make
    for client in clients:
        client.close()


def _initialize_answers(backend: ScriptedServer) -> None:
    def initialized(request: ReceivedRequest):
        return 200, {"Mcp-Session-Id": "s1", "Content-Type": "application/json"}, json.dumps({
            "jsonrpc": "2.0", "id": request.json()["id"], "result": {
                "protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "old"}}})

    backend.add_callback("POST", "/mcp", initialized)
    backend.post(status=202)


def test_a_modern_backend_answers_discover_and_gets_no_session(backend, channel):
    eras = BackendEras()
    with backend.script():
        backend.post(json={"jsonrpc": "2.0", "id": 1, "result": {
            "resultType": "complete", "supportedVersions": [MODERN], "capabilities": {"tools": {}},
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "new"}}}})
        handshake = channel(eras).perform_handshake(None)
        sent = backend.calls[0]
        body = sent.json()
    assert handshake.session_id is None and handshake.is_modern and handshake.server_info == {"name": "new"}
    assert sent.headers["MCP-Protocol-Version"] == MODERN and sent.headers["Mcp-Method"] == "server/discover"
    assert body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] == {"sampling": {}}
    assert eras.get("b") == "modern"


@pytest.mark.parametrize("refusal", [
    {"status": 400, "json": {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Bad Request"}}},
    {"status": 404, "json": {"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "no"}}},
    {"status": 200, "json": {"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "no"}}},
    {"status": 400, "body": "Bad Request: Missing session ID"},
    {"status": 405, "body": ""},
])
def test_a_legacy_backend_refusing_discover_is_initialized_and_remembered(backend, channel, refusal):
    eras = BackendEras()
    with backend.script():
        backend.post(**refusal)
        _initialize_answers(backend)
        handshake = channel(eras).perform_handshake(None)
        methods = _methods(backend)
    assert handshake.session_id == "s1" and not handshake.is_modern
    assert methods == ["server/discover", "initialize", "notifications/initialized"]
    assert eras.get("b") == "legacy"
    with backend.script():  # remembered: no probe the next time
        _initialize_answers(backend)
        channel(eras).perform_handshake(None)
        assert _methods(backend) == ["initialize", "notifications/initialized"]


def test_a_failing_backend_is_not_taken_for_a_legacy_one(backend, channel):
    eras = BackendEras()
    with backend.script():
        backend.post(status=503)
        with pytest.raises(BackendHTTPError):
            channel(eras).perform_handshake(None)
    assert eras.get("b") is None


def _discovered(request: ReceivedRequest):
    return 200, {"Content-Type": "application/json"}, json.dumps({
        "jsonrpc": "2.0", "id": request.json()["id"], "result": {
            "resultType": "complete", "supportedVersions": [MODERN], "capabilities": {"tools": {}}}})


def _methods(backend: ScriptedServer) -> list[str]:
    return [call.json().get("method") for call in backend.calls]


def test_a_user_whose_2025_clients_take_requests_initializes_first_without_a_probe(backend, channel):
    eras = BackendEras()
    legacy_first = channel(eras, prefers_legacy=True)
    with backend.script():
        _initialize_answers(backend)
        handshake = legacy_first.perform_handshake(None)
        assert _methods(backend) == ["initialize", "notifications/initialized"]
    assert not handshake.is_modern and eras.speaks("b", "legacy") is True and eras.speaks("b", "modern") is None
    assert "takes sampling, elicitation or roots" in legacy_first.era_reason


def test_a_2026_only_backend_refusing_initialize_is_discovered_and_remembered(backend, channel):
    eras = BackendEras()
    refusal = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32022, "message": "Unsupported protocol version",
                                                    "data": {"supported": [MODERN]}}}
    with backend.script():
        backend.post(status=400, json=refusal)
        backend.add_callback("POST", "/mcp", _discovered)
        first = channel(eras, prefers_legacy=True)
        assert first.perform_handshake(None).is_modern
        assert _methods(backend) == ["initialize", "server/discover"]
    assert "refuses initialize" in first.era_reason and eras.speaks("b", "legacy") is False
    with backend.script():  # remembered: straight to server/discover
        backend.add_callback("POST", "/mcp", _discovered)
        channel(eras, prefers_legacy=True).perform_handshake(None)
        assert _methods(backend) == ["server/discover"]


def test_an_initialize_failing_for_another_reason_is_not_taken_for_a_refusal(backend, channel):
    eras = BackendEras()
    legacy_first = channel(eras, prefers_legacy=True)
    with backend.script():
        backend.post(json={"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "boom"}})
        with pytest.raises(BackendRpcError):
            legacy_first.perform_handshake(None)
    assert eras.speaks("b", "legacy") is None


class _SharedLevel:
    """The shared cache's interface (get/put), in memory: what another process would read."""

    def __init__(self) -> None:
        self.entries: dict[str, object] = {}
        self.ttls: list[float] = []

    def get(self, namespace: str, key: object) -> object:
        return self.entries.get(json.dumps([namespace, key]))

    def put(self, namespace: str, key: object, value: object, ttl: float) -> None:
        self.entries[json.dumps([namespace, key])] = json.loads(json.dumps(value))
        self.ttls.append(ttl)


def test_what_a_backend_speaks_is_shared_with_other_processes_and_forgotten_after_a_while():
    shared, now = _SharedLevel(), [0.0]
    urls = {"b": URL}
    learner = BackendEras(shared=shared, urls=urls, clock=lambda: now[0])
    learner.learn("b", "modern", False)
    assert shared.ttls == [ERA_REMEMBERED_FOR]
    other = BackendEras(shared=shared, urls=urls, clock=lambda: now[0])  # a new process
    assert other.speaks("b", "modern") is False and other.get("b") == "legacy"
    assert BackendEras(shared=shared, urls={"b": "http://moved.test/mcp"}).speaks("b", "modern") is None
    now[0] += ERA_REMEMBERED_FOR + 1
    shared.entries.clear()  # Redis expired it too
    assert learner.speaks("b", "modern") is None and learner.get("b") is None


def test_a_pinned_era_is_never_probed(backend, channel):
    with backend.script():
        _initialize_answers(backend)
        channel(BackendEras({"b": "legacy"})).perform_handshake(None)
        assert backend.calls[0].json()["method"] == "initialize"


def test_requests_to_a_modern_backend_carry_metadata_and_headers_and_a_legacy_one_gets_none_of_it():
    channel = BackendChannel("b", McpHttpClient("b", URL), 5.0, client_capabilities={"sampling": {}})
    modern = Handshake(None, MODERN)
    legacy = Handshake("s1", "2025-11-25")
    sent: dict[str, str] = {}
    params = channel._params_for(modern, "tools/call", {"name": "é x", "_meta": {"progressToken": 1}}, sent)
    assert params["_meta"]["progressToken"] == 1
    assert params["_meta"]["io.modelcontextprotocol/protocolVersion"] == MODERN
    assert sent == {"Mcp-Method": "tools/call", "Mcp-Name": encode_header_value("é x")}
    sent = {}
    old = channel._params_for(legacy, "tools/call", {"name": "x", "_meta": {
        "io.modelcontextprotocol/logLevel": "info", "progressToken": 1}}, sent)
    assert old == {"name": "x", "_meta": {"progressToken": 1}} and sent == {}




# -- x-mcp-header marks --------------------------------------------------------------------------


def _schema(**properties: dict) -> dict:
    return {"type": "object", "properties": properties}


def test_header_marks_are_found_through_properties_only_and_checked():
    from vmcp_actors.protocol.mcp import (
        param_header_mismatch,
        param_headers_for,
        valid_header_params,
    )

    schema = _schema(region={"type": "string", "x-mcp-header": "Region"},
                     nested={"type": "object", "properties": {"n": {"type": "integer", "x-mcp-header": "N"}}},
                     flag={"type": "boolean", "x-mcp-header": "Flag"})
    assert valid_header_params(schema)
    arguments = {"region": "é", "nested": {"n": 42}, "flag": False}
    headers = param_headers_for(schema, arguments)
    assert headers == {"Mcp-Param-region": "=?base64?w6k=?=", "Mcp-Param-n": "42", "Mcp-Param-flag": "false"}
    received = {"region": "=?base64?w6k=?=", "n": "42.0", "flag": "false"}
    assert param_header_mismatch(schema, arguments, received) is None  # integers compare as numbers
    assert "missing" in param_header_mismatch(schema, arguments, {"n": "42", "flag": "false"})
    assert "does not match" in param_header_mismatch(schema, arguments, {**received, "flag": "true"})
    assert param_header_mismatch(schema, {"nested": {}}, {}) is None  # no value, no header expected
    for bad in (_schema(x={"type": "number", "x-mcp-header": "X"}),
                _schema(x={"type": "string", "x-mcp-header": "bad name"}),
                _schema(x={"type": "string", "x-mcp-header": "A"}, y={"type": "string", "x-mcp-header": "a"})):
        assert not valid_header_params(bad)
