"""PooledActor: a pykka actor whose messages are handled on a small shared pool of
threads instead of a thread of its own.

A ``ThreadingActor`` is a thread for its whole life, most of it spent waiting for a
message, and a thread is the scarce thing here (``kernel.pid_max``; starting one under
load costs milliseconds of GIL hand-offs). A pooled actor keeps the actor model's
guarantees, one message at a time, in order, state touched only by its handler, but
holds a thread only while it handles a message: its inbox schedules one drain job on
the actor pool when the first message arrives, and the job handles messages until the
inbox is empty (or a batch is done, so busy actors take turns).

The rule that makes a shared pool safe: a pooled actor's handlers never wait, neither
for the network (that is pooled I/O, ``concurrency.run_in_thread``) nor for an answer
from another actor on the same pool. Actors that do ask and wait (the UserActor asks its
connections) stay ``ThreadingActor``; the connections they ask answer at once.

pykka calls the inbox's ``put`` from any thread; its ``get``/``empty`` are only used by
pykka's teardown, which runs in the drain job here. A drain job marks its thread as the
actor's loop for its turn (``concurrency.actor_loop``), so a store call there is refused
while the check is on, as on a ``LoopActor``'s thread.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import deque
from typing import Any

import pykka
from pykka import ActorRegistry
from pykka._envelope import Envelope  # noqa: PLC2701 - the inbox protocol's item type

from vmcp_actors.concurrency import BoundedPool, actor_loop

logger = logging.getLogger(__name__)

# Threads that handle every pooled actor's messages; handlers never wait, so a few keep
# up with thousands of actors.
ACTOR_WORKERS = 8
# Messages one drain job handles before the actor goes to the back of the pool's queue.
BATCH = 32

_ACTOR_POOL = BoundedPool(ACTOR_WORKERS, name="vmcp-actor")


class _PooledInbox:
    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the inbox's envelopes and its draining flag; never nested
        self._envelopes: deque[Envelope[Any]] = deque()
        self._actor: PooledActor | None = None  # set when the actor starts
        self._draining = False

    def put(self, envelope: Envelope[Any], /) -> None:
        with self._lock:
            self._envelopes.append(envelope)
            schedule = self._actor is not None and not self._draining
            if schedule:
                self._draining = True
        if schedule:
            assert self._actor is not None
            _ACTOR_POOL.submit(self._actor._drain)  # noqa: SLF001 - the inbox is the actor's own

    def get(self) -> Envelope[Any]:
        with self._lock:
            return self._envelopes.popleft()

    def empty(self) -> bool:
        with self._lock:
            return not self._envelopes

    def start(self, actor: PooledActor) -> None:
        with self._lock:
            self._actor = actor
            self._draining = True  # the first job (on_start, then what waits) is submitted now

    def take(self) -> Envelope[Any] | None:
        """The next envelope; None, and draining over, when there is none."""
        with self._lock:
            if self._envelopes:
                return self._envelopes.popleft()
            self._draining = False
            return None

    def release_if_empty(self) -> bool:
        with self._lock:
            if self._envelopes:
                return False
            self._draining = False
            return True


class PooledActor(pykka.Actor):
    """A pykka actor handled on the shared actor pool (see the module docstring)."""

    actor_inbox: _PooledInbox  # type: ignore[assignment]

    @staticmethod
    def _create_actor_inbox() -> _PooledInbox:  # type: ignore[override]
        return _PooledInbox()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return pykka.ThreadingFuture()

    def _start_actor_loop(self) -> None:
        self.actor_inbox.start(self)
        _ACTOR_POOL.submit(self._first_drain)

    def _first_drain(self) -> None:
        with actor_loop(type(self).__name__):  # this pool thread is the actor's loop for the turn
            self._actor_loop_setup()  # on_start, before any message
            self._drain()

    def _drain(self) -> None:
        with actor_loop(type(self).__name__):
            self._drain_turn()

    def _drain_turn(self) -> None:
        inbox = self.actor_inbox
        for _ in range(BATCH):
            if self.actor_stopped.is_set():
                self._tear_down()
                return
            envelope = inbox.take()
            if envelope is None:
                return
            self._handle_envelope(envelope)
        if self.actor_stopped.is_set():
            self._tear_down()
        elif not inbox.release_if_empty():
            _ACTOR_POOL.submit(self._drain)  # more waiting: take turns with the other actors

    def _tear_down(self) -> None:
        """Stopped: whatever is still in the inbox (or arrives) gets ActorDeadError."""
        while True:
            self._actor_loop_teardown()
            if self.actor_inbox.release_if_empty():
                return

    def _handle_envelope(self, envelope: Envelope[Any]) -> None:
        """One message, as pykka's own loop handles it."""
        try:
            response = self._handle_receive(envelope.message)
            if envelope.reply_to is not None:
                envelope.reply_to.set(response)
        except Exception:
            if envelope.reply_to is not None:
                logger.info("Exception returned from %s to caller:", self, exc_info=sys.exc_info())
                envelope.reply_to.set_exception()
            else:
                self._handle_failure(*sys.exc_info())
                try:
                    self.on_failure(*sys.exc_info())
                except Exception:  # noqa: BLE001
                    self._handle_failure(*sys.exc_info())
        except BaseException:  # noqa: BLE001 - as pykka: a BaseException stops every actor
            logger.debug("%r in %s. Stopping all actors.", sys.exc_info()[1], self)
            self._stop()
            ActorRegistry.stop_all()


def actor_pool_stats() -> dict[str, int]:
    return {"workers": _ACTOR_POOL.workers, "maxWorkers": ACTOR_WORKERS, "queued": _ACTOR_POOL.queued}
