"""Rate limits (issue 25): ToolHive's ``rateLimiting`` through real gateways. A client's call
passes the server's buckets (global, perUser) and its tool's; a refused call is HTTP 429 with
``Retry-After`` in both revisions and never reaches the backend; composite steps and the
optimizer's ``call_tool`` spend the inner tool's tokens; with a real redis-server two workers
admit together what one would, and Redis going away follows ``onStoreError``.

Real official-SDK backends (``plain_echo`` records each call that reaches it), the local
IdP for users (each its own ``sub``), 2025-11-25 sessions opened the raw way and
2026-07-28 requests (``modern_post``), each on a fresh connection."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis as redis_client
import requests

from tests.backends import sdk_backend
from tests.gateway import backend_entry
from tests.idp import LocalIdP
from tests.task_backends import modern_post
from vmcp_actors.config import RateLimitingConfig, TokenBucket, ToolRateLimit
from vmcp_actors.limits import RateLimited, RateLimiter, RedisBuckets

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

KEY_ENV, KEY = "RATE_LIMITS_SIGNING_KEY", "rate-limits-signing-key-0123456789ab"
AUD = "vmcp"
PREFIX = "lim:"
LEGACY = "2025-11-25"


@pytest.fixture
def backend():
    """``plain_echo`` appends each text it is called with to ``backend.echoed``;
    ``plain_whoami`` is another tool of the same backend."""
    echoed: list[str] = []

    def echo(text: str) -> str:
        """Echo the text back, prefixed with the backend name."""
        echoed.append(text)
        return f"plain:{text}"

    with sdk_backend("plain", ["whoami"], extra_tools=[echo]) as served:
        served.echoed = echoed
        yield served


@pytest.fixture
def idp():
    with LocalIdP("rate-limits-idp") as started:
        yield started


def config(backend, limits: dict, **extra) -> dict:
    return {"name": "limited", "backends": [backend_entry("plain", backend)], "rateLimiting": limits, **extra}


def oidc(idp: LocalIdP) -> dict:
    return {"incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUD}}}


def in_redis(redis_server, monkeypatch) -> dict:
    """Records and buckets in the real Redis; every worker holds the same signing key."""
    monkeypatch.setenv(KEY_ENV, KEY)
    return {"operational": {"signingKeyEnv": KEY_ENV},
            "sessionStorage": {"provider": "redis", "address": redis_server.address, "keyPrefix": PREFIX}}


def user(idp: LocalIdP, subject: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {idp.issue_token(subject, AUD)}"}


def bucket(max_tokens: int, refill_period: str = "1h") -> dict:
    return {"maxTokens": max_tokens, "refillPeriod": refill_period}


# -- clients -------------------------------------------------------------------------------------


def open_session(gateway, headers: dict | None = None) -> str:
    """A fresh 2025-11-25 session (initialize, then initialized); its id."""
    opened = gateway.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "rate-tests", "version": "1"}}},
        headers=headers)
    assert opened.status_code == 200, opened.text
    session_id = opened.headers["Mcp-Session-Id"]
    assert gateway.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session_id,
                        headers=headers).status_code == 202
    return session_id


def session_call(gateway, session_id: str, tool: str, arguments: dict, headers: dict | None = None,
                 request_id: int = 1) -> requests.Response:
    return gateway.post({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                         "params": {"name": tool, "arguments": arguments}},
                        session_id, headers={"MCP-Protocol-Version": LEGACY, **(headers or {})})


def modern_call(gateway, tool: str, arguments: dict, headers: dict | None = None, **options) -> requests.Response:
    return modern_post(gateway.url, "tools/call", {"name": tool, "arguments": arguments}, headers=headers, **options)


def admitted(response: requests.Response) -> bool:
    """True for a tool's successful result; False for the rate limit's refusal; anything
    else fails the test."""
    if response.status_code == 429:
        rate_limited(response)
        return False
    assert response.status_code == 200, (response.status_code, response.text)
    result = response.json()["result"]
    assert result["isError"] is False, result
    return True


def rate_limited(response: requests.Response, request_id=None) -> int:
    """Assert ToolHive's refusal whole; its retryAfterSeconds."""
    assert response.status_code == 429, (response.status_code, response.text)
    assert response.headers["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"jsonrpc", "id", "error"} and body["jsonrpc"] == "2.0", body
    if request_id is not None:
        assert body["id"] == request_id
    error = body["error"]
    assert error["code"] == 429 and error["message"] == "Rate limit exceeded", error
    retry_after = error["data"]["retryAfterSeconds"]
    assert isinstance(retry_after, int) and retry_after >= 1
    assert response.headers["Retry-After"] == str(retry_after)
    return retry_after


# -- shared by workers -----------------------------------------------------------------------------


def test_two_workers_sharing_redis_admit_a_users_bucket_once_between_them(start_gateway, backend, idp,
                                                                          redis_server, monkeypatch):
    # 10 per 10 minutes (the burst is what is tested; a token refills only after a minute,
    # far longer than the 16 calls take on a slow machine)
    settings = config(backend, {"perUser": bucket(10, "10m")}, **oidc(idp), **in_redis(redis_server, monkeypatch))
    workers = [start_gateway(settings) for _ in range(2)]
    alice, bob = user(idp, "alice"), user(idp, "bob")
    outcomes = []
    for number in range(16):  # alternately on each worker, in each revision, always a new connection
        worker, text = workers[number % 2], f"alice {number}"
        if (number // 2) % 2:
            response = modern_call(worker, "plain_echo", {"text": text}, alice)
        else:
            response = session_call(worker, open_session(worker, alice), "plain_echo", {"text": text}, alice)
        outcomes.append(admitted(response))
    assert outcomes == [True] * 10 + [False] * 6
    assert backend.echoed == [f"alice {number}" for number in range(10)]  # refused calls reached no backend
    # another user's bucket is their own, on either worker, in either revision
    assert admitted(modern_call(workers[0], "plain_echo", {"text": "bob 0"}, bob))
    assert admitted(session_call(workers[1], open_session(workers[1], bob), "plain_echo", {"text": "bob 1"}, bob))
    assert backend.echoed[10:] == ["bob 0", "bob 1"]
    # one bucket per user in Redis, under the storage prefix, named by a digest (no subject in a key)
    keys = redis_client.Redis(port=redis_server.port).keys(f"{PREFIX}rl:*")
    assert len(keys) == 2 and all(key.startswith(f"{PREFIX}rl:u:".encode()) for key in keys)
    assert not any(b"alice" in key or b"bob" in key for key in keys)


def test_two_workers_admit_exactly_the_burst_of_concurrent_calls(start_gateway, backend, redis_server, monkeypatch):
    settings = config(backend, {"tools": [{"name": "plain_echo", "global": bucket(8)}]},
                      **in_redis(redis_server, monkeypatch))
    workers = [start_gateway(settings) for _ in range(2)]
    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(lambda number: admitted(modern_call(workers[number % 2], "plain_echo",
                                                                     {"text": str(number)})), range(24)))
    assert outcomes.count(True) == 8 and len(backend.echoed) == 8


def test_the_redis_script_spends_from_every_bucket_or_from_none(redis_server):
    settings = RateLimitingConfig(shared=TokenBucket(5, 3600), tools=(ToolRateLimit("echo", TokenBucket(1, 3600)),))
    with redis_client.Redis(port=redis_server.port) as client:
        limits = RateLimiter(settings, RedisBuckets(client), key_prefix="x:")
        limits.admit(None, "echo")
        for _ in range(3):
            with pytest.raises(RateLimited) as info:
                limits.admit(None, "echo")
            assert info.value.bucket.kind == "tool" and 3590 <= info.value.retry_after <= 3600
        (shared,) = limits.buckets_for(None, None)
        assert limits.level(shared) == pytest.approx(4, abs=0.01)  # one call admitted, three refused
        for _ in range(4):
            limits.admit(None, "other")
        with pytest.raises(RateLimited) as info:
            limits.admit(None, "other")
        assert info.value.bucket.kind == "global" and 710 <= info.value.retry_after <= 720  # 5 an hour


# -- whose bucket --------------------------------------------------------------------------------


def test_a_tools_global_bucket_is_shared_by_every_user_and_limits_that_tool_only(start_gateway, backend, idp):
    gateway = start_gateway(config(backend, {"tools": [{"name": "plain_echo", "global": bucket(3)}]}, **oidc(idp)))
    alice, bob = user(idp, "alice"), user(idp, "bob")
    callers = [("alice", alice), ("bob", bob), ("alice", alice), ("bob", bob), ("alice", alice)]
    outcomes = [admitted(modern_call(gateway, "plain_echo", {"text": name}, headers)) for name, headers in callers]
    assert outcomes == [True, True, True, False, False]
    assert backend.echoed == ["alice", "bob", "alice"]
    for headers in (alice, bob):  # another tool of the same backend has no bucket
        assert all(admitted(modern_call(gateway, "plain_whoami", {}, headers)) for _ in range(4))


def test_a_call_the_policies_refuse_spends_none_of_the_tools_tokens(start_gateway, backend, idp):
    policies = ['permit(principal == Client::"alice", action == Action::"call_tool", resource);']
    gateway = start_gateway(config(backend, {"tools": [{"name": "plain_echo", "global": bucket(2)}]},
                                   incomingAuth={**oidc(idp)["incomingAuth"],
                                                 "authz": {"type": "cedar", "policies": policies}}))
    mallory = user(idp, "mallory")
    for _ in range(3):  # the tool is not mallory's: unknown to them, whatever its bucket holds
        refused = modern_call(gateway, "plain_echo", {"text": "mallory"}, mallory)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == -32602, refused.text
    assert admitted(modern_call(gateway, "plain_echo", {"text": "alice"}, user(idp, "alice")))


def test_a_refusal_is_429_with_retry_after_in_both_revisions_and_reaches_no_backend(start_gateway, backend):
    gateway = start_gateway(config(backend, {"tools": [{"name": "plain_echo", "global": bucket(2)}]}))
    session_id = open_session(gateway)
    assert admitted(session_call(gateway, session_id, "plain_echo", {"text": "1"}))
    assert admitted(modern_call(gateway, "plain_echo", {"text": "2"}))
    legacy = session_call(gateway, session_id, "plain_echo", {"text": "3"}, request_id=41)
    modern = modern_call(gateway, "plain_echo", {"text": "4"}, request_id=42)
    # a refusal is a plain JSON answer even where the call would have streamed (a progress token)
    streaming = gateway.post({"jsonrpc": "2.0", "id": 43, "method": "tools/call", "params": {
        "name": "plain_echo", "arguments": {"text": "5"}, "_meta": {"progressToken": "p"}}},
        session_id, headers={"MCP-Protocol-Version": LEGACY})
    for response, request_id in ((legacy, 41), (modern, 42), (streaming, 43)):
        # 2 tokens an hour: the next is about half an hour away
        assert 1700 <= rate_limited(response, request_id) <= 1800
    assert backend.echoed == ["1", "2"]
    # the refusal ends nothing: the session goes on with a tool that has no bucket
    assert admitted(session_call(gateway, session_id, "plain_whoami", {}))


def test_a_refused_caller_is_admitted_again_once_a_token_has_refilled(start_gateway, backend):
    # the server's bucket: 2 at once, then 1 every 2 s (slow enough that the last refusal
    # below holds however slowly the calls go under load: it has ~1.8 s, not ~0.8 s)
    gateway = start_gateway(config(backend, {"global": bucket(2, "4s")}))
    assert "result" in modern_post(gateway.url, "tools/list", {}).json()  # discovered: the calls below are quick
    assert admitted(modern_call(gateway, "plain_echo", {"text": "1"}))
    assert admitted(modern_call(gateway, "plain_whoami", {}))
    retry_after = rate_limited(modern_call(gateway, "plain_echo", {"text": "refused"}))
    assert retry_after == 2  # between 1 and 2 s away, rounded up
    time.sleep(retry_after + 0.2)  # the refill itself (real time), as a client following Retry-After waits
    assert admitted(modern_call(gateway, "plain_echo", {"text": "2"}))
    rate_limited(modern_call(gateway, "plain_echo", {"text": "refused"}))  # one token came back, not the burst
    assert backend.echoed == ["1", "2"]


# -- calls the gateway makes for the client ----------------------------------------------------------


ECHO_TWICE = {
    "name": "echo_twice", "description": "Echo, then echo again",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "steps": [
        {"id": "a", "tool": "plain_echo", "arguments": {"text": "{{ params.text }}-a"}},
        {"id": "b", "tool": "plain_echo", "dependsOn": ["a"], "arguments": {"text": "{{ params.text }}-b"}},
    ],
}


def test_a_composites_steps_spend_their_tools_tokens(start_gateway, backend):
    gateway = start_gateway(config(backend, {"tools": [{"name": "plain_echo", "global": bucket(3)}]},
                                   compositeTools=[ECHO_TWICE]))
    session_id = open_session(gateway)
    assert admitted(session_call(gateway, session_id, "echo_twice", {"text": "one"}))
    second = session_call(gateway, session_id, "echo_twice", {"text": "two"})
    assert second.status_code == 200  # the composite ran; its second step was refused
    result = second.json()["result"]
    assert result["isError"] is True
    assert result["content"][0]["text"] == "composite tool 'echo_twice': step 'b' failed: Rate limit exceeded"
    assert backend.echoed == ["one-a", "one-b", "two-a"]
    rate_limited(session_call(gateway, session_id, "plain_echo", {"text": "direct"}))
    assert backend.echoed == ["one-a", "one-b", "two-a"]


def test_a_composite_is_one_call_for_the_servers_bucket(start_gateway, backend):
    gateway = start_gateway(config(backend, {"global": bucket(2)}, compositeTools=[ECHO_TWICE]))
    session_id = open_session(gateway)
    assert admitted(session_call(gateway, session_id, "echo_twice", {"text": "one"}))  # two steps, one token
    assert admitted(session_call(gateway, session_id, "plain_echo", {"text": "direct"}))
    rate_limited(session_call(gateway, session_id, "echo_twice", {"text": "two"}))
    assert backend.echoed == ["one-a", "one-b", "direct"]


def test_the_optimizers_call_tool_spends_the_named_tools_tokens(start_gateway, backend):
    gateway = start_gateway(config(backend, {"tools": [{"name": "plain_echo", "global": bucket(2)}]}, optimizer={}))
    session_id = open_session(gateway)

    def call_tool(tool: str, parameters: dict) -> requests.Response:
        return session_call(gateway, session_id, "call_tool", {"tool_name": tool, "parameters": parameters})

    assert admitted(call_tool("plain_echo", {"text": "1"}))
    assert admitted(call_tool("plain_echo", {"text": "2"}))
    rate_limited(call_tool("plain_echo", {"text": "3"}))
    assert all(admitted(call_tool("plain_whoami", {})) for _ in range(3))  # call_tool itself has no bucket
    assert backend.echoed == ["1", "2"]


# -- Redis going away --------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["allow", "refuse"])
def test_redis_gone_mid_load_follows_on_store_error(policy, start_gateway, backend, redis_server, monkeypatch,
                                                    caplog):
    limits = {"tools": [{"name": "plain_echo", "global": bucket(2)}], "onStoreError": policy}
    gateway = start_gateway(config(backend, limits, **in_redis(redis_server, monkeypatch)))
    assert admitted(modern_call(gateway, "plain_echo", {"text": "1"}))
    assert admitted(modern_call(gateway, "plain_echo", {"text": "2"}))
    rate_limited(modern_call(gateway, "plain_echo", {"text": "3"}))  # Redis says the bucket is empty
    redis_server.stop()
    with caplog.at_level(logging.WARNING, logger="vmcp_actors.limits"):
        while_down = [modern_call(gateway, "plain_echo", {"text": text}) for text in ("4", "5")]
    if policy == "allow":  # fail open: let through unchecked, though the bucket was empty
        assert all(admitted(response) for response in while_down)
        assert backend.echoed == ["1", "2", "4", "5"]
    else:
        for response in while_down:
            assert response.status_code == 503 and response.headers["Retry-After"] == "1"
            error = response.json()["error"]
            assert error["data"] == {"retryAfterSeconds": 1} and "Rate limits cannot be checked" in error["message"]
        assert backend.echoed == ["1", "2"]
    logged = [record.getMessage() for record in caplog.records
              if record.name.startswith("vmcp_actors.limits") and record.levelno == logging.WARNING]
    assert len(logged) == 1 and f"(onStoreError: {policy})" in logged[0]  # once, not per call
    redis_server.start()  # back, empty (no persistence): Redis decides again, from a full bucket
    assert admitted(modern_call(gateway, "plain_echo", {"text": "6"}))
    assert redis_client.Redis(port=redis_server.port).exists(f"{PREFIX}rl:t:plain_echo")
