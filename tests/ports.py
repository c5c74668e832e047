"""Loopback ports for servers a test starts on a port chosen beforehand (child processes,
redis-server, uvicorn), and for URLs nothing may listen on.

Binding port 0 and handing the number on races with every outgoing connection on the
machine: the kernel takes those from the ephemeral range too. So ports come from below that
range (``/proc/sys/net/ipv4/ip_local_port_range`` starts at 32768 here), a block of its own
for each pytest-xdist worker, taken in turn and checked free; no two workers of one run and
no client connection can be handed the same one.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading

FIRST_PORT = 20000
BLOCK = 1500  # ports per worker: 8 workers fit below 32768
_lock = threading.Lock()  # guards _next: tests start servers from several threads
_next = None


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # gw0, gw1, ... ("gw0" without xdist)
    return int(worker[2:]) if worker[2:].isdigit() else 0


def _candidates():
    start = FIRST_PORT + (_worker_index() % 8) * BLOCK
    # Start each process at a different place in its block, so two runs on one machine rarely meet.
    offset = os.getpid() % BLOCK
    return itertools.cycle([start + (offset + step) % BLOCK for step in range(BLOCK)])


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nothing listens on now, not handed out before by this process."""
    global _next
    with _lock:
        if _next is None:
            _next = _candidates()
        for _ in range(BLOCK):
            port = next(_next)
            if _bindable(port):
                return port
    raise RuntimeError(f"no free loopback port in this worker's block of {BLOCK}")


def closed_port_url(path: str = "/mcp") -> str:
    """A loopback URL on a port nothing listens on."""
    return f"http://127.0.0.1:{free_port()}{path}"
