"""The backend the MCP conformance suite's server scenarios expect, built with the official SDK.

``@modelcontextprotocol/conformance`` (see docs/conformance.md) drives a server through fixed
scenarios; each one calls tools, resources and prompts by fixed names and checks the answers.
This module serves exactly those, on a loopback port like every test backend
(:func:`conformance_backend`), or standalone for manual runs::

    .venv/bin/python -m tests.conformance.fixture_server --port 3001   # http://127.0.0.1:3001/mcp

What the scenarios need from it, by name:

* tools ``test_simple_text``, ``test_image_content``, ``test_audio_content``,
  ``test_embedded_resource``, ``test_multiple_content_types``, ``test_error_handling``
  (isError), ``test_tool_with_logging`` (3 log messages 50 ms apart),
  ``test_tool_with_progress`` (progress 0, 50, 100 of 100), ``test_sampling(prompt)``
  (``sampling/createMessage`` on the call's stream), ``test_elicitation(message)``,
  ``test_elicitation_sep1034_defaults``, ``test_elicitation_sep1330_enums`` (form
  elicitations), ``json_schema_2020_12_tool`` (a hand-written 2020-12 input schema),
  ``test_reconnection`` (closes the call's SSE stream mid-call; the result arrives after the
  client resumes with ``Last-Event-ID``);
* resources ``test://static-text``, ``test://static-binary``, ``test://watched-resource``
  (``resources/subscribe`` / ``unsubscribe`` answer ``{}``), template
  ``test://template/{id}/data``;
* prompts ``test_simple_prompt``, ``test_prompt_with_arguments(arg1, arg2)`` (with
  ``completion/complete`` for ``arg1``), ``test_prompt_with_embedded_resource(resourceUri)``,
  ``test_prompt_with_image``;
* ``logging/setLevel`` (kept per session, filters this backend's log messages);
* resumable SSE: an event store, priming events with ``retry``, replay on ``GET`` with
  ``Last-Event-ID``; DNS-rebinding protection (the SDK's default for a loopback host).

One tool goes beyond the suite: ``test_elicitation_url`` asks for a URL-mode elicitation.

No ``from __future__ import annotations``: the SDK inspects tool signatures for ``Context``.
"""

import argparse
import asyncio
import base64
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tests.asgi_bodies import read_body, replaying
from tests.backends import SdkBackend

NAME = "conformance-fixture"

# A 1x1 PNG and a tiny WAV: the suite only checks that data and mimeType are there.
PNG_BASE64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
WAV_BASE64 = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQIAAAAAAA=="

WATCHED_URI = "test://watched-resource"
RETRY_MS = 100  # the retry field of priming events: how soon a client reconnects a closed stream

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")

JSON_SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    # SEP-2106 (2026-07-28): composition and conditional keywords are kept as they are.
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}

CONTACT_SCHEMA = {
    "type": "object",
    "properties": {
        "username": {"type": "string", "description": "User's response"},
        "email": {"type": "string", "description": "User's email address"},
    },
    "required": ["username", "email"],
}

DEFAULTS_SCHEMA = {  # SEP-1034: a default for every primitive type
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "Name", "default": "John Doe"},
        "age": {"type": "integer", "description": "Age", "default": 30},
        "score": {"type": "number", "description": "Score", "default": 95.5},
        "status": {
            "type": "string",
            "description": "Status",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "description": "Verified", "default": True},
    },
}

