"""The gunicorn worker: gthread, whose thread stays with a busy connection.

gthread answers each request of a kept-alive connection on a pool thread, then hands the
connection back to its poller (the main thread) and the next request back to a pool
thread: two thread switches, a pipe write and read, and four selector and fcntl calls per
request, most of a millisecond on a small VM. Here the thread that answered waits a
moment on the connection itself and serves the next request when it comes within
``LINGER`` seconds, which is what a client making calls one after another does. A
connection that stays quiet goes back to the poller as before.

A thread lingers only while others are free for new work: the requests waiting for a
thread do not outnumber the free ones, at most a quarter of the threads linger, and a
quarter of them stay free besides (a client's standalone stream holds a thread for as long
as it is open). A request that comes in for the pool when no thread is free wakes a
lingering one (its own pipe), which hands its connection back to the poller and takes
that request: lingering never delays others, and while threads are free it costs nothing.
"""

from __future__ import annotations

import os
import select
import threading
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

# How long a thread waits on a connection it just answered for that client's next request.
# Clients calling in a loop send it within a few milliseconds; an idle client does not,
# and only a sleeping thread paid for the wait.
LINGER = 0.05


class LingeringThreadWorker(ThreadWorker):
    """gunicorn's gthread worker; a thread serves a connection's next request itself when it
    comes within LINGER seconds and other threads are free."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._load_lock = threading.Lock()  # guards _waiting, _busy and _lingering; never nested
        self._waiting = 0  # connections submitted to the pool, not yet picked up by a thread
        self._busy = 0  # threads serving a connection (lingering ones included)
        self._lingering = 0  # threads waiting for their connection's next request
        self._to_wake: dict[int, int] = {}  # lingering threads not yet woken: thread id -> its wake pipe
        self._threads = self.cfg.threads  # read once: gunicorn's settings are looked up by name
        self._linger_cap = max(1, self._threads // 4)
        self._wake_pipes = _WakePipes()

    def enqueue_req(self, conn: Any) -> None:
        with self._load_lock:
            self._waiting += 1
            short = self._to_wake and self._waiting > self._threads - self._busy  # no thread free to take it
            wake = self._to_wake.popitem()[1] if short else None
        if wake is not None:
            _poke(wake)
        super().enqueue_req(conn)

    def run(self) -> None:
        try:
            super().run()
        finally:
            self._wake_pipes.close()

    def handle(self, conn: Any) -> Any:
        with self._load_lock:
            self._waiting -= 1
            self._busy += 1
        try:
            keep = super().handle(conn)
            while keep is True and self._next_request_came(conn):
                keep = super().handle(conn)
            return keep
        finally:
            with self._load_lock:
                self._busy -= 1

    def _next_request_came(self, conn: Any) -> bool:
        """Whether ``conn``'s next request is here, waiting for it up to LINGER when other
        threads are free; False hands the connection back to the poller."""
        if not self.alive:
            return False
        if conn.parser.unreader.buf.getvalue() or _pending_tls_bytes(conn.sock):
            return True  # already read ahead, or decrypted and held by TLS
        pipe = self._wake_pipes.mine()
        woken, poke = pipe.ends
        if pipe.poked:  # its last linger was ended by a poke: empty the pipe of it
            pipe.poked = False
            _drain(woken)
        me = threading.get_ident()
        with self._load_lock:
            if (self._waiting > self._threads - self._busy or self._lingering >= self._linger_cap
                    or self._busy > self._threads - self._linger_cap):
                return False
            self._lingering += 1
            self._to_wake[me] = poke
        try:
            readable = select.poll()
            readable.register(conn.sock, select.POLLIN)
            readable.register(woken, select.POLLIN)
            ready = {fd for fd, _ in readable.poll(LINGER * 1000)}
            return conn.sock.fileno() in ready and woken not in ready and self.alive
        except (OSError, ValueError):  # closed meanwhile: the poller's path closes it
            return False
        finally:
            with self._load_lock:
                self._lingering -= 1
                pipe.poked = self._to_wake.pop(me, None) is None  # gone: taken by the thread that poked it


class _WakePipe:
    def __init__(self) -> None:
        self.ends = os.pipe()  # (read end, write end)
        for end in self.ends:
            os.set_blocking(end, False)
        self.poked = False  # a poke may be in it (only its thread reads or writes this)


class _WakePipes:
    """A pipe per pool thread, made on its first linger: how work coming in ends it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _made; never nested
        self._made: list[_WakePipe] = []
        self._mine = threading.local()

    def mine(self) -> _WakePipe:
        pipe = getattr(self._mine, "pipe", None)
        if pipe is None:
            pipe = self._mine.pipe = _WakePipe()
            with self._lock:
                self._made.append(pipe)
        return pipe

    def close(self) -> None:
        with self._lock:
            made, self._made = self._made, []
        for pipe in made:
            for end in pipe.ends:
                os.close(end)


def _poke(fd: int) -> None:
    try:
        os.write(fd, b"\0")
    except OSError:  # full: a poke is already there; closed: the worker is ending
        pass


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 64):
            pass
    except OSError:  # nothing left (EAGAIN)
        pass


def _pending_tls_bytes(sock: Any) -> int:
    pending = getattr(sock, "pending", None)
    return pending() if pending is not None else 0
