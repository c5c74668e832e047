"""MCP protocol constants: revisions, header names, version negotiation, tool names."""

from __future__ import annotations

import re

# Revisions the gateway negotiates in initialize, newest first.
NEGOTIABLE_PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18")
LATEST_PROTOCOL_VERSION = NEGOTIABLE_PROTOCOL_VERSIONS[0]
# Revisions tolerated in the MCP-Protocol-Version header (2025-03-26 clients send it too).
ACCEPTED_PROTOCOL_HEADER_VERSIONS = frozenset(NEGOTIABLE_PROTOCOL_VERSIONS + ("2025-03-26",))
# When a client sends no header, the spec says to assume this revision.
DEFAULT_HEADER_VERSION = "2025-03-26"

SESSION_HEADER = "Mcp-Session-Id"
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
