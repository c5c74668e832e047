"""The optimizer: ``find_tool`` and ``call_tool`` in place of every tool (ToolHive's vMCP
optimizer, with BM25 ranking and no model).

The outermost layer (see ``vmcp_actors.decorators``). A client lists two tools: it
describes what it wants to ``find_tool`` and gets the best matching tools with their input
schemas, then calls one through ``call_tool``. Both are answered from the layer below, so
whatever authz, the filter or an embedder's layer hides is neither found nor callable
here. These two meta-tools are, with composite tools, the only tools the gateway adds.

The index is built once per catalog (the layer below's list for this caller, the same
tuple for as long as that catalog is served) and rebuilt when that list changes;
searching it takes a fraction of a millisecond for 1,000 tools.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from vmcp_actors.concurrency import Deadline
from vmcp_actors.core._catalog import Route
from vmcp_actors.core._exchange import Exchange, answered
from vmcp_actors.core._explain import ADDS, UNLISTS, Explanation, Finding
from vmcp_actors.core._interface import CoreLayer, UnknownTool, UserCore
from vmcp_actors.decorators._search import ToolIndex, as_text, tool_summary
from vmcp_actors.identity import Identity
from vmcp_actors.protocol import INVALID_PARAMS, JsonRpcError

FIND_TOOL = "find_tool"
CALL_TOOL = "call_tool"
META_TOOLS = (FIND_TOOL, CALL_TOOL)

FIND_TOOL_DEFINITION: dict[str, Any] = {
    "name": FIND_TOOL,
    "description": ("Find the tools that can do a task. Describe the task in tool_description (and add "
                    "tool_keywords for exact terms); the answer lists the best matching tools with their "
                    "input schemas. Call one of them with call_tool."),
    "inputSchema": {
        "type": "object",
        "properties": {
            "tool_description": {"type": "string", "description": "What the tool should do, in plain words."},
            "tool_keywords": {"type": "string", "description": "Optional space-separated keywords (names, "
                                                               "systems, objects) to match."},
        },
        "required": ["tool_description"],
    },
    "annotations": {"title": "Find a tool", "readOnlyHint": True, "openWorldHint": False},
}

CALL_TOOL_DEFINITION: dict[str, Any] = {
    "name": CALL_TOOL,
    "description": ("Call a tool that find_tool returned: its name in tool_name and its arguments, as its "
                    "input schema describes them, in parameters."),
    "inputSchema": {
        "type": "object",
        "properties": {
            "tool_name": {"type": "string", "description": "The name find_tool gave."},
            "parameters": {"type": "object", "description": "The tool's arguments."},
        },
        "required": ["tool_name"],
    },
    "annotations": {"title": "Call a tool"},
}

META_DEFINITIONS = (FIND_TOOL_DEFINITION, CALL_TOOL_DEFINITION)


class ToolOptimizer(CoreLayer):
    """Two meta-tools over the layer below's tools (resources and prompts pass through)."""

    layer_name = "optimizer"

    def __init__(self, inner: UserCore, max_tools_to_return: int):
        super().__init__(inner)
        self._limit = max_tools_to_return
        self._lock = threading.Lock()  # guards _index (the cached index)
        self._index: tuple[tuple[dict[str, Any], ...], ToolIndex] | None = None

    def list_tools(self, identity: Identity | None, deadline: Deadline) -> tuple[dict[str, Any], ...]:
        return META_DEFINITIONS

    def describe_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> dict[str, Any] | None:
        return next((tool for tool in META_DEFINITIONS if tool["name"] == name), None)

    def lookup_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> Route | None:
        return Route("", name, name, composite=True) if name in META_TOOLS else None

    def call_tool(self, identity: Identity | None, name: str, arguments: dict[str, Any] | None,
                  meta: dict[str, Any] | None, deadline: Deadline) -> Exchange:
        arguments = arguments or {}
        if name == FIND_TOOL:
            return answered(self._find(identity, arguments, deadline))
        if name == CALL_TOOL:
            tool_name, parameters = arguments.get("tool_name"), arguments.get("parameters")
            if not isinstance(tool_name, str) or not tool_name:
                raise JsonRpcError(INVALID_PARAMS, "call_tool: tool_name must be a tool's name (from find_tool)")
            if parameters is not None and not isinstance(parameters, dict):
                raise JsonRpcError(INVALID_PARAMS, "call_tool: parameters must be an object of the tool's arguments")
            return self._inner.call_tool(identity, tool_name, parameters or {}, meta, deadline)
        if self._inner.lookup_tool(identity, name, deadline) is not None:
            raise JsonRpcError(INVALID_PARAMS, f"Unknown tool: {name} (this gateway lists find_tool and call_tool; "
                                               f"call {name} through call_tool)")
        raise UnknownTool(name)

    def find(self, identity: Identity | None, description: str, keywords: str, deadline: Deadline) -> list[dict]:
        """The best matches among the tools this caller may call (for find_tool and benchmarks)."""
        index = self._index_for(self._inner.list_tools(identity, deadline))
        return [tool_summary(tool, score) for tool, score in index.search(description, keywords, self._limit)]

    def _find(self, identity: Identity | None, arguments: dict[str, Any], deadline: Deadline) -> dict[str, Any]:
        description, keywords = arguments.get("tool_description"), arguments.get("tool_keywords", "")
        if not isinstance(description, str) or not description.strip():
            raise JsonRpcError(INVALID_PARAMS, "find_tool: tool_description must say what the tool should do")
        if isinstance(keywords, list) and all(isinstance(word, str) for word in keywords):
            keywords = " ".join(keywords)
        if not isinstance(keywords, str):
            raise JsonRpcError(INVALID_PARAMS, "find_tool: tool_keywords must be a string of keywords")
        found = self.find(identity, description, keywords, deadline)
        return {"content": [{"type": "text", "text": as_text({"tools": found})}],
                "structuredContent": {"tools": found}, "isError": False}

    def _index_for(self, tools: tuple[dict[str, Any], ...]) -> ToolIndex:
        # Built once per list the layer below answers (the same tuple for as long as its catalog
        # is served); the cache holds that tuple, so its id is not reused while it is cached. A
        # replaced index is left to the collector: a search in flight may still hold it.
        with self._lock:
            cached = self._index
            if cached is not None and cached[0] is tools:
                return cached[1]
        index = ToolIndex(tools)  # built outside the lock: a race only builds it twice
        with self._lock:
            self._index = (tools, index)
        return index

    def resume(self, identity, continuation, deadline):
        """A continued ``call_tool`` goes on as the tool it called, with its parameters;
        ``find_tool`` takes no input (what comes unasked is ignored)."""
        if continuation.method != "tools/call":
            return super().resume(identity, continuation, deadline)
        arguments = dict(continuation.arguments or {})
        if continuation.name == FIND_TOOL and continuation.backend is None:
            return self.call_tool(identity, FIND_TOOL, arguments, None, deadline)
        if continuation.name != CALL_TOOL:
            raise continuation.unknown()
        tool_name, parameters = arguments.get("tool_name"), arguments.get("parameters")
        if not isinstance(tool_name, str) or not tool_name or (parameters is not None and not isinstance(parameters, dict)):
            raise continuation.unknown()
        return self._inner.resume(identity, replace(continuation, name=tool_name, arguments=parameters or {}), deadline)

    def explain_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> Explanation:
        if name in META_TOOLS:
            below = self._inner.explain_tool(identity, name, deadline)
            return below.with_finding(Finding(self.layer_name, ADDS, f"{name} is one of the optimizer's two "
                                                                      "meta-tools"), listed=True, callable=True)
        below = self._inner.explain_tool(identity, name, deadline)
        if not below.callable:
            return below.with_finding(Finding(self.layer_name, UNLISTS, "the optimizer lists only find_tool and "
                                                                         "call_tool; find_tool does not return it"),
                                      listed=False, callable=False)
        return below.with_finding(Finding(self.layer_name, UNLISTS, "the optimizer lists only find_tool and call_tool; "
                                                                    f"find_tool returns {name} for matching "
                                                                    "descriptions and call_tool calls it"),
                                  listed=False, callable=True)

    def close(self) -> None:
        with self._lock:
            cached, self._index = self._index, None
        if cached is not None:
            cached[1].close()
        super().close()
