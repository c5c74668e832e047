"""Every way a tool call enters the gateway is authorized, limited and filtered (issue 35).

A table: ``ENTRY_POINTS`` (rows: each way a backend ``tools/call`` is made for a client)
times ``CHECKS`` (columns). Each cell is one test, and each cell also proves the refused call
never reached the backend (the backends count the ``tools/call`` POSTs they receive) and
that the same entry point does reach it when the check lets the call through.

Columns:

* ``cedar``: ``incomingAuth.authz`` forbids the caller the tool -> refused as an unknown
  tool (-32602). For composite steps, the step's tool is decided as the caller's: a composite
  must not launder a forbidden tool.
* ``rate-limit``: the tool's bucket holds 1 token, refilled hourly -> the second call is
  refused: HTTP 429, JSON-RPC code 429. The buckets are ``rateLimiting.tools[].perUser`` and
  every cell calls as a caller of its own, so cells sharing a gateway share no bucket.
* ``filter``: ``aggregation.tools[].filter`` hides the tool -> "Unknown tool" (-32602); for
  composite steps, by design, the step calls it (the filter sits above composite tools,
  ``vmcp_actors.decorators``), and the cell proves that design.
* ``mcp-param``: a 2026-07-28 request whose ``Mcp-Param-*`` header disagrees with the body's
  argument -> HTTP 400, -32020.

Rows (G: what else makes a backend ``tools/call`` for a client, found by reading the
call sites ``test_every_tool_call_site_is_an_entry_point_in_the_table`` lists):

* A: a 2025-11-25 session's ``tools/call``.
* B: a 2026-07-28 (stateless) ``tools/call``.
* C: a 2026-07-28 continuation: a retry with ``inputResponses`` and the gateway's sealed
  ``requestState`` after a backend answered ``input_required``. The state is minted by a twin
  gateway (the same signing key and backends, none of the limits): a process of another
  config, or this one before a policy change, so the gateway under test decides afresh.
* D25 / D26: a task's creation, a 2025 ``tools/call`` with ``task`` and a 2026-07-28 one that
  declares the tasks extension (tests/task_backends.py's backend makes the tasks).
* E: a composite tool's step naming its tool by its advertised name; E.dotted: by
  ``workload.tool``; E.task: a composite run as a task (2026-07-28, ``CompositeTools._start_task``).
* F: the optimizer's ``call_tool`` naming a backend tool; F.C: a continued ``call_tool``
  (``ToolOptimizer.resume``).
* G.parked: a 2026-07-28 retry that answers a call parked in this process (a 2025 backend
  asked mid-call): ``McpService._resume_parked``. Cedar is proved by a revocation (the same
  person, now in the group a policy forbids), as a parked call lives only in the process
  that allowed it.
* H: a code mode script's ``call_tool`` (``codeMode``, issue 39): a 2026-07-28 call of
  ``execute_tool_script`` whose script calls the role's tool. A refused call raises inside
  the script with the client's error ("<message> (error <code>)"); the script catches it
  and returns it, and the cell reads that error (the script tool's own call answers 200, so
  a refusal there has no HTTP status of its own: ``EntryPoint.in_script``).

Found under G and covered by a row's decision rather than a row of their own:
``AggregatedBackends.resume`` calling ``call_tool`` (unasked input for a 2025 backend: under
C's layers), ``CompositeTools.resume`` (a retry of a composite call: E), the workflow engine's
step retries and forEach iterations (each goes through ``_StepCaller.call``: E), and the
rounds a 2025 session answers for a 2026-07-28 backend's ``input_required``
(``InputRequired.retry`` in backends/_channel.py: the backend, not the client, asks for
each, at most 16, inside one call A decided).

A cell that fails on today's code is a door open: ``OPEN_DOORS`` marks it
``xfail(strict=True)`` with why, so closing the door turns it into a failure to unmark.

Real official-SDK backends, the tasks backend, a local IdP and the gateway on real HTTP
servers; one gateway per config for the module.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pykka
import pytest

from tests.entry_backends import CountingSdkBackend, HeaderedTaskBackend, gate_backend, task_jobs_backend
from tests.gateway import BearerSession, QuickStopGatewayServer, answer_of, backend_entry
from tests.idp import LocalIdP
from tests.task_backends import TERMINAL, client_capabilities, modern_post, poll_task

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

AUTHZ, LIMITS, FILTER, HEADERS = "cedar", "rate-limit", "filter", "mcp-param"
CHECKS = (AUTHZ, LIMITS, FILTER, HEADERS)

# What a cell calls, by role; each backend has a tool per role.
ALLOWED, FORBIDDEN, HIDDEN, LIMITED, HEADED = "allowed", "forbidden", "hidden", "limited", "headed"
GATE_TOOLS = {ALLOWED: "echo", FORBIDDEN: "secret", HIDDEN: "hidden", LIMITED: "limited", HEADED: "headed"}
JOB_TOOLS = {ALLOWED: "slow_compute", FORBIDDEN: "failing_job", HIDDEN: "protocol_error_job",
             LIMITED: "delayed_echo", HEADED: "slow_compute"}
ARGUMENTS = {"headed": {"region": "eu", "text": "x"}, "slow_compute": {"seconds": 0, "label": "x"},
             "delayed_echo": {"text": "x", "seconds": 0}, "failing_job": {}, "protocol_error_job": {}}
PARAM_HEADERS = {"headed": ("Mcp-Param-Region", "region"), "slow_compute": ("Mcp-Param-Label", "label")}

SIGNING_KEY_ENV = "VMCP_TEST_ENTRY_POINTS_KEY"
AUDIENCE = "vmcp"
REVOKED = "revoked"
POLICIES = [
    'permit(principal, action, resource);',
    'forbid(principal, action == Action::"call_tool", resource == Tool::"gate_secret");',
    'forbid(principal, action == Action::"call_tool", resource == Tool::"jobs_failing_job");',
    f'forbid(principal in THVGroup::"{REVOKED}", action, resource);',
]
ONE_AN_HOUR = {"maxTokens": 1, "refillPeriod": "1h"}
UNKNOWN_TOOL, RATE_LIMITED, HEADER_MISMATCH = -32602, 429, -32020


def composite(name: str, tool: str) -> dict[str, Any]:
    return {"name": name, "description": f"Calls {tool}", "steps": [
        {"id": "step", "tool": tool, "arguments": {"text": "via a composite"}}]}


COMPOSITES = [composite(f"via_{tool}", f"gate_{tool}") for tool in ("echo", "secret", "hidden", "limited")] + \
             [composite(f"via_{tool}_dotted", f"gate.{tool}") for tool in ("echo", "secret", "hidden", "limited")]


# ----------------------------------------------------------------------------------
# The world: backends, an IdP, one gateway per config (module-wide)
# ----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def stop_all_actors():
    """Overrides the conftest fixture: this module's gateways serve every cell, so their
    actors outlive a test; they stop with the module (``world``)."""
    yield


@dataclass
class World:
    idp: LocalIdP
    gate: CountingSdkBackend  # 2026-07-28 for 2026 callers, a 2025 session for 2025 ones (auto)
    old: CountingSdkBackend  # the same tools, pinned to 2025 behind ``parked`` (it asks mid-call: calls park)
    jobs: HeaderedTaskBackend
    started: dict[str, QuickStopGatewayServer] = field(default_factory=dict)

    def config(self, name: str) -> dict[str, Any]:
        """``guarded``: Cedar, the filter, rate limits, composites, code mode. ``twin``: the same key,
        IdP and backend with none of them. ``optimizer`` / ``optimizer_twin``: the same
        two with the optimizer on top. ``parked``: Cedar over ``old`` alone."""
        guarded = name in ("guarded", "optimizer")
        backends = {"parked": [backend_entry("old", self.old, "legacy")]}.get(name, [backend_entry("gate", self.gate)])
        config: dict[str, Any] = {
            "name": name,
            "backends": backends + ([{"name": "jobs", "url": self.jobs.mcp_url}] if guarded else []),
            "incomingAuth": {"type": "oidc", "oidc": {"issuer": self.idp.issuer, "audience": AUDIENCE}},
            "operational": {"signingKeyEnv": SIGNING_KEY_ENV},
        }
        if guarded or name == "parked":
            config["incomingAuth"]["authz"] = {"type": "cedar", "policies": POLICIES}
        if guarded:
            config["aggregation"] = {"tools": [
                {"workload": "gate", "filter": [tool for tool in GATE_TOOLS.values() if tool != "hidden"]},
                {"workload": "jobs", "filter": [tool for tool in ("greet", "echo", "slow_compute", "delayed_echo",
                                                                  "failing_job", "confirm_delete")]},
            ]}
            config["rateLimiting"] = {"tools": [{"name": "gate_limited", "perUser": ONE_AN_HOUR},
                                                {"name": "jobs_delayed_echo", "perUser": ONE_AN_HOUR}]}
            config["compositeTools"] = COMPOSITES
        if name == "guarded":  # H; listing all: every other row's tools are listed as before
            config["codeMode"] = {"enabled": True, "listing": "all"}
        if name.startswith("optimizer"):
            config["optimizer"] = {"maxToolsToReturn": 8}
        return config

    def gateway(self, name: str) -> QuickStopGatewayServer:
        if name not in self.started:
            self.started[name] = QuickStopGatewayServer(self.config(name)).start()
        return self.started[name]


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """Everything the module starts, stopped in reverse order however the module ends."""
    with pytest.MonkeyPatch.context() as env, contextlib.ExitStack() as started:
        env.setenv(SIGNING_KEY_ENV, "entry-points-signing-key-0123456789")
        idp = LocalIdP("entry-points-idp").start()
        started.callback(idp.stop)
        gate = started.enter_context(gate_backend("gate"))
        old = started.enter_context(gate_backend("old"))
        jobs = started.enter_context(task_jobs_backend("jobs", delay=0.1, job_seconds=0.1))
        built = World(idp, gate, old, jobs)
        started.callback(pykka.ActorRegistry.stop_all, block=True, timeout=5)
        started.callback(lambda: [server.stop() for server in reversed(list(built.started.values()))])
        yield built


@dataclass
class Cell:
    """One cell's caller: a person of its own (so its own per-user buckets)."""

    world: World
    subject: str
    _session: BearerSession | None = None

    def auth(self, revoked: bool = False) -> dict[str, str]:
        claims = {"groups": [REVOKED]} if revoked else {}
        return {"Authorization": f"Bearer {self.world.idp.issue_token(self.subject, AUDIENCE, extra_claims=claims)}"}

    def session(self) -> BearerSession:
        """This caller's 2025-11-25 session on the guarded gateway."""
        if self._session is None:
            self._session = BearerSession(self.world.gateway("guarded"), self.world.idp.issue_token(self.subject,
                                                                                                    AUDIENCE))
        return self._session


