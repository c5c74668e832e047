"""Never worse than a direct connection (issue 22): whatever a client can do against a
backend directly, in the same mode, it can do through the gateway in its DEFAULT
configuration (only the backend list: every backend's ``protocol`` left at ``auto``), with
the same answer field for field.

Each cell runs one scenario (tests/matrix_clients.py) with one real client twice: straight
to one backend, then through a gateway in front of that backend alone, and compares the
two outcomes. Clients: the official Python SDK client in ``mode="legacy"`` and in its
default mode (``auto``: ``server/discover`` first), and the TypeScript SDK client
(tests/node/ts_client.mjs). Backends (each on a loopback port, each with its own gateway,
shared by the module's cells): the asking SDK backend and the resolver SDK backend (both
revisions), the TypeScript reference server ``server-everything`` (2025 only) and a
2026-07-28-only SDK backend (tests/matrix_backends.py, tests/node_mcp.py).

What the comparison lets differ, and nothing else:

* names: under the default conflict resolution (``prefix``, ``{workload}_``) the gateway
  advertises ``<backend>_<name>`` for every tool and prompt even with one backend; the
  scenario calls ``<backend>_<name>`` through the gateway and the lists are compared with
  the prefix taken off (resource URIs are never rewritten);
* what must differ: the server's identity (``serverInfo``; on 2026-07-28 results also
  ``_meta["io.modelcontextprotocol/serverInfo"]``), progress tokens (the client's request
  ids), session ids and times of day that a backend writes into its text, and the
  capabilities the gateway declares for itself (it must declare at least the backend's).

A cell that no direct connection can serve is not a test (docs/conformance.md, "The
never-worse matrix", lists them); one that the gateway fails today is a strict xfail
naming why, so it turns into a failure once the gateway is fixed.

Needs ``scripts/install-node-mcp`` for the TypeScript client and server-everything (those
cells skip without it, and fail under CI).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

import pykka
import pytest

from tests import node_mcp
from tests.asking_backends import WATCHED_URI
from tests.gateway import QuickStopGatewayServer, backend_entry, wait_until
from tests.matrix_backends import (
    matrix_asking_backend,
    matrix_modern_backend,
    matrix_resolver_backend,
)
from tests.matrix_clients import CANNED, run_py_client

pytestmark = [
    pytest.mark.timeout(60),
    # the SDK deprecates logging, sampling, roots and resources/subscribe for 2026-07-28
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*deprecated as of 2026-07-28"),
    pytest.mark.filterwarnings("ignore:.*removed as of 2026-07-28"),
]

PY_LEGACY, PY_AUTO, TS = "py-legacy", "py-auto", "ts"
ASKING, RESOLVER, EVERYTHING, MODERN = "asking", "resolver", "everything", "modern"
ALL_ASKING = ["sampling", "elicitation", "roots"]
CALL_TIMEOUT = 10  # seconds a client waits for one call: a cell the gateway fails ends soon
WAIT_TIMEOUT = 2  # seconds a client waits for a notification
CANCELLED_WITHIN = 15  # seconds at most for a cancelled call to reach its backend (directly: milliseconds)


# -- the module's backends and gateways --------------------------------------------------


@pytest.fixture(autouse=True)
def stop_all_actors():
    """Overrides the conftest fixture: the module's gateways serve many cells, so their
    actors must outlive a test; everything stops at the end of the module."""
    yield


@pytest.fixture(scope="module", autouse=True)
def stop_actors_after_module():
    yield
    pykka.ActorRegistry.stop_all(block=True, timeout=5)


def default_config(name: str, backend: Any) -> dict:
    """The default configuration: the backend list and nothing else."""
    return {"name": "never-worse", "backends": [backend_entry(name, backend)]}


class Served:
    """Started backends by name, each with a gateway in front of it alone."""

    def __init__(self) -> None:
        self.backends: dict[str, Any] = {}
        self.gateways: dict[str, QuickStopGatewayServer] = {}

    def add(self, name: str, backend: Any) -> None:
        self.backends[name] = backend
        self.gateways[name] = QuickStopGatewayServer(default_config(name, backend)).start()

    def stop(self) -> None:
        for gateway in self.gateways.values():
            gateway.stop()
        for backend in self.backends.values():
            backend.stop()


STARTERS = {ASKING: matrix_asking_backend, RESOLVER: matrix_resolver_backend, MODERN: matrix_modern_backend,
            EVERYTHING: node_mcp.EverythingServer}


@pytest.fixture(scope="module")
def served():
    started = Served()
    yield started
    started.stop()


def serve(served: Served, name: str, fresh: bool) -> tuple[Served, Any]:
    """The backend ``name`` and its gateway: the module's, or (``fresh``) new ones that the
    caller stops, for a cell that changes its backend (a tool or resource added)."""
    if name == EVERYTHING:
        node_mcp.need_node_mcp()
    target = Served() if fresh else served
    if name not in target.backends:
        target.add(name, STARTERS[name](name) if name != EVERYTHING else STARTERS[name]())
    return target, target.backends[name]


# -- running a scenario both ways ---------------------------------------------------------


def run(client: str, url: str, scenario: dict) -> dict:
    if client == TS:
        node_mcp.need_node_mcp()
        return node_mcp.run_ts_client(url, scenario)
    return run_py_client(url, scenario, mode="legacy" if client == PY_LEGACY else "auto")


NAMED_OPS = ("tools/call", "prompts/get")


def through_gateway(scenario: dict, backend: str) -> dict:
    """The scenario as the gateway advertises the backend's names (``<backend>_<name>``)."""
    prefixed = copy.deepcopy(scenario)
    for step in prefixed["steps"]:
        if step["op"] in NAMED_OPS:
            step["name"] = f"{backend}_{step['name']}"
        if step["op"] == "completion/complete" and step["ref"]["type"] == "ref/prompt":
            step["ref"]["name"] = f"{backend}_{step['ref']['name']}"
    return prefixed


