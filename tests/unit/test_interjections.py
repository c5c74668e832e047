"""A backend request that arrives outside any call goes into the one call in flight on
that backend session, or nowhere (the caller then tries the client streams)."""

from __future__ import annotations

from vmcp_actors.backends import BackendRequest
from vmcp_actors.backends._channel import _INTERJECTED, _CallsInFlight


def request(answers: list[dict]) -> BackendRequest:
    return BackendRequest("b", "roots/list", {}, answers.append)


def test_only_a_single_call_in_flight_takes_an_interjected_request():
    calls, answers = _CallsInFlight(), []
    assert not calls.deliver_to_only(request(answers))  # none in flight
    first = calls.open()
    asked = request(answers)
    assert calls.deliver_to_only(asked)
    assert first.get_nowait() == (_INTERJECTED, asked)
    second = calls.open()
    assert not calls.deliver_to_only(request(answers))  # two in flight: neither is the one
    calls.close(second, "b")
    calls.close(first, "b")
    assert not calls.deliver_to_only(request(answers)) and answers == []


def test_a_request_interjected_as_the_call_ends_is_refused_not_lost():
    calls, answers = _CallsInFlight(), []
    mailbox = calls.open()
    assert calls.deliver_to_only(request(answers))
    calls.close(mailbox, "b")  # the call ended before it read its mailbox
    assert answers == [{"error": {"code": -32603, "message": "roots/list: the call it was delivered to ended"}}]
