"""Coercing rendered arguments to the types of the target tool's input schema.

Templates often yield strings ("5", "true", '[1, 2]') where the target tool wants numbers,
booleans or arrays, and whole-value templates can yield a number where it wants a string.
One rule decides: a value the schema already accepts is left alone; a value it does not
accept is converted to the first declared type it can become; a value that can become
none of them is left as it is and the backend decides.

Conversions:

* to ``integer``: "5" -> 5, "5.0" and "1e3" -> 5 and 1000 (integral only);
* to ``number``: "2.5" -> 2.5, "5" -> 5 (JSON number syntax; no "nan", "inf", "1_000");
* to ``boolean``: "true"/"false"/"1"/"0", any case, surrounding spaces ignored;
* to ``null``: "null";
* to ``array`` / ``object``: a string holding JSON of that type, via ``json.loads``;
* to ``string``: a number or boolean as JSON text ("5", "true"), an array or object as
  compact JSON.

The walk follows ``properties`` and ``additionalProperties`` (a schema) of objects,
``prefixItems`` and ``items`` of arrays, ``$ref`` to ``#/...`` inside the same schema,
``allOf`` (each in turn), and ``anyOf``/``oneOf`` (the first alternative the value
already fits, else the first it can be converted to). A ``type`` list such as
``["integer", "null"]`` works like ``anyOf`` over its types. ``patternProperties``,
``if``/``then`` and remote ``$ref`` are not followed. The input is never mutated.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

MAX_DEPTH = 100  # schema/value nesting walked; deeper values are left as they are
MAX_REF_HOPS = 32  # $ref chains followed before giving up (a ref to itself, say)

_JSON_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}
_NO_CONVERSION = object()


def coerce_arguments(arguments: Mapping[str, Any], input_schema: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` as a new dict, its values coerced to ``input_schema``'s types."""
    if not isinstance(input_schema, Mapping):
        return dict(arguments)
    coerced = _Coercer(input_schema).coerce(dict(arguments), input_schema, 0)
    return coerced if isinstance(coerced, dict) else dict(arguments)


class _Coercer:
    def __init__(self, root: Mapping[str, Any]):
        self.root = root

    def coerce(self, value: Any, schema: Any, depth: int) -> Any:
        schema = self.resolve(schema)
        if not isinstance(schema, Mapping) or depth > MAX_DEPTH:
            return value
        for part in schema.get("allOf") or ():
            value = self.coerce(value, part, depth + 1)
        for keyword in ("anyOf", "oneOf"):
            alternatives = schema.get(keyword)
            if isinstance(alternatives, list) and alternatives:
                value = self.choose(value, alternatives, depth)
        types = _types(schema)
        if not types:
            return value
        for type_ in types:
            if _has_type(value, type_):
                return self.descend(value, type_, schema, depth)
        for type_ in types:
            converted = _convert(value, type_)
            if converted is not _NO_CONVERSION:
                return self.descend(converted, type_, schema, depth)
        return value

    def choose(self, value: Any, alternatives: list[Any], depth: int) -> Any:
        for alternative in alternatives:
            if self.fits(value, alternative):
                return self.coerce(value, alternative, depth + 1)
        for alternative in alternatives:
            coerced = self.coerce(value, alternative, depth + 1)
            if self.fits(coerced, alternative):
                return coerced
        return value

    def fits(self, value: Any, schema: Any, depth: int = 0) -> bool:
        """Whether ``schema`` accepts ``value`` at its top level (type, enum, const)."""
        schema = self.resolve(schema)
        if not isinstance(schema, Mapping) or depth > MAX_DEPTH:
            return True
        if "const" in schema and not _same(value, schema["const"]):
            return False
        if isinstance(schema.get("enum"), list) and not any(_same(value, option) for option in schema["enum"]):
            return False
        types = _types(schema)
        if types and not any(_has_type(value, type_) for type_ in types):
            return False
        for keyword in ("anyOf", "oneOf"):
            alternatives = schema.get(keyword)
            if isinstance(alternatives, list) and alternatives:
                if not any(self.fits(value, alternative, depth + 1) for alternative in alternatives):
                    return False
        return all(self.fits(value, part, depth + 1) for part in schema.get("allOf") or ())

    def descend(self, value: Any, type_: str, schema: Mapping[str, Any], depth: int) -> Any:
        if type_ == "object" and isinstance(value, dict):
            properties = schema.get("properties")
            properties = properties if isinstance(properties, Mapping) else {}
            additional = schema.get("additionalProperties")
            coerced = {}
            for key, item in value.items():
                item_schema = properties.get(key, additional if isinstance(additional, Mapping) else None)
                coerced[key] = self.coerce(item, item_schema, depth + 1) if item_schema is not None else item
            return coerced
        if type_ == "array" and isinstance(value, list):
            prefix, rest = _item_schemas(schema)
            return [
                self.coerce(item, prefix[index] if index < len(prefix) else rest, depth + 1)
                for index, item in enumerate(value)
            ]
        return value

    def resolve(self, schema: Any) -> Any:
        """Follow ``$ref`` to ``#/...`` within the root schema; anything else resolves to itself."""
        for _ in range(MAX_REF_HOPS):
            if not isinstance(schema, Mapping) or not isinstance(schema.get("$ref"), str):
                return schema
            schema = _pointer(self.root, schema["$ref"])
        return None


