"""The real command line, run as subprocesses: validate, serve (gunicorn gthread), demo,
and plain gunicorn with deploy/gunicorn.conf.py.

Every process writes its stdout/stderr to files in tmp_path (never pipes that can fill
up), is started in its own process group, and is SIGKILLed (the whole group, so a
gunicorn worker never outlives a failed test) in a ``finally``. The captured logs are
printed on the way out, so pytest shows them when a test fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from tests.backends import sdk_backend
from tests.gateway import MCP_HEADERS, answer_of, backend_entry, run_client
from tests.ports import free_port

pytestmark = pytest.mark.slow  # whole gateway processes (docs/testing.md)

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin directory
VMCP = str(BIN / "vmcp-actors")
GUNICORN = str(BIN / "gunicorn")
EXAMPLE_CONFIG = ROOT / "deploy" / "config.example.yaml"
GUNICORN_CONF = ROOT / "deploy" / "gunicorn.conf.py"

READY_TIMEOUT = 60.0  # a wait for readiness (over as soon as /readyz says 200): generous under load
# What tells a prompt exit from a stuck one: stuck, gunicorn waits out its graceful_timeout
# (30 s, operational.shutdownGracePeriod's default) or an idle kept-alive connection (75 s).
# How fast it exits (about a second or two) is a bench/ matter, not a test's.
SHUTDOWN_LIMIT = 15.0
CONFIG_ERROR = 2


# ----------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------


class CliProcess:
    """One command line under test: logs to files, its own process group, always killed."""

    def __init__(self, args: list[str], tmp_path: Path, name: str, env: dict[str, str] | None = None):
        self.args = args
        self.name = name
        self.stdout_path = tmp_path / f"{name}.stdout.log"
        self.stderr_path = tmp_path / f"{name}.stderr.log"
        # gunicorn >= 25.1 opens a control socket at $XDG_RUNTIME_DIR/gunicorn.ctl (else
        # ~/.gunicorn/gunicorn.ctl), one path shared by every instance of the user: keep ours
        # in tmp_path so a test never takes over (or unlinks) another gunicorn's socket.
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_RUNTIME_DIR": str(tmp_path), **(env or {})}
        self.proc: subprocess.Popen | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> CliProcess:
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                self.args, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=ROOT, env=self.env,
                start_new_session=True,
            )
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            if self.proc is not None:
                if self.proc.poll() is None:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
                self._kill_group()
        finally:
            self.dump_logs()

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # leftovers (a gunicorn worker) of our own group only
        except (ProcessLookupError, PermissionError):
            pass

    def group_alive(self) -> bool:
        """True if any process of the group we started (e.g. a gunicorn worker) is still alive."""
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # pragma: no cover - a zombie-only group on some kernels
            return False
        return True

    def run_to_end(self, timeout: float = 30.0) -> int:
        """For commands that end on their own (validate, serve with a bad config)."""
        with self:
            return self.proc.wait(timeout=timeout)

    # -- observation ---------------------------------------------------------------------

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def dump_logs(self) -> None:
        rc = None if self.proc is None else self.proc.returncode
        print(f"----- {self.name}: {' '.join(self.args)} (exit {rc})")
        print(f"----- {self.name} stdout -----\n{self.stdout}")
        print(f"----- {self.name} stderr -----\n{self.stderr}")

    def wait_ready(self, base: str, timeout: float = READY_TIMEOUT) -> dict:
        """Poll GET {base}/readyz until 200; fail early if the process exits."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} exited with {self.proc.returncode} before /readyz answered 200")
            try:
                # `with`: the connection is closed now, not whenever the Response is collected,
                # so no stray kept-alive connection changes the shutdown timing measured later.
                with requests.get(base + "/readyz", timeout=1) as response:
                    if response.status_code == 200:
                        return response.json()
                    last = f"HTTP {response.status_code}: {response.text[:200]}"
            except requests.RequestException as error:
                last = error
            time.sleep(0.1)
        pytest.fail(f"{self.name}: /readyz not 200 within {timeout} s (last: {last})")

    def sigterm_and_measure(self, limit: float = SHUTDOWN_LIMIT) -> float:
        """Send SIGTERM to the process we started and return how long it took to exit."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=limit + 10)  # wait a bit past the limit to report the real time
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} still running {limit + 10:.0f} s after SIGTERM")
        elapsed = time.monotonic() - started
        print(f"{self.name}: exited {elapsed:.2f} s after SIGTERM (exit code {self.proc.returncode})")
        assert elapsed < limit, f"{self.name} took {elapsed:.2f} s to exit after SIGTERM (limit {limit} s)"
        return elapsed


def write_config(path: Path, mapping: dict) -> Path:
    path.write_text(yaml.safe_dump(mapping, sort_keys=False))
    return path


def raw_session_with_tools_list(http: requests.Session, url: str) -> tuple[str, list[str]]:
    """Open a session the raw way (left open on purpose) and list its tools.

    ``http`` keeps its connection alive afterwards, like a connected client would: the
    SIGTERM tests measure shutdown with that idle kept-alive connection still open.
    """
    init = http.post(
        url,
        json={"jsonrpc": "2.0", "id": 0, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "test-cli", "version": "1"}}},
        headers=MCP_HEADERS, timeout=30,
    )
    init.raise_for_status()
    session_id = init.headers["Mcp-Session-Id"]
    headers = {**MCP_HEADERS, "Mcp-Session-Id": session_id, "MCP-Protocol-Version": "2025-11-25"}
    http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers, timeout=30)
    listed = answer_of(http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers,
                                 timeout=30))
    return session_id, [tool["name"] for tool in listed["result"]["tools"]]


def gunicorn_log_checks(stderr: str) -> None:
    """The process really runs gunicorn with the gateway's gthread worker and exactly one worker."""
    assert re.search(r"Using worker: vmcp_actors\.web\.worker\.LingeringThreadWorker", stderr), \
        "gunicorn did not report the gateway's worker"
    booted = re.findall(r"Booting worker with pid", stderr)
    assert len(booted) == 1, f"expected exactly one worker boot, saw {len(booted)}"


