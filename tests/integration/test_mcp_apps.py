"""MCP Apps through the gateway, compared with the same clients directly (issue 38).

The official ext-apps example servers (``scripts/install-mcp-apps``): basic-vanillajs and
basic-react over HTTP (one tool name, ``get-time``, and one UI URI between them), and
system-monitor over stdio (an app-only ``poll-system-stats`` its app polls). Clients are
the Python SDK's in ``legacy`` (2025-11-25, a session) and default mode (2026-07-28
through the gateway; the servers themselves speak 2025-11-25).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import mcp
import pytest
import requests
from markupsafe import escape
from mcp.shared.exceptions import MCPError

from tests.apps_host import REACT, SYSTEM_MONITOR, VANILLA, AppServer, need_mcp_apps, stdio_command
from tests.gateway import MCP_HEADERS, admin_get, answer_of, backend_entry, run_client

SHARED_UI = "ui://get-time/mcp-app.html"
MONITOR_UI = "ui://system-monitor/mcp-app.html"
SHOWN_UI = {"vanilla": "ui://vanilla/get-time/mcp-app.html", "react": "ui://react/get-time/mcp-app.html",
            "monitor": MONITOR_UI}
UI_EXTENSION = "io.modelcontextprotocol/ui"
MODES = ["legacy", "auto"]
ADMIN_ENV, ADMIN_TOKEN = "VMCP_APPS_ADMIN_TOKEN", "apps-admin-token"
DISCOVERY = {"operational": {"discoveryBudget": {"default": "20s"}}}  # a Node child may start slowly under load


@pytest.fixture(scope="module")
def servers():
    need_mcp_apps()
    started = {"vanilla": AppServer(VANILLA, "vanilla"), "react": AppServer(REACT, "react")}
    try:
        yield started
    finally:
        for server in started.values():
            server.stop()


def monitor_entry() -> dict[str, Any]:
    command = stdio_command(SYSTEM_MONITOR)
    return {"name": "monitor", "transport": "stdio", "command": command[0], "args": command[1:]}


def apps_config(servers: dict[str, AppServer], *, monitor: bool = True, **more: Any) -> dict[str, Any]:
    backends = [backend_entry(name, server) for name, server in servers.items()]
    return {"name": "apps", "backends": backends + ([monitor_entry()] if monitor else []), **DISCOVERY, **more}


@pytest.fixture
def gateway(servers, start_gateway):
    return start_gateway(apps_config(servers))


def direct_target(name: str, servers: dict[str, AppServer]) -> Any:
    if name == "monitor":
        command = stdio_command(SYSTEM_MONITOR)
        return mcp.StdioServerParameters(command=command[0], args=command[1:])
    return servers[name].mcp_url


def seen(target: Any, mode: str, work: Callable[[Any], Awaitable[Any]]) -> Any:
    """``work(client)`` with the Python SDK's client connected to ``target`` (a URL, or a stdio server)."""
    async def main() -> Any:
        async with mcp.Client(target, mode=mode) as client:
            return await work(client)

    return asyncio.run(main())


def dumped(model: Any) -> dict[str, Any]:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


async def everything(client: Any) -> dict[str, Any]:
    """What a host asks of an app server: its tools, its UI resources and their HTML."""
    tools = [dumped(tool) for tool in (await client.list_tools()).tools]
    resources = [dumped(resource) for resource in (await client.list_resources()).resources]
    html = {}
    for resource in resources:
        read = await client.read_resource(resource["uri"])
        html[resource["uri"]] = [dumped(content) for content in read.contents]
    return {"tools": tools, "resources": resources, "html": html}


def as_shown(backend: str, direct: dict[str, Any]) -> dict[str, Any]:
    """A direct answer as the gateway should show it: tool names prefixed, a shared UI URI
    rewritten for its backend; everything else byte for byte."""
    def uri(value: str) -> str:
        return SHOWN_UI[backend] if value == SHARED_UI else value

    tools = []
    for tool in direct["tools"]:
        meta = json.loads(json.dumps(tool.get("_meta", {})).replace(SHARED_UI, uri(SHARED_UI)))
        tools.append({**tool, "name": f"{backend}_{tool['name']}", **({"_meta": meta} if "_meta" in tool else {})})
    return {"tools": tools,
            "resources": [{**resource, "uri": uri(resource["uri"])} for resource in direct["resources"]],
            "html": {uri(key): [{**content, "uri": uri(content["uri"])} for content in contents]
                     for key, contents in direct["html"].items()}}


