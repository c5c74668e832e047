"""Matching URIs against RFC 6570 URI templates (the reverse of expansion).

Only matching is needed (to route resources/read to the backend whose template fits),
so each template compiles to one anchored regular expression.
"""

from __future__ import annotations

import re
from functools import lru_cache

_EXPRESSION = re.compile(r"\{([^{}]*)\}")
# Operator -> (regex for the whole expression). Simple and form-style expressions may
# not contain reserved characters once expanded; reserved and fragment ones may.
_OPERATOR_PATTERNS = {
    "": r"[^/?#&]*",
    "+": r"[^?#]*",
    "#": r"(?:#.*)?",
    ".": r"(?:\.[^/?#]*)*",
    "/": r"(?:/[^/?#]*)*",
    ";": r"(?:;[^/?#]*)*",
    "?": r"(?:\?[^#]*)?",
    "&": r"(?:&[^#]*)*",
}


class InvalidUriTemplate(ValueError):
    pass


@lru_cache(maxsize=1024)
def compile_uri_template(template: str) -> re.Pattern[str]:
    """An anchored pattern that matches every URI the template can expand to."""
    parts: list[str] = []
    position = 0
    for match in _EXPRESSION.finditer(template):
        literal = template[position : match.start()]
        if "{" in literal or "}" in literal:
            raise InvalidUriTemplate(f"unbalanced braces in URI template {template!r}")
        parts.append(re.escape(literal))
        body = match.group(1)
        first = body[:1]
        if first and first in "=,!@|":
            raise InvalidUriTemplate(f"reserved operator in URI template {template!r}")
        operator = first if first and first in "+#./;?&" else ""
        if not body[len(operator) :]:
            raise InvalidUriTemplate(f"empty expression in URI template {template!r}")
        parts.append(_OPERATOR_PATTERNS[operator])
        position = match.end()
    tail = template[position:]
    if "{" in tail or "}" in tail:
        raise InvalidUriTemplate(f"unbalanced braces in URI template {template!r}")
    parts.append(re.escape(tail))
    return re.compile("".join(parts))


def uri_matches_template(uri: str, template: str) -> bool:
    try:
        return compile_uri_template(template).fullmatch(uri) is not None
    except InvalidUriTemplate:
        return False
