"""Graceful drain (issue 14, item 7): on SIGTERM /readyz turns 503 and new sessions are
refused, a call in flight finishes, then the actors stop and the backend sessions get
their DELETE. Real processes: `vmcp-actors serve` under gunicorn, a raw backend."""

from __future__ import annotations

import signal
import threading

import pytest
import requests

from tests.backends import restartable_backend
from tests.gateway import backend_entry, wait_until
from tests.integration.test_cli import VMCP, CliProcess, write_config
from tests.integration.test_identity import INIT
from tests.ports import free_port

pytestmark = pytest.mark.slow  # whole gateway processes (docs/testing.md)

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
def backend():
    served = restartable_backend("rs")
    yield served
    served.stop()


def test_draining_refuses_new_sessions_and_turns_readyz_503(start_gateway, backend):
    gateway = start_gateway({"name": "drain", "backends": [backend_entry("rs", backend)]})
    session = gateway.initialize()
    assert requests.get(gateway.base + "/readyz", timeout=30).status_code == 200
    stream = requests.get(gateway.url, headers={**HEADERS, "Accept": "text/event-stream", "Mcp-Session-Id": session,
                                                "MCP-Protocol-Version": "2025-11-25"}, stream=True, timeout=10)
    assert stream.status_code == 200
    ended = threading.Event()
    threading.Thread(target=lambda: (list(stream.iter_content(chunk_size=None)), ended.set()), daemon=True).start()
    gateway.app.extensions["vmcp_actors"].drain()
    assert ended.wait(30)  # the standalone stream ends: its client reconnects to another process
    ready = requests.get(gateway.base + "/readyz", timeout=30)
    assert (ready.status_code, ready.json()) == (503, {"status": "draining"})
    refused = gateway.post(INIT)
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
    assert "shutting down" in refused.json()["error"]["message"]
    # A session already open is still served while the process drains.
    answer = gateway.rpc(session, "tools/call", {"name": "rs_echo", "arguments": {"text": "still"}})
    assert answer["result"]["content"][0]["text"] == "rs:still"


def held_sleeps(backend) -> threading.Event:
    """The backend's ``sleep`` tool, held instead until the returned event is set (at most
    30 s): a call in flight for as long as the test needs, not for a guessed time."""
    import asyncio

    answer = backend.handlers["tools/call"]
    released = threading.Event()

    async def call_tool(call):
        if call.params.get("name") == "sleep":
            await asyncio.get_running_loop().run_in_executor(None, released.wait, 30)
        return await answer(call)

    backend.handlers["tools/call"] = call_tool
    return released


def test_sigterm_lets_a_call_in_flight_finish_then_ends_the_backend_session(tmp_path, backend):
    released = held_sleeps(backend)
    port = free_port()
    path = write_config(tmp_path / "config.yaml", {
        "name": "drain", "backends": [backend_entry("rs", backend)],
        "operational": {"shutdownGracePeriod": "20s"}})
    with CliProcess([VMCP, "serve", "--config", str(path), "--port", str(port)], tmp_path, "serve") as served:
        base = f"http://127.0.0.1:{port}"
        served.wait_ready(base)
        url = base + "/mcp"
        opened = requests.post(url, json=INIT, headers=HEADERS, timeout=30)
        session = {**HEADERS, "Mcp-Session-Id": opened.headers["Mcp-Session-Id"], "MCP-Protocol-Version": "2025-11-25"}
        requests.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session, timeout=10)
        answers: list[requests.Response] = []

        def slow_call() -> None:
            answers.append(requests.post(url, json={"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
                "name": "rs_sleep", "arguments": {"seconds": 0}}}, headers=session, timeout=60))

        caller = threading.Thread(target=slow_call)
        caller.start()
        try:
            assert wait_until(lambda: backend.requests("tools/call"), timeout=30)  # the call is at the backend
            (backend_session,) = backend.sessions
            served.proc.send_signal(signal.SIGTERM)
            assert wait_until(lambda: "draining: new sessions are refused" in served.stderr, timeout=30)
            assert not answers  # the drain began with the call in flight
        finally:
            released.set()
        caller.join(timeout=30)
        assert answers and answers[0].status_code == 200, answers
        assert answers[0].json()["result"]["content"][0]["text"] == "slept"
        assert served.proc.wait(timeout=30) == 0
        assert backend_session in backend.deleted_sessions  # the worker ended it on the way out


def test_the_grace_period_is_checked_in_the_config():
    from vmcp_actors.config import config_from_mapping
    from vmcp_actors.exceptions import ConfigError

    base = {"name": "x", "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}]}
    assert config_from_mapping(base).operational.shutdown_grace_period == 30.0
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({**base, "operational": {"shutdownGracePeriod": "2h"}})
    assert "operational.shutdownGracePeriod" in str(caught.value)
