"""A real ``redis-server`` (Debian package ``redis-server``) on a loopback port, for tests:
no persistence, its own directory, stopped (and its data gone) after use."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.ports import free_port

STARTUP_TIMEOUT = 10.0


class RedisServer:
    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="vmcp-redis-"))
        self._proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self._proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self._dir), "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
            self._proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)