def two_backend_config(alpha, beta) -> dict:
    return {
        "name": "cli-test",
        "backends": [backend_entry("alpha", alpha), backend_entry("beta", beta)],
        "aggregation": {"conflictResolution": "prefix", "conflictResolutionConfig": {"prefixFormat": "{workload}_"}},
    }


# ----------------------------------------------------------------------------------
# validate
# ----------------------------------------------------------------------------------


def test_validate_accepts_the_example_config(tmp_path):
    cli = CliProcess([VMCP, "validate", "--config", str(EXAMPLE_CONFIG)], tmp_path, "validate-example")
    assert cli.run_to_end() == 0
    assert f"{EXAMPLE_CONFIG}: ok (2 backends, 1 composite tool)" in cli.stdout
    assert cli.stderr.strip() == "" or "error" not in cli.stderr.lower()


BAD_CONFIG = """\
name: broken
backends:
  - {name: alpha, url: "http://127.0.0.1:9/mcp"}
  - {name: beta, ulr: "http://127.0.0.1:9/mcp"}
  - {name: alpha, url: "http://127.0.0.1:10/mcp"}
operational:
  timeouts: {default: forever}
compositeTools:
  - name: triage
    steps:
      - {id: one, tool: alpha.echo}
"""


def test_validate_reports_every_error_with_its_path(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(BAD_CONFIG)
    cli = CliProcess([VMCP, "validate", "--config", str(config)], tmp_path, "validate-bad")
    assert cli.run_to_end() == CONFIG_ERROR
    lines = cli.stderr.splitlines()

    def line_with(path: str, *words: str) -> str:
        found = [line for line in lines if path in line and all(w.lower() in line.lower() for w in words)]
        assert found, f"no stderr line names {path!r} with {words}: {lines}"
        return found[0]

    line_with("backends[1].ulr", "unknown field")
    line_with("operational.timeouts.default", "forever")
    line_with("backends[2].name", "duplicate")
    line_with("compositeTools[0].description", "is required")
    assert "ok" not in cli.stdout


BAD_COMPOSITES = """\
name: composites
backends:
  - {name: alpha, url: "http://127.0.0.1:9/mcp"}
compositeTools:
  - name: triage
    description: Fetch and label
    steps:
      - {id: fetch, tool: alpha.get, onError: {action: retry, retryCount: 20}}
      - {id: label, tool: alpha.label, dependsOn: [fetsh], arguments: {id: "{{ steps.fetch.output.id }}"}}
      - {id: each, type: forEach, collection: "{{ steps.fetch.output.items }}", tool: alpha.tag}
  - name: triage
    description: ""
    steps: [{id: a, tool: triage}]
"""


def test_validate_reports_composite_tool_errors_with_their_paths(tmp_path):
    config = tmp_path / "bad-composites.yaml"
    config.write_text(BAD_COMPOSITES)
    cli = CliProcess([VMCP, "validate", "--config", str(config)], tmp_path, "validate-composites")
    assert cli.run_to_end() == CONFIG_ERROR
    lines = cli.stderr.splitlines()
    for expected in (
        "compositeTools[0].steps[0].onError.retryCount: must be between 1 and 10",
        "compositeTools[0].steps[2].step: is required for type forEach",
        "compositeTools[0].steps[2].tool: a forEach step has no tool of its own: put it in step (step.tool)",
        "compositeTools[1].description: must not be empty",
        "compositeTools[1].name: duplicate composite name 'triage' (also compositeTools[0])",
        "compositeTools[1].steps[0].tool: composite 'triage', step 'a': 'triage' is a composite tool, "
        "and composite tools cannot call composite tools",
    ):
        assert expected in lines, f"missing {expected!r} in {lines}"
    assert "ok" not in cli.stdout
    assert "Traceback" not in cli.stderr


def test_validate_missing_file_exits_2_with_a_clear_message(tmp_path):
    missing = tmp_path / "does-not-exist.yaml"
    cli = CliProcess([VMCP, "validate", "--config", str(missing)], tmp_path, "validate-missing")
    assert cli.run_to_end() == CONFIG_ERROR
    assert str(missing) in cli.stderr
    assert "no such file" in cli.stderr.lower()
    assert "Traceback" not in cli.stderr


SECRET = "Bearer s3cret-for-the-test"

CLAUDE_DESKTOP = {
    "mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/shared"],
                  "env": {"API_TOKEN": "tok-in-env", "OTHER": "${input:other}"}},
        "remote": {"url": "https://x.example.com:8443/mcp", "headers": {"Authorization": SECRET}},
        "github": {"type": "sse", "url": "https://gh.example.com/sse",
                   "headers": {"Authorization": SECRET, "X-Tenant": "acme-tenant"}},
        "off": {"command": "old-server", "disabled": True},
    },
}


