"""GET /metrics (issue 14, item 3): Prometheus text whose values follow known traffic,
with real backends; one worker and `vmcp-actors serve --workers 2` adding up."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.backends import restartable_backend, sdk_backend
from tests.gateway import backend_entry, wait_until

ADMIN_ENV, ADMIN_TOKEN = "METRICS_ADMIN_TOKEN", "metrics-adm1n-Qe7"


def scrape(base: str, token: str | None = None) -> dict[tuple[str, tuple], float]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = requests.get(base + "/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/plain")
    values = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def value(values: dict, name: str, **labels) -> float:
    wanted = {k: v for k, v in labels.items()}
    found = [v for (n, lab), v in values.items()
             if n == name and all(dict(lab).get(k) == x for k, x in wanted.items())]
    return sum(found)


def test_metrics_follow_known_traffic(start_gateway):
    good, down = restartable_backend("good"), restartable_backend("down")
    down.stop()
    try:
        gateway = start_gateway({"name": "m", "backends": [backend_entry("good", good), backend_entry("down", down)],
                                 "operational": {"failureHandling": {
                                     "healthCheckInterval": "200ms", "unhealthyThreshold": 1,
                                     "circuitBreaker": {"enabled": True, "failureThreshold": 1}}}})
        before = scrape(gateway.base)
        sid = gateway.initialize()
        for n in range(3):
            answer = gateway.rpc(sid, "tools/call", {"name": "good_echo", "arguments": {"text": str(n)}})
            assert "result" in answer
        assert gateway.post({"jsonrpc": "2.0", "id": 9, "method": "made/up"}, sid,
                            headers={"MCP-Protocol-Version": "2025-11-25"}).status_code == 200

        def checked() -> dict | None:
            # A health check or two (every 200 ms) since `before`: "down" tried again, unhealthy, its circuit open.
            values = scrape(gateway.base)
            tried = value(values, "vmcp_backend_requests_total", backend="down", outcome="unreachable") > \
                value(before, "vmcp_backend_requests_total", backend="down", outcome="unreachable")
            return values if tried and value(values, "vmcp_backend_health", backend="down", state="unhealthy") == 1 \
                and value(values, "vmcp_circuit_state", backend="down") == 2 else None

        after = wait_until(checked, timeout=10)
        assert after, scrape(gateway.base)

        def delta(name, **labels):
            return value(after, name, **labels) - value(before, name, **labels)

        assert delta("vmcp_requests_total", method="tools/call", outcome="ok") == 3
        assert delta("vmcp_request_duration_seconds_count", method="tools/call", outcome="ok") == 3
        assert delta("vmcp_requests_total", method="other") == 1  # an unknown method: a bounded label
        assert delta("vmcp_requests_total", method="initialize", outcome="ok") == 1
        assert delta("vmcp_backend_requests_total", backend="good", outcome="ok") >= 3
        assert delta("vmcp_backend_requests_total", backend="down", outcome="unreachable") >= 1
        assert delta("vmcp_discoveries_total", backend="good", outcome="ok") >= 1
        buckets = {dict(lab)["le"]: v for (n, lab), v in after.items()
                   if n == "vmcp_request_duration_seconds_bucket" and dict(lab)["method"] == "tools/call"
                   and dict(lab)["outcome"] == "ok"}
        assert buckets["+Inf"] == value(after, "vmcp_requests_total", method="tools/call", outcome="ok")
        assert value(after, "vmcp_sessions") == 1 and value(after, "vmcp_live_users") == 1
        assert value(after, "vmcp_threads") > 1
        assert value(after, "vmcp_circuit_state", backend="down") == 2  # open
        assert value(after, "vmcp_circuit_state", backend="good") == 0
        assert value(after, "vmcp_backend_health", backend="down", state="unhealthy") == 1
        text = requests.get(gateway.base + "/metrics", timeout=10).text
        assert "127.0.0.1:" not in text  # never a backend's URL
    finally:
        good.stop()


def test_metrics_may_take_their_own_token(start_gateway, monkeypatch):
    monkeypatch.setenv("METRICS_TOKEN", "scrape-t0ken")
    backend = restartable_backend("b")
    try:
        gateway = start_gateway({"name": "m", "backends": [backend_entry("b", backend)],
                                 "admin": {"metricsTokenEnv": "METRICS_TOKEN"}})
        refused = requests.get(gateway.base + "/metrics", timeout=10)
        assert refused.status_code == 401 and "WWW-Authenticate" in refused.headers
        assert requests.get(gateway.base + "/metrics", headers={"Authorization": "Bearer nope"},
                            timeout=10).status_code == 401
        assert "vmcp_threads" in str(scrape(gateway.base, "scrape-t0ken"))
    finally:
        backend.stop()


def test_two_workers_add_up(tmp_path, redis_server):
    from tests.integration.test_cli import VMCP, CliProcess, write_config
    from tests.integration.test_identity import INIT
    from tests.ports import free_port

    backend = sdk_backend("plain", ["echo"])
    try:
        port = free_port()
        path = write_config(tmp_path / "config.yaml", {
            "name": "m", "backends": [backend_entry("plain", backend)],
            "operational": {"signingKeyEnv": "M_KEY"},
            "sessionStorage": {"provider": "redis", "address": redis_server.address, "keyPrefix": "m:"}})
        temp = tmp_path / "tmp"  # where serve makes the workers' metrics directory
        temp.mkdir()
        with CliProcess([VMCP, "serve", "--config", str(path), "--port", str(port), "--workers", "2"], tmp_path,
                        "serve", env={"M_KEY": "metrics-signing-key-0123456789abcdef", "TMPDIR": str(temp)}) as served:
            base = f"http://127.0.0.1:{port}"
            served.wait_ready(base)
            headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
            opened = requests.post(base + "/mcp", json=INIT, headers=headers, timeout=30)
            session = {**headers, "Mcp-Session-Id": opened.headers["Mcp-Session-Id"],
                       "MCP-Protocol-Version": "2025-11-25", "Connection": "close"}
            calls = 12
            for n in range(calls):  # a new connection each: either worker takes it
                answer = requests.post(base + "/mcp", json={"jsonrpc": "2.0", "id": n, "method": "tools/call",
                                                            "params": {"name": "plain_echo",
                                                                       "arguments": {"text": str(n)}}},
                                       headers=session, timeout=30)
                assert answer.status_code == 200
            workers = [int(pid) for pid in re.findall(r"Booting worker with pid: (\d+)", served.stderr)]
            # Each worker writes its totals every 2 s: wait until the files hold every call.
            assert wait_until(lambda: written_calls(temp) == calls, timeout=20), written_calls(temp)
            for pid in workers:  # every worker that served a call is gone: only the files say
                os.kill(pid, signal.SIGKILL)
            assert wait_until(lambda: len(re.findall(r"Booting worker with pid", served.stderr)) >= 4, timeout=20)
            served.wait_ready(base)
            pids = set()
            for _ in range(6):  # whichever worker answers the scrape, the sum is the same
                with requests.Session() as http:
                    text = http.get(base + "/metrics", headers={"Connection": "close"}, timeout=10).text
                values = {}
                for family in text_string_to_metric_families(text):
                    for sample in family.samples:
                        values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
                assert value(values, "vmcp_requests_total", method="tools/call", outcome="ok") == calls
                pids |= set(re.findall(r'vmcp_threads\{pid="(\d+)"\}', text))
            assert pids and not pids & {str(pid) for pid in workers}  # answered by the new workers
    finally:
        backend.stop()


def written_calls(temp: Path) -> float:
    """The tools/call answered ok in the totals files the workers wrote (in the directory
    `vmcp-actors serve` made for them under its TMPDIR, ``temp``)."""
    total = 0.0
    for path in temp.glob("vmcp-metrics-*/*.json"):
        try:
            rows = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # (files are replaced whole; one may go between the listing and the read)
        total += sum(row[0] for family, labels, row in rows if family == "requests" and labels == ["tools/call", "ok"])
    return total


@pytest.fixture(autouse=True)
def admin_token(monkeypatch):
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)


def test_the_grafana_dashboard_uses_only_metrics_the_gateway_exports():
    import json
    from pathlib import Path

    from vmcp_actors.metrics import FAMILIES

    exported = {"vmcp_sessions", "vmcp_live_users", "vmcp_threads", "vmcp_discovery_cache_hits",
                "vmcp_discovery_cache_misses", "vmcp_workflow_runs_in_flight", "vmcp_circuit_state",
                "vmcp_backend_health"}
    for counter, histogram, _help, _labels in FAMILIES.values():
        exported |= {f"{counter}_total", f"{histogram}_bucket", f"{histogram}_count", f"{histogram}_sum"}
    dashboard = json.loads((Path(__file__).parents[2] / "deploy" / "grafana-dashboard.json").read_text())
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"\bvmcp_[a-z_]+", target["expr"])}
    assert used and used <= exported, used - exported
    documented = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    assert all(name.removesuffix("_bucket") in documented for name in used)
