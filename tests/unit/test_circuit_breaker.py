"""The circuit breaker's states on a fake clock: closed -> open after the threshold ->
half-open after the timeout (one probe only) -> closed on success, open again on failure."""

from __future__ import annotations

import pytest

from vmcp_actors.backends import CircuitBreaker, CircuitOpen
from vmcp_actors.config import CircuitBreakerConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_the_threshold_then_one_probe_decides():
    clock = Clock()
    breaker = CircuitBreaker("b", CircuitBreakerConfig(True, failure_threshold=3, timeout=10), clock)
    for _ in range(2):
        breaker.admit()
        breaker.failed()
    breaker.admit()
    breaker.succeeded()  # a success in between starts the count again
    assert breaker.state == "closed" and breaker.failures == 0
    for _ in range(3):
        breaker.admit()
        breaker.failed()
    assert breaker.state == "open"
    with pytest.raises(CircuitOpen, match=r"backend 'b' is unavailable: its circuit is open .*next try in 10s"):
        breaker.admit()

    clock.now += 10
    breaker.admit()  # the probe
    assert breaker.state == "half_open"
    with pytest.raises(CircuitOpen, match="a probe call is under way"):
        breaker.admit()
    breaker.failed()  # the probe failed: open again, for another timeout
    assert breaker.state == "open" and breaker.opened == 2
    clock.now += 10
    breaker.admit()
    breaker.succeeded()
    assert breaker.snapshot() == {"state": "closed", "failuresInARow": 0, "opened": 2}
    breaker.admit()  # closed: calls go through
