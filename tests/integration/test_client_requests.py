"""Everything MCP 2025-11-25 offers through the gateway: requests a backend sends the
client (sampling, elicitation in form and URL mode, roots) on the call's stream and on the
standalone stream, subscriptions, list changes, cancellation; and every bad answer refused
without changing anything else. Real official-SDK backends and clients."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import mcp
import pytest
import requests
from mcp import types

from tests.asking_backends import OTHER_URI, WATCHED_URI, asking_backend
from tests.backends import sdk_backend
from tests.gateway import MCP_HEADERS, backend_entry, wait_until
from vmcp_actors.protocol.sse import iter_sse_events


@pytest.fixture(autouse=True)
def quick_keepalive(monkeypatch):
    """A client that left its standalone stream is noticed at the next write: write often."""
    monkeypatch.setattr("vmcp_actors.users._live.KEEPALIVE_EVERY", 0.2)


def _config(*backends: tuple[str, Any], **aggregation: Any) -> dict:
    # The asking backend sends its requests mid-call, as a 2025 backend does: spoken to as one.
    config: dict[str, Any] = {"name": "t", "backends": [backend_entry(name, served, "legacy")
                                                         for name, served in backends]}
    config["aggregation"] = {"conflictResolution": "prefix", **aggregation} if aggregation else \
        {"conflictResolution": "prefix", "conflictResolutionConfig": {"prefixFormat": "{workload}_"}}
    return config


async def _sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    prompt = params.messages[0].content.text
    return types.CreateMessageResult(role="assistant", model="test-model",
                                     content=types.TextContent(type="text", text=prompt.upper()))


def _elicitation(answer: dict[str, Any]):
    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        if getattr(params, "mode", "form") == "url":
            return types.ElicitResult(action="accept")
        return types.ElicitResult(action="accept", content=answer)

    return elicit


async def _roots(context: Any) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[types.Root(uri="file:///work/project", name="project")])


def _text(result: Any) -> str:
    assert not result.is_error, result
    return result.content[0].text


def _run(work, **client_args: Any) -> Any:
    async def main() -> Any:
        async with mcp.Client(**client_args) as client:
            return await work(client)

    return asyncio.run(main())


# -- requests for the client, with the official SDK client ---------------------------------


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_sampling_elicitation_and_roots_reach_the_client_and_its_answers_the_backend(start_gateway, mode):
    with asking_backend() as backend:
        gateway = start_gateway(_config(("asking", backend)))

        async def work(client: mcp.Client) -> list[str]:
            answers = [_text(await client.call_tool("asking_ask_llm", {"prompt": "hello"})),
                       _text(await client.call_tool("asking_ask_user", {"question": "Who?"})),
                       _text(await client.call_tool("asking_ask_url", {}))]
            # The SDK sends roots/list on its standalone stream, outside the call: the
            # gateway delivers it into the user's one call in flight on that backend (on
            # the call's stream for a 2025 session, as input_required for 2026-07-28).
            answers.append(_text(await asyncio.wait_for(client.call_tool("asking_roots", {}), 20)))
            return answers

        answers = _run(work, server=gateway.url, mode=mode, sampling_callback=_sampling,
                       elicitation_callback=_elicitation({"name": "Ada", "count": 3}), list_roots_callback=_roots)
        assert answers == ["model test-model said: HELLO", "accepted: Ada x3", "url: accept", "file:///work/project"]


def test_a_client_without_the_capability_gets_the_backend_an_error_at_once(start_gateway):
    with asking_backend() as backend:
        gateway = start_gateway(_config(("asking", backend)))

        async def work(client: mcp.Client) -> Any:
            try:
                return await asyncio.wait_for(client.call_tool("asking_ask_llm", {"prompt": "hello"}), 5)
            except mcp.MCPError as error:
                return error

        error = _run(work, server=gateway.url, mode="legacy")  # no callbacks: nothing declared
        assert isinstance(error, mcp.MCPError) and "did not declare the sampling capability" in str(error)


def test_two_sessions_eliciting_at_once_each_get_their_own_request(start_gateway):
    with asking_backend() as backend:
        gateway = start_gateway(_config(("asking", backend)))

        asked: set[str] = set()
        both_asked = asyncio.Event()

        async def session(name: str) -> str:
            async def elicit(context: Any, params: Any) -> types.ElicitResult:
                asked.add(name)
                if len(asked) == 2:
                    both_asked.set()
                await asyncio.wait_for(both_asked.wait(), 20)  # answered once both requests are out at once
                return types.ElicitResult(action="accept", content={"name": f"{name} answering {params.message}"})

            async with mcp.Client(gateway.url, mode="legacy", elicitation_callback=elicit) as client:
                return _text(await client.call_tool("asking_ask_user", {"question": name}))

        async def main() -> list[str]:
            return list(await asyncio.gather(session("alice"), session("bob")))

        assert asyncio.run(main()) == ["accepted: alice answering alice x0", "accepted: bob answering bob x0"]


# -- the raw protocol: ids, late and missing answers, bad answers ---------------------------


def _open(gateway, capabilities: dict) -> str:
    response = gateway.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": {"name": "raw", "version": "1"}}})
    assert response.status_code == 200, response.text
    return response.headers["Mcp-Session-Id"]


class _Call:
    """A tools/call whose SSE answer is read event by event on a thread of its own."""

    def __init__(self, gateway, session_id: str, name: str, arguments: dict, request_id: Any = 1,
                 progress_token: str | None = None):
        self.events: list[dict] = []
        self.done = threading.Event()
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if progress_token is not None:
            params["_meta"] = {"progressToken": progress_token}
        message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
        # The headers come with the first event (JSON or SSE is decided then): post on the thread.
        threading.Thread(target=self._read, args=(gateway, session_id, message), daemon=True).start()

    def _read(self, gateway, session_id: str, message: dict) -> None:
        try:
            self._response = gateway.post(message, session_id, stream=True)
            if self._response.headers.get("Content-Type", "").startswith("application/json"):
                self.events.append(self._response.json())
                return
            for event in iter_sse_events(self._response.iter_lines()):
                if event.data.strip():  # not the priming event
                    self.events.append(json.loads(event.data))
        finally:
            self.done.set()

    def request(self, method: str) -> dict:
        return wait_until(lambda: next((e for e in self.events if e.get("method") == method), None), 10)

    def answer(self) -> dict:
        assert self.done.wait(20), self.events
        return self.events[-1]


def _answer(gateway, session_id: str, request_id: Any, result: dict | None = None, error: dict | None = None):
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
    body.update({"error": error} if error is not None else {"result": result})
    return gateway.post(body, session_id)


ELICITING = {"elicitation": {"form": {}}}


def test_bad_answers_are_refused_and_change_nothing_then_a_good_one_goes_through(start_gateway):
    with asking_backend() as backend:
        gateway = start_gateway(_config(("asking", backend)))
        mine, other = _open(gateway, ELICITING), _open(gateway, ELICITING)
        call = _Call(gateway, mine, "asking_ask_user", {"question": "Who?"})
        asked = call.request("elicitation/create")
        assert asked["params"]["message"] == "Who?" and "requestedSchema" in asked["params"]

        never_sent = _answer(gateway, mine, 987654, {"action": "accept", "content": {"name": "x"}})
        assert never_sent.status_code == 400 and "awaits an answer" in never_sent.json()["error"]["message"]
        from_other_session = _answer(gateway, other, asked["id"], {"action": "accept", "content": {"name": "x"}})
        assert from_other_session.status_code == 400
        malformed = _answer(gateway, mine, asked["id"], {"action": "maybe"})
        assert malformed.status_code == 400 and "action must be one of" in malformed.json()["error"]["message"]
        not_an_object = _answer(gateway, mine, asked["id"], {"action": "accept", "content": "Ada"})
        assert not_an_object.status_code == 400
        assert not call.done.is_set()  # the call still waits for a real answer

        good = _answer(gateway, mine, asked["id"], {"action": "accept", "content": {"name": "Ada", "count": 2}})
        assert good.status_code == 202
        assert call.answer()["result"]["content"][0]["text"] == "accepted: Ada x2"
        again = _answer(gateway, mine, asked["id"], {"action": "decline"})
        assert again.status_code == 400  # answered once: the id is gone


def test_a_late_answer_within_the_deadline_works_and_a_missing_one_fails_the_call_in_time(start_gateway):
    with asking_backend() as backend:
        config = _config(("asking", backend))
        config["operational"] = {"timeouts": {"default": "2.5s"}}
        gateway = start_gateway(config)
        session_id = _open(gateway, ELICITING)
        assert "result" in gateway.rpc(session_id, "tools/list")  # discovered: the deadlines below are the answers'

        late = _Call(gateway, session_id, "asking_ask_user", {"question": "late"})
        asked = late.request("elicitation/create")
        time.sleep(1.0)  # the answer is late (what is tested), but well within the 2.5 s deadline
        assert _answer(gateway, session_id, asked["id"], {"action": "decline"}).status_code == 202
        assert late.answer()["result"]["content"][0]["text"] == "decline"

        started = time.monotonic()
        silent = _Call(gateway, session_id, "asking_ask_user", {"question": "silent"}, request_id=2)
        asked = silent.request("elicitation/create")
        final = silent.answer()
        # Failed by its 2.5 s deadline: nothing else would end it (the backend waits for the
        # client's answer without a limit; answer() gives up after 20 s).
        assert time.monotonic() - started < 10
        assert "error" in final or final["result"].get("isError"), final
        # The gateway answered the backend for the silent client: its request is gone.
        assert _answer(gateway, session_id, asked["id"], {"action": "decline"}).status_code == 400


def _ask_user_streamed(gateway, session_id: str) -> requests.Response:
    return gateway.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "asking_ask_user", "arguments": {"question": "q"}}}, session_id, stream=True)


def test_the_clients_stream_closing_answers_what_it_was_asked(start_gateway):
    with asking_backend() as backend:
        gateway = start_gateway(_config(("asking", backend)))
        session_id = _open(gateway, ELICITING)
        response = _ask_user_streamed(gateway, session_id)
        lines = response.iter_lines()
        asked = next(json.loads(event.data) for event in iter_sse_events(lines) if event.data.strip())
        assert asked["method"] == "elicitation/create"
        response.close()  # the client goes away before answering
        assert wait_until(
            lambda: _answer(gateway, session_id, asked["id"], {"action": "decline"}).status_code == 400, 10)
        assert gateway.rpc(session_id, "ping", request_id=3)["result"] == {}


# -- cancellation ---------------------------------------------------------------------------


def test_cancelling_a_call_reaches_the_backend_and_frees_the_thread(start_gateway):
    with asking_backend() as backend:
        gateway = start_gateway(_config(("asking", backend)))
        session_id = _open(gateway, {})
        call = _Call(gateway, session_id, "asking_wait", {}, request_id="slow-1", progress_token="w")
        assert call.request("notifications/progress")  # the backend is waiting (it said so)
        cancelled = gateway.post({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                  "params": {"requestId": "slow-1", "reason": "changed my mind"}}, session_id)
        assert cancelled.status_code == 202
        assert backend.cancelled.wait(10)  # the backend heard it under its own id
        assert call.done.wait(10)  # freed well before the backend's own 30 s wait would have ended
        assert all("result" not in event for event in call.events)  # no answer to a cancelled call
        assert gateway.rpc(session_id, "ping", request_id=2)["result"] == {}


# -- the standalone stream, subscriptions and list changes ---------------------------------


class _Stream:
    """GET /mcp read on a thread of its own."""

    def __init__(self, gateway, session_id: str):
        self.messages: list[dict] = []
        self._response = requests.get(gateway.url, headers={**MCP_HEADERS, "Mcp-Session-Id": session_id},
                                      stream=True, timeout=30)
        assert self._response.status_code == 200
        assert self._response.headers["Content-Type"].startswith("text/event-stream")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for event in iter_sse_events(self._response.iter_lines()):
                self.messages.append(json.loads(event.data))
        except Exception:  # noqa: BLE001 - closed by the test
            pass

    def methods(self) -> list[str]:
        return [m.get("method") for m in self.messages]

    def close(self) -> None:
        self._response.close()


def test_subscriptions_reach_exactly_the_sessions_that_subscribed(start_gateway):
    with asking_backend() as backend:
        gateway = start_gateway(_config(("asking", backend)))
        subscriber, bystander = _open(gateway, {}), _open(gateway, {})
        streams = {sid: _Stream(gateway, sid) for sid in (subscriber, bystander)}
        assert gateway.rpc(subscriber, "resources/subscribe", {"uri": WATCHED_URI})["result"] == {}
        assert backend.subscriptions == [("subscribe", WATCHED_URI)]

        def touch(uri: str, session_id: str = subscriber) -> None:
            # The backend tells the calling client's backend session (ctx.session), as directly.
            gateway.rpc(session_id, "tools/call", {"name": "asking_touch", "arguments": {"uri": uri}})

        def updates(session_id: str) -> list[str]:
            return [m["params"]["uri"] for m in streams[session_id].messages
                    if m.get("method") == "notifications/resources/updated"]

        # The backend sends its updates in order on one stream: once the last one arrived, an
        # update for the other URI would have arrived before it.
        for uri in (WATCHED_URI, OTHER_URI, WATCHED_URI):
            touch(uri)
        assert wait_until(lambda: len(updates(subscriber)) >= 2, 10), updates(subscriber)
        assert updates(subscriber) == [WATCHED_URI, WATCHED_URI]
        assert updates(bystander) == []
        # The bystander's own backend session tells only it, and it subscribed to nothing.
        touch(WATCHED_URI, bystander)
        touch(WATCHED_URI)  # the marker: had the bystander's update crossed, it would come first
        assert wait_until(lambda: len(updates(subscriber)) >= 3, 10), updates(subscriber)
        assert updates(subscriber) == [WATCHED_URI] * 3
        assert updates(bystander) == []

        assert gateway.rpc(subscriber, "resources/unsubscribe", {"uri": WATCHED_URI})["result"] == {}
        assert backend.subscriptions[-1] == ("unsubscribe", WATCHED_URI)
        # The same order tells what stopped: a subscription to the other URI is the marker.
        assert gateway.rpc(subscriber, "resources/subscribe", {"uri": OTHER_URI})["result"] == {}
        for uri in (WATCHED_URI, OTHER_URI):
            touch(uri)
        assert wait_until(lambda: OTHER_URI in updates(subscriber), 10), updates(subscriber)
        assert updates(subscriber) == [WATCHED_URI] * 3 + [OTHER_URI]
        for stream in streams.values():
            stream.close()


def test_subscribing_to_an_unknown_resource_is_a_clear_error(start_gateway):
    with asking_backend() as backend:
        gateway = start_gateway(_config(("asking", backend)))
        session_id = _open(gateway, {})
        answer = gateway.rpc(session_id, "resources/subscribe", {"uri": "test://nowhere/at-all"})
        assert answer["error"]["code"] == -32002
        assert gateway.rpc(session_id, "resources/subscribe", {})["error"]["code"] == -32602
        assert backend.subscriptions == []


@pytest.mark.parametrize("strategy", ["prefix", "priority", "manual"])
def test_a_list_change_refreshes_that_backend_and_tells_the_client_once(start_gateway, strategy, monkeypatch):
    # Changes this close together make one refresh: wide enough for two calls under load.
    monkeypatch.setattr("vmcp_actors.users._actor.LIST_CHANGES_SETTLE", 0.5)
    with asking_backend() as asking, sdk_backend("plain", ["echo", "whoami"]) as plain:
        aggregation: dict[str, Any] = {"conflictResolution": strategy,
                                       "tools": [{"workload": "plain", "filter": ["echo"]}]}
        if strategy == "prefix":
            aggregation["conflictResolutionConfig"] = {"prefixFormat": "{workload}_"}
        elif strategy == "priority":
            aggregation["conflictResolutionConfig"] = {"priorityOrder": ["asking", "plain"]}
        gateway = start_gateway(_config(("asking", asking), ("plain", plain), **aggregation))
        name = (lambda tool: f"asking_{tool}") if strategy == "prefix" else (lambda tool: tool)
        session_id = _open(gateway, {})
        before = {tool["name"] for tool in gateway.rpc(session_id, "tools/list")["result"]["tools"]}
        assert name("grow") in before and "plain_whoami" not in before and "whoami" not in before
        stream = _Stream(gateway, session_id)  # answered once the backends' streams are open too

        for tool in ("first_new", "second_new"):  # two changes close together
            answer = gateway.rpc(session_id, "tools/call", {"name": name("grow"), "arguments": {"tool": tool}})
            assert "result" in answer, answer
        assert wait_until(lambda: "notifications/tools/list_changed" in stream.methods(), 10)
        time.sleep(0.6)  # an absence: a second notification would come within this
        assert stream.methods().count("notifications/tools/list_changed") == 1
        after = {tool["name"] for tool in gateway.rpc(session_id, "tools/list", request_id=9)["result"]["tools"]}
        assert after - before == {name("first_new"), name("second_new")}
        answer = gateway.rpc(session_id, "tools/call", {"name": name("second_new"), "arguments": {}}, request_id=10)
        assert answer["result"]["content"][0]["text"] == "second_new works"
        stream.close()


def test_backend_streams_open_only_while_needed(start_gateway):
    with asking_backend() as backend:
        gateway = start_gateway(_config(("asking", backend)))
        session_id = _open(gateway, {})
        gateway.rpc(session_id, "tools/list")

        def listeners() -> int:
            return sum(1 for t in threading.enumerate() if t.name.startswith("vmcp-stream-"))

        assert listeners() == 0
        stream = _Stream(gateway, session_id)
        assert wait_until(lambda: listeners() == 1, 10)
        stream.close()
        assert wait_until(lambda: listeners() == 0, 10)


# -- resuming a call's stream ---------------------------------------------------------------


def test_a_client_whose_connection_drops_resumes_the_call_with_last_event_id(start_gateway):
    with asking_backend() as backend:
        gateway = start_gateway(_config(("asking", backend)))
        session_id = _open(gateway, ELICITING)
        response = _ask_user_streamed(gateway, session_id)
        events = iter_sse_events(response.iter_lines())
        priming = next(events)
        assert priming.data == "" and priming.id and priming.retry == 500
        asked_event = next(events)
        asked = json.loads(asked_event.data)
        response.close()  # the connection drops; the call goes on without it

        assert _answer(gateway, session_id, asked["id"], {"action": "accept",
                                                           "content": {"name": "Ada"}}).status_code == 202
        resumed = requests.get(gateway.url, headers={**MCP_HEADERS, "Mcp-Session-Id": session_id,
                                                     "Last-Event-ID": asked_event.id}, stream=True, timeout=20)
        assert resumed.status_code == 200
        rest = [json.loads(event.data) for event in iter_sse_events(resumed.iter_lines()) if event.data.strip()]
        assert rest[-1]["id"] == 1 and rest[-1]["result"]["content"][0]["text"] == "accepted: Ada x0"

        again = requests.get(gateway.url, headers={**MCP_HEADERS, "Mcp-Session-Id": session_id,
                                                   "Last-Event-ID": priming.id}, stream=True, timeout=20)
        replayed = [json.loads(event.data) for event in iter_sse_events(again.iter_lines()) if event.data.strip()]
        assert [m.get("method") for m in replayed] == ["elicitation/create", None]  # from the start, in order
        other = _open(gateway, ELICITING)  # another session cannot resume it
        foreign = requests.get(gateway.url, headers={**MCP_HEADERS, "Mcp-Session-Id": other,
                                                     "Last-Event-ID": asked_event.id}, timeout=10)
        assert foreign.status_code == 404


def test_sessions_before_2025_11_25_get_no_event_ids(start_gateway):
    with sdk_backend("plain", ["progress"]) as plain:
        gateway = start_gateway(_config(("plain", plain)))
        response = gateway.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}})
        session_id = response.headers["Mcp-Session-Id"]
        answer = gateway.post({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "plain_progress", "arguments": {"steps": 2}, "_meta": {"progressToken": "p"}}}, session_id)
        events = list(iter_sse_events(answer.text.splitlines()))
        assert events and all(event.id is None and event.data for event in events)


# -- composite elicitation steps ------------------------------------------------------------


def _composite_config(plain) -> dict:
    config = _config(("plain", plain))
    config["compositeTools"] = [{
        "name": "careful_echo",
        "description": "Ask first, then echo",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        "steps": [
            {"id": "confirm", "type": "elicitation", "message": "Echo {{ params.text }}?",
             "schema": {"type": "object", "properties": {"loud": {"type": "boolean"}}, "required": ["loud"]},
             "timeout": "10s", "onDecline": {"action": "skip_remaining"}, "onCancel": {"action": "abort"}},
            {"id": "echo", "tool": "plain_echo", "dependsOn": ["confirm"],
             "arguments": {"text": "{{ params.text }} {{ steps.confirm.output.action }} "
                                   "loud={{ steps.confirm.output.content.loud }}"}},
        ],
    }]
    return config


@pytest.mark.parametrize("action, expected", [
    ("accept", "plain:hi accept loud=true"),
    ("decline", None),  # skip_remaining: the run completes without the echo
    ("cancel", "step 'confirm'"),  # abort: an error result naming the step
])
def test_a_composite_elicitation_step_asks_the_calling_client(start_gateway, action, expected):
    with sdk_backend("plain", ["echo"]) as plain:
        gateway = start_gateway(_composite_config(plain))
        asked: list[str] = []

        async def elicit(context: Any, params: Any) -> types.ElicitResult:
            asked.append(params.message)
            content = {"loud": True} if action == "accept" else None
            return types.ElicitResult(action=action, content=content)

        async def work(client: mcp.Client) -> Any:
            return await client.call_tool("careful_echo", {"text": "hi"})

        result = _run(work, server=gateway.url, mode="legacy", elicitation_callback=elicit)
        assert asked == ["Echo hi?"]
        texts = " ".join(block.text for block in result.content if hasattr(block, "text"))
        if action == "accept":
            assert not result.is_error and expected in texts
        elif action == "decline":
            assert not result.is_error and "plain:" not in texts
        else:
            assert result.is_error and expected in texts and "cancelled" in texts


def test_a_composite_elicitation_step_fails_by_name_for_a_client_that_cannot_be_asked(start_gateway):
    with sdk_backend("plain", ["echo"]) as plain:
        gateway = start_gateway(_composite_config(plain))

        async def work(client: mcp.Client) -> Any:
            return await asyncio.wait_for(client.call_tool("careful_echo", {"text": "hi"}), 5)

        result = _run(work, server=gateway.url, mode="legacy")  # no elicitation declared
        text = result.content[0].text
        assert result.is_error and "step 'confirm'" in text and "did not declare" in text
