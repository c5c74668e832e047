"""The one Jinja environment composite-tool templates run in.

Sandboxed (``ImmutableSandboxedEnvironment``: no underscore or internal attributes, no
``list.append``-style mutation of the data a template reads), no loader (no file access),
``StrictUndefined`` (a typo is an error, not an empty string), autoescape off.

Resource limits, best effort: Jinja cannot bound every way a template can burn CPU or
memory, so the obvious amplifiers are capped: ``range()`` (items per render, all calls
together), ``*`` / ``+`` on strings and lists, ``**`` on integers, printf and
``str.format`` widths, and the filters that take a size (``center``, ``indent``,
``replace``, ``format``, ``slice``, ``batch``); rendered text is capped as well. ``~``
and ``join`` are not capped. Templates come from the operator's config, never from
clients or backends (data is never rendered a second time), so the limits catch
mistakes and keep a bad template from taking the process down; they are not a boundary
against a hostile config author.

Values become text the JSON way: a string as itself, anything else as compact JSON
(``true``, ``null``, ``{"a":1}``), never Python's ``True``/``None``/``{'a': 1}``.
"""

from __future__ import annotations

import json
import math
import re
import string
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from functools import wraps
from typing import Any

from jinja2 import StrictUndefined, Undefined
from jinja2.filters import FILTERS
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from vmcp_actors.workflows._errors import TemplateRenderError

MAX_TEXT = 10 * 1024 * 1024  # characters (or list items) one value may grow to, as ToolHive's 10 MB
MAX_RANGE_ITEMS = 100_000  # range() items in one render, all calls together
MAX_FORMAT_WIDTH = 10_000  # widths and precisions in printf / str.format specs, and filter sizes
MAX_INT_BITS = 10_000  # integers a template may build with * and **
MAX_DATA_DEPTH = 256  # nesting of a value turned into JSON data

_range_budget: ContextVar[list[int] | None] = ContextVar("workflow_template_range_budget", default=None)

# %[(name)][flags][width][.precision][length]type, as Python's printf-style formatting.
_PRINTF_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[diouxXeEfFgGcrsa%]")
_DIGITS = re.compile(r"\d+")


@contextmanager
def render_budget() -> Iterator[None]:
    """Give the renders inside this block one fresh ``range()`` budget."""
    token = _range_budget.set([MAX_RANGE_ITEMS])
    try:
        yield
    finally:
        _range_budget.reset(token)


# -- JSON data ---------------------------------------------------------------------------


def to_data(value: Any, _depth: int = 0) -> Any:
    """``value`` as plain JSON data (dict, list, str, int, float, bool, None), copied.

    Iterables that are not mappings (tuples, ranges, the generators ``map``/``select``
    return) become lists. An undefined value raises its error (a typo, or a refused
    attribute); anything else that is not data is an error rather than a Python repr.
    """
    if isinstance(value, Undefined):
        str(value)  # StrictUndefined and the sandbox's refusals raise here
        raise TemplateRenderError("the template yields an undefined value")
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return str(value)
    if _depth >= MAX_DATA_DEPTH:
        raise TemplateRenderError(f"value is nested deeper than {MAX_DATA_DEPTH} levels")
    if isinstance(value, Mapping):
        return {_json_key(key): to_data(item, _depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset, range, Iterator)) and not isinstance(value, LoopContext):
        return [to_data(item, _depth + 1) for item in value]
    raise TemplateRenderError(f"the template yields a {type(value).__name__} value, which is not JSON data")


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return str(key)
    if key is None or isinstance(key, (bool, int, float)):
        return json.dumps(key)  # what json.dumps would write for the key
    raise TemplateRenderError(f"a mapping key of type {type(key).__name__} is not JSON data")


def compact_json(value: Any) -> str:
    return json.dumps(to_data(value), separators=(",", ":"), ensure_ascii=False)


def as_text(value: Any) -> str:
    """How an expression is written into surrounding text: strings as is, the rest as JSON."""
    if isinstance(value, str):
        return value
    return compact_json(value)


# -- filters -----------------------------------------------------------------------------


def _fromjson(value: Any) -> Any:
    if not isinstance(value, str):
        raise TemplateRenderError(f"fromjson expects a string, got {type(value).__name__}")
    try:
        return json.loads(value)
    except ValueError as err:
        raise TemplateRenderError(f"fromjson: not valid JSON ({err})") from None


def _quote(value: Any) -> str:
    """A JSON string literal: of the string itself, or of a non-string's compact JSON."""
    return json.dumps(value if isinstance(value, str) else compact_json(value), ensure_ascii=False)


def _guard_size(what: str, size: Any, limit: int = MAX_FORMAT_WIDTH) -> None:
    if isinstance(size, int) and size > limit:
        raise SecurityError(f"{what} of {size} exceeds the limit of {limit}")


