"""What a catalog lets a session advertise of its composite tools (``build_view``), and the
workflow counters. The calls themselves are covered over real backends in
tests/integration/test_composite_tools.py."""

from types import MappingProxyType

from vmcp_actors.backends import DiscoveredBackend
from vmcp_actors.config import AggregationConfig, ToolOverride, WorkloadToolsConfig
from vmcp_actors.core._catalog import build_catalog
from vmcp_actors.decorators._composite import WorkflowMetrics, build_view
from vmcp_actors.workflows import CompositeTool, OutputProperty, OutputSpec, Step

READ_ONLY = {"readOnlyHint": True, "openWorldHint": False, "idempotentHint": True}


def caps(name, tools):
    """``tools``: name -> annotations (or None)."""
    return DiscoveredBackend(
        backend=name,
        capabilities=MappingProxyType({"tools": {}}),
        tools=tuple({"name": tool, "inputSchema": {"type": "object"},
                     **({"annotations": annotations} if annotations is not None else {})}
                    for tool, annotations in tools.items()),
        resources=(), resource_templates=(), prompts=(),
    )


def composite(name="combo", *tools, annotations=None, output=None):
    steps = [Step(f"s{index}", tool) for index, tool in enumerate(tools or ("a.x",))]
    return CompositeTool(name, "a composite", {"type": "object", "properties": {}}, tuple(steps),
                         annotations=annotations, output=output)


def view_of(backends, composites, aggregation=None):
    aggregation = aggregation or AggregationConfig()
    return build_view(build_catalog(backends, {}, aggregation), composites, aggregation)


def test_a_composite_is_listed_after_the_backend_tools_with_its_parameters_as_input_schema():
    view = view_of({"a": caps("a", {"x": None})}, [composite()])
    assert [tool["name"] for tool in view.tools] == ["a_x", "combo"]
    assert view.tools[-1]["inputSchema"] == {"type": "object", "properties": {}}
    assert view.tools[-1]["description"] == "a composite"
    assert "outputSchema" not in view.tools[-1]
    assert set(view.advertised) == {"combo"}


def test_a_composite_whose_step_tool_is_missing_for_this_user_is_not_advertised():
    view = view_of({"a": caps("a", {"x": None})}, [composite("combo", "a.x", "b.y")])
    assert [tool["name"] for tool in view.tools] == ["a_x"]
    assert view.advertised == {}
    assert view.problems == ("composite tool 'combo' is not advertised: step 's1' calls 'b.y', "
                             "which this session's backends do not offer",)


def test_steps_resolve_by_advertised_name_dot_form_and_renamed_dot_form():
    aggregation = AggregationConfig(tools=(WorkloadToolsConfig("a", overrides={"x": ToolOverride(name="ex")}),))
    view = view_of({"a": caps("a", {"x": None, "y": None})},
                   [composite("combo", "a_ex", "a.x", "a.ex", "a.y")], aggregation)
    assert set(view.advertised) == {"combo"}
    assert {tool: target.route.original_name for tool, target in view.targets.items()} == \
        {"a_ex": "x", "a.x": "x", "a.ex": "x", "a.y": "y"}


def test_a_step_may_call_a_tool_the_filter_hides():
    aggregation = AggregationConfig(exclude_all_tools=True)
    view = view_of({"a": caps("a", {"x": None})}, [composite()], aggregation)
    assert set(view.advertised) == {"combo"}


def test_a_name_taken_by_an_advertised_backend_tool_keeps_the_composite_out():
    aggregation = AggregationConfig(conflict_resolution="manual")
    view = view_of({"a": caps("a", {"x": None, "combo": None})}, [composite()], aggregation)
    assert view.advertised == {}
    assert "backend 'a' advertises a tool with the same name" in view.problems[0]


def test_a_name_taken_only_by_a_hidden_backend_tool_is_free():
    aggregation = AggregationConfig(conflict_resolution="manual",
                                    tools=(WorkloadToolsConfig("a", filter=("x",)),))
    view = view_of({"a": caps("a", {"x": None, "combo": None})}, [composite()], aggregation)
    assert set(view.advertised) == {"combo"}


def test_annotations_are_derived_from_the_steps():
    safe = view_of({"a": caps("a", {"x": READ_ONLY, "y": READ_ONLY})}, [composite("combo", "a.x", "a.y")])
    assert safe.tools[-1]["annotations"] == {"readOnlyHint": True, "destructiveHint": False,
                                             "idempotentHint": True, "openWorldHint": False}
    mixed = view_of({"a": caps("a", {"x": READ_ONLY, "y": None})}, [composite("combo", "a.x", "a.y")])
    assert mixed.tools[-1]["annotations"] == {"readOnlyHint": False, "destructiveHint": True,
                                              "idempotentHint": False, "openWorldHint": True}


def test_annotation_overrides_count_as_the_step_tools_annotations():
    aggregation = AggregationConfig(tools=(WorkloadToolsConfig("a", overrides={"y": ToolOverride(annotations=READ_ONLY)}),))
    view = view_of({"a": caps("a", {"x": READ_ONLY, "y": None})}, [composite("combo", "a.x", "a.y")], aggregation)
    assert view.tools[-1]["annotations"]["readOnlyHint"] is True


def test_explicit_annotations_may_be_more_cautious_but_never_safer_than_the_steps():
    cautious = view_of({"a": caps("a", {"x": READ_ONLY})},
                       [composite(annotations={"readOnlyHint": False, "title": "Combo"})])
    assert cautious.tools[-1]["annotations"]["readOnlyHint"] is False
    assert cautious.tools[-1]["annotations"]["title"] == "Combo"
    bold = view_of({"a": caps("a", {"x": None})}, [composite(annotations={"readOnlyHint": True})])
    assert bold.advertised == {}
    assert "annotations.readOnlyHint is true, but step 's0' calls a tool whose readOnlyHint is false" \
        in bold.problems[0]


def test_an_output_spec_becomes_the_output_schema():
    output = OutputSpec({"title": OutputProperty("{{ steps.s0.output.text }}", type="string", description="t"),
                         "more": OutputProperty(properties={"n": OutputProperty("{{ 1 }}", type="integer")})},
                        required=("title",))
    view = view_of({"a": caps("a", {"x": None})}, [composite(output=output)])
    assert view.tools[-1]["outputSchema"] == {
        "type": "object",
        "properties": {"title": {"type": "string", "description": "t"},
                       "more": {"type": "object", "properties": {"n": {"type": "integer"}}}},
        "required": ["title"],
    }


def test_workflow_metrics_count_runs_outcomes_and_durations():
    metrics = WorkflowMetrics()
    for state, duration in (("completed", 0.5), ("failed", 1.5)):
        metrics.started("combo")
        metrics.finished({"composite": "combo", "state": state, "duration": duration,
                          "stepsStarted": 2, "stepsFailed": int(state == "failed")})
    metrics.started("combo")
    assert metrics.snapshot() == {"combo": {
        "runs": 3, "completed": 1, "failed": 1, "cancelled": 0, "running": 1,
        "durationSecondsTotal": 2.0, "durationSecondsMax": 1.5, "stepsStarted": 4, "stepsFailed": 1,
    }}
