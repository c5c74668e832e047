"""One view per request: a published catalog is read without asking the UserActor, each
layer derives what it needs from the list below once per list, and ``describe_tool``
agrees with ``list_tools`` in every layer of the real stack."""

from __future__ import annotations

from collections import Counter
from types import MappingProxyType

import pytest

from tests.memory_core import MemoryCore, soon, tool
from vmcp_actors.backends import DiscoveredBackend
from vmcp_actors.concurrency import resolved
from vmcp_actors.config import (
    AggregationConfig,
    AuthzConfig,
    WorkloadToolsConfig,
    config_from_mapping,
)
from vmcp_actors.core import Layer
from vmcp_actors.core import _aggregated as aggregated_module
from vmcp_actors.core._aggregated import (
    AggregatedBackends,
    BackendsMissing,
    CatalogBoard,
    ConflictingNames,
    NoBackendsAvailable,
)
from vmcp_actors.core._catalog import build_catalog
from vmcp_actors.decorators import (
    CALL_TOOL,
    FIND_TOOL,
    AdvertisingFilter,
    CedarAuthz,
    CedarPolicies,
    CompositeTools,
    SubtractOnly,
    ToolOptimizer,
    stack,
)
from vmcp_actors.decorators import _composite as composite_module
from vmcp_actors.decorators import _optimizer as optimizer_module

DOWN = {"down": "backend 'down': discovery failed: connection refused"}