@pytest.fixture
def cell(world: World, request: pytest.FixtureRequest) -> Cell:
    return Cell(world, request.node.callspec.id)  # e.g. "C-cedar": a caller per cell


# ----------------------------------------------------------------------------------
# Outcomes
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one call through an entry point got: its HTTP status (None for a task's end),
    its JSON-RPC answer, and how many ``tools/call`` of the target reached its backend."""

    status: int | None
    answer: Mapping[str, Any]
    reached: int

    @property
    def error(self) -> Mapping[str, Any]:
        error = self.answer.get("error")
        return error if isinstance(error, Mapping) else {}

    @property
    def ok(self) -> bool:
        result = self.answer.get("result")
        return isinstance(result, Mapping) and not result.get("isError") \
            and result.get("resultType") != "input_required"

    def refused_with(self, code: int, status: int | None = None, says: str = "") -> bool:
        return self.error.get("code") == code and (status is None or self.status == status) \
            and says in str(self.error.get("message", ""))

    def __str__(self) -> str:
        return f"HTTP {self.status}, reached the backend {self.reached} time(s): {json.dumps(self.answer)[:600]}"


def counted(backend: Any, tool: str, send: Callable[[], Any], answers: bool = False) -> tuple[Any, int]:
    """``send()``, and how many ``tools/call`` of ``tool`` (or answers to mid-call requests)
    reached ``backend`` meanwhile."""
    count = (lambda: backend.calls.answers()) if answers else (lambda: backend.calls.count(tool))
    before = count()
    sent = send()
    return sent, count() - before


def http_outcome(response: Any, reached: int) -> Outcome:
    return Outcome(response.status_code, answer_of(response) if response.content else {}, reached)


def arguments_for(tool: str, **more: Any) -> dict[str, Any]:
    return {**ARGUMENTS.get(tool, {"text": "x"}), **more}


def param_headers(tool: str, arguments: Mapping[str, Any], mismatch: bool) -> dict[str, str]:
    """The ``Mcp-Param-*`` header a 2026-07-28 client mirrors for ``tool``; ``mismatch``:
    a value other than the body's."""
    if tool not in PARAM_HEADERS:
        return {}
    header, argument = PARAM_HEADERS[tool]
    return {header: "not-" + str(arguments[argument]) if mismatch else str(arguments[argument])}


NO_TASKS = client_capabilities(tasks=False)


def modern_call(url: str, name: str, arguments: Mapping[str, Any], headers: Mapping[str, str],
                capabilities: Mapping[str, Any] = NO_TASKS, **params: Any) -> Any:
    return modern_post(url, "tools/call", {"name": name, "arguments": dict(arguments), **params},
                       headers=dict(headers), capabilities=dict(capabilities))


def input_required(response: Any) -> tuple[str, dict[str, Any]]:
    """The requestState of an ``input_required`` answer, and answers accepting every request."""
    answer = answer_of(response)
    result = answer.get("result", {})
    assert result.get("resultType") == "input_required", answer
    return result["requestState"], {key: {"action": "accept", "content": {"ok": True}}
                                    for key in result["inputRequests"]}


# ----------------------------------------------------------------------------------
# The entry points: each calls the tool of a role as its way in does
# ----------------------------------------------------------------------------------


def session_call(cell: Cell, role: str, mismatch: bool = False) -> Outcome:
    """A: tools/call on the caller's 2025-11-25 session."""
    tool = GATE_TOOLS[role]
    session = cell.session()
    response, reached = counted(cell.world.gate, tool, lambda: session.call(f"gate_{tool}", arguments_for(tool)))
    return http_outcome(response, reached)


def stateless_call(cell: Cell, role: str, mismatch: bool = False) -> Outcome:
    """B: a 2026-07-28 tools/call."""
    tool = GATE_TOOLS[role]
    arguments = arguments_for(tool)
    headers = {**cell.auth(), **param_headers(tool, arguments, mismatch)}
    response, reached = counted(cell.world.gate, tool, lambda: modern_call(
        cell.world.gateway("guarded").url, f"gate_{tool}", arguments, headers))
    return http_outcome(response, reached)


def continued_call(cell: Cell, role: str, mismatch: bool = False) -> Outcome:
    """C: the first round at the twin (input_required: a sealed requestState), the retry
    with the answers at the guarded gateway; only the retry is counted."""
    tool = GATE_TOOLS[role]
    arguments = arguments_for(tool, ask=True)
    name = f"gate_{tool}"
    state, answers = input_required(modern_call(cell.world.gateway("twin").url, name, arguments,
                                                {**cell.auth(), **param_headers(tool, arguments, False)}))
    headers = {**cell.auth(), **param_headers(tool, arguments, mismatch)}
    response, reached = counted(cell.world.gate, tool, lambda: modern_call(
        cell.world.gateway("guarded").url, name, arguments, headers, inputResponses=answers, requestState=state))
    return http_outcome(response, reached)


def is_task(answer: Mapping[str, Any]) -> bool:
    result = answer.get("result", {})
    return isinstance(result.get("task"), Mapping) or result.get("resultType") == "task"


def legacy_task_call(cell: Cell, role: str, mismatch: bool = False) -> Outcome:
    """D25: a 2025-11-25 tools/call asking for a task (``params.task``)."""
    tool = JOB_TOOLS[role]
    session = cell.session()
    response, reached = counted(cell.world.jobs, tool, lambda: session.gateway.post(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
         "params": {"name": f"jobs_{tool}", "arguments": arguments_for(tool), "task": {"ttl": 60000}}},
        session.session, headers=session.headers))
    outcome = http_outcome(response, reached)
    assert "error" in outcome.answer or is_task(outcome.answer), f"no task was created: {outcome}"
    return outcome


