"""LiveSessions: the gateway's own ids for requests it sends clients, their answers routed
back exactly once, bounded waits, and refusals that change nothing."""

from __future__ import annotations

import pytest

from tests.gateway import wait_until
from vmcp_actors.concurrency import Deadline
from vmcp_actors.core._exchange import ServerRequest
from vmcp_actors.protocol import Message
from vmcp_actors.protocol.mcp import check_answer, missing_capability
from vmcp_actors.users._live import LiveSessions

ELICITING = {"elicitation": {}}
WAIT = 30.0  # a deadline no test here means to reach: long, so a loaded machine does not reach it either


class Recorder:
    def __init__(self) -> None:
        self.answers: list[dict] = []

    def request(self, method: str = "elicitation/create", params: dict | None = None) -> ServerRequest:
        return ServerRequest(method, params if params is not None else {"message": "?", "requestedSchema": {"type": "object"}},
                             self.answers.append, "backend")


def response(request_id, result=None, error=None) -> Message:
    if error is not None:
        return Message("response", None, request_id, error, is_error=True)
    return Message("response", None, request_id, result)


@pytest.mark.parametrize("method, params, capabilities, refused", [
    ("sampling/createMessage", {}, {"sampling": {}}, False),
    ("sampling/createMessage", {}, {}, True),
    ("roots/list", {}, {"roots": {"listChanged": True}}, False),
    ("elicitation/create", {}, {"elicitation": {}}, False),  # empty: form only
    ("elicitation/create", {"mode": "url"}, {"elicitation": {}}, True),
    ("elicitation/create", {"mode": "url"}, {"elicitation": {"url": {}}}, False),
    ("elicitation/create", {"mode": "form"}, {"elicitation": {"url": {}}}, True),
    ("ping", {}, {}, False),
    ("tools/call", {}, {"sampling": {}}, True),  # not something a client answers
])
def test_what_a_client_can_be_asked_follows_what_it_declared(method, params, capabilities, refused):
    assert (missing_capability(method, params, capabilities) is not None) is refused


def test_each_request_gets_a_fresh_id_and_its_answer_goes_back_once():
    live, first, second = LiveSessions(), Recorder(), Recorder()
    a = live.ask("s1", first.request(), ELICITING, Deadline.after(WAIT))
    b = live.ask("s1", second.request(), ELICITING, Deadline.after(WAIT))
    assert a["id"] != b["id"] and a["method"] == "elicitation/create"
    assert live.answer("s1", response(b["id"], {"action": "decline"})) is None
    assert second.answers == [{"result": {"action": "decline"}}] and first.answers == []
    again = live.answer("s1", response(b["id"], {"action": "decline"}))
    assert again is not None and second.answers == [{"result": {"action": "decline"}}]


def test_an_answer_from_another_session_or_to_an_unknown_id_is_refused_and_changes_nothing():
    live, asked = LiveSessions(), Recorder()
    message = live.ask("mine", asked.request(), ELICITING, Deadline.after(WAIT))
    assert live.answer("theirs", response(message["id"], {"action": "accept"})) is not None
    assert live.answer("mine", response(message["id"] + 1000, {"action": "accept"})) is not None
    assert live.answer("mine", response(str(message["id"]), {"action": "accept"})) is not None  # "1" is not 1
    assert asked.answers == []
    assert live.answer("mine", response(message["id"], {"action": "cancel"})) is None
    assert asked.answers == [{"result": {"action": "cancel"}}]


@pytest.mark.parametrize("method, body, problem", [
    ("elicitation/create", {"action": "maybe"}, "action must be one of"),
    ("elicitation/create", {"action": "accept", "content": ["x"]}, "content must be an object"),
    ("sampling/createMessage", {"role": "assistant"}, "needs role, content and model"),
    ("roots/list", {"roots": [{"name": "no uri"}]}, "roots must be a list"),
    ("roots/list", "not an object", "must be an object"),
])
def test_malformed_answers_are_named(method, body, problem):
    assert problem in check_answer(method, response(1, body))


