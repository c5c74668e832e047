"""Unit tests for the compositeTools section: YAML -> workflows.CompositeTool, every problem
as one ``path: message`` line."""

from __future__ import annotations

import datetime
import textwrap
from pathlib import Path
from typing import Any

import pytest

from vmcp_actors.config import (
    VmcpConfig,
    config_from_mapping,
    config_warnings,
    load_config,
)
from vmcp_actors.exceptions import ConfigError
from vmcp_actors.workflows import (
    CompositeTool,
    ForEach,
    OnError,
    OutputProperty,
    OutputSpec,
    Step,
)

DESIGN_EXAMPLE = """\
name: engineering
backends:
  - {name: github, url: http://127.0.0.1:8081/mcp, transport: streamable-http}
  - {name: jira,   url: https://jira-mcp.example.com/mcp}
compositeTools:
  - name: triage_issue
    description: Fetch an issue and search related tickets
    parameters: {type: object, properties: {issue: {type: integer}}, required: [issue]}
    steps:
      - {id: fetch, tool: github.get_issue, arguments: {number: "{{ params.issue }}"}}
      - {id: related, tool: jira.search, dependsOn: [fetch],
         arguments: {query: "{{ steps.fetch.output.title }}", limit: "5"}}
"""


def minimal(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "engineering",
        "backends": [
            {"name": "github", "url": "http://127.0.0.1:8081/mcp"},
            {"name": "jira", "url": "http://127.0.0.1:8082/mcp"},
        ],
    }
    data.update(overrides)
    return data


def step(**fields: Any) -> dict[str, Any]:
    return {"id": "fetch", "tool": "github.get_issue", **fields}


def composite(**fields: Any) -> dict[str, Any]:
    return {"name": "triage", "description": "Triage an issue", "steps": [step()], **fields}


def for_each(**fields: Any) -> dict[str, Any]:
    return {
        "id": "each",
        "type": "forEach",
        "collection": "{{ params.tickets }}",
        "step": {"tool": "jira.tag", "arguments": {"id": "{{ forEach.item }}"}},
        **fields,
    }


def load(*composites: dict[str, Any], **config: Any) -> VmcpConfig:
    return config_from_mapping(minimal(compositeTools=list(composites), **config))


def errors_of(*composites: Any, **config: Any) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(minimal(compositeTools=list(composites), **config))
    return info.value.errors


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "vmcp.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


# --- loading ----------------------------------------------------------------------------


def test_design_example_loads_into_composite_tool_dataclasses_with_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, DESIGN_EXAMPLE))

    assert config.composite_tools == (
        CompositeTool(
            name="triage_issue",
            description="Fetch an issue and search related tickets",
            parameters={"type": "object", "properties": {"issue": {"type": "integer"}}, "required": ["issue"]},
            steps=(
                Step(id="fetch", tool="github.get_issue", arguments={"number": "{{ params.issue }}"}),
                Step(
                    id="related",
                    tool="jira.search",
                    arguments={"query": "{{ steps.fetch.output.title }}", "limit": "5"},
                    depends_on=("fetch",),
                ),
            ),
        ),
    )
    tool = config.composite_tools[0]
    assert tool.timeout == 1800.0
    assert tool.max_parallel == 10
    assert tool.output is None and tool.annotations is None
    assert all(s.timeout == 300.0 and s.on_error == OnError("abort", 0, 1.0) for s in tool.steps)
    assert all(s.type == "tool" and s.for_each is None and s.condition is None for s in tool.steps)


def test_config_without_composite_tools_has_none() -> None:
    assert config_from_mapping(minimal()).composite_tools == ()
    assert load().composite_tools == ()


def test_toolhive_go_template_form_loads() -> None:
    (tool,) = load(composite(
        parameters={"type": "object", "properties": {"issue": {"type": "integer"}}},
        steps=[
            step(arguments={"number": "{{.params.issue}}"}),
            step(id="related", tool="jira.search", dependsOn=["fetch"],
                 arguments={"query": "{{.steps.fetch.output.title}}"}, condition="{{.params.issue}}"),
        ],
    )).composite_tools
    assert tool.steps[1].arguments == {"query": "{{.steps.fetch.output.title}}"}
    assert tool.steps[1].condition == "{{.params.issue}}"


def test_every_setting_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, """\
        name: engineering
        backends: [{name: github, url: http://127.0.0.1:8081/mcp}, {name: notes, url: http://127.0.0.1:8083/mcp}]
        compositeTools:
          - name: triage-2
            description: Fetch an issue
            parameters:
              type: object
              properties: {issue: {type: integer, description: The issue, default: 1}, go: {type: [boolean, "null"]}}
              required: [issue]
            timeout: 10m
            maxParallel: 4
            annotations: {title: Triage, readOnlyHint: false, destructiveHint: true, idempotentHint: false,
                          openWorldHint: true}
            steps:
              - id: fetch
                tool: github.get_issue
                arguments: {number: "{{ params.issue }}", nested: {list: ["{{ params.issue }}", 3, null, 1.5]}}
                condition: "{{ params.go }}"
                onError: {action: retry, retryCount: 5, retryDelay: 250ms}
                timeout: 1m30s
                defaultResults: {title: none, items: []}
              - id: note
                tool: notes.add
                dependsOn: [fetch]
                onError: {action: continue}
                defaultResults: null
        """))
    (tool,) = config.composite_tools
    assert tool.name == "triage-2"
    assert tool.timeout == 600.0
    assert tool.max_parallel == 4
    assert tool.annotations == {"title": "Triage", "readOnlyHint": False, "destructiveHint": True,
                                "idempotentHint": False, "openWorldHint": True}
    assert tool.parameters["properties"]["go"] == {"type": ["boolean", "null"]}
    assert tool.steps[0] == Step(
        id="fetch",
        tool="github.get_issue",
        arguments={"number": "{{ params.issue }}", "nested": {"list": ["{{ params.issue }}", 3, None, 1.5]}},
        condition="{{ params.go }}",
        on_error=OnError("retry", retry_count=5, retry_delay=0.25),
        timeout=90.0,
        default_results={"title": "none", "items": []},
    )
    assert tool.steps[1] == Step(id="note", tool="notes.add", arguments={}, depends_on=("fetch",),
                                 on_error=OnError("continue"))


def test_retry_defaults_to_three_attempts_one_second_apart_and_zero_delay_is_allowed() -> None:
    (tool,) = load(composite(steps=[
        step(onError={"action": "retry"}),
        step(id="b", onError={"action": "retry", "retryDelay": "0"}),
        step(id="c", onError={"action": "retry", "retryCount": 1, "retryDelay": "0s"}),
        step(id="d", onError={}),
    ])).composite_tools
    assert [s.on_error for s in tool.steps] == [
        OnError("retry", 3, 1.0), OnError("retry", 3, 0.0), OnError("retry", 1, 0.0), OnError("abort", 0, 1.0),
    ]


