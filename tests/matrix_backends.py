"""The official-SDK backends of the never-worse matrix (tests/integration/test_never_worse.py).

* :func:`matrix_asking_backend` - :class:`tests.asking_backends.AskingBackend` (it asks its
  client mid-call through ``ctx``: sampling, elicitation in form and URL mode, roots on the
  standalone stream; resource updates, list changes, a call that waits to be cancelled)
  plus ``roots_in_call``, ``chatty`` (progress and log messages) and the result shapes.
* :func:`matrix_resolver_backend` - the resolver backend of tests/mrtr_backends.py (it asks
  through resolvers: ``input_required`` on 2026-07-28, requests mid-call on 2025) plus
  ``chatty`` and ``wait``.
* :func:`matrix_modern_backend` - the same as the resolver backend with the result shapes,
  serving 2026-07-28 only (tests/eras.py ``start_in_era(..., "modern")``).

Every SDK server serves both revisions unless wrapped; its back-channel (``ctx.session``
requests) works only on a 2025 session. :func:`add_result_shapes` adds what the matrix
compares field for field: a tool definition with every optional field the SDK can set
(``title``, ``icons``, ``_meta``, ``annotations``, ``outputSchema``), every content block
type with annotations and ``_meta``, embedded resources and resource links, a refused call
(a JSON-RPC error with ``data``), prompts and resources with titles and icons, a resource
template, completion, and paged ``prompts/list`` and ``resources/list``.

No ``from __future__ import annotations``: the SDK reads tool signatures at registration.
"""

import base64
from typing import Any

from pydantic import BaseModel

from tests.asking_backends import AskingBackend
from tests.backends import SdkBackend
from tests.eras import start_in_era
from tests.mrtr_backends import build_mrtr_server

PAGE_SIZE = 2  # prompts/list and resources/list of a shaped server page by two
ICON = {"src": "data:image/png;base64,iVBORw0KGgo=", "mimeType": "image/png", "sizes": ["16x16"]}
TINY_PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n tiny").decode()
TINY_WAV = base64.b64encode(b"RIFF tiny WAVE").decode()
REFUSED_CODE = -32602
REFUSED_MESSAGE = "shape must be round"


class Weather(BaseModel):
    temperature: float
    conditions: str


def add_result_shapes(server: Any) -> None:
    """The result shapes (module doc) on an unstarted ``MCPServer``."""
    from mcp import types
    from mcp.server.mcpserver.prompts.base import UserMessage
    from mcp.shared.exceptions import MCPError

    icons = [types.Icon(**ICON)]
    annotations = types.Annotations(audience=["user", "assistant"], priority=0.7,
                                    last_modified="2026-01-02T03:04:05Z")
    meta = {"example.test/origin": "matrix"}

    def weather(city: str) -> Weather:
        """The weather in a city, as structured content."""
        return Weather(temperature=21.5, conditions=f"sunny in {city}")

    server.add_tool(weather, title="Weather", icons=icons, meta=meta,
                    annotations=types.ToolAnnotations(title="Weather report", read_only_hint=True,
                                                      open_world_hint=False, idempotent_hint=True))

    def blocks() -> list:
        """One content block of every type, each with annotations and _meta."""
        return [
            types.TextContent(type="text", text="text block", annotations=annotations, _meta=meta),
            types.ImageContent(type="image", data=TINY_PNG, mime_type="image/png", annotations=annotations, _meta=meta),
            types.AudioContent(type="audio", data=TINY_WAV, mime_type="audio/wav", annotations=annotations, _meta=meta),
            types.ResourceLink(type="resource_link", uri="test://shapes/linked", name="linked", title="Linked",
                               description="a linked resource", mime_type="text/plain", size=6, icons=icons,
                               annotations=annotations, _meta=meta),
            types.EmbeddedResource(type="resource", annotations=annotations, _meta=meta, resource=types.TextResourceContents(
                uri="test://shapes/embedded-text", mime_type="text/plain", text="embedded", _meta=meta)),
            types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
                uri="test://shapes/embedded-blob", mime_type="application/octet-stream", blob=TINY_PNG)),
        ]

    server.add_tool(blocks, structured_output=False)

    def refuse(shape: str) -> str:
        """Refuses every call with a JSON-RPC error that carries data."""
        raise MCPError(REFUSED_CODE, REFUSED_MESSAGE, {"shape": shape, "allowed": ["round"]})

    server.add_tool(refuse)

    def fails() -> str:
        """A tool error: isError true."""
        from mcp.server.mcpserver.exceptions import ToolError

        raise ToolError("failed on purpose")

    server.add_tool(fails)

    for index in range(5):
        server.prompt(name=f"note_{index}", title=f"Note {index}", description=f"note number {index}",
                      icons=icons)(_note(index, UserMessage))

        server.resource(f"test://shapes/page/{index}", name=f"page_{index}", title=f"Page {index}",
                        mime_type="text/plain", icons=icons, annotations=annotations, meta=meta)(_page_text(index))

    def chapter(book: str, number: str) -> str:
        return f"{book} chapter {number}"

    server.resource("test://shapes/books/{book}/chapters/{number}", name="chapter", title="Chapter",
                    description="a chapter of a book", mime_type="text/plain", icons=icons)(chapter)

    @server.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> types.Completion | None:
        known = {"topic": ["general", "gateways", "graphs"], "book": ["gamma", "golf", "guide"],
                 "number": ["1", "2", "10"]}
        values = [value for value in known.get(argument.name, []) if value.startswith(argument.value)]
        if context is not None and context.arguments and argument.name == "number":
            values = [f"{context.arguments.get('book')}-{value}" for value in values]
        return types.Completion(values=values, total=len(values), has_more=False)

    _page(server, "prompts/list", server.list_prompts, "prompts", types.ListPromptsResult)
    _page(server, "resources/list", server.list_resources, "resources", types.ListResourcesResult)