ENUMS_SCHEMA = {  # SEP-1330: the five enum shapes
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {
            "type": "string",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
        "titledMulti": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
}

COMPLETIONS = {"arg1": ("paris", "park", "party", "test-value"), "arg2": ("world", "wonder")}


# ----------------------------------------------------------------------------------
# Resumability: an in-memory event store
# ----------------------------------------------------------------------------------


class MemoryEventStore:
    """Every SSE event the transport sends, kept (bounded) so a client can resume a stream.

    Event ids are increasing integers (as strings). ``replay_events_after`` sends the
    events of the same stream after the given id; priming events (no message) are kept
    as cursors and never replayed. Built on the SDK's ``EventStore`` interface lazily
    (see :func:`event_store`).

    One store serves every session and the SDK names a POST stream after its request id,
    so two sessions with a request of the same id open at once would share a stream on
    replay (and all sessions' standalone GET streams share one name). The suite, and the
    gateway in front of the fixture, talk to it over one session at a time.
    """

    def __init__(self, limit: int = 10_000) -> None:
        self._events: deque[tuple[int, str, Any]] = deque(maxlen=limit)
        self._next_id = 0

    async def store_event(self, stream_id: str, message: Any) -> str:
        self._next_id += 1
        self._events.append((self._next_id, stream_id, message))
        return str(self._next_id)

    async def replay_events_after(self, last_event_id: str, send_callback: Any) -> str | None:
        from mcp.server.streamable_http import EventMessage

        if not last_event_id.isdigit():
            return None
        after = int(last_event_id)
        stream = next((stream for number, stream, _ in self._events if number == after), None)
        if stream is None:
            return None
        for number, stream_id, message in list(self._events):
            if number > after and stream_id == stream and message is not None:
                await send_callback(EventMessage(message, str(number)))
        return stream


def event_store() -> Any:
    """A :class:`MemoryEventStore` that is also an SDK ``EventStore``."""
    from mcp.server.streamable_http import EventStore

    class _Store(MemoryEventStore, EventStore):
        pass

    return _Store()


# ----------------------------------------------------------------------------------
# The negotiated version wins over a stale MCP-Protocol-Version header
# ----------------------------------------------------------------------------------


class NegotiatedVersionHeader:
    """ASGI middleware: a request of a session whose ``MCP-Protocol-Version`` header names an
    older revision than the session negotiated is handed on with the negotiated one.

    Why: the suite's ``server-sse-polling`` and ``server-sse-multiple-streams`` scenarios
    open a session (negotiating 2025-11-25) and then send hand-made POSTs carrying
    ``mcp-protocol-version: 2025-03-26``. The SDK decides per request from that header
    whether to send priming events and allow closing a stream mid-call (only from
    2025-11-25 on), so without this the scenario warns that no priming event and no
    retry field came. The negotiated version is learnt from each ``initialize`` and the
    session id its answer carries.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.negotiated: dict[str, str] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = {key.lower(): value for key, value in scope["headers"]}
        session_id = headers.get(b"mcp-session-id", b"").decode("latin-1")
        if session_id:
            wanted = self.negotiated.get(session_id)
            header = headers.get(b"mcp-protocol-version", b"").decode("latin-1")
            if wanted and header and header < wanted:  # ISO dates order as strings
                scope = dict(scope)
                scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() != b"mcp-protocol-version"]
                scope["headers"].append((b"mcp-protocol-version", wanted.encode("latin-1")))
            await self.app(scope, receive, send)
            return
        # No session yet: maybe an initialize. Read the body to learn the version asked for.
        body = await read_body(receive)
        asked = _initialize_version(body)

        async def watch(message: Any) -> None:
            if asked and message["type"] == "http.response.start":
                for key, value in message.get("headers", []):
                    if key.lower() == b"mcp-session-id":
                        self.negotiated[value.decode("latin-1")] = _negotiated(asked)
            await send(message)

        await self.app(scope, replaying(body, receive), watch)


def _initialize_version(body: bytes) -> str | None:
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if isinstance(message, dict) and message.get("method") == "initialize":
        params = message.get("params")
        version = params.get("protocolVersion") if isinstance(params, dict) else None
        return version if isinstance(version, str) else None
    return None


def _negotiated(asked: str) -> str:
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    return asked if asked in HANDSHAKE_PROTOCOL_VERSIONS else HANDSHAKE_PROTOCOL_VERSIONS[-1]


# ----------------------------------------------------------------------------------
# The server
# ----------------------------------------------------------------------------------


@dataclass
class FixtureState:
    """What clients set on the fixture, per ``Mcp-Session-Id`` (for tests to look at)."""

    log_levels: dict[str, str] = field(default_factory=dict)  # set by logging/setLevel
    subscriptions: dict[str, set[str]] = field(default_factory=dict)  # resources/subscribe, minus unsubscribe


def build_fixture_server(name: str = NAME, state: FixtureState | None = None) -> Any:
    """The ``MCPServer`` with everything the suite's server scenarios call."""
    import warnings

    from mcp import types
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.mcpserver.prompts.base import UserMessage
    from mcp.server.mcpserver.tools.base import Tool
    from mcp.shared.exceptions import MCPDeprecationWarning

    state = FixtureState() if state is None else state
    log_levels = state.log_levels
    subscriptions = state.subscriptions

    def session_of(headers: Any) -> str:
        return headers.get("mcp-session-id", "") if headers is not None else ""

    async def log(ctx: Context, level: str, message: str) -> None:
        """A log message on the call's stream, unless the session asked for a higher level."""
        floor = log_levels.get(session_of(ctx.headers))
        if floor is not None and LOG_LEVELS.index(level) < LOG_LEVELS.index(floor):
            return
        with warnings.catch_warnings():  # the SDK deprecates logging for 2026-07-28
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await ctx.log(level, message, logger_name=name)

    def json_schema_2020_12_tool(name: str | None = None, address: dict[str, Any] | None = None) -> str:
        """Tool with JSON Schema 2020-12 features"""
        return f"name={name!r} address={json.dumps(address)}"

    # The input schema is hand-written ($schema, $defs, additionalProperties stay as they are).
    schema_tool = Tool.from_function(json_schema_2020_12_tool, structured_output=False)
    schema_tool = schema_tool.model_copy(update={"parameters": JSON_SCHEMA_2020_12})

    srv = MCPServer(
        name,
        instructions="MCP conformance fixture",
        version="1.0.0",
        log_level="WARNING",
        tools=[schema_tool],
    )

    def tool(fn: Any) -> Any:
        srv.add_tool(fn, structured_output=False)
        return fn

    @tool
    def test_simple_text() -> str:
        """Returns simple text content"""
        return "This is a simple text response for testing."

    @tool
    def test_image_content() -> list[types.ImageContent]:
        """Returns image content (a 1x1 PNG)"""
        return [types.ImageContent(type="image", data=PNG_BASE64, mime_type="image/png")]

    @tool
    def test_audio_content() -> list[types.AudioContent]:
        """Returns audio content (a tiny WAV)"""
        return [types.AudioContent(type="audio", data=WAV_BASE64, mime_type="audio/wav")]

    def embedded(uri: str, mime_type: str, text: str) -> types.EmbeddedResource:
        contents = types.TextResourceContents(uri=uri, mime_type=mime_type, text=text)
        return types.EmbeddedResource(type="resource", resource=contents)

    @tool
    def test_embedded_resource() -> list[types.EmbeddedResource]:
        """Returns an embedded text resource"""
        return [embedded("test://embedded-resource", "text/plain", "This is an embedded resource content.")]

    @tool
    def test_multiple_content_types() -> list[types.TextContent | types.ImageContent | types.EmbeddedResource]:
        """Returns text, image and resource content"""
        return [
            types.TextContent(type="text", text="Multiple content types test:"),
            types.ImageContent(type="image", data=PNG_BASE64, mime_type="image/png"),
            embedded("test://mixed-content-resource", "application/json", json.dumps({"test": "data", "value": 123})),
        ]

    @tool
    def test_error_handling() -> str:
        """Always fails (isError: true)"""
        raise ToolError("This tool intentionally returns an error for testing")

    @tool
    async def test_tool_with_logging(ctx: Context) -> str:
        """Sends three info log messages, 50 ms apart, while it runs"""
        await log(ctx, "info", "Tool execution started")
        await asyncio.sleep(0.05)
        await log(ctx, "info", "Tool processing data")
        await asyncio.sleep(0.05)
        await log(ctx, "info", "Tool execution completed")
        return "Tool with logging executed successfully"

    @tool
    async def test_tool_with_progress(ctx: Context) -> str:
        """Reports progress 0, 50 and 100 of 100, 50 ms apart"""
        for step in (0, 50, 100):
            if step:
                await asyncio.sleep(0.05)
            await ctx.report_progress(step, 100, f"Completed step {step} of 100")
        return "Tool with progress executed successfully"

    @tool
    async def test_sampling(prompt: str, ctx: Context) -> str:
        """Asks the client's LLM (sampling/createMessage) and returns its answer"""
        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))
        with warnings.catch_warnings():  # the SDK deprecates sampling for 2026-07-28
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            result = await ctx.session.create_message([message], max_tokens=100, related_request_id=ctx.request_id)
        text = result.content.text if isinstance(result.content, types.TextContent) else "(no text)"
        return f"LLM response: {text}"

    async def elicit(ctx: Context, message: str, schema: dict[str, Any]) -> types.ElicitResult:
        return await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)

    @tool
    async def test_elicitation(message: str, ctx: Context) -> str:
        """Asks the user for a username and an email (form elicitation)"""
        result = await elicit(ctx, message, CONTACT_SCHEMA)
        return f"User response: action={result.action}, content={json.dumps(result.content or {})}"

    @tool
    async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
        """Form elicitation whose fields all have defaults (SEP-1034)"""
        result = await elicit(ctx, "Please review your information", DEFAULTS_SCHEMA)
        return f"Elicitation completed: action={result.action}, content={json.dumps(result.content or {})}"

    @tool
    async def test_elicitation_sep1330_enums(ctx: Context) -> str:
        """Form elicitation with the five enum shapes (SEP-1330)"""
        result = await elicit(ctx, "Please pick some options", ENUMS_SCHEMA)
        return f"Elicitation completed: action={result.action}, content={json.dumps(result.content or {})}"

    @tool
    async def test_elicitation_url(ctx: Context) -> str:
        """URL-mode elicitation: sends the user to a page (not used by the suite)"""
        result = await ctx.elicit_url("Please sign in", "https://example.test/sign-in", "conformance-sign-in")
        return f"URL elicitation: action={result.action}"

    @tool
    async def test_reconnection(ctx: Context) -> str:
        """Closes the call's SSE stream mid-call; the result comes after the client resumes (SEP-1699)"""
        await log(ctx, "info", "Before disconnect")
        await ctx.close_sse_stream()
        await asyncio.sleep(0.2)  # the client reconnects after the priming event's retry (100 ms)
        await log(ctx, "info", "After reconnect")
        return "Reconnection test completed"

    @srv.resource("test://static-text", mime_type="text/plain", description="A static text resource")
    def static_text() -> str:
        return "This is the content of the static text resource."

    @srv.resource("test://static-binary", mime_type="image/png", description="A static binary resource (PNG)")
    def static_binary() -> bytes:
        return base64.b64decode(PNG_BASE64)

    @srv.resource(WATCHED_URI, mime_type="text/plain", description="A resource clients may subscribe to")
    def watched_resource() -> str:
        return "Watched resource content"

    @srv.resource("test://template/{id}/data", mime_type="application/json", description="Data for an id")
    def template_data(id: str) -> str:  # noqa: A002 - the template's parameter name
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})

    @srv.prompt()
    def test_simple_prompt() -> list[UserMessage]:
        """A prompt without arguments"""
        return [UserMessage("This is a simple prompt for testing.")]

    @srv.prompt()
    def test_prompt_with_arguments(arg1: str, arg2: str) -> list[UserMessage]:
        """A prompt with two required arguments"""
        return [UserMessage(f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'")]

    @srv.prompt()
    def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:  # noqa: N803 - the suite's name
        """A prompt that embeds a resource"""
        return [
            UserMessage(embedded(resourceUri, "text/plain", "Embedded resource content for testing.")),
            UserMessage("Please process the embedded resource above."),
        ]

    @srv.prompt()
    def test_prompt_with_image() -> list[UserMessage]:
        """A prompt with an image"""
        return [
            UserMessage(types.ImageContent(type="image", data=PNG_BASE64, mime_type="image/png")),
            UserMessage("Please analyze the image above."),
        ]

    @srv.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> types.Completion:
        values: list[str] = []
        if isinstance(ref, types.PromptReference) and ref.name == "test_prompt_with_arguments":
            values = [v for v in COMPLETIONS.get(argument.name, ()) if v.startswith(argument.value)]
        return types.Completion(values=values, total=len(values), has_more=False)

    def headers_of(ctx: Any) -> Any:
        return getattr(ctx.request, "headers", None)

    async def set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
        log_levels[session_of(headers_of(ctx))] = params.level
        return types.EmptyResult()

    async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        subscriptions.setdefault(session_of(headers_of(ctx)), set()).add(str(params.uri))
        return types.EmptyResult()

    async def unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        subscriptions.get(session_of(headers_of(ctx)), set()).discard(str(params.uri))
        return types.EmptyResult()

    # MCPServer has no decorators for these three; the low-level server takes them.
    lowlevel = srv._lowlevel_server
    lowlevel.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)
    lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, unsubscribe)
    from tests.conformance.modern_scenarios import add_modern_scenarios

    add_modern_scenarios(srv)  # what the 2026-07-28 requirement set calls
    return srv


