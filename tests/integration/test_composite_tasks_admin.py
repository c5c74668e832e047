"""Composite tools run as tasks, seen by operators: this worker's runs in the admin state
(top level and per user) and page, by id prefix only, and in the metrics."""

from __future__ import annotations

import re

import pytest
import requests

from tests.backends import sdk_backend
from tests.gateway import backend_entry, wait_until
from tests.integration.test_composite_tasks_shared import CAREFUL_ECHO
from tests.integration.test_metrics import scrape, value
from tests.task_backends import modern_rpc

ADMIN_ENV, ADMIN_TOKEN = "TASKS_ADMIN_TOKEN", "tasks-adm1n-token-Hq4"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def gateway(start_gateway, monkeypatch):
    """A gateway with the admin token and careful_echo over an SDK backend."""
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    with sdk_backend("plain", ["echo", "sleep"]) as plain:
        yield start_gateway({"name": "tasks", "admin": {"tokenEnv": ADMIN_ENV},
                             "backends": [backend_entry("plain", plain)], "compositeTools": [CAREFUL_ECHO]})


def admin_state(gateway) -> dict:
    response = requests.get(gateway.base + "/admin/state", headers=ADMIN, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_task_waiting_for_input_shows_in_admin_state_page_and_metrics_until_it_ends(gateway):
    created = modern_rpc(gateway.url, "tools/call", {"name": "careful_echo", "arguments": {"text": "hi"}})
    assert created["result"]["resultType"] == "task", created
    handle = created["result"]["taskId"]

    waiting = wait_until(lambda: [row for row in admin_state(gateway)["tasks"]
                                  if row["status"] == "input_required"], timeout=10)
    assert len(waiting) == 1, admin_state(gateway)["tasks"]
    row = waiting[0]
    assert row["tool"] == "careful_echo" and "confirm" in row["step"] and row["ageSeconds"] >= 0
    assert re.fullmatch(r"[0-9a-f]{12}", row["task"])
    state = admin_state(gateway)
    (owner,) = [user for user in state["users"] if user["tasks"]]
    assert owner["tasks"] == state["tasks"] and owner["user"] == row["user"]
    assert row["user"] == "anonymous"

    page = requests.get(gateway.base + "/admin", headers=ADMIN, timeout=10)
    assert page.status_code == 200
    tasks_table = page.text.split('<table id="tasks">', 1)[1].split("</table>", 1)[0]
    for shown in (row["user"], row["task"], "careful_echo", "input_required", "confirm"):
        assert shown in tasks_table, shown
    state_text = requests.get(gateway.base + "/admin/state", headers=ADMIN, timeout=10).text
    for text in (state_text, page.text):  # a prefix only: neither the handle nor the whole id
        assert handle not in text and ADMIN_TOKEN not in text
        assert not re.search(re.escape(row["task"]) + "[0-9a-f]", text)

    metrics = scrape(gateway.base)
    assert value(metrics, "vmcp_composite_tasks", composite="careful_echo", status="input_required") == 1
    assert value(metrics, "vmcp_composite_tasks", composite="careful_echo", status="working") == 0

    answered = modern_rpc(gateway.url, "tasks/update", {
        "taskId": handle, "inputResponses": {"confirm": {"action": "accept", "content": {"loud": True}}}})
    assert "error" not in answered, answered

    def completed_task() -> dict | None:
        task = modern_rpc(gateway.url, "tasks/get", {"taskId": handle})["result"]
        return task if task["status"] == "completed" else None

    final = wait_until(completed_task, timeout=10)
    assert final and "plain:hi" in final["result"]["content"][0]["text"], final

    assert wait_until(lambda: admin_state(gateway)["tasks"] == [], timeout=10)
    assert all(user["tasks"] == [] for user in admin_state(gateway)["users"])
    metrics = scrape(gateway.base)
    assert value(metrics, "vmcp_composite_tasks", composite="careful_echo") == 0
    assert value(metrics, "vmcp_composite_tasks_ended", composite="careful_echo", status="completed") == 1
    assert value(metrics, "vmcp_composite_tasks_ended", composite="careful_echo", status="failed") == 0


def test_a_cancelled_task_leaves_the_admin_list_and_counts_as_cancelled(gateway):
    handle = modern_rpc(gateway.url, "tools/call",
                        {"name": "careful_echo", "arguments": {"text": "hi"}})["result"]["taskId"]
    assert wait_until(lambda: admin_state(gateway)["tasks"], timeout=10)
    assert "error" not in modern_rpc(gateway.url, "tasks/cancel", {"taskId": handle})

    assert wait_until(lambda: admin_state(gateway)["tasks"] == [], timeout=10)
    assert modern_rpc(gateway.url, "tasks/get", {"taskId": handle})["result"]["status"] == "cancelled"
    metrics = scrape(gateway.base)
    assert value(metrics, "vmcp_composite_tasks_ended", composite="careful_echo", status="cancelled") == 1
    assert value(metrics, "vmcp_composite_tasks_ended", composite="careful_echo") == 1
