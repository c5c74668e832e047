"""Issue 4, end to end: conflict resolution x overrides x advertising filter, over real
official-SDK backends.

The backends are started once for the module; every case starts its own gateway (cheap)
and opens one session with raw JSON-RPC requests. What a case must advertise is computed
by :func:`oracle`, written from the requirement text, independently of the gateway's code:

* overrides apply per backend, keyed by the backend's own tool name, before the strategy;
* ``prefix``: every tool gets ``prefixFormat`` with ``{workload}`` replaced;
* ``priority``: unique names stay bare; on a clash the listed backend with the lowest
  index wins (the others' tool is not advertised); if no clashing backend is listed, each
  gets ``{workload}_``;
* ``manual``: names stay bare; any clash left is an error naming backends and tools;
* the filter (``filter`` / ``excludeAll`` / ``excludeAllTools``) sits above the routing
  table: it matches the post-override, pre-prefix name and hides without renaming, so a
  hidden tool still takes part in conflict resolution, and a hidden name answers -32602
  exactly like a name that does not exist;
* prompts are named like tools under prefix, bare for listed backends under priority
  (``{workload}_`` for the others), bare under manual; a name claimed twice is dropped;
* resources are never renamed; a shared URI is served by the first backend in sorted order.

Every tool of every backend answers ``"{backend}|{tool it received}|{text}"``, so each
call proves both the backend it reached and the name that backend was asked for.
"""

# No ``from __future__ import annotations``: the SDK inspects the tool functions'
# signatures at registration time.

import asyncio
import copy
import json
import logging
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.backends import (
    SHARED_README_URI,
    RawMcpBackend,
    SdkBackend,
    build_sdk_server,
    static_result,
    text_result,
    tool_def,
)
from tests.gateway import (
    QuickStopGatewayServer,
    admin_get,
    answer_of,
    backend_entry,
    list_all,
    run_client,
)
from vmcp_actors.config import (
    AggregationConfig,
    BackendConfig,
    VmcpConfig,
    config_from_mapping,
)
from vmcp_actors.demo._serve import serve_asgi_in_thread
from vmcp_actors.exceptions import ConfigError

INVALID_PARAMS = -32602
ADMIN_ENV = "VMCP_MATRIX_ADMIN_TOKEN"
ADMIN_TOKEN = "matrix-admin-token"
VMCP = str(Path(sys.executable).parent / "vmcp-actors")
CONFIG_ERROR_EXIT = 2
NO_SUCH_TOOL = "no_such_tool_anywhere"

# -- the designed backends ------------------------------------------------------------
#
# echo/whoami clash between alpha and beta (beta is the one priorityOrder lists);
# report clashes between alpha and gamma (neither is listed: the fallback prefix);
# *_only are unique. Every backend has the prompt greet plus a unique one.

TOOLS: dict[str, tuple[str, ...]] = {
    "alpha": ("echo", "whoami", "alpha_only", "report"),
    "beta": ("echo", "whoami", "beta_only"),
    "gamma": ("report", "gamma_only"),
}
BACKENDS = tuple(sorted(TOOLS))
PROMPTS: dict[str, tuple[str, ...]] = {b: ("greet", f"{b}_tips") for b in BACKENDS}
BACKEND_ANNOTATIONS = {"readOnlyHint": True}  # what alpha's alpha_only says of itself


# (backend, tool) -> times the backend ran it; the backends run in this process
CALLS: Counter = Counter()


def _tool(backend: str, tool: str):
    def answer(text: str = "") -> str:
        CALLS[(backend, tool)] += 1
        return f"{backend}|{tool}|{text}"

    return answer


def _prompt(backend: str, prompt: str):
    def render(who: str = "") -> str:
        return f"{backend}|{prompt}|{who}"

    return render


class SlowableSdkBackend(SdkBackend):
    """An official-SDK backend behind a tiny ASGI wrapper: every POST first waits ``delay``
    seconds (settable while running), so a test can choose which backend answers last."""

    delay = 0.0

    def start(self, *, json_response: bool = False, stateless: bool = False) -> "SlowableSdkBackend":
        inner = self.server.streamable_http_app(json_response=json_response, stateless_http=stateless)

        async def app(scope, receive, send):
            if scope["type"] == "http" and scope.get("method") == "POST" and self.delay:
                await asyncio.sleep(self.delay)
            await inner(scope, receive, send)

        self._served = serve_asgi_in_thread(app, name=self.name)
        return self


def matrix_backend(name: str) -> SlowableSdkBackend:
    from mcp.types import ToolAnnotations

    server = build_sdk_server(name, tools=())  # resources, template and greet come with it
    for tool in TOOLS[name]:
        annotations = ToolAnnotations(**BACKEND_ANNOTATIONS) if tool == "alpha_only" else None
        server.add_tool(_tool(name, tool), name=tool, description=f"{tool} of {name}", annotations=annotations)
    for prompt in PROMPTS[name]:
        if prompt != "greet":
            server.prompt(name=prompt, description=f"{prompt} of {name}")(_prompt(name, prompt))
    return SlowableSdkBackend(name, server).start()


@pytest.fixture(scope="module")
def backends():
    started: dict[str, SlowableSdkBackend] = {}
    try:
        for name in BACKENDS:
            started[name] = matrix_backend(name)
        yield started
    finally:
        for backend in started.values():
            backend.stop()


