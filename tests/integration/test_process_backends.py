"""Backends as processes (issue 23): a stdio server the gateway starts, compared with a
direct stdio connection of the same client, and what happens when the child misbehaves
(it crashes, never answers, writes garbage). Real official SDK servers, the official SDK
client, the gateway on a real HTTP server. (2024-11-05 HTTP+SSE servers: test_sse_backends.py.)"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import mcp
import pytest

from tests.gateway import wait_until
from vmcp_actors.web._installed import EXTENSION_KEY

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SERVER = textwrap.dedent('''
    import os, sys
    from mcp.server.mcpserver import MCPServer
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "mute":  # reads, never answers
        for _ in sys.stdin:
            pass
        sys.exit(0)
    if mode == "garbage":  # noise on stdout before and between answers
        print("starting up...", flush=True)
    srv = MCPServer("stdio-echo", instructions="echo over stdio")

    @srv.tool()
    def echo(text: str) -> str:
        """Echo the text."""
        if mode == "garbage":
            print("{not json", flush=True)
        return f"echo:{text}"

    @srv.tool()
    def env(name: str) -> str:
        """A variable of this process's environment."""
        return os.environ.get(name, "<unset>")

    @srv.tool()
    def crash() -> str:
        """Exit at once."""
        os._exit(3)

    @srv.tool()
    def pid() -> int:
        return os.getpid()

    srv.run("stdio")
