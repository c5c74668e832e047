"""Connect on first use (issue 37), at the protocol level: the TypeScript SDK's example OAuth
server as a backend (its own authorization server: DCR, PKCE, strict resource) and a stdio
backend whose people authorize at that same server, the gateway as its clients'
authorization server in front of oidc-provider (with Cedar, a rate limit on a connect tool
and a composite tool over the backend), a headless browser."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway import wait_until
from tests.oauth_browser import sign_in_pages
from tests.oauth_gateway import RawOAuthClient, SignInGateway, connect_setup, mcp_post
from vmcp_actors.web._installed import EXTENSION_KEY

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


@pytest.fixture(autouse=True)
def stop_all_actors():
    yield


POLICIES = ['permit(principal, action, resource);',
            'forbid(principal == Client::"mallory", action == Action::"call_tool", resource == Tool::"connect_ts");']
# Before anyone connects, each person sees these (greet_twice's steps need ts: it waits too).
UNCONNECTED = ["connect_saas", "connect_ts"]
STDIO_SERVER = '''
import os
from mcp.server.mcpserver import MCPServer
srv = MCPServer("stdio-token")

@srv.tool()
def token_seen() -> str:
    """What this process got in its environment, and its pid."""
    return f"{os.getpid()} {os.environ.get('SAAS_TOKEN', '<unset>')}"

srv.run("stdio")
'''


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import sys

    script = tmp_path_factory.mktemp("connect") / "token_server.py"
    script.write_text(STDIO_SERVER, encoding="utf-8")

    def stdio_backend(ts: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """A per-person process whose people authorize at the example server's AS."""
        return ([{"name": "saas", "transport": "stdio", "command": sys.executable, "args": [str(script)],
                  "scope": "perUser"}],
                {"saas": {"type": "oauth", "tokenEnv": "SAAS_TOKEN",
                          "oauth": {"issuer": f"http://localhost:{ts.auth_port}",
                                    "resource": f"http://localhost:{ts.port}/mcp"}}})

    extra = {"rateLimiting": {"tools": [{"name": "connect_ts", "perUser": {"maxTokens": 3, "refillPeriod": "1h"}}]},
             "compositeTools": [{"name": "greet_twice", "description": "Greet, then greet the greeting",
                                 "parameters": {"type": "object", "properties": {"who": {"type": "string"}}},
                                 "steps": [{"id": "first", "tool": "ts.greet", "arguments": {"name": "{{ params.who }}"}},
                                           {"id": "second", "tool": "ts.greet", "dependsOn": ["first"],
                                            "arguments": {"name": "{{ steps.first.output.text }}"}}]}]}
    with connect_setup(extra, stdio_backend, authz={"type": "cedar", "policies": POLICIES}) as world:
        yield world


def session(gateway: SignInGateway, token: str) -> str:
    answer = mcp_post(gateway.mcp_url, token, INIT)
    assert answer.status_code == 200, answer.text
    session_id = answer.headers["Mcp-Session-Id"]
    mcp_post(gateway.mcp_url, token, {"jsonrpc": "2.0", "method": "notifications/initialized"},
             **{"Mcp-Session-Id": session_id})
    return session_id


def rpc(gateway: SignInGateway, token: str, session_id: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    answer = mcp_post(gateway.mcp_url, token, {"jsonrpc": "2.0", "id": 2, "method": method, "params": params},
                      **{"Mcp-Session-Id": session_id})
    assert answer.status_code == 200, answer.text
    text = answer.text
    if answer.headers.get("Content-Type", "").startswith("text/event-stream"):
        import json
        data = [line[5:] for line in text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1])
    return answer.json()


def listen(gateway: SignInGateway, token: str, session_id: str) -> list[str]:
    """The methods the session's standalone stream (GET) brings, as they come (read on a thread)."""
    import json
    import threading

    import requests

    heard: list[str] = []
    stream = requests.get(gateway.mcp_url, stream=True, timeout=30, headers={
        "Authorization": f"Bearer {token}", "Accept": "text/event-stream", "Mcp-Session-Id": session_id,
        "MCP-Protocol-Version": "2025-11-25"})
    assert stream.status_code == 200, stream.status_code

    def read() -> None:
        try:
            for line in stream.iter_lines(decode_unicode=True):
                if line and line.startswith("data:"):
                    heard.append(json.loads(line[5:]).get("method", ""))
        except Exception:  # noqa: BLE001 - the stream ends with the module's gateway
            pass

    threading.Thread(target=read, daemon=True).start()
    return heard


