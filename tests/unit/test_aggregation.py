from types import MappingProxyType

from vmcp_actors.backends import BackendCapabilities
from vmcp_actors.config import AggregationConfig
from vmcp_actors.sessions import build_catalog


def caps(name, tools=(), resources=(), templates=(), prompts=()):
    return BackendCapabilities(
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