def modern_task_call(cell: Cell, role: str, mismatch: bool = False) -> Outcome:
    """D26: a 2026-07-28 tools/call of a client that declares the tasks extension."""
    tool = JOB_TOOLS[role]
    arguments = arguments_for(tool)
    headers = {**cell.auth(), **param_headers(tool, arguments, mismatch)}
    response, reached = counted(cell.world.jobs, tool, lambda: modern_call(
        cell.world.gateway("guarded").url, f"jobs_{tool}", arguments, headers, client_capabilities()))
    outcome = http_outcome(response, reached)
    assert "error" in outcome.answer or is_task(outcome.answer), f"no task was created: {outcome}"
    return outcome


def composite_call(suffix: str) -> Callable[[Cell, str, bool], Outcome]:
    """E, E.dotted: a 2026-07-28 call of the composite whose one step calls the role's tool."""

    def call(cell: Cell, role: str, mismatch: bool = False) -> Outcome:
        tool = GATE_TOOLS[role]
        response, reached = counted(cell.world.gate, tool, lambda: modern_call(
            cell.world.gateway("guarded").url, f"via_{tool}{suffix}", {}, cell.auth()))
        return http_outcome(response, reached)

    call.__doc__ = f"A composite step naming gate{'.' if suffix else '_'}<tool>."
    return call