def test_malformed_answer_keeps_the_request_waiting_and_a_client_error_goes_back_as_an_error():
    live, asked = LiveSessions(), Recorder()
    message = live.ask("s", asked.request(), ELICITING, Deadline.after(WAIT))
    assert "action must be one of" in live.answer("s", response(message["id"], {"action": "maybe"})).message
    bad_error = live.answer("s", response(message["id"], error={"code": "x"}))
    assert bad_error is not None and asked.answers == []
    error = {"code": -1, "message": "user closed the dialog"}
    assert live.answer("s", response(message["id"], error=error)) is None
    assert asked.answers == [{"error": error}]


def test_a_client_lacking_the_capability_is_answered_for_at_once():
    live, asked = LiveSessions(), Recorder()
    assert live.ask("s", asked.request("sampling/createMessage", {}), {}, Deadline.after(WAIT)) is None
    assert asked.answers[0]["error"]["code"] == -32601
    assert "did not declare the sampling capability" in asked.answers[0]["error"]["message"]


def test_an_unanswered_request_fails_at_the_deadline():
    live, asked = LiveSessions(), Recorder()
    message = live.ask("s", asked.request(), ELICITING, Deadline.after(0.1))  # the deadline under test
    assert wait_until(lambda: asked.answers, timeout=WAIT)
    assert asked.answers[0]["error"]["code"] == -32001
    assert live.answer("s", response(message["id"], {"action": "accept"})) is not None


def test_a_calls_stream_ending_fails_only_its_own_requests():
    live, on_call, elsewhere = LiveSessions(), Recorder(), Recorder()
    call = live.begin_call("s", 7)
    live.ask("s", on_call.request(), ELICITING, Deadline.after(WAIT), call)
    other = live.ask("s", elsewhere.request(), ELICITING, Deadline.after(WAIT))
    live.end_call(call)
    assert "stream closed" in on_call.answers[0]["error"]["message"]
    assert elsewhere.answers == []
    assert live.answer("s", response(other["id"], {"action": "decline"})) is None


def test_cancel_reaches_every_exchange_of_the_call_even_one_opened_after():
    live, reasons = LiveSessions(), []
    call = live.begin_call("s", "r1")
    live.call_opened(call, reasons.append)
    assert live.cancel("s", "r1", "bored") and not live.cancel("s", "r1", "again")
    live.call_opened(call, reasons.append)  # a renewal's exchange, opened after the cancel
    assert reasons == ["bored", None]
    assert not live.cancel("s", "unknown", None) and not live.cancel("other", "r1", None)


def test_a_newer_stream_replaces_an_older_one_and_ending_the_session_closes_it():
    live = LiveSessions()
    older = live.open_stream("s")
    newer = live.open_stream("s")
    assert older.closed and not newer.closed
    assert not live.close_stream(older)  # no longer the session's stream
    assert live.push("s", {"method": "x"}) and next(newer.messages()) == {"method": "x"}
    asked = Recorder()
    live.ask("s", asked.request(), ELICITING, Deadline.after(WAIT))
    live.end_session("s")
    assert newer.closed and list(newer.messages()) == []
    assert "session ended" in asked.answers[0]["error"]["message"]
    assert not live.push("s", {"method": "x"})


def test_ping_from_a_backend_needs_no_capability():
    live, asked = LiveSessions(), Recorder()
    message = live.ask("s", asked.request("ping", {}), {}, Deadline.after(WAIT))
    assert message["method"] == "ping" and "params" not in message


def test_streams_past_the_limit_are_refused_but_a_session_may_always_replace_its_own(monkeypatch):
    monkeypatch.setattr("vmcp_actors.users._live.STANDALONE_STREAM_LIMIT", 2)
    live = LiveSessions()
    assert live.open_stream("a") is not None and live.open_stream("b") is not None
    assert live.open_stream("c") is None
    assert live.open_stream("a") is not None  # a reconnect replaces, it does not add
    live.end_session("b")
    assert live.open_stream("c") is not None
