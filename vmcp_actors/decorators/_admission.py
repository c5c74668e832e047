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

Its decisions are stamped on the call (``admitting``) like the layers' own, and
``AggregatedBackends`` sends no call without the stamps the config asks for
(``core/_admitted.py``). ``tests/security/test_entry_points.py`` enumerates every way a
call enters and proves each is decided; a new way in fails it until it is listed there.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from vmcp_actors.core._admitted import AUTHZ, FILTER, LIMITS, Requirements, admitted
from vmcp_actors.core._catalog import InternalTool
from vmcp_actors.decorators._cedar import CALL_TOOL, CedarPolicies, audit_denied, tool_hints
from vmcp_actors.identity import Identity
from vmcp_actors.limits import RateLimiter


@dataclass(frozen=True)
class StepAdmission:
    policies: CedarPolicies | None = None
    limiter: RateLimiter | None = None

    @property
    def checks(self) -> frozenset[str]:
        """What a step's call is decided by (what ``AggregatedBackends`` requires of it)."""
        return frozenset(check for check, used in ((AUTHZ, self.policies), (LIMITS, self.limiter)) if used is not None)

    def requirements(self, filtered: bool) -> Requirements:
        """What the stack requires of a client's call (the filter's decision too, when the
        stack has the filter: ``filtered``), of a step's, and of a prompt's get or a
        resource's read (Cedar's decision)."""
        return Requirements(client=(self.checks | {FILTER}) if filtered else self.checks, step=self.checks,
                            reads=frozenset({AUTHZ}) if self.policies is not None else frozenset())

    def decides(self) -> bool:
        """Whether a step's call has anything to pass (else it is sent at once)."""
        return bool(self.checks)

    @contextmanager
    def admitting(self, identity: Identity | None, target: InternalTool,
                  arguments: Mapping[str, Any] | None) -> Iterator[bool]:
        """Whether the call may go (``admit``); while the block runs, it is stamped as
        decided by each check, for the door in ``AggregatedBackends``."""
        if not self.admit(identity, target, arguments):
            yield False
            return
        with ExitStack() as stamps:
            for check in self.checks:
                stamps.enter_context(admitted(check, target.called_as))
            yield True

    def admit(self, identity: Identity | None, target: InternalTool, arguments: Mapping[str, Any] | None) -> bool:
        """False when the policies forbid the caller this tool (audited); ``RateLimited``
        when a bucket is empty. May be a Redis round trip: never on an actor's loop."""
        name = target.called_as
        if self.policies is not None:
            decision = self.policies.decide(self.policies.principal(identity), CALL_TOOL, name,
                                            tool_hints(target.definition), arguments)
            if not decision.allowed:
                audit_denied(identity, CALL_TOOL, name)
                return False
        if self.limiter is not None:
            self.limiter.admit(identity, name, client_call=False)
        return True