def unprefixed(outcome: dict, backend: str) -> dict:
    """The gateway's outcome with ``<backend>_`` taken off the listed tool and prompt names."""
    outcome = copy.deepcopy(outcome)
    prefix = f"{backend}_"
    for step in outcome["steps"]:
        for key in ("tools", "prompts"):
            for item in step.get("result", {}).get(key, []):
                assert item["name"].startswith(prefix), f"{item['name']} is not prefixed with {prefix}"
                item["name"] = item["name"][len(prefix):]
    return outcome


# The server's identity on a 2026-07-28 result, and the stamp of a 2026-07-28 listen
# stream on its notifications (a 2025 session gets the same notification unstamped).
PER_CONNECTION_META = ("io.modelcontextprotocol/serverInfo", "io.modelcontextprotocol/subscriptionId")
# What a backend writes into its text that differs by itself between two runs: a time of
# day (server-everything's resources) and a session id (its log messages).
TIME_OF_DAY = re.compile(r"\b\d{1,2}:\d{2}:\d{2}(\s?[AP]M)?")
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


def _scrub(value: Any) -> Any:
    """``value`` with times of day and session ids replaced, base64 blobs decoded first."""
    if isinstance(value, dict):
        scrubbed = {key: _scrub(item) for key, item in value.items()}
        if isinstance(scrubbed.get("_meta"), dict):
            for key in PER_CONNECTION_META:
                scrubbed["_meta"].pop(key, None)
            if not scrubbed["_meta"]:
                del scrubbed["_meta"]
        if isinstance(value.get("blob"), str):
            scrubbed["blob"] = _scrub(_decoded(value["blob"]))
        return scrubbed
    if isinstance(value, list):
        return [_scrub(item) for item in value]
    if isinstance(value, str):
        return UUID.sub("<uuid>", TIME_OF_DAY.sub("<time>", value))
    return value


