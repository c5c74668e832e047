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


# -- state per backend session, for tests with several clients at once -------------------

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
LOGGED_LEVELS = ("debug", "info", "warning", "error")  # what ``logs`` sends, least severe first
UPDATED_BY = "example.test/by"  # ``_meta`` key of a ``touch_subscribed`` update: who called
MEET_TIMEOUT = 10.0  # seconds a call waits at a meeting for the other caller


class _SessionState:
    def __init__(self) -> None:
        self.level: str | None = None  # set by logging/setLevel; None: every level
        self.calls = 0
        self.subscribed: list[str] = []  # URIs, in the order subscribed


def _session_key(request: Any) -> str | None:
    """The backend session a request belongs to (None: a session-less 2026-07-28 request)."""
    headers = getattr(request, "headers", None)
    return headers.get("mcp-session-id") if headers is not None else None


class PerSessionBackend(AskingBackend):
    """:class:`AskingBackend` that keeps state per backend session (the ``Mcp-Session-Id``
    it issued; one state for all session-less 2026-07-28 requests), as a server that
    several clients use at once does. On top of AskingBackend's:

    * ``logging/setLevel``: the session's level (so the backend declares ``logging``);
      ``logs`` sends nothing below it.
    * ``resources/subscribe`` / ``unsubscribe``: the session's URIs (also in ``.subscriptions``).
    * ``count()``: ``call <n> of this session``.
    * ``ask(who, what, where, meet)``: asks the client for ``what`` (sampling, elicitation,
      roots) on the call's stream (``where="call"``) or on the session's standalone
      stream (``"outside"``), after meeting the other caller of ``meet`` (so both calls
      are in flight at once); the answer says what the client said.
    * ``logs(who)``: a log message at each of LOGGED_LEVELS at or above the session's
      level, in the call and outside it (the standalone stream).
    * ``progress_for(who, steps, meet)``: progress ``steps`` times, meeting the other
      caller after the first.
    * ``touch_subscribed(who)``: ``notifications/resources/updated`` for each URI this
      session subscribed, outside the call, its ``_meta`` saying who called (UPDATED_BY).
    * ``fence(who)``: an ``emergency`` log message outside the call. On one stream what
      the backend sent before it arrives before it.
    """

    def __init__(self, name: str) -> None:
        import asyncio

        from mcp import types
        from mcp.server.mcpserver import Context
        from mcp.shared.message import ServerMessageMetadata

        super().__init__(name)
        server = self.server
        self.sessions: dict[str | None, _SessionState] = {}
        meetings: dict[str, tuple[list[int], asyncio.Event]] = {}

        def state(request: Any) -> _SessionState:
            return self.sessions.setdefault(_session_key(request), _SessionState())

        async def meet(key: str) -> bool:
            """Wait for the other caller of ``key`` (two callers meet); False after MEET_TIMEOUT."""
            if not key:
                return True
            arrived, met = meetings.setdefault(key, ([0], asyncio.Event()))
            arrived[0] += 1
            if arrived[0] >= 2:
                met.set()
            try:
                await asyncio.wait_for(met.wait(), MEET_TIMEOUT)
            except TimeoutError:
                return False
            return True

        async def set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
            state(ctx.request).level = params.level
            return types.EmptyResult()

        async def on_subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
            self.subscriptions.append(("subscribe", str(params.uri)))
            subscribed = state(ctx.request).subscribed
            if str(params.uri) not in subscribed:
                subscribed.append(str(params.uri))
            return types.EmptyResult()

        async def on_unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
            self.subscriptions.append(("unsubscribe", str(params.uri)))
            subscribed = state(ctx.request).subscribed
            if str(params.uri) in subscribed:
                subscribed.remove(str(params.uri))
            return types.EmptyResult()

        lowlevel = server._lowlevel_server
        lowlevel.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)
        lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, on_subscribe)
        lowlevel.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, on_unsubscribe)

        def count(ctx: Context) -> str:
            """Count this backend session's calls of count."""
            session = state(ctx.request_context.request)
            session.calls += 1
            return f"call {session.calls} of this session"

        async def ask(who: str, what: str, where: str, ctx: Context, meet_at: str = "") -> str:
            """Ask the client for ``what`` (sampling, elicitation, roots), ``where`` (call:
            on the call's stream; outside: on the standalone stream)."""
            met = await meet(meet_at)
            related = ctx.request_id if where == "call" else None
            session = ctx.session
            if what == "sampling":
                sampled = await session.create_message(
                    [types.SamplingMessage(role="user", content=types.TextContent(type="text", text=f"{who} asks"))],
                    max_tokens=20, related_request_id=related)
                answer = f"{sampled.model}: {sampled.content.text}"
            elif what == "elicitation":
                elicited = await session.elicit_form(f"{who}, who are you?", Answer.model_json_schema(),
                                                     related_request_id=related)
                answer = f"{elicited.action}: {elicited.content}"
            elif what == "roots":
                listed = await session.send_request(types.ListRootsRequest(), types.ListRootsResult,
                                                    metadata=ServerMessageMetadata(related_request_id=related))
                answer = ",".join(str(root.uri) for root in listed.roots)
            else:
                raise ValueError(f"cannot ask for {what}")
            return f"{who} asked for {what} {where}{'' if met else ' (alone)'}: {answer}"

        async def logs(who: str, ctx: Context) -> str:
            """Log at each of LOGGED_LEVELS at or above this session's level, in the call and outside it."""
            level = state(ctx.request_context.request).level
            floor = LOG_LEVELS.index(level) if level in LOG_LEVELS else 0
            for logged in LOGGED_LEVELS:
                if LOG_LEVELS.index(logged) >= floor:
                    await ctx.log(logged, f"{who} {logged} in the call")
                    await ctx.session.send_log_message(logged, f"{who} {logged} outside the call")
            return f"{who} logged"

        async def progress_for(who: str, steps: int, ctx: Context, meet_at: str = "") -> str:
            """Progress ``steps`` times, meeting the other caller after the first."""
            await ctx.report_progress(1, steps, f"{who} step 1")
            met = await meet(meet_at)
            for step in range(2, steps + 1):
                await ctx.report_progress(step, steps, f"{who} step {step}")
            return f"{who} progressed{'' if met else ' (alone)'}"

        async def touch_subscribed(who: str, ctx: Context) -> str:
            """resources/updated for each URI this session subscribed, outside the call."""
            uris = list(state(ctx.request_context.request).subscribed)
            for uri in uris:
                await ctx.session.send_notification(types.ResourceUpdatedNotification(
                    params=types.ResourceUpdatedNotificationParams(uri=uri, _meta={UPDATED_BY: who})))
            return f"{who} touched {len(uris)}"

        async def fence(who: str, ctx: Context) -> str:
            """An emergency log message outside the call."""
            await ctx.session.send_log_message("emergency", f"{who} fence")
            return f"{who} fenced"

        for fn in (count, ask, logs, progress_for, touch_subscribed, fence):
            server.add_tool(fn)


def per_session_backend(name: str = "sessions") -> PerSessionBackend:
    return PerSessionBackend(name).start()
