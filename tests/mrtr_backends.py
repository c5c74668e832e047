"""An official-SDK backend that needs input from the client in every way MCP offers,
written with the SDK's resolvers: on a 2026-07-28 request the SDK answers
``input_required`` and goes on when the client retries with ``inputResponses`` (multi
round-trip requests); on a 2025 session it sends the client each request mid-call. So one
backend serves both eras, and ``protocol: modern`` / ``legacy`` in the gateway's config
picks which one the gateway speaks to it.

Tools (names as the backend has them):

* ``confirm(item)``: elicits ``{"ok": bool}``; answers ``"confirmed <item>"`` or ``"not confirmed"``
  (``"declined"`` / ``"cancelled"`` when the user did not accept).
* ``summarize(text)``: samples the client's LLM; answers ``"summary: <the LLM's text>"``.
* ``roots()``: lists the client's roots; answers their URIs joined by commas.
* ``two_steps()``: asks a name, then (a second round, it depends on the first answer) a
  colour; answers ``"<name> likes <colour>"``.
"""

# No ``from __future__ import annotations``: the SDK reads these tools' annotations at
# registration, and the resolver markers must be real objects there.
from typing import Annotated, Any

from mcp.server.elicitation import ElicitationResult
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resolve import Elicit, ListRoots, Resolve, Sample
from mcp.types import SamplingMessage, TextContent
from pydantic import BaseModel

from tests.backends import SdkBackend


class Confirmation(BaseModel):
    ok: bool


class Name(BaseModel):
    name: str


class Colour(BaseModel):
    colour: str


def build_mrtr_server(name: str = "asker") -> Any:
    srv = MCPServer(name, version="0.0.1", log_level="WARNING")

    def ask_confirmation(item: str) -> Elicit[Confirmation]:
        return Elicit(f"Confirm {item}?", Confirmation)

    async def confirm(item: str, answer: Annotated[ElicitationResult[Confirmation],
                                                   Resolve(ask_confirmation)]) -> str:
        """Ask the user to confirm an item."""
        if answer.action != "accept":
            return "declined" if answer.action == "decline" else "cancelled"
        return f"confirmed {item}" if answer.data.ok else "not confirmed"

    def ask_llm(text: str) -> Sample:
        return Sample([SamplingMessage(role="user", content=TextContent(type="text", text=f"Summarize: {text}"))],
                      max_tokens=50)

    async def summarize(text: str, sampled: Annotated[Any, Resolve(ask_llm)]) -> str:
        """Summarize a text with the client's LLM."""
        content = sampled.content
        return f"summary: {getattr(content, 'text', content)}"

    def ask_roots() -> ListRoots:
        return ListRoots()

    async def roots(listed: Annotated[Any, Resolve(ask_roots)]) -> str:
        """The client's roots."""
        return ",".join(str(root.uri) for root in listed.roots)

    def ask_name() -> Elicit[Name]:
        return Elicit("Your name?", Name)

    def ask_colour(who: Annotated[Name, Resolve(ask_name)]) -> Elicit[Colour]:
        return Elicit(f"Favourite colour, {who.name}?", Colour)

    async def two_steps(who: Annotated[Name, Resolve(ask_name)],
                        colour: Annotated[Colour, Resolve(ask_colour)]) -> str:
        """Two questions, the second depending on the first."""
        return f"{who.name} likes {colour.colour}"

    for fn in (confirm, summarize, roots, two_steps):
        srv.add_tool(fn)
    return srv


def mrtr_backend(name: str = "asker") -> SdkBackend:
    return SdkBackend(name, build_mrtr_server(name)).start()


def build_header_server(name: str = "hdr") -> Any:
    """Tools whose inputSchema marks arguments with ``x-mcp-header`` (2026-07-28 clients
    mirror them in ``Mcp-Param-*`` headers): ``query(region, sql)`` with ``Region``."""
    from pydantic import Field

    srv = MCPServer(name, version="0.0.1", log_level="WARNING")

    def query(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})], sql: str) -> str:
        """Run a query in a region."""
        return f"{region}: {sql}"

    srv.add_tool(query)
    return srv


def header_backend(name: str = "hdr") -> SdkBackend:
    return SdkBackend(name, build_header_server(name)).start()
