"""MCP protocol constants: revisions, header names, version negotiation, tool names."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

from vmcp_actors.protocol.jsonrpc import Message

# Revisions the gateway negotiates in initialize, newest first.
NEGOTIABLE_PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18")
LATEST_PROTOCOL_VERSION = NEGOTIABLE_PROTOCOL_VERSIONS[0]
# Revisions tolerated in the MCP-Protocol-Version header (2025-03-26 clients send it too).
ACCEPTED_PROTOCOL_HEADER_VERSIONS = frozenset(NEGOTIABLE_PROTOCOL_VERSIONS + ("2025-03-26",))

SESSION_HEADER = "Mcp-Session-Id"
# RFC 5424 severities as MCP names them, least severe first.
LOGGING_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
PROTOCOL_VERSION_HEADER = "MCP-Protocol-Version"

# MCP Apps (interactive UIs a tool names in ``_meta.ui``): the extension's identifier.
UI_EXTENSION = "io.modelcontextprotocol/ui"


def negotiate_protocol_version(requested: object) -> str:
    """The revision to answer an initialize with: the client's if we speak it, else our latest."""
    if isinstance(requested, str) and requested in NEGOTIABLE_PROTOCOL_VERSIONS:
        return requested
    return LATEST_PROTOCOL_VERSION


# MCP tool names: 1 to 128 letters, digits, '_', '-' or '.'.
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def is_valid_tool_name(name: object) -> bool:
    """Whether ``name`` is an MCP tool name; a full match, so "echo\\n" is not one."""
    return isinstance(name, str) and TOOL_NAME.fullmatch(name) is not None


# -- the stateless revision (2026-07-28): no initialize, no session, metadata per request --

MODERN_PROTOCOL_VERSION = "2026-07-28"
# Revisions served without a session, newest first; every request names its own.
MODERN_PROTOCOL_VERSIONS = (MODERN_PROTOCOL_VERSION,)
# What server/discover and UnsupportedProtocolVersion list: every revision the gateway speaks.
SUPPORTED_PROTOCOL_VERSIONS = MODERN_PROTOCOL_VERSIONS + NEGOTIABLE_PROTOCOL_VERSIONS

METHOD_HEADER = "Mcp-Method"
NAME_HEADER = "Mcp-Name"

META_PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
META_LOG_LEVEL = "io.modelcontextprotocol/logLevel"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
META_SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
META_PREFIX = "io.modelcontextprotocol/"

# Error codes the 2026-07-28 revision defines (its reserved range -32020..-32099).
HEADER_MISMATCH = -32020
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021
UNSUPPORTED_PROTOCOL_VERSION = -32022

