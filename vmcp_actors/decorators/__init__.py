"""Decorators over each user's core, and ``stack``, the one place that orders them.

Outermost first: code mode -> optimizer -> an embedder's layers -> Cedar authz -> advertising filter ->
rate limits -> composite tools -> aggregated backends (``vmcp_actors.core``). Every layer only subtracts
but composite tools, the optimizer's two meta-tools and code mode's script tool and helpers;
an embedder's layer sits behind ``SubtractOnly``, which holds it to that. The filter sits
above composite tools so steps see every backend tool's schema. A script's calls enter
under the optimizer, as a client's call would without it. A layer is in the stack only
when the config gives it something to do: a call passes no code of a feature it does not use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vmcp_actors.codemode import Sandbox
from vmcp_actors.config import SCRIPT_TOOL, VmcpConfig
from vmcp_actors.core._interface import LayerFactory, UserCore
from vmcp_actors.decorators._admission import StepAdmission
from vmcp_actors.decorators._cedar import CedarAuthz, CedarPolicies
from vmcp_actors.decorators._code_mode import CodeMode, CodeModeServices, InnerAudit, ScriptsRunning
from vmcp_actors.decorators._composite import CompositeTools, WorkflowMetrics
from vmcp_actors.decorators._composite_tasks import CompositeTasks, UserTasks
from vmcp_actors.decorators._filter import AdvertisingFilter, hides_tools, is_advertised
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
    code_mode: CodeModeServices | None = None  # the script tool over everything (None: codeMode off)

    def build(self, backends: Any, client_capabilities: Mapping[str, Any],
              tasks: UserTasks | None = None, user: str = "") -> tuple[UserCore, CompositeTools | None]:
        """One user's stack over its ``AggregatedBackends``: the outermost layer, and the
        composite tools layer (its runs are the user's to cancel; ``tasks``: where the
        runs clients accept tasks of go; ``user``: its label, for operators).

        A layer the config gives nothing to do is left out, so a call pays nothing for it:
        the filter when no tool is hidden, composite tools when there are none and no code
        mode (whose script tasks are answered there, as the gateway's own)."""
        admission = StepAdmission(self.policies, self.limiter)
        filtered = hides_tools(self.config.aggregation)
        backends.require(admission.requirements(filtered))  # no backend call without these layers' decisions
        composites = None
        if self.config.composite_tools or self.code_mode is not None:
            composites = CompositeTools(backends, self.config.composite_tools, self.config.aggregation,
                                        self.workflow_metrics, client_capabilities=client_capabilities, tasks=tasks,
                                        admission=admission)
        below: UserCore = composites if composites is not None else backends
        limited: UserCore = below if self.limiter is None else \
            RateLimits(below, self.limiter, also_named=(SCRIPT_TOOL,) if self.code_mode is not None else ())
        outermost: UserCore = AdvertisingFilter(limited, self.config.aggregation) if filtered else limited
        optimizer = self.config.optimizer is not None  # the last of above_filter, when configured
        for wrap in self.above_filter[:-1] if optimizer else self.above_filter:
            outermost = wrap(outermost)
        callee = outermost  # what a script's calls enter: under the optimizer
        if optimizer:
            outermost = self.above_filter[-1](outermost)
        if self.code_mode is not None:
            outermost = CodeMode(outermost, callee, self.code_mode, optimizer=optimizer, tasks=tasks,
                                 user=user)
        return outermost, composites


def stack(config: VmcpConfig, embedder_layers: Sequence[LayerFactory] = (),
          workflow_metrics: WorkflowMetrics | None = None, limiter: RateLimiter | None = None,
          script_audit: InnerAudit | None = None) -> DecoratorStack:
    """Every decorator the config and the embedder ask for, in their one order
    (``script_audit``: writes the audit line of a script's tool call)."""
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
    code_mode = None
    if config.code_mode.enabled:
        code_mode = CodeModeServices(config.code_mode, Sandbox(config.code_mode), policies, limiter, script_audit)
    return DecoratorStack(config, tuple(above), workflow_metrics or WorkflowMetrics(), limiter, policies, code_mode)


__all__ = [
    "AdvertisingFilter",
    "CALL_TOOL",
    "CedarAuthz",
    "CedarPolicies",
    "CodeMode",
    "CodeModeServices",
    "CompositeTasks",
    "CompositeTools",
    "DecoratorStack",
    "FIND_TOOL",
    "META_TOOLS",
    "RateLimits",
    "ScriptsRunning",
    "SubtractOnly",
    "UserTasks",
    "ToolIndex",
    "ToolOptimizer",
    "WorkflowMetrics",
    "is_advertised",
    "stack",
]