@pytest.fixture(autouse=True)
def admin_token(monkeypatch):
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)


@pytest.fixture
def start_gateway():
    """A gateway per call (quick to stop); all stopped after the test."""
    started: list[QuickStopGatewayServer] = []

    def start(config: dict) -> QuickStopGatewayServer:
        server = QuickStopGatewayServer(config).start()
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.stop()


def gateway_config(served: dict, aggregation: dict, order: tuple[str, ...] | None = None) -> dict:
    names = order or tuple(served)
    return {
        "name": "matrix",
        "backends": [backend_entry(name, served[name]) for name in names],
        "aggregation": aggregation,
        "admin": {"tokenEnv": ADMIN_ENV},
        "operational": {"pageSize": 3},  # every list is paged (after the filter)
    }


# -- the matrix's axes ----------------------------------------------------------------

STRATEGIES: dict[str, dict[str, Any]] = {
    "prefix_underscore": {"conflictResolution": "prefix", "conflictResolutionConfig": {"prefixFormat": "{workload}_"}},
    "prefix_dot": {"conflictResolution": "prefix", "conflictResolutionConfig": {"prefixFormat": "{workload}."}},
    "priority": {"conflictResolution": "priority", "conflictResolutionConfig": {"priorityOrder": ["beta"]}},
    "manual": {"conflictResolution": "manual"},
}
RENAME = {"name": "renamed", "description": "Renamed by the gateway", "annotations": {"openWorldHint": False}}
OVERRIDES: dict[str, dict[str, dict[str, dict]]] = {
    "none": {},
    "rename": {"alpha": {"alpha_only": RENAME}},
    # beta's beta_only is renamed onto a name alpha and gamma already offer
    "clash": {"alpha": {"alpha_only": RENAME}, "beta": {"beta_only": {"name": "report"}}},
}
# Under manual the base clashes (echo, whoami, report) must be resolved by overrides.
MANUAL_BASE: dict[str, dict[str, dict]] = {
    "beta": {"echo": {"name": "beta_echo"}, "whoami": {"name": "beta_whoami"}},
    "gamma": {"report": {"name": "gamma_report"}},
}
FILTERS: dict[str, tuple[dict[str, dict], bool]] = {  # per-workload settings, excludeAllTools
    "none": ({}, False),
    "filter": ({"alpha": {"filter": ["echo", "renamed"]}}, False),
    "excludeAll": ({"beta": {"excludeAll": True}}, False),
    "excludeAllTools": ({}, True),
}


@dataclass(frozen=True)
class Case:
    strategy: str
    overrides: str
    filter: str

    @property
    def id(self) -> str:
        return f"{self.strategy}-{self.overrides}-{self.filter}"

    def tool_overrides(self) -> dict[str, dict[str, dict]]:
        merged: dict[str, dict[str, dict]] = defaultdict(dict)
        for source in ((MANUAL_BASE,) if self.strategy == "manual" else ()) + (OVERRIDES[self.overrides],):
            for backend, overrides in source.items():
                merged[backend].update(copy.deepcopy(overrides))
        return dict(merged)

    def aggregation(self) -> dict[str, Any]:
        aggregation = copy.deepcopy(STRATEGIES[self.strategy])
        overrides = self.tool_overrides()
        workload_settings, exclude_all_tools = FILTERS[self.filter]
        tools = []
        for backend in BACKENDS:
            entry: dict[str, Any] = {}
            if backend in overrides:
                entry["overrides"] = overrides[backend]
            entry.update(copy.deepcopy(workload_settings.get(backend, {})))
            if entry:
                tools.append({"workload": backend, **entry})
        if tools:
            aggregation["tools"] = tools
        if exclude_all_tools:
            aggregation["excludeAllTools"] = True
        return aggregation


MATRIX = [Case(s, o, f) for s in STRATEGIES for o in OVERRIDES for f in FILTERS]


# -- the oracle -----------------------------------------------------------------------


@dataclass
class Expected:
    advertised: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (backend, original tool)
    hidden: dict[str, tuple[str, str]] = field(default_factory=dict)  # routed but filtered out
    conflicts: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # manual: name -> claimants
    prompts: dict[str, tuple[str, str]] = field(default_factory=dict)
    dropped_prompts: set[str] = field(default_factory=set)


