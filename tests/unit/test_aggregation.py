from types import MappingProxyType

import pytest

from vmcp_actors.backends import DiscoveredBackend
from vmcp_actors.config import AggregationConfig
from vmcp_actors.core._catalog import build_catalog


def caps(name, tools=(), resources=(), templates=(), prompts=()):
    return DiscoveredBackend(
        backend=name,
        capabilities=MappingProxyType({"tools": {}, "resources": {}, "prompts": {}}),
        tools=tuple({"name": t, "inputSchema": {"type": "object"}} for t in tools),
        resources=tuple({"uri": u, "name": u} for u in resources),
        resource_templates=tuple({"uriTemplate": t, "name": t} for t in templates),
        prompts=tuple({"name": p} for p in prompts),
    )


def test_every_tool_is_prefixed_even_without_a_clash():
    catalog = build_catalog({"a": caps("a", ["x", "y"]), "b": caps("b", ["x"])}, {}, AggregationConfig())
    assert [t["name"] for t in catalog.tools] == ["a_x", "a_y", "b_x"]
    assert catalog.tool_routes["b_x"].backend == "b" and catalog.tool_routes["b_x"].original_name == "x"


def test_result_does_not_depend_on_the_order_backends_answered():
    one = build_catalog({"b": caps("b", ["x"]), "a": caps("a", ["x"])}, {}, AggregationConfig())
    two = build_catalog({"a": caps("a", ["x"]), "b": caps("b", ["x"])}, {}, AggregationConfig())
    assert one.tools == two.tools


def test_custom_and_fixed_prefix_formats():
    dotted = build_catalog({"a": caps("a", ["x"])}, {}, AggregationConfig(prefix_format="{workload}."))
    assert [t["name"] for t in dotted.tools] == ["a.x"]
    fixed = build_catalog({"a": caps("a", ["x"])}, {}, AggregationConfig(prefix_format="gw_"))
    assert [t["name"] for t in fixed.tools] == ["gw_x"]


def test_names_that_still_clash_after_prefixing_keep_the_first_backend_in_sorted_order():
    catalog = build_catalog(
        {"a": caps("a", ["b_c"]), "a_b": caps("a_b", ["c"])}, {}, AggregationConfig(prefix_format="{workload}_")
    )
    assert [t["name"] for t in catalog.tools] == ["a_b_c"]
    assert catalog.tool_routes["a_b_c"].backend == "a"


def test_invalid_tool_names_are_not_advertised(caplog):
    catalog = build_catalog({"a": caps("a", ["ok", "has space", "x" * 130])}, {}, AggregationConfig())
    assert [t["name"] for t in catalog.tools] == ["a_ok"]
    assert "not a valid MCP tool name" in caplog.text


@pytest.mark.parametrize(("strategy", "advertised"), [("prefix", ["b_ok"]), ("manual", ["ok", "a" * 128])])
def test_names_with_a_trailing_newline_or_too_long_are_not_advertised_and_are_reported(strategy, advertised):
    listed = ["ok", "echo\n", "a" * 128, "a" * 129, ""]
    catalog = build_catalog({"b": caps("b", listed)}, {}, AggregationConfig(conflict_resolution=strategy))
    assert [t["name"] for t in catalog.tools] == advertised
    assert not any("echo" in name for name in catalog.tool_routes)
    invalid = [problem for problem in catalog.problems if "not a valid MCP tool name" in problem]
    assert any(problem.startswith("tool 'echo\\n' of backend 'b'") for problem in invalid), catalog.problems
    assert any(problem.startswith(f"tool '{'a' * 129}' of backend 'b'") for problem in invalid), catalog.problems
    assert "backend 'b' lists a tool without a name; skipped" in catalog.problems


def test_the_advertised_tool_dicts_are_copies():
    backend = caps("a", ["x"])
    build_catalog({"a": backend}, {}, AggregationConfig())
    assert backend.tools[0]["name"] == "x"


def test_resources_are_deduplicated_by_uri_first_backend_in_sorted_order_wins():
    catalog = build_catalog(
        {"b": caps("b", resources=["r://shared", "r://b"]), "a": caps("a", resources=["r://shared"])}, {}, AggregationConfig()
    )
    assert [r["uri"] for r in catalog.resources] == ["r://shared", "r://b"]
    assert catalog.route_resource("r://shared") == "a"
    assert catalog.route_resource("r://b") == "b"


