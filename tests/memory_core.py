"""A small in-memory core: the capability interface over fixed tools, resources and
prompts, recording every call that reaches it (unit tests of the decorators)."""

from __future__ import annotations

from typing import Any

from vmcp_actors.core import (
    ABSENT,
    INVALID_PARAMS,
    OFFERS,
    RESOURCE_NOT_FOUND,
    Deadline,
    Explanation,
    Finding,
    JsonRpcError,
    Route,
    answered,
)


def tool(name: str, description: str = "", read_only: bool | None = None, **properties: Any) -> dict[str, Any]:
    definition: dict[str, Any] = {"name": name, "description": description,
                                  "inputSchema": {"type": "object", "properties": properties}}
    if read_only is not None:
        definition["annotations"] = {"readOnlyHint": read_only}
    return definition


class MemoryCore:
    def __init__(self, tools=(), resources=(), prompts=(), refused=()):
        self.tools = tuple(tools)
        self.resources = tuple({"uri": uri, "name": uri} for uri in resources)
        self.prompts = tuple({"name": name} for name in prompts)
        self.refused = set(refused)  # listed, yet this core refuses to look them up (and call them)
        self.calls: list[tuple[str, str, Any]] = []
        self.closed = False

    def list_tools(self, identity, deadline):
        return self.tools

    def lookup_tool(self, identity, name, deadline):
        if name in self.refused or all(t["name"] != name for t in self.tools):
            return None
        return Route("memory", name, name)

    def describe_tool(self, identity, name, deadline):
        return next((t for t in self.tools if t["name"] == name), None)

    def call_tool(self, identity, name, arguments, meta, deadline):
        if self.lookup_tool(identity, name, deadline) is None:
            raise JsonRpcError(INVALID_PARAMS, f"Unknown tool: {name}")
        self.calls.append(("tools/call", name, arguments))
        return answered({"content": [{"type": "text", "text": f"{name} ran"}]})

    def list_resources(self, identity, deadline):
        return self.resources

    def list_resource_templates(self, identity, deadline):
        return ()

    def lookup_resource(self, identity, uri, deadline):
        return "memory" if any(r["uri"] == uri for r in self.resources) else None

    def read_resource(self, identity, uri, meta, deadline):
        if self.lookup_resource(identity, uri, deadline) is None:
            raise JsonRpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": uri})
        self.calls.append(("resources/read", uri, None))
        return answered({"contents": [{"uri": uri, "text": "x"}]})

    def list_prompts(self, identity, deadline):
        return self.prompts

    def lookup_prompt(self, identity, name, deadline):
        return Route("memory", name, name) if any(p["name"] == name for p in self.prompts) else None

    def get_prompt(self, identity, name, arguments, meta, deadline):
        if self.lookup_prompt(identity, name, deadline) is None:
            raise JsonRpcError(INVALID_PARAMS, f"Unknown prompt: {name}")
        self.calls.append(("prompts/get", name, arguments))
        return answered({"messages": []})

    def complete(self, identity, params, deadline):
        return {"completion": {"values": [], "hasMore": False}}

    def set_logging_level(self, identity, level, deadline):
        return {}

    def subscribe_resource(self, identity, subscriber, uri, deadline):
        return {}

    def unsubscribe_resource(self, identity, subscriber, uri, deadline):
        return {}

    def explain_tool(self, identity, name, deadline) -> Explanation:
        if self.lookup_tool(identity, name, deadline) is not None:
            return Explanation(name, True, True, (Finding("memory", OFFERS, "offered"),))
        return Explanation(name, False, False, (Finding("memory", ABSENT, "not offered"),))

    def close(self):
        self.closed = True


def run(exchange) -> dict[str, Any]:
    """An exchange's result (these exchanges stream nothing)."""
    try:
        while True:
            next(exchange)
    except StopIteration as done:
        return done.value


def soon() -> Deadline:
    return Deadline.after(5)
