"""Backend bulkheads (``backends[].maxConcurrentCalls``): at most that many ``tools/call``
in flight to the backend at once; the others wait their turn within their own deadline,
and one still waiting when it passes gets the deadline's error without reaching the
backend.

A call holds its place from before it is sent until it ends (``Place``), except while it
is parked: a 2026-07-28 call whose backend asked its client something waits, in this
process, for the client's retry with the answer (``edge._modern.ParkedCalls``), possibly
until its deadline. The backend's handler then only waits on the client, so the parked
call gives its place back (``Place.give_back``); the retry takes a place again
(``Place.take``) before the answers reach the backend, waiting like any new call, within
the call's deadline. A client that never comes back holds no place, so it cannot exhaust
``maxConcurrentCalls``: the bulkhead bounds the calls a backend works on, not the ones
parked on a client.

In one process the places are a semaphore per backend. With records in Redis they are
leases in a sorted set per backend (``{keyPrefix}bh:{backend}``, scored by when each
lease lapses): one script drops lapsed leases and takes a place when there is one, so the
backend never sees more than the limit from all workers together; a worker that died
holding places loses them when its calls' deadlines pass. Waiters there poll (every
``POLL_FIRST`` seconds, backing off to ``POLL_AT_MOST``): a place freed elsewhere is not
announced.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from vmcp_actors.concurrency import Deadline

logger = logging.getLogger(__name__)

POLL_FIRST = 0.01
POLL_AT_MOST = 0.1
LEASE_MARGIN = 5.0  # seconds a lease outlives its call's deadline (a late release still finds it)

Release = Callable[[], None]


class QueueTimeout(Exception):
    """The call's deadline passed while it waited for a place."""


# KEYS[1]: the backend's leases; ARGV: limit, lease id, seconds the lease lasts.
# Returns 1 when the lease was taken, 0 when every place is held.
_TAKE = """
local now = redis.call('TIME')
now = tonumber(now[1]) + tonumber(now[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])) + 1, 'GT')
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])) + 1, 'NX')
return 1
"""


class Place:
    """One call's place at a backend's bulkhead (see the module docstring): ``take`` waits
    for one (at once when the backend has no limit, or the place is held already),
    ``give_back`` frees it while the call is parked, ``leave`` frees it for good (once,
    however often called; a call that is over takes none again). Calling it is ``leave``."""

    def __init__(self, bulkheads: Bulkheads, backend: str):
        self._bulkheads = bulkheads
        self.backend = backend
        self._lock = threading.Lock()  # guards _release and _left; never held while waiting or releasing
        self._release: Release | None = None  # set while the place is held
        self._left = False

    def __call__(self) -> None:
        self.leave()

    @property
    def held(self) -> bool:
        with self._lock:
            return self._release is not None

    def take(self, deadline: Deadline, cancelled: Callable[[], bool] = lambda: False) -> None:
        """A place, waited for until ``deadline`` or ``cancelled()`` (QueueTimeout)."""
        with self._lock:
            if self._release is not None or self._left:
                return
        release = self._bulkheads.wait_for_place(self.backend, deadline, cancelled)
        with self._lock:
            left = self._left
            if not left:
                self._release = release
        if left:  # the call ended while it waited: the place goes straight back
            release()

    def give_back(self) -> None:
        """The call waits on its client (parked): its place is free meanwhile."""
        with self._lock:
            release, self._release = self._release, None
        if release is not None:
            release()

    def leave(self) -> None:
        with self._lock:
            self._left = True
            release, self._release = self._release, None
        if release is not None:
            release()