def _decoded(blob: str) -> str:
    import base64
    import binascii

    try:
        return base64.b64decode(blob, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return blob


@dataclass(frozen=True)
class Cell:
    feature: str
    backend: str
    client: str
    steps: tuple[dict, ...]
    notes: tuple[str, ...] = ()  # notification methods compared (in arrival order)
    asked: str = "all"  # "all": the server's requests compared in order; "distinct": as a set
    fresh: bool = False  # the cell changes its backend: each side gets its own backend (and gateway)
    cancels: bool = False  # the backend must see the call cancelled, directly and through the gateway
    xfail: str | None = None
    capabilities: tuple[str, ...] = tuple(ALL_ASKING)

    @property
    def id(self) -> str:
        return f"{self.feature}/{self.backend}/{self.client}"

    def scenario(self) -> dict:
        return {"capabilities": list(self.capabilities), "logLevel": "debug", "canned": CANNED,
                "steps": [dict(step) for step in self.steps]}


def comparable(cell: Cell, outcome: dict) -> dict:
    """What the cell compares of an outcome (the module doc says what is let differ)."""
    asked = outcome.get("asked", [])
    if cell.asked == "distinct":
        asked = sorted({repr(item): item for item in asked}.values(), key=repr)
    return _scrub({
        "connect": outcome.get("connect"),
        "steps": outcome["steps"],
        "asked": asked,
        "notes": [_without_empty_params(note) for note in outcome.get("notifications", [])
                  if note["method"] in cell.notes],
    })


def _without_empty_params(note: dict) -> dict:
    # A 2026-07-28 listen stream stamps every notification (its params hold only the
    # stamp, taken off by _scrub); a 2025 session's carries no params: the same notification.
    params = {key: value for key, value in note.get("params", {}).items()
              if not (key == "_meta" and set(value) <= set(PER_CONNECTION_META))}
    return {"method": note["method"], **({"params": params} if params else {})}


def _first_difference(direct: Any, through: Any, path: str = "") -> str:
    if type(direct) is not type(through):
        return f"{path or '.'}: direct {direct!r:.300} / gateway {through!r:.300}"
    if isinstance(direct, dict):
        for key in sorted(set(direct) | set(through), key=str):
            if key not in through:
                return f"{path}.{key}: only direct: {direct[key]!r:.300}"
            if key not in direct:
                return f"{path}.{key}: only through the gateway: {through[key]!r:.300}"
            if direct[key] != through[key]:
                return _first_difference(direct[key], through[key], f"{path}.{key}")
    elif isinstance(direct, list):
        if len(direct) != len(through):
            return f"{path}: {len(direct)} items directly, {len(through)} through the gateway: " \
                   f"direct {direct!r:.600} / gateway {through!r:.600}"
        for index, (one, other) in enumerate(zip(direct, through)):
            if one != other:
                return _first_difference(one, other, f"{path}[{index}]")
    return f"{path or '.'}: direct {direct!r:.300} / gateway {through!r:.300}"


def _served_directly(cell: Cell, outcome: dict) -> None:
    """The direct run did what the cell is about (else the cell proves nothing)."""
    assert "connect" not in outcome, f"{cell.id}: the direct connection failed: {outcome['connect']}"
    for step, result in zip(cell.steps, outcome["steps"]):
        if step["op"] == "tools/call" and step.get("cancelOnProgress"):
            assert result.get("cancelled"), f"{cell.id}: the direct call was not cancelled: {result}"
        elif not step.get("refused"):
            assert "error" not in result and "timeout" not in result, f"{cell.id}: directly, {step}: {result}"


def check_cell(cell: Cell, served: Served) -> None:
    target, backend = serve(served, cell.backend, cell.fresh)
    try:
        scenario = cell.scenario()
        direct = run(cell.client, backend.mcp_url, scenario)
        _served_directly(cell, direct)
        if cell.cancels:
            assert wait_until(backend.cancelled.is_set, CANCELLED_WITHIN), f"{cell.id}: not cancelled directly"
            backend.cancelled.clear()
        if cell.fresh:  # the direct run changed its backend: the gateway's side starts from a new one too
            target.stop()
            target, backend = serve(served, cell.backend, True)
        gateway = target.gateways[cell.backend]
        through = unprefixed(run(cell.client, gateway.url, through_gateway(scenario, cell.backend)), cell.backend)
        mine, theirs = comparable(cell, direct), comparable(cell, through)
        if mine != theirs:
            pytest.fail(f"{cell.id}: {_first_difference(mine, theirs)}", pytrace=False)
        if cell.cancels:
            assert wait_until(backend.cancelled.is_set, CANCELLED_WITHIN), \
                f"{cell.id}: the backend never saw the call cancelled through the gateway"
            backend.cancelled.clear()
    finally:
        if target is not served:
            target.stop()


def initialize_both_ways(backend: str, client: str, served: Served) -> tuple[dict, dict]:
    """What the client learnt when connecting, directly and through the gateway."""
    _, direct_backend = serve(served, backend, False)
    scenario = {"capabilities": ALL_ASKING, "canned": CANNED, "steps": []}
    direct = run(client, direct_backend.mcp_url, scenario)
    through = run(client, served.gateways[backend].url, scenario)
    assert "connect" not in direct and "connect" not in through, (direct.get("connect"), through.get("connect"))
    return direct["initialize"], through["initialize"]


def _not_covered(wanted: Any, declared: Any, path: str = "capabilities") -> list[str]:
    if isinstance(wanted, dict):
        if not isinstance(declared, dict):
            return [path]
        return [gap for key, item in wanted.items()
                for gap in _not_covered(item, declared.get(key), f"{path}.{key}")]
    # A flag the backend sets (listChanged, subscribe) must be set by the gateway too.
    return [path] if wanted and not declared else []


# -- the cells ----------------------------------------------------------------------------


def call(name: str, arguments: dict | None = None, **options: Any) -> dict:
    return {"op": "tools/call", "name": name, "arguments": arguments or {}, "timeout": CALL_TIMEOUT, **options}


def wait_for(method: str, count: int = 1) -> dict:
    return {"op": "wait", "method": method, "count": count, "timeout": WAIT_TIMEOUT}


LISTS = ({"op": "tools/list"}, {"op": "prompts/list"}, {"op": "resources/list"}, {"op": "resources/templates/list"})
CHAPTERS = "test://shapes/books/{book}/chapters/{number}"

# The SDK backends' shapes (tests/matrix_backends.add_result_shapes).
SDK_RESULTS = (
    call("blocks"), call("weather", {"city": "Oslo"}), call("fails"),
    {"op": "prompts/get", "name": "note_1", "arguments": {"topic": "gateways"}},
    {"op": "resources/read", "uri": "test://shapes/page/3"},
    {"op": "resources/read", "uri": "test://shapes/books/guide/chapters/2"},
    {"op": "completion/complete", "ref": {"type": "ref/prompt", "name": "note_0"},
     "argument": {"name": "topic", "value": "g"}},
    {"op": "completion/complete", "ref": {"type": "ref/resource", "uri": CHAPTERS},
     "argument": {"name": "number", "value": "1"}, "context": {"arguments": {"book": "guide"}}},
)
SDK_REFUSED = (call("refuse", {"shape": "square"}, refused=True),)
CHATTY = call("chatty", {"steps": 3}, progress=True)
# Cancelled when the backend has the call: its first progress (the wait tool's progress 0).
CANCEL = call("wait", progress=True, cancelOnProgress=True)

EVERYTHING_RESULTS = (
    call("echo", {"message": "hello"}),
    call("get-annotated-message", {"messageType": "error", "includeImage": True}),
    call("get-annotated-message", {"messageType": "success"}),
    call("get-resource-links", {"count": 4}),
    call("get-resource-reference", {"resourceType": "Text", "resourceId": 2}),
    call("get-resource-reference", {"resourceType": "Blob", "resourceId": 3}),
    call("get-structured-content", {"location": "Chicago"}),
    call("get-sum", {"a": 2, "b": 3}),
    call("get-tiny-image"),
    {"op": "prompts/get", "name": "simple-prompt"},
    {"op": "prompts/get", "name": "args-prompt", "arguments": {"city": "Oslo", "state": "Viken"}},
    {"op": "prompts/get", "name": "resource-prompt", "arguments": {"resourceType": "Text", "resourceId": "2"}},
    {"op": "resources/read", "uri": "demo://resource/dynamic/text/1"},
    {"op": "resources/read", "uri": "demo://resource/dynamic/blob/2"},
    {"op": "completion/complete", "ref": {"type": "ref/prompt", "name": "completable-prompt"},
     "argument": {"name": "department", "value": "E"}},
    {"op": "completion/complete", "ref": {"type": "ref/prompt", "name": "completable-prompt"},
     "argument": {"name": "name", "value": ""}, "context": {"arguments": {"department": "Sales"}}},
    {"op": "completion/complete", "ref": {"type": "ref/resource", "uri": "demo://resource/dynamic/text/{resourceId}"},
     "argument": {"name": "resourceId", "value": "3"}},
)
DYNAMIC_TEXT = "demo://resource/dynamic/text/1"


def everything_refused(client: str) -> tuple[dict, ...]:
    # The error path of a URL elicitation: -32042 with the elicitation in its data. The
    # backend remembers (per backend session) that it asked, so each client uses its own URL.
    return (call("trigger-url-elicitation", {"url": f"https://example.test/{client}", "errorPath": True}, refused=True),
            call("get-sum", {"a": "two", "b": 3}, refused=True),
            {"op": "resources/read", "uri": "demo://resource/dynamic/text/0", "refused": True})


def everything_list_change(client: str) -> tuple[dict, ...]:
    # gzip-file-as-resource adds a session resource (resources/list_changed); a data: URI
    # keeps it off the network; one name per client (the gateway's backend session may be shared).
    return (STREAMS_OPEN, {"op": "watch", "lists": True},
            call("gzip-file-as-resource", {"name": f"{client}.txt.gz", "data": "data:text/plain;base64,aGVsbG8=",
                                           "outputType": "resourceLink"}),
            wait_for("notifications/resources/list_changed"))


UPDATED, LOGGED = "notifications/resources/updated", "notifications/message"
# Before a cell whose backend notifies on its standalone stream: a 2025 client waits until
# the server has answered its standalone stream (GET); what the server sends later reaches
# it. Directly, that server is the backend; through the gateway, the gateway answers once its
# own stream to the backend is open too. A 2026-07-28 client's `watch` returns once its
# subscriptions/listen is acknowledged, which the gateway does once its backends' streams are open.
STREAMS_OPEN = {"op": "streams", "timeout": 10}

# Why cells fail today (each a strict xfail: it fails the run once it passes).
# A log message a backend sends outside any request reaches a 2025 session (its standalone
# stream) but never a 2026-07-28 client: that revision makes notifications/message
# request-scoped and forbids it on subscriptions/listen. Directly, a default-mode client
# falls back to 2025 in front of server-everything; through the gateway it speaks
# 2026-07-28. docs/conformance.md lists the cell as one no 2026-07-28 connection serves.


def _cells() -> list[Cell]:
    cells: list[Cell] = []

    def add(feature: str, backend: str, clients: tuple[str, ...], steps: tuple[dict, ...],
            xfail: dict[str, str] | None = None, **options: Any) -> None:
        for client in clients:
            cells.append(Cell(feature, backend, client, steps, xfail=(xfail or {}).get(client), **options))

    both_2025 = (PY_LEGACY, TS)
    every = (PY_LEGACY, PY_AUTO, TS)

    # The asking SDK backend. A default-mode client speaks 2026-07-28 to it directly, where
    # ctx.session has no back-channel: those cells are for 2025 clients only.
    add("definitions", ASKING, every, LISTS)
    add("results", ASKING, every, SDK_RESULTS)
    add("refused", ASKING, every, SDK_REFUSED)
    add("progress", ASKING, every, (CHATTY,))
    add("logging", ASKING, every, (CHATTY,), notes=(LOGGED,))
    add("cancellation", ASKING, every, (CANCEL,), cancels=True, fresh=True)
    add("elicitation-form", ASKING, both_2025, (call("ask_user", {"question": "Who?"}),))
    add("elicitation-url", ASKING, both_2025, (call("ask_url"),))
    add("sampling", ASKING, both_2025, (call("ask_llm", {"prompt": "hello"}),))
    add("roots-in-call", ASKING, both_2025, (call("roots_in_call"),))
    add("roots-outside-call", ASKING, both_2025, (call("roots"),))
    add("subscription", ASKING, both_2025, (STREAMS_OPEN, {"op": "watch", "resources": [WATCHED_URI]},
                                             call("touch", {"uri": WATCHED_URI}), wait_for(UPDATED)),
        notes=(UPDATED,))
    add("list-changes", ASKING, both_2025, (STREAMS_OPEN, {"op": "watch", "lists": True}, call("grow", {"tool": "grown"}),
                                             wait_for("notifications/tools/list_changed"), {"op": "tools/list"}),
        notes=("notifications/tools/list_changed",), fresh=True)

    # The resolver SDK backend: it asks through resolvers, so every client can be asked.
    add("elicitation-form", RESOLVER, every, (call("confirm", {"item": "the order"}),))
    add("sampling", RESOLVER, every, (call("summarize", {"text": "a long text"}),))
    add("roots-in-call", RESOLVER, every, (call("roots"),))
    add("multi-round", RESOLVER, every, (call("two_steps"),))
    add("progress", RESOLVER, every, (CHATTY,))
    add("logging", RESOLVER, every, (CHATTY,), notes=(LOGGED,))
    add("cancellation", RESOLVER, every, (CANCEL,), cancels=True, fresh=True)

    # The 2026-07-28-only backend: only a default-mode client reaches it directly.
    modern = (PY_AUTO,)
    add("definitions", MODERN, modern, LISTS)
    add("results", MODERN, modern, SDK_RESULTS)
    add("refused", MODERN, modern, SDK_REFUSED)
    add("elicitation-form", MODERN, modern, (call("confirm", {"item": "the order"}),))
    add("sampling", MODERN, modern, (call("summarize", {"text": "a long text"}),))
    add("roots-in-call", MODERN, modern, (call("roots"),))
    add("multi-round", MODERN, modern, (call("two_steps"),))
    add("progress", MODERN, modern, (CHATTY,))
    add("logging", MODERN, modern, (CHATTY,), notes=(LOGGED,))
    add("cancellation", MODERN, modern, (CANCEL,), cancels=True, fresh=True)

    # server-everything (2025 only: a default-mode client falls back to initialize directly).
    # Its cells declare no roots, but the one about roots: with roots, the server asks for
    # them on its standalone stream 350 ms after initialize, at a time of its own choosing.
    no_roots = {"capabilities": ("sampling", "elicitation")}
    add("definitions", EVERYTHING, every, LISTS, **no_roots)
    add("results", EVERYTHING, every, EVERYTHING_RESULTS, **no_roots)
    for client in every:
        add("refused", EVERYTHING, (client,), everything_refused(client), **no_roots)
        add("list-changes", EVERYTHING, (client,), everything_list_change(client),
            notes=("notifications/resources/list_changed",), **no_roots)
    add("progress", EVERYTHING, every, (call("trigger-long-running-operation", {"duration": 0.3, "steps": 3},
                                              progress=True),), **no_roots)
    add("logging", EVERYTHING, both_2025, (STREAMS_OPEN, {"op": "logging/setLevel", "level": "debug"},
                                           {"op": "watch", "resources": [DYNAMIC_TEXT]}, wait_for(LOGGED)),
        notes=(LOGGED,), **no_roots)
    add("elicitation-form", EVERYTHING, every, (call("trigger-elicitation-request"),), **no_roots)
    add("elicitation-url", EVERYTHING, every, (call("trigger-url-elicitation", {
        "url": "https://example.test/sign-in", "elicitationId": "sign-in-1"}),), **no_roots)
    add("sampling", EVERYTHING, every, (call("trigger-sampling-request", {"prompt": "hello", "maxTokens": 20}),),
        **no_roots)
    # server.listRoots() goes out on the standalone stream, outside the call (once at
    # initialize, and from get-roots-list when it has no roots yet): compared as a set.
    add("roots-outside-call", EVERYTHING, every, (call("get-roots-list"),), asked="distinct", fresh=True)
    add("subscription", EVERYTHING, every, (STREAMS_OPEN, {"op": "watch", "resources": [DYNAMIC_TEXT]},
                                            call("toggle-subscriber-updates"), wait_for(UPDATED),
                                            call("toggle-subscriber-updates")), notes=(UPDATED,), **no_roots)
    return cells


CELLS = _cells()


def _param(cell: Cell) -> Any:
    marks = [pytest.mark.xfail(strict=True, reason=cell.xfail)] if cell.xfail else []
    return pytest.param(cell, id=cell.id, marks=marks)


@pytest.mark.parametrize("cell", [_param(cell) for cell in CELLS])
def test_never_worse_than_direct(cell: Cell, served: Served) -> None:
    check_cell(cell, served)


INITIALIZE = [(ASKING, PY_LEGACY), (ASKING, PY_AUTO), (ASKING, TS), (MODERN, PY_AUTO),
              (EVERYTHING, PY_LEGACY), (EVERYTHING, PY_AUTO), (EVERYTHING, TS)]
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"


def _initialize_params(xfails: dict[tuple[str, str], str]) -> list[Any]:
    return [pytest.param(backend, client, id=f"{backend}/{client}",
                         marks=[pytest.mark.xfail(strict=True, reason=xfails[backend, client])]
                         if (backend, client) in xfails else [])
            for backend, client in INITIALIZE]


@pytest.mark.parametrize(("backend", "client"), _initialize_params({}))
def test_the_gateway_declares_at_least_the_backends_capabilities(backend: str, client: str, served: Served) -> None:
    direct, through = initialize_both_ways(backend, client, served)
    wanted = dict(direct["capabilities"])
    if TASKS_EXTENSION in (through["capabilities"].get("extensions") or {}):
        wanted.pop("tasks", None)  # 2025-11-25's tasks are the extension in 2026-07-28 (a py-auto client's revision)
    missing = _not_covered(wanted, through["capabilities"])
    assert not missing, f"the gateway does not declare the backend's {missing}: it declares {through['capabilities']}"


@pytest.mark.parametrize(("backend", "client"), _initialize_params({}))
def test_the_gateway_passes_on_the_backends_instructions(backend: str, client: str, served: Served) -> None:
    direct, through = initialize_both_ways(backend, client, served)
    assert through.get("instructions") == direct.get("instructions"), "the backend's instructions are not passed on"