def test_for_each_step_loads_its_inner_tool_and_the_iteration_settings() -> None:
    (tool,) = load(composite(
        parameters={"type": "object", "properties": {"tickets": {"type": "array"}}},
        steps=[
            for_each(),
            for_each(id="tuned", itemVar="ticket", maxParallel=5, maxIterations=1000, dependsOn=["each"],
                     step={"tool": "jira.tag", "arguments": {"id": "{{ forEach.ticket.id }}"}},
                     onError={"action": "continue"}, timeout="10s", defaultResults=[]),
            for_each(id="bare", step={"tool": "jira.ping"}),
        ],
    )).composite_tools
    assert tool.steps[0] == Step(
        id="each",
        tool="jira.tag",
        arguments={"id": "{{ forEach.item }}"},
        type="forEach",
        for_each=ForEach(collection="{{ params.tickets }}", item_var="item", max_parallel=10, max_iterations=100),
    )
    assert tool.steps[1].for_each == ForEach("{{ params.tickets }}", "ticket", 5, 1000)
    assert tool.steps[1].arguments == {"id": "{{ forEach.ticket.id }}"}
    assert (tool.steps[1].on_error, tool.steps[1].timeout, tool.steps[1].default_results) == \
        (OnError("continue"), 10.0, [])
    assert tool.steps[2].arguments == {}


def test_output_with_nested_properties_loads() -> None:
    (tool,) = load(composite(output={
        "properties": {
            "summary": {"type": "string", "description": "One line", "value": "{{ steps.fetch.output.text }}",
                        "default": "n/a"},
            "details": {"type": "object", "properties": {
                "count": {"type": "integer", "value": "{{ steps.fetch.output.count }}"},
                "deeper": {"properties": {"raw": {"value": "{{ steps.fetch.output }}"}}},
            }},
        },
        "required": ["summary"],
    })).composite_tools
    assert tool.output == OutputSpec(
        properties={
            "summary": OutputProperty(value="{{ steps.fetch.output.text }}", default="n/a", type="string",
                                      description="One line"),
            "details": OutputProperty(type="object", properties={
                "count": OutputProperty(value="{{ steps.fetch.output.count }}", type="integer"),
                "deeper": OutputProperty(properties={"raw": OutputProperty(value="{{ steps.fetch.output }}")}),
            }),
        },
        required=("summary",),
    )


def test_parameters_default_to_an_empty_object_schema() -> None:
    (tool,) = load(composite()).composite_tools
    assert tool.parameters == {"type": "object", "properties": {}}


def test_null_annotations_and_output_mean_none() -> None:
    (tool,) = load(composite(annotations=None, output=None)).composite_tools
    assert (tool.annotations, tool.output) == (None, None)


def test_loaded_definitions_share_nothing_with_the_input_and_the_config_still_hashes() -> None:
    arguments = {"number": "{{ params.issue }}", "labels": ["a"]}
    data = minimal(compositeTools=[composite(steps=[step(arguments=arguments)])])
    config = config_from_mapping(data)
    arguments["labels"].append("b")

    assert config.composite_tools[0].steps[0].arguments == {"number": "{{ params.issue }}", "labels": ["a"]}
    assert isinstance(config.composite_tools, tuple)
    assert hash(config) == hash(config_from_mapping(minimal(compositeTools=[composite()])))


# --- one bad field, one line with its path -----------------------------------------------

INDEX = "must be an MCP tool name without dots: 1-128 letters, digits, '_' or '-'"
TYPES = "must be one of null, boolean, integer, number, string, array, object (or a list of them)"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"name": None}, "name: must not be null"),
        ({"name": "github.triage"}, f"name: {INDEX}"),
        ({"name": ""}, f"name: {INDEX}"),
        ({"name": "x" * 129}, f"name: {INDEX}"),
        ({"description": "  "}, "description: must not be empty"),
        ({"description": 3}, "description: must be a string"),
        ({"timeout": 30}, "timeout: invalid duration 30: durations need a unit, e.g. 30s"),
        ({"timeout": "0s"}, "timeout: invalid duration '0s': must be greater than 0"),
        ({"maxParallel": 0}, "maxParallel: must be at least 1"),
        ({"maxParallel": "2"}, "maxParallel: must be an integer"),
        ({"annotations": {"readOnly": True}}, "annotations.readOnly: unknown annotation (MCP tool annotations are "
                                              "title, readOnlyHint, destructiveHint, idempotentHint, openWorldHint)"),
        ({"annotations": {"readOnlyHint": "yes"}}, "annotations.readOnlyHint: must be true or false"),
        ({"annotations": {"title": 3}}, "annotations.title: must be a string"),
        ({"annotations": []}, "annotations: must be a mapping"),
        ({"steps": []}, "steps: must list at least one step"),
        ({"steps": {"id": "a"}}, "steps: must be a list"),
        ({"failureMode": "abort"}, "failureMode: unknown field"),
        ({"output": {}}, "output.properties: is required"),
        ({"output": {"properties": {}}}, "output.properties: must define at least one property"),
        ({"output": {"properties": []}}, "output.properties: must be a mapping of property name to property"),
        ({"output": {"properties": {"": {"value": "x"}}}}, "output.properties: property names must not be empty"),
        ({"output": {"properties": {"a": {"type": "string"}}}},
         "output.properties.a: needs a value (a template) or nested properties"),
        ({"output": {"properties": {"a": {"value": "x", "properties": {"b": {"value": "y"}}}}}},
         "output.properties.a: has a value or nested properties, not both"),
        ({"output": {"properties": {"a": {"type": "string", "properties": {"b": {"value": "y"}}}}}},
         "output.properties.a.properties: only an object has nested properties (type is string)"),
        ({"output": {"properties": {"a": {"properties": {"b": {"value": 3}}}}}},
         "output.properties.a.properties.b.value: must be a string"),
        ({"output": {"properties": {"a": {"type": "date", "value": "x"}}}},
         "output.properties.a.type: must be one of string, integer, number, boolean, object, array"),
        ({"output": {"properties": {"a": {"value": "x", "default": datetime.date(2024, 1, 1)}}}},
         "output.properties.a.default: must be a JSON value (string, finite number, boolean, null, list, "
         "mapping with string keys)"),
        ({"output": {"properties": {"a": {"value": "x", "format": "uri"}}}}, "output.properties.a.format: unknown field"),
        ({"output": {"properties": {"a": {"value": "x"}}, "required": "a"}}, "output.required: must be a list"),
    ],
)
def test_bad_composite_field_is_reported_at_its_path(fields: dict[str, Any], expected: str) -> None:
    assert errors_of(composite(**fields)) == (f"compositeTools[0].{expected}",)


