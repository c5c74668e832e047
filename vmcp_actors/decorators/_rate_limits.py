"""Rate limits in a user's stack: just under the advertising filter (and so under Cedar
authz), over composite tools. A client's ``tools/call`` of a tool it may call is one
decision before any backend is asked; a call the policies or the filter refuse, or of a
tool that does not exist, spends nothing (so an empty bucket never tells a caller that a
hidden tool exists). The optimizer's ``call_tool`` reaches this layer as a call of the
tool it names; ``find_tool`` never does (it asks no backend). Composite steps are decided
where they are called (``CompositeTools``: the step tool's own buckets only). A continued
call (a 2026-07-28 retry with the client's input) is decided again: each round reaches the
backend again, and a sealed requestState could otherwise be replayed without limit.
"""

from __future__ import annotations

from vmcp_actors.core._admitted import LIMITS, admitted
from vmcp_actors.core._explain import PASSES, Explanation, Finding
from vmcp_actors.core._interface import CoreLayer, PerList, UserCore, reachable
from vmcp_actors.identity import Identity
from vmcp_actors.limits import RateLimiter



class RateLimits(CoreLayer):
    layer_name = "rate limits"

    def __init__(self, inner: UserCore, limiter: RateLimiter, also_named: tuple[str, ...] = ()):
        """``also_named``: tools a layer above adds whose calls spend here (code mode's script tool)."""
        super().__init__(inner)
        self._limiter = limiter
        self._also_named = also_named
        self._checked: PerList[None] = PerList()

    def list_tools(self, identity, deadline):
        """As below; the configured tool names are checked against it once per catalog."""
        tools = self._inner.list_tools(identity, deadline)
        self._checked.get(tools, lambda: self._limiter.check_names({tool["name"] for tool in tools}
                                                                   | set(self._also_named)))
        return tools

    def call_tool(self, identity, name, arguments, meta, deadline):
        if self._inner.lookup_tool(identity, name, deadline) is not None:  # else: the layer below's "unknown"
            self._limiter.admit(identity, name)
        with admitted(LIMITS, name):
            return self._inner.call_tool(identity, name, arguments, meta, deadline)

    def resume(self, identity, continuation, deadline):
        """A continued call spends a token as a new one would (after the checks below it)."""
        if continuation.method == "tools/call" and reachable(self._inner, identity, continuation, deadline):
            self._limiter.admit(identity, continuation.name)
        with admitted(LIMITS, continuation.name):
            return super().resume(identity, continuation, deadline)

    def explain_tool(self, identity: Identity | None, name: str, deadline) -> Explanation:
        below = self._inner.explain_tool(identity, name, deadline)
        buckets = self._limiter.buckets_for(identity, name)
        if not buckets:
            finding = Finding(self.layer_name, PASSES, "no rate limit applies to its calls")
            return below.with_finding(finding, listed=below.listed, callable=below.callable)
        described, empty = [], []
        for bucket in buckets:
            level = self._limiter.level(bucket)
            spec = f"{bucket.kind} {bucket.spec.max_tokens} per {bucket.spec.refill_period:g}s"
            described.append(spec if level is None else f"{spec} ({level:.1f} left)")
            if level is not None and level < 1:
                empty.append(bucket.kind)
        reason = "each call passes: " + ", ".join(described)
        if empty:
            reason += f"; a call now is refused (429) by the {empty[0]} bucket, empty until it refills"
        details = (("buckets", [{"kind": bucket.kind, "maxTokens": bucket.spec.max_tokens,
                                 "refillPeriodSeconds": bucket.spec.refill_period} for bucket in buckets]),
                   ("refusedBy", empty[0] if empty else None))
        return below.with_finding(Finding(self.layer_name, PASSES, reason, details),
                                  listed=below.listed, callable=below.callable)
