"""A composite tool's annotations, from its steps' (MCP ToolAnnotations hints).

A composite is only as safe as its least safe step: read-only if every step is,
idempotent if every step is, destructive or open-world if any step is. A step without a
hint gets the MCP default: not read-only, destructive (unless read-only), not
idempotent, open-world. Explicit annotations may be more cautious than the steps, never
safer: that would tell a client it can skip confirmation for a destructive workflow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
ANNOTATION_KEYS = ("title", *HINTS)

# hint -> the value that claims more safety than the steps may justify
_SAFE_VALUE = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}


def step_hints(annotations: Mapping[str, Any] | None, *, known_only: bool = False) -> dict[str, bool]:
    """A step's four hints with the MCP defaults filled in; with ``known_only``, only the
    hints its annotations state (what a config can know before discovery)."""
    given = annotations if isinstance(annotations, Mapping) else {}
    stated = {hint: given[hint] for hint in HINTS if isinstance(given.get(hint), bool)}
    if known_only:
        if stated.get("readOnlyHint") is True:
            stated["destructiveHint"] = False  # destructiveHint means nothing for a read-only tool
        return stated
    read_only = stated.get("readOnlyHint", False)
    return {
        "readOnlyHint": read_only,
        "destructiveHint": False if read_only else stated.get("destructiveHint", True),
        "idempotentHint": stated.get("idempotentHint", False),
        "openWorldHint": stated.get("openWorldHint", True),
    }


def derive_annotations(steps: Sequence[Mapping[str, Any] | None]) -> dict[str, bool]:
    """The hints a composite over ``steps`` (each a step tool's annotations) deserves."""
    hints = [step_hints(annotations) for annotations in steps]
    return {
        "readOnlyHint": all(h["readOnlyHint"] for h in hints),
        "destructiveHint": any(h["destructiveHint"] for h in hints),
        "idempotentHint": all(h["idempotentHint"] for h in hints),
        "openWorldHint": any(h["openWorldHint"] for h in hints),
    }


def unsafe_claims(explicit: Mapping[str, Any], steps: Sequence[tuple[str, Mapping[str, Any] | None]], *,
                  known_only: bool = False) -> list[str]:
    """Why ``explicit`` annotations claim more safety than the steps allow, one message per
    (hint, step); ``steps`` are ``(step id, that step tool's annotations)``. With
    ``known_only``, a hint a step does not state is not held against the claim."""
    problems = []
    for hint in HINTS:
        if explicit.get(hint) is not _SAFE_VALUE[hint]:
            continue
        for step_id, annotations in steps:
            value = step_hints(annotations, known_only=known_only).get(hint)
            if value is not None and value is not _SAFE_VALUE[hint]:
                problems.append(f"annotations.{hint} is {str(_SAFE_VALUE[hint]).lower()}, but step {step_id!r} "
                                f"calls a tool whose {hint} is {str(value).lower()}")
    return problems


def composite_annotations(explicit: Mapping[str, Any] | None,
                          steps: Sequence[Mapping[str, Any] | None]) -> dict[str, Any]:
    """What the composite advertises: the derived hints, with explicit annotations (checked
    by :func:`unsafe_claims`) laid over them."""
    derived: dict[str, Any] = derive_annotations(steps)
    if explicit:
        derived.update(explicit)
    return derived
