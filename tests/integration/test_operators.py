"""What operators rely on: health endpoints, the admin state, config errors, request logs."""

from __future__ import annotations

import logging

import pytest
import requests

from tests.backends import restartable_backend, sdk_backend, sse_backend
from tests.gateway import admin_get, backend_entry, wait_until
from vmcp_actors.config import config_from_mapping
from vmcp_actors.exceptions import ConfigError
from vmcp_actors.runtime import start_runtime
from vmcp_actors.web import create_app

TOKEN_ENV = "VMCP_TEST_OPERATORS_ADMIN_TOKEN"
TOKEN = "operators-admin-token-9b2e7d"


def test_health_endpoints(start_gateway):
    with restartable_backend() as raw:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("rs", raw)]})
        healthz = requests.get(gateway.base + "/healthz", timeout=10)
        assert healthz.status_code == 200
        readyz = requests.get(gateway.base + "/readyz", timeout=10)
        assert readyz.status_code == 200
        assert raw.received == []  # health checks never touch backends


def test_admin_is_off_without_a_token_env(start_gateway):
    with restartable_backend() as raw:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("rs", raw)]})
        assert admin_get(gateway).status_code == 404
        assert admin_get(gateway, token="anything").status_code == 404


def test_admin_state_requires_the_bearer_token(start_gateway, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with restartable_backend() as raw:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("rs", raw)], "admin": {"tokenEnv": TOKEN_ENV}})
        for token in (None, "wrong", TOKEN + "x", ""):
            response = admin_get(gateway, token=token)
            assert response.status_code == 401, token
            assert response.headers.get("WWW-Authenticate", "").startswith("Bearer"), response.headers
            assert TOKEN not in response.text
        basic = requests.get(gateway.base + "/admin/state", headers={"Authorization": f"Basic {TOKEN}"}, timeout=10)
        assert basic.status_code == 401
        assert admin_get(gateway, token=TOKEN).status_code == 200


def test_admin_state_describes_sessions_and_backends(start_gateway, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with sdk_backend("alpha") as alpha, restartable_backend() as raw:
        gateway = start_gateway(
            {
                "name": "t",
                "backends": [backend_entry("alpha", alpha), backend_entry("rs", raw)],
                "admin": {"tokenEnv": TOKEN_ENV},
            }
        )
        sid = gateway.initialize()
        answer = gateway.rpc(sid, "tools/list")
        assert answer["result"]["tools"]

        response = admin_get(gateway, token=TOKEN)
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("application/json")
        state = response.json()
        assert isinstance(state["uptime"], (int, float)) and state["uptime"] >= 0
        (session,) = state["sessions"]
        assert session["id"] == sid
        assert session["subject"] == "anonymous"
        assert isinstance(session["created"], (int, float))
        backends = {b["backend"]: b for b in session["backends"]}
        assert set(backends) == {"alpha", "rs"}
        for entry in backends.values():
            assert set(entry) >= {"backend", "state", "protocolVersion", "tools", "resources", "prompts", "lastError"}
            assert entry["state"] == "ready"
            assert entry["protocolVersion"]
            assert entry["lastError"] is None
        assert (backends["alpha"]["tools"], backends["alpha"]["resources"], backends["alpha"]["prompts"]) == (6, 2, 1)
        assert (backends["rs"]["tools"], backends["rs"]["resources"], backends["rs"]["prompts"]) == (2, 0, 0)

        text = response.text
        assert TOKEN not in text
        for backend in (alpha, raw):
            assert backend.url not in text
            assert f":{backend.port}" not in text
        assert "127.0.0.1" not in text and "http" not in text


def test_admin_state_lists_sessions_before_discovery(start_gateway, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with restartable_backend() as raw:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("rs", raw)], "admin": {"tokenEnv": TOKEN_ENV}})
        one, two = gateway.initialize(), gateway.initialize()
        state = admin_get(gateway, token=TOKEN).json()
        assert sorted(s["id"] for s in state["sessions"]) == sorted([one, two])
        # A session's user starts at its first request: until then it holds no connection.
        assert [session["backends"] for session in state["sessions"]] == [[], []]
        assert gateway.rpc(one, "ping")["result"] == {}
        state = admin_get(gateway, token=TOKEN).json()
        backends = {s["id"]: [(b["backend"], b["state"]) for b in s["backends"]] for s in state["sessions"]}
        assert backends == {one: [("rs", "new")], two: []}
        assert raw.received == []  # asking for the state contacts no backend


