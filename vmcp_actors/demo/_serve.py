"""Run an ASGI app under uvicorn in a background thread (demo backends and the test suite).

``uvicorn`` is an optional dependency (the ``demo`` extra); it is imported lazily.
"""

from __future__ import annotations

import asyncio
import importlib
import socket
import threading
import time
from typing import Any

DEMO_EXTRA_MESSAGE = "the demo needs the 'demo' extra: pip install 'vmcp-actors[demo]'"

STARTUP_TIMEOUT = 10.0
GRACEFUL_TIMEOUT = 0.5


def require_demo_extra(module: str) -> Any:
    """Import ``module`` (``mcp``, ``uvicorn``, ...) or raise a RuntimeError naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise RuntimeError(DEMO_EXTRA_MESSAGE) from exc


class _InFlight:
    """ASGI middleware that tracks open HTTP requests so ``stop()`` can end them.

    Once stopping, a request cancelled by :meth:`cancel_all` is finished cleanly
    instead of crashing into uvicorn: a 503 if no response had started, otherwise the
    (streaming) body is terminated. The client sees an ended response, and the server
    logs no tracebacks.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def active(self) -> int:
        return len(self._tasks)

    def cancel_all(self) -> None:  # runs on the server's event loop
        for task in list(self._tasks):
            task.cancel()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        task = asyncio.current_task() if scope["type"] == "http" else None
        if task is None:
            await self.app(scope, receive, send)
            return
        state = {"started": False, "complete": False}

        async def tracking_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["complete"] = True
            await send(message)

        self._tasks.add(task)
        try:
            await self.app(scope, receive, tracking_send)
        except asyncio.CancelledError:
            if not self.stopping:
                raise
            await self._finish(send, state)
        finally:
            self._tasks.discard(task)

    @staticmethod
    async def _finish(send: Any, state: dict[str, bool]) -> None:
        try:
            if not state["started"]:
                await send(
                    {
                        "type": "http.response.start",
                        "status": 503,
                        "headers": [(b"content-type", b"text/plain"), (b"connection", b"close")],
                    }
                )
                await send({"type": "http.response.body", "body": b"server stopping"})
            elif not state["complete"]:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception:  # noqa: BLE001 - the client may be gone already
            pass


class ServedApp:
    """An ASGI app served by uvicorn on a loopback port in a daemon thread.

    Use :func:`serve_asgi_in_thread` to build and start one. ``stop()`` waits up to
    ``graceful_timeout`` for open requests (SSE streams, slow calls), then ends them;
    it is idempotent and also runs on leaving a ``with`` block.
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        graceful_timeout: float = GRACEFUL_TIMEOUT,
        name: str | None = None,
    ) -> None:
        uvicorn = require_demo_extra("uvicorn")
        self.host = host
        # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets
        # whose proto says TCP; without it every keep-alive response waits ~40 ms (Nagle).
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
        self._in_flight = _InFlight(app)
        config = uvicorn.Config(
            self._in_flight,
            log_level="warning",
            log_config=None,  # leave the process's logging configuration alone
            access_log=False,
            lifespan="auto",
            # Backstop only: stop() ends open requests itself after graceful_timeout.
            timeout_graceful_shutdown=graceful_timeout + 2.0,
        )
        self._server = uvicorn.Server(config)
        self._graceful_timeout = graceful_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_lock = threading.Lock()  # guards _stopped: one stop
        self._stopped = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"asgi-{name or 'app'}-{self.port}", daemon=True)

    # -- lifecycle -------------------------------------------------------------------

    def _run(self) -> None:
        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            await self._server.serve(sockets=[self._sock])

        try:
            asyncio.run(serve())
        except BaseException as exc:  # noqa: BLE001 - SystemExit on startup failure, too
            self._error = exc

    def start(self, timeout: float = STARTUP_TIMEOUT) -> ServedApp:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                self._stopped = True
                self._close_socket()
                raise RuntimeError(f"ASGI server on port {self.port} failed to start") from self._error
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ASGI server on port {self.port} did not start within {timeout} s")
            time.sleep(0.005)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Shut the server down and join its thread; safe to call more than once."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        self._in_flight.stopping = True
        self._server.should_exit = True
        if threading.current_thread() is self._thread:
            return  # called from a request handler: the server winds down on its own
        if self._thread.is_alive():
            deadline = time.monotonic() + self._graceful_timeout
            while self._in_flight.active and time.monotonic() < deadline and self._thread.is_alive():
                time.sleep(0.01)
            if self._in_flight.active and self._loop is not None:
                try:
                    self._loop.call_soon_threadsafe(self._in_flight.cancel_all)
                except RuntimeError:  # the loop closed meanwhile
                    pass
            self._thread.join(timeout)
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
        return f"<ServedApp {self.url} {'running' if self.running else 'stopped'}>"


def serve_asgi_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    graceful_timeout: float = GRACEFUL_TIMEOUT,
    startup_timeout: float = STARTUP_TIMEOUT,
    name: str | None = None,
) -> ServedApp:
    """Serve ``app`` on ``host:port`` (0 = an ephemeral port); returns once it accepts requests.

    ``.url`` is the ``http://host:port`` base; call ``.stop()`` (or use ``with``) to end it.
    """
    return ServedApp(app, host, port, graceful_timeout=graceful_timeout, name=name).start(startup_timeout)
