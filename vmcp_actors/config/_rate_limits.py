"""Which names a rate-limited tool can have, known from the config alone.

Backend tools are discovered per user, so whether a name is advertised is known for sure
only once a catalog is (the runtime then warns). The config already rules some names out:
under ``prefix`` every backend tool's name starts with its backend's prefix, a backend
with a ``filter`` advertises only those names, ``excludeAll`` and ``excludeAllTools`` hide
tools, and composite tools are named here. A limit on a name that none of these allows
would limit nothing, so it is an error at load.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ._fields import _loaded
from ._model import AggregationConfig

SHOWN_AT_MOST = 30  # names listed in one message


def _tool_names(aggregation: AggregationConfig, backend: str) -> tuple[set[str], str | None]:
    """The names clients can see for ``backend``'s tools, by the catalog's own naming rules
    (``advertised_name``, ``is_advertised``): exact names, and a prefix that any name may
    follow (None when its tools are only those names, or all hidden)."""
    settings = aggregation.tools_for(backend)
    if settings is None or settings.filter is None:
        visible = aggregation.is_advertised(backend, "")
        return set(), aggregation.advertised_name(backend, "") if visible else None
    renames = settings.renames()  # a filter entry may be the backend's own name of a renamed tool
    return {aggregation.advertised_name(backend, renames.get(entry, entry)) for entry in settings.filter
            if aggregation.is_advertised(backend, renames.get(entry, entry), entry)}, None


def unadvertisable_limits(tools: Sequence[Any], aggregation: AggregationConfig, backends: Iterable[str],
                          composites: Iterable[str]) -> dict[int, str]:
    """``rateLimiting.tools`` entries (by index) whose name no tool can be advertised
    under, each with a message naming what tools can be called here."""
    exact, prefixes = set(composites), []
    forms = sorted(exact)  # how tools here are named, for the message
    for backend in backends:
        names, prefix = _tool_names(aggregation, backend)
        exact |= names
        if prefix is not None:
            if prefix == "":
                return {}  # bare names under priority or manual: any name may be a backend's
            prefixes.append(prefix)
            forms.append(f"{prefix}*")
        forms += sorted(names)
    shown = ", ".join(forms[:SHOWN_AT_MOST]) + (f", and {len(forms) - SHOWN_AT_MOST} more"
                                                 if len(forms) > SHOWN_AT_MOST else "")
    problems = {}
    for index, tool in enumerate(tools):
        name = _loaded(tool, "name")
        if not isinstance(name, str) or name in exact or any(
                name.startswith(prefix) and len(name) > len(prefix) for prefix in prefixes):
            continue
        problems[index] = (f"no tool can be advertised as {name!r}, so it would limit nothing; tools here are "
                           f"named: {shown or 'nothing (every backend tool is hidden and there are no composites)'}")
    return problems
