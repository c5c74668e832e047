"""Connect on first use (issue 37) over two workers sharing one real Redis: a connect made
through one worker serves the person's calls on the other, a 2026-07-28 client's retry after
URL elicitation may land on either, and no backend token lies in Redis in plaintext. The
backend is the TypeScript SDK's example OAuth server; the browser is headless Chromium."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

from tests.gateway import answer_of, wait_until
from tests.integration.test_oauth_workers import PREFIX, assert_nowhere, shared_records
from tests.oauth_browser import sign_in_pages
from tests.oauth_gateway import RawOAuthClient, connect_setup, mcp_post
from vmcp_actors.web._installed import EXTENSION_KEY


def meta(elicitation: bool) -> dict[str, Any]:
    return {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"url": {}}} if elicitation else {},
            "io.modelcontextprotocol/clientInfo": {"name": "connect-workers", "version": "0"}}


def modern(base: str, token: str, method: str, params: dict[str, Any], elicitation: bool = False) -> dict[str, Any]:
    """A stateless (2026-07-28) request to ``base``."""
    headers = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method}
    if "name" in params:
        headers["Mcp-Name"] = params["name"]
    answer = mcp_post(f"{base}/mcp", token, {"jsonrpc": "2.0", "id": 3, "method": method,
                                             "params": {**params, "_meta": meta(elicitation)}}, **headers)
    assert answer.status_code == 200, answer.text
    return answer_of(answer)


@pytest.fixture(autouse=True)
def stop_all_actors():
    yield


@pytest.fixture(scope="module")
def setup():
    from tests.redis_server import RedisServer

    server = RedisServer().start()
    try:
        with connect_setup(shared_records(server), workers=2) as (gateway, driver, _):
            yield gateway, driver, server
    finally:
        server.close()


def tools(base: str, token: str) -> list[str]:
    return [tool["name"] for tool in modern(base, token, "tools/list", {})["result"]["tools"]]


def test_a_connect_made_through_one_worker_serves_the_person_on_the_other(setup):
    """A 2026-07-28 client asks on the second worker, is asked by URL elicitation, accepts,
    and its retry reaches the first worker (the person's browser finishes on the first, the
    public URL's): the retry waits there for the connect. Then the second worker's user of
    the person lists the backend's tools (the fanout told it) and calls them."""
    gateway, driver, server = setup
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    first, second = gateway.worker_urls
    token = RawOAuthClient(gateway.issuer).sign_in(driver, "bob")["access_token"]
    assert tools(second, token) == ["connect_ts"]
    asked = modern(second, token, "tools/call", {"name": "connect_ts", "arguments": {}}, elicitation=True)["result"]
    assert asked["resultType"] == "input_required"
    ((key, request),) = asked["inputRequests"].items()
    assert request["method"] == "elicitation/create" and request["params"]["mode"] == "url"
    assert request["params"]["url"].startswith(f"{gateway.issuer}/connect/")  # the public URL, whichever worker
    opened = threading.Thread(target=sign_in_pages, args=(driver, request["params"]["url"]),
                              kwargs={"login": "bob", "stop_prefix": f"{gateway.issuer}/connect/callback"})
    opened.start()
    try:  # accepted at once (the person is still in the browser): the retry waits for the connect
        done = modern(first, token, "tools/call", {"name": "connect_ts", "arguments": {},
                                                   "inputResponses": {key: {"action": "accept"}},
                                                   "requestState": asked["requestState"]}, elicitation=True)
    finally:
        opened.join(30)
    assert done["result"]["content"][0]["text"].startswith("Connected to ts"), done
    assert done["result"].get("isError") is False
    assert wait_until(lambda: "ts_greet" in tools(second, token), timeout=30, interval=0.2)
    greeted = modern(second, token, "tools/call", {"name": "ts_greet", "arguments": {"name": "Bo"}})
    assert greeted["result"]["content"][0]["text"] == "Hello, Bo!"
    records = gateway.gateway.app.extensions[EXTENSION_KEY].connect.connections.records
    (key_of_bob,) = records.keys("connection")
    held = redis.Redis.from_url(f"redis://{server.address}")
    assert_nowhere(held, {"access token at ts": records.get("connection", key_of_bob)["access_token"]},
                   {"connection", "backend-client"})
