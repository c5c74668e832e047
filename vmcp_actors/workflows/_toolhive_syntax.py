"""ToolHive's Go-template path form, translated to Jinja so ToolHive users can bring their files.

Supported, and only this: one action that reads a dotted path from the context,
optionally through ToolHive's ``json`` or ``quote`` function, with Go's trim markers::

    {{.params.x}}  {{ .steps.a.output.b }}  {{- .forEach.item -}}
    {{json .steps.a.output}}  {{quote .params.name}}  {{ .params.x | json }}

Each path segment becomes a subscript (``{{ params["x"] }}``), so a key such as ``items``
reads the data, not a method. ``json`` becomes ``tojson`` and ``quote`` stays ``quote``.
Anything else Go templates can say (``if``, ``range``, ``eq``, ``index``, ``{{.}}``,
variables) is not translated; it fails to compile as Jinja, and the error says which forms
are supported. The translation keeps line breaks where they are, so syntax errors point at
the line as written.
"""

from __future__ import annotations

import re

_SEGMENT = r"[A-Za-z_][A-Za-z0-9_]*"
_GO_ACTION = re.compile(
    r"\{\{(?P<ltrim>-)?[ \t]*"
    r"(?:(?P<func>json|quote)[ \t]+)?"
    rf"(?P<path>(?:\.{_SEGMENT})+)"
    r"(?:[ \t]*\|[ \t]*(?P<pipe>json|quote))?"
    r"[ \t]*(?P<rtrim>-)?\}\}"
)
# An action holding a Go path or variable (``.x``, ``$x`` after a space): Go syntax.
_GO_LOOKING = re.compile(r"\{\{-?(?:[^}]*?[\s(])?[.$][A-Za-z_]")
# Go control actions; Jinja would read ``{{ if .x }}`` as the undefined name ``if``.
_GO_CONTROL = re.compile(r"\{\{-?\s*(?P<word>if|else|end|with|range|define|template|block)\b(?!\s*\()")
_JINJA_FILTER = {"json": "tojson", "quote": "quote"}

SUPPORTED_FORMS = "{{.path.to.value}}, {{json .path}}, {{quote .path}}, {{ .path | json }}"


def translate_go_paths(source: str) -> str:
    """``source`` with every supported Go-template action rewritten as Jinja."""
    return _GO_ACTION.sub(_to_jinja, source)


def looks_like_go_template(source: str) -> bool:
    """Whether ``source`` still holds a Go-style action after translation (for error hints)."""
    return _GO_LOOKING.search(source) is not None


def go_control_action(source: str) -> tuple[int, str] | None:
    """``(line, keyword)`` of the first Go control action (``{{ if ...}}``, ``{{ end }}``), if any."""
    match = _GO_CONTROL.search(source)
    if match is None:
        return None
    return source.count("\n", 0, match.start()) + 1, match["word"]


def _to_jinja(match: re.Match[str]) -> str:
    root, *keys = match["path"][1:].split(".")
    expression = root + "".join(f'["{key}"]' for key in keys)
    for function in (match["func"], match["pipe"]):
        if function:
            expression += f" | {_JINJA_FILTER[function]}"
    open_ = "{{-" if match["ltrim"] else "{{"
    close = "-}}" if match["rtrim"] else "}}"
    return f"{open_} {expression} {close}"