def oracle(case: Case) -> Expected:
    """What the requirement says a client of ``case`` must see (independent of the gateway)."""
    settings = STRATEGIES[case.strategy]
    kind = settings["conflictResolution"]
    prefix_format = settings.get("conflictResolutionConfig", {}).get("prefixFormat", "{workload}_")
    order = settings.get("conflictResolutionConfig", {}).get("priorityOrder", [])
    overrides = case.tool_overrides()
    workload_settings, exclude_all_tools = FILTERS[case.filter]
    expected = Expected()

    resolved = {
        (backend, tool): overrides.get(backend, {}).get(tool, {}).get("name", tool)
        for backend in BACKENDS
        for tool in TOOLS[backend]
    }
    routing: dict[str, tuple[str, str]] = {}
    if kind == "prefix":
        for (backend, tool), name in resolved.items():
            routing[prefix_format.replace("{workload}", backend) + name] = (backend, tool)
    else:
        claimants: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for key, name in resolved.items():
            claimants[name].append(key)
        for name, claiming in claimants.items():
            if len(claiming) == 1:
                routing[name] = claiming[0]
            elif kind == "manual":
                expected.conflicts[name] = claiming
            else:
                listed = [c for c in claiming if c[0] in order]
                if listed:
                    routing[name] = min(listed, key=lambda c: order.index(c[0]))
                else:
                    for backend, tool in claiming:
                        routing[f"{backend}_{name}"] = (backend, tool)

    def visible(backend: str, name_before_prefix: str) -> bool:
        if exclude_all_tools:
            return False
        own = workload_settings.get(backend, {})
        if own.get("excludeAll"):
            return False
        return "filter" not in own or name_before_prefix in own["filter"]

    for name, (backend, tool) in routing.items():
        target = expected.advertised if visible(backend, resolved[(backend, tool)]) else expected.hidden
        target[name] = (backend, tool)

    claims: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for backend in BACKENDS:
        for prompt in PROMPTS[backend]:
            if kind == "prefix":
                name = prefix_format.replace("{workload}", backend) + prompt
            elif kind == "priority" and backend not in order:
                name = f"{backend}_{prompt}"
            else:
                name = prompt
            claims[name].append((backend, prompt))
    for name, claiming in claims.items():
        if len(claiming) == 1:
            expected.prompts[name] = claiming[0]
        else:
            expected.dropped_prompts.add(name)
    return expected


def test_the_oracle_reads_the_requirement_as_intended():
    """A few hand-checked points, so a wrong oracle cannot make the matrix vacuous."""
    prefixed = oracle(Case("prefix_underscore", "none", "none"))
    assert prefixed.advertised["alpha_echo"] == ("alpha", "echo")
    assert prefixed.advertised["beta_echo"] == ("beta", "echo")
    assert "echo" not in prefixed.advertised and not prefixed.hidden and not prefixed.conflicts

    priority = oracle(Case("priority", "clash", "none"))
    assert priority.advertised["echo"] == ("beta", "echo")  # listed beta wins
    assert priority.advertised["report"] == ("beta", "beta_only")  # renamed into the clash, and listed
    assert "alpha_report" not in priority.advertised and "gamma_report" not in priority.advertised
    assert priority.advertised["renamed"] == ("alpha", "alpha_only")
    assert set(priority.prompts) == {"greet", "beta_tips", "alpha_greet", "alpha_alpha_tips", "gamma_greet",
                                     "gamma_gamma_tips"}
    assert oracle(Case("priority", "none", "none")).advertised["gamma_report"] == ("gamma", "report")

    manual = oracle(Case("manual", "clash", "filter"))
    assert manual.conflicts == {"report": [("alpha", "report"), ("beta", "beta_only")]}
    assert oracle(Case("manual", "rename", "none")).dropped_prompts == {"greet"}

    hidden = oracle(Case("prefix_dot", "rename", "filter"))
    assert set(n for n in hidden.advertised if n.startswith("alpha.")) == {"alpha.echo", "alpha.renamed"}
    assert {"alpha.whoami", "alpha.report"} <= set(hidden.hidden)
    assert not oracle(Case("manual", "none", "excludeAllTools")).advertised


AMBIGUOUS = "ambiguous"


def own_name_meaning(case: Case, expected: Expected, name: str) -> tuple[str, str] | str | None:
    """What a call by ``name``, not advertised, reaches (issue 38): the tool whose backend
    named it so, when exactly one the client can call (advertised, not hidden) has that own
    name, or the one whose backend comes strictly first in priorityOrder; AMBIGUOUS when
    several and none first; None when none (an unknown tool)."""
    meanings = [(backend, original) for advertised, (backend, original) in expected.advertised.items()
                if original == name]
    if not meanings:
        return None
    if len(meanings) == 1:
        return meanings[0]
    order = STRATEGIES[case.strategy].get("conflictResolutionConfig", {}).get("priorityOrder", [])
    ranked = sorted(meanings, key=lambda meaning: order.index(meaning[0]) if meaning[0] in order else len(order))
    first, second = ranked[0], ranked[1]
    if first[0] in order and (second[0] not in order or order.index(first[0]) < order.index(second[0])):
        return first
    return AMBIGUOUS


# -- raw protocol helpers -------------------------------------------------------------


def call_tool(gateway, sid: str, name: str, text: str = "") -> dict:
    return gateway.rpc(sid, "tools/call", {"name": name, "arguments": {"text": text}})


def result_text(answer: dict) -> str:
    assert "result" in answer, answer
    assert not answer["result"].get("isError"), answer
    return answer["result"]["content"][0]["text"]


class UnknownTool:
    """How the gateway answers a tools/call for a name that does not exist (the reference)."""

    def __init__(self, gateway, sid: str):
        self.gateway, self.sid = gateway, sid
        self.status, self.reference = self._call(NO_SUCH_TOOL)
        assert "error" in self.reference, self.reference
        assert self.reference["error"]["code"] == INVALID_PARAMS

    def _call(self, name: str) -> tuple[int, dict]:
        params = {"name": name, "arguments": {"text": "x"}}
        message = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params}
        response = self.gateway.post(message, self.sid)
        return response.status_code, answer_of(response)

    def assert_same_answer(self, name: str, why: str) -> None:
        """``name`` answers exactly as a name that does not exist: HTTP status, code, message, data."""
        status, answer = self._call(name)
        assert "error" in answer, f"{why}: {name!r} was callable: {answer}"
        error, reference = answer["error"], self.reference["error"]
        assert error["code"] == INVALID_PARAMS, f"{why}: {name!r}: {error}"
        assert status == self.status, (why, name, status, self.status)
        assert set(answer) == set(self.reference) and set(error) == set(reference), (why, error, reference)

        def shape(value: Any, own: str) -> str:
            return json.dumps(value, sort_keys=True).replace(json.dumps(own)[1:-1], "<name>")

        assert shape(error, name) == shape(reference, NO_SUCH_TOOL), (why, error, reference)