def test_uris_are_never_rewritten_and_templates_route_reads():
    catalog = build_catalog({"a": caps("a", templates=["file:///{path}"]), "b": caps("b", templates=["db://{table}/{id}"])},
                            {}, AggregationConfig())
    assert [t["uriTemplate"] for t in catalog.resource_templates] == ["file:///{path}", "db://{table}/{id}"]
    assert catalog.route_resource("db://users/7") == "b"
    assert catalog.route_resource("file:///notes") == "a"
    assert catalog.route_resource("nope://x") is None


def test_prompts_are_prefixed_like_tools():
    catalog = build_catalog({"a": caps("a", prompts=["greet"])}, {}, AggregationConfig())
    assert [p["name"] for p in catalog.prompts] == ["a_greet"]
    assert catalog.prompt_routes["a_greet"].original_name == "greet"


def test_a_catalog_without_backends_says_so():
    catalog = build_catalog({}, {"a": "down"}, AggregationConfig())
    assert not catalog.has_backends and catalog.failures["a"] == "down"


# -- overrides, strategies, prompts, internal resolution (issue 4) -------------------------

from vmcp_actors.config import ToolOverride, WorkloadToolsConfig  # noqa: E402
from vmcp_actors.core._catalog import advertised_name  # noqa: E402
from vmcp_actors.decorators._filter import AdvertisingFilter, is_advertised  # noqa: E402


def names(catalog):
    return [t["name"] for t in catalog.tools]


def agg(strategy="prefix", **kwargs):
    return AggregationConfig(conflict_resolution=strategy, **kwargs)


def workload(name, **kwargs):
    return WorkloadToolsConfig(workload=name, **kwargs)


def test_overrides_apply_before_prefixing_and_routes_keep_the_original_name():
    config = agg(tools=(workload("a", overrides={"x": ToolOverride(name="renamed", description="New")}),))
    catalog = build_catalog({"a": caps("a", ["x"])}, {}, config)
    assert names(catalog) == ["a_renamed"]
    assert catalog.tools[0]["description"] == "New"
    route = catalog.tool_routes["a_renamed"]
    assert (route.original_name, route.resolved_name) == ("x", "renamed")


def test_override_annotations_merge_over_the_backends():
    tool = {"name": "x", "annotations": {"readOnlyHint": True, "title": "X"}}
    backend = DiscoveredBackend("a", MappingProxyType({"tools": {}}), tools=(tool,))
    config = agg(tools=(workload("a", overrides={"x": ToolOverride(annotations={"readOnlyHint": False})}),))
    catalog = build_catalog({"a": backend}, {}, config)
    assert catalog.tools[0]["annotations"] == {"readOnlyHint": False, "title": "X"}


def test_priority_keeps_unique_names_bare_and_the_first_listed_backend_wins_a_clash():
    config = agg("priority", priority_order=("b", "a"))
    catalog = build_catalog({"a": caps("a", ["x", "only_a"]), "b": caps("b", ["x"])}, {}, config)
    assert sorted(names(catalog)) == ["only_a", "x"]
    assert catalog.tool_routes["x"].backend == "b"
    assert any("not advertised" in p for p in catalog.problems)


def test_priority_prefixes_clashing_tools_of_unlisted_backends():
    config = agg("priority", priority_order=("z",))
    catalog = build_catalog({"a": caps("a", ["x"]), "b": caps("b", ["x"])}, {}, config)
    assert names(catalog) == ["a_x", "b_x"]


def test_manual_keeps_names_bare_and_an_unresolved_clash_is_an_error_naming_backends_and_tools():
    catalog = build_catalog({"a": caps("a", ["x", "y"]), "b": caps("b", ["x"])}, {}, agg("manual"))
    assert len(catalog.errors) == 1
    assert "'x'" in catalog.errors[0] and "a (tool 'x')" in catalog.errors[0] and "b (tool 'x')" in catalog.errors[0]


def test_manual_clash_resolved_by_an_override():
    config = agg("manual", tools=(workload("b", overrides={"x": ToolOverride(name="b_x")}),))
    catalog = build_catalog({"a": caps("a", ["x"]), "b": caps("b", ["x"])}, {}, config)
    assert not catalog.errors and names(catalog) == ["x", "b_x"]
    assert catalog.tool_routes["b_x"].original_name == "x"


def test_a_rename_into_a_clash_is_a_clash():
    config = agg("manual", tools=(workload("b", overrides={"y": ToolOverride(name="x")}),))
    catalog = build_catalog({"a": caps("a", ["x"]), "b": caps("b", ["y"])}, {}, config)
    assert catalog.errors and "b (tool 'y')" in catalog.errors[0]