def _note(index: int, message: Any) -> Any:
    def note(topic: str = "general") -> list:
        return [message(f"note {index} on {topic}")]

    return note


def _page_text(index: int) -> Any:
    def page() -> str:
        return f"page {index}"

    return page


def _page(server: Any, method: str, items: Any, key: str, result_type: Any) -> None:
    """Answer ``method`` in pages of PAGE_SIZE (the cursor is the offset, as text)."""
    from mcp import types

    async def paged(ctx: Any, params: types.PaginatedRequestParams | None) -> Any:
        every = await items()
        start = int(params.cursor) if params is not None and params.cursor else 0
        rest = every[start + PAGE_SIZE:]
        return result_type(**{key: every[start:start + PAGE_SIZE]},
                           next_cursor=str(start + PAGE_SIZE) if rest else None)

    server._lowlevel_server.add_request_handler(method, types.PaginatedRequestParams, paged)


def add_chatty(server: Any) -> None:
    """``chatty(steps)``: progress ``steps`` times and a log message at four levels, on the call's stream."""
    from mcp.server.mcpserver import Context

    async def chatty(steps: int, ctx: Context) -> str:
        """Report progress and log."""
        for step in range(1, steps + 1):
            await ctx.report_progress(step, steps, f"step {step} of {steps}")
        await ctx.debug("debug line")
        await ctx.info("info line")
        await ctx.warning("warning line")
        await ctx.error("error line")
        return f"chatted {steps}"

    server.add_tool(chatty)


def _add_roots_in_call(server: Any) -> None:
    from mcp import types
    from mcp.server.mcpserver import Context
    from mcp.shared.message import ServerMessageMetadata

    async def roots_in_call(ctx: Context) -> str:
        """The client's roots, asked on the call's own stream (related to the call)."""
        result = await ctx.session.send_request(
            types.ListRootsRequest(), types.ListRootsResult,
            metadata=ServerMessageMetadata(related_request_id=ctx.request_id))
        return ",".join(str(root.uri) for root in result.roots)

    server.add_tool(roots_in_call)


def matrix_asking_backend(name: str = "asking") -> AskingBackend:
    backend = AskingBackend(name)
    _add_roots_in_call(backend.server)
    add_chatty(backend.server)
    add_result_shapes(backend.server)
    return backend.start()


def _add_wait(server: Any, cancelled: Any) -> None:
    from mcp.server.mcpserver import Context

    async def wait(ctx: Context) -> str:
        """Wait until cancelled (or 30 s); progress 0 first (to a caller that asked for
        progress) says the call has arrived."""
        import anyio

        try:
            await ctx.report_progress(0, message="waiting")
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise
        return "waited"

    server.add_tool(wait)


class _ResolverBackend(SdkBackend):
    def __init__(self, name: str, shapes: bool) -> None:
        import threading

        super().__init__(name, build_mrtr_server(name))
        self.cancelled = threading.Event()
        add_chatty(self.server)
        _add_wait(self.server, self.cancelled)
        if shapes:
            add_result_shapes(self.server)


def matrix_resolver_backend(name: str = "resolver") -> SdkBackend:
    return _ResolverBackend(name, shapes=False).start()


def matrix_modern_backend(name: str = "modern") -> SdkBackend:
    return start_in_era(_ResolverBackend(name, shapes=True), "modern")