def test_validate_mcp_servers_lists_the_backends_and_notes_what_it_could_not_use(tmp_path):
    servers = tmp_path / "claude_desktop_config.json"
    servers.write_text(json.dumps(CLAUDE_DESKTOP))
    cli = CliProcess([VMCP, "validate", "--mcp-servers", str(servers)], tmp_path, "validate-mcp-servers")
    assert cli.run_to_end() == 0
    assert cli.stdout.splitlines() == [
        "backend files: stdio, command npx",
        "backend remote: streamable-http, host x.example.com:8443, header Authorization",
        "backend github: sse, host gh.example.com",
        f"{servers}: ok (3 backends)",
    ]
    warnings = cli.stderr.splitlines()
    assert any(line.startswith("warning: mcpServers.files.env.OTHER: uses ${input:other}") for line in warnings)
    assert any(line.startswith("warning: mcpServers.github.headers: not sent (Authorization, X-Tenant)")
               for line in warnings)
    assert "warning: mcpServers.off: disabled: true, so not served" in warnings
    for secret in ("s3cret", "tok-in-env", "acme-tenant", "/srv/shared"):
        assert secret not in cli.stdout + cli.stderr


def test_validate_mcp_servers_exits_2_with_the_files_paths_when_the_result_is_invalid(tmp_path):
    servers = tmp_path / "mcp.json"
    servers.write_text(json.dumps({"servers": {
        "a": {"type": "http", "url": "ftp://files.example.com"},
        "b": {"type": "stdio", "command": "srv", "autoApprove": ["x"]},
    }}))
    cli = CliProcess([VMCP, "validate", "--mcp-servers", str(servers)], tmp_path, "validate-mcp-servers-bad")
    assert cli.run_to_end() == CONFIG_ERROR
    lines = cli.stderr.splitlines()
    assert "servers.a.url: must be an http(s) URL with a host" in lines
    assert "warning: servers.b.autoApprove: not used: the gateway has no such setting" in lines
    assert "ok" not in cli.stdout
    assert "Traceback" not in cli.stderr


