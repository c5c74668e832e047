"""The gateway as a library and the layers above the core, over real official-SDK
backends and the official SDK client (legacy sessions and MCP 2026-07-28): the example
embedder served by gunicorn, Cedar policies by user, group and role claims, the optimizer
through the policies, and the explain view (admin endpoint and command line)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.backends import sdk_backend
from tests.gateway import admin_get, backend_entry, run_client
from tests.idp import LocalIdP
from tests.integration.test_cli import CliProcess, write_config
from tests.ports import free_port
from vmcp_actors import core as library

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ROOT = Path(__file__).resolve().parents[2]
AUD = "vmcp"
ADMIN_ENV, ADMIN_TOKEN = "LIB_ADMIN_TOKEN", "lib-adm1n-token-Qr7"
INVALID_PARAMS = -32602
POLICIES = [
    'permit(principal in THVGroup::"eng", action == Action::"call_tool", resource);',
    'permit(principal, action == Action::"call_tool", resource) when { resource.name like "docs_*" };',
    'permit(principal in THVGroup::"auditor", action == Action::"call_tool", resource == Tool::"ops_whoami");',
]
MODES = ["legacy", "auto"]  # auto: the SDK speaks MCP 2026-07-28 to the gateway, no session


@pytest.fixture
def idp():
    provider = LocalIdP().start()
    yield provider
    provider.stop()


@pytest.fixture
def backends():
    ops, docs = sdk_backend("ops", ["echo", "whoami", "fail"]), sdk_backend("docs", ["echo", "sleep", "structured"])
    yield ops, docs
    docs.stop()
    ops.stop()


def gateway_config(backends, idp: LocalIdP | None = None, **extra: Any) -> dict[str, Any]:
    ops, docs = backends
    config: dict[str, Any] = {
        "name": "library",
        "backends": [backend_entry("ops", ops), backend_entry("docs", docs)],
        "aggregation": {"conflictResolution": "prefix", "conflictResolutionConfig": {"prefixFormat": "{workload}_"},
                        "tools": [{"workload": "docs", "filter": ["echo", "structured"]}]},
        "compositeTools": [{"name": "shout", "description": "echo through ops",
                            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
                            "steps": [{"id": "say", "tool": "ops.echo", "arguments": {"text": "{{.params.text}}"}}]}],
        "admin": {"tokenEnv": ADMIN_ENV},
        **extra,
    }
    if idp is not None:
        config["incomingAuth"] = {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUD},
                                  "authz": {"type": "cedar", "policies": POLICIES}}
    return config


@pytest.fixture(autouse=True)
def admin_token(monkeypatch):
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)


def sdk_session(url: str, token: str | None, work, mode: str) -> Any:
    """``work(client)`` with the official SDK client, with a bearer token when given."""
    import httpx2
    import mcp
    from mcp.client.streamable_http import streamable_http_client

    async def main():
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            async with mcp.Client(streamable_http_client(url, http_client=http), mode=mode) as client:
                return await work(client)

    return asyncio.run(main())


async def refusal(client, name: str, arguments: dict[str, Any] | None = None) -> int | None:
    from mcp.shared.exceptions import MCPError

    try:
        await client.call_tool(name, arguments or {})
    except MCPError as error:
        return error.error.code
    return None


# -- the example embedder ------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_the_example_embedder_serves_the_demo_with_its_decorator(tmp_path, mode):
    port = free_port()
    with CliProcess([sys.executable, "examples/filtering_decorator.py", "--port", str(port)], tmp_path,
                    "example") as example:
        example.wait_ready(f"http://127.0.0.1:{port}")

        async def work(client):
            tools = sorted(t.name for t in (await client.list_tools()).tools)
            denied = await refusal(client, "notes_add_note", {"title": "t", "body": "b"})
            forecast = (await client.call_tool("weather_get_forecast", {"city": "Oslo"})).content[0].text
            resources = [str(r.uri) for r in (await client.list_resources()).resources]
            prompts = [p.name for p in (await client.list_prompts()).prompts]
            try:
                await client.read_resource("notes://index")
                read_index = "read"
            except Exception as error:  # noqa: BLE001 - any refusal will do; the code is checked below
                read_index = getattr(getattr(error, "error", None), "code", error)
            return tools, denied, forecast, resources, prompts, read_index

        tools, denied, forecast, resources, prompts, read_index = run_client(
            f"http://127.0.0.1:{port}/mcp", work, mode=mode)
    assert "notes_add_note" not in tools and "notes_reindex" not in tools and "weather_climate_report" not in tools
    assert {"notes_search", "weather_get_forecast", "weather_current_conditions"} <= set(tools)
    assert denied == INVALID_PARAMS
    assert forecast.startswith("Forecast for Oslo")
    assert resources == ["weather://cities"] and prompts == []
    assert read_index in (-32002, INVALID_PARAMS)


def test_an_embedder_layer_in_process_is_held_to_subtracting(backends):
    class Smuggler(library.Layer):
        """Tries to add a tool and to let a hidden one through."""

        def list_tools(self, identity, deadline):
            return self.inner.list_tools(identity, deadline) + ({"name": "smuggled", "inputSchema": {}},)

        def lookup_tool(self, identity, name, deadline):
            return library.Route("ops", "echo", "echo")

    running = library.start(library.build(gateway_config(backends)).decorated(Smuggler))
    try:
        async def work(client):
            tools = sorted(t.name for t in (await client.list_tools()).tools)
            return tools, await refusal(client, "smuggled"), await refusal(client, "docs_sleep", {"seconds": 0})

        tools, smuggled, hidden = run_client(running.url, work)
    finally:
        running.stop()
    assert "smuggled" not in tools and "docs_sleep" not in tools
    assert smuggled == INVALID_PARAMS and hidden == INVALID_PARAMS


# -- Cedar ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_cedar_gives_each_user_their_view_by_group_and_role_claims(start_gateway, backends, idp, mode):
    gateway = start_gateway(gateway_config(backends, idp))
    tokens = {
        "alice": idp.issue_token("alice", AUD, extra_claims={"groups": ["eng"]}),
        "bob": idp.issue_token("bob", AUD),
        "carol": idp.issue_token("carol", AUD, extra_claims={"roles": ["auditor"]}),
    }

    async def work(client):
        tools = sorted(t.name for t in (await client.list_tools()).tools)
        return tools, {name: await refusal(client, name, {"text": "x"}) for name in ("ops_echo", "ops_whoami", "shout")}

    views = {user: sdk_session(gateway.url, token, work, mode) for user, token in tokens.items()}
    assert views["alice"][0] == ["docs_echo", "docs_structured", "ops_echo", "ops_fail", "ops_whoami", "shout"]
    assert views["bob"][0] == ["docs_echo", "docs_structured"]
    assert views["carol"][0] == ["docs_echo", "docs_structured", "ops_whoami"]
    assert views["alice"][1] == {"ops_echo": None, "ops_whoami": None, "shout": None}
    assert views["bob"][1] == {"ops_echo": INVALID_PARAMS, "ops_whoami": INVALID_PARAMS, "shout": INVALID_PARAMS}
    assert views["carol"][1] == {"ops_echo": INVALID_PARAMS, "ops_whoami": None, "shout": INVALID_PARAMS}


# -- the optimizer ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_the_optimizer_finds_and_calls_only_what_the_policies_allow(start_gateway, backends, idp, mode):
    gateway = start_gateway(gateway_config(backends, idp, optimizer={"maxToolsToReturn": 3}))
    bob = idp.issue_token("bob", AUD)
    alice = idp.issue_token("alice", AUD, extra_claims={"groups": ["eng"]})

    async def work(client):
        listed = sorted(t.name for t in (await client.list_tools()).tools)
        found = await client.call_tool("find_tool", {"tool_description": "echo the text back",
                                                     "tool_keywords": ["echo"]})
        names = [t["name"] for t in found.structured_content["tools"]]
        echoed = await client.call_tool("call_tool", {"tool_name": "docs_echo", "parameters": {"text": "hi"}})
        denied = await refusal(client, "call_tool", {"tool_name": "ops_echo", "parameters": {"text": "hi"}})
        direct = await refusal(client, "docs_echo", {"text": "hi"})
        return listed, names, echoed.content[0].text, denied, direct

    listed, bob_found, echoed, denied, direct = sdk_session(gateway.url, bob, work, mode)
    assert listed == ["call_tool", "find_tool"]
    assert "docs_echo" in bob_found and "ops_echo" not in bob_found and len(bob_found) <= 3
    assert echoed == "docs:hi"
    assert denied == INVALID_PARAMS and direct == INVALID_PARAMS
    _, alice_found, _, alice_denied, _ = sdk_session(gateway.url, alice, work, mode)
    assert {"docs_echo", "ops_echo"} <= set(alice_found)
    assert alice_denied is None


# -- explain -------------------------------------------------------------------------------


def _session_of(gateway, token: str, first_request: bool = True) -> str:
    from tests.integration.test_identity import INIT, bearer

    response = gateway.post(INIT, headers=bearer(token))
    assert response.status_code == 200, response.text
    session_id = response.headers["Mcp-Session-Id"]
    if not first_request:
        return session_id
    # Its first request starts its user, as the caller: explain then knows their claims.
    ping = gateway.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, session_id, headers=bearer(token))
    assert ping.status_code == 200 and ping.json()["result"] == {}, ping.text
    return session_id


def explain(gateway, tool: str, **query: str) -> dict[str, Any]:
    response = requests.get(gateway.base + "/admin/explain", params={"tool": tool, **query},
                            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def verdicts(explained: dict[str, Any]) -> list[tuple[str, str]]:
    return [(finding["layer"], finding["verdict"]) for finding in explained["findings"]]


def test_explain_says_which_layer_hides_a_tool_and_why(start_gateway, backends, idp):
    gateway = start_gateway(gateway_config(backends, idp))
    bob = _session_of(gateway, idp.issue_token("bob", AUD))
    alice = _session_of(gateway, idp.issue_token("alice", AUD, extra_claims={"groups": ["eng"]}))

    by_cedar = explain(gateway, "ops_echo", session=bob)
    assert (by_cedar["listed"], by_cedar["callable"]) == (False, False)
    assert verdicts(by_cedar) == [("backends", "offers"), ("composite tools", "uses"), ("advertising filter", "passes"),
                                  ("authz (Cedar)", "hides")]
    assert "backend 'ops' offers it as 'echo'" in by_cedar["findings"][0]["reason"]
    assert "'shout' (step 'say')" in by_cedar["findings"][1]["reason"]
    assert 'Client::"bob"' in by_cedar["findings"][-1]["reason"]

    by_filter = explain(gateway, "docs_sleep", session=bob)
    assert ("advertising filter", "hides") in verdicts(by_filter)
    assert "aggregation.tools[0].filter" in by_filter["findings"][2]["reason"]

    composite = explain(gateway, "shout", session=alice)
    assert composite["listed"] and verdicts(composite)[1] == ("composite tools", "adds")
    assert "say -> ops.echo" in composite["findings"][1]["reason"]
    assert explain(gateway, "ops_echo", session=alice)["callable"] is True
    unknown = explain(gateway, "nothing_here", user="bob")
    assert verdicts(unknown)[0] == ("backends", "absent") and not unknown["callable"]
    unused = _session_of(gateway, idp.issue_token("carol", AUD), first_request=False)
    not_yet = requests.get(gateway.base + "/admin/explain", params={"tool": "ops_echo", "session": unused},
                           headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)
    assert not_yet.status_code == 409 and "no request" in not_yet.json()["error"]  # never as someone else
    assert requests.get(gateway.base + "/admin/explain", params={"tool": "x", "session": "0" * 64},
                        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10).status_code == 404
    assert requests.get(gateway.base + "/admin/explain", params={"tool": "x"},
                        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10).status_code == 400
    assert admin_get(gateway, "/admin/explain?tool=ops_echo&user=bob").status_code == 401  # behind the token


def test_explain_names_the_optimizer_when_it_hides_the_list(start_gateway, backends):
    gateway = start_gateway(gateway_config(backends, optimizer={}))
    session = gateway.initialize()
    explained = explain(gateway, "docs_echo", session=session)
    assert (explained["listed"], explained["callable"]) == (False, True)
    assert verdicts(explained)[-1] == ("optimizer", "unlists")
    assert verdicts(explain(gateway, "find_tool", session=session))[-1] == ("optimizer", "adds")


def test_the_explain_command_explains_for_a_user_with_claims(tmp_path, backends, idp):
    config = write_config(tmp_path / "config.yaml", gateway_config(backends, idp))
    args = [str(Path(sys.executable).parent / "vmcp-actors"), "explain", "--config", str(config)]
    env = {**os.environ, ADMIN_ENV: ADMIN_TOKEN}
    hidden = subprocess.run(args + ["--tool", "ops_echo", "--user", "bob"], capture_output=True, text=True,
                            timeout=60, env=env, cwd=ROOT)
    assert hidden.returncode == 0, hidden.stderr
    assert hidden.stdout.startswith("ops_echo: not visible")
    assert "[authz (Cedar)] hides" in hidden.stdout and "[backends] offers" in hidden.stdout
    shown = subprocess.run(args + ["--tool", "ops_echo", "--user", "alice", "--claims", '{"groups": ["eng"]}',
                                   "--json"], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert shown.returncode == 0, shown.stderr
    import json
    assert json.loads(shown.stdout)["callable"] is True
    bad = subprocess.run(args + ["--tool", "x", "--claims", "[1]"], capture_output=True, text=True, timeout=60,
                         env=env, cwd=ROOT)
    assert bad.returncode == 2 and "--claims" in bad.stderr


def test_a_retry_with_request_state_asks_the_layers_again():
    """MCP 2026-07-28: a grant withdrawn between the rounds of a multi round-trip call holds."""
    from tests.integration.test_modern import (
        ALL_CAPABILITIES,
        _config,
        answer,
        modern_post,
    )
    from tests.mrtr_backends import mrtr_backend

    blocked: set[str] = set()

    class Revocable(library.Layer):
        def list_tools(self, identity, deadline):
            return tuple(t for t in self.inner.list_tools(identity, deadline) if t["name"] not in blocked)

        def lookup_tool(self, identity, name, deadline):
            return None if name in blocked else self.inner.lookup_tool(identity, name, deadline)

    with mrtr_backend("asker") as asker:
        running = library.start(library.build(_config(("asker", asker, "modern"))).decorated(Revocable))
        try:
            first = answer(modern_post(running.url, "tools/call", {"name": "asker_confirm", "arguments": {"item": "x"}},
                                       capabilities=ALL_CAPABILITIES))["result"]
            assert first["resultType"] == "input_required"
            (key,) = first["inputRequests"]
            blocked.add("asker_confirm")
            retried = modern_post(running.url, "tools/call", {
                "name": "asker_confirm", "arguments": {"item": "x"}, "requestState": first["requestState"],
                "inputResponses": {key: {"action": "accept", "content": {"ok": True}}}},
                capabilities=ALL_CAPABILITIES, request_id=2)
        finally:
            running.stop()
    assert retried.status_code == 400 and retried.json()["error"] == {"code": INVALID_PARAMS,
                                                                      "message": "Unknown tool: asker_confirm"}