def composite_task_call(cell: Cell, role: str, mismatch: bool = False) -> Outcome:
    """E.task: the composite run as a task (2026-07-28, tasks declared), polled to its end."""
    tool = GATE_TOOLS[role]
    url = cell.world.gateway("guarded").url

    def run() -> tuple[int, dict[str, Any]]:
        created = modern_call(url, f"via_{tool}", {}, cell.auth(), client_capabilities())
        answer = answer_of(created)
        if not is_task(answer):
            return created.status_code, answer
        task = poll_task(url, answer["result"]["taskId"], TERMINAL, headers=cell.auth())
        assert task["status"] in TERMINAL, task
        result = task.get("result") if task["status"] == "completed" else None
        return created.status_code, {"result": result} if result is not None else \
            {"error": task.get("error") or {"message": json.dumps(task)}}

    (status, answer), reached = counted(cell.world.gate, tool, run)
    return Outcome(status, answer, reached)


def optimizer_call(cell: Cell, role: str, mismatch: bool = False) -> Outcome:
    """F: the optimizer's call_tool naming the backend tool (2026-07-28)."""
    tool = GATE_TOOLS[role]
    arguments = {"tool_name": f"gate_{tool}", "parameters": arguments_for(tool)}
    response, reached = counted(cell.world.gate, tool, lambda: modern_call(
        cell.world.gateway("optimizer").url, "call_tool", arguments, cell.auth()))
    return http_outcome(response, reached)