def test_required_composite_fields() -> None:
    assert errors_of({}) == (
        "compositeTools[0].description: is required",
        "compositeTools[0].name: is required",
        "compositeTools[0].steps: is required",
    )
    assert errors_of("triage") == ("compositeTools[0]: must be a mapping",)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"id": None}, "id: must not be null"),
        ({"id": "fetch issue"}, "id: must be 1-64 letters, digits, '_' or '-'"),
        ({"id": "x" * 65}, "id: must be 1-64 letters, digits, '_' or '-'"),
        ({"type": "loop"}, "type: must be one of tool, forEach, elicitation"),
        ({"tool": "github get_issue"}, "tool: must be an MCP tool name: 1-128 letters, digits, '_', '-' or '.'"),
        ({"tool": None}, "tool: must not be null"),
        ({"arguments": ["x"]}, "arguments: must be a mapping"),
        ({"arguments": {"when": datetime.date(2024, 1, 1)}},
         "arguments.when: must be a JSON value (string, finite number, boolean, null, list, mapping with string keys)"),
        ({"arguments": {"n": float("inf")}},
         "arguments.n: must be a JSON value (string, finite number, boolean, null, list, mapping with string keys)"),
        ({"dependsOn": "other"}, "dependsOn: must be a list"),
        ({"dependsOn": [3]}, "dependsOn[0]: must be a string"),
        ({"condition": "maybe"}, 'condition: must be a template that renders to true or false, e.g. "{{ params.go }}"'),
        ({"condition": True}, "condition: must be a string"),
        ({"onError": {"action": "ignore"}}, "onError.action: must be one of abort, continue, retry"),
        ({"onError": {"action": "retry", "retryCount": 0}}, "onError.retryCount: must be between 1 and 10"),
        ({"onError": {"action": "retry", "retryCount": 11}}, "onError.retryCount: must be between 1 and 10"),
        ({"onError": {"action": "retry", "retryCount": "3"}}, "onError.retryCount: must be an integer"),
        ({"onError": {"action": "retry", "retryDelay": "-1s"}},
         "onError.retryDelay: invalid duration '-1s': must not be negative (use e.g. 500ms, 30s, 2m)"),
        ({"onError": {"retryCount": 2}}, "onError.retryCount: only used with action retry (action is abort)"),
        ({"onError": {"action": "continue", "retryDelay": "1s"}},
         "onError.retryDelay: only used with action retry (action is continue)"),
        ({"onError": {"action": "retry", "backoff": "2x"}}, "onError.backoff: unknown field"),
        ({"timeout": "0"}, "timeout: invalid duration '0': durations need a unit, e.g. 30s"),
        ({"timeout": "soon"}, "timeout: invalid duration 'soon' (use e.g. 500ms, 30s, 2m)"),
        ({"defaultResults": {1.5: "x"}},
         "defaultResults: must be a JSON value (string, finite number, boolean, null, list, mapping with string keys)"),
        ({"depends_on": ["x"]}, "depends_on: unknown field"),
        ({"message": "Proceed?"}, "message: only for type elicitation"),
        ({"schema": {"type": "object", "properties": {"a": {"type": "string"}}}}, "schema: only for type elicitation"),
        ({"onDecline": {"action": "abort"}}, "onDecline: only for type elicitation"),
        ({"collection": "{{ params.x }}"}, "collection: only for type forEach"),
        ({"itemVar": "x"}, "itemVar: only for type forEach"),
        ({"maxParallel": 2}, "maxParallel: only for type forEach"),
        ({"maxIterations": 2}, "maxIterations: only for type forEach"),
        ({"step": {"tool": "a"}}, "step: only for type forEach"),
    ],
)
def test_bad_step_field_is_reported_at_its_path(fields: dict[str, Any], expected: str) -> None:
    assert errors_of(composite(steps=[step(**fields)])) == (f"compositeTools[0].steps[0].{expected}",)


CONFIRM_SCHEMA = {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]}


def elicitation_step(**fields: Any) -> dict[str, Any]:
    return {"id": "confirm", "type": "elicitation", "message": "Go on?", "schema": CONFIRM_SCHEMA, **fields}


def test_an_elicitation_step_loads_with_toolhive_fields() -> None:
    loaded = load(composite(steps=[
        elicitation_step(timeout="2m", onDecline={"action": "skip_remaining"}, onCancel={"action": "continue"}),
        step(dependsOn=["confirm"], condition="{{ steps.confirm.output.content.confirm }}"),
    ]))
    confirm = loaded.composite_tools[0].steps[0]
    assert (confirm.type, confirm.tool, confirm.message, confirm.timeout) == ("elicitation", None, "Go on?", 120.0)
    assert (confirm.on_decline, confirm.on_cancel) == ("skip_remaining", "continue")
    assert confirm.elicitation_schema == CONFIRM_SCHEMA
    defaults = load(composite(steps=[elicitation_step()])).composite_tools[0].steps[0]
    assert (defaults.on_decline, defaults.on_cancel, defaults.timeout) == ("abort", "abort", 300.0)


def test_toolhives_elicitation_example_loads() -> None:
    """The steps of ToolHive's examples/operator/virtual-mcps/composite_tool_with_elicitations.yaml,
    as its own vMCP config takes them."""
    loaded = load(composite(steps=[
        step(id="build_app"),
        {"id": "confirm_deployment", "type": "elicitation",
         "message": "Application built successfully. Do you want to proceed with deployment?",
         "schema": {"type": "object", "properties": {"proceed": {"type": "boolean", "description": "Confirm"}},
                    "required": ["proceed"]},
         "dependsOn": ["build_app"], "timeout": "10m",
         "onDecline": {"action": "skip_remaining"}, "onCancel": {"action": "abort"}},
        {"id": "select_environment", "type": "elicitation",
         "message": "Please select the target deployment environment (staging or production)",
         "schema": {"type": "object", "properties": {"environment": {"type": "string",
                                                                     "enum": ["staging", "production"]}},
                    "required": ["environment"]},
         "dependsOn": ["confirm_deployment"], "timeout": "5m",
         "onDecline": {"action": "continue"}, "onCancel": {"action": "abort"}},
        step(id="deploy_app", tool="github.deploy", dependsOn=["select_environment"],
             arguments={"env": "{{.steps.select_environment.output.content.environment}}"}),
    ]))
    steps = loaded.composite_tools[0].steps
    assert [s.type for s in steps] == ["tool", "elicitation", "elicitation", "tool"]
    assert (steps[1].on_decline, steps[1].timeout, steps[2].on_decline) == ("skip_remaining", 600.0, "continue")
    assert config_warnings(loaded) == []


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {}},  # a plain yes/no: the action is the answer
    {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 40, "title": "Name"},
        "email": {"type": "string", "format": "email"},
        "when": {"type": "string", "format": "date-time"},
        "size": {"type": "string", "enum": ["S", "M"], "default": "S"},
        "tier": {"type": "string", "oneOf": [{"const": "a", "title": "A"}, {"const": "b", "title": "B"}]},
        "count": {"type": "integer", "minimum": 1, "maximum": 9},
        "ratio": {"type": "number"},
        "ok": {"type": "boolean", "default": False},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}, "minItems": 1},
        "picks": {"type": "array", "items": {"anyOf": [{"const": "x", "title": "X"}]}},
    }, "required": ["name"]},
])
def test_every_form_mcp_allows_loads(schema: dict[str, Any]) -> None:
    loaded = load(composite(steps=[elicitation_step(schema=schema)])).composite_tools[0].steps[0]
    assert loaded.elicitation_schema == schema


