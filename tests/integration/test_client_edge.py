"""The client edge: MCP streamable HTTP (2025-06-18 / 2025-11-25) as clients see it.

Real backends on loopback (official-SDK servers, and raw backends where the wire must be
observed), the real gateway HTTP server, raw HTTP with ``requests`` for the wire rules and
the official SDK client for compatibility. Every bad input is followed by a check that the
same session still works: none of them may kill an actor or hang a thread.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any

import pykka
import pytest
import requests

from tests.backends import paged_backend, restartable_backend, sdk_backend
from tests.gateway import (
    MCP_HEADERS,
    QuickStopGatewayServer,
    answer_of,
    backend_entry,
    run_client,
    wait_until,
)

INVALID_PARAMS = -32602
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
PARSE_ERROR = -32700
RESOURCE_NOT_FOUND = -32002

EXPECTED_CAPABILITIES = ("tools", "resources", "prompts", "logging", "completions")


# ----------------------------------------------------------------------------------
# Fixtures and helpers
# ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sdk_pair():
    with sdk_backend("alpha") as alpha, sdk_backend("beta") as beta:
        yield alpha, beta


@pytest.fixture(scope="module")
def paged():
    with paged_backend(name="paged") as backend:
        yield backend


def config_for(*backends: tuple[str, Any], **operational: Any) -> dict:
    # Spoken to as 2025-11-25 backends: they advertise no resource subscriptions then.
    config: dict[str, Any] = {"name": "edge", "backends": [backend_entry(name, b, "legacy") for name, b in backends]}
    if operational:
        config["operational"] = operational
    return config


@pytest.fixture(autouse=True)
def stop_all_actors():
    """Overrides the conftest fixture: this module shares one gateway (and session) across
    its wire-level tests, so its actors must outlive a test. Gateways started per test are
    still stopped by ``start_gateway``; everything else stops at the end of the module."""
    yield


@pytest.fixture(scope="module", autouse=True)
def stop_actors_after_module():
    yield
    pykka.ActorRegistry.stop_all(block=True, timeout=5)


@pytest.fixture(scope="module")
def gateway(sdk_pair):
    """One gateway for the module's wire-level tests (discovery is the costly part)."""
    alpha, beta = sdk_pair
    server = QuickStopGatewayServer(config_for(("alpha", alpha), ("beta", beta))).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def session(gateway) -> str:
    """The module's shared session: every bad input is sent on it, and it must keep working."""
    return gateway.initialize()


def request(method: str, params: Any = None, request_id: Any = 7) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def error_code(answer: dict) -> int:
    assert "error" in answer, f"expected a JSON-RPC error, got {answer}"
    return answer["error"]["code"]


def assert_session_works(gateway, session_id: str, text: str = "still alive") -> None:
    """A real round trip through the session's actors to a backend."""
    answer = gateway.rpc(session_id, "tools/call", {"name": "alpha_echo", "arguments": {"text": text}}, request_id=901)
    assert answer.get("id") == 901, answer
    assert "result" in answer, answer
    assert answer["result"]["content"][0]["text"] == f"alpha:{text}"
    listed = gateway.rpc(session_id, "tools/list", request_id=902)
    assert "alpha_echo" in [t["name"] for t in listed["result"]["tools"]]


def collect_pages(gateway, session_id: str, method: str, key: str, field: str) -> tuple[list[str], int]:
    """Follow nextCursor to the end; (every item's field, number of pages)."""
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        answer = gateway.rpc(session_id, method, {"cursor": cursor} if cursor else {}, request_id=100 + pages)
        assert "result" in answer, answer
        pages += 1
        seen.extend(item[field] for item in answer["result"][key])
        cursor = answer["result"].get("nextCursor")
        if cursor is None:
            return seen, pages
        assert pages < 200, "pagination does not end"


def b64_cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


