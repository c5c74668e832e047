"""MCP Apps in a real host: our host page (tests/node/apps_host.mjs: ext-apps' AppBridge and
the MCP client) renders each example server's app in headless Chromium, and the app's own
tool calls go back through the bridge: straight to each server (which proves the test host
itself), then through the gateway's one URL, with the same expectations
(``tests/apps_host.expect_*``) and the same text in the DOM. Screenshots of every card go to
``$VMCP_TEST_ARTIFACTS/mcp-apps`` (else a pytest temporary directory; printed).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests import apps_host, oauth_browser
from tests.apps_host import (
    GET_TIME_URI,
    REACT,
    SYSTEM_MONITOR,
    SYSTEM_MONITOR_URI,
    VANILLA,
    Card,
    expect_get_time_app,
    expect_system_monitor_app,
)

STDIO_TIMEOUT = 20.0


@pytest.fixture(scope="module")
def servers():
    """The three example servers over HTTP, on loopback ports, for the whole module."""
    apps_host.need_mcp_apps()
    started = apps_host.start_app_servers()
    yield started
    for server in started.values():
        server.stop()


@pytest.fixture(scope="module")
def host():
    apps_host.need_mcp_apps()
    with oauth_browser.browser() as driver, apps_host.AppsHost(driver) as served:
        yield served


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    return apps_host.artifacts_dir(tmp_path_factory, "mcp-apps")


def shot(card: Card, directory: Path, name: str) -> None:
    path = card.screenshot(directory / f"{name}.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_example_server_answers_over_stdio():
    """stdio_command starts an example server over stdio (the other way a gateway reaches them)."""
    apps_host.need_mcp_apps()
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "clientInfo": {"name": "test", "version": "1"},
                    "capabilities": {"extensions": {"io.modelcontextprotocol/ui": {
                        "mimeTypes": [apps_host.APP_MIME_TYPE]}}}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ]
    # It answers what is on its stdin, then exits as stdin closes.
    done = subprocess.run(apps_host.stdio_command(SYSTEM_MONITOR), capture_output=True, text=True, check=False,
                          input="".join(json.dumps(request) + "\n" for request in requests), timeout=STDIO_TIMEOUT)
    answers = {answer["id"]: answer for answer in map(json.loads, done.stdout.splitlines())}
    assert answers[1]["result"]["protocolVersion"] == "2025-11-25", done.stderr
    tools = {tool["name"]: tool for tool in answers[2]["result"]["tools"]}
    assert tools["get-system-info"]["_meta"]["ui"]["resourceUri"] == SYSTEM_MONITOR_URI
    assert tools["poll-system-stats"]["_meta"]["ui"]["visibility"] == ["app"]


# -- through the gateway ---------------------------------------------------------------------

VARYING = ((re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+Z"), "<time>"), (re.compile(r"\d+(\.\d+)?"), "<n>"))


def same_text(text: str) -> str:
    """A card's visible text with what changes from one call to the next (times, live figures) masked."""
    for pattern, mask in VARYING:
        text = pattern.sub(mask, text)
    return text


@pytest.fixture
def apps_gateway(servers, host, start_gateway):
    """The gateway over vanilla and react (HTTP) and the system monitor (stdio), its MCP
    endpoint open to the host page's origin (a browser host)."""
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(host.url))
    command = apps_host.stdio_command(SYSTEM_MONITOR)

    def start(**aggregation: object):
        return start_gateway({
            "name": "apps",
            "backends": [{"name": "vanilla", "url": servers[VANILLA].mcp_url},
                         {"name": "react", "url": servers[REACT].mcp_url},
                         {"name": "monitor", "transport": "stdio", "command": command[0], "args": command[1:]}],
            "aggregation": aggregation,
            "operational": {"allowedOrigins": [origin], "discoveryBudget": {"default": "20s"}}})

    return start


def test_a_host_renders_the_three_apps_directly_and_from_one_gateway_alike(servers, host, apps_gateway, screenshots):
    direct = host.render_servers([(servers[VANILLA].mcp_url, ["get-time"]), (servers[REACT].mcp_url, ["get-time"]),
                                  (servers[SYSTEM_MONITOR].mcp_url, ["get-system-info"])])
    # One URI, two different apps: each card got its own server's HTML.
    assert [card.uri for card in direct] == [GET_TIME_URI, GET_TIME_URI, SYSTEM_MONITOR_URI]
    assert direct[0].html_sha256 != direct[1].html_sha256
    for card, package in zip(direct, (VANILLA, REACT)):
        expect_get_time_app(card, package)
    expect_system_monitor_app(direct[2], polls=1)
    direct_texts = [same_text(card.text()) for card in direct]
    for card, name in zip(direct, ("vanilla", "react", "system-monitor")):
        shot(card, screenshots, f"direct-{name}")

    # Both template apps call get-time: the rule documented for a shared own name decides (vanilla first).
    gateway = apps_gateway(conflictResolutionConfig={"priorityOrder": ["vanilla"]})
    vanilla, react, monitor = host.render(gateway.url, ["vanilla_get-time", "react_get-time", "monitor_get-system-info"])
    # One URI at the servers, two through the gateway: each card shows its own server's HTML.
    assert (vanilla.uri, react.uri, monitor.uri) == (
        "ui://vanilla/get-time/mcp-app.html", "ui://react/get-time/mcp-app.html", SYSTEM_MONITOR_URI)
    expect_get_time_app(vanilla, VANILLA)
    expect_get_time_app(react, REACT)
    expect_system_monitor_app(monitor, polls=2)  # app-only poll-system-stats, by its own name, again and again
    assert [same_text(card.text()) for card in (vanilla, react, monitor)] == direct_texts
    for card, name in ((vanilla, "vanilla"), (react, "react"), (monitor, "system-monitor")):
        shot(card, screenshots, f"gateway-{name}")
    host.screenshot(screenshots / "gateway-side-by-side.png")


def test_in_the_default_config_an_app_call_no_rule_decides_is_refused_clearly(host, apps_gateway):
    gateway = apps_gateway()
    vanilla, monitor = host.render(gateway.url, ["vanilla_get-time", "monitor_get-system-info"])
    expect_system_monitor_app(monitor, polls=1)  # its own name is the monitor's alone: it just works
    call = vanilla.press(apps_host.GET_TIME_BUTTON)
    assert call["name"] == "get-time" and "is ambiguous" in call["error"], call
    assert "react_get-time, vanilla_get-time" in call["error"]
