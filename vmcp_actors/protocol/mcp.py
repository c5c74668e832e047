"""MCP protocol constants: revisions, header names, version negotiation, tool names."""

from __future__ import annotations

import base64
import binascii
import re

# Revisions the gateway negotiates in initialize, newest first.
NEGOTIABLE_PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18")
LATEST_PROTOCOL_VERSION = NEGOTIABLE_PROTOCOL_VERSIONS[0]
# Revisions tolerated in the MCP-Protocol-Version header (2025-03-26 clients send it too).
ACCEPTED_PROTOCOL_HEADER_VERSIONS = frozenset(NEGOTIABLE_PROTOCOL_VERSIONS + ("2025-03-26",))
# When a client sends no header, the spec says to assume this revision.
DEFAULT_HEADER_VERSION = "2025-03-26"

SESSION_HEADER = "Mcp-Session-Id"
# RFC 5424 severities as MCP names them, least severe first.
LOGGING_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
PROTOCOL_VERSION_HEADER = "MCP-Protocol-Version"


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
MODERN_ERROR_CODES = frozenset({HEADER_MISMATCH, MISSING_REQUIRED_CLIENT_CAPABILITY, UNSUPPORTED_PROTOCOL_VERSION})

# The methods whose Mcp-Name header mirrors params.name or params.uri.
NAMED_METHODS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
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
