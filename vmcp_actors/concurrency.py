"""Running blocking work off actor threads, and the one deadline a request carries.

Actors own state and must never hold their message loop on network I/O (DESIGN rule 2).
HTTP exchanges therefore run on worker threads and report back through
``concurrent.futures.Future`` values, which any number of threads may wait on.

The workers form a bounded pool (``MAX_WORKERS``): a job goes to an idle worker, a new
worker starts while fewer than ``MAX_WORKERS`` run, and further jobs queue. A bounded
pool is safe because no pooled job ever waits for another job: work that depends on
other work (discovery after the handshake, a composite step after a renewed handshake)
is chained with done-callbacks (``on_settled``, ``when_all``) instead of a blocking
``result()``, so a queued job can never be starved by workers waiting for it. Pooled work may ask
an actor (actors answer at once) but never waits for a job; only web threads (bounded by
the server's thread count) block on job futures, each until its request's ``Deadline``. Idle workers leave after 10 s (threads follow load); workers are daemon
threads so a hung exchange never holds up process exit.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import contextvars
import heapq
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import pykka

T = TypeVar("T")

# The most worker threads the pool runs at once; further jobs wait in its queue.
MAX_WORKERS = 32


@dataclass(frozen=True)
class Deadline:
    """An absolute point on the monotonic clock: the one deadline of a client request,
    which every wait below the request uses (``remaining()``, or ``cap(limit)`` for a
    wait that also has a limit of its own, such as one backend's timeout)."""

    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def cap(self, seconds: float) -> float:
        """The shorter of ``seconds`` and what is left of the deadline."""
        return min(seconds, self.remaining())

    def earlier(self, seconds: float) -> Deadline:
        """This deadline moved ``seconds`` earlier (a margin to answer in)."""
        return Deadline(self.at - seconds)


class BoundedPool:
    """At most ``max_workers`` reusable daemon worker threads; jobs beyond them queue."""

    def __init__(self, max_workers: int = MAX_WORKERS, idle_exit: float = 10.0, name: str = "vmcp-io"):
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], cf.Future[Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards the worker counts (_workers, _idle, _pending); never nested
        self._max = max_workers
        self._workers = 0
        self._idle = 0  # workers waiting for a job
        self._pending = 0  # jobs submitted and not yet taken by a worker
        self._idle_exit = idle_exit
        self._name = name

    def submit(self, fn: Callable[..., T], *args: Any) -> cf.Future[T]:
        future: cf.Future[T] = cf.Future()
        future.set_running_or_notify_cancel()
        with self._lock:
            self._pending += 1
            start_worker = self._pending > self._idle and self._workers < self._max
            if start_worker:
                self._workers += 1
        # The job runs in the submitter's context (a trace's current span goes with it).
        self._jobs.put((contextvars.copy_context().run, (fn, *args), future))
        if start_worker:
            threading.Thread(target=self._work, name=self._name, daemon=True).start()
        return future

    @property
    def workers(self) -> int:
        return self._workers

    def wait_idle(self, timeout: float) -> bool:
        """Wait (at most ``timeout``) until no job is queued or running; True if so."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._pending == 0 and self._idle >= self._workers:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    @property
    def queued(self) -> int:
        with self._lock:
            return max(0, self._pending - self._idle)

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            try:
                fn, args, future = self._jobs.get(timeout=self._idle_exit)
            except queue.Empty:
                with self._lock:
                    self._idle -= 1
                    if self._pending == 0:  # nothing on its way: leave
                        self._workers -= 1
                        return
                continue
            with self._lock:
                self._idle -= 1
                self._pending -= 1
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                future.set_exception(exc)
            del fn, args, future  # drop references before idling


_POOL = BoundedPool()
# Calls made for composite steps wait on backends as long as a step may take: a pool of
# their own, so slow steps never hold up handshakes, discovery or record writes.
MAX_CALL_WORKERS = 256
_CALLS = BoundedPool(MAX_CALL_WORKERS, name="vmcp-calls")


def run_in_thread(fn: Callable[..., T], *args: Any) -> cf.Future[T]:
    """Run ``fn(*args)`` on a pooled worker thread; its outcome lands in the returned future.
    ``fn`` must not wait for another pooled job (chain with ``on_settled`` instead)."""
    return _POOL.submit(fn, *args)


def run_call(fn: Callable[..., T], *args: Any) -> cf.Future[T]:
    """Run ``fn(*args)`` on the calls' pool (a backend call for a composite step)."""
    return _CALLS.submit(fn, *args)


def wait_for_io(timeout: float) -> bool:
    """At shutdown: let the pooled exchanges under way (backend DELETEs) finish."""
    return _POOL.wait_idle(timeout)


def pool_stats() -> dict[str, int]:
    return {"workers": _POOL.workers, "maxWorkers": MAX_WORKERS, "queued": _POOL.queued,
            "callWorkers": _CALLS.workers, "maxCallWorkers": MAX_CALL_WORKERS, "callsQueued": _CALLS.queued}


def on_settled(future: cf.Future[T], fn: Callable[[cf.Future[T]], None]) -> None:
    """Call ``fn(future)`` once it is settled (at once if it already is), on whichever
    thread settles it. ``fn`` must be quick and must not block."""
    future.add_done_callback(fn)


def when_all(futures: Mapping[str, cf.Future[Any]]) -> cf.Future[dict[str, cf.Future[Any]]]:
    """A future settled once every one of ``futures`` is, holding them all (none waits)."""
    joined: cf.Future[dict[str, cf.Future[Any]]] = cf.Future()
    remaining = [len(futures)]
    lock = threading.Lock()  # guards the countdown of futures not yet settled; never nested
    if not futures:
        joined.set_result({})
        return joined

    def one_settled(_: cf.Future[Any]) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            joined.set_result(dict(futures))

    for future in futures.values():
        future.add_done_callback(one_settled)
    return joined


def result_or_none(future: cf.Future[T] | None) -> T | None:
    """The result of a settled, successful future; None otherwise (never waits)."""
    if future is None or not future.done() or future.exception() is not None:
        return None
    return future.result()


def settle_from(target: cf.Future[T], source: cf.Future[T]) -> None:
    """Copy ``source``'s outcome into ``target`` (unless ``target`` is already settled)."""
    error = source.exception()
    try:
        if error is not None:
            target.set_exception(error)
        else:
            target.set_result(source.result())
    except cf.InvalidStateError:
        pass  # settled meanwhile by someone else (a deadline, a cancellation)


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
        self._wakeup = threading.Condition()  # guards the timer heap and thread; wakes the timer thread; never nested
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


# -- actors' loops and the store ------------------------------------------------------------
#
# DESIGN rule 2: no actor holds its message loop on store I/O. The threads that run
# actors' loops are marked (a ``LoopActor``'s thread for its whole life; a pool thread
# while it handles a ``PooledActor``'s messages), and the stores call
# ``refuse_on_actor_loop`` first: while checking is on (the test suite turns it on, as
# does ``VMCP_CHECK_STORE_CALLS=1``), a store call on a marked thread raises
# ``StoreOnActorLoop``; off (production's default), the check is one global read.

CHECK_STORE_CALLS_ENV = "VMCP_CHECK_STORE_CALLS"
_checking = os.environ.get(CHECK_STORE_CALLS_ENV) == "1"
_loop = threading.local()  # .actor: the actor whose loop this thread runs now (absent: none)


class StoreOnActorLoop(RuntimeError):
    """A store call made on an actor's message loop (a bug: hand it to the I/O pool)."""


def check_store_calls(on: bool = True) -> None:
    """Turn the check on (the test suite) or off (the default)."""
    global _checking
    _checking = on


def refuse_on_actor_loop(what: str) -> None:
    """Called by the stores before any I/O: raises ``StoreOnActorLoop`` on an actor's
    loop while checking is on."""
    if _checking:
        actor = getattr(_loop, "actor", None)
        if actor is not None:
            raise StoreOnActorLoop(f"{what} called on the message loop of {actor}: store I/O runs off actors' "
                                   "loops (on the I/O pool or the caller's thread), reporting back by message")


@contextlib.contextmanager
def actor_loop(actor: str) -> Iterator[None]:
    """This thread runs ``actor``'s loop until the block ends (a pooled actor's turn)."""
    outer = getattr(_loop, "actor", None)
    _loop.actor = actor
    try:
        yield
    finally:
        _loop.actor = outer


class LoopActor(pykka.ThreadingActor):
    """A ``ThreadingActor`` whose thread is marked as its loop (``refuse_on_actor_loop``)
    from ``on_start`` to ``on_stop``: every thread-per-actor actor here is one."""

    def _actor_loop(self) -> None:  # pykka's thread target: this thread is the loop for its whole life
        _loop.actor = type(self).__name__
        super()._actor_loop()
