"""Running blocking work off actor threads.

Actors own state and must never hold their message loop on network I/O (DESIGN rule 2).
HTTP exchanges therefore run on their own short-lived threads and report back through
``concurrent.futures.Future`` values, which any number of threads may wait on.
A thread per exchange (rather than a bounded pool) cannot deadlock when one exchange
waits for another (a list call waiting for the handshake), and the number of exchanges
in flight is already bounded by the web server's threads and the per-backend timeouts.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def run_in_thread(fn: Callable[..., T], *args: Any, name: str = "vmcp-io") -> cf.Future[T]:
    """Run ``fn(*args)`` on a new daemon thread; its outcome lands in the returned future."""
    future: cf.Future[T] = cf.Future()
    future.set_running_or_notify_cancel()

    def work() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            future.set_exception(exc)
        else:
            future.set_result(result)

    threading.Thread(target=work, name=name, daemon=True).start()
    return future


def resolved(value: T) -> cf.Future[T]:
    future: cf.Future[T] = cf.Future()
    future.set_result(value)
    return future


def failed(exc: BaseException) -> cf.Future[Any]:
    future: cf.Future[Any] = cf.Future()
    future.set_exception(exc)
    return future

# How long to wait for an actor to answer a quick message (one that does no I/O).
# Actors here never block their loop on the network, so this only trips when an
# actor is dead or wedged; it turns that into a clean error instead of a hung thread.
ASK_TIMEOUT = 5.0
