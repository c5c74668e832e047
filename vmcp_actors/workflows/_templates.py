"""Composite-tool templates: compile them, render them into a step's arguments, evaluate
conditions, and find which steps a template reads.

The context a template sees (build it with :func:`template_context`)::

    params.<name>                          the composite tool's arguments
    steps.<id>.output / .status / .error   steps that have finished (completed, failed, skipped)
    workflow.id                            this run's id
    forEach.<itemVar>, forEach.index       inside a forEach iteration

Templates are Jinja in the sandbox of ``_sandbox.py``; ToolHive's Go path form
(``{{.params.x}}``) is translated first (``_toolhive_syntax.py`` lists the forms).
Filters beyond Jinja's: ``tojson`` (compact JSON), ``fromjson``, ``quote`` (a JSON string
literal). A mapping key wins over a method of the same name (``output.items``).

Whole value or text:

* A string that is exactly one expression, ``"{{ steps.a.output }}"``, with nothing before
  or after it (not even a space; a single trailing newline is ignored, as Jinja does),
  renders to the expression's value itself: a dict, list, number, bool or null passes
  through as data, copied.
* Anything else renders to a string, each expression written as text: a string as is,
  any other value as compact JSON (``true``, ``null``, ``[1,2]``).
* A string with neither ``{{`` nor ``{%`` is not a template and is kept as is.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.meta
from jinja2 import nodes
from jinja2.environment import TemplateExpression
from jinja2.sandbox import SecurityError

from vmcp_actors.workflows._errors import (
    TemplateError,
    TemplateRenderError,
    TemplateSyntaxError,
    UnsafeTemplate,
)
from vmcp_actors.workflows._sandbox import ENVIRONMENT, MAX_TEXT, render_budget, to_data
from vmcp_actors.workflows._toolhive_syntax import (
    SUPPORTED_FORMS,
    go_control_action,
    looks_like_go_template,
    translate_go_paths,
)

MAX_ARGUMENT_DEPTH = 100  # nesting of an arguments structure render_value walks (as ToolHive)
_STEP_METADATA = frozenset({"status", "error"})  # what a template may read of a step without its output


# -- context -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StepOutcome:
    """What templates may read of a finished step. ``status`` is ToolHive's word:
    ``completed``, ``failed`` or ``skipped`` (a skipped step's output is its defaultResults)."""

    status: str
    output: Any = None
    error: str | None = None


@dataclass(frozen=True)
class ForEachItem:
    """The current iteration of a forEach step: ``forEach.<item_var>`` and ``forEach.index``."""

    item: Any
    index: int
    item_var: str = "item"


def template_context(
    *,
    params: Mapping[str, Any],
    steps: Mapping[str, StepOutcome],
    workflow_id: str,
    for_each: ForEachItem | None = None,
) -> dict[str, Any]:
    context: dict[str, Any] = {
        "params": dict(params),
        "steps": {
            step_id: {"output": outcome.output, "status": outcome.status, "error": outcome.error}
            for step_id, outcome in steps.items()
        },
        "workflow": {"id": workflow_id},
    }
    if for_each is not None:
        if for_each.item_var == "index":
            raise ValueError("forEach itemVar cannot be 'index': forEach.index is the iteration number")
        context["forEach"] = {for_each.item_var: for_each.item, "index": for_each.index}
    return context


# -- compiling ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Template:
    """A compiled template. ``render`` gives the whole value or the text (see the module doc)."""

    source: str
    jinja_source: str
    _text: jinja2.Template | None
    _value: TemplateExpression | None


    def render(self, context: Mapping[str, Any]) -> Any:
        try:
            with render_budget():
                if self._value is not None:
                    return to_data(self._value(dict(context)))
                return _render_text(self._text, context)
        except TemplateError as err:
            err.source = err.source or self.source
            raise
        except SecurityError as err:
            raise UnsafeTemplate(f"refused: {err}", source=self.source) from err
        except jinja2.UndefinedError as err:
            raise TemplateRenderError(f"undefined value: {err}", source=self.source) from err
        except RecursionError as err:
            raise UnsafeTemplate("refused: recursion too deep", source=self.source) from err
        except Exception as err:  # a template must never take its caller down
            raise TemplateRenderError(f"{type(err).__name__}: {err}", source=self.source) from err


@lru_cache(maxsize=1024)
def compile_template(source: str) -> Template:
    """Compile ``source``; :class:`TemplateSyntaxError` (with the line) or
    :class:`UnsafeTemplate` if it cannot be. Compiled templates are cached."""
    jinja_source, tree = _parse(source)
    _refuse_unsafe(tree, source)
    expression = _whole_expression(tree)
    try:
        if expression is not None:
            return Template(source, jinja_source, None, _expression_evaluator(expression))
        return Template(source, jinja_source, ENVIRONMENT.from_string(tree), None)
    except jinja2.TemplateSyntaxError as err:  # compile-time checks, e.g. a block defined twice
        raise TemplateSyntaxError(err.message or str(err), line=err.lineno, source=source) from None


def is_template(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _parse(source: str) -> tuple[str, nodes.Template]:
    jinja_source = translate_go_paths(source)
    go_control = go_control_action(jinja_source)
    if go_control is not None:
        line, word = go_control
        raise TemplateSyntaxError(f"Go-template action {{{{ {word} }}}} is not supported; write control flow "
                                  "as Jinja ({% if ... %}...{% endif %}, {% for ... %}...{% endfor %}); of "
                                  f"ToolHive's Go-template syntax only {SUPPORTED_FORMS} are supported",
                                  line=line, source=source)
    try:
        return jinja_source, ENVIRONMENT.parse(jinja_source)
    except jinja2.TemplateSyntaxError as err:
        message = err.message or "invalid template"
        if looks_like_go_template(jinja_source):
            message += f" (of ToolHive's Go-template syntax only {SUPPORTED_FORMS} are supported)"
        raise TemplateSyntaxError(message, line=err.lineno, source=source) from None


def _refuse_unsafe(tree: nodes.Template, source: str) -> None:
    """Refuse at compile time what the text already shows: dunder attributes (Python
    internals) and other templates (there is no loader; say so rather than fail later)."""
    for node in _innermost_first(tree):  # so `a.__init__.__globals__` names `__init__`
        if isinstance(node, (nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)):
            raise UnsafeTemplate("refused: templates cannot include, import or extend other templates",
                                 source=source)
        if isinstance(node, (nodes.Getattr, nodes.Getitem)):
            name = node.attr if isinstance(node, nodes.Getattr) else _constant_key(node.arg)
            if name is not None and name.startswith("__"):
                raise UnsafeTemplate(f"refused: attribute {name!r} reaches Python internals", source=source)


def _innermost_first(node: nodes.Node) -> Iterator[nodes.Node]:
    for child in node.iter_child_nodes():
        yield from _innermost_first(child)
    yield node


def _whole_expression(tree: nodes.Template) -> nodes.Expr | None:
    """The one expression the template consists of, if it consists of exactly one."""
    if len(tree.body) != 1 or not isinstance(tree.body[0], nodes.Output):
        return None
    outputs = tree.body[0].nodes
    if len(outputs) != 1 or isinstance(outputs[0], nodes.TemplateData):
        return None
    return outputs[0]


def _expression_evaluator(expression: nodes.Expr) -> TemplateExpression:
    """As ``Environment.compile_expression``, from an already parsed expression."""
    body = [nodes.Assign(nodes.Name("result", "store"), expression, lineno=expression.lineno)]
    root = nodes.Template(body, lineno=1)
    root.set_environment(ENVIRONMENT)
    return TemplateExpression(ENVIRONMENT.from_string(root), undefined_to_none=False)


def _render_text(template: jinja2.Template, context: Mapping[str, Any]) -> str:
    size = 0
    parts: list[str] = []
    for chunk in template.generate(dict(context)):
        size += len(chunk)
        if size > MAX_TEXT:
            raise SecurityError(f"rendered text exceeds the limit of {MAX_TEXT} characters")
        parts.append(chunk)
    return "".join(parts)


# -- rendering ---------------------------------------------------------------------------


def render_value(value: Any, context: Mapping[str, Any]) -> Any:
    """``value`` with every template inside it rendered (dicts and lists are walked; keys
    and non-string leaves are kept as they are). Never mutates ``value``. Errors carry
    the location of the failing template, e.g. ``filters[0].name``."""
    return _render(value, context, "", 0)


def _render(value: Any, context: Mapping[str, Any], location: str, depth: int) -> Any:
    if depth > MAX_ARGUMENT_DEPTH:
        raise TemplateRenderError(f"arguments are nested deeper than {MAX_ARGUMENT_DEPTH} levels",
                                  location=location)
    if isinstance(value, str):
        if not is_template(value):
            return value
        try:
            return compile_template(value).render(context)
        except TemplateError as err:
            err.location = location
            raise
    if isinstance(value, Mapping):
        return {key: _render(item, context, _key_location(location, key), depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_render(item, context, f"{location}[{index}]", depth + 1) for index, item in enumerate(value)]
    return value


def render_condition(source: str, context: Mapping[str, Any]) -> bool:
    """A step's condition: it must render to a boolean, or to ``true``/``false`` in any case
    (surrounding whitespace ignored); anything else is a :class:`TemplateRenderError`."""
    value = compile_template(source).render(context)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    raise TemplateRenderError(f"a condition must render to true or false, got {shown}", source=source)


def iter_templates(value: Any, location: str = "") -> Iterator[tuple[str, str]]:
    """``(location, source)`` of every template inside ``value``, in order, for validation."""
    if is_template(value):
        yield location, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from iter_templates(item, _key_location(location, key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from iter_templates(item, f"{location}[{index}]")


def _key_location(location: str, key: Any) -> str:
    return f"{location}.{key}" if location else str(key)


# -- static analysis ---------------------------------------------------------------------


def referenced_steps(source: str, *, output_only: bool = False) -> set[str]:
    """The step ids ``source`` reads as ``steps.<id>`` or ``steps["<id>"]`` (Go form too).

    With ``output_only``, only the steps whose output it may read: reading just
    ``.status`` or ``.error`` does not count, anything else (``.output``, the whole step)
    does. Dynamic access (``steps[params.which]``, ``steps | tojson``) cannot be known
    statically and is not reported; at run time a step that has not run is undefined.
    Raises :class:`TemplateSyntaxError` as :func:`compile_template` does.
    """
    if not is_template(source):
        return set()
    _, tree = _parse(source)
    found: set[str] = set()
    for parent, node in _walk(tree, None):
        step = _static_step(node)
        if step is not None and not (output_only and _reads_only_metadata(parent, node)):
            found.add(step)
    return found


def free_names(source: str) -> set[str]:
    """The top-level names ``source`` reads from its context (``params``, ``steps``, ...),
    leaving out names the template sets itself and the sandbox's globals (``range``...).
    Raises :class:`TemplateSyntaxError` as :func:`compile_template` does."""
    if not is_template(source):
        return set()
    _, tree = _parse(source)
    return set(jinja2.meta.find_undeclared_variables(tree)) - set(ENVIRONMENT.globals)


def _walk(node: nodes.Node, parent: nodes.Node | None) -> Iterator[tuple[nodes.Node | None, nodes.Node]]:
    yield parent, node
    for child in node.iter_child_nodes():
        yield from _walk(child, node)


def _static_step(node: nodes.Node) -> str | None:
    """The id in ``steps.<id>`` / ``steps["<id>"]``, if ``node`` is such an access."""
    if not isinstance(node, (nodes.Getattr, nodes.Getitem)):
        return None
    base = node.node
    if not (isinstance(base, nodes.Name) and base.name == "steps" and base.ctx == "load"):
        return None
    return node.attr if isinstance(node, nodes.Getattr) else _constant_key(node.arg)


def _reads_only_metadata(parent: nodes.Node | None, step_node: nodes.Node) -> bool:
    if not isinstance(parent, (nodes.Getattr, nodes.Getitem)) or parent.node is not step_node:
        return False
    key = parent.attr if isinstance(parent, nodes.Getattr) else _constant_key(parent.arg)
    return key in _STEP_METADATA


def _constant_key(node: nodes.Node) -> str | None:
    return node.value if isinstance(node, nodes.Const) and isinstance(node.value, str) else None
