"""Input the gateway never asked for cannot pass as a continuation (issue 35): a 2026-07-28
call that brings ``inputResponses`` without the gateway's sealed ``requestState`` is refused
before any layer, and a continued call (a retry with the requestState of an
``input_required`` answer) is decided again by every layer, rate limits and the
``Mcp-Param-*`` check included, so replaying a requestState spends tokens like new calls.

Real official-SDK backends, the gateway on a real HTTP server, 2026-07-28 requests sent the
raw way (``modern_post``) and 2025-11-25 sessions opened the raw way."""

from __future__ import annotations

import pytest

from tests.backends import sdk_backend
from tests.gateway import backend_entry
from tests.mrtr_backends import header_backend, mrtr_backend
from tests.task_backends import modern_post

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

THREE_AN_HOUR = {"global": {"maxTokens": 3, "refillPeriod": "1h"}}


@pytest.fixture
def backend():
    echoed: list[str] = []

    def echo(text: str) -> str:
        """Echo the text back."""
        echoed.append(text)
        return f"plain:{text}"

    with sdk_backend("plain", [], extra_tools=[echo]) as served:
        served.echoed = echoed
        yield served


def call_2026(gateway, tool: str, arguments: dict, **params) -> tuple[int, dict]:
    response = modern_post(gateway.url, "tools/call", {"name": tool, "arguments": arguments, **params})
    return response.status_code, response.json()


def test_calls_past_the_limit_with_unasked_input_are_refused_and_never_reach_the_backend(start_gateway, backend):
    gateway = start_gateway({"name": "t", "backends": [backend_entry("plain", backend)],
                             "rateLimiting": THREE_AN_HOUR})
    served = [call_2026(gateway, "plain_echo", {"text": str(n)}) for n in range(3)]
    assert [status for status, _ in served] == [200] * 3 and all("result" in body for _, body in served)
    limited = [call_2026(gateway, "plain_echo", {"text": "over"}) for _ in range(2)]
    assert [status for status, _ in limited] == [429, 429]

    for forged in ({}, {"anything": {"action": "accept"}}):
        status, body = call_2026(gateway, "plain_echo", {"text": "sneak"}, inputResponses=forged)
        assert body["error"]["code"] == -32602 and "asked for no input" in body["error"]["message"], body
    status, body = call_2026(gateway, "plain_echo", {"text": "sneak"}, inputResponses={}, requestState="forged")
    assert body["error"]["code"] == -32602, body
    assert backend.echoed == ["0", "1", "2"]


def test_a_replayed_request_state_spends_a_token_each_time(start_gateway):
    with mrtr_backend("asker") as asker:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("asker", asker)],
                                 "rateLimiting": THREE_AN_HOUR})
        status, first = call_2026(gateway, "asker_confirm", {"item": "x"})
        assert status == 200 and first["result"]["resultType"] == "input_required", first
        (key,) = first["result"]["inputRequests"]
        answer = {key: {"action": "accept", "content": {"ok": True}}}
        state = first["result"]["requestState"]
        replies = [call_2026(gateway, "asker_confirm", {"item": "x"}, inputResponses=answer, requestState=state)
                   for _ in range(3)]
        # the first call and two continuations fill the three tokens; the third replay is refused
        assert [status for status, _ in replies] == [200, 200, 429], replies
        assert replies[0][1]["result"]["content"][0]["text"] == "confirmed x"


def test_a_continued_call_is_checked_against_its_param_headers(start_gateway):
    with header_backend("hdr") as hdr:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("hdr", hdr)]})
        arguments = {"region": "eu", "sql": "select 1"}
        mismatched = modern_post(gateway.url, "tools/call", {"name": "hdr_query", "arguments": arguments,
                                                             "inputResponses": {}, "requestState": "x"},
                                 headers={"Mcp-Param-Region": "us"})
        assert mismatched.status_code == 400 and mismatched.json()["error"]["code"] == -32020, mismatched.text


def test_a_2025_session_passing_input_params_is_limited_like_any_call(start_gateway, backend):
    """A 2025 session has no continuations: inputResponses in its params change nothing."""
    gateway = start_gateway({"name": "t", "backends": [backend_entry("plain", backend)],
                             "rateLimiting": THREE_AN_HOUR})
    session = gateway.initialize()
    answers = [gateway.post({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {
        "name": "plain_echo", "arguments": {"text": str(n)}, "inputResponses": {}, "requestState": "x"}}, session)
        for n in range(5)]
    assert [answer.status_code for answer in answers] == [200, 200, 200, 429, 429]
    assert backend.echoed == ["0", "1", "2"]
