"""Settings that load but have no effect, or may not do what they seem to: reported
(validate prints them, the server logs them at start), never silently ignored."""

from __future__ import annotations

from urllib.parse import urlsplit

from vmcp_actors.config._model import SCRIPT_TOOL, VmcpConfig
from vmcp_actors.workflows import MAX_ELICITATION_TIMEOUT


def config_warnings(config: VmcpConfig) -> list[str]:
    warnings = []
    aggregation = config.aggregation
    if aggregation.priority_order and aggregation.conflict_resolution != "priority":
        warnings.append(
            f"aggregation.conflictResolutionConfig.priorityOrder: under {aggregation.conflict_resolution} it names no "
            "tool; it only ranks the backends whose tools share an own name an app calls by (the first listed "
            "gets such a call)"
        )
    warnings.extend(_unknown_step_workloads(config))
    warnings.extend(_elicitation_settings(config))
    if config.optimizer is not None and config.optimizer.ignored:
        warnings.append("optimizer: " + ", ".join(config.optimizer.ignored) + " ignored: find_tool ranks with "
                        "BM25 over tool names, descriptions and parameter names (no embedding model)")
    telemetry = config.telemetry
    if telemetry.endpoint and urlsplit(telemetry.endpoint).port == 4317:
        warnings.append("telemetry.endpoint: port 4317 is OTLP over gRPC; this gateway sends OTLP over HTTP "
                        "(a collector's port 4318)")
    if telemetry.metrics_enabled:
        warnings.append("telemetry.metricsEnabled: no OTLP metrics are sent; GET /metrics serves them to Prometheus")
    authz = config.incoming_auth.authz
    if authz is not None and config.incoming_auth.type == "anonymous":
        warnings.append("incomingAuth.authz: every caller is anonymous (no claims, no subject), so every request "
                        "is evaluated as the principal Client::\"anonymous\"")
    if authz is not None and config.code_mode.enabled and not any(
            policy.lstrip().startswith("permit") and (SCRIPT_TOOL in policy or "resource ==" not in policy)
            for policy in authz.policies):
        warnings.append(f"codeMode: no Cedar policy permits {SCRIPT_TOOL} (by name or every tool): no caller "
                        f"may run scripts (permit action == Action::\"call_tool\", resource == Tool::\"{SCRIPT_TOOL}\")")
    if config.incoming_auth.oauth is not None and config.session_storage.provider == "memory":
        warnings.append("incomingAuth.oauth: sign-ins, registered clients and grants live in this process's memory: "
                        "a restart signs everyone out, and a second worker knows none of them (sessionStorage "
                        "provider redis shares them)")
    return warnings


def _elicitation_settings(config: VmcpConfig) -> list[str]:
    """What an elicitation step loads but does not do, as in ToolHive: wait past the cap,
    or retry (a person is not asked twice)."""
    warnings = []
    for index, composite in enumerate(config.composite_tools):
        for position, step in enumerate(composite.steps):
            if step.type != "elicitation":
                continue
            where = f"compositeTools[{index}].steps[{position}]"
            if step.timeout > MAX_ELICITATION_TIMEOUT:
                warnings.append(f"{where}.timeout: an elicitation waits at most {MAX_ELICITATION_TIMEOUT / 60:g}m "
                                f"for an answer; {step.timeout:g}s is cut to that")
            if step.on_error.action == "retry":
                warnings.append(f"{where}.onError.action: an elicitation is never retried; a failure of this step "
                                "aborts the call, as with abort")
    return warnings


def _unknown_step_workloads(config: VmcpConfig) -> list[str]:
    """A step tool ``w.t`` reads as tool ``t`` of backend ``w``; without such a backend it
    only works if some backend advertises a tool named exactly ``w.t`` (dots are allowed)."""
    warnings = []
    for index, composite in enumerate(config.composite_tools):
        for position, step in enumerate(composite.steps):
            if step.tool is None:
                continue  # an elicitation step
            workload, dot, _ = step.tool.partition(".")
            if dot and config.backend(workload) is None:
                where = f"compositeTools[{index}].steps[{position}]" + (".step" if step.for_each else "") + ".tool"
                warnings.append(
                    f"{where}: {step.tool!r} reads as workload.tool, but there is no backend named {workload!r}; "
                    "it only works if a backend advertises a tool with exactly this name"
                )
    return warnings