class ConformanceBackend(SdkBackend):
    """The fixture server, served with an event store, a retry interval and DNS-rebinding protection.

    ``.state`` is the :class:`FixtureState` its server fills in.
    """

    def __init__(self, name: str = NAME) -> None:
        self.state = FixtureState()
        super().__init__(name, build_fixture_server(name, self.state))

    def start(self, *, json_response: bool = False, stateless: bool = False, port: int = 0,
              era: str | None = None) -> "ConformanceBackend":
        """``era``: ``modern`` or ``legacy`` serves one era only (tests/eras.py); None both."""
        from tests.eras import wrap
        from vmcp_actors.demo._serve import serve_asgi_in_thread

        app = self.server.streamable_http_app(
            json_response=json_response,
            stateless_http=stateless,
            event_store=event_store(),
            retry_interval=RETRY_MS,
        )
        served = wrap(NegotiatedVersionHeader(app), era)
        self._served = serve_asgi_in_thread(served, port=port, name=self.name)
        return self


def conformance_backend(name: str = NAME, era: str | None = None) -> ConformanceBackend:
    """A started fixture backend on a loopback port (``.mcp_url``; ``.stop()``); ``era``
    ``modern`` or ``legacy`` makes it a backend of that era only."""
    return ConformanceBackend(name).start(era=era)


def main(argv: list[str] | None = None) -> None:
    import warnings

    parser = argparse.ArgumentParser(description="Serve the MCP conformance fixture on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=3001)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", DeprecationWarning)
    backend = ConformanceBackend().start(port=args.port)
    print(f"conformance fixture on {backend.mcp_url} (Ctrl-C stops it)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        backend.stop()


if __name__ == "__main__":
    main()
