"""The advertising filter: a decorator over the capability interface.

It sits above the composite-tool layer (see ``vmcp_actors.decorators``): a hidden tool
is neither listed nor callable by clients (tools/call on it is -32602, exactly as for a
name that does not exist), yet it stays in the routing table below, where composite
steps call it and read its input schema. ``list_tools``, ``describe_tool`` and
``lookup_tool`` share one predicate, so what is listed and what is callable cannot drift.
The list is filtered once per list the layer below answers (so once per catalog).
"""

from __future__ import annotations

from typing import Any

from vmcp_actors.concurrency import Deadline
from vmcp_actors.config import AggregationConfig
from vmcp_actors.core._admitted import FILTER, admitted
from vmcp_actors.core._catalog import Route, by_name
from vmcp_actors.core._exchange import Exchange
from vmcp_actors.core._explain import HIDES, Explanation, Finding
from vmcp_actors.core._interface import (
    UnknownTool,
    CoreLayer,
    PerList,
    UserCore,
)
from vmcp_actors.identity import Identity
from vmcp_actors.protocol import INVALID_PARAMS, JsonRpcError


def is_advertised(aggregation: AggregationConfig, route: Route) -> bool:
    """The one predicate: a ``filter`` entry matches the post-override, pre-prefix name or
    the backend's own name. Composite tools and connect tools are the gateway's own and are
    not filtered (the filter chooses backend tools; a hidden backend's tools still serve
    composite steps once its person has connected it)."""
    return route.composite or route.connect or aggregation.is_advertised(route.backend, route.resolved_name, route.original_name)


def hides_tools(aggregation: AggregationConfig) -> bool:
    """Whether the config hides any backend tool (``excludeAllTools``, a backend's
    ``excludeAll`` or ``filter``): without one the filter has nothing to do, and the stack
    leaves it out."""
    return aggregation.exclude_all_tools or any(tools.exclude_all or tools.filter is not None
                                                for tools in aggregation.tools)


class AdvertisingFilter(CoreLayer):
    """UserCore minus the tools the config hides from clients (the filter only
    subtracts tools; everything else passes through)."""

    layer_name = "advertising filter"

    def __init__(self, inner: UserCore, aggregation: AggregationConfig):
        super().__init__(inner)
        self._aggregation = aggregation
        self._advertised: PerList[tuple[tuple[dict[str, Any], ...], dict[str, dict[str, Any]]]] = PerList()

    def list_tools(self, identity: Identity | None, deadline: Deadline) -> tuple[dict[str, Any], ...]:
        return self._advertised_tools(identity, deadline)[0]

    def describe_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> dict[str, Any] | None:
        return self._advertised_tools(identity, deadline)[1].get(name)

    def _advertised_tools(self, identity: Identity | None,
                          deadline: Deadline) -> tuple[tuple[dict[str, Any], ...], dict[str, dict[str, Any]]]:
        """The advertised part of the layer below's list, and it by name: derived once per list."""
        tools = self._inner.list_tools(identity, deadline)

        def advertised() -> tuple[tuple[dict[str, Any], ...], dict[str, dict[str, Any]]]:
            kept = tuple(tool for tool in tools if self.lookup_tool(identity, tool["name"], deadline) is not None)
            return kept, by_name(kept)

        return self._advertised.get(tools, advertised)

    def lookup_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> Route | None:
        route = self._inner.lookup_tool(identity, name, deadline)
        return route if route is not None and is_advertised(self._aggregation, route) else None

    def call_tool(self, identity: Identity | None, name: str, arguments: dict[str, Any] | None,
                  meta: dict[str, Any] | None, deadline: Deadline) -> Exchange:
        if self.lookup_tool(identity, name, deadline) is None:
            raise UnknownTool(name)  # the same answer as for no such tool
        with admitted(FILTER, name):
            return self._inner.call_tool(identity, name, arguments, meta, deadline)

    def resume(self, identity, continuation, deadline):
        """As a new call: refused unless the tool is advertised (``CoreLayer.resume``)."""
        with admitted(FILTER, continuation.name):
            return super().resume(identity, continuation, deadline)

    def finding(self, identity: Identity | None, name: str, deadline: Deadline, below: Explanation,
                listed: bool, callable_: bool) -> Finding:
        route = self._inner.lookup_tool(identity, name, deadline)
        if route is None or is_advertised(self._aggregation, route):
            return super().finding(identity, name, deadline, below, listed, callable_)
        return Finding(self.layer_name, HIDES, f"{_why_hidden(self._aggregation, route)}; composite steps still call it",
                       (("backend", route.backend), ("resolvedName", route.resolved_name)))


def _why_hidden(aggregation: AggregationConfig, route: Route) -> str:
    if aggregation.exclude_all_tools:
        return "aggregation.excludeAllTools hides every backend tool"
    tools = aggregation.tools_for(route.backend)
    index = aggregation.tools.index(tools) if tools is not None else -1
    if tools is not None and tools.exclude_all:
        return f"aggregation.tools[{index}].excludeAll hides every tool of backend {route.backend!r}"
    return (f"aggregation.tools[{index}].filter of backend {route.backend!r} does not list "
            f"{route.resolved_name!r}")
