"""What a backend sends outside any call reaches one client, or no one: never a guess.
And a backend whose handshake failed backs off for everyone who would try it next."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from vmcp_actors.backends._backoff import FIRST_BACKOFF, MOST_BACKOFF, HandshakeBackoff
from vmcp_actors.backends._bus import MessageBus
from vmcp_actors.backends._http import STREAM_OPEN, Abort
from vmcp_actors.exceptions import (
    BackendAuthError,
    BackendHTTPError,
    BackendNotTried,
    BackendTimeout,
    BackendUnavailable,
)

ROOTS_REQUEST = {"jsonrpc": "2.0", "id": "r1", "method": "roots/list"}


class FakeLink:
    """Answers initialize at once; records what the gateway sends."""

    def __init__(self, bus: MessageBus):
        self.bus = bus
        self.sent: list[dict[str, Any]] = []
        self.refused = threading.Event()

    def send(self, message: dict[str, Any], headers: Mapping[str, str] | None = None) -> None:
        self.sent.append(message)
        if message.get("method") == "initialize":
            self.bus.received(self, {"jsonrpc": "2.0", "id": message["id"], "result": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "fake", "version": "1"}}})
        if "error" in message:
            self.refused.set()

    def close(self) -> None:
        pass


def next_within(stream: Any, seconds: float = 10.0) -> Any:
    """The stream's next message, or a failure (not a hang) when none comes."""
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(next(stream)), daemon=True)
    reader.start()
    reader.join(seconds)
    assert got, "nothing came on the stream"
    return got[0]


def opened_bus(one_client: bool) -> tuple[MessageBus, FakeLink]:
    links: list[FakeLink] = []

    def open_link(bus: MessageBus, headers: Mapping[str, str]) -> FakeLink:
        links.append(FakeLink(bus))
        return links[-1]

    bus = MessageBus("kid", open_link, one_client=one_client)
    exchange = bus.request({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}}, 5.0)
    with pytest.raises(StopIteration):
        next(exchange)
    return bus, links[0]


def test_one_clients_request_before_its_listener_waits_for_it():
    bus, link = opened_bus(one_client=True)
    link.bus.received(link, ROOTS_REQUEST)  # right after initialize: nobody listens yet
    abort = Abort()
    stream = bus.listen(abort)
    assert next(stream) is STREAM_OPEN
    assert next_within(stream) == ROOTS_REQUEST
    assert not any("error" in message for message in link.sent)
    abort.abort()


def test_one_clients_request_that_no_listener_takes_is_refused(monkeypatch):
    monkeypatch.setattr("vmcp_actors.backends._bus.UNCLAIMED_WAIT", 0.05)
    bus, link = opened_bus(one_client=True)
    link.bus.received(link, ROOTS_REQUEST)
    assert link.refused.wait(10)
    assert link.sent[-1]["id"] == "r1" and link.sent[-1]["error"]["code"] == -32603


def test_a_shared_link_refuses_a_request_outside_a_call_and_keeps_other_notifications_to_itself():
    bus, link = opened_bus(one_client=False)
    abort = Abort()
    stream = bus.listen(abort)
    assert next(stream) is STREAM_OPEN
    link.bus.received(link, {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x"}})
    link.bus.received(link, ROOTS_REQUEST)  # several clients share it: whose roots?
    assert link.refused.is_set()
    assert link.sent[-1]["id"] == "r1" and link.sent[-1]["error"]["code"] == -32603
    changed = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    link.bus.received(link, changed)  # everyone's
    assert next_within(stream) == changed  # the log message before it went to no one
    abort.abort()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fail_with(backoff: HandshakeBackoff, error: Exception, owner: str = "ada") -> None:
    with pytest.raises(type(error)), backoff.attempt("stuck", owner):
        raise error


def test_a_failed_handshake_backs_off_doubling_for_its_owner_only():
    clock = Clock()
    backoff = HandshakeBackoff(clock=clock)
    fail_with(backoff, BackendTimeout("stuck", "backend 'stuck' did not answer initialize"))

    with pytest.raises(BackendUnavailable, match="did not answer initialize") as refused, backoff.attempt("stuck", "ada"):
        pass
    assert "stuck" in str(refused.value)
    with backoff.attempt("stuck", "bob"):  # another person's credentials may work
        pass
    assert backoff.snapshot()["stuck"]["failures"] == 1

    clock.now += FIRST_BACKOFF
    fail_with(backoff, BackendUnavailable("stuck", "backend 'stuck' ended: exit 1"))
    clock.now += FIRST_BACKOFF  # doubled: still backing off
    assert backoff.refusal("stuck", "ada") is not None
    clock.now += FIRST_BACKOFF
    with backoff.attempt("stuck", "ada"):  # its time came; it answered
        pass
    assert backoff.refusal("stuck", "ada") is None and backoff.snapshot() == {}

    for _ in range(20):
        clock.now += MOST_BACKOFF
        fail_with(backoff, BackendTimeout("stuck", "no answer"))
    assert backoff.snapshot()["stuck"]["retryInSeconds"] == MOST_BACKOFF


def test_a_refused_credential_or_the_gateways_own_refusal_does_not_back_off():
    backoff = HandshakeBackoff(clock=Clock())
    fail_with(backoff, BackendAuthError("stuck", "backend 'stuck' refused the credentials"))
    fail_with(backoff, BackendHTTPError("stuck", "backend 'stuck' answered HTTP 401", 401))
    fail_with(backoff, BackendNotTried("stuck", "all 1 processes of this worker are busy"))
    assert backoff.refusal("stuck", "ada") is None


def test_a_handshake_under_way_past_the_budget_is_not_waited_for_by_others():
    clock = Clock()
    backoff = HandshakeBackoff(patience=lambda backend: 5.0, clock=clock)
    with backoff.attempt("stuck", "ada"):
        clock.now += 4.0
        assert backoff.refusal("stuck", "ada") is None  # within the budget: others try too
        clock.now += 2.0
        assert "its handshake has not answered for 6s" in (backoff.refusal("stuck", "ada") or "")
    assert backoff.refusal("stuck", "ada") is None  # it answered in the end
