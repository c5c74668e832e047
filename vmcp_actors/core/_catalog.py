"""Aggregating the backends' lists into one catalog with a routing table.

Pure functions over immutable inputs. Backends are always visited in sorted name order,
so the same inputs give the same names whichever backend answered first (ToolHive's
map-order nondeterminism is a known flaw we do not copy).

Tools go through: overrides (per backend, keyed by the backend's own name) -> conflict
resolution (prefix | priority | manual) -> name validation. Every tool, advertised or
not, stays in the internal index so composite steps can reach it as ``workload.tool``.
What two backends both claim (own tool names an app calls by, ``ui://`` URIs) is worked
out by ``_shared_names`` and reported as ``clashes``.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from vmcp_actors.backends import DiscoveredBackend
from vmcp_actors.config import AggregationConfig
from vmcp_actors.core._shared_names import (
    RESOURCE_URI,
    UI_SCHEME,
    Clash,
    OwnName,
    UiRewrites,
    own_name_index,
    own_ui_uri,
    rewritten_ui_uri,
    ui_resource_uris,
    ui_rewrites,
)
from vmcp_actors.core._uri_template import InvalidUriTemplate, compile_uri_template
from vmcp_actors.protocol import is_valid_tool_name

logger = logging.getLogger(__name__)

RESOURCE_UPDATED = "notifications/resources/updated"
# Under priority, clashing tools of unlisted backends get this fixed prefix (as ToolHive).
PRIORITY_FALLBACK_PREFIX = "{workload}_"


def by_name(tools: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    """Tool definitions by name (the first of a name wins, as a client reading the list finds it)."""
    named: dict[str, dict[str, Any]] = {}
    for tool in tools:
        named.setdefault(tool.get("name"), tool)  # type: ignore[arg-type]
    return named


@dataclass(frozen=True)
class Route:
    """Where an advertised name really lives.

    ``original_name`` is the backend's own name (what it receives); ``resolved_name`` is the
    name after overrides and before conflict resolution (what filters match). A composite
    tool's route has ``composite`` set and no backend.
    """

    backend: str
    original_name: str
    resolved_name: str = ""
    composite: bool = False
    connect: bool = False  # the gateway's own tool that connects the person to ``backend``


@dataclass(frozen=True)
class TemplateRoute:
    backend: str
    uri_template: str  # as clients see it
    own_template: str = ""  # the backend's own, when the gateway shows it rewritten (a shared ui:// one)

    def own_uri(self, uri: str) -> str:
        """A URI this template matched, as its backend knows it."""
        return (own_ui_uri(self.backend, uri) or uri) if self.own_template else uri


@dataclass(frozen=True)
class InternalTool:
    """Any backend tool, advertised or not: its route and its definition (overrides applied)."""

    route: Route
    definition: Mapping[str, Any]
    advertised_as: str | None

    @property
    def called_as(self) -> str:
        """The name decisions about it use: as clients call it, or ``backend.tool`` when hidden."""
        return self.advertised_as or f"{self.route.backend}.{self.route.resolved_name or self.route.original_name}"


@dataclass(frozen=True)
class Catalog:
    """A session's aggregated view of its backends. Advertised dicts are never mutated."""

    tools: tuple[dict[str, Any], ...] = ()
    tool_routes: Mapping[str, Route] = field(default_factory=lambda: MappingProxyType({}))
    internal_tools: Mapping[tuple[str, str], InternalTool] = field(default_factory=lambda: MappingProxyType({}))
    resources: tuple[dict[str, Any], ...] = ()
    # Every URI a client may read by name, as shown (listed, or a tool's UI), and its backend.
    resource_owners: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # A shown URI that is not its backend's own (a shared ui:// URI), and the backend's own.
    own_uris: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    ui_rewrites: UiRewrites = UiRewrites()
    resource_templates: tuple[dict[str, Any], ...] = ()
    template_routes: tuple[TemplateRoute, ...] = ()
    prompts: tuple[dict[str, Any], ...] = ()
    prompt_routes: Mapping[str, Route] = field(default_factory=lambda: MappingProxyType({}))
    backends: Mapping[str, DiscoveredBackend] = field(default_factory=lambda: MappingProxyType({}))
    failures: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Conflicts that make the catalog unusable (manual resolution left a clash).
    errors: tuple[str, ...] = ()
    # Names that were not advertised and why (lost a clash, invalid name).
    problems: tuple[str, ...] = ()
    # Backends the person has not connected (outgoingAuth type oauth): each has a connect tool.
    unconnected: tuple[str, ...] = ()
    # Own tool names that are not advertised, and the advertised tools each may mean.
    own_names: Mapping[str, tuple[OwnName, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # What two or more backends claim, and what the gateway does about it (reported, not errors).
    clashes: tuple[Clash, ...] = ()

    @property
    def has_backends(self) -> bool:
        """Usable: a backend answered, or one waits for the person to connect it."""
        return bool(self.backends) or bool(self.unconnected)

    @functools.cached_property
    def missing(self) -> tuple[str, ...]:
        """The backends a later round may add: failed ones and unconnected ones (derived once:
        every request asks)."""
        return tuple(sorted({*self.failures, *self.unconnected}))

    @functools.cached_property
    def tool_definitions(self) -> Mapping[str, dict[str, Any]]:
        """The advertised tools by name: the very dicts ``tools`` holds (derived once)."""
        return MappingProxyType(by_name(self.tools))

    def route_resource(self, uri: str) -> str | None:
        """The backend that serves ``uri``: the one that listed it, else the first template that matches."""
        target = self.resource_target(uri)
        return target[0] if target is not None else None

    def resource_target(self, uri: str) -> tuple[str, str] | None:
        """The backend that serves ``uri`` (as shown) and the URI as that backend knows it."""
        owner = self.resource_owners.get(uri)
        if owner is not None:
            return owner, self.own_uris.get(uri, uri)
        for route in self.template_routes:
            if compile_uri_template(route.uri_template).match(uri) is not None:
                return route.backend, route.own_uri(uri)
        return None

    def shown_uri(self, backend: str, uri: str) -> str:
        """A URI of ``backend``'s (in a read's contents, an update) as clients see it."""
        if not uri.startswith(UI_SCHEME) or not self.ui_rewrites.uris:
            return uri
        if (backend, uri) in self.ui_rewrites.uris:
            return rewritten_ui_uri(backend, uri)
        for route in self.template_routes:
            if route.backend == backend and route.own_template \
                    and compile_uri_template(route.own_template).match(uri) is not None:
                return rewritten_ui_uri(backend, uri)
        return uri

    def shown_update(self, backend: str, message: dict[str, Any]) -> dict[str, Any]:
        """A notification of ``backend``'s with a resource URI it names as clients see it."""
        params = message.get("params")
        if message.get("method") != RESOURCE_UPDATED or not isinstance(params, dict) \
                or not isinstance(params.get("uri"), str):
            return message
        shown = self.shown_uri(backend, params["uri"])
        return message if shown == params["uri"] else {**message, "params": {**params, "uri": shown}}

    def route_template(self, uri_template: str) -> TemplateRoute | None:
        for route in self.template_routes:
            if route.uri_template == uri_template:
                return route
        return None

    def resolve_internal(self, name: str) -> InternalTool | None:
        """For internal callers (composite steps): an exact advertised name first, else
        ``workload.tool`` whatever the strategy or filters, where ``tool`` is the backend's
        own name or, failing that, the name its override gives it. A leading dot is rejected."""
        if not name or name.startswith("."):
            return None
        route = self.tool_routes.get(name)
        if route is not None:
            return self.internal_tools.get((route.backend, route.original_name))
        workload, dot, tool = name.partition(".")
        if not dot or not tool:
            return None
        found = self.internal_tools.get((workload, tool))
        if found is not None:
            return found
        return next((internal for (backend, _), internal in self.internal_tools.items()
                     if backend == workload and internal.route.resolved_name == tool), None)


def advertised_name(aggregation: AggregationConfig, backend: str, name: str) -> str:
    """``AggregationConfig.advertised_name``: under ``prefix`` every name is prefixed, clash
    or not, as ToolHive does. One rule, so the config checks composite names against it too."""
    return aggregation.advertised_name(backend, name)


@dataclass(frozen=True)
class _Candidate:
    route: Route
    definition: dict[str, Any]


def connect_tool_name(backend: str) -> str:
    return f"connect_{backend}"


def connect_tool(backend: str) -> dict[str, Any]:
    """The tool that tells the person how to connect ``backend`` (listed while they have not)."""
    return {"name": connect_tool_name(backend),
            "description": f"Connect your account at {backend}: its tools need your own authorization there and "
                           f"appear once you have given it. Call this tool to get the link to open in a browser.",
            "inputSchema": {"type": "object", "properties": {}},
            "annotations": {"title": f"Connect {backend}", "readOnlyHint": True, "openWorldHint": True}}


def build_catalog(
    discovered: Mapping[str, DiscoveredBackend],
    failures: Mapping[str, str],
    aggregation: AggregationConfig,
    unconnected: tuple[str, ...] | frozenset[str] = (),
) -> Catalog:
    """``unconnected``: backends the person must connect first (a connect tool each is listed)."""
    backends = sorted(discovered)
    problems: list[str] = []
    rewrites, clashes = ui_rewrites({backend: _ui_uris_used(discovered[backend]) for backend in backends})

    candidates = [c for b in backends
                  for c in _tool_candidates(b, discovered[b].tools, aggregation, problems, rewrites)]
    names, errors = _resolve_tool_names(candidates, aggregation, problems)
    tools: list[dict[str, Any]] = []
    tool_routes: dict[str, Route] = {}
    internal: dict[tuple[str, str], InternalTool] = {}
    for candidate in candidates:
        name = names.get(candidate.route)
        internal[(candidate.route.backend, candidate.route.original_name)] = InternalTool(
            candidate.route, MappingProxyType(candidate.definition), name
        )
        if name is not None:
            tool_routes[name] = candidate.route
            tools.append({**candidate.definition, "name": name})
    for backend in sorted(unconnected):
        name = connect_tool_name(backend)
        if name in tool_routes:
            problems.append(f"the connect tool {name!r} is not offered: a backend tool has that name")
            continue
        tool_routes[name] = Route(backend, name, name, connect=True)
        tools.append(connect_tool(backend))

    own_names, name_clashes = own_name_index(
        ((found.route.backend, found.route.original_name, found.advertised_as) for found in internal.values()),
        tool_routes, aggregation.priority_order)
    prompts, prompt_routes = _prompts(backends, discovered, aggregation, problems)
    resources, owners, own_uris = _resources(backends, discovered, rewrites, clashes)
    templates, template_routes = _templates(backends, discovered, rewrites, clashes)
    clashes.extend(name_clashes)
    return Catalog(
        tools=tuple(tools),
        tool_routes=MappingProxyType(tool_routes),
        internal_tools=MappingProxyType(internal),
        resources=tuple(resources),
        resource_owners=MappingProxyType(owners),
        own_uris=MappingProxyType(own_uris),
        ui_rewrites=rewrites,
        resource_templates=tuple(templates),
        template_routes=tuple(template_routes),
        prompts=tuple(prompts),
        prompt_routes=MappingProxyType(prompt_routes),
        backends=MappingProxyType(dict(discovered)),
        failures=MappingProxyType(dict(failures)),
        errors=tuple(errors),
        problems=tuple(problems),
        unconnected=tuple(sorted(unconnected)),
        own_names=MappingProxyType(own_names),
        clashes=tuple(sorted(clashes, key=lambda clash: (clash.kind, clash.name))),
    )


# -- tools -------------------------------------------------------------------------------


def _tool_candidates(
    backend: str, listed: tuple[dict[str, Any], ...], aggregation: AggregationConfig, problems: list[str],
    rewrites: UiRewrites,
) -> list[_Candidate]:
    """The backend's tools with its overrides applied (renames, descriptions, annotations)
    and their UI URIs as shown."""
    workload = aggregation.tools_for(backend)
    overrides = workload.overrides if workload is not None else {}
    candidates = []
    for tool in listed:
        original = tool.get("name")
        if not isinstance(original, str) or not original:
            _problem(problems, logging.WARNING, f"backend {backend!r} lists a tool without a name; skipped")
            continue
        definition = rewrites.tool(backend, dict(tool))
        resolved = original
        override = overrides.get(original)
        if override is not None:
            resolved = override.name or original
            if override.description is not None:
                definition["description"] = override.description
            if override.annotations is not None:
                annotations = tool.get("annotations") if isinstance(tool.get("annotations"), dict) else {}
                definition["annotations"] = {**annotations, **override.annotations}
        definition["name"] = resolved
        candidates.append(_Candidate(Route(backend, original, resolved), definition))
    return candidates


def _resolve_tool_names(
    candidates: list[_Candidate], aggregation: AggregationConfig, problems: list[str]
) -> tuple[dict[Route, str], list[str]]:
    """Advertised name per route (absent: not advertised), and the errors that make the
    catalog unusable. Candidates arrive in sorted backend order."""
    strategy = aggregation.conflict_resolution
    by_name: dict[str, list[_Candidate]] = defaultdict(list)
    for candidate in candidates:
        by_name[candidate.route.resolved_name].append(candidate)

    proposed: list[tuple[_Candidate, str]] = []
    errors: list[str] = []
    if strategy == "prefix":
        proposed = [(c, advertised_name(aggregation, c.route.backend, c.route.resolved_name)) for c in candidates]
    else:
        order = {name: index for index, name in enumerate(aggregation.priority_order)}
        for name, claimants in by_name.items():
            if len(claimants) == 1:
                proposed.append((claimants[0], name))
            elif strategy == "manual":
                offered = ", ".join(f"{c.route.backend} (tool {c.route.original_name!r})" for c in claimants)
                errors.append(f"tool name {name!r} is offered by backends {offered}; "
                              "rename all but one with an override (manual conflict resolution)")
            else:  # priority
                listed = [c for c in claimants if c.route.backend in order]
                if listed:
                    winner = min(listed, key=lambda c: order[c.route.backend])
                    proposed.append((winner, name))
                    for loser in claimants:
                        if loser is not winner:
                            _problem(problems, logging.INFO,
                                     f"tool {name!r} of backend {loser.route.backend!r} is not advertised: "
                                     f"backend {winner.route.backend!r} comes first in priorityOrder")
                else:
                    for claimant in claimants:
                        prefix = PRIORITY_FALLBACK_PREFIX.replace("{workload}", claimant.route.backend)
                        proposed.append((claimant, prefix + name))
        position = {id(candidate): index for index, candidate in enumerate(candidates)}
        proposed.sort(key=lambda pair: position[id(pair[0])])  # back to sorted backend order
    for error in errors:
        logger.error("%s", error)

    names: dict[Route, str] = {}
    taken: dict[str, Route] = {}
    for candidate, name in proposed:
        route = candidate.route
        if not is_valid_tool_name(name):
            _problem(problems, logging.ERROR, f"tool {route.original_name!r} of backend {route.backend!r} would be "
                                              f"advertised as {name[:140]!r}, not a valid MCP tool name; not advertised")
        elif name in taken:
            _problem(problems, logging.ERROR, f"tool name {name!r} of backend {route.backend!r} clashes with backend "
                                              f"{taken[name].backend!r} after resolution; keeping the first")
        else:
            taken[name] = route
            names[route] = name
    return names, errors


# -- prompts, resources, templates -------------------------------------------------------


def _prompts(
    backends: list[str], discovered: Mapping[str, DiscoveredBackend], aggregation: AggregationConfig,
    problems: list[str],
) -> tuple[list[dict[str, Any]], dict[str, Route]]:
    """Named like tools under prefix; bare for listed backends under priority (unlisted ones
    get the fallback prefix); bare under manual. A name claimed twice is dropped for all."""
    strategy = aggregation.conflict_resolution
    proposed: list[tuple[str, Route, dict[str, Any]]] = []
    for backend in backends:
        for prompt in discovered[backend].prompts:
            original = prompt.get("name")
            if not isinstance(original, str) or not original:
                _problem(problems, logging.WARNING, f"backend {backend!r} lists a prompt without a name; skipped")
                continue
            if strategy == "prefix":
                name = advertised_name(aggregation, backend, original)
            elif strategy == "priority" and backend not in aggregation.priority_order:
                name = PRIORITY_FALLBACK_PREFIX.replace("{workload}", backend) + original
            else:
                name = original
            proposed.append((name, Route(backend, original, original), prompt))
    claims: dict[str, list[str]] = defaultdict(list)
    for name, route, _ in proposed:
        claims[name].append(route.backend)
    prompts: list[dict[str, Any]] = []
    routes: dict[str, Route] = {}
    for name, route, prompt in proposed:
        if len(claims[name]) > 1:
            if claims[name][0] == route.backend:  # report once per name
                _problem(problems, logging.ERROR, f"prompt name {name!r} is claimed by backends "
                                                  f"{', '.join(claims[name])}; not advertised for any of them")
            continue
        routes[name] = route
        prompts.append({**prompt, "name": name})
    return prompts, routes


def _ui_uris_used(found: DiscoveredBackend) -> set[str]:
    """The ``ui://`` URIs and URI templates a backend lists or names in a tool."""
    used = {uri for resource in found.resources if isinstance(uri := resource.get("uri"), str)
            and uri.startswith(UI_SCHEME)}
    used.update(template for listed in found.resource_templates
                if isinstance(template := listed.get("uriTemplate"), str) and template.startswith(UI_SCHEME))
    for tool in found.tools:
        used.update(ui_resource_uris(tool))
    return used


def _resources(backends: list[str], discovered: Mapping[str, DiscoveredBackend], rewrites: UiRewrites,
               clashes: list[Clash]) -> tuple[list, dict[str, str], dict[str, str]]:
    """The resources as listed (shared ui:// URIs rewritten), every URI a client may read by
    name with its backend (a tool's UI too, listed or not), and the rewritten ones' own URIs."""
    resources: list[dict[str, Any]] = []
    owners: dict[str, str] = {}
    own_uris: dict[str, str] = {}
    also: dict[str, list[str]] = {}

    def claim(backend: str, uri: str, shown: str) -> None:
        owners[shown] = backend
        if shown != uri:
            own_uris[shown] = uri

    for backend in backends:
        for resource in discovered[backend].resources:
            uri = resource.get("uri")
            if not isinstance(uri, str):
                continue
            shown = rewrites.shown(backend, uri)
            if shown in owners:
                also.setdefault(shown, [owners[shown]]).append(backend)
                continue  # the first backend in sorted order serves it
            claim(backend, uri, shown)
            resources.append(resource if shown == uri else {**resource, "uri": shown})
    for backend in backends:  # a tool's UI that its backend does not list is read all the same
        for tool in discovered[backend].tools:
            for uri in ui_resource_uris(tool):
                shown = rewrites.shown(backend, uri)
                if shown not in owners:
                    claim(backend, uri, shown)
    for uri, claimants in sorted(also.items()):
        clashes.append(Clash(RESOURCE_URI, uri, tuple(claimants),
                             f"{claimants[0]} serves it (the first in name order); the others' is not reachable"))
    return resources, owners, own_uris


def _templates(backends: list[str], discovered: Mapping[str, DiscoveredBackend], rewrites: UiRewrites,
               clashes: list[Clash]) -> tuple[list, list[TemplateRoute]]:
    templates: list[dict[str, Any]] = []
    routes: list[TemplateRoute] = []
    for backend in backends:
        for template in discovered[backend].resource_templates:
            own_template = template.get("uriTemplate")
            if not isinstance(own_template, str):
                continue
            uri_template = rewrites.shown(backend, own_template)
            taken = next((r for r in routes if r.uri_template == uri_template), None)
            if taken is not None:
                clashes.append(Clash(RESOURCE_URI, uri_template, (taken.backend, backend),
                                     f"a resource template: {taken.backend} serves it (the first in name order)"))
                continue
            try:
                compile_uri_template(uri_template)
            except InvalidUriTemplate:
                logger.warning("backend %r lists an invalid resource template %r; skipping it", backend, own_template)
                continue
            rewritten = uri_template != own_template
            routes.append(TemplateRoute(backend, uri_template, own_template if rewritten else ""))
            templates.append({**template, "uriTemplate": uri_template} if rewritten else template)
    return templates, routes


def _problem(problems: list[str], level: int, message: str) -> None:
    logger.log(level, "%s", message)
    problems.append(message)
