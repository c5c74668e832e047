"""marshmallow schemas for ``compositeTools`` (ToolHive's composite tool definitions),
loading each entry into the frozen dataclasses of ``vmcp_actors.workflows``.

Three layers of checks, each reported as ``path: message``:

* the fields of one composite (the schemas below), including what the dataclasses'
  ``__post_init__`` would refuse, so a user never meets a bare ``ValueError``;
* the composite as a whole once its fields loaded: templates and the step graph
  (``workflows.composite_problems``);
* what needs the rest of the config (:func:`composite_reference_problems`, run by
  ``VmcpSchema`` on what the sections loaded): duplicate names, composites calling
  composites, names of renamed backend tools, annotations safer than the overrides allow.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.validators import validator_for
from marshmallow import ValidationError, fields, post_load, validate, validates_schema
from marshmallow.exceptions import SCHEMA

from vmcp_actors.protocol import INVALID_PARAMS, JsonRpcError
from vmcp_actors.workflows import (
    ANNOTATION_KEYS,
    ELICITATION_ACTIONS,
    HINTS,
    MAX_FOR_EACH_ITERATIONS,
    MAX_RETRY_COUNT,
    ON_ERROR_ACTIONS,
    OUTPUT_TYPES,
    STEP_TYPES,
    CompositeTool,
    ForEach,
    OnError,
    OutputProperty,
    OutputSpec,
    Step,
    composite_problems,
    is_template,
    unsafe_claims,
)
from vmcp_actors.workflows._params import validate_params

from ._fields import (
    _Boolean,
    _Choice,
    _Duration,
    _Integer,
    _is_json,
    _JsonMapping,
    _List,
    _loaded,
    _Nested,
    _not_blank,
    _PlainMessages,
    _StrictSchema,
    _String,
    _tool_name,
)
from ._model import AggregationConfig, ToolOverride

# An MCP tool name without dots: a dot in a step's tool means workload.tool.
COMPOSITE_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")
STEP_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
ITEM_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
JSON_SCHEMA_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")

DEFAULT_COMPOSITE_TIMEOUT = 1800.0
DEFAULT_STEP_TIMEOUT = 300.0
DEFAULT_MAX_PARALLEL = 10
DEFAULT_RETRY_COUNT = 3
DEFAULT_RETRY_DELAY = 1.0
DEFAULT_ITEM_VAR = "item"
DEFAULT_MAX_ITERATIONS = 100
FOR_EACH_KEYS = ("collection", "itemVar", "maxParallel", "maxIterations", "step")
INNER_STEP_KEYS = ("tool", "arguments")  # what a forEach step keeps under `step`
ELICITATION_KEYS = ("message", "schema", "onDecline", "onCancel")
# What MCP lets a server ask in a form (elicitation/create, form mode): an object whose
# properties are primitives; an array only as a multi-select of strings.
ELICITATION_PROPERTY_TYPES = ("string", "number", "integer", "boolean", "array")
ELICITATION_FORMATS = ("email", "uri", "date", "date-time")
MAX_ELICITATION_SCHEMA = 100 * 1024  # characters of JSON, ToolHive's limit
RETRY_KEYS = ("retryCount", "retryDelay")

_JSON_VALUE = "must be a JSON value (string, finite number, boolean, null, list, mapping with string keys)"


# --- fields and validators --------------------------------------------------------------


class _JsonValue(_PlainMessages, fields.Field):
    """Any JSON value, deep-copied so the loaded config shares nothing with its input."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if not _is_json(value):
            raise ValidationError(_JSON_VALUE)
        return copy.deepcopy(value)


class _JsonArguments(_JsonMapping):
    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> dict[str, Any]:
        return copy.deepcopy(super()._deserialize(value, attr, data, **kwargs))