''')


@pytest.fixture
def server_script(tmp_path: Path) -> Path:
    path = tmp_path / "echo_server.py"
    path.write_text(SERVER, encoding="utf-8")
    return path


@pytest.fixture
def gateway_with(start_gateway):
    """Start a gateway for one stdio backend; its children are stopped after the test."""
    started: list[Any] = []

    def start(backend: dict, **extra: Any) -> Any:
        gateway = start_gateway({"name": "t", "backends": [backend], **extra})
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        processes = gateway.app.extensions[EXTENSION_KEY].processes
        if processes is not None:
            processes.stop_all()


def stdio_backend(script: Path, *args: str, **fields: Any) -> dict:
    return {"name": "echo", "transport": "stdio", "command": sys.executable, "args": [str(script), *args], **fields}


def session(url_or_params: Any, mode: str, steps) -> Any:
    async def main() -> Any:
        async with mcp.Client(url_or_params, mode=mode) as client:
            return await steps(client)

    return asyncio.run(asyncio.wait_for(main(), 30))


def call(name: str, arguments: dict | None = None):
    async def steps(client) -> Any:
        result = (await client.call_tool(name, arguments or {})).model_dump(mode="json", exclude_none=True)
        meta = result.get("meta") or {}
        meta.pop("io.modelcontextprotocol/serverInfo", None)  # the server's identity: the gateway's own
        if not meta:
            result.pop("meta", None)
        return result

    return steps


async def listed(client) -> list[dict]:
    return [tool.model_dump(mode="json", exclude_none=True) for tool in (await client.list_tools()).tools]


def without_prefix(tools: list[dict]) -> list[dict]:
    return [{**tool, "name": tool["name"].removeprefix("echo_")} for tool in tools]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_stdio_server_answers_through_the_gateway_as_directly(gateway_with, server_script, mode):
    gateway = gateway_with(stdio_backend(server_script))
    direct = mcp.StdioServerParameters(command=sys.executable, args=[str(server_script)])
    assert without_prefix(session(gateway.url, mode, listed)) == session(direct, mode, listed)
    assert session(gateway.url, mode, call("echo_echo", {"text": "hi"})) == \
        session(direct, mode, call("echo", {"text": "hi"}))


def test_the_child_gets_only_what_config_names(gateway_with, server_script, monkeypatch):
    monkeypatch.setenv("VMCP_TEST_GATEWAY_SECRET", "do-not-leak-7f3a")
    monkeypatch.setenv("VMCP_ADMIN_TOKEN_FOR_TEST", "admin-token-do-not-leak")
    gateway = gateway_with(stdio_backend(server_script, env={"GREETING": "hello"}),
                           admin={"tokenEnv": "VMCP_ADMIN_TOKEN_FOR_TEST"})

    def seen(name: str) -> str:
        return session(gateway.url, "legacy", call("echo_env", {"name": name}))["content"][0]["text"]

    assert seen("GREETING") == "hello"
    assert seen("PATH") == os.environ["PATH"]
    assert seen("VMCP_TEST_GATEWAY_SECRET") == "<unset>"
    assert seen("VMCP_ADMIN_TOKEN_FOR_TEST") == "<unset>"
    assert seen("HOME") == "/tmp/home"  # its sandbox's own, not the gateway's
    session(gateway.url, "legacy", call("echo_pid"))
    (child,) = gateway.app.extensions[EXTENSION_KEY].processes.snapshot()
    for pid in (child.pid, *descendants(child.pid)):  # the sandbox's launcher and the server it runs
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        names = sorted(entry.split(b"=", 1)[0].decode() for entry in environ if entry)
        assert set(names) <= {"PATH", "HOME", "LANG", "GREETING", "PWD"}, names  # (bwrap sets PWD)


def test_a_crashed_child_is_restarted_and_the_next_call_works(gateway_with, server_script):
    gateway = gateway_with(stdio_backend(server_script))

    processes = gateway.app.extensions[EXTENSION_KEY].processes

    async def steps(client) -> tuple[Any, ...]:
        await client.call_tool("echo_pid", {})
        (first,) = [child.pid for child in processes.snapshot()]
        with pytest.raises(mcp.MCPError) as crashed:
            await client.call_tool("echo_crash", {})
        again = await client.call_tool("echo_echo", {"text": "again"})
        await client.call_tool("echo_pid", {})
        (second,) = [child.pid for child in processes.snapshot()]
        return first, crashed.value.error.message, again.content[0].text, second

    first, crashed, again, second = session(gateway.url, "legacy", steps)
    assert "exited with code 3" in crashed
    assert again == "echo:again"
    assert first != second
    assert not Path(f"/proc/{first}").exists() or "zombie" not in Path(f"/proc/{first}/status").read_text().lower()
    assert gateway.app.extensions[EXTENSION_KEY].processes.restarts() == {"echo": 1}


def test_a_child_that_never_answers_initialize_is_timed_out_and_killed(gateway_with, server_script, caplog):
    # The child's own timeout is 1 s and the request's deadline (the longest timeout) 10 s:
    # the child's timeout ends discovery first, always (with one deadline for both, which
    # came first depended on how long the fork took).
    gateway = gateway_with(stdio_backend(server_script, "mute"),
                           operational={"timeouts": {"default": "10s", "perWorkload": {"echo": "1s"}}})
    started = time.monotonic()
    with pytest.raises(BaseException) as failed:  # noqa: PT011 - the SDK wraps the MCPError in a group
        session(gateway.url, "legacy", call("echo_echo", {"text": "x"}))
    assert "No backend is available" in repr(_leaf(failed.value))  # its only backend failed discovery
    # Answered after the child's 1 s, not a hang until a client's 30 s (session(), the SDK's HTTP read).
    assert time.monotonic() - started < 15
    assert any("'echo': it did not answer initialize" in record.getMessage() for record in caplog.records)
    processes = gateway.app.extensions[EXTENSION_KEY].processes
    assert wait_until(lambda: processes.snapshot() == [], timeout=10), "the mute child is stopped"


def _leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def test_garbage_on_stdout_is_skipped(gateway_with, server_script, caplog):
    gateway = gateway_with(stdio_backend(server_script, "garbage"))
    assert session(gateway.url, "legacy", call("echo_echo", {"text": "x"}))["content"][0]["text"] == "echo:x"
    assert session(gateway.url, "auto", call("echo_echo", {"text": "y"}))["content"][0]["text"] == "echo:y"
    assert any("not JSON" in record.getMessage() for record in caplog.records)


def test_stderr_lines_are_logged_under_the_backends_name(gateway_with, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="vmcp_actors.backends.stderr")
    script = tmp_path / "noisy.py"
    script.write_text("import sys\nsys.stderr.write('hello from the child\\n'); sys.stderr.flush()\n"
                      + SERVER, encoding="utf-8")
    gateway = gateway_with(stdio_backend(script))
    session(gateway.url, "legacy", call("echo_echo", {"text": "x"}))
    assert wait_until(lambda: any("hello from the child" in r.getMessage() for r in caplog.records), timeout=10)
    lines = [r.getMessage() for r in caplog.records if "hello from the child" in r.getMessage()]
    assert lines == ["backend 'echo': hello from the child"]
    (child,) = gateway.app.extensions[EXTENSION_KEY].processes.snapshot()
    assert child.last_stderr is not None and child.pid > 0 and child.restarts == 0


def test_operators_see_the_children(gateway_with, server_script, monkeypatch):
    import requests

    monkeypatch.setenv("VMCP_PROCESS_ADMIN_TOKEN", "process-admin-token-4d1b")
    gateway = gateway_with(stdio_backend(server_script), admin={"tokenEnv": "VMCP_PROCESS_ADMIN_TOKEN"})
    session(gateway.url, "legacy", call("echo_pid"))
    (pid,) = [child.pid for child in gateway.app.extensions[EXTENSION_KEY].processes.snapshot()]
    state = requests.get(gateway.base + "/admin/state", timeout=10,
                         headers={"Authorization": "Bearer process-admin-token-4d1b"}).json()
    (child,) = state["processes"]
    assert (child["backend"], child["pid"], child["user"], child["restarts"]) == ("echo", pid, None, 0)
    assert child["rssBytes"] > 1_000_000 and child["uptimeSeconds"] >= 0
    assert state["processRestarts"] == {"echo": 0}
    metrics = requests.get(gateway.base + "/metrics", timeout=10).text
    assert 'vmcp_backend_processes{backend="echo"' in metrics


RUN_GATEWAY = textwrap.dedent('''
    import sys, time
    sys.path.insert(0, {root!r})
    from tests.gateway import GatewayServer
    gateway = GatewayServer({{"name": "t", "backends": [{{"name": "echo", "transport": "stdio",
        "command": sys.executable, "args": [{script!r}]}}]}}).start()
    print(gateway.url, flush=True)
    time.sleep(600)
