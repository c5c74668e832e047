"""An official-SDK backend that asks its client things and changes under it: sampling,
elicitation (form and URL), roots, resource updates, list changes, a call that waits to be
cancelled. Served on a loopback port like every test backend.

No ``from __future__ import annotations`` here: the SDK inspects tool signatures for the
``Context`` parameter when the tool is registered.
"""

import threading
from typing import Any

from pydantic import BaseModel

from tests.backends import SdkBackend

WATCHED_URI = "test://asking/watched"
OTHER_URI = "test://asking/other"


class Answer(BaseModel):
    name: str
    count: int = 0


class AskingBackend(SdkBackend):
    """``.cancelled`` is set when a ``wait`` call was cancelled; ``.events`` records what happened."""

    def __init__(self, name: str) -> None:
        from mcp.server.mcpserver import Context, MCPServer
        from mcp.types import SamplingMessage, TextContent

        server = MCPServer(name, log_level="WARNING")
        super().__init__(name, server)
        self.cancelled = threading.Event()
        self.events: list[str] = []
        backend = self

        async def ask_llm(prompt: str, ctx: Context) -> str:
            """Ask the client's model (sampling/createMessage on the call's stream)."""
            result = await ctx.session.create_message(
                [SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
                max_tokens=50, related_request_id=ctx.request_id)
            return f"model {result.model} said: {result.content.text}"

        async def ask_user(question: str, ctx: Context) -> str:
            """Ask the user (form elicitation on the call's stream)."""
            result = await ctx.elicit(question, Answer)
            if result.action == "accept":
                return f"accepted: {result.data.name} x{result.data.count}"
            return result.action

        async def ask_url(ctx: Context) -> str:
            """Send the user to a URL (URL elicitation on the call's stream)."""
            result = await ctx.elicit_url("Sign in, please", "https://example.test/sign-in", "sign-in-1")
            return f"url: {result.action}"

        async def roots(ctx: Context) -> str:
            """The client's roots (roots/list, which the SDK sends on its standalone stream)."""
            result = await ctx.session.list_roots()
            return ",".join(str(root.uri) for root in result.roots)

        async def touch(uri: str, ctx: Context) -> str:
            """Tell subscribers that ``uri`` changed (on the standalone stream)."""
            await ctx.session.send_resource_updated(uri)
            return f"touched {uri}"

        async def grow(tool: str, ctx: Context) -> str:
            """Add a tool named ``tool`` and say the tool list changed."""

            def added() -> str:
                return f"{tool} works"

            added.__name__ = tool
            server.add_tool(added, name=tool, description=f"added at run time: {tool}")
            await ctx.session.send_tool_list_changed()
            return f"added {tool}"

        async def wait(ctx: Context) -> str:
            """Wait until cancelled (or 30 s); progress 0 first (to a caller that asked for
            progress) says the call has arrived."""
            import anyio

            try:
                await ctx.report_progress(0, message="waiting")
                await anyio.sleep(30)
            except anyio.get_cancelled_exc_class():
                backend.cancelled.set()
                raise
            return "waited"

        later: list[Any] = []  # the tasks roots_later started (kept from the garbage collector)

        async def roots_later(ctx: Context) -> str:
            """Answer at once, then ask for the client's roots (roots/list outside any call);
            ``.events`` says what came back and how long it took."""
            import asyncio
            import time

            session = ctx.session

            async def ask() -> None:
                await asyncio.sleep(0.3)
                started = time.monotonic()
                try:
                    result = await session.list_roots()
                    outcome = "roots: " + ",".join(str(root.uri) for root in result.roots)
                except Exception as error:  # noqa: BLE001 - recorded for the test
                    outcome = f"refused: {error}"
                backend.events.append(f"{outcome} after {time.monotonic() - started:.1f} s")

            later.append(asyncio.get_running_loop().create_task(ask()))
            return "asking later"

        for fn in (ask_llm, ask_user, ask_url, roots, roots_later, touch, grow, wait):
            server.add_tool(fn)

        @server.resource(WATCHED_URI, mime_type="text/plain")
        def watched() -> str:
            return "watched"

        @server.resource(OTHER_URI, mime_type="text/plain")
        def other() -> str:
            return "other"

        from mcp import types

        self.subscriptions: list[tuple[str, str]] = []  # (method, uri) in arrival order

        async def on_subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
            backend.subscriptions.append(("subscribe", str(params.uri)))
            return types.EmptyResult()

        async def on_unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
            backend.subscriptions.append(("unsubscribe", str(params.uri)))
            return types.EmptyResult()

        server._lowlevel_server.add_request_handler("resources/subscribe", types.SubscribeRequestParams, on_subscribe)
        server._lowlevel_server.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams,
                                                    on_unsubscribe)


def asking_backend(name: str = "asking") -> AskingBackend:
    return AskingBackend(name).start()
