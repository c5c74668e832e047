"""MCP 2026-07-28 through the gateway (issue 11): stateless requests on the client edge,
backends spoken to in their own era, multi round-trip requests in every pairing of
client and backend era, sealed requestState, subscriptions/listen, errors as the
specification names them. Real official-SDK backends and clients, raw HTTP where the
wire itself is the point."""

from __future__ import annotations

import asyncio
import queue
from typing import Any

import mcp
import pytest
import requests
from mcp import types

from tests.asking_backends import WATCHED_URI, asking_backend
from tests.backends import sdk_backend
from tests.gateway import (
    MCP_HEADERS,
    StreamReader,
    admin_get,
    backend_entry,
    sse_messages,
    wait_until,
)
from tests.mrtr_backends import header_backend, mrtr_backend

MODERN = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}}
ALL_CAPABILITIES = {"elicitation": {"form": {}, "url": {}}, "sampling": {}, "roots": {}}
PREFIX = {"conflictResolution": "prefix", "conflictResolutionConfig": {"prefixFormat": "{workload}_"}}


def _config(*backends: tuple[str, Any, str | None], **extra: Any) -> dict:
    return {"name": "gw", "backends": [backend_entry(name, served, protocol) for name, served, protocol in backends],
            "aggregation": PREFIX, **extra}


def modern_post(url: str, method: str, params: dict | None = None, *, request_id: Any = 1,
                capabilities: dict | None = None, headers: dict | None = None, meta: dict | None = None,
                stream: bool = False) -> requests.Response:
    """One 2026-07-28 request the raw way: metadata in _meta, mirrored in headers."""
    body_params = dict(params or {})
    body_params["_meta"] = {**body_params.get("_meta", {}), **META,
                            **({"io.modelcontextprotocol/clientCapabilities": capabilities}
                                       if capabilities is not None else {}), **(meta or {})}
    sent = {**MCP_HEADERS, "MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    name = (params or {}).get("name", (params or {}).get("uri"))
    if method in ("tools/call", "prompts/get", "resources/read") and isinstance(name, str):
        sent["Mcp-Name"] = name
    sent.update(headers or {})
    message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": body_params}
    return requests.post(url, json=message, headers=sent, timeout=30, stream=stream)


def answer(response: requests.Response) -> dict:
    if response.headers.get("Content-Type", "").startswith("text/event-stream"):
        return sse_messages(response)[-1]
    return response.json()


def _text(result: Any) -> str:
    assert not result.is_error, result
    return result.content[0].text


def _run(work, **client_args: Any) -> Any:
    async def main() -> Any:
        async with mcp.Client(**client_args) as client:
            return await work(client)

    return asyncio.run(main())


async def _elicit(context: Any, params: Any) -> types.ElicitResult:
    message = params.message
    if message.startswith("Confirm"):
        return types.ElicitResult(action="accept", content={"ok": True})
    if message.startswith("Your name"):
        return types.ElicitResult(action="accept", content={"name": "Ada"})
    if message.startswith("Echo"):
        return types.ElicitResult(action="accept", content={"loud": True})
    return types.ElicitResult(action="accept", content={"colour": "blue"})


async def _sample(context: Any, params: Any) -> types.CreateMessageResult:
    return types.CreateMessageResult(role="assistant", model="m", content=types.TextContent(type="text", text="SHORT"))


async def _roots(context: Any) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[types.Root(uri="file:///work", name="work")])


# -- 1. the SDK client in each mode, both at once -----------------------------------------------