def session_state(gateway, sid: str) -> dict:
    response = admin_get(gateway, token=ADMIN_TOKEN)
    assert response.status_code == 200, response.text
    (state,) = [s for s in response.json()["sessions"] if s["id"] == sid]
    return state


def assert_conflict_reported(gateway, sid: str, conflicts: dict[str, list[tuple[str, str]]]) -> None:
    """Every request that needs the catalog fails with a JSON-RPC error naming the clashing
    backends and tools; the admin state shows the same."""
    for method in ("tools/list", "prompts/list", "resources/list"):
        answer = gateway.rpc(sid, method, {})
        assert "error" in answer and "result" not in answer, (method, answer)
    message = gateway.rpc(sid, "tools/list", {})["error"]["message"]
    for name, claimants in conflicts.items():
        assert repr(name) in message, message
        for backend, tool in claimants:
            assert backend in message and repr(tool) in message, (backend, tool, message)
    called = call_tool(gateway, sid, "echo")
    assert "error" in called and called["error"]["message"] == message, called
    errors = session_state(gateway, sid)["catalogErrors"]
    for name, claimants in conflicts.items():
        (entry,) = [e for e in errors if repr(name) in e]
        for backend, tool in claimants:
            assert backend in entry and repr(tool) in entry, (backend, tool, entry)
    assert len(errors) == len(conflicts), errors


def snapshot(gateway, sid: str) -> tuple:
    """Everything a client can list, in the order it is sent (or the error, if any)."""
    first = gateway.rpc(sid, "tools/list", {})
    if "error" in first:
        return ("error", first["error"]["code"], first["error"]["message"])
    return (
        tuple(t["name"] for t in list_all(gateway, sid, "tools/list", "tools")),
        tuple(p["name"] for p in list_all(gateway, sid, "prompts/list", "prompts")),
        tuple(r["uri"] for r in list_all(gateway, sid, "resources/list", "resources")),
        tuple(t["uriTemplate"] for t in list_all(gateway, sid, "resources/templates/list", "resourceTemplates")),
    )


# -- the matrix -----------------------------------------------------------------------


@pytest.mark.parametrize("case", MATRIX, ids=[c.id for c in MATRIX])
def test_aggregation_matrix(case: Case, backends, start_gateway):
    expected = oracle(case)
    gateway = start_gateway(gateway_config(backends, case.aggregation()))
    sid = gateway.initialize()

    if expected.conflicts:
        assert_conflict_reported(gateway, sid, expected.conflicts)
        return

    # tools: exactly the expected names, each once
    tools = list_all(gateway, sid, "tools/list", "tools")
    names = [t["name"] for t in tools]
    assert len(names) == len(set(names)), names
    assert sorted(names) == sorted(expected.advertised)
    # in sorted backend order, each backend's tools in the order it lists them
    order = [(b, t) for b in BACKENDS for t in TOOLS[b]]
    assert names == sorted(names, key=lambda n: order.index(expected.advertised[n]))

    # overrides change description and annotations (merged over the backend's)
    for tool in tools:
        backend, original = expected.advertised[tool["name"]]
        if (backend, original) == ("alpha", "alpha_only") and case.overrides != "none":
            assert tool["description"] == RENAME["description"]
            assert {**BACKEND_ANNOTATIONS, **RENAME["annotations"]}.items() <= tool["annotations"].items()
        else:
            assert tool["description"] == f"{original} of {backend}"

    # every advertised tool reaches its backend, which receives its own tool name
    for name, (backend, original) in expected.advertised.items():
        before = CALLS[(backend, original)]
        assert result_text(call_tool(gateway, sid, name, "hi")) == f"{backend}|{original}|hi", name
        assert CALLS[(backend, original)] == before + 1, name

    # every hidden name, and every name that is not advertised, answers as an unknown tool
    # (and no backend runs anything for them), but a backend's own name for a tool the client
    # can call (an MCP App calls by those): it reaches the one tool it means, or is refused
    # as ambiguous
    calls_before = CALLS.copy()
    unknown = UnknownTool(gateway, sid)
    for name in expected.hidden:
        unknown.assert_same_answer(name, "hidden by the filter")
    overrides = case.tool_overrides()
    for backend in BACKENDS:
        for tool in TOOLS[backend]:
            renamed = overrides.get(backend, {}).get(tool, {}).get("name", tool)
            for base in {tool, renamed}:
                for name in (base, f"{backend}.{base}", f"{backend}_{base}"):
                    if name in expected.advertised or name in expected.hidden:
                        continue
                    meant = own_name_meaning(case, expected, name)
                    if meant is None:
                        unknown.assert_same_answer(name, "not an advertised name")
                    elif meant == AMBIGUOUS:
                        assert "is ambiguous" in call_tool(gateway, sid, name, "hi")["error"]["message"], name
                    else:
                        assert result_text(call_tool(gateway, sid, name, "hi")) == f"{meant[0]}|{meant[1]}|hi", name
                        calls_before[meant] += 1
    assert CALLS == calls_before, "a hidden or unknown name reached a backend"

    # prompts: named per strategy, each reaching its backend under its own name
    prompts = [p["name"] for p in list_all(gateway, sid, "prompts/list", "prompts")]
    assert sorted(prompts) == sorted(expected.prompts)
    for name, (backend, original) in expected.prompts.items():
        got = gateway.rpc(sid, "prompts/get", {"name": name, "arguments": {"who": "zoe"}})
        text = got["result"]["messages"][0]["content"]["text"]
        assert text == (f"Hello zoe, from {backend}!" if original == "greet" else f"{backend}|{original}|zoe"), name
        if original == "greet":  # the backend completes only its own prompt name
            completed = gateway.rpc(sid, "completion/complete", {
                "ref": {"type": "ref/prompt", "name": name}, "argument": {"name": "who", "value": "al"}})
            assert completed["result"]["completion"]["values"] == ["alice", "albert"], (name, completed)
    for name in expected.dropped_prompts:
        dropped = gateway.rpc(sid, "prompts/get", {"name": name, "arguments": {"who": "zoe"}})
        assert dropped["error"]["code"] == INVALID_PARAMS, dropped

    # resources: never renamed, the shared one once and served by the first backend in sorted order
    uris = [r["uri"] for r in list_all(gateway, sid, "resources/list", "resources")]
    assert sorted(uris) == sorted([SHARED_README_URI] + [f"test://{b}/static" for b in BACKENDS])

    def read(uri: str) -> str:
        answer = gateway.rpc(sid, "resources/read", {"uri": uri})
        assert "result" in answer, (uri, answer)
        return answer["result"]["contents"][0]["text"]

    assert read(SHARED_README_URI) == f"shared readme (served by {BACKENDS[0]})"
    templates = [t["uriTemplate"] for t in list_all(gateway, sid, "resources/templates/list", "resourceTemplates")]
    assert sorted(templates) == sorted(f"test://{b}/items/{{item}}" for b in BACKENDS)
    for backend in BACKENDS:
        assert read(f"test://{backend}/static") == f"static resource of {backend}"
        assert read(f"test://{backend}/items/7") == f"{backend} item 7"  # routed by RFC 6570 matching


