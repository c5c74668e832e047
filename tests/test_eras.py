"""tests/eras.py: an official-SDK backend made 2026-07-28-only or 2025-only, checked on the
wire (requests against a real loopback server). The unwrapped SDK app serves both eras;
the first test shows it, so the wrappers are what makes the difference."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from tests.backends import SdkBackend, build_sdk_server
from tests.eras import (
    ASSUMED_WITHOUT_HEADER,
    ERAS,
    LEGACY_VERSIONS,
    LegacyOnly,
    ModernOnly,
    start_in_era,
    wrap,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

MODERN = "2026-07-28"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "test-eras", "version": "0"}}


@pytest.fixture
def serve():
    started: list[SdkBackend] = []

    def start(era: str | None) -> SdkBackend:
        backend = start_in_era(SdkBackend("eras", build_sdk_server("eras", tools=["echo"])), era)
        started.append(backend)
        return backend

    yield start
    for backend in started:
        backend.stop()


def post(url: str, message: dict[str, Any], version: str | None = None, session: str | None = None,
         **headers: str) -> requests.Response:
    extra = dict(ACCEPT)
    if version is not None:
        extra["MCP-Protocol-Version"] = version
    if session is not None:
        extra["Mcp-Session-Id"] = session
    extra.update({key.replace("_", "-"): value for key, value in headers.items()})
    return requests.post(url, json=message, headers=extra, timeout=10)


def answer(response: requests.Response) -> dict[str, Any]:
    """The JSON-RPC answer in a JSON or SSE response."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:") and line[5:].strip():
                message = json.loads(line[5:])
                if "id" in message:
                    return message
        raise AssertionError(f"no answer on the stream: {response.text!r}")
    return response.json()


def initialize(version: str = "2025-11-25") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}


def discover(request_id: int = 2) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "server/discover", "params": {"_meta": META}}


def modern_call(url: str, text: str) -> requests.Response:
    message = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
               "params": {"name": "echo", "arguments": {"text": text}, "_meta": META}}
    return post(url, message, MODERN, Mcp_Method="tools/call", Mcp_Name="echo")


def open_session(url: str, offered: str = "2025-11-25") -> tuple[str, str]:
    """initialize + notifications/initialized; the session id and the revision negotiated."""
    response = post(url, initialize(offered))
    assert response.status_code == 200, response.text
    negotiated = answer(response)["result"]["protocolVersion"]
    session = response.headers["mcp-session-id"]
    done = post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, negotiated, session)
    assert done.status_code == 202, done.text
    return session, negotiated


def test_the_bare_sdk_app_serves_both_eras(serve) -> None:
    url = serve(None).mcp_url
    assert answer(post(url, discover(), MODERN, Mcp_Method="server/discover"))["result"]["supportedVersions"] == [MODERN]
    assert open_session(url)[1] == "2025-11-25"


# -- ModernOnly ---------------------------------------------------------------------------


def assert_unsupported(response: requests.Response, requested: str, request_id: Any) -> None:
    assert response.status_code == 400, response.text
    assert response.json() == {"jsonrpc": "2.0", "id": request_id, "error": {
        "code": -32022, "message": "Unsupported protocol version",
        "data": {"supported": [MODERN], "requested": requested}}}


@pytest.mark.parametrize("offered", ["2025-11-25", "2025-06-18", MODERN])
def test_modern_only_refuses_initialize_with_unsupported_protocol_version(serve, offered: str) -> None:
    url = serve("modern").mcp_url
    assert_unsupported(post(url, initialize(offered)), offered, 1)
    assert_unsupported(post(url, initialize(offered), "2025-11-25"), offered, 1)


def test_modern_only_answers_initialize_of_2026_07_28_as_a_removed_method(serve) -> None:
    url = serve("modern").mcp_url
    message = initialize(MODERN)
    message["params"]["_meta"] = META
    response = post(url, message, MODERN, Mcp_Method="initialize")
    assert response.status_code == 404 and response.json()["error"]["code"] == -32601, response.text


