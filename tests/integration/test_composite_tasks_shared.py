"""Composite tools as tasks with Redis and two workers (issue 24, item 3): a task created on
one worker is polled, answered and cancelled on the other, and a task whose worker is killed
(SIGKILL, a real ``vmcp-actors serve`` process) reads as ``failed`` on the other, not
"unknown task". A real redis-server, an official-SDK backend, 2026-07-28 requests."""

from __future__ import annotations

import os
import signal

import pytest
import redis as redis_client
import yaml

from tests.backends import sdk_backend
from tests.gateway import backend_entry, wait_until
from tests.integration.test_cli import VMCP, CliProcess
from tests.ports import free_port
from tests.task_backends import modern_rpc, poll_task
from vmcp_actors.decorators._composite_tasks import RUNNER_GONE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

KEY_ENV, KEY = "TASKS_SIGNING_KEY", "tasks-signing-key-0123456789abcdef"
SCHEMA = {"type": "object", "properties": {"loud": {"type": "boolean"}}, "required": ["loud"]}
CAREFUL_ECHO = {
    "name": "careful_echo", "description": "Ask first, then echo",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "steps": [
        {"id": "confirm", "type": "elicitation", "message": "Echo {{ params.text }}?", "schema": SCHEMA,
         "timeout": "60s"},
        {"id": "echo", "tool": "plain_echo", "dependsOn": ["confirm"],
         "arguments": {"text": "{{ params.text }} loud={{ steps.confirm.output.content.loud }}"}},
    ],
}
SLOW_ECHO = {
    "name": "slow_echo", "description": "Sleep, then echo",
    "parameters": {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]},
    "steps": [
        {"id": "nap", "tool": "plain_sleep", "arguments": {"seconds": "{{ params.seconds }}"}, "timeout": "120s"},
        {"id": "echo", "tool": "plain_echo", "dependsOn": ["nap"], "arguments": {"text": "woke"}},
    ],
}


@pytest.fixture
def backend(monkeypatch):
    """The backend the composites call; the workers' shared signing key is set meanwhile."""
    monkeypatch.setenv(KEY_ENV, KEY)
    with sdk_backend("plain", ["echo", "sleep"]) as served:
        yield served


def config(backend, redis_server) -> dict:
    return {"name": "tasks", "backends": [backend_entry("plain", backend)],
            "compositeTools": [CAREFUL_ECHO, SLOW_ECHO],
            "operational": {"signingKeyEnv": KEY_ENV, "tasks": {"pollInterval": "200ms"}},
            "sessionStorage": {"provider": "redis", "address": redis_server.address, "keyPrefix": "ct:"}}


def task_of(url: str, handle: str) -> dict:
    answer = modern_rpc(url, "tasks/get", {"taskId": handle})
    assert "result" in answer, answer
    return answer["result"]


def wait_for(url: str, handle: str, *statuses: str, within: float = 30.0) -> dict:
    task = poll_task(url, handle, statuses, timeout=within)
    assert task["status"] in statuses, task
    return task


def start_task(url: str, tool: str, arguments: dict) -> str:
    answer = modern_rpc(url, "tools/call", {"name": tool, "arguments": arguments})
    assert answer["result"]["resultType"] == "task", answer
    return answer["result"]["taskId"]


def test_a_task_made_on_one_worker_is_polled_answered_and_finished_on_the_other(start_gateway, backend, redis_server):
    first, second = (start_gateway(config(backend, redis_server)) for _ in range(2))
    handle = start_task(first.url, "careful_echo", {"text": "hi"})
    asked = wait_for(second.url, handle, "input_required")
    assert asked["taskId"] == handle and "'confirm'" in asked["statusMessage"]
    request = asked["inputRequests"]["confirm"]
    assert request["method"] == "elicitation/create" and request["params"]["message"] == "Echo hi?"
    assert request["params"]["requestedSchema"] == SCHEMA
    answered = modern_rpc(second.url, "tasks/update", {"taskId": handle, "inputResponses": {
        "confirm": {"action": "accept", "content": {"loud": True}}}})
    assert answered["result"]["resultType"] == "complete"
    done = wait_for(second.url, handle, "completed")
    assert done["result"]["structuredContent"] == {"result": "plain:hi loud=true"}
    assert task_of(first.url, handle) == done  # one record, whichever worker reads it
    # the record is encrypted at rest: neither the question nor the answer is readable in Redis
    raw = redis_client.Redis(port=redis_server.port)
    stored = b"".join(raw.get(name) or b"" for name in raw.keys("ct:t:*"))
    assert stored and b"Echo hi" not in stored and b"loud=true" not in stored


def test_a_cancel_on_the_other_worker_stops_the_run(start_gateway, backend, redis_server):
    first, second = (start_gateway(config(backend, redis_server)) for _ in range(2))
    handle = start_task(first.url, "slow_echo", {"seconds": 30})
    assert wait_for(second.url, handle, "working")["statusMessage"].startswith("running step 'nap'")
    runner = first.app.extensions["vmcp_actors"].tasks
    assert runner.live_count() == 1
    assert modern_rpc(second.url, "tasks/cancel", {"taskId": handle})["result"]["resultType"] == "complete"
    cancelled = task_of(first.url, handle)
    assert cancelled["status"] == "cancelled" and "result" not in cancelled
    assert wait_until(lambda: runner.live_count() == 0, timeout=10)  # the signal reaches the runner through Redis
    assert task_of(second.url, handle)["status"] == "cancelled"  # the run's own end did not overwrite it


def test_a_task_whose_worker_was_killed_reads_as_failed_on_the_other(tmp_path, start_gateway, backend, redis_server):
    settings = config(backend, redis_server)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(settings))
    port = free_port()
    with CliProcess([VMCP, "serve", "--config", str(path), "--host", "127.0.0.1", "--port", str(port)], tmp_path,
                    "runner", env={KEY_ENV: KEY}) as runner:
        survivor = start_gateway(settings)  # while the runner boots
        runner.wait_ready(f"http://127.0.0.1:{port}")
        url = f"http://127.0.0.1:{port}/mcp"
        handle = start_task(url, "slow_echo", {"seconds": 60})
        assert wait_for(survivor.url, handle, "working")["taskId"] == handle
        os.killpg(runner.proc.pid, signal.SIGKILL)  # the gunicorn master and its worker, no goodbye
        runner.proc.wait(timeout=10)
        # the behaviour under test: the runner's heartbeat key lapses (it had 5 s left at most,
        # vmcp_actors.users._task_signals.HEARTBEAT_TTL), then the task reads as failed
        failed = wait_for(survivor.url, handle, "failed", within=30)
    assert failed["error"]["message"] == RUNNER_GONE and failed["statusMessage"] == RUNNER_GONE
    assert task_of(survivor.url, handle) == failed  # written once, read alike after