class _Parameters(_JsonArguments):
    """The composite's input schema: a JSON Schema for an object (Draft 2020-12 unless
    ``$schema`` names another draft), which ``workflows.validate_params`` enforces on every
    call. Checked in rounds, each once the one before found nothing: the usual mistakes
    (in words that say the fix), the draft's metaschema, then the defaults."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> dict[str, Any]:
        schema = super()._deserialize(value, attr, data, **kwargs)
        errors = _usual_mistakes(schema) or _metaschema_problems(schema) or _default_problems(schema, schema)
        if errors:
            raise ValidationError(errors)
        return schema


def _usual_mistakes(schema: Mapping[str, Any]) -> dict[str, Any]:
    errors: dict[str, Any] = {}
    if "type" not in schema:
        errors["type"] = ["is required and must be object"]
    elif schema["type"] != "object":
        errors["type"] = ["must be object (a tool's arguments are a JSON object)"]
    errors.update(_object_schema_problems(schema, "parameters", top_level=True))
    return errors


def _metaschema_problems(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Where ``schema`` breaks its draft's metaschema (formats such as ``regex`` included)."""
    if "$schema" not in schema:
        draft = Draft202012Validator
    else:
        draft = validator_for(schema, default=None) if isinstance(schema["$schema"], str) else None
        if draft is None:
            return {"$schema": [f"must name a JSON Schema draft, e.g. {Draft202012Validator.META_SCHEMA['$id']}"]}
    errors: dict[Any, Any] = {}
    for error in draft(draft.META_SCHEMA, format_checker=draft.FORMAT_CHECKER).iter_errors(schema):
        _add_message(errors, list(error.absolute_path), error.message)
    return errors