@pytest.mark.parametrize("version", sorted(LEGACY_VERSIONS))
def test_modern_only_refuses_any_request_of_a_2025_revision(serve, version: str) -> None:
    url = serve("modern").mcp_url
    listing = {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}}
    assert_unsupported(post(url, listing, version, session="an-old-session"), version, 7)
    ping = {"jsonrpc": "2.0", "id": "p", "method": "ping"}
    assert_unsupported(post(url, ping, version), version, "p")


def test_modern_only_refuses_requests_without_a_version_header(serve) -> None:
    url = serve("modern").mcp_url
    assert_unsupported(post(url, {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}), ASSUMED_WITHOUT_HEADER, 4)
    assert_unsupported(post(url, discover(5)), ASSUMED_WITHOUT_HEADER, 5)  # even discover: the header is required
    notification = post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert notification.status_code == 400 and notification.json()["error"]["code"] == -32022


def test_modern_only_has_no_get_or_delete(serve) -> None:
    url = serve("modern").mcp_url
    for method in ("GET", "DELETE"):
        response = requests.request(method, url, headers={"Accept": "text/event-stream", "Mcp-Session-Id": "x",
                                                          "MCP-Protocol-Version": MODERN}, timeout=10)
        assert response.status_code == 405, (method, response.text)
        assert response.headers.get("allow") == "POST"


def test_modern_only_serves_2026_07_28(serve) -> None:
    url = serve("modern").mcp_url
    discovered = answer(post(url, discover(), MODERN, Mcp_Method="server/discover"))
    assert discovered["result"]["supportedVersions"] == [MODERN]
    called = answer(modern_call(url, "hi"))
    assert called["result"]["content"] == [{"type": "text", "text": "eras:hi"}], called


# -- LegacyOnly ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", [MODERN, "2027-01-01", "draft"])
def test_legacy_only_refuses_a_header_it_does_not_know_as_invalid_request(serve, version: str) -> None:
    url = serve("legacy").mcp_url
    for message in (discover(), initialize(), {"jsonrpc": "2.0", "id": 9, "method": "tools/list"}):
        response = post(url, message, version, Mcp_Method=str(message["method"]))
        assert response.status_code == 400, response.text
        body = response.json()
        assert body["error"]["code"] == -32600 and "data" not in body["error"], body
        assert body["error"]["message"].startswith(f"Bad Request: Unsupported protocol version: {version}"), body
        assert "-32022" not in response.text and "supported\"" not in response.text


def test_legacy_only_knows_no_server_discover(serve) -> None:
    url = serve("legacy").mcp_url
    for version in (None, "2025-11-25", "2025-06-18"):
        response = post(url, discover(11), version, Mcp_Method="server/discover")
        assert response.status_code == 200, response.text
        assert response.json() == {"jsonrpc": "2.0", "id": 11, "error": {"code": -32601,
                                                                          "message": "Method not found"}}
    session, negotiated = open_session(url)
    in_session = post(url, discover(12), negotiated, session)
    assert answer(in_session)["error"]["code"] == -32601


def test_legacy_only_serves_2025_sessions_and_answers_a_2026_offer_with_2025_11_25(serve) -> None:
    url = serve("legacy").mcp_url
    session, negotiated = open_session(url, offered=MODERN)
    assert negotiated == "2025-11-25"
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "x"}}}
    assert answer(post(url, call, negotiated, session))["result"]["content"] == [{"type": "text", "text": "eras:x"}]
    older, version = open_session(url, offered="2025-06-18")
    assert version == "2025-06-18" and older != session
    # the 2025 transport keeps its GET stream and DELETE
    assert requests.delete(url, headers={"Mcp-Session-Id": older, "MCP-Protocol-Version": version},
                           timeout=10).status_code in (200, 204)


def test_wrap_and_eras() -> None:
    app = object()
    assert wrap(app, None) is app
    assert isinstance(wrap(app, "modern"), ModernOnly) and isinstance(wrap(app, "legacy"), LegacyOnly)
    assert set(ERAS) == {"modern", "legacy"}
    with pytest.raises(ValueError):
        wrap(app, "2026-07-28")
