"""Aggregating the backends' lists into one catalog with a routing table.

Pure functions over immutable inputs. Backends are always visited in sorted name order,
so the same inputs give the same names whichever backend answered first.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from vmcp_actors.backends import BackendCapabilities
from vmcp_actors.config import AggregationConfig
from vmcp_actors.sessions._uri_template import InvalidUriTemplate, compile_uri_template

logger = logging.getLogger(__name__)

# MCP tool names: letters, digits, '_', '-', '.'; 1 to 128 characters.
VALID_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


@dataclass(frozen=True)
class Route:
    """Where an advertised name really lives."""

    backend: str
    original_name: str


@dataclass(frozen=True)
class TemplateRoute:
    backend: str
    uri_template: str


@dataclass(frozen=True)
class Catalog:
    """A session's aggregated view of its backends. Advertised dicts are never mutated."""

    tools: tuple[dict[str, Any], ...] = ()
    tool_routes: Mapping[str, Route] = field(default_factory=lambda: MappingProxyType({}))
    resources: tuple[dict[str, Any], ...] = ()
    resource_owners: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    resource_templates: tuple[dict[str, Any], ...] = ()
    template_routes: tuple[TemplateRoute, ...] = ()
    prompts: tuple[dict[str, Any], ...] = ()
    prompt_routes: Mapping[str, Route] = field(default_factory=lambda: MappingProxyType({}))
    backends: Mapping[str, BackendCapabilities] = field(default_factory=lambda: MappingProxyType({}))
    failures: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def has_backends(self) -> bool:
        return bool(self.backends)

    def route_resource(self, uri: str) -> str | None:
        """The backend that serves ``uri``: the one that listed it, else the first template that matches."""
        owner = self.resource_owners.get(uri)
        if owner is not None:
            return owner
        for route in self.template_routes:
            if compile_uri_template(route.uri_template).fullmatch(uri):
                return route.backend
        return None

    def route_template(self, uri_template: str) -> str | None:
        for route in self.template_routes:
            if route.uri_template == uri_template:
                return route.backend
        return None


def advertised_name(aggregation: AggregationConfig, backend: str, name: str) -> str:
    """Under ``prefix`` every name is prefixed, clash or not, as ToolHive does."""
    return aggregation.prefix_for(backend) + name


def build_catalog(
    discovered: Mapping[str, BackendCapabilities],
    failures: Mapping[str, str],
    aggregation: AggregationConfig,
) -> Catalog:
    backends = sorted(discovered)
    tools, tool_routes = _named_items(
        "tool", [(b, discovered[b].tools) for b in backends], aggregation, require_valid_name=True
    )
    prompts, prompt_routes = _named_items("prompt", [(b, discovered[b].prompts) for b in backends], aggregation)

    resources: list[dict[str, Any]] = []
    owners: dict[str, str] = {}
    for backend in backends:
        for resource in discovered[backend].resources:
            uri = resource.get("uri")
            if not isinstance(uri, str) or uri in owners:
                continue  # URIs are never rewritten; the first backend in sorted order serves it
            owners[uri] = backend
            resources.append(resource)

    templates: list[dict[str, Any]] = []
    template_routes: list[TemplateRoute] = []
    for backend in backends:
        for template in discovered[backend].resource_templates:
            uri_template = template.get("uriTemplate")
            if not isinstance(uri_template, str) or any(r.uri_template == uri_template for r in template_routes):
                continue
            try:
                compile_uri_template(uri_template)
            except InvalidUriTemplate:
                logger.warning("backend %r lists an invalid resource template %r; skipping it", backend, uri_template)
                continue
            template_routes.append(TemplateRoute(backend, uri_template))
            templates.append(template)

    return Catalog(
        tools=tools,
        tool_routes=tool_routes,
        resources=tuple(resources),
        resource_owners=MappingProxyType(owners),
        resource_templates=tuple(templates),
        template_routes=tuple(template_routes),
        prompts=prompts,
        prompt_routes=prompt_routes,
        backends=MappingProxyType(dict(discovered)),
        failures=MappingProxyType(dict(failures)),
    )


def _named_items(
    kind: str,
    per_backend: list[tuple[str, tuple[dict[str, Any], ...]]],
    aggregation: AggregationConfig,
    require_valid_name: bool = False,
) -> tuple[tuple[dict[str, Any], ...], Mapping[str, Route]]:
    items: list[dict[str, Any]] = []
    routes: dict[str, Route] = {}
    for backend, listed in per_backend:
        for item in listed:
            original = item.get("name")
            if not isinstance(original, str) or not original:
                logger.warning("backend %r lists a %s without a name; skipping it", backend, kind)
                continue
            name = advertised_name(aggregation, backend, original)
            if require_valid_name and not VALID_TOOL_NAME.match(name):
                logger.error("backend %r %s %r would be advertised as %r, not a valid MCP tool name; not advertised",
                             backend, kind, original, name)
                continue
            if name in routes:
                taken = routes[name]
                logger.error("%s name %r from backend %r clashes with %r from backend %r after prefixing; "
                             "keeping the first", kind, name, backend, taken.original_name, taken.backend)
                continue
            routes[name] = Route(backend, original)
            items.append({**item, "name": name})
    return tuple(items), MappingProxyType(routes)