def test_a_schema_without_properties_is_sent_with_empty_ones() -> None:
    loaded = load(composite(steps=[elicitation_step(schema={"type": "object"})])).composite_tools[0].steps[0]
    assert loaded.elicitation_schema == {"type": "object", "properties": {}}


@pytest.mark.parametrize(("fields", "expected"), [
    ({"message": None}, "message: must not be null"),
    ({"message": "  "}, "message: must not be empty"),
    ({"schema": {"type": "boolean"}},  # ToolHive's guide shows this form; MCP asks for an object
     "schema.type: must be object: an elicitation asks for a form, an object of flat properties"),
    ({"schema": "yes or no"}, "schema: must be a mapping"),
    ({"schema": {"type": "object", "properties": ["a"]}},
     "schema.properties: must be a mapping of field name to JSON Schema"),
    ({"schema": {"type": "object", "properties": {"who": {"type": "object", "properties": {}}}}},
     "schema.properties.who.type: must be one of string, number, integer, boolean, array: an elicitation form is "
     "flat (no objects, no nesting)"),
    ({"schema": {"type": "object", "properties": {"who": {"description": "no type"}}}},
     "schema.properties.who.type: must be one of string, number, integer, boolean, array: an elicitation form is "
     "flat (no objects, no nesting)"),
    ({"schema": {"type": "object", "properties": {"who": "string"}}},
     "schema.properties.who: must be a mapping (a JSON Schema)"),
    ({"schema": {"type": "object", "properties": {"at": {"type": "string", "format": "ipv4"}}}},
     "schema.properties.at.format: must be one of email, uri, date, date-time (the formats MCP allows in a form)"),
    ({"schema": {"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "integer"}}}}},
     "schema.properties.ids.items: an array field is a multi-select of strings: items must be "
     "{type: string, enum: [...]} or {anyOf: [{const: ..., title: ...}, ...]}"),
    ({"schema": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}},
     "schema.required[0]: 'b' is not one of the properties"),
    ({"schema": {"type": "object", "properties": {"a": {"type": "string", "minLength": "one"}}}},
     "schema.properties.a.minLength: 'one' is not of type 'integer'"),
    ({"schema": {"type": "object", "properties": {"a": {"type": "string", "enum": ["x" * 200] * 600}}}},
     "schema: is 122469 characters of JSON, more than the limit of 102400"),
    ({"onDecline": {"action": "ignore"}}, "onDecline.action: must be one of abort, continue, skip_remaining"),
    ({"onCancel": {"action": "retry"}}, "onCancel.action: must be one of abort, continue, skip_remaining"),
    ({"onDecline": "abort"}, "onDecline: must be a mapping"),
    ({"onCancel": {"when": "now"}}, "onCancel.when: unknown field"),
    ({"tool": "github.get_issue"}, "tool: an elicitation step asks the client: it has no tool"),
    ({"arguments": {}}, "arguments: an elicitation step asks the client: it has no arguments"),
])
def test_bad_elicitation_fields_are_reported_at_their_path(fields: dict[str, Any], expected: str) -> None:
    assert errors_of(composite(steps=[elicitation_step(**fields)])) == (f"compositeTools[0].steps[0].{expected}",)


def test_an_elicitation_message_is_a_template_checked_like_arguments() -> None:
    assert errors_of(composite(steps=[elicitation_step(message="{{ steps.nowhere.output }}")])) == (
        "compositeTools[0].steps[0]: composite 'triage', step 'confirm': its templates read steps.nowhere, "
        "but there is no step 'nowhere'",)


def test_an_elicitation_step_needs_a_message_and_a_schema() -> None:
    assert errors_of(composite(steps=[{"id": "ask", "type": "elicitation"}])) == (
        "compositeTools[0].steps[0].message: is required for type elicitation",
        "compositeTools[0].steps[0].schema: is required for type elicitation",
    )


def test_a_toolhive_for_each_inner_step_with_id_and_type_loads() -> None:
    loaded = load(composite(steps=[{"id": "each", "type": "forEach", "collection": "{{ params.items }}",
                                    "step": {"id": "inner", "type": "tool", "tool": "github.get_issue",
                                             "arguments": {"n": "{{ forEach.item }}"}}}]))
    assert loaded.composite_tools[0].steps[0].tool == "github.get_issue"
    assert errors_of(composite(steps=[{"id": "each", "type": "forEach", "collection": "{{ params.items }}",
                                       "step": {"type": "elicitation", "tool": "a"}}])) == (
        "compositeTools[0].steps[0].step.type: must be tool: a forEach step's inner step calls a tool "
        "(no elicitation or nested forEach)",)


@pytest.mark.parametrize(("inner", "expected"), [
    ({"id": "inner step", "tool": "jira.tag"}, "step.id: must be 1-64 letters, digits, '_' or '-'"),
    ({"type": "forEach", "tool": "jira.tag"},
     "step.type: must be tool: a forEach step's inner step calls a tool (no elicitation or nested forEach)"),
    ({"id": "inner", "type": "tool"}, "step.tool: is required"),
    ({"id": "inner", "tool": "jira.tag", "message": "hi"},
     "step.message: unknown field (a forEach step's inner step has id, type, tool and arguments)"),
])
def test_bad_for_each_inner_fields_are_reported_at_their_path(inner: dict[str, Any], expected: str) -> None:
    assert errors_of(composite(steps=[for_each(step=inner)])) == (f"compositeTools[0].steps[0].{expected}",)


def test_toolhives_for_each_example_loads_from_yaml(tmp_path: Path) -> None:
    """ToolHive's forEach as its guide and tests write it: the inner step with id and type."""
    config = load_config(write(tmp_path, """\
        name: engineering
        backends:
          - {name: deps, url: http://127.0.0.1:8081/mcp}
          - {name: osv, url: http://127.0.0.1:8082/mcp}
        compositeTools:
          - name: check_vulns
            description: Query every package
            steps:
              - {id: get_packages, tool: deps.list}
              - id: check_vulns
                type: forEach
                collection: "{{json .steps.get_packages.output.packages}}"
                itemVar: pkg
                maxParallel: 5
                step:
                  id: query
                  type: tool
                  tool: osv.query_vulnerability
                  arguments:
                    package_name: "{{.forEach.pkg.name}}"
                dependsOn: [get_packages]
        """))
    each = config.composite_tools[0].steps[1]
    assert (each.type, each.tool, each.for_each.item_var) == ("forEach", "osv.query_vulnerability", "pkg")
    assert each.arguments == {"package_name": "{{.forEach.pkg.name}}"}


def test_a_tool_step_needs_an_id_and_a_tool() -> None:
    assert errors_of(composite(steps=[{"type": "tool"}])) == (
        "compositeTools[0].steps[0].id: is required",
        "compositeTools[0].steps[0].tool: is required for type tool",
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"collection": None}, "collection: must not be null"),
        ({"collection": "[1, 2]"},
         'collection: must be a template that renders to a list, e.g. "{{ steps.fetch.output.items }}"'),
        ({"itemVar": "index"}, "itemVar: cannot be 'index': forEach.index is the iteration number"),
        ({"itemVar": "1st"}, "itemVar: must be an identifier: letters, digits and '_', not starting with a digit"),
        ({"itemVar": "a-b"}, "itemVar: must be an identifier: letters, digits and '_', not starting with a digit"),
        ({"maxParallel": 0}, "maxParallel: must be at least 1"),
        ({"maxIterations": 0}, "maxIterations: must be between 1 and 1000"),
        ({"maxIterations": 1001}, "maxIterations: must be between 1 and 1000"),
        ({"step": {"arguments": {}}}, "step.tool: is required"),
        ({"step": {"tool": "a b"}}, "step.tool: must be an MCP tool name: 1-128 letters, digits, '_', '-' or '.'"),
        ({"step": {"tool": "jira.tag", "arguments": "x"}}, "step.arguments: must be a mapping"),
        ({"step": {"tool": "jira.tag", "dependsOn": ["a"]}},
         "step.dependsOn: unknown field (a forEach step's inner step has id, type, tool and arguments)"),
        ({"tool": "jira.tag"}, "tool: a forEach step has no tool of its own: put it in step (step.tool)"),
        ({"arguments": {"a": 1}},
         "arguments: a forEach step has no arguments of its own: put it in step (step.arguments)"),
    ],
)
def test_bad_for_each_field_is_reported_at_its_path(fields: dict[str, Any], expected: str) -> None:
    assert errors_of(composite(steps=[for_each(**fields)])) == (f"compositeTools[0].steps[0].{expected}",)