# ----------------------------------------------------------------------------------
# 1-2. initialize
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "negotiated"),
    [("2025-06-18", "2025-06-18"), ("2025-11-25", "2025-11-25"), ("2024-01-01", "2025-11-25")],
)
def test_initialize_issues_session_and_negotiates_version(gateway, requested, negotiated):
    response = gateway.post(
        {"jsonrpc": "2.0", "id": "init-1", "method": "initialize",
         "params": {"protocolVersion": requested, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    )
    assert response.status_code == 200
    session_id = response.headers.get("Mcp-Session-Id")
    assert session_id
    answer = answer_of(response)
    assert answer["id"] == "init-1"
    result = answer["result"]
    assert result["protocolVersion"] == negotiated
    assert result["serverInfo"]["name"] == "edge"
    for capability in EXPECTED_CAPABILITIES:
        assert capability in result["capabilities"], result["capabilities"]
    assert gateway.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session_id,
                        headers={"MCP-Protocol-Version": negotiated}).status_code == 202
    listed = answer_of(gateway.post(request("tools/list"), session_id, headers={"MCP-Protocol-Version": negotiated}))
    assert "alpha_echo" in [t["name"] for t in listed["result"]["tools"]]


@pytest.mark.parametrize(
    "params",
    [
        {"capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        {"protocolVersion": 20250618, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        None,
    ],
    ids=["missing", "not-a-string", "no-params"],
)
def test_initialize_without_protocol_version_is_invalid_params(gateway, params):
    response = gateway.post(request("initialize", params, request_id=3))
    assert response.status_code == 200
    answer = response.json()
    assert answer["id"] == 3
    assert error_code(answer) == INVALID_PARAMS
    assert "Mcp-Session-Id" not in response.headers


# ----------------------------------------------------------------------------------
# 3-4. session header, unknown sessions, DELETE
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [request("tools/list"), {"jsonrpc": "2.0", "method": "notifications/initialized"}],
    ids=["request", "notification"],
)
def test_missing_session_header_is_400(gateway, session, message):
    response = gateway.post(message)
    assert response.status_code == 400
    assert error_code(response.json()) == INVALID_REQUEST
    assert_session_works(gateway, session)


def test_unknown_session_is_404(gateway, session):
    response = gateway.post(request("tools/list"), "0" * 32)
    assert response.status_code == 404
    assert_session_works(gateway, session)


def test_delete_ends_session_then_404(gateway, session):
    other = gateway.initialize()
    response = requests.delete(gateway.url, headers={"Mcp-Session-Id": other}, timeout=10)
    assert response.status_code == 200
    assert gateway.post(request("tools/list"), other).status_code == 404
    assert requests.delete(gateway.url, headers={"Mcp-Session-Id": other}, timeout=10).status_code == 404
    assert_session_works(gateway, session)


def test_delete_unknown_session_is_404(gateway, session):
    response = requests.delete(gateway.url, headers={"Mcp-Session-Id": "f" * 32}, timeout=10)
    assert response.status_code == 404
    assert_session_works(gateway, session)


def test_delete_without_session_header_is_400(gateway, session):
    response = requests.delete(gateway.url, timeout=10)
    assert response.status_code == 400
    assert_session_works(gateway, session)


def test_delete_ends_every_backend_session(start_gateway):
    with restartable_backend("r1") as r1, restartable_backend("r2") as r2:
        gateway = start_gateway(config_for(("r1", r1), ("r2", r2)))
        session_id = gateway.initialize()
        listed = gateway.rpc(session_id, "tools/list")
        assert {"r1_echo", "r2_echo"} <= {t["name"] for t in listed["result"]["tools"]}
        backend_sessions = {name: set(b.sessions) for name, b in (("r1", r1), ("r2", r2))}
        assert all(len(ids) == 1 for ids in backend_sessions.values()), backend_sessions

        assert requests.delete(gateway.url, headers={"Mcp-Session-Id": session_id}, timeout=10).status_code == 200

        assert wait_until(lambda: all(backend_sessions[name] <= set(b.deleted_sessions)
                                      for name, b in (("r1", r1), ("r2", r2))), timeout=10)
        assert backend_sessions["r1"] <= set(r1.deleted_sessions)
        assert backend_sessions["r2"] <= set(r2.deleted_sessions)
        assert r1.sessions == {} and r2.sessions == {}


# ----------------------------------------------------------------------------------
# 5-7. protocol header, notifications and responses, GET
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["2025-03-26", "2025-06-18", "2025-11-25"])
def test_protocol_version_header_accepted(gateway, session, version):
    response = gateway.post(request("tools/list"), session, headers={"MCP-Protocol-Version": version})
    assert response.status_code == 200
    assert "alpha_echo" in [t["name"] for t in answer_of(response)["result"]["tools"]]


