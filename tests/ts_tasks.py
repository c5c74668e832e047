"""The TypeScript SDK client's experimental task API (``client.experimental.tasks``) against
one MCP URL, by ``tests/node/ts_tasks.mjs``: a direct connection to server-everything and
one through the gateway must give the same outcome (2025 tasks with real software).

A scenario is ``{"steps": [...], "elicit": {...}?}``; each step is one of

* ``{"op": "tools/list"}``: the tools' names and ``execution.taskSupport`` (a
  ``callToolStream`` lists the tools itself first if no step has: the client only
  task-augments a call to a tool it has seen listed as a task tool);
* ``{"op": "callToolStream", "name", "arguments", "task"?, "until"?, "timeout"?, "raw"?}``:
  ``client.experimental.tasks.callToolStream``; ``until`` (a message type, e.g.
  ``"taskCreated"``) stops reading the stream there, leaving the task running; ``task``
  passes task creation parameters explicitly;
* ``{"op": "tasks/get" | "tasks/result" | "tasks/cancel", "task": "T1"}`` and
  ``{"op": "tasks/list"}``: the client's helpers for those methods;
* ``{"op": "waitTaskStatus", "task": "T1", "status": "completed", "timeout"?}``: until a
  ``notifications/tasks/status`` with that status has come for the task;
* ``{"op": "sleep", "seconds"}``.

The outcome: ``protocolVersion``, ``tasksCapability`` (the server's ``tasks`` capability),
``steps`` (each ``{"op", ...}`` with ``result`` or ``error`` ``{code, message}``; a
``callToolStream`` step has ``taskSupport``, ``stream`` and the ``elicitations`` that came
during it), ``elicitations`` (all, in order: ``method``, ``message``, ``requestedSchema``,
``relatedTask``: the task named by ``params._meta["io.modelcontextprotocol/related-task"]``
or None, ``after``: the status of the last streamed message before it, ``answered``),
``taskNotifications`` (every ``notifications/tasks/status``, in order) and
``otherNotifications`` (the methods of any other notifications).

Task ids are labels ``T1``, ``T2``, ... in the order the client first saw each id (in every
string of the outcome, error messages too), so a gateway that rewrites ids consistently gives
the same outcome; times are ``"<time>"``. The streamed ``taskStatus`` messages come one per
poll of ``tasks/get``, so ``stream`` collapses consecutive ones of the same status into one
(the first's ``statusMessage``); a taskCreated's ``statusMessage`` is left out (the server
sets it or not by a race). Which stage the first poll finds depends on when it came too:
:func:`comparable` sets that message aside when two outcomes are compared (:func:`outcome_diff`
shows where two differ).
"""

from __future__ import annotations

import difflib
import json
import subprocess
from pathlib import Path
from typing import Any

from tests import node_mcp

TS_TASKS = Path(__file__).resolve().parent / "node" / "ts_tasks.mjs"
RESEARCH_TOOL = "simulate-research-query"  # server-everything's task tool (taskSupport "required")
RELATED_TASK = "io.modelcontextprotocol/related-task"
# The research task's stages before it asks, a second each: the first of them is what the
# client's first tasks/get finds, unless that poll comes more than a second after the task was
# created (a busy machine), when it finds a later one.
RESEARCH_STAGES = ("Gathering sources...", "Analyzing content...", "Synthesizing findings...")
POLLED_STAGE = "<a research stage>"


def research_scenario(tool: str = RESEARCH_TOOL, topic: str = "python") -> dict[str, Any]:
    """server-everything's research task, ambiguous so that it asks (an elicitation, the task
    ``input_required``) before it completes; then tasks/get, tasks/result and tasks/list of it;
    then a second task cancelled right after it is created. ``tool`` is the name the URL
    advertises it under (through the gateway: prefixed)."""
    return {"steps": [
        {"op": "callToolStream", "name": tool, "arguments": {"topic": topic, "ambiguous": True}},
        {"op": "waitTaskStatus", "task": "T1", "status": "completed"},
        {"op": "tasks/get", "task": "T1"},
        {"op": "tasks/result", "task": "T1"},
        {"op": "tasks/list"},
        {"op": "callToolStream", "name": tool, "arguments": {"topic": topic}, "until": "taskCreated"},
        {"op": "tasks/cancel", "task": "T2"},
        {"op": "tasks/get", "task": "T2"},
        {"op": "tasks/result", "task": "T2"},
        {"op": "tasks/cancel", "task": "T2"},
        {"op": "tasks/list"},
    ]}


def comparable(outcome: dict[str, Any]) -> dict[str, Any]:
    """``outcome`` without what depends on when the client polled rather than on the server:
    the message of a streamed ``working`` taskStatus that is one of the research stages (which
    one, the first poll's timing decides, as it decides how many polls there were) is
    :data:`POLLED_STAGE`. Every other message, those of the notifications and of tasks/get
    included, is compared as it came."""
    steps = []
    for step in outcome.get("steps", []):
        if step.get("op") == "callToolStream" and "stream" in step:
            step = {**step, "stream": [
                {**entry, "statusMessage": POLLED_STAGE}
                if entry.get("type") == "taskStatus" and entry.get("status") == "working"
                and entry.get("statusMessage") in RESEARCH_STAGES else entry
                for entry in step["stream"]]}
        steps.append(step)
    return {**outcome, "steps": steps}


def outcome_diff(expected: dict[str, Any], got: dict[str, Any]) -> str:
    """Where two outcomes differ, as a unified diff of their indented JSON (for an assertion's
    message: pytest shortens the difference of two large dicts to nothing useful)."""
    return "\n".join(difflib.unified_diff(json.dumps(expected, indent=1, sort_keys=True).splitlines(),
                                          json.dumps(got, indent=1, sort_keys=True).splitlines(),
                                          "expected", "got", lineterm="", n=6))


def run_ts_tasks(url: str, scenario: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """Run ``scenario`` with the TypeScript SDK client's task API against ``url``; its outcome
    (the shape above)."""
    home = node_mcp.node_mcp_home()
    done = subprocess.run([str(home / node_mcp.NODE), str(TS_TASKS), str(home), url], input=json.dumps(scenario),
                          capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"ts_tasks.mjs exited with {done.returncode}: {done.stderr[-3000:]}")
    return json.loads(done.stdout)
