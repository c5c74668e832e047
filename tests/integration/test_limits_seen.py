"""Rate limits and bulkheads as operators see them (issue 25, item 4): the admin state
and page show the configured limits, the buckets' tokens and this worker's refusals; the
metrics count refusals by bucket and queue depth by backend; explain says which bucket
refuses a call now; each refusal has an audit line. Plus the bulkheads themselves (item
3): a backend with maxConcurrentCalls 2 never has a third call at once, counted on the
backend's side, in one worker and across two sharing Redis; a call still waiting at its
deadline gets the deadline's error without reaching the backend."""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from tests.backends import sdk_backend
from tests.gateway import backend_entry
from tests.integration.test_metrics import scrape, value
from tests.task_backends import modern_post, modern_rpc

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ADMIN_ENV, ADMIN_TOKEN = "LIMITS_ADMIN_TOKEN", "limits-adm1n-token-Zq8"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
KEY_ENV, KEY = "LIMITS_SIGNING_KEY", "limits-signing-key-0123456789abcdef"


class Busy:
    """A backend tool that sleeps, counting the calls in flight at once (the backend's own count)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = self.peak = self.calls = 0

    def tool(self):
        def busy(seconds: float) -> str:
            """Sleep for a while, counting calls in flight"""
            with self._lock:
                self.now += 1
                self.calls += 1
                self.peak = max(self.peak, self.now)
            time.sleep(seconds)
            with self._lock:
                self.now -= 1
            return "done"
        return busy


def echo(url: str, text: str = "x") -> requests.Response:
    return modern_post(url, "tools/call", {"name": "plain_echo", "arguments": {"text": text}})


def test_limits_refusals_and_the_refusing_bucket_are_visible(start_gateway, monkeypatch, tmp_path):
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    audit = tmp_path / "audit.log"
    with sdk_backend("plain", ["echo"]) as plain:
        gateway = start_gateway({
            "name": "limits", "admin": {"tokenEnv": ADMIN_ENV}, "audit": {"enabled": True, "logFile": str(audit)},
            "backends": [{**backend_entry("plain", plain), "maxConcurrentCalls": 3}],
            "rateLimiting": {"global": {"maxTokens": 100, "refillPeriod": "1h"},
                             "tools": [{"name": "plain_echo", "global": {"maxTokens": 2, "refillPeriod": "1h"}}]}})
        assert [echo(gateway.url).status_code for _ in range(3)] == [200, 200, 429]

        state = requests.get(gateway.base + "/admin/state", headers=ADMIN, timeout=10).json()
        limits = state["rateLimits"]
        assert limits["global"] == {"maxTokens": 100, "refillPeriodSeconds": 3600.0} and limits["store"] == "memory"
        (tool,) = limits["tools"]
        assert tool["name"] == "plain_echo" and tool["globalTokens"] < 1
        assert limits["refusals"] == [{"kind": "tool", "tool": "plain_echo", "count": 1}]
        assert state["bulkheads"] == {"plain": {"limit": 3, "inFlight": 0, "waiting": 0, "timedOut": 0}}

        page = requests.get(gateway.base + "/admin", headers=ADMIN, timeout=10).text
        refusals = page.split('<table id="refusals">', 1)[1].split("</table>", 1)[0]
        assert "plain_echo" in refusals and "<td>tool</td>" in refusals
        assert "<td>plain</td><td>3</td>" in page.split('<table id="bulkheads">', 1)[1].split("</table>", 1)[0]

        metrics = scrape(gateway.base)
        assert value(metrics, "vmcp_rate_limit_refusals", kind="tool", tool="plain_echo") == 1
        assert value(metrics, "vmcp_rate_limit_refusals", kind="global") == 0
        assert value(metrics, "vmcp_backend_calls_queued", backend="plain") == 0

        explained = requests.get(gateway.base + "/admin/explain", params={"tool": "plain_echo", "user": "anonymous"},
                                 headers=ADMIN, timeout=10).json()
        (finding,) = [found for found in explained["findings"] if found["layer"] == "rate limits"]
        assert finding["details"]["refusedBy"] == "tool" and "refused (429) by the tool bucket" in finding["reason"]

    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    calls = [line for line in lines if line["method"] == "tools/call"]
    assert [line["outcome"] for line in calls] == ["success", "success", "rate_limited"]
    assert calls[-1]["name"] == "plain_echo"


def test_a_limited_tool_no_client_can_call_is_reported_with_the_advertised_names(start_gateway, monkeypatch):
    """Tools are discovered per user, so a name is checked once a catalog is known."""
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    with sdk_backend("plain", ["echo", "sleep"]) as plain:
        gateway = start_gateway({
            "name": "limits", "admin": {"tokenEnv": ADMIN_ENV}, "backends": [backend_entry("plain", plain)],
            "rateLimiting": {"tools": [{"name": "plain_echo", "global": {"maxTokens": 5, "refillPeriod": "1m"}},
                                       {"name": "plain_ehco", "global": {"maxTokens": 5, "refillPeriod": "1m"}}]}})
        assert "result" in modern_rpc(gateway.url, "tools/list", {})
        state = requests.get(gateway.base + "/admin/state", headers=ADMIN, timeout=10).json()
        page = requests.get(gateway.base + "/admin", headers=ADMIN, timeout=10).text
    (problem,) = state["rateLimits"]["problems"]
    assert problem.startswith("rateLimiting.tools[1].name: no advertised tool is named 'plain_ehco'")
    assert problem.endswith("the advertised tools are: plain_echo, plain_sleep")
    assert problem in page.replace("&#39;", "'")


def _at_once(url: str, count: int, seconds: float) -> list[dict]:
    answers: list[dict] = []

    def call() -> None:
        answers.append(modern_rpc(url, "tools/call", {"name": "plain_busy", "arguments": {"seconds": seconds}}))

    threads = [threading.Thread(target=call) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return answers


def test_a_bulkhead_of_two_never_lets_a_third_call_through(start_gateway):
    busy = Busy()
    with sdk_backend("plain", ["echo"], extra_tools=[busy.tool()]) as plain:
        gateway = start_gateway({"name": "bulkhead",
                                 "backends": [{**backend_entry("plain", plain), "maxConcurrentCalls": 2}]})
        answers = _at_once(gateway.url, 6, 0.4)
    assert all("result" in answer for answer in answers), answers
    assert busy.calls == 6 and busy.peak == 2


def test_a_bulkhead_shared_by_two_workers_holds_across_them(start_gateway, redis_server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    busy = Busy()
    with sdk_backend("plain", ["echo"], extra_tools=[busy.tool()]) as plain:
        config = {"name": "bulkhead", "backends": [{**backend_entry("plain", plain), "maxConcurrentCalls": 2}],
                  "operational": {"signingKeyEnv": KEY_ENV},
                  "sessionStorage": {"provider": "redis", "address": redis_server.address, "keyPrefix": "bh:"}}
        first, second = (start_gateway(config) for _ in range(2))
        answers: list[list[dict]] = []
        threads = [threading.Thread(target=lambda url=url: answers.append(_at_once(url, 3, 0.4)))
                   for url in (first.url, second.url)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert all("result" in answer for batch in answers for answer in batch), answers
    assert busy.calls == 6 and busy.peak == 2  # each worker alone would have allowed 2


def test_a_call_still_waiting_at_its_deadline_gets_the_deadline_error_and_never_reaches_the_backend(start_gateway):
    busy = Busy()
    with sdk_backend("plain", ["echo"], extra_tools=[busy.tool()]) as plain:
        gateway = start_gateway({"name": "bulkhead",
                                 "backends": [{**backend_entry("plain", plain), "maxConcurrentCalls": 1}],
                                 "operational": {"timeouts": {"default": "2s"}}})
        # One at a time, 0.9 s each, all with the same 2 s deadline: two answer, and the
        # last ones wait until the deadline passes (one may just get sent, and time out).
        answers = _at_once(gateway.url, 4, 0.9)
        queued = scrape(gateway.base)
    assert sum("result" in answer for answer in answers) >= 1 and busy.peak == 1, answers
    waited_out = [answer["error"] for answer in answers
                  if "error" in answer and "maxConcurrentCalls" in answer["error"]["message"]]
    assert waited_out, answers
    assert busy.calls == len(answers) - len(waited_out)  # those never reached the backend
    assert value(queued, "vmcp_backend_calls_queue_timeouts", backend="plain") == len(waited_out)