def test_a_for_each_step_needs_a_collection_and_a_step() -> None:
    assert errors_of(composite(steps=[{"id": "each", "type": "forEach"}])) == (
        "compositeTools[0].steps[0].collection: is required for type forEach",
        "compositeTools[0].steps[0].step: is required for type forEach",
    )


# --- parameters -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ([], ("parameters: must be a mapping",)),
        ({}, ("parameters.type: is required and must be object",)),
        ({"type": "array"}, ("parameters.type: must be object (a tool's arguments are a JSON object)",)),
        ({"type": "object", "properties": ["issue"]},
         ("parameters.properties: must be a mapping of property name to JSON Schema",)),
        ({"type": "object", "properties": {"issue": "integer"}},
         ("parameters.properties.issue: must be a mapping (a JSON Schema)",)),
        ({"type": "object", "properties": {"issue": {"type": "int"}}}, (f"parameters.properties.issue.type: {TYPES}",)),
        ({"type": "object", "properties": {"issue": {"type": []}}}, (f"parameters.properties.issue.type: {TYPES}",)),
        ({"type": "object", "properties": {"issue": {"type": ["integer", "date"]}}},
         (f"parameters.properties.issue.type: {TYPES}",)),
        ({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "float"}}}}},
         (f"parameters.properties.a.properties.b.type: {TYPES}",)),
        ({"type": "object", "properties": {"issue": {}}, "required": "issue"},
         ("parameters.required: must be a list of property names",)),
        ({"type": "object", "properties": {"issue": {}}, "required": True},
         ("parameters.required: must be a list of property names",)),
        ({"type": "object", "properties": {"issue": {}}, "required": ["issue", "isue", 3]},
         ("parameters.required[1]: 'isue' is not one of the properties",
          "parameters.required[2]: must be a property name (a string)")),
        ({"type": "object", "required": ["issue"]}, ("parameters.required[0]: 'issue' is not one of the properties",)),
        ({"type": "object", "properties": {"issue": {"type": "integer", "required": True}}},
         ("parameters.properties.issue.required: JSON Schema lists required names at the level above, not on the "
          "property: parameters.required: [issue]",)),
        ({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"required": False}}}}},
         ("parameters.properties.a.properties.b.required: JSON Schema lists required names at the level above, "
          "not on the property: parameters.properties.a.required: [b]",)),
        ({"type": "object", "properties": {"issue": {"type": "integer", "default": "7"}}},
         ("parameters.properties.issue.default: does not match the property: issue must be integer, got string",)),
        ({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}},
                                                 "default": {"b": 1}}}},
         ("parameters.properties.a.default: does not match the property: a.b must be string, got integer",)),
        ({"type": "object", "properties": {"a": {"type": "object", "required": ["b"], "properties": {"b": {}},
                                                 "default": {}}}},
         ("parameters.properties.a.default: does not match the property: missing required property 'a.b'",)),
        ({"type": "object", "properties": {"a": {"properties": {"b": {"type": "integer", "default": 1.5}}}}},
         ("parameters.properties.a.properties.b.default: does not match the property: b must be integer, "
          "got number",)),
    ],
)
def test_bad_parameters_are_reported_at_their_path(parameters: Any, expected: tuple[str, ...]) -> None:
    assert errors_of(composite(parameters=parameters)) == tuple(f"compositeTools[0].{line}" for line in expected)


def test_parameters_accept_any_other_json_schema_keywords_and_matching_defaults() -> None:
    parameters = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "description": "Triage input",
        "additionalProperties": False,
        "properties": {
            "issue": {"type": "integer", "minimum": 1, "default": 1},
            "labels": {"type": "array", "items": {"type": "string"}, "default": []},
            "owner": {"type": ["string", "null"], "default": None},
            "extra": {"type": "object", "properties": {"depth": {"type": "number", "default": 2}}, "default": {}},
            "anything": {"default": {"x": [1]}},
        },
        "required": ["issue"],
    }
    (tool,) = load(composite(parameters=parameters)).composite_tools
    assert tool.parameters == parameters


