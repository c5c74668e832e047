"""When children stop (issue 23, item 1): a shared child idle past
``operational.processIdleTimeout`` (one with a call in flight is kept), a perUser child
when its user's last channel is done; and the next use starts a new one that works. The
backend is the official-SDK test server over stdio."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.gateway import wait_until
from vmcp_actors.backends import _stdio
from vmcp_actors.backends._stdio import ChildProcesses
from vmcp_actors.config import config_from_mapping

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ROOT = Path(__file__).resolve().parents[2]
SERVER = "from tests.backends import build_sdk_server; build_sdk_server('echo', tools=['echo', 'sleep']).run('stdio')"
INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


def backend(scope: str) -> dict[str, Any]:
    return {"name": "echo", "transport": "stdio", "scope": scope, "command": sys.executable,
            "args": ["-c", SERVER], "cwd": str(ROOT)}


def call(view: Any, tool: str, arguments: dict) -> dict:
    return view.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}},
                     session_id=None, protocol_version=None, timeout=20).message


def started(processes: ChildProcesses, owner: tuple[str, str] | None = None) -> Any:
    view = processes.client(processes._config.backends[0], owner)
    assert "result" in view.post(INITIALIZE, session_id=None, protocol_version=None, timeout=20).message
    return view


def pid_of(processes: ChildProcesses) -> int:
    (child,) = processes._children.values()
    return child.link.pid


def gone(pid: int) -> bool:
    """Exited and reaped: no zombie left either."""
    return not os.path.exists(f"/proc/{pid}")


def test_a_shared_child_idle_past_the_timeout_is_stopped_and_the_next_use_starts_another(monkeypatch):
    monkeypatch.setattr(_stdio, "IDLE_SWEEP", 0.2)
    config = config_from_mapping({"name": "t", "operational": {"processIdleTimeout": "1s"},
                                  "backends": [backend("shared")]})
    processes = ChildProcesses(config)
    try:
        view = started(processes)
        first = pid_of(processes)
        answers: list[tuple[dict, int]] = []
        # A call in flight past the timeout (the sleep is the behaviour: longer than the 1 s
        # idle timeout and a few 0.2 s sweeps): the child is kept, so the call is answered
        # (a child stopped under it would fail it), and it is still the first child after.
        sleeping = threading.Thread(target=lambda: answers.append((call(view, "sleep", {"seconds": 2}),
                                                                   pid_of(processes))))
        sleeping.start()
        sleeping.join(20)
        assert answers and answers[0][0]["result"]["content"][0]["text"] == "slept", answers
        assert answers[0][1] == first
        assert wait_until(lambda: processes.live_count() == 0, timeout=10)  # then idle for 1 s: stopped
        assert wait_until(lambda: gone(first), timeout=10)
        assert call(view, "echo", {"text": "again"})["result"]["content"][0]["text"] == "echo:again"
        assert pid_of(processes) != first
    finally:
        processes.stop_all()


def test_a_per_user_child_stops_when_its_users_last_channel_is_done():
    config = config_from_mapping({"name": "t", "backends": [backend("perUser")]})
    processes = ChildProcesses(config)
    try:
        owner = ("https://idp.example", "alice")
        first, second = started(processes, owner), started(processes, owner)
        pid = pid_of(processes)
        first.close()
        assert processes.live_count() == 1  # another channel of the same user still uses it
        second.close()
        assert wait_until(lambda: processes.live_count() == 0, timeout=10) and wait_until(lambda: gone(pid), timeout=10)
        again = started(processes, owner)
        assert call(again, "echo", {"text": "x"})["result"]["content"][0]["text"] == "echo:x"
        assert pid_of(processes) != pid
    finally:
        processes.stop_all()
