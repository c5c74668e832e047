"""Rate limits over a user's stack: the outermost layer, so each client ``tools/call`` is
one decision (before any layer below runs, so a refused call reaches no backend).

The optimizer's ``call_tool`` is decided as a call of the tool it names. Composite steps
are decided where they are called (``CompositeTools``, the step tool's own buckets only).
A continued call (a 2026-07-28 retry with the client's input) was admitted when it began
and is not decided again, so a limit reached meanwhile loses no answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vmcp_actors.core._explain import PASSES, Explanation, Finding
from vmcp_actors.core._interface import CoreLayer, PerList, UserCore
from vmcp_actors.identity import Identity
from vmcp_actors.limits import RateLimiter



class RateLimits(CoreLayer):
    layer_name = "rate limits"

    def __init__(self, inner: UserCore, limiter: RateLimiter, call_tool: str | None = None,
                 callable_tools: Callable[[Identity | None, Any], tuple[dict[str, Any], ...]] | None = None):
        """``call_tool``: the optimizer's meta-tool that calls another tool (None: no
        optimizer); ``callable_tools``: every tool a client may name (the composite layer's
        list), which the configured tool names are checked against once per catalog."""
        super().__init__(inner)
        self._limiter = limiter
        self._call_tool = call_tool
        self._callable_tools = callable_tools
        self._checked: PerList[None] = PerList()

    def list_tools(self, identity, deadline):
        listed = self._inner.list_tools(identity, deadline)
        if self._callable_tools is not None:
            tools = self._callable_tools(identity, deadline)
            self._checked.get(tools, lambda: self._limiter.check_names(
                {tool["name"] for tool in tools} | ({self._call_tool} if self._call_tool else set())))
        return listed

    def limited_tool(self, name: str, arguments: dict[str, Any] | None) -> str:
        """The tool whose buckets a call of ``name`` passes."""
        if name == self._call_tool and isinstance(arguments, dict) and isinstance(arguments.get("tool_name"), str):
            return arguments["tool_name"]
        return name

    def call_tool(self, identity, name, arguments, meta, deadline):
        self._limiter.admit(identity, self.limited_tool(name, arguments))
        return self._inner.call_tool(identity, name, arguments, meta, deadline)

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
