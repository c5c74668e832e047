"""The deploy kit (issue 14, item 8): deploy/nginx.conf served by a real nginx (Debian's
package, scripts/install-nginx) in front of two `vmcp-actors serve` processes sharing
Redis; the official SDK client drives a session through it, streaming included; and the
systemd unit says what the docs promise."""

from __future__ import annotations

import asyncio
import configparser
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import requests

from tests.backends import sdk_backend
from tests.gateway import backend_entry, wait_until
from tests.integration.test_cli import VMCP, CliProcess, write_config
from tests.ports import free_port

pytestmark = pytest.mark.slow  # whole gateway processes (docs/testing.md)

DEPLOY = Path(__file__).parents[2] / "deploy"
KEY_ENV, KEY = "DEPLOY_SIGNING_KEY", "deploy-signing-key-0123456789abcdef"


def nginx_binary() -> str:
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(found).exists():
        pytest.fail("nginx is not installed: run scripts/install-nginx (the README's test set-up does)")
    return found


def rendered_site(listen: int, upstreams: list[int]) -> str:
    """deploy/nginx.conf on plain HTTP: the `# tls` lines dropped, this test's ports."""
    lines = []
    for line in (DEPLOY / "nginx.conf").read_text().splitlines():
        if line.rstrip().endswith("# tls"):
            continue
        if line.strip().startswith("listen 443"):
            line = f"    listen 127.0.0.1:{listen};"
        elif line.strip().startswith("server 127.0.0.1:"):
            continue  # replaced below
        lines.append(line)
        if line.strip().startswith("upstream vmcp_actors"):
            lines.extend(f"    server 127.0.0.1:{port} max_fails=0;" for port in upstreams)
    return "\n".join(lines) + "\n"


class Nginx:
    def __init__(self, prefix: Path, site: str):
        self.prefix = prefix
        (prefix / "logs").mkdir(parents=True, exist_ok=True)
        (prefix / "site.conf").write_text(site)
        (prefix / "nginx.conf").write_text(
            "daemon off;\nworker_processes 1;\npid %s/nginx.pid;\nerror_log %s/logs/error.log;\n"
            "events { worker_connections 256; }\n"
            "http {\n  access_log %s/logs/access.log;\n  client_body_temp_path %s/body;\n"
            "  proxy_temp_path %s/proxy;\n  include %s/site.conf;\n}\n"
            % ((prefix,) * 3 + (prefix,) * 2 + (prefix,)))
        self.proc: subprocess.Popen | None = None

    def start(self, port: int) -> Nginx:
        binary = nginx_binary()
        check = subprocess.run([binary, "-t", "-p", str(self.prefix), "-c", str(self.prefix / "nginx.conf")],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        self.proc = subprocess.Popen([binary, "-p", str(self.prefix), "-c", str(self.prefix / "nginx.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        if not wait_until(listening, timeout=30, interval=0.05):
            raise RuntimeError("nginx did not start")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def access_log(self) -> str:
        return (self.prefix / "logs" / "access.log").read_text()


def test_a_session_through_nginx_over_two_gateway_processes_streams_and_survives_one_stopping(
        tmp_path, redis_server):
    import mcp

    backend = sdk_backend("plain", ["echo", "progress"])
    ports = [free_port(), free_port()]
    listen = free_port()
    config = write_config(tmp_path / "config.yaml", {
        "name": "deployed", "backends": [backend_entry("plain", backend)],
        "operational": {"signingKeyEnv": KEY_ENV, "allowedHosts": ["127.0.0.1"]},
        "sessionStorage": {"provider": "redis", "address": redis_server.address, "keyPrefix": "deploy:"}})
    nginx = Nginx(tmp_path / "nginx", rendered_site(listen, ports))
    try:
        with CliProcess([VMCP, "serve", "--config", str(config), "--port", str(ports[0])], tmp_path, "first",
                        env={KEY_ENV: KEY}) as first, \
                CliProcess([VMCP, "serve", "--config", str(config), "--port", str(ports[1])], tmp_path, "second",
                           env={KEY_ENV: KEY}) as second:
            first.wait_ready(f"http://127.0.0.1:{ports[0]}")
            second.wait_ready(f"http://127.0.0.1:{ports[1]}")
            nginx.start(listen)
            url = f"http://127.0.0.1:{listen}/mcp"
            progress: list[float] = []

            async def session() -> list[str]:
                async def on_progress(done: float, total: float | None, message: str | None) -> None:
                    progress.append(done)

                texts = []
                async with mcp.Client(url, mode="legacy") as client:
                    for n in range(6):  # nginx balances the requests over both processes
                        texts.append((await client.call_tool("plain_echo", {"text": str(n)})).content[0].text)
                    streamed = await client.call_tool("plain_progress", {"steps": 3}, progress_callback=on_progress)
                    texts.append(streamed.content[0].text)
                return texts

            texts = asyncio.run(session())
            assert texts == [f"plain:{n}" for n in range(6)] + ["done"]
            assert progress == [1, 2, 3]  # the SSE answer streamed through nginx unbuffered
            log = nginx.access_log()
            assert f"127.0.0.1:{ports[0]}" not in log  # (the access log does not name upstreams)
            assert requests.get(f"http://127.0.0.1:{listen}/readyz", timeout=30).status_code == 200

            # One process stops (an upgrade): the session goes on on the other one.
            first.proc.terminate()
            first.proc.wait(timeout=30)

            async def after_stop() -> list[str]:
                async with mcp.Client(url, mode="legacy") as client:
                    return [(await client.call_tool("plain_echo", {"text": f"after{n}"})).content[0].text
                            for n in range(4)]

            assert asyncio.run(after_stop()) == [f"plain:after{n}" for n in range(4)]
            assert second.proc.poll() is None
    finally:
        nginx.stop()
        backend.stop()


def test_the_systemd_unit_drains_longer_than_the_grace_period_and_is_hardened():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # keys keep their case
    unit.read(DEPLOY / "vmcp-actors.service")
    service = unit["Service"]
    assert service["KillSignal"] == "SIGTERM"
    assert int(service["TimeoutStopSec"]) > 30  # operational.shutdownGracePeriod's default
    assert service["ExecStart"].split()[1:3] == ["serve", "--config"]
    assert service["ExecStartPre"].split()[1] == "validate"
    assert service["EnvironmentFile"] == "/etc/vmcp/env" and service["User"] != "root"
    assert int(service["LimitNOFILE"]) > 4000  # gunicorn's worker_connections
    for hardening in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp"):
        assert service[hardening] in ("yes", "strict")
    assert unit["Install"]["WantedBy"] == "multi-user.target"
