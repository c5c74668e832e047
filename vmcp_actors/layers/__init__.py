"""The layers above the core: Cedar authz, an embedder's own decorators, the optimizer.

Outermost first (DESIGN.md, "The core interface"): optimizer -> embedder layers -> authz
(Cedar) -> advertising filter -> composite tools -> aggregated backends. The last three
are the core (``vmcp_actors.sessions``); this package stacks the rest on each user's core.
An embedder's layer sits behind ``SubtractOnly``, which holds it to hiding things.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vmcp_actors.config import VmcpConfig
from vmcp_actors.layers._cedar import CedarAuthz, CedarPolicies
from vmcp_actors.layers._guard import SubtractOnly
from vmcp_actors.layers._optimizer import CALL_TOOL, FIND_TOOL, META_TOOLS, ToolOptimizer
from vmcp_actors.layers._search import ToolIndex
from vmcp_actors.sessions import Capabilities

LayerFactory = Callable[[Capabilities], Capabilities]


def stack_layers(config: VmcpConfig, embedder_layers: Sequence[LayerFactory] = ()) -> tuple[LayerFactory, ...]:
    """The factories that wrap each user's core, innermost first: authz from the config,
    the embedder's layers (each held to subtracting), the optimizer from the config."""
    factories: list[LayerFactory] = []
    if config.incoming_auth.authz is not None:
        policies = CedarPolicies(config.incoming_auth.authz)  # parsed once for the process
        factories.append(lambda inner: CedarAuthz(inner, policies))
    for make_layer in embedder_layers:
        factories.append(lambda inner, make_layer=make_layer: SubtractOnly(make_layer(inner), inner))
    if config.optimizer is not None:
        limit = config.optimizer.max_tools_to_return
        factories.append(lambda inner: ToolOptimizer(inner, limit))
    return tuple(factories)


__all__ = [
    "CALL_TOOL",
    "CedarAuthz",
    "CedarPolicies",
    "FIND_TOOL",
    "LayerFactory",
    "META_TOOLS",
    "SubtractOnly",
    "ToolIndex",
    "ToolOptimizer",
    "stack_layers",
]
