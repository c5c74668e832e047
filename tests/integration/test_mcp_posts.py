"""POST /mcp skips Flask's request machinery (``web.mcp.McpPosts``, the app's WSGI entry):
the same answers as through Flask, on a real gateway and a real SDK client, and the
checks Flask's hooks made (Host, CORS, the error answers) still hold on that path."""

from __future__ import annotations

import logging

import flask
import pytest
import requests

from tests.backends import sdk_backend
from tests.gateway import MCP_HEADERS, backend_entry, run_client
from vmcp_actors.edge._service import McpService

ORIGIN = "https://apps.example.com"


@pytest.fixture(scope="module")
def plain():
    served = sdk_backend("plain", ["echo"])
    yield served
    served.stop()


@pytest.fixture
def gateway(start_gateway, plain):
    return start_gateway({"name": "posts", "backends": [backend_entry("plain", plain)],
                          "operational": {"allowedOrigins": [ORIGIN]}})


@pytest.fixture
def flask_dispatches(monkeypatch):
    """The requests Flask dispatched (routing, contexts, hooks): method and path."""
    seen: list[tuple[str, str]] = []
    dispatch = flask.Flask.full_dispatch_request

    def counted(app: flask.Flask):
        seen.append((flask.request.method, flask.request.path))
        return dispatch(app)

    monkeypatch.setattr(flask.Flask, "full_dispatch_request", counted)
    return seen


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_tool_call_is_answered_without_flask_dispatching_it(gateway, flask_dispatches, mode):
    async def call(client):
        return (await client.call_tool("plain_echo", {"text": "fast"})).content[0].text

    assert run_client(gateway.url, call, mode) == "plain:fast"
    assert ("POST", "/mcp") not in flask_dispatches, "a POST to /mcp went through Flask"
    assert requests.get(gateway.base + "/healthz", timeout=5).ok
    assert flask_dispatches[-1] == ("GET", "/healthz"), "the control: any other request still goes through Flask"


def test_a_listed_origin_gets_its_cors_headers_and_a_foreign_host_is_refused(gateway):
    ping = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "cors", "version": "1"}}}
    listed = requests.post(gateway.url, json=ping, timeout=5, headers={**MCP_HEADERS, "Origin": ORIGIN})
    assert listed.status_code == 200, listed.text
    assert listed.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "Mcp-Session-Id" in listed.headers["Access-Control-Expose-Headers"]
    foreign = requests.post(gateway.url, json=ping, timeout=5, headers={**MCP_HEADERS, "Host": "evil.example"})
    assert foreign.status_code == 403 and foreign.json()["error"]["code"] == -32600


def test_an_error_raised_while_serving_is_a_json_rpc_500_and_logged(gateway, monkeypatch, caplog):
    def broken(*_args, **_kwargs):
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(McpService, "post", broken)
    caplog.set_level(logging.ERROR, logger="vmcp_actors.web")
    answer = requests.post(gateway.url, timeout=5, headers=MCP_HEADERS,
                           json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
    assert answer.status_code == 500
    assert answer.json()["error"] == {"code": -32603, "message": "Internal error"}
    assert any("RuntimeError" in record.getMessage() for record in caplog.records)


def test_a_body_over_the_limit_is_a_json_rpc_413(gateway):
    limit = gateway.config.operational.max_request_body_bytes
    answer = requests.post(gateway.url, data=b"{" + b" " * limit + b"}", timeout=10, headers=MCP_HEADERS)
    assert answer.status_code == 413 and answer.json()["error"]["code"] == -32600
