"""Health checks of process backends (issue 23, item 7): a stdio backend is checked without
starting anything or keeping anything alive (its command is found; its live children answer
``ping``; none waits out a back-off after a crash). Real official-SDK servers over stdio,
the gateway on a real HTTP server, the admin state read as an operator does."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.gateway import admin_get, answer_of, wait_until
from tests.ports import free_port
from vmcp_actors.backends._stdio import ChildProcesses, user_digest
from vmcp_actors.config import config_from_mapping
from vmcp_actors.web._installed import EXTENSION_KEY

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
ADMIN_ENV, ADMIN_TOKEN = "PROCESS_HEALTH_ADMIN_TOKEN", "proc-health-adm1n-Q7"
SERVER = textwrap.dedent('''
    import os, sys
    from mcp.server.mcpserver import MCPServer
    srv = MCPServer("stdio-echo")

    @srv.tool()
    def echo(text: str) -> str:
        return f"echo:{text}"

    @srv.tool()
    def crash() -> str:
        os._exit(3)

    srv.run("stdio")
''')


@pytest.fixture(autouse=True)
def admin_token(monkeypatch):
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "echo_server.py"
    path.write_text(SERVER, encoding="utf-8")
    return path


def gateway_for(start_gateway, backend: dict, **failure_handling: Any) -> Any:
    return start_gateway({"name": "t", "backends": [backend], "admin": {"tokenEnv": ADMIN_ENV},
                          "operational": {"timeouts": {"default": "10s"}, "failureHandling": {
                              "healthCheckInterval": "300ms", "healthCheckTimeout": "300ms", "unhealthyThreshold": 1,
                              **failure_handling}}})


def row(gateway, backend: str = "echo") -> dict:
    return admin_get(gateway, token=ADMIN_TOKEN).json()["backendHealth"].get(backend, {})


def _checked_after(gateway, since: float) -> dict | None:
    """The health row if its last check ran after ``since`` (time.monotonic(): the gateway
    runs in this process); else None."""
    asked = time.monotonic()  # the gateway's "now" is no earlier, so the check ran at or after asked - ago
    current = row(gateway)
    ago = current.get("lastCheckSecondsAgo")
    return current if ago is not None and asked - ago > since + 0.001 else None  # (ago is rounded to 1 ms)


def checks_after(gateway, count: int = 2) -> dict:
    """The health row once ``count`` more checks than now have run (a wait for the checks
    themselves, every 300 ms, not for a guessed time)."""
    current: dict | None = None
    for _ in range(count):
        since = time.monotonic()
        current = wait_until(lambda since=since: _checked_after(gateway, since), timeout=10)
        assert current, row(gateway)
    assert current is not None
    return current


def session_call(gateway, tool: str, arguments: dict) -> dict:
    session_id = gateway.initialize()
    return gateway.rpc(session_id, "tools/call", {"name": tool, "arguments": arguments})


def test_checks_start_no_process_and_keep_none_alive(start_gateway, script):
    gateway = gateway_for(start_gateway, {"name": "echo", "transport": "stdio", "command": sys.executable,
                                          "args": [str(script)]})
    processes = gateway.app.extensions[EXTENSION_KEY].processes
    assert wait_until(lambda: row(gateway).get("state") == "healthy", timeout=10), row(gateway)
    checked = checks_after(gateway, 3)  # several checks
    assert processes.live_count() == 0 and checked["lastCheckMs"] is None  # nothing started, nothing pinged

    assert session_call(gateway, "echo_echo", {"text": "x"})["result"]["content"][0]["text"] == "echo:x"
    (child,) = processes._children.values()
    used = child.bus.last_used
    assert wait_until(lambda: row(gateway).get("lastCheckMs") is not None, timeout=10), row(gateway)  # pinged
    checked = checks_after(gateway, 3)  # and pinged again
    assert checked["lastCheckMs"] is not None
    assert child.bus.last_used == used  # the pings are no use: the idle timeout still stops the child
    # The pings passed ("degraded": one slower than half the 300 ms timeout, as under load).
    assert checked["state"] in ("healthy", "degraded") and checked["failedChecksInARow"] == 0, checked


def test_a_crash_shows_until_the_back_off_ends(start_gateway, script):
    gateway = gateway_for(start_gateway, {"name": "echo", "transport": "stdio", "command": sys.executable,
                                          "args": [str(script)]})
    assert wait_until(lambda: row(gateway).get("state") == "healthy", timeout=10)
    session_id = gateway.initialize()
    crashed = gateway.rpc(session_id, "tools/call", {"name": "echo_crash", "arguments": {}})
    assert "error" in crashed or crashed["result"].get("isError"), crashed
    assert wait_until(lambda: row(gateway).get("state") == "unhealthy", timeout=10), row(gateway)
    assert "exited with code 3" in row(gateway)["lastError"]
    # The back-off (1 s after a first crash) ends; nothing runs, nothing is in back-off: healthy.
    assert wait_until(lambda: row(gateway).get("state") == "healthy", timeout=10), row(gateway)
    answer = gateway.rpc(session_id, "tools/call", {"name": "echo_echo", "arguments": {"text": "y"}})
    assert answer["result"]["content"][0]["text"] == "echo:y"


def test_a_command_that_cannot_run_is_unhealthy(start_gateway, tmp_path):
    missing = tmp_path / "no-such-server"
    gateway = gateway_for(start_gateway, {"name": "echo", "transport": "stdio", "command": str(missing)})
    assert wait_until(lambda: row(gateway).get("state") == "unhealthy", timeout=10), row(gateway)
    assert "cannot be run" in row(gateway)["lastError"] and str(tmp_path) not in str(row(gateway))
    session_id = gateway.initialize()
    refused = gateway.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, session_id)
    assert refused.status_code == 503 and "error" in answer_of(refused)


def test_a_per_user_backend_fails_only_when_none_of_its_children_answers(script):
    config = config_from_mapping({"name": "t", "backends": [{
        "name": "echo", "transport": "stdio", "scope": "perUser", "command": sys.executable, "args": [str(script)]}]})
    backend = config.backends[0]
    processes = ChildProcesses(config)
    try:
        views = {person: processes.client(backend, ("https://idp.example", person)) for person in ("alice", "bob")}
        for view in views.values():
            assert "result" in view.post(INITIALIZE, session_id=None, protocol_version=None, timeout=20).message
        assert processes.check(backend, 5)[0] is True
        children = {child.user: child for child in processes._children.values()}
        alice, bob = (children[user_digest(("https://idp.example", person))] for person in ("alice", "bob"))
        os.kill(alice.link.pid, signal.SIGKILL)  # one user's child crashed: that is not everyone's backend
        assert wait_until(lambda: alice.bus.restarting() is not None, timeout=10)
        passed, latency, error = processes.check(backend, 5)
        assert passed and latency is not None and error is None
        os.kill(bob.link.pid, signal.SIGKILL)  # none answers now
        assert wait_until(lambda: bob.bus.restarting() is not None, timeout=10)
        passed, latency, error = processes.check(backend, 5)
        assert not passed and "killed by signal 9" in error and "(and 1 more)" in error
    finally:
        processes.stop_all()


def test_a_legacy_sse_backend_is_checked_on_its_own_stream(start_gateway):
    import threading

    import uvicorn
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("sse-echo")

    @server.tool()
    def echo(text: str) -> str:
        return f"echo:{text}"

    port = free_port()
    running = uvicorn.Server(uvicorn.Config(server.sse_app(), host="127.0.0.1", port=port, log_level="warning",
                                            timeout_graceful_shutdown=1))
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    assert wait_until(lambda: running.started, timeout=10)
    try:
        gateway = gateway_for(start_gateway, {"name": "old", "transport": "sse", "url": f"http://127.0.0.1:{port}/sse"})
        assert wait_until(lambda: row(gateway, "old").get("lastCheckMs") is not None, timeout=10), row(gateway, "old")
        assert row(gateway, "old")["state"] in ("healthy", "degraded")
    finally:
        running.should_exit = True
        thread.join(timeout=10)
    assert wait_until(lambda: row(gateway, "old").get("state") == "unhealthy", timeout=10), row(gateway, "old")
    assert f"127.0.0.1:{port}" not in str(row(gateway, "old"))  # never a backend's URL