def test_the_default_sdk_client_speaks_2026_07_28_end_to_end_and_legacy_keeps_its_session(start_gateway):
    with sdk_backend("alpha") as alpha:
        gateway = start_gateway(_config(("alpha", alpha, None)))
        sessions = gateway.app.extensions["vmcp_actors"].gateway

        async def everything(client: mcp.Client) -> dict:
            tools = [tool.name for tool in (await client.list_tools()).tools]
            called = _text(await client.call_tool("alpha_echo", {"text": "hi"}))
            read = (await client.read_resource("test://alpha/static")).contents[0].text
            prompt = (await client.get_prompt("alpha_greet", {"who": "Bo"})).messages[0].content.text
            completion = await client.complete(types.PromptReference(type="ref/prompt", name="alpha_greet"),
                                               {"name": "who", "value": "a"})
            templates = [t.uri_template for t in (await client.list_resource_templates()).resource_templates]
            return {"tools": tools, "called": called, "read": read, "prompt": prompt,
                    "completion": completion.completion.values, "templates": templates}

        async def both() -> tuple[dict, dict, int]:
            async with mcp.Client(gateway.url) as modern, mcp.Client(gateway.url, mode="legacy") as legacy:
                seen = await asyncio.gather(everything(modern), everything(legacy))
                # Only the legacy client opened a session; the modern one never sent initialize.
                return seen[0], seen[1], sessions.session_count().get(timeout=5)

        modern, legacy, session_count = asyncio.run(both())
        assert session_count == 1
        for seen in (modern, legacy):
            assert "alpha_echo" in seen["tools"]
            assert seen["called"] == "alpha:hi"
            assert seen["read"] == "static resource of alpha"
            assert seen["prompt"] == "Hello Bo, from alpha!"
            assert seen["completion"]
            assert seen["templates"] == ["test://alpha/items/{item}"]
        assert modern["tools"] == legacy["tools"]


def test_a_modern_request_opens_no_session_and_is_served_by_the_callers_user(start_gateway):
    with sdk_backend("alpha", ["echo"]) as alpha:
        gateway = start_gateway(_config(("alpha", alpha, None)))
        response = modern_post(gateway.url, "tools/call", {"name": "alpha_echo", "arguments": {"text": "x"}})
        assert response.status_code == 200
        assert "Mcp-Session-Id" not in response.headers
        result = answer(response)["result"]
        assert result["resultType"] == "complete"
        assert result["content"][0]["text"] == "alpha:x"
        assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "gw"
        assert gateway.app.extensions["vmcp_actors"].gateway.session_count().get(timeout=5) == 0


# -- 2. results: resultType, cache hints, deterministic order -----------------------------------