DRAFT_07 = "http://json-schema.org/draft-07/schema#"


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({"type": "object", "properties": {"n": {"type": "integer", "minimum": "zero"}}},
         "parameters.properties.n.minimum: 'zero' is not of type 'number'"),
        ({"type": "object", "properties": {"code": {"type": "string", "pattern": "("}}},
         "parameters.properties.code.pattern: '(' is not a 'regex'"),
        ({"type": "object", "properties": {"tags": {"type": "array", "items": 3}}},
         "parameters.properties.tags.items: 3 is not of type 'object', 'boolean'"),
        ({"type": "object", "properties": {"name": {"type": "string", "minLength": -1}}},
         "parameters.properties.name.minLength: -1 is less than the minimum of 0"),
        ({"type": "object", "additionalProperties": "no"},
         "parameters.additionalProperties: 'no' is not of type 'object', 'boolean'"),
        ({"$schema": DRAFT_07, "type": "object", "properties": {"n": {"exclusiveMinimum": True}}},
         "parameters.properties.n.exclusiveMinimum: True is not of type 'number'"),
        ({"$schema": "https://example.com/my-dialect", "type": "object"},
         "parameters.$schema: must name a JSON Schema draft, e.g. https://json-schema.org/draft/2020-12/schema"),
    ],
)
def test_a_parameters_schema_its_draft_refuses_is_reported_at_its_path(parameters: Any, expected: str) -> None:
    assert errors_of(composite(parameters=parameters)) == (f"compositeTools[0].{expected}",)


@pytest.mark.parametrize(
    ("prop", "problem"),
    [
        ({"enum": ["C", "F"], "default": "K"}, "p: 'K' is not one of ['C', 'F']"),
        ({"type": "string", "pattern": "^[A-Z]{3}$", "default": "oslo"}, "p: 'oslo' does not match '^[A-Z]{3}$'"),
        ({"type": "integer", "minimum": 1, "default": 0}, "p: 0 is less than the minimum of 1"),
        ({"type": "array", "items": {"type": "string"}, "default": ["a", 2]}, "p[1] must be string, got integer"),
    ],
)
def test_a_default_is_checked_against_every_keyword_of_its_property(prop: dict[str, Any], problem: str) -> None:
    parameters = {"type": "object", "properties": {"p": prop}}
    assert errors_of(composite(parameters=parameters)) == (
        f"compositeTools[0].parameters.properties.p.default: does not match the property: {problem}",
    )


def test_a_default_is_checked_against_definitions_the_property_refers_to() -> None:
    parameters = {"type": "object", "$defs": {"unit": {"enum": ["C", "F"]}},
                  "properties": {"unit": {"$ref": "#/$defs/unit", "default": "K"}}}
    assert errors_of(composite(parameters=parameters)) == (
        "compositeTools[0].parameters.properties.unit.default: does not match the property: "
        "unit: 'K' is not one of ['C', 'F']",
    )
    parameters["properties"]["unit"]["default"] = "C"
    assert load(composite(parameters=parameters)).composite_tools


def test_an_older_draft_named_by_schema_is_checked_by_its_own_rules() -> None:
    parameters = {"$schema": DRAFT_07, "type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": 0}}}
    assert load(composite(parameters=parameters)).composite_tools[0].parameters == parameters


# --- templates and the step graph (workflows.composite_problems) -------------------------


def test_unknown_dependency_is_reported_at_its_dependsOn_entry() -> None:
    steps = [step(id="a"), step(id="b"), step(id="x", dependsOn=["y"])]
    assert errors_of(composite(name="c", steps=steps)) == (
        "compositeTools[0].steps[2].dependsOn[0]: composite 'c', step 'x': depends on unknown step 'y'",
    )


def test_graph_problems_are_reported_at_their_paths() -> None:
    steps = [
        step(id="a", dependsOn=["b"]),
        step(id="b", dependsOn=["a"]),
        step(id="a"),
        step(id="d", arguments={"q": "{{ steps.e.output }}"}),
        step(id="e", condition="{{ params.go }}"),
        step(id="f", dependsOn=["e", "e"], arguments={"q": "{{ steps.e.output.x }}"}),
    ]
    assert errors_of(composite(name="c", steps=steps)) == (
        "compositeTools[0].steps[0].dependsOn[0]: composite 'c', step 'a': dependency cycle a -> b -> a",
        "compositeTools[0].steps[2].id: composite 'c', step 'a': the id is already used by steps[0]",
        "compositeTools[0].steps[3]: composite 'c', step 'd': its templates read steps.e, but 'e' is not among the "
        "steps it depends on (add it to dependsOn, directly or through another step)",
        "compositeTools[0].steps[4].defaultResults: composite 'c', step 'e': it has a condition, so it may be "
        "skipped, and steps 'd', 'f' read its output; give it defaultResults (its output when skipped)",
        "compositeTools[0].steps[5].dependsOn[1]: composite 'c', step 'f': lists 'e' more than once",
    )


def test_template_syntax_errors_are_reported_where_the_template_is() -> None:
    steps = [
        step(id="a", arguments={"outer": {"list": ["ok", "{{ params.x + }}"]}}, condition="{{ params.go ) }}"),
        for_each(collection="{{ steps..a }}", step={"tool": "jira.tag", "arguments": {"id": "{{ forEach.item ]] }}"}}),
    ]
    lines = errors_of(composite(name="c", steps=steps, output={"properties": {"s": {"value": "{% if %}"}}}))
    assert [line.split(": ", 1)[0] for line in lines] == [
        "compositeTools[0].output.properties.s.value",
        "compositeTools[0].steps[0].arguments.outer.list[1]",
        "compositeTools[0].steps[0].condition",
        "compositeTools[0].steps[1].collection",
        "compositeTools[0].steps[1].step.arguments.id",
    ]
    assert lines[2].startswith("compositeTools[0].steps[0].condition: composite 'c', step 'a': template syntax error")


def test_output_reading_unknown_steps_and_required_names_that_are_not_properties() -> None:
    output = {"properties": {"s": {"value": "{{ steps.nope.output }}"}, "t": {"value": "{{ steps.fetch.output }}"}},
              "required": ["t", "u"]}
    assert errors_of(composite(name="c", output=output)) == (
        "compositeTools[0].output.properties.s.value: composite 'c': the output reads steps.nope, "
        "but there is no step 'nope'",
        "compositeTools[0].output.required[1]: composite 'c': 'u' is not an output property",
    )


def test_continue_on_error_step_read_by_the_output_needs_default_results() -> None:
    output = {"properties": {"s": {"value": "{{ steps.fetch.output }}"}}}
    assert errors_of(composite(name="c", output=output, steps=[step(onError={"action": "continue"})])) == (
        "compositeTools[0].steps[0].defaultResults: composite 'c', step 'fetch': its onError action is continue, "
        "so it may fail without output, and the output reads its output; give it defaultResults (its output when "
        "failed)",
    )
    assert load(composite(output=output, steps=[step(onError={"action": "continue"}, defaultResults={})]))


