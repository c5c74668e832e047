"""Connect on first use with everything else in the stack (issue 37): Cedar decides on the
connect tool as on any tool, rate limits count it, and a composite tool's steps reach a
backend the person connected (and fail with a clear message before). The backend is the
TypeScript SDK's example OAuth server; the browser is headless Chromium."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway import wait_until
from tests.integration.test_connections_flow import rpc, session
from tests.oauth_browser import sign_in_pages
from tests.oauth_gateway import RawOAuthClient, SignInGateway, connect_setup, mcp_post

POLICIES = ['permit(principal, action, resource);',
            'forbid(principal == Client::"mallory", action == Action::"call_tool", resource == Tool::"connect_ts");']


@pytest.fixture(autouse=True)
def stop_all_actors():
    yield


@pytest.fixture(scope="module")
def setup():
    extra = {"rateLimiting": {"tools": [{"name": "connect_ts", "perUser": {"maxTokens": 3, "refillPeriod": "1h"}}]},
             "compositeTools": [{"name": "greet_twice", "description": "Greet, then greet the greeting",
                                 "parameters": {"type": "object", "properties": {"who": {"type": "string"}}},
                                 "steps": [{"id": "first", "tool": "ts.greet", "arguments": {"name": "{{ params.who }}"}},
                                           {"id": "second", "tool": "ts.greet", "dependsOn": ["first"],
                                            "arguments": {"name": "{{ steps.first.output.text }}"}}]}]}
    with connect_setup(extra, authz={"type": "cedar", "policies": POLICIES}) as (gateway, driver, _):
        yield gateway, driver


def signed_in(gateway: SignInGateway, driver: Any, login: str) -> tuple[str, str]:
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    token = RawOAuthClient(gateway.issuer).sign_in(driver, login)["access_token"]
    return token, session(gateway, token)


def call(gateway: SignInGateway, token: str, session_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return rpc(gateway, token, session_id, "tools/call", {"name": name, "arguments": arguments})


def test_cedar_decides_on_the_connect_tool_as_on_any_tool(setup):
    gateway, driver = setup
    token, session_id = signed_in(gateway, driver, "mallory")
    listed = [tool["name"] for tool in rpc(gateway, token, session_id, "tools/list", {})["result"]["tools"]]
    assert "connect_ts" not in listed
    refused = call(gateway, token, session_id, "connect_ts", {})
    assert "error" in refused and "connect_ts" in refused["error"]["message"], refused


def test_the_connect_tool_is_rate_limited_like_any_tool(setup):
    gateway, driver = setup
    token, session_id = signed_in(gateway, driver, "rita")
    answers = [call(gateway, token, session_id, "connect_ts", {}) for _ in range(3)]
    assert all(answer["result"]["isError"] for answer in answers)  # each a link
    limited = mcp_post(gateway.mcp_url, token, {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                                                "params": {"name": "connect_ts", "arguments": {}}},
                       **{"Mcp-Session-Id": session_id})
    assert limited.status_code == 429 and "Retry-After" in limited.headers  # the bucket is empty


def test_a_composite_over_a_backend_appears_once_the_person_connected_it(setup):
    gateway, driver = setup
    token, session_id = signed_in(gateway, driver, "carl")
    listed = [tool["name"] for tool in rpc(gateway, token, session_id, "tools/list", {})["result"]["tools"]]
    assert listed == ["connect_ts"]  # its steps' tools are not there yet: nor is the composite
    link = call(gateway, token, session_id, "connect_ts", {})["result"]["content"][0]["text"].rsplit(" ", 1)[-1]
    sign_in_pages(driver, link, login="carl", stop_prefix=f"{gateway.issuer}/connect/callback")

    def greeted() -> str | None:
        answer = call(gateway, token, session_id, "greet_twice", {"who": "Ann"})
        result = answer.get("result") or {}
        return None if "error" in answer or result.get("isError") else result["content"][0]["text"]

    assert wait_until(greeted, timeout=20, interval=0.1) == '{"text": "Hello, Hello, Ann!!"}'  # the last step's output


def test_a_composite_task_runs_its_steps_with_the_persons_connection(setup):
    gateway, driver = setup
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
