"""Clients of the never-worse matrix: one scenario, run by a real client against one MCP URL,
gives one outcome (plain JSON values) that the test compares between a direct connection
and the gateway.

Two drivers print the same shapes: :func:`run_py_client` (the official Python SDK's
``mcp.Client``, ``mode="legacy"`` or the default ``"auto"``) and
``tests/node/ts_client.mjs`` (the TypeScript SDK's client; :func:`tests.node_mcp.run_ts_client`).

A scenario::

    {"capabilities": ["sampling", "elicitation", "roots"],   # callbacks the client installs
     "logLevel": "debug",                                     # the client's log opt-in on 2026-07-28
     "canned": CANNED,                                        # what those callbacks answer
     "steps": [{"op": "tools/list"}, {"op": "tools/call", "name": "echo", "arguments": {...},
                "progress": true, "timeout": 5, "cancelOnProgress": true}, ...]}

Steps: ``tools/list``, ``prompts/list``, ``resources/list``, ``resources/templates/list``
(each followed through ``nextCursor`` to the end, the items under the list's key),
``tools/call`` (``cancelOnProgress`` with ``progress``: cancelled at its first progress
notification, when the server has the call), ``prompts/get`` (``name``, ``arguments``),
``resources/read`` (``uri``), ``completion/complete`` (``ref``, ``argument``, ``context``),
``logging/setLevel`` (``level``), ``watch`` (``lists``: list changes, ``resources``: URIs to
hear updates of), ``wait`` (``method``, ``count``, ``timeout``: until that many such
notifications came), ``streams`` (``timeout``: until the server has answered the session's
standalone stream, so what it sends from then on reaches the client; at once on 2026-07-28,
which has none: ``watch`` returns once its ``subscriptions/listen`` is acknowledged).

``logging/setLevel`` and ``watch`` are each done the way the negotiated revision offers:
a 2025 session sends ``logging/setLevel`` and ``resources/subscribe`` (list changes come
on its standalone stream unasked); a 2026-07-28 connection opts in to log messages on
every request (``logLevel``) and opens ``subscriptions/listen``. The client's code is the
same either way, as it is for an application that lets its SDK negotiate.

The outcome::

    {"protocolVersion": "2025-11-25",
     "initialize": {"capabilities": {...}, "instructions": ..., "serverInfo": {...}},
     "steps": [{"result": {...}} | {"error": {"code", "message", "data"}} | {"timeout": true}
               | {"cancelled": true}, plus "progress": [...] for a call with "progress"],
     "asked": [{"method", "params"}, ...],          # the server's requests, in arrival order
     "notifications": [{"method", "params"}, ...]}  # every notification, in arrival order
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import mcp
from mcp import types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

CANNED: dict[str, Any] = {
    "model": "test-model",
    # Every field any matrix backend's form asks for: AskingBackend's Answer, the resolver
    # backend's Confirmation / Name / Colour, server-everything's form (only name required).
    "elicited": {"name": "Ada", "count": 3, "ok": True, "colour": "blue"},
    "roots": [{"uri": "file:///work/project", "name": "project"}],
}

HANDSHAKE_REVISIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")


def _dump(value: Any) -> Any:
    return value.model_dump(by_alias=True, mode="json", exclude_none=True)


class _PyDriver:
    def __init__(self, scenario: dict[str, Any]) -> None:
        self.scenario = scenario
        self.canned = scenario.get("canned", CANNED)
        self.asked: list[dict[str, Any]] = []
        self.notifications: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()
        self.client: mcp.Client | None = None
        self.listening = contextlib.AsyncExitStack()
        self.drains: list[asyncio.Task] = []
        self.standalone_open = asyncio.Event()  # the server answered the session's GET

    async def observe_response(self, response: Any) -> None:
        """An HTTP response hook: the SDK opens the standalone stream in the background."""
        if response.request.method == "GET" and response.status_code == 200:
            self.standalone_open.set()

    # -- what the client answers and hears ------------------------------------------------

    async def sampling(self, context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        self.asked.append({"method": "sampling/createMessage", "params": _dump(params)})
        text = params.messages[0].content.text
        return types.CreateMessageResult(role="assistant", model=self.canned["model"],
                                         content=types.TextContent(type="text", text=text.upper()))

    async def elicitation(self, context: Any, params: Any) -> types.ElicitResult:
        self.asked.append({"method": "elicitation/create", "params": _dump(params)})
        if getattr(params, "mode", "form") == "url":
            return types.ElicitResult(action="accept")
        return types.ElicitResult(action="accept", content=self.canned["elicited"])

    async def roots(self, context: Any) -> types.ListRootsResult:
        self.asked.append({"method": "roots/list", "params": {}})
        return types.ListRootsResult(roots=[types.Root(**root) for root in self.canned["roots"]])

    async def heard(self, message: Any) -> None:
        if isinstance(message, Exception):
            return
        self.notifications.append(_dump(message))
        self.arrived.set()

    def client_args(self) -> dict[str, Any]:
        wants = self.scenario.get("capabilities", [])
        args: dict[str, Any] = {"message_handler": self.heard, "log_level": self.scenario.get("logLevel")}
        if "sampling" in wants:
            args["sampling_callback"] = self.sampling
        if "elicitation" in wants:
            args["elicitation_callback"] = self.elicitation
        if "roots" in wants:
            args["list_roots_callback"] = self.roots
        return args

    # -- steps ------------------------------------------------------------------------------

    @property
    def handshake_era(self) -> bool:
        return self.client.protocol_version in HANDSHAKE_REVISIONS

    async def all_pages(self, list_page: Any, key: str) -> dict[str, Any]:
        items: list[Any] = []
        cursor = None
        for _ in range(1000):
            page = await list_page(cursor=cursor, cache_mode="bypass")
            dumped = _dump(page)
            items.extend(dumped.get(key, []))
            cursor = dumped.get("nextCursor")
            if not cursor:
                return {key: items}
        raise AssertionError(f"{key}: too many pages")

    async def call_tool(self, step: dict[str, Any]) -> dict[str, Any]:
        outcome: dict[str, Any] = {}
        progress: list[dict[str, Any]] = []
        first_progress = asyncio.Event()  # the server has the call

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append({key: item for key, item in
                             (("progress", value), ("total", total), ("message", message)) if item is not None})
            first_progress.set()

        call = asyncio.ensure_future(self.client.call_tool(
            step["name"], step.get("arguments", {}), progress_callback=on_progress if step.get("progress") else None))
        progressed = asyncio.ensure_future(first_progress.wait()) if step.get("cancelOnProgress") else None
        await asyncio.wait({call} | ({progressed} if progressed else set()), timeout=step.get("timeout", 30),
                           return_when=asyncio.FIRST_COMPLETED)
        if progressed is not None:
            progressed.cancel()
        if not call.done():
            call.cancel()  # the SDK tells the server (notifications/cancelled, or the request's stream closed)
            with contextlib.suppress(asyncio.CancelledError, mcp.MCPError):
                await call
            outcome["cancelled" if first_progress.is_set() and progressed is not None else "timeout"] = True
        elif isinstance(call.exception(), mcp.MCPError):
            outcome["error"] = _dump(call.exception().error)
        else:
            outcome["result"] = _dump(call.result())
        if step.get("progress"):
            outcome["progress"] = progress
        return outcome

    async def watch(self, step: dict[str, Any]) -> dict[str, Any]:
        resources = step.get("resources", [])
        if self.handshake_era:
            for uri in resources:
                await self.client.subscribe_resource(uri)
            return {}
        lists = bool(step.get("lists"))
        subscription = await self.listening.enter_async_context(self.client.listen(
            tools_list_changed=lists, prompts_list_changed=lists, resources_list_changed=lists,
            resource_subscriptions=resources))

        async def drain() -> None:  # the events reach message_handler as notifications too
            async for _ in subscription:
                pass

        self.drains.append(asyncio.create_task(drain()))
        return {}

    async def wait(self, step: dict[str, Any]) -> dict[str, Any]:
        method, count = step["method"], step.get("count", 1)

        def seen() -> list[Any]:
            return [n.get("params", {}) for n in self.notifications if n["method"] == method]

        async def until() -> None:
            while len(seen()) < count:
                self.arrived.clear()
                await self.arrived.wait()

        try:
            await asyncio.wait_for(until(), step.get("timeout", 5))
        except TimeoutError:
            return {"timeout": True}
        return {"result": {"seen": seen()}}

    async def step(self, step: dict[str, Any]) -> dict[str, Any]:
        client, op = self.client, step["op"]
        try:
            if op == "tools/call":
                return await self.call_tool(step)
            if op == "wait":
                return await self.wait(step)
            if op == "streams":
                if self.handshake_era:
                    try:
                        await asyncio.wait_for(self.standalone_open.wait(), step.get("timeout", 5))
                    except TimeoutError:
                        return {"timeout": True}
                return {}
            if op == "watch":
                return {"result": await self.watch(step)}
            if op == "logging/setLevel":
                if self.handshake_era:
                    return {"result": _dump(await client.set_logging_level(step["level"]))}
                return {"result": {}}  # 2026-07-28: the opt-in (logLevel) rides every request
            if op == "tools/list":
                return {"result": await self.all_pages(client.list_tools, "tools")}
            if op == "prompts/list":
                return {"result": await self.all_pages(client.list_prompts, "prompts")}
            if op == "resources/list":
                return {"result": await self.all_pages(client.list_resources, "resources")}
            if op == "resources/templates/list":
                return {"result": await self.all_pages(client.list_resource_templates, "resourceTemplates")}
            if op == "resources/read":
                return {"result": _dump(await client.read_resource(step["uri"], cache_mode="bypass"))}
            if op == "prompts/get":
                return {"result": _dump(await client.get_prompt(step["name"], step.get("arguments", {})))}
            if op == "completion/complete":
                ref = step["ref"]
                reference = (types.PromptReference(**ref) if ref["type"] == "ref/prompt"
                             else types.ResourceTemplateReference(**ref))
                context = step.get("context", {}).get("arguments")
                return {"result": _dump(await client.complete(reference, step["argument"], context_arguments=context))}
        except mcp.MCPError as error:
            return {"error": _dump(error.error)}
        return {"error": {"client": f"unknown step {op}"}}

    async def run(self, url: str, mode: str) -> dict[str, Any]:
        out: dict[str, Any] = {"steps": []}
        http = create_mcp_http_client()  # the SDK's own, with a hook that sees the standalone stream open
        http.event_hooks["response"].append(self.observe_response)
        try:
            async with http, mcp.Client(streamable_http_client(url, http_client=http), mode=mode,
                                        **self.client_args()) as client:
                self.client = client
                out["protocolVersion"] = client.protocol_version
                out["initialize"] = {"capabilities": _dump(client.server_capabilities),
                                     "instructions": client.instructions,
                                     "serverInfo": _dump(client.server_info) if client.server_info else None}
                async with self.listening:
                    for step in self.scenario["steps"]:
                        out["steps"].append(await self.step(step))
                    for drain in self.drains:
                        drain.cancel()
        except mcp.MCPError as error:
            out["connect"] = {"error": _dump(error.error)}
        out["asked"] = self.asked
        out["notifications"] = self.notifications
        return out


def run_py_client(url: str, scenario: dict[str, Any], mode: str = "auto", timeout: float = 60.0) -> dict[str, Any]:
    """Run ``scenario`` with the official Python SDK client (``mode``) against ``url``."""

    async def main() -> dict[str, Any]:
        return await asyncio.wait_for(_PyDriver(scenario).run(url, mode), timeout)

    return asyncio.run(main())
