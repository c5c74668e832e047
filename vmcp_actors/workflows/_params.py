"""Composite tools' parameters checked against their JSON Schema (pure: the config's
load and the engine both use it)."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError as SchemaValidationError
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from referencing.exceptions import Unresolvable

from vmcp_actors.protocol import INTERNAL_ERROR, INVALID_PARAMS, JsonRpcError
from vmcp_actors.workflows._coercion import _has_type as has_json_type

_JSON_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")


def validate_params(params: Any, schema: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with the schema's defaults filled in (top level and in nested object
    properties), then validated against ``schema`` with jsonschema (Draft 2020-12 unless
    ``$schema`` names another draft; ``format`` is not asserted). ``JsonRpcError(-32602)``
    names one problem, the shallowest (jsonschema's ``best_match``), and where it is."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise JsonRpcError(INVALID_PARAMS, "Invalid params: arguments must be an object")
    schema = schema if isinstance(schema, Mapping) else {}
    filled = _with_defaults(params, schema)
    try:
        problem = best_match(schema_validator(json.dumps(schema, sort_keys=True, default=dict)).iter_errors(filled))
    except Unresolvable as err:
        # The gateway fetches no schemas, and the config cannot tell that every $ref resolves.
        message = f"the parameters schema has a $ref that cannot be resolved: {err.ref}"
        raise JsonRpcError(INTERNAL_ERROR, message) from None
    if problem is not None:
        raise JsonRpcError(INVALID_PARAMS, f"Invalid params: {problem_text(problem)}")
    return filled


@functools.lru_cache(maxsize=256)
def schema_validator(schema_json: str) -> Validator:
    """One validator per schema (keyed by its JSON text), reused by every call."""
    schema = json.loads(schema_json)
    return validator_for(schema, default=Draft202012Validator)(schema)


def _with_defaults(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` with the ``default`` of each missing object property filled in, recursively
    (a default filled in gets its own nested defaults too)."""
    properties = schema.get("properties")
    if not isinstance(value, dict) or not isinstance(properties, Mapping):
        return value
    result = dict(value)
    for name, sub in properties.items():
        if not isinstance(sub, Mapping):
            continue
        if name not in result and "default" in sub:
            result[name] = copy.deepcopy(sub["default"])
        if name in result:
            result[name] = _with_defaults(result[name], sub)
    return result


def problem_text(error: SchemaValidationError) -> str:
    """``error`` placed by its path within the arguments (``a.b[0]``); missing properties
    and wrong types in the words clients already get."""
    where = ""
    for part in error.absolute_path:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else part)
    if error.validator == "required":
        missing = next((name for name in error.validator_value if name not in error.instance), None)
        if missing is not None:
            return f"missing required property {_join(where, missing)!r}"
    if error.validator == "type":
        types = error.validator_value
        names = [types] if isinstance(types, str) else list(types)
        return f"{where or 'arguments'} must be {' or '.join(names)}, got {json_type(error.instance)}"
    return f"{where or 'arguments'}: {error.message}"


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def json_type(value: Any) -> str:
    for name in _JSON_TYPES:
        if has_json_type(value, name):
            return name
    return type(value).__name__
