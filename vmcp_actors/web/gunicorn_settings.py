"""gunicorn settings for serving the gateway (used by `vmcp-actors serve` and deploy/gunicorn.conf.py).

Worker processes with threads (one by default; more need sessionStorage: redis, so any
worker serves any session from its record). Actors must
start inside the worker (the app factory runs there; never preload), because actors
started before a fork look alive in the child and never answer.
"""

from __future__ import annotations

import logging
import signal

import pykka

from vmcp_actors.concurrency import wait_for_io
from vmcp_actors.web._log_writer import BatchedLogWriter

# gthread, whose thread serves a busy connection's next request itself (vmcp_actors.web.worker).
worker_class = "vmcp_actors.web.worker.LingeringThreadWorker"
workers = 1
# A client's standalone stream (GET /mcp) holds a thread while it is open: at most
# STANDALONE_STREAM_LIMIT of them (vmcp_actors.users._live), the rest serve requests.
threads = 128
# Client connections one worker keeps open at once (gthread parks idle keep-alive ones in
# its poller, off the threads): gunicorn's default of 1,000 would stall the 1,001st
# client. Each is a file descriptor: the service needs LimitNOFILE above this.
worker_connections = 4000
preload_app = False
max_requests = 0
# SSE answers and slow backends hold a thread; gthread keeps them off the accept loop.
timeout = 120
graceful_timeout = 30  # `vmcp-actors serve` takes it from operational.shutdownGracePeriod
# Longer than a reverse proxy's idle timeout (nginx: 60 s), so the proxy, not us, closes
# idle connections: a server closing a kept-alive connection just as a client reuses it
# makes that request fail (a 1 s keep-alive did, for clients pausing about a second).
# The price is at shutdown: gthread lets idle connections linger up to 2 s after SIGTERM.
keepalive = 75
# gunicorn's control socket path is shared by every instance of one user: two gateways
# on one VM would take over each other's socket.
control_socket_disable = True


_log_writer: BatchedLogWriter | None = None


def post_fork(server, worker):  # noqa: ANN001 - gunicorn hook signature
    """The worker's log lines go through a queue to one writer thread, in batches
    (vmcp_actors.web._log_writer). Started here, in the worker, as no thread survives a fork."""
    global _log_writer
    root = logging.getLogger()
    if not root.handlers:
        return
    _log_writer = BatchedLogWriter(root.handlers)
    root.handlers = [_log_writer.handler]
    _log_writer.start()


def post_worker_init(worker):  # noqa: ANN001 - gunicorn hook signature
    """On SIGTERM the worker drains before gunicorn's own handling: /readyz answers 503 and
    new sessions are refused, while the requests in flight finish (up to graceful_timeout,
    which `vmcp-actors serve` takes from operational.shutdownGracePeriod)."""
    runtime = _runtime_of(worker)
    stop_accepting = signal.getsignal(signal.SIGTERM)
    if runtime is None or not callable(stop_accepting):
        return

    def drain_then_stop(signum, frame):  # noqa: ANN001 - signal handler signature
        runtime.drain()
        stop_accepting(signum, frame)

    signal.signal(signal.SIGTERM, drain_then_stop)


def worker_exit(server, worker):  # noqa: ANN001 - gunicorn hook signature
    """The requests are done: end the sessions this process holds (its backend sessions
    get their DELETE when records are not shared), stop every actor so the worker ends in
    a moment, let the DELETEs under way finish, then write the log lines still queued."""
    runtime = _runtime_of(worker)
    if runtime is not None:
        runtime.stop(timeout=2)
    pykka.ActorRegistry.stop_all(block=True, timeout=2)
    wait_for_io(SHUTDOWN_IO_WAIT)
    if _log_writer is not None:
        _log_writer.stop()


# How long worker_exit lets backend DELETEs under way finish.
SHUTDOWN_IO_WAIT = 3.0


def _runtime_of(worker):  # noqa: ANN001, ANN202 - a gunicorn worker; the Runtime or None
    app = getattr(worker, "wsgi", None)
    extensions = getattr(app, "extensions", None)
    return extensions.get("vmcp_actors") if isinstance(extensions, dict) else None


SETTINGS = {
    "worker_class": worker_class,
    "workers": workers,
    "threads": threads,
    "worker_connections": worker_connections,
    "preload_app": preload_app,
    "max_requests": max_requests,
    "timeout": timeout,
    "graceful_timeout": graceful_timeout,
    "keepalive": keepalive,
    "control_socket_disable": control_socket_disable,
    "post_fork": post_fork,
    "post_worker_init": post_worker_init,
    "worker_exit": worker_exit,
}