def test_bad_protocol_version_header_is_400(gateway, session):
    response = gateway.post(request("tools/list"), session, headers={"MCP-Protocol-Version": "1999-01-01"})
    assert response.status_code == 400
    assert error_code(response.json()) == INVALID_REQUEST
    assert_session_works(gateway, session)


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99, "reason": "changed mind"}},
        {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"},
    ],
    ids=["initialized", "cancelled-unknown-call", "roots-changed"],
)
def test_notifications_are_202_without_body(gateway, session, message):
    response = gateway.post(message, session)
    assert response.status_code == 202
    assert response.content == b""
    assert_session_works(gateway, session)


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": 5, "result": {}},
        {"jsonrpc": "2.0", "id": "s-1", "error": {"code": -32601, "message": "no sampling here"}},
    ],
    ids=["response", "error-response"],
)
def test_answers_to_requests_never_sent_are_400_and_change_nothing(gateway, session, message):
    response = gateway.post(message, session)
    assert response.status_code == 400
    error = response.json()
    assert error["id"] is None and error["error"]["code"] == INVALID_REQUEST
    assert "awaits an answer" in error["error"]["message"]
    assert_session_works(gateway, session)


def test_get_without_a_session_is_400_and_with_an_unknown_one_404(gateway, session):
    headers = {"Accept": "text/event-stream"}
    assert requests.get(gateway.url, headers=headers, timeout=10).status_code == 400
    unknown = requests.get(gateway.url, headers={**headers, "Mcp-Session-Id": "f" * 64}, timeout=10)
    assert unknown.status_code == 404
    refused = requests.get(gateway.url, headers={"Accept": "application/json", "Mcp-Session-Id": session}, timeout=10)
    assert refused.status_code == 406
    assert_session_works(gateway, session)


# ----------------------------------------------------------------------------------
# 8. envelope errors
# ----------------------------------------------------------------------------------