''')


def descendants(pid: int) -> list[int]:
    """Every process ``pid`` started, and theirs."""
    found, waiting = [], [pid]
    while waiting:
        try:
            children = Path(f"/proc/{waiting.pop()}/task").glob("*/children")
            started = [int(child) for path in children for child in path.read_text().split()]
        except OSError:
            continue
        found += started
        waiting += started
    return found


def running(text: str) -> list[int]:
    """The processes whose command line holds ``text``."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_no_child_outlives_its_gateway(server_script, tmp_path, how):
    import signal
    import subprocess

    runner = tmp_path / "run_gateway.py"
    runner.write_text(RUN_GATEWAY.format(root=str(Path(__file__).parents[2]), script=str(server_script)))
    gateway = subprocess.Popen([sys.executable, str(runner)], stdout=subprocess.PIPE, text=True)
    try:
        url = gateway.stdout.readline().strip()
        session(url, "legacy", call("echo_pid"))
        pids = running(str(server_script))  # the sandbox's launcher, its init and the server
        assert len(pids) >= 2 and all(_alive(pid) for pid in pids), pids
        gateway.send_signal(getattr(signal, how))
        gateway.wait(timeout=10)
        assert wait_until(lambda: not any(_alive(pid) for pid in pids), timeout=10), \
            f"a child of {pids} outlived its gateway ({how})"
    finally:
        if gateway.poll() is None:
            gateway.kill()
            gateway.wait()


def test_failure_handling_leaves_a_stdio_backend_usable(gateway_with, server_script, monkeypatch):
    monkeypatch.setenv("VMCP_PROCESS_ADMIN_TOKEN", "process-admin-token-4d1b")
    gateway = gateway_with(stdio_backend(server_script), admin={"tokenEnv": "VMCP_PROCESS_ADMIN_TOKEN"},
                           # a ping's timeout is the interval: 600 ms holds for a child on a loaded machine
                           operational={"failureHandling": {"healthCheckInterval": "600ms", "circuitBreaker": {
                               "enabled": True, "failureThreshold": 1, "timeout": "30s"}}})
    checks_run(gateway, 2)  # a check or two, before any child runs: one failing would open the circuit
    assert session(gateway.url, "legacy", call("echo_echo", {"text": "x"}))["content"][0]["text"] == "echo:x"
    health = checks_run(gateway, 2)  # and with the child running (pinged)
    assert health["circuit"]["state"] == "closed" and health["failedChecksInARow"] == 0, health
    assert session(gateway.url, "legacy", call("echo_echo", {"text": "y"}))["content"][0]["text"] == "echo:y"


def _health(gateway: Any) -> dict:
    import requests

    state = requests.get(gateway.base + "/admin/state", timeout=10,
                         headers={"Authorization": "Bearer process-admin-token-4d1b"}).json()
    return state["backendHealth"]["echo"]


def checks_run(gateway: Any, count: int) -> dict:
    """The backend's admin health row once ``count`` more health checks than now have run
    (a check's time is the gateway's "now" less lastCheckSecondsAgo, on this process's clock)."""
    def checked_after(since: float) -> dict | None:
        asked = time.monotonic()  # the gateway's "now" is no earlier
        row = _health(gateway)
        ago = row.get("lastCheckSecondsAgo")
        return row if ago is not None and asked - ago > since + 0.001 else None  # (ago is rounded to 1 ms)

    row = None
    for _ in range(count):
        since = time.monotonic()
        row = wait_until(lambda since=since: checked_after(since), timeout=10)
        assert row, _health(gateway)
    return row