# -- determinism ----------------------------------------------------------------------

DETERMINISM_CASES = [
    Case("prefix_underscore", "clash", "none"),
    Case("prefix_dot", "rename", "filter"),
    Case("priority", "clash", "excludeAll"),
    Case("priority", "none", "none"),  # the unlisted alpha/gamma clash on report
    Case("manual", "rename", "none"),
    Case("manual", "clash", "none"),  # the error itself must not depend on the order
]


@pytest.mark.parametrize("case", DETERMINISM_CASES, ids=[c.id for c in DETERMINISM_CASES])
def test_results_do_not_depend_on_config_order_or_answer_order(case: Case, backends, start_gateway):
    variants = {
        "config order": (BACKENDS, None),
        "reversed config order": (tuple(reversed(BACKENDS)), None),
        "alpha answers last": (BACKENDS, "alpha"),
        "gamma answers last, reversed": (tuple(reversed(BACKENDS)), "gamma"),
    }
    seen = {}
    for label, (order, slow) in variants.items():
        if slow:
            backends[slow].delay = 0.08
        try:
            gateway = start_gateway(gateway_config(backends, case.aggregation(), order=order))
            sid = gateway.initialize()
            seen[label] = snapshot(gateway, sid)
        finally:
            if slow:
                backends[slow].delay = 0.0
    baseline = seen["config order"]
    for label, got in seen.items():
        assert got == baseline, f"{label} differs from the config order"
    expected = oracle(case)
    if expected.conflicts:
        assert baseline[0] == "error"
    else:
        assert sorted(baseline[0]) == sorted(expected.advertised)


# -- the dot convention from the client side ------------------------------------------


def test_clients_call_advertised_names_only_not_the_dot_convention(backends, start_gateway):
    gateway = start_gateway(gateway_config(backends, STRATEGIES["prefix_underscore"]))
    sid = gateway.initialize()
    assert result_text(call_tool(gateway, sid, "alpha_echo", "a")) == "alpha|echo|a"
    unknown = UnknownTool(gateway, sid)
    for name in ("alpha.echo", "beta.whoami", ".echo", "alpha."):
        unknown.assert_same_answer(name, "the dot convention is for internal callers only")
    # a bare own name two backends share is refused as ambiguous, never guessed (issue 38)
    assert "is ambiguous" in call_tool(gateway, sid, "echo", "a")["error"]["message"]


def test_under_a_dot_prefix_the_advertised_dotted_name_is_the_one_clients_call(backends, start_gateway):
    aggregation = Case("prefix_dot", "rename", "none").aggregation()
    gateway = start_gateway(gateway_config(backends, aggregation))
    sid = gateway.initialize()
    assert result_text(call_tool(gateway, sid, "alpha.renamed", "r")) == "alpha|alpha_only|r"
    # alpha.alpha_only is the internal (original-name) spelling: not for clients
    UnknownTool(gateway, sid).assert_same_answer("alpha.alpha_only", "original name of a renamed tool")


