"""Serve one test backend in its own process (for benchmarks that want the backend off the
client's GIL): prints its MCP URL on stdout, then serves until stdin closes or SIGTERM.

    python -m bench._backend_server sdk NAME [TOOL ...]
"""

from __future__ import annotations

import signal
import sys
import threading


def main(argv: list[str]) -> None:
    kind, name, *tools = argv
    from tests.backends import delayed_backend, sdk_backend

    backend = sdk_backend(name, tools=tools or None) if kind == "sdk" else delayed_backend(0, name=name)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    print(backend.mcp_url, flush=True)
    try:
        stop.wait()
    finally:
        backend.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
