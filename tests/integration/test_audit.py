"""The audit log (issue 14, item 5): one JSON line per tool call, resource read and
prompt get, with who, what, which backend, the outcome and the duration; arguments only
when the operator opts in; never a token or a full session id. Real SDK backend, real
IdP stand-in, the SDK client in both eras."""

from __future__ import annotations

import json

import pytest

from tests.backends import sdk_backend
from tests.gateway import backend_entry, wait_until
from tests.idp import LocalIdP
from tests.integration.test_identity import bearer

AUD = "vmcp"


@pytest.fixture
def backend():
    served = sdk_backend("plain", ["echo", "fail"])
    yield served
    served.stop()


@pytest.fixture
def idp():
    provider = LocalIdP().start()
    yield provider
    provider.stop()


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def gateway_with_audit(start_gateway, backend, idp, path, **audit):
    return start_gateway({"name": "audited", "backends": [backend_entry("plain", backend)],
                          "incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUD}},
                          "audit": {"enabled": True, "logFile": str(path), **audit}})


def test_each_call_read_and_get_is_one_line_with_who_what_and_how_it_went(start_gateway, backend, idp, tmp_path):
    path = tmp_path / "audit.log"
    gateway = gateway_with_audit(start_gateway, backend, idp, path)
    token = idp.issue_token("alice", AUD)
    headers = {"MCP-Protocol-Version": "2025-11-25", **bearer(token)}
    sid = gateway.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        headers=bearer(token)).headers["Mcp-Session-Id"]

    def rpc(method, params):
        response = gateway.post({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, sid, headers=headers)
        assert response.status_code == 200

    rpc("tools/call", {"name": "plain_echo", "arguments": {"text": "secret-argument"}})
    rpc("tools/call", {"name": "plain_fail", "arguments": {}})
    rpc("tools/call", {"name": "no_such_tool", "arguments": {}})
    rpc("resources/read", {"uri": "test://plain/static"})
    rpc("prompts/get", {"name": "plain_greet", "arguments": {"who": "bob"}})
    rpc("tools/list", {})  # not audited
    assert wait_until(lambda: len(lines(path)) == 5, timeout=5), lines(path)
    echo, failed, unknown, read, prompt = lines(path)
    assert echo["type"] == "mcp_tool_call" and echo["method"] == "tools/call"
    assert echo["name"] == "plain_echo" and echo["backend"] == "plain" and echo["outcome"] == "success"
    assert echo["user"] == {"issuer": idp.issuer, "subject": "alice"}
    assert echo["session"] == sid[:8] and echo["component"] == "vmcp-actors"
    assert echo["durationMs"] >= 0 and echo["time"].endswith("Z")
    assert (failed["outcome"], failed["backend"]) == ("tool_error", "plain")
    assert (unknown["outcome"], unknown["backend"]) == ("error", None)
    assert (read["type"], read["name"], read["backend"], read["outcome"]) == (
        "mcp_resource_read", "test://plain/static", "plain", "success")
    assert (prompt["type"], prompt["name"], prompt["outcome"]) == ("mcp_prompt_get", "plain_greet", "success")
    text = path.read_text()
    assert "secret-argument" not in text and token not in text and sid not in text  # nothing opted out
    assert "request" not in echo and "response" not in echo
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_request_data_when_opted_in_cut_to_max_data_size_and_event_types_filter(
        start_gateway, backend, idp, tmp_path):
    path = tmp_path / "audit.log"
    gateway = gateway_with_audit(start_gateway, backend, idp, path, includeRequestData=True,
                                 includeResponseData=True, maxDataSize=40, eventTypes=["mcp_tool_call"])
    token = idp.issue_token("carol", AUD)
    sid = gateway.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        headers=bearer(token)).headers["Mcp-Session-Id"]
    headers = {"MCP-Protocol-Version": "2025-11-25", **bearer(token)}
    for params in ({"name": "plain_echo", "arguments": {"text": "short"}},
                   {"name": "plain_echo", "arguments": {"text": "x" * 200}}):
        gateway.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}, sid, headers=headers)
    gateway.post({"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": "test://plain/static"}},
                 sid, headers=headers)  # not among eventTypes
    assert wait_until(lambda: len(lines(path)) == 2, timeout=5), lines(path)
    short, long = lines(path)
    assert short["request"] == {"text": "short"}
    assert long["request"]["truncated"].startswith('{"text":"xxx') and len(long["request"]["truncated"]) == 40
    assert "response" in short


def test_a_2026_07_28_call_is_audited_too(start_gateway, backend, idp, tmp_path):
    import asyncio

    import mcp

    path = tmp_path / "audit.log"
    gateway = gateway_with_audit(start_gateway, backend, idp, path)
    token = idp.issue_token("dave", AUD)

    async def call() -> None:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        async with httpx2.AsyncClient(headers=bearer(token), timeout=30) as http:
            async with mcp.Client(streamable_http_client(gateway.url, http_client=http)) as client:  # auto: 2026-07-28
                await client.call_tool("plain_echo", {"text": "modern"})

    asyncio.run(call())
    assert wait_until(lambda: any(line["user"]["subject"] == "dave" for line in lines(path)), timeout=5)
    (line,) = [line for line in lines(path) if line["type"] == "mcp_tool_call"]
    assert (line["backend"], line["outcome"], line["session"]) == ("plain", "success", None)


def test_the_audit_config_is_checked():
    from vmcp_actors.config import config_from_mapping
    from vmcp_actors.exceptions import ConfigError

    base = {"name": "x", "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}]}
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({**base, "audit": {"eventTypes": ["mcp_everything"], "maxDataSize": 0, "logfile": "x"}})
    assert list(caught.value.errors) == [
        "audit.eventTypes[0]: must be one of mcp_tool_call, mcp_resource_read, mcp_prompt_get, mcp_task, oauth, connection",
        "audit.logfile: unknown field",
        "audit.maxDataSize: must be between 1 and 1048576",
    ]
    assert config_from_mapping(base).audit.enabled is False
