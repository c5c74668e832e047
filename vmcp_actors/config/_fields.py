"""Field classes, validators and helpers shared by the config schema modules
(``_schema.py`` for the gateway's sections, ``_composite.py`` for compositeTools)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, pre_load, validate
from marshmallow.utils import missing

from vmcp_actors.protocol import is_valid_tool_name

from ._durations import parse_duration

# --- fields -----------------------------------------------------------------------------


class _PlainMessages:
    """Lower-case messages that read well after a ``path:``."""

    default_error_messages = {
        "required": "is required",
        "null": "must not be null",
        "validator_failed": "invalid value",
    }


class _String(_PlainMessages, fields.String):
    default_error_messages = {"invalid": "must be a string", "invalid_utf8": "must be valid UTF-8"}


class _Integer(_PlainMessages, fields.Integer):
    """An integer written as one: no strings, floats or booleans."""

    default_error_messages = {"invalid": "must be an integer", "too_large": "is too large"}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(strict=True, **kwargs)

    def _validated(self, value: Any) -> int:
        if isinstance(value, bool):  # YAML `true` is an int to Python
            raise self.make_error("invalid", input=value)
        return super()._validated(value)


class _Boolean(_PlainMessages, fields.Field):
    """``true`` or ``false`` as YAML booleans: no strings or numbers."""

    default_error_messages = {"invalid": "must be true or false"}

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


class _List(_PlainMessages, fields.List):
    default_error_messages = {"invalid": "must be a list"}

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> list[Any]:
        try:
            return super()._deserialize(value, attr, data, **kwargs)
        except ValidationError as err:
            # What loaded goes on to the checks across sections (see ``_loaded``) only if it
            # keeps its indices: an item that failed with nothing loaded would shift them.
            aligned = isinstance(err.valid_data, list) and len(err.valid_data) == len(value)
            raise ValidationError(err.messages, valid_data=err.valid_data if aligned else None) from None


class _Nested(_PlainMessages, fields.Nested):
    pass


class _Duration(_PlainMessages, fields.Field):
    """``30s`` -> 30.0 seconds; ``allow_zero`` also takes ``0``, ``at_most`` is a duration like ``5m``."""

    def __init__(self, *, allow_zero: bool = False, at_most: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.allow_zero = allow_zero
        self.at_most = at_most
        self.max_seconds = parse_duration(at_most) if at_most is not None else None

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> float:
        try:
            seconds = parse_duration(value, allow_zero=self.allow_zero)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
        if self.max_seconds is not None and seconds > self.max_seconds:
            raise ValidationError(f"must be at most {self.at_most}")
        return seconds


class _JsonMapping(_PlainMessages, fields.Field):
    """A mapping of string keys to JSON values (what a client will receive as JSON)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ValidationError("must be a mapping")
        errors: dict[str, list[str]] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                errors[str(key)] = ["names must be strings (quote them in YAML)"]
            elif not _is_json(item):
                errors[key] = [
                    "must be a JSON value (string, finite number, boolean, null, list, mapping with string keys)"
                ]
        if errors:
            raise ValidationError(errors)
        return dict(value)


def _is_json(value: Any) -> bool:
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_is_json(item) for item in value)
    if isinstance(value, Mapping):
        return all(isinstance(key, str) and _is_json(item) for key, item in value.items())
    return False  # e.g. a YAML date or binary


class NotSupportedYet(fields.Field):
    """A contract field this project has not built yet: any value at all is an error."""

    def __init__(self, hint: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hint = hint

    def deserialize(self, value: Any, attr: str | None = None, data: Any = None, **kwargs: Any) -> Any:
        if value is missing:
            return missing
        raise ValidationError(f"{self.data_key or self.name} is not supported yet{self.hint}")


# --- validators -------------------------------------------------------------------------


class _Choice(validate.Validator):
    """One of ``supported``; values in ``not_yet`` are part of the contract but not built."""

    def __init__(self, supported: Iterable[str], not_yet: Iterable[str] = (), hint: str = "") -> None:
        self.supported = tuple(supported)
        self.not_yet = tuple(not_yet)
        self.hint = hint

    def __call__(self, value: str) -> str:
        if value in self.supported:
            return value
        if value in self.not_yet:
            raise ValidationError(f"{value!r} is not supported yet{self.hint}")
        raise ValidationError(f"must be one of {', '.join(self.supported + self.not_yet)}")


def _not_blank(value: str) -> None:
    if not value.strip():
        raise ValidationError("must not be empty")


def _tool_name(value: str) -> None:
    if not is_valid_tool_name(value):
        raise ValidationError("must be an MCP tool name: 1-128 letters, digits, '_', '-' or '.'")


# --- schemas and what they loaded --------------------------------------------------------


class _StrictSchema(Schema):
    error_messages = {"unknown": "unknown field", "type": "must be a mapping"}

    class Meta:
        unknown = RAISE

    @pre_load
    def _stringify_keys(self, data: Any, **kwargs: Any) -> Any:
        # YAML allows `1: x`; an int key would later read as a list index in the error path.
        if isinstance(data, Mapping) and not all(isinstance(key, str) for key in data):
            return {str(key): value for key, value in data.items()}
        return data


def _loaded(section: Any, name: str) -> Any:
    """Field ``name`` of a loaded section, None if it did not load. A section whose fields
    all loaded is its built dataclass; one where some failed is the dict of those that
    loaded (marshmallow hands that on), so checks across sections still run beside the
    field errors and one ``validate`` run shows every problem."""
    if isinstance(section, Mapping):
        return section.get(name)
    return getattr(section, name, None)
