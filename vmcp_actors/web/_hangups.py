"""Telling that a client closed its connection while its answer is still pending.

A 2026-07-28 client cancels a request by closing it. While the gateway has written
nothing (a JSON answer is still to come) the WSGI server cannot tell: nothing is read
from or written to the socket. One thread per process watches such sockets with a
selector: a socket that turns readable with nothing to read (end of file, or reset) is
a client that went away. A socket that turns readable with data is a client sending
more (pipelining): it can no longer be told apart, so it is no longer watched.

Plain sockets only (the WSGI servers' ``werkzeug.socket`` and ``gunicorn.socket``). A
TLS socket's bytes are records, not requests, so it is not watched; behind a proxy
(the usual set-up) the proxy closes its upstream connection when its client goes away.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

Unwatch = Callable[[], None]


def _nothing() -> None:
    pass


_WAITS_SEE_NEW_SOCKETS = tuple(getattr(selectors, name) for name in ("EpollSelector", "KqueueSelector")
                               if hasattr(selectors, name))


class Hangups:
    """Watches sockets for their client's hang-up; ``watch`` calls back at most once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _watched and the selector's registrations
        self._selector = selectors.DefaultSelector()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self._selector.register(self._wake_reader, selectors.EVENT_READ)
        # epoll and kqueue watch a socket registered while their wait is under way; the
        # others (select, poll) must be woken to see it: a thread switch per request.
        self._wake_on_watch = not isinstance(self._selector, _WAITS_SEE_NEW_SOCKETS)
        self._watched: dict[int, Callable[[], None]] = {}  # by file descriptor
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="vmcp-hangups", daemon=True)
        self._thread.start()

    def watch(self, sock: socket.socket | None, on_hangup: Callable[[], None]) -> Unwatch:
        """Call ``on_hangup`` (on the watching thread) if ``sock``'s client goes away
        before the returned function is called. Sockets that cannot be watched are not."""
        if sock is None or isinstance(sock, ssl.SSLSocket):
            return _nothing
        try:
            fd = sock.fileno()
        except OSError:
            return _nothing
        with self._lock:
            if self._stopped or fd < 0:
                return _nothing
            if fd in self._watched:  # left by a request that ended unwatched; the number was reused
                self._forget(fd)
            try:
                self._selector.register(fd, selectors.EVENT_READ)
            except (OSError, ValueError):
                return _nothing
            self._watched[fd] = on_hangup
        if self._wake_on_watch:
            self._wake()

        def unwatch() -> None:
            with self._lock:
                if self._watched.get(fd) is on_hangup:
                    self._forget(fd)

        return unwatch

    def count(self) -> int:
        with self._lock:
            return len(self._watched)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for fd in list(self._watched):
                self._forget(fd)
        self._wake()
        self._thread.join(timeout=2.0)

    def _forget(self, fd: int) -> None:
        del self._watched[fd]
        try:
            self._selector.unregister(fd)
        except (KeyError, ValueError, OSError):
            pass

    def _wake(self) -> None:
        try:
            self._wake_writer.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # a wake-up is already pending

    def _run(self) -> None:
        while True:
            try:
                ready = self._selector.select()
            except OSError:
                ready = []
            hung_up: list[Callable[[], None]] = []
            with self._lock:
                if self._stopped:
                    break
                for key, _ in ready:
                    if key.fileobj is self._wake_reader:
                        self._drain_wakeups()
                        continue
                    fd = key.fd
                    on_hangup = self._watched.get(fd)
                    if on_hangup is None:
                        continue
                    gone = _hung_up(fd)
                    if gone is None:
                        continue
                    self._forget(fd)  # gone, or sending more: either way no longer watched
                    if gone:
                        hung_up.append(on_hangup)
            for on_hangup in hung_up:
                try:
                    on_hangup()
                except Exception:  # noqa: BLE001 - one callback's failure must not stop the watching
                    logger.exception("ending a request whose client went away failed")
        self._selector.close()
        self._wake_reader.close()
        self._wake_writer.close()

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass


def _hung_up(fd: int) -> bool | None:
    """True: the peer closed or reset; False: it sent data; None: nothing to tell yet."""
    probe = socket.socket(fileno=os.dup(fd))
    try:
        data = probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return True  # reset by the peer, or no longer a connected socket
    finally:
        probe.close()  # closes the duplicate only
    return not data


_process: tuple[int, Hangups] | None = None
_process_lock = threading.Lock()


def process_hangups() -> Hangups:
    """This process's watcher, started on first use (after a fork: a new one for the child)."""
    global _process
    with _process_lock:
        if _process is None or _process[0] != os.getpid():
            _process = (os.getpid(), Hangups())
        return _process[1]


def request_socket(environ: Mapping[str, Any]) -> socket.socket | None:
    """The connection's socket, where the WSGI server says which it is."""
    sock = environ.get("gunicorn.socket", environ.get("werkzeug.socket"))
    return sock if isinstance(sock, socket.socket) else None