def test_the_official_sdk_client_sees_the_same_matrix_case(backends, start_gateway):
    from mcp.shared.exceptions import MCPError

    case = Case("prefix_dot", "rename", "filter")
    expected = oracle(case)
    gateway = start_gateway(gateway_config(backends, case.aggregation()))

    async def work(client):
        listed, cursor = [], None
        while True:  # pageSize 3: follow nextCursor
            page = await client.list_tools(cursor=cursor)
            listed += [t.name for t in page.tools]
            cursor = page.next_cursor
            if not cursor:
                break
        called = (await client.call_tool("alpha.renamed", {"text": "sdk"})).content[0].text
        failures = {}
        for name in ("alpha.whoami", NO_SUCH_TOOL):
            try:
                await client.call_tool(name, {"text": "sdk"})
            except MCPError as error:
                failures[name] = (error.code, error.message)
        return listed, called, failures

    listed, called, failures = run_client(gateway.url, work)
    assert sorted(listed) == sorted(expected.advertised)
    assert called == "alpha|alpha_only|sdk"
    assert failures["alpha.whoami"][0] == failures[NO_SUCH_TOOL][0] == INVALID_PARAMS
    assert failures["alpha.whoami"][1] == failures[NO_SUCH_TOOL][1].replace(NO_SUCH_TOOL, "alpha.whoami")


# -- prefix formats beyond the matrix -------------------------------------------------


@pytest.mark.parametrize("prefix_format, expected", [
    ("{workload}", {"alphaecho", "alphawhoami", "alphaalpha_only", "alphareport"}),
    ("gw-", {"gw-echo", "gw-whoami", "gw-alpha_only", "gw-report"}),  # a fixed string
    ("x.{workload}-", {"x.alpha-echo", "x.alpha-whoami", "x.alpha-alpha_only", "x.alpha-report"}),
])
def test_other_prefix_formats(prefix_format, expected, backends, start_gateway):
    aggregation = {"conflictResolution": "prefix", "conflictResolutionConfig": {"prefixFormat": prefix_format}}
    gateway = start_gateway(gateway_config({"alpha": backends["alpha"]}, aggregation))
    sid = gateway.initialize()
    names = [t["name"] for t in list_all(gateway, sid, "tools/list", "tools")]
    assert set(names) == expected and len(names) == len(expected)
    for name in names:
        original = name[len(prefix_format.replace("{workload}", "alpha")):]
        assert result_text(call_tool(gateway, sid, name, "p")) == f"alpha|{original}|p"


# -- name validity --------------------------------------------------------------------


def raw_backend_with_tool_names(names: list[str]) -> RawMcpBackend:
    handlers = {
        "tools/list": static_result({"tools": [tool_def(n, f"tool {n}") for n in names]}),
        "tools/call": lambda call: text_result(f"raw|{call.params.get('name')}|"),
    }
    return RawMcpBackend("raw", handlers).start()


@pytest.mark.parametrize("strategy", ["prefix_underscore", "manual"])
def test_invalid_advertised_names_are_reported_not_sent(strategy, start_gateway):
    prefix = "raw_" if strategy == "prefix_underscore" else ""
    longest_ok = "a" * (128 - len(prefix))  # exactly 128 characters as advertised
    bad = ["has space", "bad/slash", "ünïcode", "b" * (129 - len(prefix))]  # the last: 129 as advertised
    with raw_backend_with_tool_names(["ok_tool", longest_ok, *bad]) as raw:
        gateway = start_gateway(gateway_config({"raw": raw}, STRATEGIES[strategy]))
        sid = gateway.initialize()
        names = [t["name"] for t in list_all(gateway, sid, "tools/list", "tools")]
        assert sorted(names) == sorted([prefix + "ok_tool", prefix + longest_ok])
        assert len(prefix + longest_ok) == 128
        assert result_text(call_tool(gateway, sid, prefix + longest_ok)) == f"raw|{longest_ok}|"
        unknown = UnknownTool(gateway, sid)
        for original in bad:
            unknown.assert_same_answer(prefix + original, "invalid name")
        problems = session_state(gateway, sid)["catalogProblems"]
        assert len(problems) == len(bad), problems
        for original in bad:
            assert any(f"tool {original!r} of backend 'raw'" in p for p in problems), (original, problems)


def test_a_long_prefix_format_hides_only_the_names_it_makes_too_long(backends, start_gateway):
    prefix_format = "{workload}" + "x" * 119  # "alpha" + 119 = 124; + "echo" = 128
    aggregation = {"conflictResolution": "prefix", "conflictResolutionConfig": {"prefixFormat": prefix_format}}
    gateway = start_gateway(gateway_config({"alpha": backends["alpha"]}, aggregation))
    sid = gateway.initialize()
    prefix = prefix_format.replace("{workload}", "alpha")
    names = [t["name"] for t in list_all(gateway, sid, "tools/list", "tools")]
    assert names == [prefix + "echo"] and len(names[0]) == 128
    assert result_text(call_tool(gateway, sid, prefix + "echo", "l")) == "alpha|echo|l"
    problems = session_state(gateway, sid)["catalogProblems"]
    for original in ("whoami", "alpha_only", "report"):
        assert any(repr(original) in p and "alpha" in p for p in problems), (original, problems)
        UnknownTool(gateway, sid).assert_same_answer(prefix + original, "too long")


# -- conflicts only visible at discovery ----------------------------------------------


