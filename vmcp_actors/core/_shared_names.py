"""What two of a person's backends both claim: own tool names, and MCP Apps' ``ui://`` URIs.

**Own names.** An MCP App calls tools back by the names its server gave them
(``callServerTool({name: "get-time"})``: the name is in the app's HTML, which the gateway
passes on byte for byte), not by the names the gateway advertises (``vanilla_get-time``).
So a call whose name is not advertised is taken as a backend's own name when exactly one
tool the caller can call has it, and goes on as a call of that tool's advertised name:
every layer (filter, Cedar, rate limits, audit) decides it under that name. An own name
several such tools share is resolved by ``priorityOrder`` (the first listed backend's),
else refused as ambiguous: the gateway cannot tell which app called (a host sends nothing
that says so). An advertised name always means its own tool.

**UI URIs.** Two backends that use the same ``ui://`` URI (apps made from one template
do) would show one app's HTML for the other's tools. Such a URI is rewritten for each
backend that uses it, to ``ui://<backend>/<the rest>``, in its tools' ``_meta.ui``, its
resources and templates, reads and update notifications. A URI only one backend uses is
left as it is. Other URIs (``file://``, ``https://``) are never rewritten: a clash there is
reported, and the first backend in name order serves the URI.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

UI_SCHEME = "ui://"
# MCP Apps' key for a tool's UI resource (ext-apps writes both; hosts read either).
UI_META = "ui"
LEGACY_UI_RESOURCE_KEY = "ui/resourceUri"

# Clash kinds.
TOOL_NAME = "tool name"
UI_URI = "ui URI"
RESOURCE_URI = "resource URI"


@dataclass(frozen=True)
class OwnName:
    """A tool an own name may mean: its advertised name and backend. ``rank``: its backend's
    place in ``priorityOrder`` (None: not listed there)."""

    advertised: str
    backend: str
    rank: int | None


@dataclass(frozen=True)
class Clash:
    """A name or URI two or more backends claim, and what the gateway does about it."""

    kind: str
    name: str
    backends: tuple[str, ...]
    outcome: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "backends": list(self.backends), "outcome": self.outcome}

    def __str__(self) -> str:
        return f"{self.kind} {self.name!r} is claimed by backends {', '.join(self.backends)}: {self.outcome}"


def own_name_index(tools: Iterable[tuple[str, str, str | None]], advertised: Mapping[str, Any],
                   priority_order: tuple[str, ...]) -> tuple[Mapping[str, tuple[OwnName, ...]], list[Clash]]:
    """``tools``: (backend, own name, advertised name or None) of every backend tool.
    Returns each own name that is not itself advertised, with the tools it may mean (ranked
    ones first, in ``priorityOrder``; then by backend), and the clashes worth reporting."""
    order = {backend: index for index, backend in enumerate(priority_order)}
    meanings: dict[str, list[OwnName]] = defaultdict(list)
    shadowed: dict[str, list[str]] = defaultdict(list)
    for backend, own, name in tools:
        if name == own:
            continue  # advertised under its own name
        if own in advertised:
            shadowed[own].append(backend)
            continue
        if name is None:
            continue  # not advertised (filtered by overrides, or lost a clash): not callable
        meanings[own].append(OwnName(name, backend, order.get(backend)))
    index = {own: tuple(sorted(found, key=_rank)) for own, found in meanings.items()}
    clashes = []
    for own, found in sorted(index.items()):
        if len(found) < 2:
            continue
        names = ", ".join(meaning.advertised for meaning in found)
        chosen = chosen_meaning(found)
        outcome = (f"a call by this name (an app's) goes to {chosen.advertised}: its backend comes first in "
                   f"priorityOrder (the tools: {names})" if chosen is not None else
                   f"a call by this name (an app's) is refused as ambiguous: call {names} instead, or list the "
                   f"backend whose app should have it first in priorityOrder")
        clashes.append(Clash(TOOL_NAME, own, tuple(sorted(m.backend for m in found)), outcome))
    for own, backends in sorted(shadowed.items()):
        owner = getattr(advertised[own], "backend", "")
        clashes.append(Clash(TOOL_NAME, own, tuple(sorted({owner, *backends} - {""})),
                             f"an advertised name: a call by it goes to that tool (of {owner}), never to another "
                             f"backend's tool of that own name"))
    return index, clashes


def chosen_meaning(found: tuple[OwnName, ...]) -> OwnName | None:
    """The tool an own name means: the only one, or the one ranked strictly first."""
    if len(found) == 1:
        return found[0]
    first, second = found[0], found[1]
    if first.rank is not None and (second.rank is None or first.rank < second.rank):
        return first
    return None


def _rank(meaning: OwnName) -> tuple[int, int, str]:
    return (0, meaning.rank, meaning.backend) if meaning.rank is not None else (1, 0, meaning.backend)


# -- ui:// URIs ------------------------------------------------------------------------------


def ui_resource_uris(tool: Mapping[str, Any]) -> list[str]:
    """The ``ui://`` URIs a tool names for its UI (``_meta.ui.resourceUri`` and the older
    flat ``_meta["ui/resourceUri"]``)."""
    meta = tool.get("_meta")
    if not isinstance(meta, Mapping):
        return []
    found = []
    ui = meta.get(UI_META)
    if isinstance(ui, Mapping) and _is_ui(ui.get("resourceUri")):
        found.append(ui["resourceUri"])
    if _is_ui(meta.get(LEGACY_UI_RESOURCE_KEY)):
        found.append(meta[LEGACY_UI_RESOURCE_KEY])
    return found


def _is_ui(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(UI_SCHEME)


def rewritten_ui_uri(backend: str, uri: str) -> str:
    """``ui://x/y`` of ``backend`` as the gateway shows it when another backend uses it too."""
    return f"{UI_SCHEME}{backend}/{uri[len(UI_SCHEME):]}"