# --- checks across composites and the rest of the config ---------------------------------


def test_duplicate_composite_names_are_reported_at_each_repeat() -> None:
    names = ["a", "b", "c", "a", "b"]
    assert errors_of(*(composite(name=name) for name in names)) == (
        "compositeTools[3].name: duplicate composite name 'a' (also compositeTools[0])",
        "compositeTools[4].name: duplicate composite name 'b' (also compositeTools[1])",
    )


def test_composite_tools_cannot_call_composite_tools() -> None:
    calls = composite(name="outer", steps=[
        step(id="a", tool="inner"),
        for_each(id="b", step={"tool": "outer"}),
        step(id="c", tool="inner_not"),
        step(id="d", tool="github.inner"),
    ])
    assert errors_of(composite(name="inner"), calls) == (
        "compositeTools[1].steps[0].tool: composite 'outer', step 'a': 'inner' is a composite tool, and composite "
        "tools cannot call composite tools",
        "compositeTools[1].steps[1].step.tool: composite 'outer', step 'b': 'outer' is a composite tool, and "
        "composite tools cannot call composite tools",
    )


def renaming(aggregation: dict[str, Any] | None = None, **workload: Any) -> dict[str, Any]:
    """An aggregation section renaming github's open_pr to create_pr."""
    tools = {"workload": "github", "overrides": {"open_pr": {"name": "create_pr"}}, **workload}
    return {"tools": [tools], **(aggregation or {})}


CLASH = ("is also the name clients see for github.open_pr (renamed by aggregation.tools[0].overrides.open_pr.name); "
         "composite and backend tools share one list of names, rename one of them")


@pytest.mark.parametrize(
    ("name", "aggregation"),
    [
        ("github_create_pr", renaming()),
        ("gh-create_pr", renaming({"conflictResolutionConfig": {"prefixFormat": "gh-"}})),
        ("github__create_pr", renaming({"conflictResolutionConfig": {"prefixFormat": "{workload}__"}})),
        ("create_pr", renaming({"conflictResolution": "priority", "conflictResolutionConfig": {
            "priorityOrder": ["github"]}})),
        ("create_pr", renaming({"conflictResolution": "manual"})),
        ("create_pr", renaming({"conflictResolution": "manual"}, filter=["create_pr"])),
        ("github_create_pr", renaming(excludeAll=False)),
    ],
)
def test_composite_named_like_an_advertised_renamed_tool_is_an_error(name: str, aggregation: dict[str, Any]) -> None:
    assert errors_of(composite(name=name), aggregation=aggregation) == (f"compositeTools[0].name: {name!r} {CLASH}",)


@pytest.mark.parametrize(
    ("name", "aggregation"),
    [
        ("create_pr", renaming()),  # under prefix clients see github_create_pr
        ("github_open_pr", renaming()),  # the old name is gone
        ("github_create_pr", renaming({"conflictResolution": "manual"})),
        ("github_create_pr", renaming({"excludeAllTools": True})),
        ("github_create_pr", renaming(excludeAll=True)),
        ("github_create_pr", renaming(filter=["list_issues"])),
        ("create_pr", renaming({"conflictResolution": "manual"}, filter=[])),
    ],
)
def test_composite_named_like_a_hidden_or_differently_named_tool_loads(name: str, aggregation: dict[str, Any]) -> None:
    assert load(composite(name=name), aggregation=aggregation).composite_tools[0].name == name


def test_a_rename_of_an_unknown_backend_is_not_held_against_a_composite() -> None:
    aggregation = {"tools": [{"workload": "gitlab", "overrides": {"open_pr": {"name": "create_pr"}}}]}
    assert errors_of(composite(name="gitlab_create_pr"), aggregation=aggregation) == (
        "aggregation.tools[0].workload: no backend named 'gitlab'",
    )


def annotated(**overrides: Any) -> dict[str, Any]:
    return {"tools": [{"workload": "github", "overrides": overrides}]}


WRITES = {"name": "create_pr", "annotations": {"readOnlyHint": False, "destructiveHint": True,
                                               "idempotentHint": False, "openWorldHint": True}}
SAFE = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}


@pytest.mark.parametrize(
    "tool",
    ["github.open_pr", "github.create_pr", "github_create_pr"],
    ids=["workload.original", "workload.new_name", "advertised_name"],
)
def test_explicit_annotations_safer_than_a_step_tool_the_overrides_describe_are_errors(tool: str) -> None:
    data = composite(name="c", annotations={"title": "Open", **SAFE}, steps=[step(id="open", tool=tool)])
    source = "(set by aggregation.tools[0].overrides.open_pr.annotations)"
    assert errors_of(data, aggregation=annotated(open_pr=WRITES)) == tuple(
        f"compositeTools[0].annotations.{hint}: composite 'c': annotations.{hint} is {str(SAFE[hint]).lower()}, "
        f"but step 'open' calls a tool whose {hint} is {str(not SAFE[hint]).lower()} {source}"
        for hint in sorted(SAFE)
    )


def test_a_for_each_step_tool_counts_for_the_annotation_check() -> None:
    data = composite(name="c", annotations={"idempotentHint": True},
                     steps=[for_each(id="each", step={"tool": "github.open_pr"})])
    assert errors_of(data, aggregation=annotated(open_pr=WRITES)) == (
        "compositeTools[0].annotations.idempotentHint: composite 'c': annotations.idempotentHint is true, but step "
        "'each' calls a tool whose idempotentHint is false (set by aggregation.tools[0].overrides.open_pr.annotations)",
    )