BAD_BODIES = [
    ("unparsable", b"{not json", PARSE_ERROR),
    ("empty", b"", PARSE_ERROR),
    ("truncated", b'{"jsonrpc": "2.0", "id": 1, "method": "ping"', PARSE_ERROR),
    ("bad-utf8", b'{"jsonrpc": "2.0", "id": 1, "method": "\xff\xfe"}', PARSE_ERROR),
    ("batch", json.dumps([request("ping", request_id=1), request("ping", request_id=2)]), INVALID_REQUEST),
    ("empty-batch", b"[]", INVALID_REQUEST),
    ("scalar", b"42", INVALID_REQUEST),
    ("no-jsonrpc", json.dumps({"id": 1, "method": "ping"}), INVALID_REQUEST),
    ("jsonrpc-1.0", json.dumps({"jsonrpc": "1.0", "id": 1, "method": "ping"}), INVALID_REQUEST),
    ("float-id", json.dumps({"jsonrpc": "2.0", "id": 1.5, "method": "ping"}), INVALID_REQUEST),
    ("bool-id", json.dumps({"jsonrpc": "2.0", "id": True, "method": "ping"}), INVALID_REQUEST),
    ("object-id", json.dumps({"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}), INVALID_REQUEST),
    ("null-id", json.dumps({"jsonrpc": "2.0", "id": None, "method": "ping"}), INVALID_REQUEST),
    ("method-not-string", json.dumps({"jsonrpc": "2.0", "id": 1, "method": 12}), INVALID_REQUEST),
    ("scalar-params", json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": 3}), INVALID_REQUEST),
    ("neither", json.dumps({"jsonrpc": "2.0", "id": 1}), INVALID_REQUEST),
]


@pytest.mark.parametrize(("body", "code"), [(b, c) for _, b, c in BAD_BODIES], ids=[i for i, _, _ in BAD_BODIES])
def test_bad_envelope_is_400_with_jsonrpc_error(gateway, session, body, code):
    response = gateway.post(body, session)
    assert response.status_code == 400
    answer = response.json()
    assert answer["jsonrpc"] == "2.0"
    assert error_code(answer) == code
    assert_session_works(gateway, session)


# ----------------------------------------------------------------------------------
# 9-10. methods and params
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["foo/bar", "resources/subscribe", "resources/unsubscribe", "sampling/createMessage"])
def test_unknown_or_unadvertised_method_is_method_not_found(gateway, session, method):
    params = {"uri": "test://alpha/static"} if method.startswith("resources/") else {}
    response = gateway.post(request(method, params, request_id="m-1"), session)
    assert response.status_code == 200
    answer = answer_of(response)
    assert answer["id"] == "m-1"
    assert error_code(answer) == METHOD_NOT_FOUND
    assert_session_works(gateway, session)


BAD_PARAMS = [
    ("call-without-name", "tools/call", {"arguments": {}}, INVALID_PARAMS),
    ("call-empty-name", "tools/call", {"name": ""}, INVALID_PARAMS),
    ("call-name-not-string", "tools/call", {"name": 5}, INVALID_PARAMS),
    ("call-unknown-tool", "tools/call", {"name": "no_such_tool", "arguments": {}}, INVALID_PARAMS),
    ("call-unprefixed-name", "tools/call", {"name": "echo", "arguments": {"text": "x"}}, INVALID_PARAMS),
    ("arguments-string", "tools/call", {"name": "alpha_echo", "arguments": "text=x"}, INVALID_PARAMS),
    ("arguments-list", "tools/call", {"name": "alpha_echo", "arguments": ["x"]}, INVALID_PARAMS),
    ("meta-not-object", "tools/call", {"name": "alpha_echo", "arguments": {"text": "x"}, "_meta": 1}, INVALID_PARAMS),
    ("prompt-unknown", "prompts/get", {"name": "no_such_prompt"}, INVALID_PARAMS),
    ("prompt-without-name", "prompts/get", {}, INVALID_PARAMS),
    ("prompt-arguments-list", "prompts/get", {"name": "alpha_greet", "arguments": ["x"]}, INVALID_PARAMS),
    ("read-unknown-uri", "resources/read", {"uri": "test://nowhere/at-all"}, RESOURCE_NOT_FOUND),
    ("read-without-uri", "resources/read", {}, INVALID_PARAMS),
    ("list-params-list", "tools/list", ["cursor"], INVALID_PARAMS),
    ("call-params-list", "tools/call", ["alpha_echo", {"text": "x"}], INVALID_PARAMS),
    ("complete-without-ref", "completion/complete", {"argument": {"name": "who", "value": "a"}}, INVALID_PARAMS),
    ("complete-bad-ref-type", "completion/complete",
     {"ref": {"type": "ref/tool", "name": "alpha_echo"}, "argument": {"name": "text", "value": "a"}}, INVALID_PARAMS),
    ("complete-without-argument", "completion/complete", {"ref": {"type": "ref/prompt", "name": "alpha_greet"}},
     INVALID_PARAMS),
]


@pytest.mark.parametrize(
    ("method", "params", "code"), [(m, p, c) for _, m, p, c in BAD_PARAMS], ids=[i for i, *_ in BAD_PARAMS]
)
def test_bad_params_are_jsonrpc_errors(gateway, session, method, params, code):
    response = gateway.post(request(method, params, request_id=11), session)
    assert response.status_code == 200
    answer = answer_of(response)
    assert answer["id"] == 11
    assert error_code(answer) == code
    assert_session_works(gateway, session)


# ----------------------------------------------------------------------------------
# 11-14. HTTP-level checks
# ----------------------------------------------------------------------------------


def _chunked(body: bytes, size: int = 500):
    """A body requests sends with Transfer-Encoding: chunked (no Content-Length)."""
    return (body[i : i + size] for i in range(0, len(body), size))


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_body_over_limit_is_413(start_gateway, sdk_pair, framing):
    alpha, beta = sdk_pair
    gateway = start_gateway(config_for(("alpha", alpha), ("beta", beta), maxRequestBodyBytes=2048))
    session_id = gateway.initialize()
    headers = {**MCP_HEADERS, "Mcp-Session-Id": session_id}

    def send(text: str) -> requests.Response:
        body = json.dumps(request("tools/call", {"name": "alpha_echo", "arguments": {"text": text}})).encode()
        return requests.post(gateway.url, data=_chunked(body) if framing == "chunked" else body, headers=headers, timeout=10)

    assert send("x" * 4096).status_code == 413
    # Just under the limit still goes through, with the same framing.
    fits = "y" * 1500
    response = send(fits)
    assert response.status_code == 200
    assert answer_of(response)["result"]["content"][0]["text"] == f"alpha:{fits}"
    assert_session_works(gateway, session_id)


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_wrong_content_type_is_415(gateway, session, content_type):
    headers = {"Accept": MCP_HEADERS["Accept"], "Mcp-Session-Id": session}
    if content_type:
        headers["Content-Type"] = content_type
    response = requests.post(gateway.url, data=json.dumps(request("tools/list")).encode(), headers=headers, timeout=10)
    assert response.status_code == 415
    assert_session_works(gateway, session)


def test_json_content_type_with_charset_is_accepted(gateway, session):
    response = gateway.post(request("ping"), session, headers={"Content-Type": "application/json; charset=utf-8"})
    assert response.status_code == 200
    assert answer_of(response)["result"] == {}


@pytest.mark.parametrize(
    "accept",
    ["application/json", "text/event-stream", "text/html",
     "application/json;q=0, text/event-stream", "application/json, text/event-stream;q=0"],
    ids=["json-only", "sse-only", "html", "json-refused-q0", "sse-refused-q0"],
)
def test_accept_lacking_json_or_sse_is_406(gateway, session, accept):
    response = gateway.post(request("tools/list"), session, headers={"Accept": accept})
    assert response.status_code == 406
    assert_session_works(gateway, session)


@pytest.mark.parametrize("accept", ["*/*", "application/json, text/event-stream", "text/event-stream, application/*"])
def test_accept_wildcards_are_accepted(gateway, session, accept):
    response = gateway.post(request("tools/list"), session, headers={"Accept": accept})
    assert response.status_code == 200
    assert "alpha_echo" in [t["name"] for t in answer_of(response)["result"]["tools"]]


@pytest.mark.parametrize(
    "headers",
    [{"Host": "evil.example.com"}, {"Host": "evil.example.com:80"}, {"Origin": "http://evil.example.com"},
     {"Origin": "null"}, {"Origin": "http://localhost.evil.example.com"}],
    ids=["host", "host-with-port", "origin", "null-origin", "lookalike-origin"],
)
def test_dns_rebinding_is_403(gateway, session, headers):
    response = gateway.post(request("tools/list"), session, headers=headers)
    assert response.status_code == 403
    assert_session_works(gateway, session)


def test_dns_rebinding_checked_on_initialize_and_delete(gateway, session):
    init = gateway.post(
        request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                               "clientInfo": {"name": "t", "version": "1"}}),
        headers={"Host": "evil.example.com"},
    )
    assert init.status_code == 403
    assert "Mcp-Session-Id" not in init.headers
    deleted = requests.delete(
        gateway.url, headers={"Mcp-Session-Id": session, "Origin": "http://evil.example.com"}, timeout=10
    )
    assert deleted.status_code == 403
    assert_session_works(gateway, session)


def test_localhost_origin_is_allowed(gateway, session):
    for origin in (f"http://localhost:{gateway.port}", f"http://127.0.0.1:{gateway.port}"):
        response = gateway.post(request("ping"), session, headers={"Origin": origin})
        assert response.status_code == 200, origin
        assert answer_of(response)["result"] == {}


@pytest.mark.parametrize(
    ("allowed_host", "host_header"),
    [("mcp.example.com", "mcp.example.com"), ("mcp.example.com", "mcp.example.com:8443"),
     ("mcp.example.com:8443", "mcp.example.com:8443")],
    ids=["bare", "bare-entry-header-with-port", "entry-with-port"],
)
def test_allowed_hosts_are_allowed(start_gateway, sdk_pair, allowed_host, host_header):
    alpha, beta = sdk_pair
    gateway = start_gateway(config_for(("alpha", alpha), ("beta", beta), allowedHosts=[allowed_host]))
    session_id = gateway.initialize()
    response = gateway.post(request("ping"), session_id, headers={"Host": host_header})
    assert response.status_code == 200, response.text
    assert answer_of(response)["result"] == {}
    assert gateway.post(request("ping"), session_id, headers={"Host": "other.example.com"}).status_code == 403
    assert_session_works(gateway, session_id)


def test_allowed_origins_are_allowed(start_gateway, sdk_pair):
    alpha, beta = sdk_pair
    gateway = start_gateway(config_for(("alpha", alpha), ("beta", beta), allowedOrigins=["https://app.example.com"]))
    session_id = gateway.initialize()
    response = gateway.post(request("ping"), session_id, headers={"Origin": "https://app.example.com"})
    assert response.status_code == 200
    assert answer_of(response)["result"] == {}
    assert gateway.post(request("ping"), session_id, headers={"Origin": "https://other.example.com"}).status_code == 403
    assert_session_works(gateway, session_id)


# ----------------------------------------------------------------------------------
# 15-16. server/discover, ping
# ----------------------------------------------------------------------------------


def test_server_discover_answers_without_a_session_and_refuses_a_bad_envelope(gateway):
    headers = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "server/discover"}
    response = gateway.post(request("server/discover", {}, request_id="d-1"), headers=headers)
    assert response.status_code == 400  # no _meta envelope: -32602, as 2026-07-28 says
    assert answer_of(response)["error"]["code"] == INVALID_PARAMS
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    response = gateway.post(request("server/discover", {"_meta": meta}, request_id="d-2"), headers=headers)
    answer = answer_of(response)
    assert response.status_code == 200 and answer["id"] == "d-2"
    assert answer["result"]["supportedVersions"][0] == "2026-07-28"
    assert "Mcp-Session-Id" not in response.headers


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_sdk_client_connects_lists_and_calls(gateway, mode):
    async def work(client):
        tools = await client.list_tools()
        called = await client.call_tool("beta_echo", {"text": mode})
        return [t.name for t in tools.tools], called, client.protocol_version, client.server_info

    names, called, version, server_info = run_client(gateway.url, work, mode=mode)
    # Auto mode probes server/discover and speaks 2026-07-28; legacy mode initializes.
    assert version == ("2026-07-28" if mode == "auto" else "2025-11-25")
    assert server_info is not None and server_info.name == "edge"
    assert {"alpha_echo", "beta_echo"} <= set(names)
    assert called.content[0].text == f"beta:{mode}"
    assert not called.is_error


