"""Run an ASGI app under uvicorn in a background thread (demo backends and the test suite).

``uvicorn`` is an optional dependency (the ``demo`` extra); it is imported lazily.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

DEMO_EXTRA_MESSAGE = "the demo needs the 'demo' extra: pip install 'vmcp-actors[demo]'"

_STARTUP_TIMEOUT = 10.0


def require_demo_extra(module: str) -> Any:
    """Import ``module`` (``mcp``, ``uvicorn``, ...) or raise a RuntimeError naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise RuntimeError(DEMO_EXTRA_MESSAGE) from exc


class ServedApp:
    """An ASGI app served by uvicorn on a loopback port in a daemon thread.

    Use :func:`serve_asgi_in_thread` to build one. ``stop()`` is idempotent and also
    runs on leaving a ``with`` block.
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        graceful_timeout: float = 1.0,
        name: str | None = None,
    ) -> None:
        uvicorn = require_demo_extra("uvicorn")
        self.host = host
        # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets whose
        # proto says TCP, and without it every keep-alive response waits ~40 ms on Nagle.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
            self._sock.listen(128)
        except OSError:
            self._sock.close()
            raise
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="auto",
            # Open requests (SSE streams, a hanging backend) are cancelled after this
            # long on stop(), so stopping never blocks on a client.
            timeout_graceful_shutdown=graceful_timeout,
        )
        self._server = uvicorn.Server(config)
        self._graceful_timeout = graceful_timeout
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"asgi-{name or 'app'}-{self.port}", daemon=True
        )

    # -- lifecycle -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as exc:  # noqa: BLE001 - SystemExit on startup failure, too
            self._error = exc

    def start(self, timeout: float = _STARTUP_TIMEOUT) -> ServedApp:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                self._close_socket()
                raise RuntimeError(f"ASGI server on port {self.port} failed to start") from self._error
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ASGI server on port {self.port} did not start within {timeout} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Shut the server down and join its thread; safe to call more than once."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        self._server.should_exit = True
        if self._thread.is_alive():
            # Graceful phase: uvicorn closes idle connections, waits up to
            # graceful_timeout for open requests, then cancels them.
            self._thread.join(self._graceful_timeout + timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout)
        self._close_socket()

    def _close_socket(self) -> None:
        try:
            self._sock.close()
        except OSError:  # pragma: no cover - already closed
            pass

    # -- accessors -------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:54321`` (no trailing slash)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stopped

    def __enter__(self) -> ServedApp:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<ServedApp {self.url} {state}>"


def serve_asgi_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    graceful_timeout: float = 1.0,
    startup_timeout: float = _STARTUP_TIMEOUT,
    name: str | None = None,
) -> ServedApp:
    """Serve ``app`` on ``host:port`` (0 = an ephemeral port) and return once it accepts requests."""
    return ServedApp(app, host, port, graceful_timeout=graceful_timeout, name=name).start(startup_timeout)
