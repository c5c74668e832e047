"""Running blocking work off actor threads.

Actors own state and must never hold their message loop on network I/O (DESIGN rule 2).
HTTP exchanges therefore run on worker threads and report back through
``concurrent.futures.Future`` values, which any number of threads may wait on.

The workers form an elastic pool: a job goes to an idle worker, and a new worker starts
only when none is idle. So, unlike a bounded pool, a job that waits for another job (a
list call waiting for the handshake) can never starve it, while a steady load reuses
threads instead of paying for a new one per exchange. The number of jobs in flight is
bounded by the web server's threads and the per-backend timeouts; idle workers leave after
a minute. Workers are daemon threads so a hung exchange never holds up process exit.
"""

from __future__ import annotations

import concurrent.futures as cf
import heapq
import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pykka

T = TypeVar("T")


class ElasticPool:
    """Reusable daemon worker threads; a new one starts only when none is idle."""

    def __init__(self, idle_exit: float = 60.0, name: str = "vmcp-io"):
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], cf.Future[Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # waiting workers not yet claimed by a submitted job
        self._workers = 0
        self._idle_exit = idle_exit
        self._name = name

    def submit(self, fn: Callable[..., T], *args: Any) -> cf.Future[T]:
        future: cf.Future[T] = cf.Future()
        future.set_running_or_notify_cancel()
        with self._lock:
            start_worker = self._idle == 0
            if start_worker:
                self._workers += 1
            else:
                self._idle -= 1  # claim an idle worker for this job
        self._jobs.put((fn, args, future))
        if start_worker:
            threading.Thread(target=self._work, name=self._name, daemon=True).start()
        return future

    @property
    def workers(self) -> int:
        return self._workers

    def _work(self) -> None:
        while True:
            try:
                fn, args, future = self._jobs.get(timeout=self._idle_exit)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # nobody claimed a waiting worker: one of us leaves
                        self._idle -= 1
                        self._workers -= 1
                        return
                continue  # a job was claimed and is on its way
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                future.set_exception(exc)
            del fn, args, future  # drop references before idling
            with self._lock:
                self._idle += 1


_POOL = ElasticPool()


def run_in_thread(fn: Callable[..., T], *args: Any) -> cf.Future[T]:
    """Run ``fn(*args)`` on a pooled worker thread; its outcome lands in the returned future."""
    return _POOL.submit(fn, *args)


class TimerHandle:
    """A scheduled call; ``cancel()`` before it is due and it never runs."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class TimerQueue:
    """Delayed calls on one daemon thread, for the many short-lived timeouts of workflow
    runs (a thread per ``threading.Timer`` would cost a thread per step). The calls must
    be quick and must not raise: they run one after another on the timer thread (an actor
    ``tell`` is the intended use)."""

    def __init__(self, name: str = "vmcp-timers"):
        self._heap: list[tuple[float, int, TimerHandle, Callable[[], None]]] = []
        self._order = itertools.count()  # ties keep scheduling order; handles never compare
        self._wakeup = threading.Condition()
        self._thread: threading.Thread | None = None
        self._name = name

    def call_later(self, delay: float, fn: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle()
        with self._wakeup:
            heapq.heappush(self._heap, (time.monotonic() + max(delay, 0.0), next(self._order), handle, fn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._wakeup.notify()
        return handle

    def pending(self) -> int:
        with self._wakeup:
            return sum(1 for _, _, handle, _ in self._heap if not handle.cancelled)

    def _run(self) -> None:
        while True:
            with self._wakeup:
                while True:
                    while self._heap and self._heap[0][2].cancelled:
                        heapq.heappop(self._heap)  # cancelled timers leave as they reach the top
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        _, _, handle, fn = heapq.heappop(self._heap)
                        break
                    self._wakeup.wait(self._heap[0][0] - now if self._heap else None)
            if not handle.cancelled:
                try:
                    fn()
                except Exception:  # noqa: BLE001 - one bad callback must not stop every timer
                    pass
            del handle, fn


_TIMERS = TimerQueue()


def call_later(delay: float, fn: Callable[[], None]) -> TimerHandle:
    """Run the quick, non-raising ``fn()`` after ``delay`` seconds on the shared timer thread."""
    return _TIMERS.call_later(delay, fn)


def stop_quietly(ref: pykka.ActorRef[Any]) -> None:
    """Ask an actor to stop without waiting; one that already stopped is fine."""
    try:
        ref.stop(block=False)
    except pykka.ActorDeadError:
        pass


def tell_quietly(ref: pykka.ActorRef[Any], message: Any) -> None:
    """Fire and forget from a worker or timer thread: an actor that stopped meanwhile
    no longer needs the news."""
    try:
        ref.tell(message)
    except pykka.ActorDeadError:
        pass


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