def _types(schema: Mapping[str, Any]) -> list[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [type_ for type_ in declared if isinstance(type_, str)]
    if "properties" in schema:
        return ["object"]
    if "items" in schema or "prefixItems" in schema:
        return ["array"]
    return []


def _has_type(value: Any, type_: str) -> bool:
    if type_ == "string":
        return isinstance(value, str)
    if type_ == "integer":
        return _is_number(value) and (isinstance(value, int) or (math.isfinite(value) and value.is_integer()))
    if type_ == "number":
        return _is_number(value)
    if type_ == "boolean":
        return isinstance(value, bool)
    if type_ == "null":
        return value is None
    if type_ == "array":
        return isinstance(value, list)
    if type_ == "object":
        return isinstance(value, dict)
    return False


def _convert(value: Any, type_: str) -> Any:
    """``value`` converted to ``type_``, or ``_NO_CONVERSION``."""
    if type_ == "string":
        if isinstance(value, (bool, int, float)):
            return json.dumps(value)
        if isinstance(value, (dict, list)):
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        return _NO_CONVERSION
    if not isinstance(value, str):
        return _NO_CONVERSION
    text = value.strip()
    if type_ in ("integer", "number"):
        number = _parse_number(text)
        if type_ == "integer" and isinstance(number, float):
            return int(number) if number.is_integer() else _NO_CONVERSION
        return number
    if type_ == "boolean":
        return _BOOLEANS.get(text.lower(), _NO_CONVERSION)
    if type_ == "null":
        return None if text == "null" else _NO_CONVERSION
    if type_ in ("array", "object"):
        try:
            parsed = json.loads(text)
        except ValueError:
            return _NO_CONVERSION
        return parsed if _has_type(parsed, type_) else _NO_CONVERSION
    return _NO_CONVERSION


def _parse_number(text: str) -> Any:
    """An int or a finite float from JSON number syntax, or ``_NO_CONVERSION``."""
    if not _JSON_NUMBER.fullmatch(text):
        return _NO_CONVERSION
    try:
        return int(text)
    except ValueError:
        number = float(text)
    return number if math.isfinite(number) else _NO_CONVERSION


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same(value: Any, option: Any) -> bool:
    """JSON equality: True is not 1."""
    return value == option and isinstance(value, bool) == isinstance(option, bool)


def _item_schemas(schema: Mapping[str, Any]) -> tuple[list[Any], Any]:
    """Per-position schemas and the schema for the rest (2020-12 and draft-4 spellings)."""
    items = schema.get("items")
    if isinstance(items, list):  # draft 4: items as a tuple
        return items, schema.get("additionalItems")
    prefix = schema.get("prefixItems")
    return (prefix if isinstance(prefix, list) else []), items


def _pointer(root: Mapping[str, Any], reference: str) -> Any:
    if not reference.startswith("#"):
        return None  # remote references are not fetched
    node: Any = root
    for token in reference[1:].split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node
