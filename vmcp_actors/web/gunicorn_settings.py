"""gunicorn settings for serving the gateway (used by `vmcp-actors serve` and deploy/gunicorn.conf.py).

Worker processes with threads (one by default; more need sessionStorage: redis, so any
worker serves any session from its record). Actors must
start inside the worker (the app factory runs there; never preload), because actors
started before a fork look alive in the child and never answer.
"""

from __future__ import annotations

import pykka

worker_class = "gthread"
workers = 1
# A client's standalone stream (GET /mcp) holds a thread while it is open: at most
# STANDALONE_STREAM_LIMIT of them (vmcp_actors.sessions), the rest serve requests.
threads = 128
preload_app = False
max_requests = 0
# SSE answers and slow backends hold a thread; gthread keeps them off the accept loop.
timeout = 120
graceful_timeout = 5
# Longer than a reverse proxy's idle timeout (nginx: 60 s), so the proxy, not us, closes
# idle connections: a server closing a kept-alive connection just as a client reuses it
# makes that request fail (a 1 s keep-alive did, for clients pausing about a second).
# The price is at shutdown: gthread lets idle connections linger up to 2 s after SIGTERM.
keepalive = 75
# gunicorn's control socket path is shared by every instance of one user: two gateways
# on one VM would take over each other's socket.
control_socket_disable = True


def worker_exit(server, worker):  # noqa: ANN001 - gunicorn hook signature
    """Stop every actor so SIGTERM ends the worker in a moment, not after graceful_timeout."""
    pykka.ActorRegistry.stop_all(block=True, timeout=2)


SETTINGS = {
    "worker_class": worker_class,
    "workers": workers,
    "threads": threads,
    "preload_app": preload_app,
    "max_requests": max_requests,
    "timeout": timeout,
    "graceful_timeout": graceful_timeout,
    "keepalive": keepalive,
    "control_socket_disable": control_socket_disable,
    "worker_exit": worker_exit,
}