def own_ui_uri(backend: str, uri: str) -> str | None:
    """The inverse of ``rewritten_ui_uri`` (None: ``uri`` is not one of ``backend``'s rewritten ones)."""
    prefix = f"{UI_SCHEME}{backend}/"
    return UI_SCHEME + uri[len(prefix):] if uri.startswith(prefix) else None


@dataclass(frozen=True)
class UiRewrites:
    """Which backends' ``ui://`` URIs (and templates) the gateway shows rewritten."""

    uris: frozenset[tuple[str, str]] = frozenset()  # (backend, its own URI or URI template)

    def shown(self, backend: str, uri: str) -> str:
        return rewritten_ui_uri(backend, uri) if (backend, uri) in self.uris else uri

    def tool(self, backend: str, definition: dict[str, Any]) -> dict[str, Any]:
        """``definition`` with its UI URIs as shown (a new dict when any changes; never mutated)."""
        meta = definition.get("_meta")
        if not self.uris or not isinstance(meta, Mapping) or not ui_resource_uris(definition):
            return definition
        meta = dict(meta)
        ui = meta.get(UI_META)
        if isinstance(ui, Mapping) and _is_ui(ui.get("resourceUri")):
            meta[UI_META] = {**ui, "resourceUri": self.shown(backend, ui["resourceUri"])}
        if _is_ui(meta.get(LEGACY_UI_RESOURCE_KEY)):
            meta[LEGACY_UI_RESOURCE_KEY] = self.shown(backend, meta[LEGACY_UI_RESOURCE_KEY])
        return {**definition, "_meta": meta}


def ui_rewrites(used: Mapping[str, set[str]]) -> tuple[UiRewrites, list[Clash]]:
    """``used``: the ``ui://`` URIs and URI templates each backend uses (lists, or names in
    a tool). One used by two or more backends is rewritten for each of them, unless a
    rewritten form would be a URI some backend uses itself (then it is reported, not
    rewritten: the first backend in name order serves it)."""
    users: dict[str, list[str]] = defaultdict(list)
    for backend in sorted(used):
        for uri in used[backend]:
            users[uri].append(backend)
    everything = set(users)
    rewritten: set[tuple[str, str]] = set()
    clashes = []
    for uri, backends in sorted(users.items()):
        if len(backends) < 2:
            continue
        shown = [rewritten_ui_uri(backend, uri) for backend in backends]
        if everything.intersection(shown):
            clashes.append(Clash(UI_URI, uri, tuple(backends),
                                 f"not rewritten (a rewritten form is a URI a backend uses itself): "
                                 f"{backends[0]} serves it"))
            continue
        rewritten.update((backend, uri) for backend in backends)
        clashes.append(Clash(UI_URI, uri, tuple(backends),
                             "rewritten for each backend: " + ", ".join(shown)))
    return UiRewrites(frozenset(rewritten)), clashes