def caps(name: str, *tools: str) -> DiscoveredBackend:
    return DiscoveredBackend(backend=name, capabilities=MappingProxyType({"tools": {}}),
                               tools=tuple({"name": t, "description": f"{name} {t}",
                                            "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}}}
                                           for t in tools),
                               resources=(), resource_templates=(), prompts=())


class _Answer:
    """What a proxy call returns, answered at once."""

    def __init__(self, value):
        self._value = value

    def get(self, timeout=None):
        return self._value


class FakeUser:
    """Stands for the UserActor's proxy: counts every message sent to it."""

    def __init__(self, board: CatalogBoard):
        self.board = board
        self.messages: Counter[str] = Counter()

    def catalog(self, identity):
        self.messages["catalog"] += 1
        return _Answer(self.board.current)

    def catalog_so_far(self):
        self.messages["catalog_so_far"] += 1
        return _Answer(None)

    def retry_failed(self, identity):
        self.messages["retry_failed"] += 1
        return _Answer(None)


def published(catalog) -> tuple[CatalogBoard, FakeUser]:
    board = CatalogBoard()
    board.publish(resolved(catalog))
    return board, FakeUser(board)


@pytest.fixture
def remind_once(monkeypatch):
    monkeypatch.setattr(aggregated_module, "REMIND_RETRY_EVERY", 3600.0, raising=False)


# -- AggregatedBackends reads the board -----------------------------------------------------------------------


def test_a_catalog_missing_a_backend_is_read_without_asking_and_reminds_the_user_once(remind_once):
    catalog = build_catalog({"up": caps("up", *(f"t{i}" for i in range(30)))}, DOWN, AggregationConfig())
    board, user = published(catalog)
    backends = AggregatedBackends(user, {}, board)
    listed = backends.list_tools(None, soon())
    for tool_def in listed:
        assert backends.lookup_tool(None, tool_def["name"], soon()) is not None
    assert user.messages == {"retry_failed": 1}  # told, never asked; once per interval
    assert [backends.describe_tool(None, t["name"], soon()) for t in listed] == list(listed)


def test_the_reminder_comes_again_after_its_interval(monkeypatch):
    monkeypatch.setattr(aggregated_module, "REMIND_RETRY_EVERY", 0.0, raising=False)
    board, user = published(build_catalog({"up": caps("up", "x")}, DOWN, AggregationConfig()))
    backends = AggregatedBackends(user, {}, board)
    for _ in range(3):
        backends.list_tools(None, soon())
    assert user.messages == {"retry_failed": 3}


def test_a_complete_catalog_sends_no_message_at_all():
    board, user = published(build_catalog({"up": caps("up", "x", "y")}, {}, AggregationConfig()))
    backends = AggregatedBackends(user, {}, board)
    for _ in range(5):
        backends.lookup_tool(None, "up_x", soon())
    assert user.messages == {}


def test_conflicts_and_partial_failure_mode_fail_keep_their_errors_from_the_board(remind_once):
    clash = build_catalog({"a": caps("a", "x"), "b": caps("b", "x")}, {},
                          AggregationConfig(conflict_resolution="manual"))
    board, user = published(clash)
    with pytest.raises(ConflictingNames):
        AggregatedBackends(user, {}, board).list_tools(None, soon())
    board, user = published(build_catalog({"up": caps("up", "x")}, DOWN, AggregationConfig()))
    with pytest.raises(BackendsMissing):
        AggregatedBackends(user, {}, board, fail_on_partial=True).lookup_tool(None, "up_x", soon())
    assert user.messages == {"retry_failed": 1}  # still retried in the background
    assert "catalog" not in user.messages


def test_before_a_usable_catalog_is_published_the_user_is_asked():
    board = CatalogBoard()
    user = FakeUser(board)
    board.publish(resolved(build_catalog({}, DOWN, AggregationConfig())))  # nothing discovered: not usable
    with pytest.raises(NoBackendsAvailable):
        AggregatedBackends(user, {}, board).list_tools(None, soon())
    assert user.messages["catalog"] == 1


# -- each layer derives from a list once ------------------------------------------------------------------------


class SpyCore(MemoryCore):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked: Counter[str] = Counter()

    def list_tools(self, identity, deadline):
        self.asked["list_tools"] += 1
        return super().list_tools(identity, deadline)

    def lookup_tool(self, identity, name, deadline):
        self.asked["lookup_tool"] += 1
        return super().lookup_tool(identity, name, deadline)


TOOLS = tuple(tool(f"t{i}", read_only=i % 2 == 0) for i in range(12))


def test_the_filter_asks_the_layer_below_about_each_tool_once_per_list():
    core = SpyCore(TOOLS)
    layer = AdvertisingFilter(core, AggregationConfig(tools=(WorkloadToolsConfig("memory", filter=("t1", "t2")),)))
    first = layer.list_tools(None, soon())
    for _ in range(3):
        assert layer.list_tools(None, soon()) is first
        assert layer.describe_tool(None, "t1", soon()) is TOOLS[1]
    assert [t["name"] for t in first] == ["t1", "t2"]
    assert core.asked["lookup_tool"] == len(TOOLS)


def test_cedar_decides_each_tool_once_per_list_and_principal():
    core = SpyCore(TOOLS)
    policies = CedarPolicies(AuthzConfig(policies=(
        'permit(principal, action == Action::"call_tool", resource) when { resource.readOnlyHint == true };',)))
    decided = Counter()
    decide = policies.decide

    def counted(*args, **kwargs):
        decided["decide"] += 1
        return decide(*args, **kwargs)

    policies.decide = counted  # type: ignore[method-assign]
    layer = CedarAuthz(core, policies)
    first = layer.list_tools(None, soon())
    for _ in range(3):
        assert layer.list_tools(None, soon()) is first
        assert layer.describe_tool(None, "t0", soon()) is TOOLS[0]
        assert layer.describe_tool(None, "t1", soon()) is None
        assert layer.lookup_tool(None, "t0", soon()) is not None
    assert decided["decide"] == len(TOOLS)


class FreshLists(Layer):
    """An embedder's layer that builds a new list on every call (hides t3)."""

    def list_tools(self, identity, deadline):
        return tuple(t for t in self.inner.list_tools(identity, deadline) if t["name"] != "t3")

    def lookup_tool(self, identity, name, deadline):
        return None if name == "t3" else self.inner.lookup_tool(identity, name, deadline)


def test_the_guard_answers_the_same_list_while_nothing_changed_so_the_optimizer_indexes_once(monkeypatch):
    built = Counter()
    index_class = optimizer_module.ToolIndex

    class CountedIndex(index_class):  # type: ignore[misc,valid-type]
        def __init__(self, tools):
            built["index"] += 1
            super().__init__(tools)

    monkeypatch.setattr(optimizer_module, "ToolIndex", CountedIndex)
    core = SpyCore(TOOLS)
    guard = SubtractOnly(FreshLists(core), core)
    first = guard.list_tools(None, soon())
    assert guard.list_tools(None, soon()) is first and "t3" not in [t["name"] for t in first]
    optimizer = ToolOptimizer(guard, 3)
    for _ in range(3):
        optimizer.find(None, "t5", "", soon())
    assert built["index"] == 1


def test_composites_build_one_view_per_catalog(monkeypatch, remind_once):
    built = Counter()
    build_view = composite_module.build_view

    def counted(*args, **kwargs):
        built["view"] += 1
        return build_view(*args, **kwargs)

    monkeypatch.setattr(composite_module, "build_view", counted)
    config = config_from_mapping({"name": "x", "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}],
                                  "compositeTools": [{"name": "combo", "description": "both",
                                                      "parameters": {"type": "object", "properties": {}},
                                                      "steps": [{"id": "s", "tool": "a.x"}]}]})
    board, user = published(build_catalog({"a": caps("a", "x", "y")}, DOWN, config.aggregation))
    layer = CompositeTools(AggregatedBackends(user, {}, board), config.composite_tools, config.aggregation)
    first = layer.list_tools(None, soon())
    for name in ("a_x", "a_y", "combo", "nope"):
        assert layer.list_tools(None, soon()) is first
        layer.describe_tool(None, name, soon())
        layer.lookup_tool(None, name, soon())
    assert built["view"] == 1
    assert user.messages == {"retry_failed": 1}


# -- describe_tool agrees with list_tools in every layer -------------------------------------------------------


class HidesB(Layer):
    """An embedder's layer: no tool of backend b."""

    def list_tools(self, identity, deadline):
        return tuple(t for t in self.inner.list_tools(identity, deadline) if not t["name"].startswith("b_"))

    def lookup_tool(self, identity, name, deadline):
        return None if name.startswith("b_") else self.inner.lookup_tool(identity, name, deadline)


def test_describe_tool_agrees_with_list_tools_in_every_layer_of_the_stack(remind_once):
    config = config_from_mapping({
        "name": "x",
        "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}, {"name": "b", "url": "http://127.0.0.1:2/mcp"}],
        "aggregation": {"tools": [{"workload": "a", "filter": ["x", "y", "w"]}]},  # hides a_z
        "compositeTools": [{"name": "combo", "description": "both", "parameters": {"type": "object", "properties": {}},
                            "steps": [{"id": "s", "tool": "a.z"}]}],
        "incomingAuth": {"authz": {"type": "cedar", "policies": [
            'permit(principal, action == Action::"call_tool", resource) unless { resource.name == "a_y" };']}},
        "optimizer": {"maxToolsToReturn": 5},
    })
    catalog = build_catalog({"a": caps("a", "x", "y", "z", "w"), "b": caps("b", "v")}, DOWN, config.aggregation)
    board, user = published(catalog)
    outermost, _ = stack(config, [HidesB]).build(AggregatedBackends(user, {}, board), {})
    names = ("a_x", "a_y", "a_z", "a_w", "b_v", "combo", FIND_TOOL, CALL_TOOL, "nope")
    seen: dict[str, set[str]] = {}
    layer = outermost
    while True:
        listed = layer.list_tools(None, soon())
        for name in names:
            expected = next((t for t in listed if t["name"] == name), None)
            assert layer.describe_tool(None, name, soon()) is expected, (type(layer).__name__, name)
        seen[type(layer).__name__] = {name for name in names if layer.describe_tool(None, name, soon()) is not None}
        if isinstance(layer, AggregatedBackends):
            break
        layer = layer._inner
    assert seen == {
        "ToolOptimizer": {FIND_TOOL, CALL_TOOL},
        "SubtractOnly": {"a_x", "a_w", "combo"},  # the embedder's layer hides b_v
        "CedarAuthz": {"a_x", "a_w", "b_v", "combo"},  # a_y denied
        "AdvertisingFilter": {"a_x", "a_y", "a_w", "b_v", "combo"},  # a_z hidden
        "CompositeTools": {"a_x", "a_y", "a_z", "a_w", "b_v", "combo"},
        "AggregatedBackends": {"a_x", "a_y", "a_z", "a_w", "b_v"},
    }
    assert outermost.describe_tool(None, FIND_TOOL, soon())["inputSchema"]["required"] == ["tool_description"]
    assert user.messages == {"retry_failed": 1}


def test_a_hidden_backend_tool_whose_name_a_composite_takes_is_listed_once_as_the_composite(remind_once):
    config = config_from_mapping({
        "name": "x", "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}],
        "aggregation": {"conflictResolution": "manual", "tools": [{"workload": "a", "filter": ["x"]}]},
        "compositeTools": [{"name": "combo", "description": "the composite",
                            "parameters": {"type": "object", "properties": {}}, "steps": [{"id": "s", "tool": "a.x"}]}],
    })
    board, user = published(build_catalog({"a": caps("a", "x", "combo")}, {}, config.aggregation))
    outermost, _ = stack(config).build(AggregatedBackends(user, {}, board), {})
    combos = [t for t in outermost.list_tools(None, soon()) if t["name"] == "combo"]
    assert [t["description"] for t in combos] == ["the composite"]
    assert outermost.describe_tool(None, "combo", soon()) is combos[0]
    assert outermost.lookup_tool(None, "combo", soon()).composite