@pytest.mark.parametrize(
    ("explicit", "overrides", "tool"),
    [
        (None, {"open_pr": WRITES}, "github.open_pr"),  # nothing claimed
        ({"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True},
         {"open_pr": WRITES}, "github.open_pr"),  # more cautious is fine
        ({"title": "Only a title"}, {"open_pr": WRITES}, "github.open_pr"),
        (SAFE, {"open_pr": {"name": "create_pr"}}, "github.open_pr"),  # the override states no hint
        (SAFE, {"open_pr": {"annotations": {"title": "x"}}}, "github.open_pr"),
        (SAFE, {"get_issue": {"annotations": {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False}}},
         "github.get_issue"),  # read-only implies not destructive
        (SAFE, {"open_pr": WRITES}, "jira.open_pr"),  # another backend's tool
        (SAFE, {"open_pr": WRITES}, "open_pr"),  # a name the config cannot resolve
        (SAFE, {"open_pr": WRITES}, "create_pr"),  # under prefix clients see github_create_pr
    ],
)
def test_annotations_the_overrides_do_not_contradict_load(explicit: Any, overrides: dict[str, Any], tool: str) -> None:
    fields = {"annotations": explicit} if explicit is not None else {}
    assert load(composite(steps=[step(tool=tool)], **fields), aggregation=annotated(**overrides)).composite_tools


# --- all at once ------------------------------------------------------------------------


def test_every_problem_of_every_composite_is_reported_in_one_config_error(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        name: engineering
        backends: [{name: github, url: http://127.0.0.1:8081/mcp}]
        aggregation:
          tools: [{workload: github, overrides: {open_pr: {name: create_pr}}}]
        compositeTools:
          - name: github_create_pr
            description: ""
            maxParallel: 0
            steps:
              - {id: a, tool: github.x, onError: {action: abort, retryCount: 2}}
              - {id: b, type: forEach, tool: y, collection: "{{ params.x }}", step: {tool: z}}
          - name: graph
            description: fine fields, bad graph
            steps:
              - {id: a, tool: github.x, dependsOn: [zz]}
              - {id: b, tool: graph}
          - name: graph
            description: a repeat
            steps: []
        """)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.errors == (
        "compositeTools[0].description: must not be empty",
        "compositeTools[0].maxParallel: must be at least 1",
        f"compositeTools[0].name: 'github_create_pr' {CLASH}",
        "compositeTools[0].steps[0].onError.retryCount: only used with action retry (action is abort)",
        "compositeTools[0].steps[1].tool: a forEach step has no tool of its own: put it in step (step.tool)",
        "compositeTools[1].steps[0].dependsOn[0]: composite 'graph', step 'a': depends on unknown step 'zz'",
        "compositeTools[1].steps[1].tool: composite 'graph', step 'b': 'graph' is a composite tool, and composite "
        "tools cannot call composite tools",
        "compositeTools[2].name: duplicate composite name 'graph' (also compositeTools[1])",
        "compositeTools[2].steps: must list at least one step",
    )


def test_composite_tool_refs_are_still_not_supported() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping(minimal(compositeToolRefs=["triage"]))
    assert info.value.errors == ("compositeToolRefs: compositeToolRefs is not supported yet",)


# --- warnings ---------------------------------------------------------------------------


def test_dot_form_step_tool_of_no_backend_is_a_warning() -> None:
    config = load(composite(steps=[
        step(id="a", tool="gh.get_issue"),
        step(id="b", tool="github.get_issue"),
        step(id="c", tool="get_issue"),
        for_each(id="d", step={"tool": "jra.tag"}),
        for_each(id="e"),
    ]))
    assert config_warnings(config) == [
        "compositeTools[0].steps[0].tool: 'gh.get_issue' reads as workload.tool, but there is no backend named "
        "'gh'; it only works if a backend advertises a tool with exactly this name",
        "compositeTools[0].steps[3].step.tool: 'jra.tag' reads as workload.tool, but there is no backend named "
        "'jra'; it only works if a backend advertises a tool with exactly this name",
    ]


def test_composites_over_known_backends_give_no_warning() -> None:
    assert config_warnings(load(composite(steps=[step(), for_each()]))) == []


def test_elicitation_settings_that_do_nothing_are_warnings() -> None:
    config = load(composite(steps=[elicitation_step(timeout="30m", onError={"action": "retry"})]))
    assert config_warnings(config) == [
        "compositeTools[0].steps[0].timeout: an elicitation waits at most 10m for an answer; 1800s is cut to that",
        "compositeTools[0].steps[0].onError.action: an elicitation is never retried; a failure of this step aborts "
        "the call, as with abort",
    ]


def test_a_go_template_function_is_refused_at_load_where_jinja_would_read_it_as_a_variable():
    data = {
        "name": "gw",
        "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}],
        "compositeTools": [{
            "name": "c", "description": "d",
            "steps": [
                {"id": "s", "tool": "a.t", "arguments": {"same": "{{ eq .params.a .params.b }}"}},
                {"id": "e", "type": "forEach", "collection": "{{ [1] }}",
                 "step": {"tool": "a.t", "arguments": {"x": "{{ forEach.item }}", "y": "{{ item }}"}}},
            ],
        }],
    }
    with pytest.raises(ConfigError) as raised:
        config_from_mapping(data)
    paths = [line.split(":")[0] for line in raised.value.errors]
    assert paths == ["compositeTools[0].steps[0].arguments.same", "compositeTools[0].steps[1].step.arguments.y"]
    assert "reads 'eq'" in raised.value.errors[0] and "reads 'item'" in raised.value.errors[1]


def test_the_worked_example_in_the_docs_is_the_demo_s_trip_brief():
    """docs/composite-tools.md section 1.1 shows trip_brief as YAML; it must stay the demo's definition."""
    from pathlib import Path

    import yaml

    from vmcp_actors.demo import DEMO_COMPOSITE_TOOLS

    page = (Path(__file__).resolve().parents[2] / "docs" / "composite-tools.md").read_text(encoding="utf-8")
    section = page[page.index("### 1.1 The definition"):]
    block = section[section.index("```yaml\n") + len("```yaml\n"):section.index("```\n", section.index("```yaml"))]
    backends = [{"name": "weather", "url": "http://127.0.0.1:1/mcp"}, {"name": "notes", "url": "http://127.0.0.1:2/mcp"}]
    documented = config_from_mapping({"name": "doc", "backends": backends, **yaml.safe_load(block)})
    demo = config_from_mapping({"name": "doc", "backends": backends, "compositeTools": DEMO_COMPOSITE_TOOLS[:1]})
    assert documented.composite_tools == demo.composite_tools


def test_field_errors_and_graph_problems_of_one_composite_are_reported_together():
    data = {
        "name": "gw",
        "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}],
        "compositeTools": [{
            "name": "c", "description": "d",
            "steps": [
                {"id": "x", "tool": "a.t", "dependsOn": ["y"], "onError": {"action": "explode"}},
                {"id": "y", "tool": "a.t", "dependsOn": ["x"], "arguments": {"q": "{{ steps.z.output }}"}},
                {"tool": "a.t", "timeout": "soon"},
            ],
        }],
    }
    with pytest.raises(ConfigError) as raised:
        config_from_mapping(data)
    errors = raised.value.errors
    assert any(line.startswith("compositeTools[0].steps[0].onError.action: must be one of") for line in errors)
    assert any(line.startswith("compositeTools[0].steps[2].id: ") for line in errors)
    assert any(line.startswith("compositeTools[0].steps[2].timeout: ") for line in errors)
    assert "compositeTools[0].steps[0].dependsOn[0]: composite 'c', step 'x': dependency cycle x -> y -> x" in errors
    assert any(line.startswith("compositeTools[0].steps[1]: composite 'c', step 'y': its templates read steps.z")
               for line in errors)
