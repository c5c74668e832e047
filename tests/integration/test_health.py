"""Backend health and circuit breakers (issue 14, items 1-2): real raw and SDK backends
that go down, come back, hang, answer slowly or answer 401; the gateway on a real HTTP
server; the admin state and the client's answers show what happened."""

from __future__ import annotations

import time

import pytest

from tests.backends import (
    delayed_backend,
    hanging_backend,
    header_backend,
    restartable_backend,
    sdk_backend,
)
from tests.gateway import admin_get, backend_entry, wait_until

ADMIN_ENV, ADMIN_TOKEN = "HEALTH_ADMIN_TOKEN", "health-adm1n-Zk2"


@pytest.fixture(autouse=True)
def admin_token(monkeypatch):
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)


def config(*entries, call_timeout: str = "5s", **failure_handling) -> dict:
    return {"name": "health", "backends": list(entries), "admin": {"tokenEnv": ADMIN_ENV},
            "operational": {"timeouts": {"default": call_timeout}, "failureHandling": failure_handling}}


def health(gateway) -> dict:
    return admin_get(gateway, token=ADMIN_TOKEN).json()["backendHealth"]


def state_of(gateway, backend: str) -> str:
    return health(gateway).get(backend, {}).get("state", "unknown")


def tool_names(gateway, session_id: str) -> list[str]:
    answer = gateway.rpc(session_id, "tools/list")
    assert "result" in answer, answer
    return sorted(tool["name"] for tool in answer["result"]["tools"])


def call(gateway, session_id: str, tool: str, text: str = "x") -> dict:
    return gateway.rpc(session_id, "tools/call", {"name": tool, "arguments": {"text": text}})


def failed(answer: dict) -> bool:
    """A call's answer is a failure: a JSON-RPC error or a tool result with isError."""
    return "error" in answer or answer["result"].get("isError") is True


# -- health states ------------------------------------------------------------------------------


def test_each_backend_gets_its_state_from_checks_made_without_a_user(start_gateway):
    good = sdk_backend("good", ["echo"])
    # Checks time out after 1 s; one that took more than half of it is slow. Margins that hold
    # under load: "slow" answers in 0.7 s (+ the load), "good" in milliseconds (+ the load).
    slow = delayed_backend(0.7, name="slow")
    hanging = hanging_backend(name="hanging")
    locked = header_backend("locked", required_header="Authorization")
    try:
        gateway = start_gateway(config(backend_entry("good", good), backend_entry("slow", slow),
                                       backend_entry("hanging", hanging), backend_entry("locked", locked),
                                       healthCheckInterval="1s", healthCheckTimeout="1s",
                                       unhealthyThreshold=2))
        assert wait_until(lambda: [state_of(gateway, name) for name in ("good", "slow", "hanging", "locked")]
                          == ["healthy", "degraded", "unhealthy", "unauthenticated"], timeout=20), health(gateway)
        rows = health(gateway)
        assert rows["hanging"]["failedChecksInARow"] >= 2 and "did not answer" in rows["hanging"]["lastError"]
        assert rows["slow"]["lastCheckMs"] >= 700
        assert "401" in rows["locked"]["lastError"]
        # The checks are pings on one health session per backend, with no user's credentials.
        assert wait_until(lambda: len(slow.requests("ping")) >= 2, timeout=10) and slow.initialize_count == 1
        assert locked.rejections and all(r.reason == "missing header Authorization" for r in locked.rejections)
        assert "http://" not in str(rows)  # never a backend's URL
    finally:
        for backend in (good, slow, hanging, locked):
            backend.stop()


def test_a_static_header_goes_with_the_checks(start_gateway, monkeypatch):
    monkeypatch.setenv("HEALTH_KEY", "k3y-for-health")
    locked = header_backend("locked", required_header="X-Api-Key", expected_value="k3y-for-health")
    try:
        entry = backend_entry("locked", locked)
        gateway = start_gateway({**config(entry, healthCheckInterval="300ms"), "outgoingAuth": {"backends": {
            "locked": {"type": "header_injection",
                       "headerInjection": {"headerName": "X-Api-Key", "headerValueEnv": "HEALTH_KEY"}}}}})
        assert wait_until(lambda: state_of(gateway, "locked") == "healthy", timeout=10), health(gateway)
    finally:
        locked.stop()