def continued_optimizer_call(cell: Cell, role: str, mismatch: bool = False) -> Outcome:
    """F.C: call_tool's first round at the optimizer twin, its retry at the optimizer gateway."""
    tool = GATE_TOOLS[role]
    arguments = {"tool_name": f"gate_{tool}", "parameters": arguments_for(tool, ask=True)}
    state, answers = input_required(modern_call(cell.world.gateway("optimizer_twin").url, "call_tool", arguments,
                                                cell.auth()))
    response, reached = counted(cell.world.gate, tool, lambda: modern_call(
        cell.world.gateway("optimizer").url, "call_tool", arguments, cell.auth(),
        inputResponses=answers, requestState=state))
    return http_outcome(response, reached)


# The script H runs: the tool called as ``data`` says, its value or the error it raised.
SCRIPT = """
try:
    outcome = {'value': await call_tool(data['tool'], data['arguments'])}
except RuntimeError as error:
    outcome = {'raised': str(error)}
outcome
"""
RAISED = re.compile(r"(?P<message>.*) \(error (?P<code>-?\d+)\)", re.S)


def script_call(cell: Cell, role: str, mismatch: bool = False) -> Outcome:
    """H: a 2026-07-28 call of execute_tool_script whose script calls the role's tool; a
    refusal the script caught becomes the outcome's error (the client's message and code)."""
    tool = GATE_TOOLS[role]
    arguments = {"script": SCRIPT, "data": {"tool": f"gate_{tool}", "arguments": arguments_for(tool)}}
    response, reached = counted(cell.world.gate, tool, lambda: modern_call(
        cell.world.gateway("guarded").url, "execute_tool_script", arguments, cell.auth()))
    outcome = http_outcome(response, reached)
    raised = ((outcome.answer.get("result") or {}).get("structuredContent") or {}).get("raised")
    if raised is None:
        return outcome
    found = RAISED.fullmatch(raised)
    assert found, f"a script's failed call_tool names no error code: {outcome}"
    return Outcome(outcome.status, {"error": {"code": int(found["code"]), "message": found["message"]}}, reached)


# ----------------------------------------------------------------------------------
# The checks
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EntryPoint:
    id: str
    what: str
    call: Callable[..., Outcome] | None  # (cell, role, mismatch=False): the role's tool called this way
    # check -> a cell of its own (None: the generic check of that column), or why it does not apply
    checks: Mapping[str, Callable[[EntryPoint, Cell], None] | str | None]
    runs_steps: bool = False  # a composite: its steps see tools the filter hides, by design
    in_script: bool = False  # a script's call: a refusal raises inside it, with no HTTP status of its own


def check_cedar(entry: EntryPoint, cell: Cell) -> None:
    allowed = entry.call(cell, ALLOWED)
    assert allowed.ok and allowed.reached == 1, f"the entry point must work for an allowed tool: {allowed}"
    forbidden = entry.call(cell, FORBIDDEN)
    assert forbidden.reached == 0, f"a tool Cedar forbids the caller reached the backend: {forbidden}"
    if entry.runs_steps:
        assert not forbidden.ok, f"a composite ran a step Cedar forbids the caller: {forbidden}"
    else:
        assert forbidden.refused_with(UNKNOWN_TOOL, says="Unknown tool"), forbidden


def check_rate_limit(entry: EntryPoint, cell: Cell) -> None:
    first = entry.call(cell, LIMITED)
    assert first.ok and first.reached == 1, f"the bucket's one token lets the first call through: {first}"
    second = entry.call(cell, LIMITED)
    assert second.reached == 0, f"a call past the tool's bucket reached the backend: {second}"
    if entry.runs_steps:
        assert not second.ok and "Rate limit exceeded" in json.dumps(second.answer), second
    else:
        assert second.refused_with(RATE_LIMITED, None if entry.in_script else 429, "Rate limit exceeded"), second


def check_filter(entry: EntryPoint, cell: Cell) -> None:
    hidden = entry.call(cell, HIDDEN)
    if entry.runs_steps:
        # By design: the filter sits above composite tools, so a step calls a hidden tool.
        assert hidden.ok and hidden.reached == 1, f"a composite's step calls a tool the filter hides: {hidden}"
        return
    assert hidden.reached == 0, f"a tool the filter hides reached the backend: {hidden}"
    assert hidden.refused_with(UNKNOWN_TOOL, says="Unknown tool"), hidden


def check_param_headers(entry: EntryPoint, cell: Cell) -> None:
    mismatched = entry.call(cell, HEADED, mismatch=True)
    assert mismatched.reached == 0, f"a call whose Mcp-Param header disagrees reached the backend: {mismatched}"
    assert mismatched.refused_with(HEADER_MISMATCH, 400), mismatched
    agreeing = entry.call(cell, HEADED)
    assert agreeing.reached == 1 and not agreeing.refused_with(HEADER_MISMATCH, says="Header mismatch"), \
        f"the same call with the right header goes through to the backend: {agreeing}"


GENERIC = {AUTHZ: check_cedar, LIMITS: check_rate_limit, FILTER: check_filter, HEADERS: check_param_headers}


