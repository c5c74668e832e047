"""PooledActor keeps pykka's guarantees (one message at a time, in order, on_start first,
on_stop last, asks answered or failed, never lost) while thousands of actors share a few
threads."""

from __future__ import annotations

import threading

import pykka
import pytest

from vmcp_actors.pooled import ACTOR_WORKERS, PooledActor, actor_pool_stats

WAIT = 30.0  # for answers that take milliseconds: generous, so a loaded machine does not fail a test


class Recorder(PooledActor):
    def __init__(self, log: list, gate: threading.Event | None = None, holding: threading.Event | None = None):
        """``note`` waits for ``gate`` (if given), after setting ``holding``."""
        super().__init__()
        self.log = log
        self.gate = gate
        self.holding = holding
        self.busy = 0

    def on_start(self) -> None:
        self.log.append("start")

    def on_stop(self) -> None:
        self.log.append("stop")

    def note(self, value) -> int:
        self.busy += 1
        assert self.busy == 1, "two messages of one actor handled at once"
        if self.holding is not None:
            self.holding.set()
        if self.gate is not None:
            self.gate.wait(WAIT)
        self.log.append(value)
        self.busy -= 1
        return len(self.log)

    def fail(self) -> None:
        raise ValueError("refused")

    def on_receive(self, message):
        self.log.append(("told", message))


def test_messages_are_handled_one_at_a_time_in_order_after_on_start_and_before_on_stop():
    log: list = []
    ref = Recorder.start(log)
    proxy = ref.proxy()
    futures = [proxy.note(i) for i in range(200)]
    assert [f.get(timeout=WAIT) for f in futures] == list(range(2, 202))
    ref.stop(block=True, timeout=WAIT)
    assert log == ["start", *range(200), "stop"]
    assert not ref.is_alive()


def test_an_ask_to_a_failing_handler_gets_the_exception_and_the_actor_lives_on():
    ref = Recorder.start([])
    with pytest.raises(ValueError, match="refused"):
        ref.proxy().fail().get(timeout=WAIT)
    assert ref.proxy().note("after").get(timeout=WAIT) == 2
    ref.tell("hello")
    assert ref.proxy().log.get(timeout=WAIT)[-1] == ("told", "hello")


def test_asks_waiting_when_the_actor_stops_get_actor_dead_error_not_silence():
    gate = threading.Event()
    ref = Recorder.start([], gate)
    proxy = ref.proxy()
    first = proxy.note("held")  # holds the actor until the gate opens
    ref.stop(block=False)  # queued behind the held message
    later = proxy.note("never")  # queued behind the stop
    gate.set()
    assert first.get(timeout=WAIT) == 2
    with pytest.raises(pykka.ActorDeadError):
        later.get(timeout=WAIT)
    with pytest.raises(pykka.ActorDeadError):
        ref.tell("too late")


def test_thousands_of_actors_share_the_pool_and_a_slow_one_delays_no_other():
    refs = [Recorder.start([]) for _ in range(2000)]
    threads_before = threading.active_count()
    answers = [ref.proxy().note("x") for ref in refs]
    assert all(f.get(timeout=WAIT) == 2 for f in answers)
    assert threading.active_count() <= threads_before + ACTOR_WORKERS
    assert actor_pool_stats()["workers"] <= ACTOR_WORKERS

    gate, holding = threading.Event(), threading.Event()
    slow = Recorder.start([], gate, holding)
    held = slow.proxy().note("slow")
    assert holding.wait(WAIT)  # the slow actor holds a pool worker until the gate opens
    # Answered while the slow actor still holds its worker: not behind it.
    assert refs[0].proxy().note("quick").get(timeout=WAIT) == 3
    gate.set()
    assert held.get(timeout=WAIT) == 2
    for ref in refs:
        ref.stop(block=False)
