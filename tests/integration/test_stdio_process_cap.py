"""operational.maxProcesses with perUser stdio backends (issue 23): what bench.stdio_echo's
crowd part found, as tests. The backend is the official-SDK test server
(``tests.backends.build_sdk_server``) speaking MCP over stdio, one process per user.

Each was a bug the benchmark found: children started at once passed the cap, a child still
initializing was stopped to make room, a send to a stopped child was an internal error, and
a child stopped to make room was still exiting when the next one started.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.gateway import answer_of, wait_until
from tests.idp import LocalIdP
from vmcp_actors.backends import _stdio
from vmcp_actors.backends._bus import MessageBus
from vmcp_actors.backends._stdio import ChildProcesses
from vmcp_actors.config import config_from_mapping
from vmcp_actors.core._aggregated import NO_BACKENDS_RETRY_AFTER
from vmcp_actors.exceptions import BackendError

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ROOT = Path(__file__).resolve().parents[2]
SERVER = "from tests.backends import build_sdk_server; build_sdk_server('echo', tools=['echo', 'sleep']).run('stdio')"
AUDIENCE = "vmcp"
INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
# The same server with a tool ``hold(marker)`` that writes MARKER.started and answers once
# MARKER.release exists: a call in flight until the test lets it end (files: it is another process).
HELD_SERVER = (
    "import os, anyio\n"
    "from tests.backends import build_sdk_server\n"
    "async def hold(marker: str) -> str:\n"
    "    'Mark the call started; answer once the test releases it'\n"
    "    open(marker + '.started', 'w').close()\n"
    "    with anyio.move_on_after(30):\n"
    "        while not os.path.exists(marker + '.release'):\n"
    "            await anyio.sleep(0.01)\n"
    "    return 'released'\n"
    "build_sdk_server('echo', tools=['echo'], extra_tools=[hold]).run('stdio')\n"
)


def per_user_backend(server: str = SERVER) -> dict[str, Any]:
    return {"name": "echo", "transport": "stdio", "scope": "perUser", "command": sys.executable,
            "args": ["-c", server], "cwd": str(ROOT)}


class Held:
    """A call of ``echo_hold`` on its own thread: ``started`` once the backend runs it,
    answered once ``release()`` is called."""

    def __init__(self, caller: Any, marker: Path) -> None:
        self._marker = marker
        self._thread = threading.Thread(target=caller.call, args=("echo_hold", {"marker": str(marker)}))
        self._thread.start()

    def started(self) -> bool:
        return self._marker.with_name(self._marker.name + ".started").exists()

    def release(self) -> None:
        self._marker.with_name(self._marker.name + ".release").touch()
        self._thread.join(30)


def test_children_started_at_once_stay_within_max_processes(monkeypatch):
    config = config_from_mapping({"name": "t", "operational": {"maxProcesses": 2}, "backends": [per_user_backend()]})
    processes = ChildProcesses(config)
    views = [processes.client(config.backends[0], ("https://idp.example", f"user-{i}")) for i in range(4)]
    outcomes: list[Any] = [None] * len(views)
    start = threading.Barrier(len(views))
    forking: list[int] = []  # starts past the room check, their child not yet forked
    spawn = _stdio._spawn

    def slow_spawn(*args: Any) -> Any:
        # A slow fork (a big, busy gateway forks slowly) at its slowest: no child exists
        # until every start has either got this far or been refused (a start that waited
        # for a place instead would hold this up 5 s, no more).
        forking.append(1)
        wait_until(lambda: len(forking) + sum(isinstance(o, _stdio.ProcessesBusy) for o in outcomes) == 4, timeout=5)
        return spawn(*args)

    monkeypatch.setattr(_stdio, "_spawn", slow_spawn)

    def initialize(index: int) -> None:
        start.wait()
        try:
            outcomes[index] = views[index].post(INITIALIZE, session_id=None, protocol_version=None, timeout=20).message
        except _stdio.ProcessesBusy as refused:  # a refusal at the cap is fine; too many children is not
            outcomes[index] = refused

    threads = [threading.Thread(target=initialize, args=(i,)) for i in range(len(views))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        started = [outcome for outcome in outcomes if isinstance(outcome, dict)]
        assert started, outcomes
        assert processes.live_count() <= 2, f"{processes.live_count()} children live: {outcomes}"
    finally:
        processes.stop_all()


@pytest.fixture
def idp():
    provider = LocalIdP("cap-idp").start()
    yield provider
    provider.stop()


class Caller:
    """One user's session on the gateway, raw JSON-RPC."""

    def __init__(self, gateway: Any, token: str):
        self.gateway = gateway
        self.headers = {"Authorization": f"Bearer {token}"}
        response = gateway.post(INITIALIZE, headers=self.headers)
        assert response.status_code == 200, response.text
        self.session = response.headers["Mcp-Session-Id"]
        gateway.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, self.session, headers=self.headers)

    def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        return self.gateway.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                  "params": {"name": tool, "arguments": arguments}}, self.session, headers=self.headers)


