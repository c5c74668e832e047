"""The Node side of the never-worse matrix: the TypeScript reference server
``@modelcontextprotocol/server-everything`` (streamable HTTP, or the 2024-11-05 HTTP+SSE
transport; 2025 revisions only) on a loopback port, and the TypeScript SDK's client driven
by ``tests/node/ts_client.mjs``.

``scripts/install-node-mcp`` installs both, with a Node 22, into :func:`node_mcp_home`;
this module looks in the same place (``$VMCP_NODE_MCP_HOME``, else
``${XDG_CACHE_HOME:-$HOME/.cache}/vmcp-actors/node-mcp``).
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.ports import free_port

INSTALL_SCRIPT = "scripts/install-node-mcp"
TS_CLIENT = Path(__file__).resolve().parent / "node" / "ts_client.mjs"
EVERYTHING_ENTRY = "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
# The sign-in tests' packages (tests/oidc_idp.py): checked like the install script does.
SIGN_IN_PACKAGES = ("node_modules/oidc-provider/package.json", "node_modules/mcp-remote/package.json")
NODE = "node_modules/.bin/node"
STARTUP_TIMEOUT = 15.0
STOP_TIMEOUT = 5.0


def install_home(variable: str, name: str) -> Path:
    """Where an install script puts its packages: ``$variable``, else
    ``${XDG_CACHE_HOME:-$HOME/.cache}/vmcp-actors/<name>``."""
    explicit = os.environ.get(variable)
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "vmcp-actors" / name


def node_mcp_home() -> Path:
    return install_home("VMCP_NODE_MCP_HOME", "node-mcp")


def missing() -> str | None:
    """Why the Node side cannot run (a message naming the install script), or None."""
    home = node_mcp_home()
    if not (home / ".installed").is_file() or not (home / NODE).exists() or not (home / EVERYTHING_ENTRY).is_file() \
            or not all((home / package).is_file() for package in SIGN_IN_PACKAGES):
        return (f"the Node MCP packages are not installed in {home}: run {INSTALL_SCRIPT} (it installs Node 22, "
                f"@modelcontextprotocol/server-everything, @modelcontextprotocol/sdk, oidc-provider and mcp-remote)")
    return None


def unless_installed(why: str | None) -> None:
    """Skip the calling test for ``why`` (what is not installed); fail it under CI, whose
    set-up (the README's) installs everything a test needs. Nothing when ``why`` is None."""
    from tests.conformance.test_conformance import in_ci

    if why is not None:
        if in_ci():
            pytest.fail(why)
        pytest.skip(why)


def need_node_mcp() -> None:
    """Skip the calling test without the Node side; fail it under CI."""
    unless_installed(missing())


class NodeHttpServer:
    """A Node MCP server on a loopback port (PORT), as a child process: ``.url``,
    ``.mcp_url``, ``.name``, ``.stop()``, like the Python test backends, so ``backend_entry``
    takes it. ``what`` names it in errors."""

    def __init__(self, name: str, argv: list[str], cwd: Path, what: str) -> None:
        self.name = name
        self.what = what
        self.port = free_port()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - the server's output, kept until stop()
        # It listens on every interface of PORT; it is only ever reached on loopback.
        self._process = subprocess.Popen(argv, env={**os.environ, "PORT": str(self.port)}, cwd=cwd,
                                         stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self._wait_listening()
        except BaseException:
            self.stop()
            raise

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"{self.what} exited with {self._process.returncode}: {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.what} did not listen on {self.port} within {STARTUP_TIMEOUT} s: {self.log()}")

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-2000:]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mcp_url(self) -> str:
        return self.url + "/mcp"

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(5)
        self._log.close()


class EverythingServer(NodeHttpServer):
    """server-everything in streamable HTTP mode (or ``transport="sse"``: the 2024-11-05
    HTTP+SSE transport, its stream at ``.sse_url``)."""

    def __init__(self, name: str = "everything", transport: str = "streamableHttp") -> None:
        home = node_mcp_home()
        super().__init__(name, [str(home / NODE), str(home / EVERYTHING_ENTRY), transport], home, "server-everything")

    @property
    def sse_url(self) -> str:
        """Where the ``sse`` mode's event stream is (its messages go to ``/message``)."""
        return self.url + "/sse"


def run_ts_client(url: str, scenario: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """Run ``scenario`` with the TypeScript SDK client against ``url``; its outcome (the shape
    tests/matrix_clients.py documents)."""
    home = node_mcp_home()
    done = subprocess.run([str(home / NODE), str(TS_CLIENT), str(home), url], input=json.dumps(scenario),
                          capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"ts_client.mjs exited with {done.returncode}: {done.stderr[-3000:]}")
    return json.loads(done.stdout)


class ReadyNodeProgram:
    """A test program of ``tests/node/`` (oidc-provider behind it) started with its config
    JSON in an environment variable, not argv (no process listing shows a secret in it). It
    prints ``READY <issuer>`` once it listens, and exits when its stdin closes, so it never
    outlives this process. Subclasses set ``issuer`` and call :meth:`_start`."""

    issuer: str
    _process: subprocess.Popen
    _log: Any

    def _start(self, program: Path, config_env: str, config: dict[str, Any]) -> None:
        home = node_mcp_home()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - its stderr, kept until stop()
        self._process = subprocess.Popen(
            [str(home / NODE), str(program), str(home)], env={**os.environ, config_env: json.dumps(config)},
            cwd=home, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        try:
            self._wait_ready(program.name)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, name: str) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        received = b""
        stdout = self._process.stdout
        assert stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            while b"\n" not in received:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    raise RuntimeError(f"{name} did not start within {STARTUP_TIMEOUT} s: {self.log()}")
                chunk = os.read(stdout.fileno(), 4096)
                if not chunk:
                    self._process.wait(STOP_TIMEOUT)
                    raise RuntimeError(f"{name} exited with {self._process.returncode}: {self.log()}")
                received += chunk
        line = received.split(b"\n", 1)[0].decode("utf-8", "replace")
        if line != f"READY {self.issuer}":
            raise RuntimeError(f"{name} said {line!r}, not READY {self.issuer}: {self.log()}")

    def log(self) -> str:
        """The tail of its stderr (oidc-provider's warnings, server errors)."""
        if self._log.closed:
            return ""
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-2000:]

    def stop(self) -> None:
        """Stop it and wait for it; safe to call more than once."""
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(STOP_TIMEOUT)
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        self._log.close()
