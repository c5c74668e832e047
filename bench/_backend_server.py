"""Serve one test backend in its own process (for benchmarks that want the backend off the
client's GIL): prints its MCP URL on stdout, then serves until stdin closes or SIGTERM.

    python -m bench._backend_server [--delay S] [--count] {sdk,legacy,raw,stdio} NAME [TOOL ...]

* ``sdk``: tests.backends' official-SDK backend (both MCP eras on one endpoint);
  ``legacy``: the same app as a 2025-11-25 server that never heard of 2026-07-28
  (tests/eras.py ``LegacyOnly``: it refuses ``server/discover``); ``raw``:
  ``tests.backends.delayed_backend`` (raw MCP, JSON answers); ``stdio``: the ``sdk``
  backend's server speaking MCP on this process's stdin and stdout (a stdio backend's
  command: nothing is printed, no option applies; it ends with its input).
* ``--delay S``: every POST waits S seconds before it is handled (without blocking other
  requests); GET and DELETE are not delayed.
* ``--count`` (``sdk`` and ``legacy``): count what reaches the backend. ``GET /bench/counts``
  answers ``{"POST": {JSON-RPC method: {HTTP status: n}}, "GET": {"": {...}}, ...}``:
  every request counted as it arrives (a POST's method before its delay), under
  ``"pending"`` until its answer starts (the status line: for a streamed answer that may be
  long before the answer ends, e.g. at the stream's first keep-alive ping), then under its
  status. ``GET /bench/open`` answers ``{"POST": {JSON-RPC method: n}, ...}``: the requests
  being handled right now (arrived, the app not yet done with them: its answer is not
  finished and the client has not gone away).

Without ``--delay`` and ``--count`` the app is served as it is (the direct baseline of
bench.overhead has no middleware in its way).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
from collections import Counter
from typing import Any

from tests.asgi_bodies import read_body as _body
from tests.asgi_bodies import replaying as _replay
from tests.eras import _message

COUNTS_PATH = "/bench/counts"
OPEN_PATH = "/bench/open"


class Counted:
    """ASGI middleware: counts requests by HTTP method, POSTs by JSON-RPC method, each by the
    status it was answered with (``"pending"`` until then), and serves them at COUNTS_PATH."""

    def __init__(self, app: Any) -> None:
        self.app = app
        # Only uvicorn's event loop reads and writes the counts (the counts page included): no lock.
        self._counts: dict[tuple[str, str], Counter[str]] = {}
        self._open: Counter[tuple[str, str]] = Counter()  # requests the app is handling now

    def snapshot(self) -> dict[str, dict[str, dict[str, int]]]:
        shaped: dict[str, dict[str, dict[str, int]]] = {}
        for (verb, method), statuses in self._counts.items():
            shaped.setdefault(verb, {})[method] = +statuses  # without statuses counted down to 0
        return shaped

    def open_now(self) -> dict[str, dict[str, int]]:
        shaped: dict[str, dict[str, int]] = {}
        for (verb, method), n in self._open.items():
            if n:
                shaped.setdefault(verb, {})[method] = n
        return shaped

    def _count(self, key: tuple[str, str], status: str, before: str | None = None) -> None:
        statuses = self._counts.setdefault(key, Counter())
        if before is not None:
            statuses[before] -= 1
        statuses[status] += 1

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] in (COUNTS_PATH, OPEN_PATH):
            body = json.dumps(self.snapshot() if scope["path"] == COUNTS_PATH else self.open_now()).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        verb = scope["method"]
        method = ""
        if verb == "POST":
            body = await _body(receive)
            method = str(_message(body).get("method") or "(response or batch)")
            receive = _replay(body, receive)
        key = (verb, method)
        self._count(key, "pending")

        async def counting_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self._count(key, str(message["status"]), before="pending")
            await send(message)

        self._open[key] += 1
        try:
            await self.app(scope, receive, counting_send)
        finally:
            self._open[key] -= 1


class Delayed:
    """ASGI middleware: every POST waits ``delay`` seconds first (other requests go on)."""

    def __init__(self, app: Any, delay: float) -> None:
        self.app = app
        self.delay = delay

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.delay and scope["type"] == "http" and scope["method"] == "POST":
            await asyncio.sleep(self.delay)
        await self.app(scope, receive, send)


def serve(kind: str, name: str, tools: list[str], delay: float, count: bool) -> tuple[str, Any]:
    """Start the backend; (its MCP URL, what to stop)."""
    from tests.backends import build_sdk_server, delayed_backend

    if kind == "raw":
        if count:
            raise SystemExit("--count: sdk and legacy backends only (a raw backend records what it receives itself)")
        backend = delayed_backend(delay, name=name)
        return backend.mcp_url, backend
    from tests.eras import wrap
    from vmcp_actors.demo._serve import serve_asgi_in_thread

    app = wrap(build_sdk_server(name, tools=tools or None).streamable_http_app(),
               "legacy" if kind == "legacy" else None)
    if delay:
        app = Delayed(app, delay)
    if count:
        app = Counted(app)
    served = serve_asgi_in_thread(app, name=name)
    return served.url + "/mcp", served


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.0, help="seconds every POST waits first")
    parser.add_argument("--count", action="store_true", help=f"count requests, served at {COUNTS_PATH}")
    parser.add_argument("kind", choices=("sdk", "legacy", "raw", "stdio"))
    parser.add_argument("name")
    parser.add_argument("tools", nargs="*")
    args = parser.parse_args(argv)
    if args.kind == "stdio":
        if args.delay or args.count:
            raise SystemExit("--delay and --count: not for a stdio backend")
        from tests.backends import build_sdk_server

        build_sdk_server(args.name, tools=args.tools or None).run("stdio")
        return
    url, backend = serve(args.kind, args.name, args.tools, args.delay, args.count)
    stop = threading.Event()
    # The SIGTERM handler takes no lock: Event.set() in a handler can deadlock the main
    # thread (a second signal landing inside the first handler's set()), as happened when
    # a killed benchmark's PR_SET_PDEATHSIG and its closed stdin came together.
    terminated: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: terminated.append(signum))
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    print(url, flush=True)
    try:
        while not terminated and not stop.wait(0.1):
            pass
    finally:
        backend.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
