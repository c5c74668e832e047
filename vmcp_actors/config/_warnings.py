"""Settings that load but have no effect: reported (validate prints them, the server logs
them at start), never silently ignored."""

from __future__ import annotations

from vmcp_actors.config._model import VmcpConfig


def config_warnings(config: VmcpConfig) -> list[str]:
    warnings = []
    aggregation = config.aggregation
    if aggregation.priority_order and aggregation.conflict_resolution != "priority":
        warnings.append(
            "aggregation.conflictResolutionConfig.priorityOrder: only used with conflictResolution priority; "
            f"ignored under {aggregation.conflict_resolution}"
        )
    return warnings