def test_unresolved_manual_clash_is_a_runtime_error_naming_backends_and_tools(backends, start_gateway, tmp_path):
    aggregation = {"conflictResolution": "manual"}
    config = gateway_config(backends, aggregation)
    # the config alone shows no clash: validate accepts it
    path = tmp_path / "manual.yaml"
    path.write_text(yaml.safe_dump(config))
    done = run_cli(["validate", "--config", str(path)])
    assert done.returncode == 0, done.stderr

    gateway = start_gateway(config)
    sid = gateway.initialize()
    conflicts = {"echo": [("alpha", "echo"), ("beta", "echo")], "whoami": [("alpha", "whoami"), ("beta", "whoami")],
                 "report": [("alpha", "report"), ("gamma", "report")]}
    assert_conflict_reported(gateway, sid, conflicts)
    # the error is stable: the same on every request of the session, and for a new session
    first = gateway.rpc(sid, "tools/list", {})["error"]
    assert gateway.rpc(sid, "tools/list", {})["error"] == first
    other = gateway.initialize()
    assert gateway.rpc(other, "tools/list", {})["error"] == first


def test_a_filter_does_not_resolve_a_manual_clash(backends, start_gateway):
    """The filter sits above the routing table: hiding one side of a clash leaves the clash."""
    aggregation = {"conflictResolution": "manual",
                   "tools": [{"workload": "beta", "excludeAll": True}, {"workload": "gamma", "excludeAll": True}]}
    gateway = start_gateway(gateway_config(backends, aggregation))
    sid = gateway.initialize()
    assert_conflict_reported(gateway, sid, {
        "echo": [("alpha", "echo"), ("beta", "echo")], "whoami": [("alpha", "whoami"), ("beta", "whoami")],
        "report": [("alpha", "report"), ("gamma", "report")]})


def test_prompt_claimed_twice_under_manual_is_dropped_for_every_claimant_with_an_error_log(
    backends, start_gateway, caplog
):
    caplog.set_level(logging.ERROR, logger="vmcp_actors.core._catalog")
    case = Case("manual", "rename", "none")
    gateway = start_gateway(gateway_config(backends, case.aggregation()))
    sid = gateway.initialize()
    prompts = [p["name"] for p in list_all(gateway, sid, "prompts/list", "prompts")]
    assert sorted(prompts) == sorted(f"{b}_tips" for b in BACKENDS)
    got = gateway.rpc(sid, "prompts/get", {"name": "greet", "arguments": {"who": "x"}})
    assert got["error"]["code"] == INVALID_PARAMS
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and "'greet'" in r.getMessage()]
    assert len(logged) == 1, logged
    assert all(b in logged[0] for b in BACKENDS), logged
    assert any("'greet'" in p for p in session_state(gateway, sid)["catalogProblems"])
    # tools are unaffected: the session works
    assert result_text(call_tool(gateway, sid, "renamed", "t")) == "alpha|alpha_only|t"


def raw_prompt_backend(name: str, prompts: list[str]) -> RawMcpBackend:
    def get(call):
        text = f"{name}|{call.params.get('name')}|"
        return {"messages": [{"role": "user", "content": {"type": "text", "text": text}}]}

    handlers = {
        "tools/list": static_result({"tools": [tool_def(f"{name}_tool")]}),
        "tools/call": lambda call: text_result(f"{name}|{call.params.get('name')}|"),
        "prompts/list": static_result({"prompts": [{"name": p, "description": f"{p} of {name}"} for p in prompts]}),
        "prompts/get": get,
    }
    return RawMcpBackend(name, handlers, capabilities={"tools": {}, "prompts": {}}).start()


def test_prompt_claimed_twice_after_priority_resolution_is_dropped_for_both(start_gateway, caplog):
    """alpha is not listed, so its greet becomes alpha_greet: the bare name of a beta prompt."""
    caplog.set_level(logging.ERROR, logger="vmcp_actors.core._catalog")
    with raw_prompt_backend("alpha", ["greet", "solo"]) as alpha, \
            raw_prompt_backend("beta", ["alpha_greet", "greet"]) as beta:
        gateway = start_gateway(gateway_config({"alpha": alpha, "beta": beta}, STRATEGIES["priority"]))
        sid = gateway.initialize()
        prompts = sorted(p["name"] for p in list_all(gateway, sid, "prompts/list", "prompts"))
        assert prompts == ["alpha_solo", "greet"]
        for name, text in (("greet", "beta|greet|"), ("alpha_solo", "alpha|solo|")):
            got = gateway.rpc(sid, "prompts/get", {"name": name, "arguments": {}})
            assert got["result"]["messages"][0]["content"]["text"] == text
        dropped = gateway.rpc(sid, "prompts/get", {"name": "alpha_greet", "arguments": {}})
        assert dropped["error"]["code"] == INVALID_PARAMS, dropped
        logged = [r.getMessage() for r in caplog.records
                  if r.levelno == logging.ERROR and "'alpha_greet'" in r.getMessage()]
        assert len(logged) == 1 and "alpha" in logged[0] and "beta" in logged[0], logged


