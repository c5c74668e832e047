"""Why a caller does or does not see a tool: every layer of the capability stack adds its
own finding, innermost first, so a new decorator explains itself without touching others.

``CoreLayer.explain_tool`` asks the layer below, then adds the layer's finding:
by default a generic one from comparing its own ``lookup_tool`` and ``list_tools`` with the
layer below's; a layer with something more to say overrides ``finding``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

# What a layer did with the tool.
OFFERS = "offers"  # the backends offer it (the innermost layer)
ABSENT = "absent"  # nothing below has it
ADDS = "adds"  # the layer itself provides it (composite tools, the optimizer's meta-tools)
PASSES = "passes"  # the layer lets it through as it found it
HIDES = "hides"  # the layer takes it out of the list and refuses calls
UNLISTS = "unlists"  # not listed, still reachable another way (behind the optimizer's call_tool)
USES = "uses"  # not a change of visibility: the layer's own features depend on it (composite steps)


@dataclass(frozen=True)
class Finding:
    """One layer's word on a tool."""

    layer: str
    verdict: str
    reason: str
    details: tuple[tuple[str, Any], ...] = ()  # plain values for machines (backend, original name, ...)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"layer": self.layer, "verdict": self.verdict, "reason": self.reason}
        if self.details:
            out["details"] = dict(self.details)
        return out


@dataclass(frozen=True)
class Explanation:
    """What the stack does with ``tool`` for one caller: listed and callable as the outermost
    layer decided, and each layer's findings, innermost first."""

    tool: str
    listed: bool
    callable: bool
    findings: tuple[Finding, ...] = ()

    def with_finding(self, finding: Finding, *, listed: bool, callable: bool) -> Explanation:
        return replace(self, listed=listed, callable=callable, findings=self.findings + (finding,))

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "listed": self.listed, "callable": self.callable,
                "findings": [finding.to_json() for finding in self.findings]}

    def to_text(self) -> str:
        """For a terminal: the verdict, then one line per layer, innermost first."""
        if self.listed:
            head = f"{self.tool}: listed and callable" if self.callable else f"{self.tool}: listed, not callable"
        elif self.callable:
            head = f"{self.tool}: not listed, reachable through another tool"
        else:
            head = f"{self.tool}: not visible"
        lines = [head]
        for finding in self.findings:
            lines.append(f"  [{finding.layer}] {finding.verdict}: {finding.reason}")
        return "\n".join(lines)


def generic_finding(layer: str, below: Explanation, listed: bool, callable: bool) -> Finding:
    """What any layer did, read from its own answers compared with the layer below's."""
    if listed == below.listed and callable == below.callable:
        if below.callable or below.listed:
            return Finding(layer, PASSES, "passed through unchanged")
        hidden = any(finding.verdict == HIDES for finding in below.findings)
        return Finding(layer, PASSES, "nothing to decide: a layer below hides it" if hidden
                       else "nothing to pass: the layers below do not offer it")
    if not below.listed and not below.callable and (listed or callable):
        return Finding(layer, ADDS, "this layer provides it")
    if not listed and not callable:
        return Finding(layer, HIDES, "this layer hides it: not listed, and a call is refused as for an unknown tool")
    if not listed:
        return Finding(layer, UNLISTS, "this layer leaves it out of the list")
    return Finding(layer, HIDES, "this layer lists it but refuses calls")