# The methods whose Mcp-Name header mirrors params.name or params.uri.
NAMED_METHODS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
# The param each request's Mcp-Name header mirrors (the tasks extension's requests name their task).
NAME_HEADER_PARAMS = {**NAMED_METHODS, "tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}
# The requests that may answer input_required (multi round-trip requests).
INPUT_REQUIRED_METHODS = frozenset({"tools/call", "prompts/get", "resources/read"})
# Results that carry cache hints (ttlMs, cacheScope).
CACHEABLE_METHODS = frozenset({"server/discover", "tools/list", "prompts/list", "resources/list",
                               "resources/templates/list", "resources/read"})


def is_modern(version: object) -> bool:
    """Whether a revision is of the stateless era (dated revisions compare as text)."""
    return isinstance(version, str) and version >= MODERN_PROTOCOL_VERSION


_BASE64_SENTINEL = re.compile(r"=\?base64\?([A-Za-z0-9+/=]*)\?=")


def encode_header_value(value: str) -> str:
    """A value as an Mcp-Name / Mcp-Param header: as it is when it is plain visible ASCII
    without edge whitespace, else the ``=?base64?...?=`` form."""
    plain = (all(0x20 <= ord(c) <= 0x7E for c in value) and value == value.strip()
             and not _BASE64_SENTINEL.fullmatch(value))
    if plain:
        return value
    return "=?base64?" + base64.b64encode(value.encode("utf-8")).decode("ascii") + "?="


def decode_header_value(value: str) -> str | None:
    """The value an Mcp-Name / Mcp-Param header carries; None when it is malformed."""
    found = _BASE64_SENTINEL.fullmatch(value)
    if found is None:
        if value.startswith("=?base64?") and value.endswith("?="):
            return None  # the sentinel form with something else than base64 inside
        return value if all(c == "\t" or 0x20 <= ord(c) <= 0x7E for c in value) else None
    try:
        return base64.b64decode(found.group(1), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


# -- Mcp-Param-{Name} headers: tool arguments a tool's inputSchema marks with x-mcp-header --

PARAM_HEADER_PREFIX = "Mcp-Param-"
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def header_params(input_schema: object) -> dict[str, tuple[tuple[str, ...], str]]:
    """The ``x-mcp-header`` marks of a tool's inputSchema: lower-cased header name ->
    (property path, declared type). Only marks reachable through ``properties`` chains
    count; a schema whose marks break the specification's rules yields ``{}`` with
    ``valid_header_params`` False."""
    found: dict[str, tuple[tuple[str, ...], str]] = {}

    def walk(schema: object, path: tuple[str, ...]) -> None:
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(properties, dict):
            return
        for key, child in properties.items():
            if not isinstance(child, dict):
                continue
            mark = child.get("x-mcp-header")
            if isinstance(mark, str):
                found.setdefault(mark.lower(), (path + (key,), str(child.get("type", ""))))
            walk(child, path + (key,))

    walk(input_schema, ())
    return found


def valid_header_params(input_schema: object) -> bool:
    """Whether every ``x-mcp-header`` mark is one the specification allows: a token,
    unique (case-insensitively), on a string, integer or boolean property."""
    marks: list[tuple[str, str]] = []

    def walk(schema: object) -> None:
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(properties, dict):
            return
        for child in properties.values():
            if isinstance(child, dict):
                if "x-mcp-header" in child:
                    marks.append((child["x-mcp-header"], child.get("type")))
                walk(child)

    walk(input_schema)
    names = [mark.lower() for mark, _ in marks if isinstance(mark, str)]
    return (all(isinstance(mark, str) and _TOKEN.fullmatch(mark) and kind in ("string", "integer", "boolean")
                for mark, kind in marks) and len(names) == len(set(names)))


def _rendered(value: object) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return value
    return None


def _at(arguments: object, path: tuple[str, ...]) -> object:
    for key in path:
        if not isinstance(arguments, dict):
            return None
        arguments = arguments.get(key)
    return arguments


def param_headers_for(input_schema: object, arguments: object) -> dict[str, str]:
    """The ``Mcp-Param-*`` headers a call with ``arguments`` must carry."""
    headers = {}
    for name, (path, _) in header_params(input_schema).items():
        rendered = _rendered(_at(arguments, path))
        if rendered is not None:
            headers[PARAM_HEADER_PREFIX + name] = encode_header_value(rendered)
    return headers


def param_header_mismatch(input_schema: object, arguments: object, received: dict[str, str]) -> str | None:
    """Why the ``Mcp-Param-*`` headers received (lower-cased names without the prefix ->
    value) do not match the body; None when they do."""
    for name, (path, kind) in header_params(input_schema).items():
        value = _at(arguments, path)
        sent = received.get(name)
        if value is None:
            continue  # no value, no header expected
        if sent is None:
            return f"the Mcp-Param-{name} header is missing"
        decoded = decode_header_value(sent)
        if decoded is None:
            return f"the Mcp-Param-{name} header is malformed"
        if kind == "integer" and isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                matches = float(decoded) == float(value)
            except ValueError:
                matches = False
        else:
            matches = decoded == _rendered(value)
        if not matches:
            return f"the Mcp-Param-{name} header does not match the body's argument"
    return None


# What a backend may ask a client, and the client capability each needs.
CLIENT_METHODS = {
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
    "ping": None,
}
ELICITATION_ACTIONS = ("accept", "decline", "cancel")


def missing_capability(method: str, params: Mapping[str, Any], capabilities: Mapping[str, Any]) -> str | None:
    """Why a client with ``capabilities`` cannot take ``method``; None when it can."""
    if method not in CLIENT_METHODS:
        return f"{method} is not a request an MCP client takes"
    needed = CLIENT_METHODS[method]
    if needed is None:
        return None
    declared = capabilities.get(needed)
    if not isinstance(declared, Mapping):
        return f"the client did not declare the {needed} capability"
    if method == "elicitation/create":
        mode = params.get("mode", "form")
        # An empty elicitation capability means form mode only (2025-11-25).
        supported = {"form"} if not declared else {m for m in ("form", "url") if m in declared}
        if mode not in supported:
            return f"the client did not declare {mode!r} elicitation"
    return None


def check_answer(method: str, answer: Message) -> str | None:
    """What is wrong with a client's answer to ``method``; None when it is well formed."""
    body = answer.params
    if not isinstance(body, dict):
        return "the result must be an object" if not answer.is_error else "the error must be an object"
    if answer.is_error:
        if not isinstance(body.get("code"), int) or isinstance(body.get("code"), bool) \
                or not isinstance(body.get("message"), str):
            return "the error must have an integer code and a message"
        return None
    if method == "elicitation/create":
        if body.get("action") not in ELICITATION_ACTIONS:
            return f"action must be one of {', '.join(ELICITATION_ACTIONS)}"
        if "content" in body and body["content"] is not None and not isinstance(body["content"], dict):
            return "content must be an object"
    elif method == "sampling/createMessage":
        if not isinstance(body.get("role"), str) or not isinstance(body.get("model"), str) \
                or not isinstance(body.get("content"), (dict, list)):
            return "a sampling result needs role, content and model"
    elif method == "roots/list":
        roots = body.get("roots")
        if not isinstance(roots, list) or not all(isinstance(r, dict) and isinstance(r.get("uri"), str) for r in roots):
            return "roots must be a list of objects with a uri"
    return None


def is_logged_at(message: Mapping[str, Any], level: str | None) -> bool:
    """Whether a session that asked for ``level`` gets this message: log messages less
    severe than its level are not relayed; everything else is."""
    if level is None or message.get("method") != "notifications/message":
        return True
    params = message.get("params")
    severity = params.get("level") if isinstance(params, Mapping) else None
    if severity not in LOGGING_LEVELS:
        return True
    return LOGGING_LEVELS.index(severity) >= LOGGING_LEVELS.index(level)
