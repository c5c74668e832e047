"""What a composite step's call passes: the decisions a client's own call of the same tool
passes, in the same order, made by the same objects (the process's Cedar policies and rate
limiter) for the same caller.

A client's call is decided by the stack's layers (Cedar authz, then the advertising
filter, then rate limits; the edge checks ``Mcp-Param-*`` first). A step is called by the
gateway inside a composite the caller was allowed, so it meets none of those layers:
``StepAdmission`` makes the two decisions that apply to it. The tool is named as clients
call it (its advertised name; ``backend.tool`` for one the filter hides), so a composite
never launders a tool the caller may not call, nor a name around its bucket. The filter
does not refuse steps: composites may use tools it hides from lists (by design).

``tests/security/test_entry_points.py`` enumerates every way a call enters and proves each
is decided; a new way in fails it until it is listed there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vmcp_actors.core._catalog import InternalTool
from vmcp_actors.decorators._cedar import CALL_TOOL, CedarPolicies, audit_denied, tool_hints
from vmcp_actors.identity import Identity
from vmcp_actors.limits import RateLimiter


@dataclass(frozen=True)
class StepAdmission:
    policies: CedarPolicies | None = None
    limiter: RateLimiter | None = None

    @staticmethod
    def name_of(target: InternalTool) -> str:
        """The tool as clients call it."""
        return target.advertised_as or f"{target.route.backend}.{target.route.resolved_name or target.route.original_name}"

    def decides(self, target: InternalTool) -> bool:
        """Whether a call of ``target`` has anything to pass (else it is sent at once)."""
        return self.policies is not None or (self.limiter is not None and self.limiter.limits(self.name_of(target)))

    def admit(self, identity: Identity | None, target: InternalTool, arguments: Mapping[str, Any] | None) -> bool:
        """False when the policies forbid the caller this tool (audited); ``RateLimited``
        when a bucket is empty. May be a Redis round trip: never on an actor's loop."""
        name = self.name_of(target)
        if self.policies is not None:
            decision = self.policies.decide(self.policies.principal(identity), CALL_TOOL, name,
                                            tool_hints(target.definition), arguments)
            if not decision.allowed:
                audit_denied(identity, CALL_TOOL, name)
                return False
        if self.limiter is not None:
            self.limiter.admit(identity, name, client_call=False)
        return True