class Bulkheads:
    """The process's bulkheads (thread-safe), by backend name."""

    def __init__(self, limits: Mapping[str, int], redis_client: Any = None, key_prefix: str = ""):
        self._limits = dict(limits)
        self._redis = redis_client
        self._prefix = f"{key_prefix}bh:"
        self._take = redis_client.register_script(_TAKE) if redis_client is not None else None
        self._places = {name: threading.BoundedSemaphore(limit) for name, limit in self._limits.items()}
        self._lock = threading.Lock()  # guards the counters below
        self._waiting: dict[str, int] = dict.fromkeys(self._limits, 0)
        self._in_flight: dict[str, int] = dict.fromkeys(self._limits, 0)
        self._timed_out: dict[str, int] = dict.fromkeys(self._limits, 0)

    def limit(self, backend: str) -> int | None:
        return self._limits.get(backend)

    def place(self, backend: str) -> Place:
        """A call's place at ``backend``, not taken yet."""
        return Place(self, backend)

    def enter(self, backend: str, deadline: Deadline, cancelled: Callable[[], bool] = lambda: False) -> Place:
        """Wait for a place at ``backend`` (at once when it has no limit) until ``deadline``
        or until ``cancelled()``; the place (calling it frees it)."""
        place = self.place(backend)
        place.take(deadline, cancelled)
        return place

    def wait_for_place(self, backend: str, deadline: Deadline, cancelled: Callable[[], bool]) -> Release:
        """(``Place.take``.) Wait for a place at ``backend``; what frees it (once)."""
        if backend not in self._limits:
            return _nothing
        self._count(self._waiting, backend, 1)
        try:
            release = self._enter_shared(backend, deadline, cancelled) if self._take is not None \
                else self._enter_local(backend, deadline, cancelled)
        except QueueTimeout:
            self._count(self._timed_out, backend, 1)
            raise
        finally:
            self._count(self._waiting, backend, -1)
        self._count(self._in_flight, backend, 1)
        done = threading.Event()

        def leave() -> None:
            if not done.is_set():  # once, however many times it is called
                done.set()
                self._count(self._in_flight, backend, -1)
                release()
        return leave

    def _enter_local(self, backend: str, deadline: Deadline, cancelled: Callable[[], bool]) -> Release:
        place = self._places[backend]
        while not place.acquire(timeout=min(POLL_AT_MOST, max(0.0, deadline.remaining()))):
            if deadline.remaining() <= 0 or cancelled():
                raise QueueTimeout(backend)
        return place.release

    def _enter_shared(self, backend: str, deadline: Deadline, cancelled: Callable[[], bool]) -> Release:
        import redis

        key, lease = self._prefix + backend, secrets.token_hex(8)
        wait = POLL_FIRST
        while True:
            remaining = deadline.remaining()
            if remaining <= 0 or cancelled():
                raise QueueTimeout(backend)
            try:
                taken = self._take(keys=[key], args=[self._limits[backend], lease, remaining + LEASE_MARGIN])
            except (redis.RedisError, OSError) as error:
                # Unreachable: the process's own places still bound what this worker sends.
                logger.warning("bulkhead %r: Redis unreachable (%s); this worker's own limit applies", backend,
                               type(error).__name__)
                return self._enter_local(backend, deadline, cancelled)
            if taken:
                return lambda: self._give_back(key, lease)
            time.sleep(min(wait, max(0.0, deadline.remaining())))
            wait = min(wait * 2, POLL_AT_MOST)

    def _give_back(self, key: str, lease: str) -> None:
        import redis

        try:
            self._redis.zrem(key, lease)
        except (redis.RedisError, OSError):
            pass  # the lease lapses with its call's deadline

    def _count(self, counters: dict[str, int], backend: str, change: int) -> None:
        with self._lock:
            counters[backend] += change

    def snapshot(self) -> dict[str, dict[str, int]]:
        """backend -> limit, calls in flight and waiting in this process, and waits that
        timed out since start (metrics, admin state)."""
        with self._lock:
            return {name: {"limit": limit, "inFlight": self._in_flight[name], "waiting": self._waiting[name],
                           "timedOut": self._timed_out[name]} for name, limit in self._limits.items()}


def _nothing() -> None:
    pass
