"""Checks of Cedar policies and entities at load time (``cedarpy``, imported when used)."""

from __future__ import annotations

import json
from typing import Any


def policy_problem(policy: str) -> str | None:
    """Cedar's own message when ``policy`` (one or more policies) does not parse."""
    import cedarpy

    if not policy.strip():
        return "must be a Cedar policy, not blank"
    try:
        cedarpy.PolicySet.from_str(policy)
    except ValueError as error:
        return f"Cedar cannot parse it: {error}"
    return None


def parse_entities(text: str) -> list[dict[str, Any]]:
    """``entitiesJson`` as Cedar's entity list; ValueError with what is wrong."""
    try:
        entities = json.loads(text or "[]")
    except json.JSONDecodeError as error:
        raise ValueError(f"must be a JSON array of Cedar entities: {error.msg} at line {error.lineno}") from None
    if not isinstance(entities, list):
        raise ValueError("must be a JSON array of Cedar entities")
    for index, entity in enumerate(entities):
        uid = entity.get("uid") if isinstance(entity, dict) else None
        if not isinstance(uid, dict) or not isinstance(uid.get("type"), str) or not isinstance(uid.get("id"), str):
            raise ValueError(f"entity {index} needs a uid with a string type and id")
        if not isinstance(entity.get("attrs", {}), dict) or not isinstance(entity.get("parents", []), list):
            raise ValueError(f"entity {index}: attrs must be an object and parents an array")
    return entities


def entities_problem(text: str) -> str | None:
    import cedarpy

    try:
        entities = parse_entities(text)
    except ValueError as error:
        return str(error)
    # Cedar itself reads them: one request over them tells what it cannot.
    result = cedarpy.is_authorized({"principal": 'Client::"check"', "action": 'Action::"check"',
                                    "resource": 'Tool::"check"', "context": {}}, "", entities)
    errors = list(result.diagnostics.errors)
    return f"Cedar cannot read the entities: {errors[0]}" if errors else None
