"""Connect on first use (issue 37), at the protocol level: the TypeScript SDK's example OAuth
server as a backend (its own authorization server: DCR, PKCE, strict resource), the gateway
as its clients' authorization server in front of oidc-provider, a headless browser."""

from __future__ import annotations

from typing import Any

import pykka
import pytest

from tests.oauth_browser import browser, need_browser, sign_in_pages
from tests.oauth_clients import TsExampleOAuthServer
from tests.oauth_gateway import RawOAuthClient, SignInGateway, mcp_post

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


@pytest.fixture(autouse=True)
def stop_all_actors():
    yield


@pytest.fixture(scope="module")
def setup():
    need_browser()
    backend = TsExampleOAuthServer()
    gateway = SignInGateway([{"name": "ts", "url": f"http://localhost:{backend.port}/mcp"}],
                            extra={"outgoingAuth": {"backends": {"ts": {"type": "oauth"}}}})
    try:
        with browser() as driver:
            yield gateway, driver, backend
    finally:
        gateway.stop()
        backend.stop()
        pykka.ActorRegistry.stop_all(block=True, timeout=5)


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


def test_a_person_connects_through_the_link_and_the_backends_tools_appear(setup):
    gateway, driver, backend = setup
    client = RawOAuthClient(gateway.issuer)
    token = client.sign_in(driver, "alice")["access_token"]
    session_id = session(gateway, token)
    listed = rpc(gateway, token, session_id, "tools/list", {})
    names = [tool["name"] for tool in listed["result"]["tools"]]
    assert names == ["connect_ts"], listed
    called = rpc(gateway, token, session_id, "tools/call", {"name": "connect_ts", "arguments": {}})
    result = called["result"]
    assert result["isError"] is True
    text = result["content"][0]["text"]
    link = text.rsplit(" ", 1)[-1]
    assert link.startswith(f"{gateway.issuer}/connect/"), text
    final, pages = sign_in_pages(driver, link, login="alice", stop_prefix=f"{gateway.issuer}/connect/callback")
    import time
    time.sleep(1)
    print(driver.find_element("id", "message").text, pages)
    listed = rpc(gateway, token, session_id, "tools/list", {})
    names = [tool["name"] for tool in listed["result"]["tools"]]
    assert "ts_greet" in names, listed
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
    assert run.tools == ["connect_ts"]
    assert asked and asked[0]["mode"] == "url", asked
    assert run.call_is_error is False, run.call_text
    assert "Connected to ts" in run.call_text
    print(mode, run.protocol_version, [n["method"] for n in heard])


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
    assert run.tools == ["connect_ts"]
    assert run.call_is_error is False and "Connected to ts" in run.call_text, run.call_text
    assert run.elicitation is not None and len(run.elicitation["elicitations"]) == 1
    assert run.elicitation["completed"] == run.elicitation["elicitations"]