def test_validate_mcp_servers_exits_2_for_a_file_that_is_not_one(tmp_path):
    servers = tmp_path / "settings.json"
    servers.write_text('{"editor.fontSize": 14}')
    cli = CliProcess([VMCP, "validate", "--mcp-servers", str(servers)], tmp_path, "validate-not-mcp-servers")
    assert cli.run_to_end() == CONFIG_ERROR
    assert f"{servers}: has neither mcpServers" in cli.stderr
    assert "Traceback" not in cli.stderr


def test_validate_takes_exactly_one_of_config_and_mcp_servers(tmp_path):
    both = CliProcess([VMCP, "validate", "--config", str(EXAMPLE_CONFIG), "--mcp-servers", str(EXAMPLE_CONFIG)],
                      tmp_path, "validate-both")
    assert both.run_to_end() == CONFIG_ERROR
    assert "not allowed with argument" in both.stderr
    neither = CliProcess([VMCP, "validate"], tmp_path, "validate-neither")
    assert neither.run_to_end() == CONFIG_ERROR
    assert "one of the arguments --config --mcp-servers is required" in neither.stderr


# ----------------------------------------------------------------------------------
# serve
# ----------------------------------------------------------------------------------


def test_serve_runs_gunicorn_gthread_and_stops_promptly_on_sigterm(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with sdk_backend("alpha") as alpha, sdk_backend("beta") as beta:
        config = write_config(tmp_path / "config.yaml", two_backend_config(alpha, beta))
        with CliProcess(
            [VMCP, "serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)], tmp_path, "serve"
        ) as cli:
            cli.wait_ready(base)

            async def work(client):
                tools = await client.list_tools()
                result = await client.call_tool("beta_echo", {"text": "through gunicorn"})
                return sorted(t.name for t in tools.tools), result

            names, result = run_client(base + "/mcp", work, mode="legacy")
            assert {"alpha_echo", "beta_echo", "alpha_whoami", "beta_whoami"} <= set(names)
            assert not result.is_error
            assert result.content[0].text == "beta:through gunicorn"

            # A session left open, so SessionActor and BackendConnections exist at SIGTERM,
            # and a client that still holds its kept-alive connection.
            with requests.Session() as http:
                _, raw_names = raw_session_with_tools_list(http, base + "/mcp")
                assert "alpha_echo" in raw_names
                assert http.get(base + "/readyz", timeout=30).json()["sessions"] >= 1
                cli.sigterm_and_measure()
            assert cli.proc.returncode == 0
            assert not cli.group_alive(), "a gunicorn process outlived the master"
            gunicorn_log_checks(cli.stderr)


def test_serve_mcp_servers_serves_the_files_url_servers(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with sdk_backend("alpha") as alpha, sdk_backend("beta") as beta:
        servers = tmp_path / "mcp.json"
        servers.write_text(json.dumps({"servers": {
            "alpha": {"type": "http", "url": alpha.url + "/mcp"},
            "beta": {"url": beta.url + "/mcp", "timeout": 30},
        }}))
        with CliProcess(
            [VMCP, "serve", "--mcp-servers", str(servers), "--host", "127.0.0.1", "--port", str(port)],
            tmp_path, "serve-mcp-servers",
        ) as cli:
            cli.wait_ready(base)

            async def work(client):
                tools = await client.list_tools()
                result = await client.call_tool("beta_echo", {"text": "from an mcpServers file"})
                return {t.name for t in tools.tools}, result

            names, result = run_client(base + "/mcp", work, mode="legacy")
            assert {"alpha_echo", "beta_echo"} <= names
            assert result.content[0].text == "beta:from an mcpServers file"
            assert "warning: servers.beta.timeout: not used" in cli.stderr
            cli.sigterm_and_measure()
            assert cli.proc.returncode == 0


def test_serve_with_invalid_config_exits_2_before_gunicorn(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(BAD_CONFIG)
    port = free_port()
    cli = CliProcess(
        [VMCP, "serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)], tmp_path, "serve-bad"
    )
    assert cli.run_to_end(timeout=60) == CONFIG_ERROR
    assert "backends[1].ulr" in cli.stderr
    assert "compositeTools" in cli.stderr
    assert "Starting gunicorn" not in cli.stderr
    assert "Booting worker" not in cli.stderr
    with socket.socket() as sock:  # nothing ever listened there
        assert sock.connect_ex(("127.0.0.1", port)) != 0


# ----------------------------------------------------------------------------------
# demo
# ----------------------------------------------------------------------------------


def test_demo_serves_the_bundled_backends_and_stops_on_sigterm(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with CliProcess([VMCP, "demo", "--port", str(port)], tmp_path, "demo") as cli:
        cli.wait_ready(base)
        assert f"{base}/mcp" in cli.stdout

        async def work(client):
            tools = await client.list_tools()
            resources = await client.list_resources()
            prompts = await client.list_prompts()
            weather = await client.call_tool("weather_search", {"query": "Lisbon"})
            notes = await client.call_tool("notes_search", {"query": "Lisbon"})
            forecast = await client.call_tool("weather_get_forecast", {"city": "Oslo", "days": 2})
            trip = await client.call_tool("trip_brief", {"city": "Lisbon"})
            return tools, resources, prompts, weather, notes, forecast, trip

        tools, resources, prompts, weather, notes, forecast, trip = run_client(base + "/mcp", work, mode="legacy")
        names = {t.name for t in tools.tools}
        assert any(n.startswith("weather_") for n in names) and any(n.startswith("notes_") for n in names), names
        # both demo servers expose `search`: it appears once under each prefix, never bare
        assert {"weather_search", "notes_search"} <= names
        assert "search" not in names
        assert {"weather_get_forecast", "notes_add_note"} <= names
        assert {"clock_now", "clock_convert"} <= names  # the stdio backend, a child of the gateway

        uris = {str(r.uri) for r in resources.resources}
        assert {"weather://cities", "notes://index"} <= uris, uris
        prompt_names = {p.name for p in prompts.prompts}
        assert any("packing_advice" in p for p in prompt_names) and any("summarize_notes" in p for p in prompt_names), (
            prompt_names
        )

        # the clashing name routes to the right backend under each prefix
        assert not weather.is_error and "Lisbon (Portugal)" in weather.content[0].text
        assert not notes.is_error and "Trip to Lisbon" in notes.content[0].text
        assert not forecast.is_error and "Forecast for Oslo" in forecast.content[0].text

        # the demo's composite tools: advertised with derived annotations, and they run
        composites = {t.name: t for t in tools.tools if t.name in ("trip_brief", "compare_cities")}
        assert set(composites) == {"trip_brief", "compare_cities"}
        assert composites["trip_brief"].annotations.read_only_hint is True
        assert not trip.is_error, trip
        assert trip.structured_content["city"] == "Lisbon"
        assert trip.structured_content["forecast"].startswith("Forecast for Lisbon")
        assert trip.structured_content["conditions"]["country"] == "Portugal"
        assert "Trip to Lisbon" in trip.structured_content["notes"]

        with requests.Session() as http:
            _, raw_names = raw_session_with_tools_list(http, base + "/mcp")
            assert "notes_search" in raw_names
            assert http.get(base + "/readyz", timeout=30).json()["sessions"] >= 1
            cli.sigterm_and_measure()
        assert cli.proc.returncode == 0
        assert not cli.group_alive()


# ----------------------------------------------------------------------------------
# plain gunicorn with the deploy file
# ----------------------------------------------------------------------------------


def test_gunicorn_with_deploy_conf_serves_and_stops_on_sigterm(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with sdk_backend("alpha") as alpha, sdk_backend("beta") as beta:
        config = write_config(tmp_path / "config.yaml", two_backend_config(alpha, beta))
        with CliProcess(
            [GUNICORN, "-c", str(GUNICORN_CONF), "--bind", f"127.0.0.1:{port}", "vmcp_actors.web.wsgi:application"],
            tmp_path, "gunicorn", env={"VMCP_CONFIG": str(config)},
        ) as cli:
            body = cli.wait_ready(base)
            assert body["status"] == "ready"
            with requests.Session() as http:
                _, raw_names = raw_session_with_tools_list(http, base + "/mcp")
                assert {"alpha_echo", "beta_echo"} <= set(raw_names)
                cli.sigterm_and_measure()
            assert cli.proc.returncode == 0
            assert not cli.group_alive(), "a gunicorn process outlived the master"
            gunicorn_log_checks(cli.stderr)