def _default_problems(schema: Mapping[str, Any], root: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults of ``schema``'s properties (nested ones too) that a call would refuse,
    checked by ``validate_params`` with what the root lends its subschemas in reach."""
    context = {key: root[key] for key in ("$schema", "$id", "$defs", "definitions") if key in root}
    errors: dict[str, Any] = {}
    for name, prop in schema.get("properties", {}).items():
        problems = _default_problems(prop, root)
        if "default" in prop:
            try:
                validate_params({}, {**context, "type": "object", "properties": {name: prop}})
            except JsonRpcError as err:
                problem = err.message.removeprefix("Invalid params: ")
                problems["default"] = [f"does not match the property: {problem}" if err.code == INVALID_PARAMS
                                       else f"cannot be checked: {problem}"]
        if problems:
            errors.setdefault("properties", {})[name] = problems
    return errors


def _object_schema_problems(schema: Mapping[str, Any], where: str, *, top_level: bool = False) -> dict[str, Any]:
    """Problems of ``properties`` and ``required`` in an object schema at ``where``."""
    errors: dict[str, Any] = {}
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        errors["properties"] = ["must be a mapping of property name to JSON Schema"]
        properties = {}
    else:
        per_property = {
            name: problems
            for name, prop in properties.items()
            if (problems := _property_problems(name, prop, f"{where}.properties.{name}", where))
        }
        if per_property:
            errors["properties"] = per_property

    required = schema.get("required", [])
    if isinstance(required, bool) and not top_level:
        pass  # said by the enclosing property's check, with the form JSON Schema wants
    elif not isinstance(required, list):
        errors["required"] = ["must be a list of property names"]
    else:
        unknown = {
            index: ["must be a property name (a string)"] if not isinstance(name, str)
            else [f"{name!r} is not one of the properties"]
            for index, name in enumerate(required)
            if not isinstance(name, str) or name not in properties
        }
        if unknown:
            errors["required"] = unknown
    return errors


def _property_problems(name: str, prop: Any, where: str, parent: str) -> Any:
    if not isinstance(prop, Mapping):
        return ["must be a mapping (a JSON Schema)"]
    errors: dict[str, Any] = {}
    if "type" in prop and not _is_schema_type(prop["type"]):
        errors["type"] = [f"must be one of {', '.join(JSON_SCHEMA_TYPES)} (or a list of them)"]
    if isinstance(prop.get("required"), bool):
        errors["required"] = [
            f"JSON Schema lists required names at the level above, not on the property: "
            f"{parent}.required: [{name}]"
        ]
    errors.update(_object_schema_problems(prop, where))
    return errors


def _is_schema_type(value: Any) -> bool:
    names = value if isinstance(value, list) else [value]
    return bool(names) and all(isinstance(name, str) and name in JSON_SCHEMA_TYPES for name in names)


def _composite_name(value: str) -> None:
    if not COMPOSITE_NAME.fullmatch(value):
        raise ValidationError("must be an MCP tool name without dots: 1-128 letters, digits, '_' or '-'")


def _step_id(value: str) -> None:
    if not STEP_ID.fullmatch(value):
        raise ValidationError("must be 1-64 letters, digits, '_' or '-'")


def _item_var(value: str) -> None:
    if not ITEM_VAR.fullmatch(value):
        raise ValidationError("must be an identifier: letters, digits and '_', not starting with a digit")
    if value == "index":
        raise ValidationError("cannot be 'index': forEach.index is the iteration number")


def _condition(value: str) -> None:
    # Anything else would fail at every run: a condition must render to true or false.
    if not is_template(value) and value.strip().lower() not in ("true", "false"):
        raise ValidationError('must be a template that renders to true or false, e.g. "{{ params.go }}"')


def _collection(value: str) -> None:
    if not is_template(value):
        raise ValidationError('must be a template that renders to a list, e.g. "{{ steps.fetch.output.items }}"')


def _built(build: Any, *args: Any, **kwargs: Any) -> Any:
    """A dataclass built from loaded values; its ``ValueError`` (a check this module
    missed) still comes out as a config error rather than a traceback."""
    try:
        return build(*args, **kwargs)
    except ValueError as err:
        raise ValidationError(str(err)) from None


# --- schemas ----------------------------------------------------------------------------


class OnErrorSchema(_StrictSchema):
    action = _String(load_default="abort", validate=_Choice(ON_ERROR_ACTIONS))
    retry_count = _Integer(
        data_key="retryCount",
        validate=validate.Range(1, MAX_RETRY_COUNT, error=f"must be between 1 and {MAX_RETRY_COUNT}"),
    )
    retry_delay = _Duration(data_key="retryDelay", allow_zero=True)

    @validates_schema(pass_original=True, skip_on_field_errors=False)
    def _check_retry_settings(self, data: Any, original_data: Any, **kwargs: Any) -> None:
        if not isinstance(original_data, Mapping):
            return
        action = original_data.get("action", "abort")
        if action == "retry" or action not in ON_ERROR_ACTIONS:
            return
        misplaced = {key: [f"only used with action retry (action is {action})"]
                     for key in RETRY_KEYS if key in original_data}
        if misplaced:
            raise ValidationError(misplaced)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> OnError:
        if data["action"] != "retry":
            return _built(OnError, data["action"])
        return _built(
            OnError,
            "retry",
            retry_count=data.get("retry_count", DEFAULT_RETRY_COUNT),
            retry_delay=data.get("retry_delay", DEFAULT_RETRY_DELAY),
        )


def _inner_step_type(value: str) -> None:
    if value != "tool":
        raise ValidationError("must be tool: a forEach step's inner step calls a tool (no elicitation or "
                              "nested forEach)")


class ForEachInnerStepSchema(_StrictSchema):
    """A forEach step's ``step``: the tool each iteration calls. ToolHive's own ``id`` and
    ``type: tool`` are accepted; ToolHive names the inner step only in its logs, and here
    too it names nothing (iterations are the outer step's)."""

    error_messages = {"unknown": "unknown field (a forEach step's inner step has id, type, tool and arguments)"}

    id = _String(validate=_step_id)
    type = _String(validate=_inner_step_type)
    tool = _String(required=True, validate=_tool_name)
    arguments = _JsonArguments(load_default=dict)


class ElicitationActionSchema(_StrictSchema):
    """``onDecline`` / ``onCancel`` of an elicitation step."""

    action = _String(load_default="abort", validate=_Choice(ELICITATION_ACTIONS))


class _ElicitationSchema(_JsonArguments):
    """An elicitation step's ``schema``: the form MCP lets a server ask for (an object of
    flat properties), then the draft's metaschema, then ToolHive's size limit. Loads with
    ``properties`` filled in (``{}``), which MCP requires of the request."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> dict[str, Any]:
        schema = super()._deserialize(value, attr, data, **kwargs)
        errors = _form_problems(schema) or _metaschema_problems(schema)
        if errors:
            raise ValidationError(errors)
        size = len(json.dumps(schema))
        if size > MAX_ELICITATION_SCHEMA:
            raise ValidationError(f"is {size} characters of JSON, more than the limit of {MAX_ELICITATION_SCHEMA}")
        return {**schema, "properties": schema.get("properties", {})}


def _form_problems(schema: Mapping[str, Any]) -> dict[str, Any]:
    errors: dict[str, Any] = {}
    if schema.get("type") != "object":
        errors["type"] = ["must be object: an elicitation asks for a form, an object of flat properties"]
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        errors["properties"] = ["must be a mapping of field name to JSON Schema"]
        properties = {}
    per_field = {name: problems for name, prop in properties.items() if (problems := _form_field_problems(prop))}
    if per_field:
        errors["properties"] = per_field
    required = schema.get("required", [])
    if not isinstance(required, list):
        errors["required"] = ["must be a list of field names"]
    else:
        unknown = {index: [f"{name!r} is not one of the properties"] for index, name in enumerate(required)
                   if not isinstance(name, str) or name not in properties}
        if unknown:
            errors["required"] = unknown
    return errors


def _form_field_problems(prop: Any) -> Any:
    if not isinstance(prop, Mapping):
        return ["must be a mapping (a JSON Schema)"]
    kind = prop.get("type")
    if kind not in ELICITATION_PROPERTY_TYPES:
        return {"type": [f"must be one of {', '.join(ELICITATION_PROPERTY_TYPES)}: an elicitation form is flat "
                         "(no objects, no nesting)"]}
    errors: dict[str, Any] = {}
    if kind == "string" and "format" in prop and prop["format"] not in ELICITATION_FORMATS:
        errors["format"] = [f"must be one of {', '.join(ELICITATION_FORMATS)} (the formats MCP allows in a form)"]
    if kind == "array" and not _is_multi_select(prop.get("items")):
        errors["items"] = ["an array field is a multi-select of strings: items must be "
                           "{type: string, enum: [...]} or {anyOf: [{const: ..., title: ...}, ...]}"]
    return errors


def _is_multi_select(items: Any) -> bool:
    if not isinstance(items, Mapping):
        return False
    if items.get("type") == "string" and isinstance(items.get("enum"), list):
        return True
    options = items.get("anyOf")
    return isinstance(options, list) and bool(options) and all(
        isinstance(option, Mapping) and isinstance(option.get("const"), str) for option in options)


class StepSchema(_StrictSchema):
    id = _String(required=True, validate=_step_id)
    type = _String(load_default="tool", validate=_Choice(STEP_TYPES))
    tool = _String(validate=_tool_name)  # an advertised tool name, or workload.tool
    arguments = _JsonArguments()
    depends_on = _List(_String(), data_key="dependsOn", load_default=tuple)
    condition = _String(validate=_condition)
    on_error = _Nested(OnErrorSchema, data_key="onError", load_default=OnError)
    timeout = _Duration(load_default=DEFAULT_STEP_TIMEOUT)
    default_results = _JsonValue(data_key="defaultResults", load_default=None, allow_none=True)

    # forEach only
    collection = _String(validate=_collection)
    item_var = _String(data_key="itemVar", validate=_item_var)
    max_parallel = _Integer(data_key="maxParallel", validate=validate.Range(min=1, error="must be at least 1"))
    max_iterations = _Integer(
        data_key="maxIterations",
        validate=validate.Range(
            1, MAX_FOR_EACH_ITERATIONS, error=f"must be between 1 and {MAX_FOR_EACH_ITERATIONS}"
        ),
    )
    step = _Nested(ForEachInnerStepSchema)

    # elicitation only (ToolHive's fields)
    message = _String(validate=_not_blank)
    elicitation_schema = _ElicitationSchema(data_key="schema")
    on_decline = _Nested(ElicitationActionSchema, data_key="onDecline")
    on_cancel = _Nested(ElicitationActionSchema, data_key="onCancel")

    @validates_schema(pass_original=True, skip_on_field_errors=False)
    def _check_keys_for_type(self, data: Any, original_data: Any, **kwargs: Any) -> None:
        if not isinstance(original_data, Mapping):
            return
        kind = original_data.get("type", "tool")
        errors: dict[str, list[str]] = {}
        if kind != "elicitation":
            errors.update({key: ["only for type elicitation"] for key in ELICITATION_KEYS if key in original_data})
        if kind == "tool":
            errors.update({key: ["only for type forEach"] for key in FOR_EACH_KEYS if key in original_data})
            if "tool" not in original_data:
                errors["tool"] = ["is required for type tool"]
        elif kind == "elicitation":
            errors.update({key: ["an elicitation step asks the client: it has no " + key]
                           for key in ("tool", "arguments", *FOR_EACH_KEYS) if key in original_data})
            errors.update({key: ["is required for type elicitation"]
                           for key in ("message", "schema") if key not in original_data})
        elif kind == "forEach":
            errors.update({
                key: [f"a forEach step has no {key} of its own: put it in step ({'step.' + key})"]
                for key in INNER_STEP_KEYS if key in original_data
            })
            errors.update({key: ["is required for type forEach"]
                           for key in ("collection", "step") if key not in original_data})
        if errors:
            raise ValidationError(errors)

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> Step:
        common = {
            "id": data["id"],
            "depends_on": tuple(data["depends_on"]),
            "condition": data.get("condition"),
            "on_error": data["on_error"],
            "timeout": data["timeout"],
            "default_results": data["default_results"],
        }
        if data["type"] == "tool":
            return _built(Step, tool=data["tool"], arguments=data.get("arguments", {}), **common)
        if data["type"] == "elicitation":
            return _built(Step, tool=None, type="elicitation", message=data["message"],
                          elicitation_schema=data["elicitation_schema"],
                          on_decline=data.get("on_decline", {}).get("action", "abort"),
                          on_cancel=data.get("on_cancel", {}).get("action", "abort"), **common)
        for_each = _built(
            ForEach,
            collection=data["collection"],
            item_var=data.get("item_var", DEFAULT_ITEM_VAR),
            max_parallel=data.get("max_parallel", DEFAULT_MAX_PARALLEL),
            max_iterations=data.get("max_iterations", DEFAULT_MAX_ITERATIONS),
        )
        inner = data["step"]
        return _built(Step, tool=inner["tool"], arguments=inner["arguments"], type="forEach",
                      for_each=for_each, **common)


class _OutputProperties(_PlainMessages, fields.Field):
    """Property name -> output property; nested ``properties`` load the same way."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> dict[str, OutputProperty]:
        if not isinstance(value, Mapping):
            raise ValidationError("must be a mapping of property name to property")
        if not value:
            raise ValidationError("must define at least one property")
        if "" in value:
            raise ValidationError("property names must not be empty")
        loaded: dict[str, OutputProperty] = {}
        errors: dict[str, Any] = {}
        for name, raw in value.items():
            try:
                loaded[str(name)] = OutputPropertySchema().load(raw)
            except ValidationError as err:
                errors[str(name)] = err.messages
        if errors:
            raise ValidationError(errors)
        return loaded


class OutputPropertySchema(_StrictSchema):
    type = _String(validate=_Choice(OUTPUT_TYPES))
    description = _String()
    value = _String(validate=_not_blank)  # a template
    default = _JsonValue(allow_none=True)
    properties = _OutputProperties()

    @validates_schema(pass_original=True, skip_on_field_errors=False)
    def _check_value_or_properties(self, data: Any, original_data: Any, **kwargs: Any) -> None:
        if not isinstance(original_data, Mapping):
            return
        has_value, has_properties = "value" in original_data, "properties" in original_data
        if has_value and has_properties:
            raise ValidationError("has a value or nested properties, not both")
        if not has_value and not has_properties:
            raise ValidationError("needs a value (a template) or nested properties")
        kind = original_data.get("type", "object")
        if has_properties and kind != "object" and kind in OUTPUT_TYPES:
            raise ValidationError({"properties": [f"only an object has nested properties (type is {kind})"]})

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> OutputProperty:
        return _built(OutputProperty, **data)


class OutputSchema(_StrictSchema):
    properties = _OutputProperties(required=True)
    required = _List(_String(), load_default=tuple)  # must name properties: composite_problems

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> OutputSpec:
        return _built(OutputSpec, properties=data["properties"], required=tuple(data["required"]))


class AnnotationsSchema(_StrictSchema.from_dict(
    {key: _String() if key == "title" else _Boolean() for key in ANNOTATION_KEYS}
)):
    """Explicit MCP tool annotations; keys as MCP spells them (``readOnlyHint``)."""

    error_messages = {"unknown": f"unknown annotation (MCP tool annotations are {', '.join(ANNOTATION_KEYS)})"}


class CompositeToolSchema(_StrictSchema):
    name = _String(required=True, validate=_composite_name)
    description = _String(required=True, validate=_not_blank)
    parameters = _Parameters(load_default=lambda: {"type": "object", "properties": {}})
    timeout = _Duration(load_default=DEFAULT_COMPOSITE_TIMEOUT)
    max_parallel = _Integer(
        data_key="maxParallel",
        load_default=DEFAULT_MAX_PARALLEL,
        validate=validate.Range(min=1, error="must be at least 1"),
    )
    annotations = _Nested(AnnotationsSchema, load_default=None, allow_none=True)
    output = _Nested(OutputSchema, load_default=None, allow_none=True)
    steps = _List(
        _Nested(StepSchema),
        required=True,
        validate=validate.Length(min=1, error="must list at least one step"),
    )

    # Runs even when fields failed, on a sketch of the raw input, so one validate run
    # shows a composite's template and graph problems together with its field errors.
    @validates_schema(pass_original=True, skip_on_field_errors=False)
    def _check_templates_and_graph(self, data: Any, original_data: Any, **kwargs: Any) -> None:
        tool = _sketch(original_data)
        if tool is None:
            return
        problems = composite_problems(tool)
        if problems:
            raise ValidationError(_nest_problems(tool, problems))

    @post_load
    def _build(self, data: dict[str, Any], **kwargs: Any) -> CompositeTool:
        return _built(CompositeTool, steps=tuple(data.pop("steps")), **data)


def _sketch(raw: Any) -> CompositeTool | None:
    """What ``composite_problems`` needs of a composite, read leniently from raw input:
    every step keeps its index (a step too broken to read gets a placeholder), values
    that failed their own checks fall back to defaults (their errors are reported by
    the fields). None if there are no steps to look at."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("steps"), list) or not raw["steps"]:
        return None
    steps = [_sketch_step(index, step) for index, step in enumerate(raw["steps"])]
    output = None
    try:
        output = _sketch_output(raw.get("output"))
    except (TypeError, ValueError, AttributeError):
        pass  # an output too broken to read: its fields say why
    name = raw.get("name") if isinstance(raw.get("name"), str) else "?"
    return CompositeTool(name, "", {}, tuple(steps), output=output)


def _sketch_step(index: int, raw: Any) -> Step:
    raw = raw if isinstance(raw, Mapping) else {}
    step_id = raw.get("id") if isinstance(raw.get("id"), str) and raw.get("id") else f"steps[{index}]"
    on_error = raw.get("onError") if isinstance(raw.get("onError"), Mapping) else {}
    action = on_error.get("action") if on_error.get("action") in ON_ERROR_ACTIONS else "abort"
    depends_on = raw.get("dependsOn") if isinstance(raw.get("dependsOn"), list) else []
    common = {
        "depends_on": tuple(dep for dep in depends_on if isinstance(dep, str)),
        "condition": raw.get("condition") if isinstance(raw.get("condition"), str) else None,
        "on_error": OnError(action),
        "default_results": raw.get("defaultResults"),
    }
    if raw.get("type") == "forEach":
        inner = raw.get("step") if isinstance(raw.get("step"), Mapping) else {}
        collection = raw.get("collection") if isinstance(raw.get("collection"), str) else "[]"
        return Step(step_id, "?", inner.get("arguments"), type="forEach", for_each=ForEach(collection), **common)
    if raw.get("type") == "elicitation":
        message = raw.get("message") if isinstance(raw.get("message"), str) and raw.get("message") else "?"
        return Step(step_id, None, None, type="elicitation", message=message, elicitation_schema={}, **common)
    return Step(step_id, "?", raw.get("arguments"), **common)


def _sketch_output(raw: Any) -> OutputSpec | None:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("properties"), Mapping):
        return None

    def properties(raw_properties: Mapping[str, Any]) -> dict[str, OutputProperty]:
        sketched = {}
        for name, prop in raw_properties.items():
            if not isinstance(prop, Mapping):
                continue
            nested = prop.get("properties")
            if isinstance(nested, Mapping):
                sketched[str(name)] = OutputProperty(properties=properties(nested))
            elif isinstance(prop.get("value"), str):
                sketched[str(name)] = OutputProperty(prop["value"])
        return sketched

    required = raw.get("required") if isinstance(raw.get("required"), list) else []
    return OutputSpec(properties(raw["properties"]), tuple(name for name in required if isinstance(name, str)))


def _nest_problems(tool: CompositeTool, problems: list[tuple[str, str]]) -> dict[str, Any]:
    """``composite_problems``' ``(path, message)`` pairs as marshmallow's nested messages,
    at the YAML's places: a forEach step's arguments live under its ``step``."""
    messages: dict[Any, Any] = {}
    for path, message in problems:
        parts = _path_parts(path)
        if (len(parts) > 2 and parts[0] == "steps" and isinstance(parts[1], int)
                and parts[2] == "arguments" and tool.steps[parts[1]].for_each is not None):
            parts.insert(2, "step")
        _add_message(messages, parts, message)
    return messages


def _add_message(messages: dict[Any, Any], path: Sequence[str | int], message: str) -> None:
    """Put ``message`` at ``path`` in marshmallow's nested messages; the ``_schema`` key
    lets a place hold messages of its own besides those of places under it."""
    node = messages
    for part in path:
        node = node.setdefault(part, {})
    node.setdefault(SCHEMA, []).append(message)


_INDICES = re.compile(r"((?:\[\d+\])*)$")


def _path_parts(path: str) -> list[str | int]:
    """``steps[2].dependsOn[0]`` -> ``["steps", 2, "dependsOn", 0]``; it renders back to
    the same text (a key holding a dot reads as two keys, which print alike)."""
    parts: list[str | int] = []
    for segment in path.split("."):
        indices = _INDICES.search(segment).group(1)
        name = segment[: len(segment) - len(indices)]
        if name or not indices:
            parts.append(name)
        parts.extend(int(index) for index in re.findall(r"\d+", indices))
    return parts


# --- checks across the config -----------------------------------------------------------


@dataclass(frozen=True)
class _Override:
    """An ``aggregation.tools[].overrides`` entry of a configured backend, named as the
    gateway will name the tool."""

    workload: str
    original: str
    override: ToolOverride
    path: str  # aggregation.tools[j].overrides.<original>
    resolved_name: str  # after the override, before prefixing
    advertised_as: str  # when no other backend's tool claims the name
    visible: bool  # not hidden by excludeAllTools, excludeAll or filter


def composite_reference_problems(
    composites: Sequence[Any], aggregation: AggregationConfig | None, backends: set[str]
) -> dict[str, Any]:
    """Problems of the loaded composites that need the rest of the config, as marshmallow's
    nested messages under ``compositeTools``; ``{}`` when there are none. A composite whose
    fields failed is the dict of what did load (``_loaded``); the checks that need the
    aggregation's rules run once it loaded (``aggregation`` is None until then)."""
    errors: dict[Any, Any] = {}

    def add(index: int, path: tuple[str | int, ...], message: str) -> None:
        _add_message(errors, (index, *path), message)

    first_index: dict[str, int] = {}
    for index, composite in enumerate(composites):
        name = _loaded(composite, "name")
        if name is None:
            continue
        if name in first_index:
            add(index, ("name",), f"duplicate composite name {name!r} (also compositeTools[{first_index[name]}])")
        else:
            first_index[name] = index

    overrides = _configured_overrides(aggregation, backends) if aggregation is not None else []
    renamed_and_shown = {o.advertised_as: o for o in overrides if o.override.name is not None and o.visible}
    for index, composite in enumerate(composites):
        name = _loaded(composite, "name")
        label = f"composite {name!r}"
        clash = renamed_and_shown.get(name)
        if clash is not None:
            add(index, ("name",), f"{name!r} is also the name clients see for {clash.workload}.{clash.original} "
                                  f"(renamed by {clash.path}.name); composite and backend tools share one list "
                                  "of names, rename one of them")

        step_tools = list(_step_tools(composite))
        for step_id, tool, path in step_tools:
            if tool in first_index:
                add(index, path, f"{label}, step {step_id!r}: {tool!r} is a composite tool, and composite tools "
                                 "cannot call composite tools")

        explicit = _loaded(composite, "annotations")
        if not explicit:
            continue
        for step_id, tool, _ in step_tools:
            reached = _override_reached_by(tool, overrides)
            if reached is None or reached.override.annotations is None:
                continue
            for hint in HINTS:
                if hint in explicit:
                    for claim in unsafe_claims({hint: explicit[hint]}, [(step_id, reached.override.annotations)],
                                               known_only=True):
                        add(index, ("annotations", hint), f"{label}: {claim} (set by {reached.path}.annotations)")
    return {"compositeTools": errors} if errors else {}


def _step_tools(composite: Any) -> Iterator[tuple[str, str, tuple[str | int, ...]]]:
    """``(step id, tool, path of the tool)`` of each loaded step whose tool loaded."""
    for index, step in enumerate(_loaded(composite, "steps") or ()):
        if isinstance(step, Step):
            for_each, tool, step_id = step.for_each is not None, step.tool, step.id
        else:  # a step with failed fields: what loaded of it, the inner step's tool under `step`
            for_each = step.get("type") == "forEach"
            tool = _loaded(step.get("step"), "tool") if for_each else step.get("tool")
            step_id = step.get("id")
        if tool is not None:
            path = ("steps", index, "step", "tool") if for_each else ("steps", index, "tool")
            yield step_id or f"steps[{index}]", tool, path


def _configured_overrides(aggregation: AggregationConfig, backends: set[str]) -> list[_Override]:
    """Every override of a configured backend, named by the aggregation's own rules."""
    found = []
    for index, tools in enumerate(aggregation.tools):
        if tools.workload not in backends:
            continue  # reported as an unknown backend
        for original, override in tools.overrides.items():
            resolved = override.name or original
            found.append(_Override(
                workload=tools.workload,
                original=original,
                override=override,
                path=f"aggregation.tools[{index}].overrides.{original}",
                resolved_name=resolved,
                advertised_as=aggregation.advertised_name(tools.workload, resolved),
                visible=aggregation.is_advertised(tools.workload, resolved, original),
            ))
    return found


def _override_reached_by(tool: str, overrides: list[_Override]) -> _Override | None:
    """The override a step's tool reaches, in ``Catalog.resolve_internal``'s order: an
    advertised name first, then ``workload.tool`` by the backend's own name, then by the
    name its override gives it."""
    if not tool or tool.startswith("."):
        return None
    exact = next((o for o in overrides if o.advertised_as == tool), None)
    if exact is not None:
        return exact
    workload, dot, name = tool.partition(".")
    if not dot or not name:
        return None
    mine = [o for o in overrides if o.workload == workload]
    return (next((o for o in mine if o.original == name), None)
            or next((o for o in mine if o.resolved_name == name), None))