@pytest.mark.parametrize(("strategy", "expected"), [("prefix", "a_x"), ("priority", "x"), ("manual", "x")])
def test_the_catalog_and_the_config_name_an_unclashed_tool_by_one_rule(strategy, expected):
    config = agg(strategy, priority_order=("a",) if strategy == "priority" else ())
    assert advertised_name(config, "a", "x") == config.advertised_name("a", "x") == expected
    assert names(build_catalog({"a": caps("a", ["x"])}, {}, config)) == [expected]


def test_prompts_under_priority_keep_bare_names_for_listed_backends_only():
    config = agg("priority", priority_order=("a",))
    catalog = build_catalog({"a": caps("a", prompts=["p"]), "b": caps("b", prompts=["q"])}, {}, config)
    assert [p["name"] for p in catalog.prompts] == ["p", "b_q"]


def test_a_prompt_name_claimed_twice_is_dropped_for_every_claimant(caplog):
    catalog = build_catalog({"a": caps("a", prompts=["p", "own"]), "b": caps("b", prompts=["p"])}, {}, agg("manual"))
    assert [p["name"] for p in catalog.prompts] == ["own"]
    assert "claimed by backends a, b" in caplog.text


def test_internal_resolution_by_advertised_name_or_workload_dot_original_name():
    config = agg(tools=(workload("a", overrides={"x": ToolOverride(name="renamed")}),))
    catalog = build_catalog({"a": caps("a", ["x"])}, {}, config)
    assert catalog.resolve_internal("a_renamed").route.original_name == "x"
    assert catalog.resolve_internal("a.x").route.original_name == "x"
    assert catalog.resolve_internal("a.renamed").route.original_name == "x"  # the override's name works too
    assert catalog.resolve_internal(".x") is None
    assert catalog.resolve_internal("nope.x") is None


def test_tools_that_lost_a_clash_stay_reachable_internally():
    config = agg("priority", priority_order=("b",))
    catalog = build_catalog({"a": caps("a", ["x"]), "b": caps("b", ["x"])}, {}, config)
    loser = catalog.resolve_internal("a.x")
    assert loser is not None and loser.advertised_as is None and loser.definition["inputSchema"] == {"type": "object"}


def test_an_exact_routing_table_key_wins_over_the_dot_form():
    catalog = build_catalog({"a": caps("a", ["b.c"]), "b": caps("b", ["c"])}, {}, agg("manual"))
    assert catalog.resolve_internal("b.c").route.backend == "a"  # the advertised name 'b.c'


@pytest.mark.parametrize(
    "config, visible",
    [
        (agg(), {"a_x", "a_y", "b_x"}),
        (agg(tools=(workload("a", filter=("y",)),)), {"a_y", "b_x"}),
        (agg(tools=(workload("a", exclude_all=True),)), {"b_x"}),
        (agg(exclude_all_tools=True), set()),
        (agg(tools=(workload("a", filter=("z",), overrides={"x": ToolOverride(name="z")}),)), {"a_z", "b_x"}),
    ],
)
def test_the_filter_matches_post_override_pre_prefix_names_and_list_and_lookup_agree(config, visible):
    catalog = build_catalog({"a": caps("a", ["x", "y"]), "b": caps("b", ["x"])}, {}, config)
    advertised = {name for name, route in catalog.tool_routes.items() if is_advertised(config, route)}
    assert advertised == visible


class _Inner:
    def __init__(self, catalog):
        self.catalog = catalog
        self.called = []

    def list_tools(self, identity, deadline):
        return self.catalog.tools

    def lookup_tool(self, identity, name, deadline):
        return self.catalog.tool_routes.get(name)

    def call_tool(self, identity, name, arguments, meta, deadline):
        self.called.append(name)
        return iter(())


def test_hidden_tools_are_neither_listed_nor_callable_through_the_filter():
    from vmcp_actors.concurrency import Deadline
    from vmcp_actors.protocol import INVALID_PARAMS, JsonRpcError

    config = agg(tools=(workload("a", exclude_all=True),))
    inner = _Inner(build_catalog({"a": caps("a", ["x"]), "b": caps("b", ["x"])}, {}, config))
    advertised = AdvertisingFilter(inner, config)
    deadline = Deadline.after(5)
    assert [t["name"] for t in advertised.list_tools(None, deadline)] == ["b_x"]
    with pytest.raises(JsonRpcError) as caught:
        advertised.call_tool(None, "a_x", {}, None, deadline)
    assert caught.value.code == INVALID_PARAMS and caught.value.message == "Unknown tool: a_x"
    assert inner.called == []
    advertised.call_tool(None, "b_x", {}, None, deadline)
    assert inner.called == ["b_x"]