def test_a_call_refused_because_every_process_is_busy_is_a_503_with_retry_after(start_gateway, idp, tmp_path):
    gateway = start_gateway({"name": "t", "operational": {"maxProcesses": 1},
                             "backends": [{**per_user_backend(HELD_SERVER), "sandbox": {"writable": [str(tmp_path)]}}],
                             "incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUDIENCE}}})
    alice, bob = (Caller(gateway, idp.issue_token(person, AUDIENCE)) for person in ("alice", "bob"))
    assert answer_of(bob.call("echo_echo", {"text": "b"}))["result"]["content"][0]["text"] == "echo:b"

    held = Held(alice, tmp_path / "alice")  # bob's idle child makes room for alice's, busy until released
    try:
        assert wait_until(held.started, timeout=30)  # alice's call is in flight on the only process
        refused = bob.call("echo_echo", {"text": "b"})
        assert "error" in answer_of(refused) and "busy" in answer_of(refused)["error"]["message"]
        assert refused.status_code == 503
        assert refused.headers.get("Retry-After") == str(_stdio.BUSY_RETRY_AFTER)
    finally:
        held.release()


def _started(processes: ChildProcesses, owner: tuple[str, str]) -> tuple[Any, Any]:
    """A view of the perUser backend for ``owner``, initialized (its child up); (view, answer)."""
    view = processes.client(processes._config.backends[0], owner)
    return view, view.post(INITIALIZE, session_id=None, protocol_version=None, timeout=20).message


def test_sending_to_a_stopped_child_is_a_backend_error():
    config = config_from_mapping({"name": "t", "backends": [per_user_backend()]})
    processes = ChildProcesses(config)
    try:
        _, answer = _started(processes, ("https://idp.example", "alice"))
        assert "result" in answer
        (child,) = processes._children.values()
        link = child.link
        link.close()
        try:
            link.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        except BackendError:
            pass  # what a caller of a Link expects
        except Exception as error:  # the bug: anything else
            raise AssertionError(f"send on a stopped child raised {type(error).__name__}: {error}") from error
    finally:
        processes.stop_all()


def test_a_child_still_initializing_is_not_stopped_to_make_room(monkeypatch):
    config = config_from_mapping({"name": "t", "operational": {"maxProcesses": 1}, "backends": [per_user_backend()]})
    initialize_link = MessageBus._initialize_link
    gap, bob_tried = threading.Event(), threading.Event()

    def after_a_gap(self, *args):
        # Holds the window between `child.link = link` and initialize going out (the first
        # start's, alice's) open until bob's start has been refused (were bob to wait for a
        # place instead, alice's start goes on after 5 s and bob's after it).
        if not gap.is_set():
            gap.set()
            bob_tried.wait(5)
        return initialize_link(self, *args)

    monkeypatch.setattr(MessageBus, "_initialize_link", after_a_gap)
    processes = ChildProcesses(config)
    outcomes: dict[str, Any] = {}

    def start(person: str) -> None:
        try:
            outcomes[person] = _started(processes, ("https://idp.example", person))[1]
        except Exception as error:  # noqa: BLE001 - recorded for the assertions
            outcomes[person] = error

    alice = threading.Thread(target=start, args=("alice",))
    try:
        alice.start()
        assert gap.wait(20)
        try:
            start("bob")  # at the cap while alice's child starts: bob is refused, or waits; alice's start goes on
        finally:
            bob_tried.set()
        alice.join(30)
        assert isinstance(outcomes["alice"], dict) and "result" in outcomes["alice"], outcomes
    finally:
        processes.stop_all()


def test_discovery_refused_because_every_process_is_busy_is_a_503_with_retry_after(start_gateway, idp, tmp_path):
    gateway = start_gateway({"name": "t", "operational": {"maxProcesses": 1},
                             "backends": [{**per_user_backend(HELD_SERVER), "sandbox": {"writable": [str(tmp_path)]}}],
                             "incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUDIENCE}}})
    alice = Caller(gateway, idp.issue_token("alice", AUDIENCE))
    held = Held(alice, tmp_path / "alice")
    try:
        assert wait_until(held.started, timeout=30)  # alice's call is in flight on the only process there may be
        bob = Caller(gateway, idp.issue_token("bob", AUDIENCE))  # opening a session contacts no backend
        refused = gateway.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, bob.session, headers=bob.headers)
        assert refused.status_code == 503, refused.text
        assert refused.headers.get("Retry-After") == str(NO_BACKENDS_RETRY_AFTER)
        assert answer_of(refused)["error"]["data"]["retryAfterSeconds"] == NO_BACKENDS_RETRY_AFTER
    finally:
        held.release()
    listed = gateway.post({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, bob.session, headers=bob.headers)
    assert [tool["name"] for tool in answer_of(listed)["result"]["tools"]] == ["echo_echo", "echo_hold"]


# Ignores SIGTERM and takes half a second to exit once its input ends: a child slow to go
# (the sleep is the behaviour under test: the gateway must wait for that exit).
SLOW_EXIT = "import atexit, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); atexit.register(time.sleep, 0.5); "


def _running(pid: int) -> bool:
    """The process exists and has not exited (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def _running_at_each_spawn(monkeypatch, pid: int) -> list[bool]:
    """Whether ``pid`` was still running when each later child was forked, appended as they are."""
    seen: list[bool] = []
    spawn = _stdio._spawn

    def spawn_and_look(*args: Any) -> Any:
        seen.append(_running(pid))
        return spawn(*args)

    monkeypatch.setattr(_stdio, "_spawn", spawn_and_look)
    return seen


def test_a_child_stopped_to_make_room_has_exited_before_the_next_starts(monkeypatch):
    # bench.stdio_echo's crowd saw 21 children with maxProcesses 20: a child stopped to make
    # room was still exiting when the next one started.
    backend = {**per_user_backend(), "args": ["-c", SLOW_EXIT + SERVER]}
    config = config_from_mapping({"name": "t", "operational": {"maxProcesses": 1}, "backends": [backend]})
    processes = ChildProcesses(config)
    try:
        _, answer = _started(processes, ("https://idp.example", "alice"))
        assert "result" in answer
        (alice,) = processes._children.values()
        running_at_spawn = _running_at_each_spawn(monkeypatch, alice.link.pid)
        _, answer = _started(processes, ("https://idp.example", "bob"))  # alice's idle child makes room
        assert "result" in answer
        assert running_at_spawn == [False], "alice's child was still running when bob's started"
        assert processes.live_count() == 1
    finally:
        processes.stop_all()


def test_a_child_stopping_because_its_user_left_counts_until_it_has_exited(monkeypatch):
    # A released user's child is taken out of the table at once but exits later: a start
    # meanwhile waits for it (within the call's deadline) rather than run one over the cap.
    backend = {**per_user_backend(), "args": ["-c", SLOW_EXIT + SERVER]}
    config = config_from_mapping({"name": "t", "operational": {"maxProcesses": 1}, "backends": [backend]})
    processes = ChildProcesses(config)
    try:
        alice_view, answer = _started(processes, ("https://idp.example", "alice"))
        assert "result" in answer
        (alice,) = processes._children.values()
        running_at_spawn = _running_at_each_spawn(monkeypatch, alice.link.pid)
        alice_view.close()  # alice is released: her child is stopping (it takes SLOW_EXIT's time)
        assert processes.live_count() == 1
        _, answer = _started(processes, ("https://idp.example", "bob"))
        assert "result" in answer
        assert running_at_spawn == [False], "alice's child was still running when bob's started"
        assert processes.live_count() == 1
    finally:
        processes.stop_all()