def test_discover_lists_every_revision_and_lists_carry_cache_hints(start_gateway):
    with sdk_backend("alpha") as alpha, sdk_backend("beta") as beta:
        gateway = start_gateway({**_config(("alpha", alpha, None), ("beta", beta, "legacy")),
                                 "operational": {"discoveryCacheTTL": "30s"}})
        discovered = answer(modern_post(gateway.url, "server/discover"))["result"]
        assert discovered["supportedVersions"] == [MODERN, "2025-11-25", "2025-06-18"]
        assert discovered["resultType"] == "complete" and discovered["cacheScope"] == "public"
        # logging is deprecated in 2026-07-28 but served (per-request levels): declared, as backends do
        assert "tools" in discovered["capabilities"] and discovered["capabilities"]["logging"] == {}
        assert discovered["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "gw"
        firsts = []
        for method, key in (("tools/list", "tools"), ("prompts/list", "prompts"), ("resources/list", "resources"),
                            ("resources/templates/list", "resourceTemplates")):
            result = answer(modern_post(gateway.url, method))["result"]
            assert result["resultType"] == "complete", method
            # alpha (spoken to in 2026-07-28) says its lists are fresh for 0 ms: that bounds ours
            assert result["ttlMs"] == 0 and result["cacheScope"] == "public", method
            firsts.append([item.get("name", item.get("uri")) for item in result[key]])
        again = answer(modern_post(gateway.url, "tools/list"))["result"]["tools"]
        assert [tool["name"] for tool in again] == firsts[0]  # deterministic order
        read = answer(modern_post(gateway.url, "resources/read", {"uri": "test://beta/static"}))["result"]
        # beta (spoken to in 2025) gives no hints: its read may be per session, so private
        assert read["resultType"] == "complete" and read["ttlMs"] == 0 and read["cacheScope"] == "private"
        only_legacy = start_gateway({**_config(("beta", beta, "legacy")), "operational": {"discoveryCacheTTL": "30s"}})
        assert answer(modern_post(only_legacy.url, "tools/list"))["result"]["ttlMs"] == 30_000


def test_a_legacy_client_gets_no_2026_fields_from_a_modern_backend(start_gateway):
    with sdk_backend("alpha", ["echo"]) as alpha:
        gateway = start_gateway(_config(("alpha", alpha, "modern")))
        session_id = gateway.initialize()
        result = gateway.rpc(session_id, "resources/read", {"uri": "test://alpha/static"})["result"]
        assert set(result) == {"contents"}, result
        called = gateway.rpc(session_id, "tools/call", {"name": "alpha_echo", "arguments": {"text": "x"}})["result"]
        assert "resultType" not in called and "io.modelcontextprotocol/serverInfo" not in called.get("_meta", {})


# -- 3. errors as the specification names them ------------------------------------------------


@pytest.mark.parametrize("case, change, code, status", [
    ("version header differs from _meta", {"headers": {"MCP-Protocol-Version": "2099-01-01"}}, -32020, 400),
    ("method header differs", {"headers": {"Mcp-Method": "tools/call"}}, -32020, 400),
    ("unsupported revision", {"meta": {"io.modelcontextprotocol/protocolVersion": "2099-01-01"},
                              "headers": {"MCP-Protocol-Version": "2099-01-01"}}, -32022, 400),
    ("no _meta client capabilities", {"drop": "io.modelcontextprotocol/clientCapabilities"}, -32602, 400),
    ("bad log level", {"meta": {"io.modelcontextprotocol/logLevel": "loud"}}, -32602, 400),
])
def test_a_bad_envelope_gets_the_specifications_error(start_gateway, case, change, code, status):
    with sdk_backend("alpha", ["echo"]) as alpha:
        gateway = start_gateway(_config(("alpha", alpha, None)))
        params: dict[str, Any] = {"_meta": {**META, **change.get("meta", {})}}
        params["_meta"].pop(change.get("drop", ""), None)
        headers = {**MCP_HEADERS, "MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list", **change.get("headers", {})}
        response = requests.post(gateway.url, json={"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": params},
                                 headers=headers, timeout=10)
        assert response.status_code == status, (case, response.text)
        error = response.json()["error"]
        assert error["code"] == code, (case, error)
        if code == -32022:
            assert error["data"]["supported"][0] == MODERN and error["data"]["requested"] == "2099-01-01"
        # nothing was harmed: the next good request works
        assert answer(modern_post(gateway.url, "tools/list"))["result"]["tools"]


def test_mcp_name_must_match_the_body_and_may_be_base64(start_gateway):
    with sdk_backend("alpha", ["echo"]) as alpha:
        gateway = start_gateway(_config(("alpha", alpha, None)))
        params = {"name": "alpha_echo", "arguments": {"text": "x"}}
        wrong = modern_post(gateway.url, "tools/call", params, headers={"Mcp-Name": "alpha_whoami"})
        assert wrong.status_code == 400 and wrong.json()["error"]["code"] == -32020
        missing = modern_post(gateway.url, "tools/call", params, headers={"Mcp-Name": ""})
        assert missing.status_code == 400
        encoded = modern_post(gateway.url, "tools/call", params, headers={"Mcp-Name": "=?base64?YWxwaGFfZWNobw==?="})
        assert answer(encoded)["result"]["content"][0]["text"] == "alpha:x"
        padded = modern_post(gateway.url, "tools/call", params, headers={"Mcp-Name": "alpha_echo \t"})
        assert answer(padded)["result"]["content"][0]["text"] == "alpha:x"  # RFC 9110: whitespace around a value


def test_unknown_removed_and_legacy_only_methods_and_resource_not_found(start_gateway):
    with sdk_backend("alpha", ["echo"]) as alpha:
        gateway = start_gateway(_config(("alpha", alpha, None)))
        for method in ("foo/bar", "ping", "logging/setLevel", "resources/subscribe", "initialize"):
            response = modern_post(gateway.url, method, {"level": "info"} if method == "logging/setLevel" else {})
            assert response.status_code == 404, method
            assert response.json()["error"]["code"] == -32601, method
        missing = modern_post(gateway.url, "resources/read", {"uri": "test://nowhere"})
        assert missing.status_code == 400 and missing.json()["error"]["code"] == -32602
        session_id = gateway.initialize()  # a legacy client still gets -32002
        assert gateway.rpc(session_id, "resources/read", {"uri": "test://nowhere"})["error"]["code"] == -32002
        for verb in ("get", "delete"):
            response = requests.request(verb, gateway.url, headers={**MCP_HEADERS, "MCP-Protocol-Version": MODERN,
                                                                    "Accept": "text/event-stream"}, timeout=10)
            assert response.status_code == 405, verb


def test_log_messages_only_for_requests_that_ask_and_at_their_level(start_gateway):
    with sdk_backend("alpha", ["progress"]) as alpha:
        gateway = start_gateway(_config(("alpha", alpha, None)))
        call = {"name": "alpha_progress", "arguments": {"steps": 2}, "_meta": {"progressToken": "p"}}
        quiet = modern_post(gateway.url, "tools/call", call)
        loud = modern_post(gateway.url, "tools/call", call, meta={"io.modelcontextprotocol/logLevel": "debug"})
        terse = modern_post(gateway.url, "tools/call", call, meta={"io.modelcontextprotocol/logLevel": "emergency"})

        def methods(response: requests.Response) -> list[str]:
            messages = sse_messages(response) if "event-stream" in response.headers["Content-Type"] else [response.json()]
            return [m.get("method", "answer") for m in messages]

        assert "notifications/message" not in methods(quiet)
        assert methods(quiet).count("notifications/progress") == 2
        assert "notifications/message" in methods(loud)
        assert "notifications/message" not in methods(terse)


# -- 4. multi round-trip requests in every pairing ------------------------------------------------


@pytest.mark.parametrize("client_mode", ["auto", "legacy"])
@pytest.mark.parametrize("backend_era", ["modern", "legacy"])
def test_input_requests_work_in_every_pairing_of_eras(start_gateway, client_mode, backend_era):
    with mrtr_backend("asker") as asker:
        gateway = start_gateway(_config(("asker", asker, backend_era)))

        async def work(client: mcp.Client) -> list[str]:
            return [_text(await asyncio.wait_for(client.call_tool(name, arguments), 20)) for name, arguments in (
                ("asker_confirm", {"item": "x"}), ("asker_summarize", {"text": "t"}), ("asker_roots", {}),
                ("asker_two_steps", {}))]

        answers = _run(work, server=gateway.url, mode=client_mode, elicitation_callback=_elicit,
                       sampling_callback=_sample, list_roots_callback=_roots)
        assert answers == ["confirmed x", "summary: SHORT", "file:///work", "Ada likes blue"]


def _input_required(gateway, era: str, name: str = "asker_confirm", arguments: dict | None = None,
                    capabilities: dict | None = None) -> dict:
    response = modern_post(gateway.url, "tools/call", {"name": name, "arguments": arguments or {"item": "x"}},
                           capabilities=ALL_CAPABILITIES if capabilities is None else capabilities)
    result = answer(response)["result"]
    assert result["resultType"] == "input_required", (era, result)
    return result


@pytest.mark.parametrize("era", ["modern", "legacy"])
def test_the_raw_round_trip_seals_the_state_and_refuses_tampered_or_foreign_state(start_gateway, era):
    with mrtr_backend("asker") as asker:
        gateway = start_gateway(_config(("asker", asker, era)))
        first = _input_required(gateway, era)
        (key, asked), = first["inputRequests"].items()
        assert asked["method"] == "elicitation/create" and "Confirm x?" in asked["params"]["message"]
        state = first["requestState"]
        assert "asker" not in state and "127.0.0.1" not in state  # sealed: nothing readable
        responses = {key: {"action": "accept", "content": {"ok": True}}}

        def retry(state_value: str, name: str = "asker_confirm", arguments: dict | None = None) -> requests.Response:
            return modern_post(gateway.url, "tools/call", {"name": name, "arguments": arguments or {"item": "x"},
                                                           "inputResponses": responses, "requestState": state_value},
                               capabilities=ALL_CAPABILITIES, request_id=2)

        tampered = state[:-4] + ("AAAA" if not state.endswith("AAAA") else "BBBB")
        for bad in (tampered, "not-a-state", retry_state_of_other_tool(gateway, era)):
            refused = retry(bad)
            assert refused.status_code == 400 and refused.json()["error"]["code"] == -32602, refused.text
        done = answer(retry(state))
        assert done["result"]["content"][0]["text"] == "confirmed x", done
        assert done["result"]["resultType"] == "complete" and "ttlMs" not in done["result"]
        replayed = retry(state)
        if era == "legacy":  # the parked call went on: its state is spent
            assert replayed.status_code == 400 and "no longer waiting" in replayed.json()["error"]["message"]
        else:  # a backend's state goes back to that backend (within its lifetime), which decides
            assert answer(replayed)["result"]["content"][0]["text"] == "confirmed x"


def retry_state_of_other_tool(gateway, era: str) -> str:
    """A genuine state, issued for another tool: refused when presented for this one."""
    return _input_required(gateway, era, "asker_two_steps", {})["requestState"]


def test_a_state_of_one_person_is_refused_for_another(start_gateway):
    """Two passthrough-header digests stand for two callers here (OIDC is exercised in test_identity)."""
    with mrtr_backend("asker") as asker:
        gateway = start_gateway({**_config(("asker", asker, "modern")),
                                 "outgoingAuth": {"passthroughHeaders": ["X-Tenant"]}})
        response = modern_post(gateway.url, "tools/call", {"name": "asker_confirm", "arguments": {"item": "x"}},
                               capabilities=ALL_CAPABILITIES, headers={"X-Tenant": "a"})
        first = answer(response)["result"]
        (key,) = first["inputRequests"]
        stolen = modern_post(gateway.url, "tools/call", {
            "name": "asker_confirm", "arguments": {"item": "x"}, "requestState": first["requestState"],
            "inputResponses": {key: {"action": "accept", "content": {"ok": True}}}},
            capabilities=ALL_CAPABILITIES, headers={"X-Tenant": "b"})
        assert stolen.status_code == 400 and "another caller" in stolen.json()["error"]["message"]


def test_an_expired_backend_state_is_refused(start_gateway, monkeypatch):
    monkeypatch.setattr("vmcp_actors.edge._modern.BACKEND_STATE_TTL", -1.0)
    with mrtr_backend("asker") as asker:
        gateway = start_gateway(_config(("asker", asker, "modern")))
        first = _input_required(gateway, "modern")
        (key,) = first["inputRequests"]
        late = modern_post(gateway.url, "tools/call", {
            "name": "asker_confirm", "arguments": {"item": "x"}, "requestState": first["requestState"],
            "inputResponses": {key: {"action": "accept", "content": {"ok": True}}}}, capabilities=ALL_CAPABILITIES)
        assert late.status_code == 400 and "expired" in late.json()["error"]["message"]


def test_a_client_without_the_capability_is_not_asked(start_gateway):
    with mrtr_backend("asker") as asker:
        gateway = start_gateway(_config(("asker", asker, "legacy")))
        response = modern_post(gateway.url, "tools/call", {"name": "asker_summarize", "arguments": {"text": "t"}},
                               capabilities={})
        result = answer(response)
        # The legacy backend was told "no sampling" at once: no input_required, an ordinary error or result.
        assert result.get("result", {}).get("resultType") != "input_required", result


def test_a_parked_call_nobody_comes_back_for_ends_at_its_deadline(start_gateway):
    with mrtr_backend("asker") as asker:
        gateway = start_gateway({**_config(("asker", asker, "legacy")), "operational": {"timeouts": {"default": "1s"}}})
        _input_required(gateway, "legacy")
        parked = gateway.app.extensions["vmcp_actors"].service.parked
        assert parked.count() == 1
        wait_until(lambda: parked.count() == 0, timeout=5)
        # the backend got an error for its request and the gateway still serves
        assert answer(modern_post(gateway.url, "tools/list"))["result"]["tools"]


# -- 5. composite elicitation steps for a modern client ----------------------------------------------


def test_a_composite_elicitation_step_answers_a_modern_client_with_input_required(start_gateway):
    with sdk_backend("plain", ["echo"]) as plain:
        config = _config(("plain", plain, None))
        config["compositeTools"] = [{
            "name": "careful_echo", "description": "Ask first, then echo",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
            "steps": [
                {"id": "confirm", "type": "elicitation", "message": "Echo {{ params.text }}?",
                 "schema": {"type": "object", "properties": {"loud": {"type": "boolean"}}, "required": ["loud"]},
                 "timeout": "10s"},
                {"id": "echo", "tool": "plain_echo", "dependsOn": ["confirm"],
                 "arguments": {"text": "{{ params.text }} loud={{ steps.confirm.output.content.loud }}"}},
            ],
        }]
        gateway = start_gateway(config)
        result = _run(lambda client: client.call_tool("careful_echo", {"text": "hi"}), server=gateway.url,
                      elicitation_callback=_elicit)
        assert not result.is_error and "plain:hi loud=true" in " ".join(b.text for b in result.content)


# -- 6. subscriptions/listen ----------------------------------------------------------------------


class Listener(StreamReader):
    """A subscriptions/listen stream read on a thread: its messages arrive in ``messages``."""

    def __init__(self, url: str, notifications: dict, request_id: Any = "sub-1"):
        super().__init__(modern_post(url, "subscriptions/listen", {"notifications": notifications},
                                     request_id=request_id, stream=True))


def test_subscriptions_listen_acknowledges_and_delivers_list_changes_and_resource_updates(start_gateway):
    with asking_backend() as backend:
        gateway = start_gateway(_config(("asking", backend, "legacy")))
        listener = Listener(gateway.url, {"toolsListChanged": True, "resourceSubscriptions": [WATCHED_URI]})
        try:
            ack = listener.next()
            assert ack["method"] == "notifications/subscriptions/acknowledged"
            assert ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "sub-1"
            assert ack["params"]["notifications"] == {"toolsListChanged": True, "resourceSubscriptions": [WATCHED_URI]}
            touched = answer(modern_post(gateway.url, "tools/call", {"name": "asking_touch",
                                                                     "arguments": {"uri": WATCHED_URI}}))
            assert touched["result"]["content"][0]["text"].startswith("touched")
            update = listener.next()
            assert update["method"] == "notifications/resources/updated" and update["params"]["uri"] == WATCHED_URI
            assert update["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "sub-1"
            grown = answer(modern_post(gateway.url, "tools/call", {"name": "asking_grow", "arguments": {"tool": "late"}}))
            assert not grown["result"].get("isError"), grown
            change = listener.next()
            assert change["method"] == "notifications/tools/list_changed"
            names = [tool["name"] for tool in answer(modern_post(gateway.url, "tools/list"))["result"]["tools"]]
            assert "asking_late" in names
        finally:
            listener.close()


def test_a_listen_stream_gets_only_what_it_asked_for(start_gateway):
    with asking_backend() as backend:
        gateway = start_gateway(_config(("asking", backend, "legacy")))
        listener = Listener(gateway.url, {"promptsListChanged": True})
        try:
            assert listener.next()["params"]["notifications"] == {"promptsListChanged": True}
            answer(modern_post(gateway.url, "tools/call", {"name": "asking_grow", "arguments": {"tool": "later"}}))
            answer(modern_post(gateway.url, "tools/call", {"name": "asking_touch", "arguments": {"uri": WATCHED_URI}}))
            with pytest.raises(queue.Empty):
                listener.next(timeout=1.0)
        finally:
            listener.close()


# -- 7. Mcp-Param headers (x-mcp-header) -------------------------------------------------------------


@pytest.mark.parametrize("era", ["modern", "legacy"])
def test_mirrored_arguments_are_checked_and_mirrored_to_a_modern_backend(start_gateway, era):
    with header_backend("hdr") as backend:
        gateway = start_gateway(_config(("hdr", backend, era)))
        names = [tool["name"] for tool in answer(modern_post(gateway.url, "tools/list"))["result"]["tools"]]
        assert names == ["hdr_query"]
        call = {"name": "hdr_query", "arguments": {"region": "eu-west", "sql": "select 1"}}
        missing = modern_post(gateway.url, "tools/call", call)
        assert missing.status_code == 400 and missing.json()["error"]["code"] == -32020
        wrong = modern_post(gateway.url, "tools/call", call, headers={"Mcp-Param-Region": "us-east"})
        assert wrong.status_code == 400 and wrong.json()["error"]["code"] == -32020
        # The modern backend checks its own Mcp-Param-Region: the gateway mirrored it.
        right = modern_post(gateway.url, "tools/call", call, headers={"mcp-param-region": "eu-west"})
        assert answer(right)["result"]["content"][0]["text"] == "eu-west: select 1"
        encoded = modern_post(gateway.url, "tools/call", {"name": "hdr_query", "arguments": {
            "region": "é", "sql": "x"}}, headers={"Mcp-Param-Region": "=?base64?w6k=?="})
        assert answer(encoded)["result"]["content"][0]["text"] == "é: x"


# -- 8. operators and lifecycle ------------------------------------------------------------------------


def test_admin_state_shows_backend_eras_and_sessionless_users_and_the_reaper_ends_them(start_gateway, monkeypatch):
    monkeypatch.setenv("VMCP_ADMIN_TOKEN", "adm1n-t0ken")
    with sdk_backend("alpha", ["echo"]) as alpha, sdk_backend("beta", ["echo"]) as beta:
        gateway = start_gateway({**_config(("alpha", alpha, None), ("beta", beta, "legacy")),
                                 "admin": {"tokenEnv": "VMCP_ADMIN_TOKEN"},
                                 "operational": {"sessionTTL": "1s", "userIdleTimeout": "1s"}})
        assert answer(modern_post(gateway.url, "tools/call", {"name": "alpha_echo", "arguments": {"text": "x"}}))
        state = admin_get(gateway, token="adm1n-t0ken").json()
        assert state["backendEras"] == {"alpha": "modern", "beta": "legacy"}
        assert state["clients"]["sessionlessUsers"] == 1 and state["clients"]["parkedCalls"] == 0
        assert state["sessions"] == [] and len(state["users"]) == 1
        # No session ends it: after sessionTTL without a request the reaper does.
        wait_until(lambda: admin_get(gateway, token="adm1n-t0ken").json()["clients"]["sessionlessUsers"] == 0,
                   timeout=10)
        assert admin_get(gateway, token="adm1n-t0ken").json()["users"] == []
        # and the next request simply starts it again
        assert answer(modern_post(gateway.url, "tools/call", {"name": "beta_echo", "arguments": {"text": "y"}}))[
            "result"]["content"][0]["text"] == "beta:y"


def test_a_legacy_sessions_log_level_reaches_a_modern_backend_per_request(start_gateway):
    with sdk_backend("alpha", ["progress"]) as alpha:
        gateway = start_gateway(_config(("alpha", alpha, "modern")))
        session_id = gateway.initialize()
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "alpha_progress", "arguments": {"steps": 1}}}
        # No level set: everything the backend logs, as a 2025 backend would send it.
        loud = [m.get("method") for m in sse_or_json(gateway.post(call, session_id))]
        assert "notifications/message" in loud
        assert "error" not in gateway.rpc(session_id, "logging/setLevel", {"level": "emergency"})
        quiet = [m.get("method") for m in sse_or_json(gateway.post(call, session_id))]
        assert "notifications/message" not in quiet
        assert "error" not in gateway.rpc(session_id, "logging/setLevel", {"level": "info"})
        assert "notifications/message" in [m.get("method") for m in sse_or_json(gateway.post(call, session_id))]


def sse_or_json(response: requests.Response) -> list[dict]:
    if "event-stream" in response.headers.get("Content-Type", ""):
        return sse_messages(response)
    return [response.json()]