# -- G.parked: a retry that answers a call parked in this process ------------------------------


def park(cell: Cell, tool: str, arguments: Mapping[str, Any]) -> tuple[str, dict[str, Any], dict[str, str]]:
    """A 2026-07-28 call of the 2025 backend ``old`` that asks mid-call: parked, answered
    input_required (a state naming the parked call); its state, answers and headers."""
    headers = param_headers(tool, arguments, False)
    state, answers = input_required(modern_call(cell.world.gateway("parked").url, f"old_{tool}", arguments,
                                                {**cell.auth(), **headers}))
    return state, answers, headers


def answer_parked(cell: Cell, tool: str, arguments: Mapping[str, Any], state: str, answers: dict[str, Any],
                  headers: Mapping[str, str]) -> Outcome:
    response, reached = counted(cell.world.old, tool, lambda: modern_call(
        cell.world.gateway("parked").url, f"old_{tool}", arguments, headers, inputResponses=answers,
        requestState=state), answers=True)
    return http_outcome(response, reached)


def check_parked_cedar(entry: EntryPoint, cell: Cell) -> None:
    arguments = arguments_for("echo", ask=True)
    state, answers, _ = park(cell, "echo", arguments)
    revoked = answer_parked(cell, "echo", arguments, state, answers, cell.auth(revoked=True))
    assert revoked.reached == 0, f"a caller Cedar now forbids answered the parked call's backend: {revoked}"
    assert revoked.refused_with(UNKNOWN_TOOL, says="Unknown tool"), revoked
    allowed = answer_parked(cell, "echo", arguments, state, answers, cell.auth())
    assert allowed.ok and allowed.reached == 1, f"the caller, allowed again, goes on with the call: {allowed}"


def check_parked_param_headers(entry: EntryPoint, cell: Cell) -> None:
    arguments = arguments_for("headed", ask=True)
    state, answers, headers = park(cell, "headed", arguments)
    mismatched = answer_parked(cell, "headed", arguments, state, answers,
                               {**cell.auth(), **param_headers("headed", arguments, True)})
    assert mismatched.reached == 0, f"a retry whose Mcp-Param header disagrees reached the backend: {mismatched}"
    assert mismatched.refused_with(HEADER_MISMATCH, 400), mismatched
    agreeing = answer_parked(cell, "headed", arguments, state, answers, {**cell.auth(), **headers})
    assert agreeing.ok and agreeing.reached == 1, f"the same retry with the right header goes on: {agreeing}"


# ----------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------

NO_HEADERS_2025 = "2025-11-25 has no Mcp-Param-* headers"
NO_HEADERS_IN_STEPS = "a composite's steps are the gateway's own calls: no client sends their headers"
NO_HEADERS_CALL_TOOL = ("call_tool's own schema marks no x-mcp-header; the gateway derives the inner "
                        "tool's headers from its parameters")
NO_HEADERS_IN_SCRIPTS = ("a script's call_tool is made inside the gateway: no client request carries its "
                         "arguments, so no Mcp-Param-* header can disagree with them (execute_tool_script's own "
                         "schema marks no x-mcp-header)")

ENTRY_POINTS: tuple[EntryPoint, ...] = (
    EntryPoint("A", "a 2025-11-25 session's tools/call", session_call,
               {AUTHZ: None, LIMITS: None, FILTER: None, HEADERS: NO_HEADERS_2025}),
    EntryPoint("B", "a 2026-07-28 tools/call", stateless_call,
               {AUTHZ: None, LIMITS: None, FILTER: None, HEADERS: None}),
    EntryPoint("C", "a 2026-07-28 continuation (inputResponses + the gateway's requestState)", continued_call,
               {AUTHZ: None, LIMITS: None, FILTER: None, HEADERS: None}),
    EntryPoint("D25", "a task's creation, 2025-11-25 (params.task)", legacy_task_call,
               {AUTHZ: None, LIMITS: None, FILTER: None, HEADERS: NO_HEADERS_2025}),
    EntryPoint("D26", "a task's creation, 2026-07-28 (tasks extension declared)", modern_task_call,
               {AUTHZ: None, LIMITS: None, FILTER: None, HEADERS: None}),
    EntryPoint("E", "a composite tool's step (its tool by advertised name)", composite_call(""),
               {AUTHZ: None, LIMITS: None, FILTER: None, HEADERS: NO_HEADERS_IN_STEPS}, runs_steps=True),
    EntryPoint("E.dotted", "a composite tool's step (its tool as workload.tool)", composite_call("_dotted"),
               {AUTHZ: None, LIMITS: None, FILTER: None, HEADERS: NO_HEADERS_IN_STEPS}, runs_steps=True),
    EntryPoint("E.task", "a composite tool run as a task (2026-07-28)", composite_task_call,
               {AUTHZ: None, LIMITS: None, FILTER: None, HEADERS: NO_HEADERS_IN_STEPS}, runs_steps=True),
    EntryPoint("F", "the optimizer's call_tool naming a backend tool", optimizer_call,
               {AUTHZ: None, LIMITS: None, FILTER: None, HEADERS: NO_HEADERS_CALL_TOOL}),
    EntryPoint("F.C", "a continued optimizer call_tool (2026-07-28 retry)", continued_optimizer_call,
               {AUTHZ: None, LIMITS: None, FILTER: None, HEADERS: NO_HEADERS_CALL_TOOL}),
    EntryPoint("G.parked", "a 2026-07-28 retry answering a call parked here (a 2025 backend asked mid-call)",
               None,
               {AUTHZ: check_parked_cedar,
                LIMITS: ("the retry sends the backend no new tools/call (it answers the request the parked call "
                         "waits on), and a parked call is taken by one retry only: nothing to replay"),
                FILTER: ("the filter is the process's config and a parked call lives only in the process whose "
                         "filter let it through: no state of a hidden tool can exist"),
                HEADERS: check_parked_param_headers}),
    EntryPoint("H", "a code mode script's call_tool (execute_tool_script, 2026-07-28)", script_call,
               {AUTHZ: None, LIMITS: None, FILTER: None, HEADERS: NO_HEADERS_IN_SCRIPTS}, in_script=True),
)