def _guarded(name: str, check):
    """The builtin filter ``name``, preceded by ``check`` on the same arguments (minus the
    environment or eval context Jinja passes first to some filters)."""
    builtin = FILTERS[name]
    passes_first = getattr(builtin, "jinja_pass_arg", None) is not None

    @wraps(builtin)  # copies jinja_pass_arg, so Jinja passes what the builtin expects
    def filter_(*args, **kwargs):
        check(*(args[1:] if passes_first else args), **kwargs)
        return builtin(*args, **kwargs)

    return filter_


def _check_center(value: Any, width: Any = 80) -> None:
    _guard_size("center width", width)


def _check_indent(s: Any, width: Any = 4, *args: Any, **kwargs: Any) -> None:
    prefix = len(width) if isinstance(width, str) else width
    if isinstance(prefix, int):
        text = str(s)
        _guard_size("indent result length", len(text) + (text.count("\n") + 1) * prefix, MAX_TEXT)


def _check_replace(s: Any, old: Any, new: Any, count: Any = None) -> None:
    text, old, new = str(s), str(old), str(new)
    hits = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    _guard_size("replace result length", len(text) + hits * (len(new) - len(old)), MAX_TEXT)


def _check_format(value: Any, *args: Any, **kwargs: Any) -> None:
    check_printf(str(value))


def _check_slice(value: Any, slices: Any = 1, *args: Any, **kwargs: Any) -> None:
    _guard_size("slice count", slices)


def _check_batch(value: Any, linecount: Any = 1, *args: Any, **kwargs: Any) -> None:
    _guard_size("batch size", linecount)


def check_printf(fmt: str) -> None:
    for match in _PRINTF_SPEC.finditer(fmt):
        for size in match.groups():
            if size == "*":
                raise SecurityError("'*' widths in printf formats are not allowed in templates")
            if size is not None:
                _guard_size("format width", int(size))


def _check_str_format(fmt: str) -> None:
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # str.format raises its own, clearer error
    for _, _, spec, _ in fields:
        if not spec:
            continue
        if "{" in spec:
            raise SecurityError("nested fields in str.format specs are not allowed in templates")
        for size in _DIGITS.findall(spec):
            _guard_size("format width", int(size))


# -- the environment ---------------------------------------------------------------------


def _budgeted_range(*args: int) -> range:
    items = range(*args)
    budget = _range_budget.get()
    remaining = budget[0] if budget is not None else MAX_RANGE_ITEMS
    if len(items) > remaining:
        raise SecurityError(f"range() would exceed the limit of {MAX_RANGE_ITEMS} items in one template")
    if budget is not None:
        budget[0] -= len(items)
    return items


class WorkflowSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def getattr(self, obj: Any, attribute: str) -> Any:
        # Data wins over methods: ``output.items`` is the key "items" when there is one.
        if isinstance(obj, Mapping) and attribute in obj:
            return obj[attribute]
        return super().getattr(obj, attribute)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            _check_product(left, right)
        elif operator == "**":
            _check_power(left, right)
        elif operator == "%" and isinstance(left, str):
            check_printf(left)
        elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            _guard_size("'+' result length", len(left) + len(right), MAX_TEXT)
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value: Any) -> Any:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt = value.__self__

        @wraps(wrapper)
        def checked(*args: Any, **kwargs: Any) -> str:
            _check_str_format(fmt)
            return wrapper(*args, **kwargs)

        return checked


def _check_product(left: Any, right: Any) -> None:
    for sequence, times in ((left, right), (right, left)):
        if isinstance(sequence, (str, list, tuple)) and isinstance(times, int):
            _guard_size("'*' result length", len(sequence) * times, MAX_TEXT)
    if _is_int(left) and _is_int(right):
        _guard_size("'*' result size in bits", left.bit_length() + right.bit_length(), MAX_INT_BITS)


def _check_power(base: Any, exponent: Any) -> None:
    if _is_int(base) and _is_int(exponent) and abs(base) > 1 and exponent > 0:
        _guard_size("'**' result size in bits", math.ceil(math.log2(abs(base))) * exponent, MAX_INT_BITS)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _build_environment() -> WorkflowSandbox:
    environment = WorkflowSandbox(
        undefined=StrictUndefined,
        autoescape=False,
        loader=None,
        finalize=as_text,
    )
    environment.globals.pop("lipsum", None)  # lorem ipsum: no use here, and a CPU sink
    environment.globals["range"] = _budgeted_range
    environment.filters.update(
        tojson=compact_json,
        fromjson=_fromjson,
        quote=_quote,
        center=_guarded("center", _check_center),
        indent=_guarded("indent", _check_indent),
        replace=_guarded("replace", _check_replace),
        format=_guarded("format", _check_format),
        slice=_guarded("slice", _check_slice),
        batch=_guarded("batch", _check_batch),
    )
    return environment


ENVIRONMENT = _build_environment()