def test_token_env_set_but_variable_missing_is_a_config_error(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    config = config_from_mapping(
        {"name": "t", "backends": [{"name": "x", "url": "http://127.0.0.1:9/mcp"}], "admin": {"tokenEnv": TOKEN_ENV}}
    )
    with pytest.raises(ConfigError) as raised:
        create_app(start_runtime(config))
    assert "admin.tokenEnv" in str(raised.value)
    assert TOKEN_ENV in str(raised.value)


def test_one_info_line_per_mcp_request(start_gateway, caplog):
    caplog.set_level(logging.INFO, logger="vmcp_actors")
    with sdk_backend("alpha", tools=("echo",)) as alpha, sse_backend() as sse:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("alpha", alpha), backend_entry("sse", sse)]})
        sid = gateway.initialize()
        gateway.rpc(sid, "tools/list")
        gateway.rpc(sid, "tools/call", {"name": "alpha_echo", "arguments": {"text": "x"}})
        gateway.rpc(sid, "tools/call", {"name": "no_such_tool", "arguments": {}})
        streamed = gateway.post(
            {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
             "params": {"name": "sse_echo", "arguments": {"text": "s"}, "_meta": {"progressToken": 1}}},
            sid,
        )
        assert streamed.headers["Content-Type"].startswith("text/event-stream")

        def request_lines():
            return [r for r in caplog.records if r.name == "vmcp_actors.requests"]

        # the streamed request is logged when its stream ends
        assert wait_until(lambda: len(request_lines()) >= 6, timeout=3)
        lines = request_lines()
        methods = [r.getMessage().split()[0] for r in lines]
        assert methods == [
            "initialize", "notifications/initialized", "tools/list", "tools/call", "tools/call", "tools/call"
        ], methods
        for record in lines:
            assert record.levelno == logging.INFO
            message = record.getMessage()
            assert sid[:8] in message
            assert "duration" in message

        for record in caplog.records:
            assert sid not in record.getMessage()
            assert sid not in str(record.args)
        assert sid not in caplog.text


def test_rejected_requests_are_logged_too(start_gateway, caplog):
    """Operators see every MCP request, including ones the gateway turns away (expired sessions)."""
    caplog.set_level(logging.INFO, logger="vmcp_actors")
    with restartable_backend() as raw:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("rs", raw)]})
        unknown = "0123456789abcdef" * 2
        response = gateway.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, unknown)
        assert response.status_code == 404
        lines = [r.getMessage() for r in caplog.records if r.name == "vmcp_actors.requests"]
        assert len(lines) == 1, lines
        assert lines[0].split()[0] == "tools/list"
        assert "404" in lines[0] and unknown[:8] in lines[0] and "duration" in lines[0]
        assert unknown not in caplog.text


def test_requests_while_the_actor_system_is_down_get_503_not_500(start_gateway):
    import pykka

    with sdk_backend("alpha", tools=("echo",)) as alpha:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("alpha", alpha)]})
        sid = gateway.initialize()
        pykka.ActorRegistry.stop_all()  # as during shutdown
        deleted = requests.delete(gateway.url, headers={"Mcp-Session-Id": sid}, timeout=10)
        assert deleted.status_code == 503
        opened = gateway.post({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                               "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                          "clientInfo": {"name": "t", "version": "1"}}})
        assert opened.status_code == 503
        assert requests.get(gateway.base + "/readyz", timeout=10).status_code == 503
