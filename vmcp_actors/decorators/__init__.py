"""Decorators over each user's core, and ``stack``, the one place that orders them.

Outermost first: optimizer -> an embedder's layers -> Cedar authz -> advertising filter ->
rate limits -> composite tools -> aggregated backends (``vmcp_actors.core``). Every layer only subtracts
but composite tools and the optimizer's two meta-tools; an embedder's layer sits behind
``SubtractOnly``, which holds it to that. The filter sits above composite tools so steps
see every backend tool's schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vmcp_actors.config import VmcpConfig
from vmcp_actors.core._interface import LayerFactory, UserCore
from vmcp_actors.decorators._admission import StepAdmission
from vmcp_actors.decorators._cedar import CedarAuthz, CedarPolicies
from vmcp_actors.decorators._composite import CompositeTools, WorkflowMetrics
from vmcp_actors.decorators._composite_tasks import CompositeTasks, UserTasks
from vmcp_actors.decorators._filter import AdvertisingFilter, is_advertised
from vmcp_actors.decorators._guard import SubtractOnly
from vmcp_actors.decorators._optimizer import (
    CALL_TOOL,
    FIND_TOOL,
    META_TOOLS,
    ToolOptimizer,
)
from vmcp_actors.decorators._rate_limits import RateLimits
from vmcp_actors.decorators._search import ToolIndex
from vmcp_actors.limits import RateLimiter


@dataclass(frozen=True)
class DecoratorStack:
    """How every user's core is decorated in this process (built once at start)."""

    config: VmcpConfig
    above_filter: tuple[LayerFactory, ...]  # innermost first: authz, an embedder's layers, the optimizer
    workflow_metrics: WorkflowMetrics
    limiter: RateLimiter | None = None  # under the filter; composite steps pass their tools' buckets too
    policies: CedarPolicies | None = None  # Cedar authz over the filter; composite steps are decided too

    def build(self, backends: Any, client_capabilities: Mapping[str, Any],
              tasks: UserTasks | None = None) -> tuple[UserCore, CompositeTools]:
        """One user's stack over its ``AggregatedBackends``: the outermost layer, and the
        composite tools layer (its runs are the user's to cancel; ``tasks``: where the
        runs clients accept tasks of go)."""
        admission = StepAdmission(self.policies, self.limiter)
        backends.require(admission.requirements())  # no backend call without these layers' decisions
        composites = CompositeTools(backends, self.config.composite_tools, self.config.aggregation,
                                    self.workflow_metrics, client_capabilities=client_capabilities, tasks=tasks,
                                    admission=admission)
        limited: UserCore = composites if self.limiter is None else RateLimits(composites, self.limiter)
        outermost: UserCore = AdvertisingFilter(limited, self.config.aggregation)
        for wrap in self.above_filter:
            outermost = wrap(outermost)
        return outermost, composites


def stack(config: VmcpConfig, embedder_layers: Sequence[LayerFactory] = (),
          workflow_metrics: WorkflowMetrics | None = None, limiter: RateLimiter | None = None) -> DecoratorStack:
    """Every decorator the config and the embedder ask for, in their one order."""
    above: list[LayerFactory] = []
    policies = None
    if config.incoming_auth.authz is not None:
        policies = CedarPolicies(config.incoming_auth.authz)  # parsed once for the process
        above.append(lambda inner: CedarAuthz(inner, policies))
    for make_layer in embedder_layers:
        above.append(lambda inner, make_layer=make_layer: SubtractOnly(make_layer(inner), inner))
    if config.optimizer is not None:
        limit = config.optimizer.max_tools_to_return
        above.append(lambda inner: ToolOptimizer(inner, limit))
    return DecoratorStack(config, tuple(above), workflow_metrics or WorkflowMetrics(), limiter, policies)


__all__ = [
    "AdvertisingFilter",
    "CALL_TOOL",
    "CedarAuthz",
    "CedarPolicies",
    "CompositeTasks",
    "CompositeTools",
    "DecoratorStack",
    "FIND_TOOL",
    "META_TOOLS",
    "RateLimits",
    "SubtractOnly",
    "UserTasks",
    "ToolIndex",
    "ToolOptimizer",
    "WorkflowMetrics",
    "is_advertised",
    "stack",
]
