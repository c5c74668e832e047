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
from typing import Any

import pytest
import requests

from tests.asgi_bodies import read_body, replaying
from tests.backends import SdkBackend, build_sdk_server, sdk_backend
from tests.gateway import backend_entry, wait_until
from tests.integration.test_metrics import scrape, value
from tests.task_backends import modern_post, modern_rpc
from vmcp_actors.demo._serve import serve_asgi_in_thread

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ADMIN_ENV, ADMIN_TOKEN = "LIMITS_ADMIN_TOKEN", "limits-adm1n-token-Zq8"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
KEY_ENV, KEY = "LIMITS_SIGNING_KEY", "limits-signing-key-0123456789abcdef"


class Busy:
    """A backend tool held until the test opens ``gate``, counting the calls in flight at
    once (the backend's own count): calls overlap for as long as the test wants, not for a
    guessed sleep."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = self.peak = self.calls = 0
        self.gate = threading.Event()

    def tool(self):
        def busy() -> str:
            """Wait until the test lets calls through, counting calls in flight"""
            with self._lock:
                self.now += 1
                self.calls += 1
                self.peak = max(self.peak, self.now)
            try:
                self.gate.wait(60)
            finally:
                with self._lock:
                    self.now -= 1
            return "done"
        return busy


class HeldTenant:
    """ASGI middleware before a backend: every request forwarded for the tenant ``held``
    (the passthrough header X-Tenant) waits until ``released`` is set; ``arrived`` is set
    by the first. ``methods`` records (tenant, JSON-RPC method) of every request reaching
    the backend, held ones once let through."""

    def __init__(self, app: Any, held: str) -> None:
        self.app, self.held = app, held
        self.arrived, self.released = threading.Event(), threading.Event()
        self.methods: list[tuple[str, str | None]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        import anyio

        tenant = dict(scope["headers"]).get(b"x-tenant", b"").decode()
        body = await read_body(receive)
        if tenant == self.held:
            self.arrived.set()
            await anyio.to_thread.run_sync(self.released.wait, 60)
        try:
            method = json.loads(body).get("method") if body else None
        except (ValueError, AttributeError):
            method = None
        self.methods.append((tenant, method))
        await self.app(scope, replaying(body, receive), send)


class HeldBackend(SdkBackend):
    """The ``plain`` SDK backend (``plain_echo``, ``plain_busy``) behind :class:`HeldTenant`."""

    def __init__(self, busy: Busy, held: str) -> None:
        super().__init__("plain", build_sdk_server("plain", ["echo"], extra_tools=[busy.tool()]))
        self.held = held
        self.holding: HeldTenant | None = None

    def start(self) -> HeldBackend:
        self.holding = HeldTenant(self.server.streamable_http_app(), self.held)
        self._served = serve_asgi_in_thread(self.holding, name=self.name)
        return self


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


def _at_once(url: str, count: int, headers: dict[str, str] | None = None) -> tuple[list[dict], list[threading.Thread]]:
    """``count`` calls of plain_busy started at once, each on a thread of its own; the list
    their answers go into, and the threads."""
    answers: list[dict] = []

    def call() -> None:
        answers.append(modern_rpc(url, "tools/call", {"name": "plain_busy", "arguments": {}}, headers=headers))

    threads = [threading.Thread(target=call) for _ in range(count)]
    for thread in threads:
        thread.start()
    return answers, threads


def _joined(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a call did not answer"


def _queued(*gateways: Any) -> float:
    return sum(value(scrape(gateway.base), "vmcp_backend_calls_queued", backend="plain") for gateway in gateways)


def test_a_bulkhead_of_two_never_lets_a_third_call_through(start_gateway):
    busy = Busy()
    with sdk_backend("plain", ["echo"], extra_tools=[busy.tool()]) as plain:
        gateway = start_gateway({"name": "bulkhead",
                                 "backends": [{**backend_entry("plain", plain), "maxConcurrentCalls": 2}]})
        answers, threads = _at_once(gateway.url, 6)
        try:
            # Two calls held at the backend, the other four waiting at the bulkhead: none gets past it.
            assert wait_until(lambda: busy.now == 2 and _queued(gateway) == 4, timeout=30), (busy.now, _queued(gateway))
            assert busy.calls == 2
        finally:
            busy.gate.set()
            _joined(threads)
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
        answers, threads = [], []
        for url in (first.url, second.url):
            batch, started = _at_once(url, 3)
            answers.append(batch)
            threads += started
        try:
            # Each worker alone would let 2 through (4 in all): two are held, four wait.
            assert wait_until(lambda: busy.now == 2 and _queued(first, second) == 4, timeout=30), \
                (busy.now, _queued(first, second))
            assert busy.calls == 2
        finally:
            busy.gate.set()
            _joined(threads)
    assert all("result" in answer for batch in answers for answer in batch), answers
    assert busy.calls == 6 and busy.peak == 2


MARGIN = 1.0


def test_a_call_still_waiting_at_its_deadline_gets_the_deadline_error_and_never_reaches_the_backend(start_gateway):
    """Every request's deadline is the same length (operational.timeouts), counted from its
    arrival, and the first call gives its place back by its own deadline at the latest: so
    the queued call arrives FIRST (its deadline is the earlier one) and is held before the
    bulkhead by its user's discovery (tenant ``late``: its own user, catalog and backend
    session), while the first call (tenant ``early``, discovered already) takes the only
    place and keeps it, held at the backend, until the queued call has answered."""
    busy = Busy()
    with HeldBackend(busy, held="late").start() as plain:
        assert plain.holding is not None
        gateway = start_gateway({"name": "bulkhead",
                                 "backends": [{**backend_entry("plain", plain), "maxConcurrentCalls": 1}],
                                 "outgoingAuth": {"passthroughHeaders": ["X-Tenant"]},
                                 # the queued call waits this long: its deadline, 1 s before the
                                 # first call's (MARGIN below); what comes before its wait at the
                                 # bulkhead takes milliseconds
                                 "operational": {"timeouts": {"default": "5s"}}})
        assert "result" in modern_rpc(gateway.url, "tools/list", {}, headers={"X-Tenant": "early"})

        queued, queued_threads = _at_once(gateway.url, 1, headers={"X-Tenant": "late"})
        assert plain.holding.arrived.wait(30)  # the queued call's deadline runs; its discovery is held
        # A margin, not an event: the first call's deadline comes this much after the queued
        # call's, so the first call, released once the queued one has answered, answers too.
        time.sleep(MARGIN)
        first, first_threads = _at_once(gateway.url, 1, headers={"X-Tenant": "early"})
        try:
            assert wait_until(lambda: busy.now == 1, timeout=30)  # the first call holds the only place
            plain.holding.released.set()  # the queued call's discovery goes on; then it waits for the place
            assert wait_until(lambda: _queued(gateway) == 1, timeout=10)  # it waits at the bulkhead
            for thread in queued_threads:
                thread.join(30)
            assert queued, "the queued call did not answer"
            assert busy.now == 1 and busy.calls == 1  # the first call still holds the place
        finally:
            plain.holding.released.set()
            busy.gate.set()
            _joined(queued_threads + first_threads)
        metrics = scrape(gateway.base)
    (waited_out,) = queued
    assert "maxConcurrentCalls" in waited_out["error"]["message"], waited_out
    assert [answer["result"]["content"][0]["text"] for answer in first] == ["done"], first
    assert busy.calls == 1 and ("late", "tools/call") not in plain.holding.methods  # it never reached the backend
    assert value(metrics, "vmcp_backend_calls_queue_timeouts", backend="plain") == 1