@pytest.mark.parametrize("mode", MODES)
def test_tools_resources_and_html_are_as_directly_but_names_and_shared_ui_uris(servers, gateway, mode):
    through = seen(gateway.url, mode, everything)
    for backend in ("vanilla", "react", "monitor"):
        direct = as_shown(backend, seen(direct_target(backend, servers), "legacy", everything))
        assert [tool for tool in through["tools"] if tool["name"].startswith(backend + "_")] == direct["tools"]
        for resource in direct["resources"]:
            assert resource in through["resources"]
            assert through["html"][resource["uri"]] == direct["html"][resource["uri"]]  # the HTML, byte for byte
    # two apps, two UIs: vanilla's tool renders vanilla's HTML, react's react's
    assert through["html"][SHOWN_UI["vanilla"]][0]["text"] != through["html"][SHOWN_UI["react"]][0]["text"]
    assert len(through["resources"]) == 3


async def app_calls(client: Any) -> dict[str, Any]:
    """What the apps' own HTML calls: the monitor's poll, vanilla's and react's get-time."""
    answers: dict[str, Any] = {}
    for name in ("poll-system-stats", "get-time"):
        try:
            answers[name] = dumped(await client.call_tool(name, {}))
        except MCPError as error:
            answers[name] = {"error": error.error.message if hasattr(error, "error") else str(error)}
    return answers


@pytest.mark.parametrize("mode", MODES)
def test_an_apps_call_by_its_servers_own_name_reaches_its_server(servers, gateway, mode):
    direct = seen(direct_target("monitor", servers), "legacy", app_calls)
    through = seen(gateway.url, mode, app_calls)
    polled, polled_directly = through["poll-system-stats"], direct["poll-system-stats"]
    assert not polled.get("isError") and set(polled["structuredContent"]) == set(polled_directly["structuredContent"])
    # vanilla and react both call get-time: the gateway cannot tell which app asked
    assert "ambiguous" in through["get-time"]["error"]
    assert "react_get-time" in through["get-time"]["error"] and "vanilla_get-time" in through["get-time"]["error"]


