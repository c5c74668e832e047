"""A call's place at a backend's bulkhead (issue 35): taken before the call is sent, given
back while the call is parked on its client, taken again (waiting like a new call, within
the call's deadline) when the client's retry comes, and freed for good exactly once."""

from __future__ import annotations

import threading

import pytest

from vmcp_actors.concurrency import Deadline
from vmcp_actors.edge._driver import CallRun
from vmcp_actors.limits import Bulkheads, QueueTimeout
from vmcp_actors.protocol import REQUEST_TIMEOUT, JsonRpcError

WAIT = 30.0  # a deadline no test here means to reach


def in_flight(bulkheads: Bulkheads) -> int:
    return bulkheads.snapshot()["b"]["inFlight"]


def test_a_place_given_back_frees_the_bulkhead_and_is_taken_again():
    bulkheads = Bulkheads({"b": 1})
    parked = bulkheads.enter("b", Deadline.after(WAIT))
    assert parked.held and in_flight(bulkheads) == 1
    parked.give_back()
    parked.give_back()  # once is enough
    assert not parked.held and in_flight(bulkheads) == 0
    other = bulkheads.enter("b", Deadline.after(WAIT))  # a new call gets the place at once
    other.leave()
    parked.take(Deadline.after(WAIT))
    assert parked.held and in_flight(bulkheads) == 1
    parked.leave()
    parked.leave()
    parked()  # calling it is leaving: still once
    assert in_flight(bulkheads) == 0
    assert bulkheads.enter("b", Deadline.after(WAIT)).held  # the semaphore was released exactly once


def test_a_place_left_takes_nothing_again():
    bulkheads = Bulkheads({"b": 1})
    place = bulkheads.enter("b", Deadline.after(WAIT))
    place.give_back()
    place.leave()  # the parked call ended at its deadline
    place.take(Deadline.after(WAIT))
    assert not place.held and in_flight(bulkheads) == 0


def test_a_continuation_waits_for_a_place_like_a_new_call():
    bulkheads = Bulkheads({"b": 1})
    run = CallRun(iter(()), Deadline.after(WAIT), place=bulkheads.enter("b", Deadline.after(WAIT)))
    run.give_back_place()
    busy = bulkheads.enter("b", Deadline.after(WAIT))  # a new call took the place meanwhile
    took = threading.Event()
    waiting = threading.Thread(target=lambda: (run.take_place_again(), took.set()), daemon=True)
    waiting.start()
    assert bulkheads.snapshot()["b"]["inFlight"] == 1
    busy.leave()  # the new call ends: the continuation gets its place
    assert took.wait(WAIT) and run.place.held


def test_a_continuation_that_finds_no_place_by_its_deadline_fails_with_the_deadlines_error():
    bulkheads = Bulkheads({"b": 1})
    run = CallRun(iter(()), Deadline.after(0.2), place=bulkheads.place("b"))  # the deadline under test
    busy = bulkheads.enter("b", Deadline.after(WAIT))
    with pytest.raises(JsonRpcError) as refused:
        run.take_place_again()
    assert refused.value.code == REQUEST_TIMEOUT and "maxConcurrentCalls" in refused.value.message
    assert not run.place.held and bulkheads.snapshot()["b"]["timedOut"] == 1
    busy.leave()


def test_a_backend_without_a_limit_has_places_for_everyone():
    bulkheads = Bulkheads({"b": 1})
    place = bulkheads.enter("other", Deadline.after(WAIT))
    place.give_back()
    place.take(Deadline.after(0.0))
    place.leave()
    with pytest.raises(QueueTimeout):
        blocked = bulkheads.enter("b", Deadline.after(WAIT))
        bulkheads.enter("b", Deadline.after(0.0))
    blocked.leave()