# Cells that fail on the current code: the door is open. Strict: closing it fails the test
# until its line here goes.
OPEN_DOORS: dict[tuple[str, str], str] = {}  # none open (composite steps: decorators/_admission.py)


def cells() -> Iterator[Any]:
    for entry in ENTRY_POINTS:
        for check in CHECKS:
            how = entry.checks[check]
            if isinstance(how, str):
                continue  # does not apply; test_every_cell_is_proved_or_says_why_not reads why
            door = OPEN_DOORS.get((entry.id, check))
            marks = [pytest.mark.xfail(strict=True, reason=f"door open: {door}")] if door else []
            yield pytest.param(entry, check, id=f"{entry.id}-{check}", marks=marks)


@pytest.mark.parametrize(("entry", "check"), list(cells()))
def test_the_entry_point_passes_the_check(entry: EntryPoint, check: str, cell: Cell) -> None:
    how = entry.checks[check]
    (how or GENERIC[check])(entry, cell)


def test_every_cell_is_proved_or_says_why_not() -> None:
    for entry in ENTRY_POINTS:
        assert set(entry.checks) == set(CHECKS), f"{entry.id}: every column needs a cell or a reason"
        for check, how in entry.checks.items():
            assert how is None or callable(how) or (isinstance(how, str) and how.strip()), (entry.id, check)
    assert len({entry.id for entry in ENTRY_POINTS}) == len(ENTRY_POINTS)
    assert set(OPEN_DOORS) <= {(entry.id, check) for entry in ENTRY_POINTS for check in CHECKS
                               if not isinstance(entry.checks[check], str)}



def test_a_continued_call_brings_the_backend_its_mcp_param_headers(world: World) -> None:
    """C-mcp-param's control, apart: the right header lets a continuation through the
    gateway, and the backend then answers it as it answered the first round."""
    continued = continued_call(Cell(world, "continued-with-headers"), HEADED)
    assert continued.reached == 1 and continued.ok, continued

# ----------------------------------------------------------------------------------
# No new way in without a row
# ----------------------------------------------------------------------------------