def test_two_clients_at_once_each_get_their_own_answers(servers, gateway):
    answers: dict[str, Any] = {}

    def client(mode: str) -> None:
        async def work(client: Any) -> Any:
            read = await client.read_resource(SHOWN_UI["react"])
            calls = [dumped(await client.call_tool("poll-system-stats", {})) for _ in range(3)]
            return read.contents[0].uri, calls

        answers[mode] = seen(gateway.url, mode, work)

    threads = [threading.Thread(target=client, args=(mode,)) for mode in MODES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for mode in MODES:
        uri, calls = answers[mode]
        assert uri == SHOWN_UI["react"]
        assert all("cpu" in call["structuredContent"] for call in calls)


def test_the_gateway_declares_the_ui_extension_in_both_revisions(gateway):
    async def declared(client: Any) -> Any:
        return client.server_capabilities

    for mode in MODES:
        capabilities = run_client(gateway.url, declared, mode=mode)
        assert UI_EXTENSION in dumped(capabilities)["extensions"]


# -- two backends with the same app tool name, under each strategy ---------------------------


def time_of(result: dict[str, Any]) -> str:
    """Whose get-time answered: vanilla's declares an output schema and answers structured
    content; react's does not."""
    assert not result.get("isError"), result
    return "vanilla" if "structuredContent" in result else "react"


STRATEGIES = {
    "prefix": ({}, None),
    "prefix, priorityOrder": ({"conflictResolutionConfig": {"priorityOrder": ["vanilla"]}}, "vanilla"),
    "priority": ({"conflictResolution": "priority", "conflictResolutionConfig": {"priorityOrder": ["react", "vanilla"]}},
                 "react"),
    "manual": ({"conflictResolution": "manual",
                "tools": [{"workload": "react", "overrides": {"get-time": {"name": "react_time"}}}]}, "vanilla"),
}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_shared_app_tool_name_is_resolved_by_the_documented_rule_or_refused(servers, start_gateway, monkeypatch,
                                                                              strategy):
    aggregation, goes_to = STRATEGIES[strategy]
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    gateway = start_gateway(apps_config(servers, monitor=False, aggregation=aggregation,
                                        admin={"tokenEnv": ADMIN_ENV}))

    async def calls_and_clashes(client: Any) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
        answers = await app_calls(client)
        # while this client's session (and so its user) is live
        sessions = admin_get(gateway, token=ADMIN_TOKEN).json()["sessions"]
        page = admin_get(gateway, "/admin", token=ADMIN_TOKEN).text
        return answers, [clash for session in sessions for clash in session["catalogClashes"]], page

    answers, clashes, page = seen(gateway.url, "legacy", calls_and_clashes)
    table = page[page.index('<table id="clashes">'):]
    table = table[:table.index("</table>")]
    for clash in clashes:  # the admin page's Name clashes table shows each
        assert f"<td>{escape(clash['name'])}</td><td>{escape(', '.join(clash['backends']))}</td>" \
            f"<td>{escape(clash['outcome'])}</td>" in table, (clash, table)
    if goes_to is None:
        assert "ambiguous" in answers["get-time"]["error"]
    else:
        assert time_of(answers["get-time"]) == goes_to
    assert any(clash["kind"] == "tool name" and clash["name"] == "get-time" for clash in clashes), clashes
    assert any(clash["kind"] == "ui URI" and clash["name"] == SHARED_UI for clash in clashes), clashes


def test_an_apps_call_passes_cedar_rate_limits_and_audit_under_the_advertised_name(servers, start_gateway, tmp_path):
    audit = tmp_path / "audit.log"
    policies = ['permit(principal, action, resource);',
                'forbid(principal, action == Action::"call_tool", resource == Tool::"monitor_poll-system-stats");']
    config = apps_config(servers, aggregation={"conflictResolutionConfig": {"priorityOrder": ["vanilla"]}},
                         incomingAuth={"type": "anonymous", "authz": {"type": "cedar", "policies": policies}},
                         rateLimiting={"tools": [{"name": "vanilla_get-time", "global": {"maxTokens": 2,
                                                                                        "refillPeriod": "1h"}}]},
                         audit={"enabled": True, "logFile": str(audit)})
    gateway = start_gateway(config)
    async def calls(client: Any) -> list[Any]:
        answers = []
        for name in ("poll-system-stats", "get-time", "get-time", "get-time"):
            try:
                answers.append(dumped(await client.call_tool(name, {})))
            except MCPError as error:
                answers.append(str(error))
        return answers

    denied, first, second, limited = seen(gateway.url, "legacy", calls)
    assert "Unknown tool: poll-system-stats" in denied  # a Cedar deny still denies the app's call
    assert time_of(first) == time_of(second) == "vanilla"
    assert "rate limit" in limited.lower()  # the app's calls count against vanilla_get-time's bucket
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    called = [(line["name"], line.get("calledAs"), line["outcome"]) for line in lines
              if line["method"] == "tools/call"]
    assert called[1:] == [("vanilla_get-time", "get-time", "success")] * 2 + [
        ("vanilla_get-time", "get-time", "rate_limited")]


def test_a_browser_host_at_a_listed_origin_gets_cors_and_others_do_not(servers, start_gateway):
    host = "http://127.0.0.1:5999"
    gateway = start_gateway(apps_config(servers, monitor=False, operational={
        "allowedOrigins": [host], **DISCOVERY["operational"]}))
    preflight = requests.options(gateway.url, headers={
        "Origin": host, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, mcp-protocol-version, mcp-session-id, x-evil"},
        timeout=10)
    assert preflight.status_code == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == host
    allowed = {name.strip() for name in preflight.headers["Access-Control-Allow-Headers"].split(",")}
    assert allowed == {"content-type", "mcp-protocol-version", "mcp-session-id"}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "page", "version": "1"}}}
    answered = requests.post(gateway.url, json=initialize, headers={**MCP_HEADERS, "Origin": host}, timeout=10)
    assert answered.headers["Access-Control-Allow-Origin"] == host
    assert "Mcp-Session-Id" in answered.headers["Access-Control-Expose-Headers"]
    assert answer_of(answered)["result"]["capabilities"]["extensions"] == {UI_EXTENSION: {}}
    elsewhere = "http://127.0.0.1:6000"
    refused = requests.options(gateway.url, headers={"Origin": elsewhere, "Access-Control-Request-Method": "POST"},
                               timeout=10)
    assert "Access-Control-Allow-Origin" not in refused.headers
    # a page elsewhere may still reach a loopback gateway (allowedHosts decide that), but not read it
    assert "Access-Control-Allow-Origin" not in requests.post(
        gateway.url, json=initialize, headers={**MCP_HEADERS, "Origin": elsewhere}, timeout=10).headers


def test_validate_discover_reports_the_clashes(servers, tmp_path):
    import subprocess

    import yaml

    path = tmp_path / "apps.yaml"
    path.write_text(yaml.safe_dump(apps_config(servers, monitor=False)), encoding="utf-8")
    checked = subprocess.run([sys.executable, "-m", "vmcp_actors.cli", "validate", "--config", str(path),
                              "--discover"], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert "clash: tool name 'get-time' is claimed by backends react, vanilla: a call by this name (an app's) " \
           "is refused as ambiguous" in checked.stdout
    assert "clash: ui URI 'ui://get-time/mcp-app.html' is claimed by backends react, vanilla: rewritten for each " \
           "backend: ui://react/get-time/mcp-app.html, ui://vanilla/get-time/mcp-app.html" in checked.stdout