def test_a_person_connects_through_the_link_and_the_backends_tools_appear(setup):
    gateway, driver, backend = setup
    client = RawOAuthClient(gateway.issuer)
    token = client.sign_in(driver, "alice")["access_token"]
    session_id = session(gateway, token)
    listed = rpc(gateway, token, session_id, "tools/list", {})
    names = [tool["name"] for tool in listed["result"]["tools"]]
    assert names == UNCONNECTED, listed
    heard = listen(gateway, token, session_id)  # the session's stream, as a client keeps it open
    called = rpc(gateway, token, session_id, "tools/call", {"name": "connect_ts", "arguments": {}})
    result = called["result"]
    assert result["isError"] is True
    text = result["content"][0]["text"]
    link = text.rsplit(" ", 1)[-1]
    assert link.startswith(f"{gateway.issuer}/connect/"), text
    final, pages = sign_in_pages(driver, link, login="alice", stop_prefix=f"{gateway.issuer}/connect/callback")
    assert driver.find_element("id", "message").text.startswith("Connected to ts.")

    def listed() -> list[str]:  # the person's catalog is rebuilt just after the connect
        return [tool["name"] for tool in rpc(gateway, token, session_id, "tools/list", {})["result"]["tools"]]

    assert wait_until(lambda: "notifications/tools/list_changed" in heard, timeout=20), heard  # told at once
    assert "ts_greet" in wait_until(lambda: "ts_greet" in listed() and listed(), timeout=20), listed()
    assert "connect_ts" not in listed()
    greeted = rpc(gateway, token, session_id, "tools/call", {"name": "ts_greet", "arguments": {"name": "Ann"}})
    assert greeted["result"]["content"][0]["text"] == "Hello, Ann!", greeted


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_client_with_url_elicitation_is_asked_and_its_call_goes_on(setup, mode):
    import threading

    from tests.oauth_browser import sign_in
    from tests.oauth_clients import PythonSdkClient, ToolCall

    gateway, driver, backend = setup
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    client = PythonSdkClient(mode=mode)
    asked: list[dict[str, Any]] = []
    heard: list[dict[str, Any]] = []
    login = f"carol-{mode}"

    def open_url(url: str) -> None:
        sign_in(driver, url, login=login, stop_prefix=client.redirect_uri)

    def elicit(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        threading.Thread(target=sign_in_pages, args=(driver, params["url"]),
                         kwargs={"login": login, "stop_prefix": f"{gateway.issuer}/connect/callback"},
                         daemon=True).start()
        return {"action": "accept"}

    run = client.run(gateway.mcp_url, open_url, ToolCall("connect_ts", {}), elicitation=elicit, notifications=heard)
    assert run.tools == UNCONNECTED
    assert asked and asked[0]["mode"] == "url", asked
    assert run.call_is_error is False, run.call_text
    assert "Connected to ts" in run.call_text
    assert run.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
    if mode == "legacy":  # the call waited for the connect, and says so before its answer
        assert "notifications/elicitation/complete" in [n["method"] for n in heard]
        assert [n["params"]["elicitationId"] for n in heard if n["method"].endswith("complete")] == \
            [asked[0]["elicitationId"]]


def test_the_typescript_sdk_client_is_asked_by_url_elicitation_and_told_when_it_is_done(setup):
    import threading

    from tests.oauth_browser import sign_in
    from tests.oauth_clients import ToolCall, TsSdkClient

    gateway, driver, backend = setup
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    client = TsSdkClient()
    login = "dave"
    browsing: list[threading.Thread] = []

    def open_url(url: str) -> None:
        sign_in(driver, url, login=login, stop_prefix=client.redirect_uri)

    def on_elicit(params: dict[str, Any]) -> None:
        assert params["mode"] == "url" and params["url"].startswith(f"{gateway.issuer}/connect/")
        thread = threading.Thread(target=sign_in_pages, args=(driver, params["url"]),
                                  kwargs={"login": login, "stop_prefix": f"{gateway.issuer}/connect/callback"},
                                  daemon=True)
        browsing.append(thread)
        thread.start()

    run = client.run(gateway.mcp_url, open_url, ToolCall("connect_ts", {}), on_elicit=on_elicit)
    for thread in browsing:
        thread.join(30)
    assert run.tools == UNCONNECTED
    assert run.call_is_error is False and "Connected to ts" in run.call_text, run.call_text
    assert run.elicitation is not None and len(run.elicitation["elicitations"]) == 1
    assert run.elicitation["completed"] == run.elicitation["elicitations"]


def test_a_process_backend_gets_the_persons_token_and_starts_again_with_a_new_one(setup):
    gateway, driver, backend = setup
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    token = RawOAuthClient(gateway.issuer).sign_in(driver, "erin")["access_token"]
    session_id = session(gateway, token)

    def connect() -> None:
        asked = rpc(gateway, token, session_id, "tools/call", {"name": "connect_saas", "arguments": {}})
        link = asked["result"]["content"][0]["text"].rsplit(" ", 1)[-1]
        sign_in_pages(driver, link, login="erin", stop_prefix=f"{gateway.issuer}/connect/callback")

    def seen() -> str:
        def called() -> str | None:  # the catalog is rebuilt just after the connect
            answer = rpc(gateway, token, session_id, "tools/call", {"name": "saas_token_seen", "arguments": {}})
            if "error" in answer or answer["result"].get("isError"):
                return None
            return answer["result"]["content"][0]["text"].split(" ", 1)[1]

        value = wait_until(called, timeout=20, interval=0.1)
        assert value, "the process backend never answered"
        return value

    connect()
    first_token = seen()
    assert first_token not in ("<unset>", token) and len(first_token) > 10
    runtime = gateway.gateway.app.extensions[EXTENSION_KEY]
    runtime.connect.connections.disconnect((gateway.idp.issuer, "erin"), "saas")
    connect()
    assert seen() not in (first_token, "<unset>")  # a process's environment is fixed: a new process


# -- with everything else in the stack: Cedar, rate limits, composite tools and tasks ----------


def signed_in(gateway: SignInGateway, driver: Any, login: str) -> tuple[str, str]:
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    token = RawOAuthClient(gateway.issuer).sign_in(driver, login)["access_token"]
    return token, session(gateway, token)


def call(gateway: SignInGateway, token: str, session_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return rpc(gateway, token, session_id, "tools/call", {"name": name, "arguments": arguments})


def test_cedar_decides_on_the_connect_tool_as_on_any_tool(setup):
    gateway, driver, _ = setup
    token, session_id = signed_in(gateway, driver, "mallory")
    listed = [tool["name"] for tool in rpc(gateway, token, session_id, "tools/list", {})["result"]["tools"]]
    assert "connect_ts" not in listed
    refused = call(gateway, token, session_id, "connect_ts", {})
    assert "error" in refused and "connect_ts" in refused["error"]["message"], refused


def test_the_connect_tool_is_rate_limited_like_any_tool(setup):
    gateway, driver, _ = setup
    token, session_id = signed_in(gateway, driver, "rita")
    answers = [call(gateway, token, session_id, "connect_ts", {}) for _ in range(3)]
    assert all(answer["result"]["isError"] for answer in answers)  # each a link
    limited = mcp_post(gateway.mcp_url, token, {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                                                "params": {"name": "connect_ts", "arguments": {}}},
                       **{"Mcp-Session-Id": session_id})
    assert limited.status_code == 429 and "Retry-After" in limited.headers  # the bucket is empty


def test_a_composite_over_a_backend_appears_once_the_person_connected_it(setup):
    gateway, driver, _ = setup
    token, session_id = signed_in(gateway, driver, "carl")
    listed = [tool["name"] for tool in rpc(gateway, token, session_id, "tools/list", {})["result"]["tools"]]
    assert listed == UNCONNECTED  # its steps' tools are not there yet: nor is the composite
    link = call(gateway, token, session_id, "connect_ts", {})["result"]["content"][0]["text"].rsplit(" ", 1)[-1]
    sign_in_pages(driver, link, login="carl", stop_prefix=f"{gateway.issuer}/connect/callback")

    def greeted() -> str | None:
        answer = call(gateway, token, session_id, "greet_twice", {"who": "Ann"})
        result = answer.get("result") or {}
        return None if "error" in answer or result.get("isError") else result["content"][0]["text"]

    assert wait_until(greeted, timeout=20, interval=0.1) == '{"text": "Hello, Hello, Ann!!"}'  # the last step's output


def test_a_composite_task_runs_its_steps_with_the_persons_connection(setup):
    gateway, driver, _ = setup
    token, session_id = signed_in(gateway, driver, "tess")
    link = call(gateway, token, session_id, "connect_ts", {})["result"]["content"][0]["text"].rsplit(" ", 1)[-1]
    sign_in_pages(driver, link, login="tess", stop_prefix=f"{gateway.issuer}/connect/callback")
    assert wait_until(lambda: "greet_twice" in [tool["name"] for tool in rpc(
        gateway, token, session_id, "tools/list", {})["result"]["tools"]], timeout=20, interval=0.1)
    created = rpc(gateway, token, session_id, "tools/call",
                  {"name": "greet_twice", "arguments": {"who": "Tim"}, "task": {"ttl": 60000}})
    handle = created["result"]["task"]["taskId"]
    done = rpc(gateway, token, session_id, "tasks/result", {"taskId": handle})
    assert done["result"]["content"][0]["text"] == '{"text": "Hello, Hello, Tim!!"}', done