# Every place in vmcp_actors/ that makes or passes on a tool call: a use of ``call_tool``,
# ``call_route``, ``submit_route`` or ``resume`` (called, or handed on), or a call given the literal method
# "tools/call" (a backend channel's request). Keyed (file, the top-level class or function it
# is in, what it calls), so a refactoring inside a class keeps its key; the value is the
# ENTRY_POINTS rows that go through it, or why it is no entry point of its own. A new site
# fails the test below: add a row to ENTRY_POINTS for it (a new way a client's call reaches
# a backend), or a line here naming the rows that already cover it.
KNOWN_CALL_SITES: dict[tuple[str, str, str], str] = {
    # the client's own calls, and its retries with the gateway's requestState
    ("core/_dispatch.py", "McpDispatcher", "call_tool"): "A B D25 D26 E E.dotted E.task F",
    ("core/_dispatch.py", "resume", "resume"): "C F.C",
    ("edge/_service.py", "McpService", "resume"): "C F.C (the edge hands a retry to dispatch's resume; "
                                                  "LiveSessions.resume is an SSE stream's replay, no call)",
    # the decorator stack passing a call (or a continuation) down, each layer deciding first
    ("core/_interface.py", "CoreLayer", "call_tool"): "the layers' pass-through: every row",
    ("core/_interface.py", "CoreLayer", "resume"): "the layers' pass-through: C F.C",
    ("decorators/_cedar.py", "CedarAuthz", "call_tool"): "the cedar column",
    ("decorators/_cedar.py", "CedarAuthz", "resume"): "the cedar column of C F.C",
    ("decorators/_filter.py", "AdvertisingFilter", "resume"): "the filter column of C F.C",
    ("decorators/_filter.py", "AdvertisingFilter", "call_tool"): "the filter column",
    ("decorators/_rate_limits.py", "RateLimits", "call_tool"): "the rate-limit column",
    ("decorators/_rate_limits.py", "RateLimits", "resume"): "the rate-limit column of C F.C",
    ("decorators/_guard.py", "SubtractOnly", "call_tool"): "an embedder's layer (above Cedar): passes down",
    ("decorators/_guard.py", "SubtractOnly", "resume"): "an embedder's layer (above Cedar): passes down",
    # the tools the gateway adds
    ("decorators/_optimizer.py", "ToolOptimizer", "call_tool"): "F, and F.C (find_tool asks no backend)",
    ("decorators/_optimizer.py", "ToolOptimizer", "resume"): "F.C",
    ("decorators/_composite.py", "CompositeTools", "call_tool"): "A B (a name that is no composite); E (a retry "
                                                                 "of a composite's call runs it anew)",
    ("decorators/_composite.py", "CompositeTools", "resume"): "C",
    ("decorators/_composite.py", "_StepCaller", "submit_route"): "E E.dotted E.task (step retries, forEach too)",
    # the backends
    ("core/_aggregated.py", "AggregatedBackends", "call_route"): "A B D25 D26 F",
    ("core/_aggregated.py", "AggregatedBackends", "request"): "A B D25 D26 F (call_route)",
    ("core/_aggregated.py", "AggregatedBackends", "submit"): "E E.dotted E.task (submit_route)",
    ("core/_aggregated.py", "AggregatedBackends", "call_tool"): "C (resume: unasked input for a 2025 backend)",
    # code mode (issue 39)
    ("decorators/_code_mode.py", "CodeMode", "call_tool"): "H (a script's call_tool: the layer under the optimizer "
                                                           "decides it, Cedar, filter and rate limits); every other "
                                                           "row passes through it (a name not code mode's)",
    ("decorators/_code_mode.py", "CodeMode", "resume"): "C F.C pass through it; a continuation naming code mode's "
                                                        "own tool runs it again as a new call (H)",
    ("codemode/_sandbox.py", "ScriptRun", "resume"): "no tool call: pydantic-monty's snapshot.resume hands the "
                                                     "sandbox a call's result and runs the script on; the call itself "
                                                     "is H's (CodeMode._inner_call)",
    ("edge/_audit.py", "AuditLog", "event_type"): "no tool call: the audit event type of 'tools/call', for the line "
                                                  "of a script's call (H)",
    ("edge/_audit.py", "AuditLog", "write"): "no tool call: writes the audit line (method 'tools/call') of a "
                                             "script's call (H)",
}
TOOL_CALLS = frozenset({"call_tool", "call_route", "submit_route", "resume"})


def tool_call_sites(root: Path) -> set[tuple[str, str, str]]:
    found: set[tuple[str, str, str]] = set()
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        text = path.read_text()
        if not any(word in text for word in (*TOOL_CALLS, "tools/call")):
            continue  # parsing only the files that can hold a site keeps this test fast

        class Sites(ast.NodeVisitor):
            def __init__(self) -> None:
                self.scope: list[str] = []

            def visit_ClassDef(self, node: ast.ClassDef) -> None:
                self.scope.append(node.name)
                self.generic_visit(node)
                self.scope.pop()

            visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef  # type: ignore[assignment]

            def visit_Attribute(self, node: ast.Attribute) -> None:
                if node.attr in TOOL_CALLS:  # called, or handed on to be called (tracing.within(span, f, ...))
                    self.add(node.attr)
                self.generic_visit(node)

            def visit_Call(self, node: ast.Call) -> None:
                if isinstance(node.func, ast.Name) and node.func.id in TOOL_CALLS:
                    self.add(node.func.id)
                if isinstance(node.func, ast.Attribute) and any(
                        isinstance(arg, ast.Constant) and arg.value == "tools/call"
                        for arg in [*node.args, *(keyword.value for keyword in node.keywords)]):
                    self.add(node.func.attr)
                self.generic_visit(node)

            def add(self, called: str) -> None:
                found.add((where, self.scope[0] if self.scope else "", called))

        Sites().visit(ast.parse(text, str(path)))
    return found


def test_every_tool_call_site_is_an_entry_point_in_the_table() -> None:
    import vmcp_actors

    sites = tool_call_sites(Path(vmcp_actors.__file__).parent)
    new = sorted(sites - set(KNOWN_CALL_SITES))
    assert not new, ("new places make or pass on a tool call; give each a row in ENTRY_POINTS (a new way in) or "
                     f"a line in KNOWN_CALL_SITES naming the rows that cover it: {new}")
    gone = sorted(set(KNOWN_CALL_SITES) - sites)
    assert not gone, f"KNOWN_CALL_SITES names call sites that are gone (moved or renamed?): {gone}"

