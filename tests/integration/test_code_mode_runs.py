"""One script's run in the real sandbox (pydantic-monty worker processes), its tool calls
answered by the test (issue 39): sleeps the host serves, ``call_tool`` named as a value, an
inner call's own timeout named, a cancel that ends a sleep. The gateway's side of the same
runs: tests/integration/test_code_mode.py and tests/security/test_code_mode_sandbox.py."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from vmcp_actors.codemode import InnerCall, Sandbox, ScriptCancelled, ScriptRun
from vmcp_actors.concurrency import Deadline
from vmcp_actors.config import CodeModeConfig
from vmcp_actors.protocol import REQUEST_TIMEOUT, JsonRpcError

pytestmark = pytest.mark.timeout(60)

WAIT = 20.0


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    started = Sandbox(CodeModeConfig(enabled=True, timeout=10, tool_call_timeout=7, worker_isolation="none"))
    yield started
    started.close()


def answered(result: dict[str, Any]) -> Any:
    def call(name: str, arguments: dict[str, Any], deadline: Deadline) -> InnerCall:
        outcome: cf.Future[dict[str, Any]] = cf.Future()
        outcome.set_result(result)
        return InnerCall(outcome, lambda: None)
    return call


def started(sandbox: Sandbox, script: str, call: Any = None, seconds: float = 10.0) -> ScriptRun:
    assert sandbox.take_slot()
    run = ScriptRun(sandbox, script, None, call or answered({}), Deadline.after(seconds), "alice")
    run.start()
    return run


def text_of(run: ScriptRun) -> str:
    return run.outcome.result(timeout=WAIT)["content"][0]["text"]


def test_gathered_sleeps_overlap_and_a_plain_sleep_waits(sandbox):
    script = ("import asyncio\nasync def later(i):\n    await asyncio.sleep(1.0)\n    return i\n"
              "await asyncio.gather(later(1), later(2), later(3), later(4))")
    began = time.monotonic()
    assert text_of(started(sandbox, script)) == "[1,2,3,4]"
    took = time.monotonic() - began
    assert 1.0 <= took < 3.5  # four sleeps of 1 s side by side (one after another: 4 s or more)
    began = time.monotonic()
    assert text_of(started(sandbox, "import time\ntime.sleep(0.2)\n'woke'")) == "woke"
    assert time.monotonic() - began >= 0.2


def test_a_sleep_ends_at_the_scripts_deadline_and_at_a_cancel(sandbox):
    run = started(sandbox, "import asyncio\nawait asyncio.sleep(3600)\n'never'", seconds=0.5)
    assert "ran longer than codeMode.timeout" in text_of(run)
    run = started(sandbox, "import time\ntime.sleep(3600)\n'never'")
    running = threading.Timer(0.3, run.cancel)
    running.start()
    with pytest.raises(ScriptCancelled):
        run.outcome.result(timeout=WAIT)


def test_call_tool_may_be_named_and_called_later(sandbox):
    seen: list[tuple[str, dict[str, Any]]] = []

    def call(name: str, arguments: dict[str, Any], deadline: Deadline) -> InnerCall:
        seen.append((name, arguments))
        return answered({"structuredContent": {"echo": arguments["text"]}})(name, arguments, deadline)

    script = "tools = {'echo': call_tool}\nanswer = await tools['echo']('plain_echo', {'text': 'hi'})\nanswer['echo']"
    assert text_of(started(sandbox, script, call)) == "hi"
    assert seen == [("plain_echo", {"text": "hi"})]


def test_an_inner_calls_own_timeout_is_named_in_the_script(sandbox):
    def call(name: str, arguments: dict[str, Any], deadline: Deadline) -> InnerCall:
        outcome: cf.Future[dict[str, Any]] = cf.Future()
        outcome.set_exception(JsonRpcError(REQUEST_TIMEOUT, "backend 'plain' did not answer within 7s"))
        return InnerCall(outcome, lambda: None)

    script = "try:\n    await call_tool('plain_sleep', {})\nexcept RuntimeError as error:\n    said = str(error)\nsaid"
    assert text_of(started(sandbox, script, call)) == \
        "backend 'plain' did not answer within 7s (error -32001) (codeMode.toolCallTimeout: 7s)"


def test_a_call_that_runs_out_of_the_scripts_own_time_stops_the_script_at_its_timeout(sandbox):
    """The call's deadline is the script's (sooner than toolCallTimeout): its timeout is the
    script's, whichever of the call and the script's clock sees it first."""
    def call(name: str, arguments: dict[str, Any], deadline: Deadline) -> InnerCall:
        outcome: cf.Future[dict[str, Any]] = cf.Future()
        outcome.set_exception(JsonRpcError(REQUEST_TIMEOUT, "backend 'plain' did not answer within 0.99s"))
        return InnerCall(outcome, lambda: None)

    script = "try:\n    await call_tool('plain_hold', {})\nexcept RuntimeError as error:\n    said = str(error)\nsaid"
    assert text_of(started(sandbox, script, call, seconds=5.0)) == \
        "The script was stopped: it ran longer than codeMode.timeout (10s, waiting on tools included)."
