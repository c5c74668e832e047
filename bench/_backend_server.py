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
    # The SIGTERM handler takes no lock: Event.set() in a handler can deadlock the main
    # thread (a second signal landing inside the first handler's set()), as happened when
    # a killed benchmark's PR_SET_PDEATHSIG and its closed stdin came together.
    terminated: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: terminated.append(signum))
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    print(backend.mcp_url, flush=True)
    try:
        while not terminated and not stop.wait(0.1):
            pass
    finally:
        backend.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