def test_ping_answers_empty_result(gateway, session):
    answer = gateway.rpc(session, "ping", request_id="p")
    assert answer == {"jsonrpc": "2.0", "id": "p", "result": {}}
    answer = answer_of(gateway.post({"jsonrpc": "2.0", "id": 4, "method": "ping"}, session))  # no params at all
    assert answer["result"] == {}


# ----------------------------------------------------------------------------------
# 17. pagination towards the client
# ----------------------------------------------------------------------------------

LISTS = [
    ("tools/list", "tools", "name"),
    ("prompts/list", "prompts", "name"),
    ("resources/list", "resources", "uri"),
    ("resources/templates/list", "resourceTemplates", "uriTemplate"),
]


@pytest.fixture
def paged_gateways(start_gateway, sdk_pair, paged):
    alpha, beta = sdk_pair
    backends = (("alpha", alpha), ("beta", beta), ("paged", paged))
    small = start_gateway(config_for(*backends, pageSize=2))
    big = start_gateway(config_for(*backends, pageSize=1000))
    return small, big


@pytest.mark.parametrize(("method", "key", "field"), LISTS, ids=[m for m, _, _ in LISTS])
def test_pagination_yields_every_item_once_in_order(paged_gateways, method, key, field):
    small, big = paged_gateways
    small_session, big_session = small.initialize(), big.initialize()
    everything = big.rpc(big_session, method)["result"]
    assert "nextCursor" not in everything
    expected = [item[field] for item in everything[key]]

    first = small.rpc(small_session, method)["result"]
    assert len(first[key]) == min(2, len(expected))
    if len(expected) > 2:
        assert isinstance(first.get("nextCursor"), str) and first["nextCursor"]
    seen, pages = collect_pages(small, small_session, method, key, field)
    assert seen == expected
    assert len(seen) == len(set(seen))
    assert pages == max(1, -(-len(expected) // 2))
    if method != "resources/templates/list":
        assert len(expected) > 4  # the case really pages


def test_pagination_covers_the_paged_backend_entirely(paged_gateways):
    small, _ = paged_gateways
    session_id = small.initialize()
    tools, _ = collect_pages(small, session_id, "tools/list", "tools", "name")
    assert [t for t in tools if t.startswith("paged_")] == [f"paged_tool_{i:02d}" for i in range(23)]
    prompts, _ = collect_pages(small, session_id, "prompts/list", "prompts", "name")
    assert [p for p in prompts if p.startswith("paged_")] == [f"paged_prompt_{i:02d}" for i in range(7)]
    resources, _ = collect_pages(small, session_id, "resources/list", "resources", "uri")
    assert [r for r in resources if r.startswith("paged://")] == [f"paged://paged/resource_{i:02d}" for i in range(6)]


def test_sdk_client_sees_paged_tools(paged_gateways):
    small, big = paged_gateways
    big_session = big.initialize()
    expected = [t["name"] for t in big.rpc(big_session, "tools/list")["result"]["tools"]]

    async def work(client):
        first = await client.list_tools()
        names = [t.name for t in first.tools]
        cursor = first.next_cursor
        while cursor is not None:
            page = await client.list_tools(cursor=cursor)
            names.extend(t.name for t in page.tools)
            cursor = page.next_cursor
        prompts = await client.list_prompts()
        return len(first.tools), first.next_cursor, names, prompts.next_cursor

    first_len, first_cursor, names, prompt_cursor = run_client(small.url, work, mode="legacy")
    assert first_len == 2 and first_cursor is not None  # the SDK client does not auto-follow
    assert names == expected
    assert prompt_cursor is not None


@pytest.mark.parametrize(("method", "key", "field"), LISTS[:3], ids=[m for m, _, _ in LISTS[:3]])
def test_invalid_cursor_is_invalid_params(paged_gateways, method, key, field):
    small, _ = paged_gateways
    session_id = small.initialize()
    foreign_method = "resources/list" if method != "resources/list" else "tools/list"
    foreign = small.rpc(session_id, foreign_method)["result"]["nextCursor"]
    own_key = key
    bad_cursors = [
        "garbage!!",
        "",
        foreign,
        b64_cursor(json.dumps([own_key, 100000])),
        b64_cursor(json.dumps([own_key, -2])),
        b64_cursor(json.dumps([own_key, "2"])),
        b64_cursor("not json"),
        123,
        {"offset": 2},
    ]
    for cursor in bad_cursors:
        answer = small.rpc(session_id, method, {"cursor": cursor}, request_id=31)
        assert answer.get("id") == 31
        assert error_code(answer) == INVALID_PARAMS, (cursor, answer)
    # The session is fine, and its own cursors still work.
    seen, _ = collect_pages(small, session_id, method, key, field)
    assert len(seen) == len(set(seen)) > 2
    listed = small.rpc(session_id, "tools/call", {"name": "alpha_echo", "arguments": {"text": "ok"}})
    assert listed["result"]["content"][0]["text"] == "alpha:ok"


# ----------------------------------------------------------------------------------
# 18-19. logging, completion
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["debug", "info", "warning", "emergency"])
def test_set_logging_level_valid(gateway, session, level):
    answer = gateway.rpc(session, "logging/setLevel", {"level": level})
    assert answer["result"] == {}
    assert_session_works(gateway, session)


@pytest.mark.parametrize(
    "params", [{"level": "loud"}, {"level": "INFO"}, {"level": 3}, {}], ids=["loud", "upper", "int", "missing"]
)
def test_set_logging_level_invalid_is_invalid_params(gateway, session, params):
    answer = gateway.rpc(session, "logging/setLevel", params)
    assert error_code(answer) == INVALID_PARAMS
    assert_session_works(gateway, session)


def test_completion_is_routed_to_the_prompts_backend(gateway, session):
    answer = gateway.rpc(
        session, "completion/complete",
        {"ref": {"type": "ref/prompt", "name": "beta_greet"}, "argument": {"name": "who", "value": "al"}},
    )
    assert answer["result"]["completion"]["values"] == ["alice", "albert"]
    answer = gateway.rpc(
        session, "completion/complete",
        {"ref": {"type": "ref/prompt", "name": "alpha_greet"}, "argument": {"name": "who", "value": "c"}},
    )
    assert answer["result"]["completion"]["values"] == ["carol"]


def test_completion_for_unknown_prompt_is_invalid_params(gateway, session):
    for name in ("no_such_prompt", "greet"):  # "greet" is the backend's name, not the advertised one
        answer = gateway.rpc(
            session, "completion/complete",
            {"ref": {"type": "ref/prompt", "name": name}, "argument": {"name": "who", "value": "a"}},
        )
        assert error_code(answer) == INVALID_PARAMS, name
    assert_session_works(gateway, session)


def test_sdk_client_completion(gateway):
    from mcp.types import PromptReference

    async def work(client):
        result = await client.complete(PromptReference(type="ref/prompt", name="alpha_greet"), {"name": "who", "value": "b"})
        return result.completion.values

    assert run_client(gateway.url, work) == ["bob"]


# ----------------------------------------------------------------------------------
# 20-21. concurrency, and actors surviving every bad input
# ----------------------------------------------------------------------------------


def test_concurrent_calls_on_one_session_get_their_own_answers(gateway, session):
    threads_count, calls_each = 16, 20
    failures: list[str] = []
    answered: list[str] = []
    lock = threading.Lock()

    def worker(index: int) -> None:
        with requests.Session() as http:
            for call in range(calls_each):
                text = f"t{index}-c{call}"
                request_id = index * 1000 + call
                try:
                    response = http.post(
                        gateway.url,
                        json=request("tools/call", {"name": "alpha_echo", "arguments": {"text": text}}, request_id),
                        headers={**MCP_HEADERS, "Mcp-Session-Id": session},
                        timeout=20,
                    )
                    answer = answer_of(response)
                    got = answer["result"]["content"][0]["text"]
                    ok = response.status_code == 200 and answer["id"] == request_id and got == f"alpha:{text}"
                except Exception as exc:  # noqa: BLE001 - collected and reported below
                    ok, got = False, repr(exc)
                with lock:
                    (answered if ok else failures).append(text if ok else f"{text}: {got}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(threads_count)]
    for thread in threads:
        thread.start()
    # A hung call fails by its own 20 s client timeout; this only bounds the whole run (it
    # takes seconds, more under load).
    deadline = time.monotonic() + 120
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads), "a client thread hung"
    assert failures == []
    assert len(answered) == len(set(answered)) == threads_count * calls_each


def _bad_inputs(gateway, session_id: str) -> list[tuple[str, Any]]:
    """(label, callable sending one bad input on the session) for every kind of bad input."""
    inputs: list[tuple[str, Any]] = []
    for label, body, _ in BAD_BODIES:
        inputs.append((f"body:{label}", lambda body=body: gateway.post(body, session_id)))
    for label, method, params, _ in BAD_PARAMS:
        inputs.append((f"params:{label}", lambda m=method, p=params: gateway.post(request(m, p), session_id)))
    for method in ("foo/bar", "resources/subscribe"):
        inputs.append((f"method:{method}", lambda m=method: gateway.post(request(m, {}), session_id)))
    inputs += [
        ("header:version", lambda: gateway.post(request("tools/list"), session_id,
                                                headers={"MCP-Protocol-Version": "1999-01-01"})),
        ("header:accept", lambda: gateway.post(request("tools/list"), session_id, headers={"Accept": "application/json"})),
        ("header:content-type", lambda: gateway.post(json.dumps(request("tools/list")), session_id,
                                                     headers={"Content-Type": "text/plain"})),
        ("header:host", lambda: gateway.post(request("tools/list"), session_id, headers={"Host": "evil.example.com"})),
        ("header:origin", lambda: gateway.post(request("tools/list"), session_id,
                                               headers={"Origin": "http://evil.example.com"})),
        ("cursor:garbage", lambda: gateway.post(request("tools/list", {"cursor": "garbage"}), session_id)),
        ("log:level", lambda: gateway.post(request("logging/setLevel", {"level": "loud"}), session_id)),
        ("complete:unknown", lambda: gateway.post(request("completion/complete", {
            "ref": {"type": "ref/prompt", "name": "nope"}, "argument": {"name": "who", "value": "a"}}), session_id)),
        ("notification", lambda: gateway.post({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                               "params": {"requestId": "nope"}}, session_id)),
        ("response", lambda: gateway.post({"jsonrpc": "2.0", "id": 5, "result": {}}, session_id)),
        ("get", lambda: requests.get(gateway.url, headers={"Mcp-Session-Id": session_id, "Accept": "application/json"},
                                     timeout=10)),
        ("discover", lambda: gateway.post(request("server/discover", {}), session_id,
                                          headers={"MCP-Protocol-Version": "2026-07-28"})),
        ("tool-error", lambda: gateway.post(request("tools/call", {"name": "alpha_fail", "arguments": {}}), session_id)),
        ("tool-bad-argument-type", lambda: gateway.post(
            request("tools/call", {"name": "alpha_echo", "arguments": {"text": {"deep": [1, 2]}}}), session_id)),
    ]
    return inputs


def test_actors_survive_every_bad_input(start_gateway, sdk_pair):
    alpha, beta = sdk_pair
    gateway = start_gateway(config_for(("alpha", alpha), ("beta", beta)))
    existing = {ref.actor_urn for ref in pykka.ActorRegistry.get_all()}
    session = gateway.initialize()
    assert_session_works(gateway, session)
    mine = [ref for ref in pykka.ActorRegistry.get_all() if ref.actor_urn not in existing]
    session_actors = [ref for ref in mine if ref.actor_class.__name__ == "UserActor"]
    connections = [ref for ref in mine if ref.actor_class.__name__ == "BackendConnection"]
    assert len(session_actors) == 1 and len(connections) == 2, [ref.actor_class.__name__ for ref in mine]

    statuses: dict[str, int] = {}
    for label, send in _bad_inputs(gateway, session):
        response = send()
        statuses[label] = response.status_code
        assert response.status_code < 500, (label, response.status_code, response.text[:300])

    assert all(ref.is_alive() for ref in session_actors + connections)
    alive = {ref.actor_urn for ref in pykka.ActorRegistry.get_all()}
    assert {ref.actor_urn for ref in session_actors + connections} <= alive
    assert_session_works(gateway, session, text="after every bad input")
    assert statuses["response"] == 400 and statuses["notification"] == 202 and statuses["get"] == 406