def test_prompts_under_a_fixed_prefix_collide_and_are_dropped(backends, start_gateway, caplog):
    """A fixed prefixFormat gives every backend's greet the same name: dropped for all."""
    caplog.set_level(logging.ERROR, logger="vmcp_actors.core._catalog")
    aggregation = {"conflictResolution": "prefix", "conflictResolutionConfig": {"prefixFormat": "gw-"}}
    gateway = start_gateway(gateway_config({b: backends[b] for b in ("alpha", "beta")}, aggregation))
    sid = gateway.initialize()
    prompts = sorted(p["name"] for p in list_all(gateway, sid, "prompts/list", "prompts"))
    assert prompts == ["gw-alpha_tips", "gw-beta_tips"]
    assert any("'gw-greet'" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    # tools: a name that still clashes after prefixing goes to the first backend in sorted
    # order (documented in docs/aggregation.md); the loser is reported
    names = [t["name"] for t in list_all(gateway, sid, "tools/list", "tools")]
    assert names == ["gw-echo", "gw-whoami", "gw-alpha_only", "gw-report", "gw-beta_only"]
    for name in names:
        backend, original, _ = result_text(call_tool(gateway, sid, name)).split("|")
        assert "gw-" + original == name and backend == ("beta" if original == "beta_only" else "alpha")
    problems = session_state(gateway, sid)["catalogProblems"]
    for clash in ("gw-echo", "gw-whoami"):
        assert any(repr(clash) in p and "'beta'" in p and "'alpha'" in p for p in problems), (clash, problems)


# -- config errors: at validate and at runtime ----------------------------------------


def run_cli(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([VMCP, *args], capture_output=True, text=True, timeout=60)


def bare_config(aggregation: dict) -> dict:
    return {
        "name": "matrix",
        "backends": [{"name": b, "url": f"http://127.0.0.1:9/{b}/mcp"} for b in BACKENDS],
        "aggregation": aggregation,
    }


CONFIG_ERRORS = {
    "missing priorityOrder": (
        {"conflictResolution": "priority"},
        ["aggregation.conflictResolutionConfig.priorityOrder: is required for conflictResolution priority"],
    ),
    "empty priorityOrder": (
        {"conflictResolution": "priority", "conflictResolutionConfig": {"priorityOrder": []}},
        ["aggregation.conflictResolutionConfig.priorityOrder: is required for conflictResolution priority"],
    ),
    "duplicate override names in one workload": (
        {"tools": [{"workload": "alpha", "overrides": {"echo": {"name": "same"}, "whoami": {"name": "same"}}}]},
        ["aggregation.tools[0].overrides.whoami.name: 'same' is also the new name of 'echo'"],
    ),
    "duplicate override names across workloads under manual": (
        {"conflictResolution": "manual", "tools": [
            {"workload": "alpha", "overrides": {"alpha_only": {"name": "shared"}}},
            {"workload": "beta", "overrides": {"beta_only": {"name": "shared"}}},
        ]},
        ["aggregation.tools[1].overrides.beta_only.name: 'shared' clashes with alpha's override of 'alpha_only' "
         "(manual conflict resolution)"],
    ),
}


@pytest.mark.parametrize("label", list(CONFIG_ERRORS))
def test_config_errors_at_validate_and_at_runtime(label, tmp_path):
    aggregation, lines = CONFIG_ERRORS[label]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bare_config(aggregation)))

    validated = run_cli(["validate", "--config", str(path)])
    assert validated.returncode == CONFIG_ERROR_EXIT, (validated.stdout, validated.stderr)
    assert [line for line in validated.stderr.splitlines() if line] == lines

    # runtime: the loader refuses it, so the server never starts
    with pytest.raises(ConfigError) as raised:
        config_from_mapping(bare_config(aggregation))
    assert list(raised.value.errors) == lines
    served = run_cli(["serve", "--config", str(path), "--host", "127.0.0.1", "--port", "9"])
    assert served.returncode == CONFIG_ERROR_EXIT, (served.stdout, served.stderr)
    assert all(line in served.stderr for line in lines), served.stderr


def test_the_same_override_names_across_workloads_load_under_prefix_and_priority(backends, start_gateway):
    """Only manual makes cross-workload rename collisions a config error; priority lets the order decide."""
    tools = [{"workload": "alpha", "overrides": {"alpha_only": {"name": "shared"}}},
             {"workload": "beta", "overrides": {"beta_only": {"name": "shared"}}}]
    for strategy, wanted in (
        ("prefix_underscore", {"alpha_shared": "alpha|alpha_only|s", "beta_shared": "beta|beta_only|s"}),
        ("priority", {"shared": "beta|beta_only|s"}),  # beta is listed: it wins, alpha's is not advertised
    ):
        gateway = start_gateway(gateway_config(backends, {**STRATEGIES[strategy], "tools": tools}))
        sid = gateway.initialize()
        names = {t["name"] for t in list_all(gateway, sid, "tools/list", "tools")}
        assert set(wanted) <= names and not ({"alpha_shared", "beta_shared"} - set(wanted)) & names
        for name, text in wanted.items():
            assert result_text(call_tool(gateway, sid, name, "s")) == text


def test_create_app_refuses_priority_without_priority_order():
    """A config built in code (not through the loader) must not slip past the rule either."""
    from vmcp_actors.runtime import start_runtime
    from vmcp_actors.web import create_app, stop_app

    try:  # refused when the config is built, or at the latest when the app starts
        config = VmcpConfig(
            name="matrix",
            backends=(BackendConfig("alpha", "http://127.0.0.1:9/mcp"),),
            aggregation=AggregationConfig(conflict_resolution="priority"),
        )
        app = create_app(start_runtime(config))
    except (ConfigError, ValueError) as error:
        assert "priorityOrder" in str(error) or "priority_order" in str(error)
    else:
        stop_app(app)
        pytest.fail("create_app started a priority gateway without a priorityOrder")
