"""Issue 40, item 4: where one echo call's gateway CPU goes, by layer (no target: a profile).

The gateway (``vmcp-actors serve``: gunicorn gthread, one worker) over the echo tool of one
official-SDK backend in its own process; one client thread sends echo calls one after the
other, as a 2025-11-25 session and as a 2026-07-28 client (each phase on its own). py-spy
samples the gunicorn worker while the calls run, only the thread that holds the GIL
(``--gil``: Python at work; a thread blocked in a read, a poll or a lock wait holds none,
and py-spy's own idle test counts those waits as work here), and each sample is put in one
layer by the innermost frame that names one (the first rule in ``LAYERS`` that matches,
from the innermost frame out):

* JSON: ``json`` and ``orjson`` (encoding and decoding, whoever calls them);
* sockets and selectors: the syscalls of both hops (client and backend), whoever makes them;
* backend hop: ``requests``, ``urllib3`` and ``http.client``'s own Python (the bookkeeping);
* gunicorn: its poller, the gthread hand-off, reading the request and writing the response;
* Flask / Werkzeug: the WSGI app, routing, the request and response objects;
* logging; threads, queues and futures of the standard library;
* the gateway's own packages: edge, web, users, decorators, core, backends (the channel and
  its client's own code), protocol, concurrency / pooled / metrics / tracing; pykka;
* anything else (the rest of the standard library, the interpreter).

The worker's CPU per call (from /proc, over the phase) is split in two: its system time
(the kernel's side of the syscalls) and its user time, split by those shares (``perf``
shows that user time is the interpreter's: 85 % of the worker's samples are libpython).

    .venv/bin/python -m bench.hot_path [--calls 2000] [--rate 997]
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._common import (
    McpClient,
    backend_process,
    gateway,
    parse_args,
    print_header,
    run_benchmark,
    table,
)

WARMUP = 200
# (layer, the frame file paths it claims), tried in order on each frame from the innermost out.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("JSON", ("(json/", "orjson")),
    ("sockets and selectors (the syscalls)", ("(socket.py", "(selectors.py", "(ssl.py")),
    ("backend hop (requests, urllib3, http.client)", ("(requests/", "(urllib3/", "(http/client.py")),
    ("gunicorn (poller, gthread hand-off, HTTP parse/write)", ("(gunicorn/",)),
    ("Flask / Werkzeug", ("(flask/", "(werkzeug/")),
    ("logging", ("(logging/",)),
    ("threads, queues, futures (stdlib)", ("(threading.py", "(queue.py", "(concurrent/")),
    ("gateway: edge", ("(vmcp_actors/edge/",)),
    ("gateway: web", ("(vmcp_actors/web/",)),
    ("gateway: users", ("(vmcp_actors/users/",)),
    ("gateway: decorators", ("(vmcp_actors/decorators/",)),
    ("gateway: core", ("(vmcp_actors/core/",)),
    ("gateway: backends", ("(vmcp_actors/backends/",)),
    ("gateway: protocol", ("(vmcp_actors/protocol/",)),
    ("gateway: concurrency, pooled, metrics, tracing, identity",
     ("(vmcp_actors/concurrency.py", "(vmcp_actors/pooled.py", "(vmcp_actors/metrics.py", "(vmcp_actors/tracing.py",
      "(vmcp_actors/identity.py", "(vmcp_actors/signing.py")),
    ("pykka", ("(pykka/",)),
)
OTHER = "other (the rest of the standard library, the interpreter)"


def layer_of(stack: str) -> str:
    """The layer of one collapsed stack (frames outermost first, ``;``-separated)."""
    for frame in reversed(stack.split(";")):
        for layer, marks in LAYERS:
            if any(mark in frame for mark in marks):
                return layer
    return OTHER


def profile(pid: int, seconds_hint: float, rate: int, out: Path, work) -> None:
    """py-spy records ``pid`` while ``work()`` runs (started first, stopped after)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    recorder = subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
                                 "--output", str(out), "--nonblocking", "--gil",
                                 "--duration", str(int(seconds_hint) + 60)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # py-spy attaches: a start-up delay, not an event we can wait on
    try:
        work()
    finally:
        recorder.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        recorder.wait(timeout=60)


def shares(raw: Path) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[layer_of(stack)] += int(count)
    return counts


def body(calls: int, rate: int, raw_dir: Path | None) -> list:
    print_header("hot path: one echo call's gateway CPU by layer (py-spy)", "gunicorn",
                 ["backend: the SDK echo in its own process", f"{calls} calls per phase, one thread",
                  f"py-spy --rate {rate} --gil: the thread holding the GIL"])
    with contextlib.ExitStack() as stack:
        backend = stack.enter_context(backend_process("sdk", "echo", "echo"))
        gw = stack.enter_context(gateway({"echo": backend.mcp_url}))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vmcp-hot-")))
        for phase, modern in (("2025-11-25 session", False), ("2026-07-28", True)):
            client = stack.enter_context(McpClient(gw.url, modern=modern))
            client.initialize()
            for i in range(WARMUP):
                client.call_tool("echo_echo", {"text": f"w{i}"})
            out = tmp / f"{'modern' if modern else 'legacy'}.txt"
            measured = {}

            def work() -> None:
                (user, system), began = _user_and_system(gw.pid), time.perf_counter()
                for i in range(calls):
                    client.call_tool("echo_echo", {"text": f"c{i}"})
                user_after, system_after = _user_and_system(gw.pid)
                measured["user"], measured["system"] = user_after - user, system_after - system
                measured["wall"] = time.perf_counter() - began

            profile(gw.pid, calls * 0.01, rate, out, work)
            counts = shares(out)
            if raw_dir is not None:  # the collapsed stacks, for a closer look
                raw_dir.mkdir(parents=True, exist_ok=True)
                shutil.copy(out, raw_dir / out.name)
            total = sum(counts.values()) or 1
            user_ms, system_ms = (measured[part] * 1000 / calls for part in ("user", "system"))
            print(f"\n{phase}: {user_ms + system_ms:.2f} ms of gateway worker CPU per call ({user_ms:.2f} user, "
                  f"{system_ms:.2f} system; {measured['wall'] * 1000 / calls:.2f} ms wall per call), "
                  f"{total} samples")
            layer_rows = [[layer, f"{count / total:.1%}", f"{user_ms * count / total:.3f} ms"]
                          for layer, count in counts.most_common()]
            layer_rows.append(["system time (the kernel's side of the syscalls)", "", f"{system_ms:.3f} ms"])
            print(table(["layer", "share of GIL samples", "CPU per call"], layer_rows))
    return []


def _user_and_system(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / os.sysconf("SC_CLK_TCK"), int(fields[12]) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--calls", type=int, default=2000, help="echo calls per phase")
        parser.add_argument("--rate", type=int, default=997, help="py-spy samples per second")
        parser.add_argument("--raw", type=Path, default=None, help="keep py-spy's collapsed stacks in this directory")

    args = parse_args(__doc__.splitlines()[0], extra=extra, gunicorn_only="the profile samples a gunicorn worker")
    run_benchmark(lambda: body(args.calls, args.rate, args.raw))


if __name__ == "__main__":
    main()