def test_discovery_skips_an_unhealthy_backend_at_once_and_a_recovered_one_joins(start_gateway, caplog, monkeypatch):
    # A missing backend that passes its checks again is retried on the next request (not 1 s on).
    monkeypatch.setattr("vmcp_actors.users._actor.RETRY_WHEN_HEALTHY", 0.1)
    monkeypatch.setattr("vmcp_actors.core._aggregated.REMIND_RETRY_EVERY", 0.05)
    good = restartable_backend("good")
    flaky = restartable_backend("flaky")
    try:
        gateway = start_gateway(config(backend_entry("good", good), backend_entry("flaky", flaky),
                                       call_timeout="30s", healthCheckInterval="200ms", healthCheckTimeout="200ms",
                                       unhealthyThreshold=1))
        assert wait_until(lambda: state_of(gateway, "flaky") == "healthy", timeout=10)
        flaky.hang = True  # it stops answering (the 30 s call timeout would be the wait)
        assert wait_until(lambda: state_of(gateway, "flaky") == "unhealthy", timeout=10)
        sid = gateway.initialize()
        started = time.monotonic()
        assert tool_names(gateway, sid) == ["good_echo", "good_sleep"]
        # Skipped for being unhealthy (so logged), not waited for: the 30 s timeout would be the wait.
        assert time.monotonic() - started < 10
        assert any("skipping backend 'flaky'" in r.getMessage() and "is unhealthy" in r.getMessage()
                   for r in caplog.records), caplog.text

        flaky.hang = False  # back
        assert wait_until(lambda: state_of(gateway, "flaky") == "healthy", timeout=10)
        assert wait_until(lambda: "flaky_echo" in tool_names(gateway, sid), timeout=10, interval=0.3)
        assert call(gateway, sid, "flaky_echo")["result"]["content"][0]["text"] == "flaky:x"
    finally:
        flaky.hang = False
        good.stop()
        flaky.stop()


# -- partial failure mode -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fail", "best_effort", "bestEffort"])
def test_partial_failure_mode(start_gateway, mode):
    good = restartable_backend("good")
    down = restartable_backend("down")
    down.stop()  # refuses connections from the start
    try:
        gateway = start_gateway(config(backend_entry("good", good), backend_entry("down", down),
                                       healthCheckInterval="1h", partialFailureMode=mode))
        sid = gateway.initialize()
        answer = gateway.rpc(sid, "tools/list")
        if mode == "fail":
            error = answer["error"]
            assert error["data"] == {"unavailable": ["down"]}
            assert "partialFailureMode: fail" in error["message"] and "'down'" in error["message"]
            assert "127.0.0.1" not in error["message"]
        else:
            assert sorted(t["name"] for t in answer["result"]["tools"]) == ["good_echo", "good_sleep"]
    finally:
        good.stop()


# -- circuit breaker ----------------------------------------------------------------------------


def test_the_circuit_opens_fails_fast_then_one_probe_closes_it(start_gateway):
    backend = restartable_backend("cb")
    try:
        gateway = start_gateway(config(backend_entry("cb", backend), call_timeout="500ms", healthCheckInterval="1h",
                                       circuitBreaker={"enabled": True, "failureThreshold": 2, "timeout": "1s"}))
        sid = gateway.initialize()
        assert call(gateway, sid, "cb_echo")["result"]["content"][0]["text"] == "cb:x"
        backend.hang = True
        for _ in range(2):  # two timeouts in a row
            assert failed(call(gateway, sid, "cb_echo", "y"))
        assert health(gateway)["cb"]["circuit"]["state"] == "open"
        before = len(backend.requests("tools/call"))
        refused = call(gateway, sid, "cb_echo")  # failed fast: nothing sent (counted below)
        assert failed(refused)
        text = refused["result"]["content"][0]["text"] if "result" in refused else refused["error"]["message"]
        assert "'cb'" in text and "circuit is open" in text and "127.0.0.1" not in text
        assert len(backend.requests("tools/call")) == before

        backend.hang = False
        time.sleep(1.1)  # the circuit's 1 s open period (real time): the next call is the probe
        assert call(gateway, sid, "cb_echo")["result"]["content"][0]["text"] == "cb:x"
        circuit = health(gateway)["cb"]["circuit"]
        assert circuit["state"] == "closed" and circuit["opened"] == 1
    finally:
        backend.hang = False
        backend.stop()


def test_the_config_is_checked_with_field_paths():
    from vmcp_actors.config import config_from_mapping
    from vmcp_actors.exceptions import ConfigError

    base = {"name": "x", "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}]}
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({**base, "operational": {"failureHandling": {
            "unhealthyThreshold": 0, "partialFailureMode": "sometimes", "circuitBreaker": {"enabled": "y", "x": 1}}}})
    assert list(caught.value.errors) == [
        "operational.failureHandling.circuitBreaker.enabled: must be true or false",
        "operational.failureHandling.circuitBreaker.x: unknown field",
        "operational.failureHandling.partialFailureMode: must be one of fail, best_effort, bestEffort",
        "operational.failureHandling.unhealthyThreshold: must be between 1 and 1000",
    ]
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({**base, "operational": {"failureHandling": {
            "healthCheckInterval": "5s", "healthCheckTimeout": "10s"}}})
    assert "healthCheckTimeout: must not be longer than healthCheckInterval" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({**base, "operational": {"failureHandling": {"circuitBreaker": {"timeout": "500ms"}}}})
    assert "circuitBreaker.timeout: must be at least 1s" in str(caught.value)
    loaded = config_from_mapping({**base, "operational": {"failureHandling": {
        "healthCheckInterval": "5s", "statusReportingInterval": "30s"}}}).operational.failure_handling
    assert (loaded.health_check_timeout, loaded.unhealthy_threshold, loaded.partial_failure_mode) == (5.0, 3,
                                                                                                     "best_effort")
    assert config_from_mapping(base).operational.failure_handling is None
