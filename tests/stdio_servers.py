"""Real stdio MCP servers for the stdio backend tests: ``mcp-server-time`` (Python, in a venv
of its own) and ``@modelcontextprotocol/server-memory``, ``server-filesystem`` and
``server-sequential-thinking`` (Node, run on the Node 22 of ``tests/node_mcp.py``).

``scripts/install-stdio-servers`` installs them into :func:`stdio_servers_home`; this module
looks in the same place (``$VMCP_STDIO_SERVERS_HOME``, else
``${XDG_CACHE_HOME:-$HOME/.cache}/vmcp-actors/stdio-servers``). :func:`need_stdio_servers`
skips a test without them, and fails it under CI.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests import node_mcp

INSTALL_SCRIPT = "scripts/install-stdio-servers"
TIME_SERVER = "venv/bin/mcp-server-time"
MEMORY_ENTRY = "node_modules/@modelcontextprotocol/server-memory/dist/index.js"
FILESYSTEM_ENTRY = "node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
THINKING_ENTRY = "node_modules/@modelcontextprotocol/server-sequential-thinking/dist/index.js"
NODE_ENTRIES = (MEMORY_ENTRY, FILESYSTEM_ENTRY, THINKING_ENTRY)


def stdio_servers_home() -> Path:
    return node_mcp.install_home("VMCP_STDIO_SERVERS_HOME", "stdio-servers")


def time_server() -> str:
    """The ``mcp-server-time`` executable."""
    return str(stdio_servers_home() / TIME_SERVER)


def _node_server(entry: str) -> tuple[str, list[str]]:
    return str(node_mcp.node_mcp_home() / node_mcp.NODE), [str(stdio_servers_home() / entry)]


def memory_server() -> tuple[str, list[str]]:
    """How to start server-memory: (the Node 22 executable, its arguments)."""
    return _node_server(MEMORY_ENTRY)


def filesystem_server(*directories: str) -> tuple[str, list[str]]:
    """How to start server-filesystem over ``directories`` (its allowed directories until a
    client's roots replace them): (the Node 22 executable, its arguments)."""
    node, args = _node_server(FILESYSTEM_ENTRY)
    return node, [*args, *directories]


def sequential_thinking_server() -> tuple[str, list[str]]:
    """How to start server-sequential-thinking: (the Node 22 executable, its arguments). Its
    thought history lives in the process (set ``DISABLE_THOUGHT_LOGGING=true`` in its
    environment to keep the thoughts off its stderr)."""
    return _node_server(THINKING_ENTRY)


def missing() -> str | None:
    """Why the stdio servers cannot run (a message naming the install script), or None."""
    home = stdio_servers_home()
    node, _ = memory_server()
    if not (home / ".installed").is_file() or not os.access(home / TIME_SERVER, os.X_OK) \
            or not all((home / entry).is_file() for entry in NODE_ENTRIES) or not os.access(node, os.X_OK):
        return (f"the stdio MCP servers are not installed in {home}: run {INSTALL_SCRIPT} "
                "(it installs mcp-server-time, @modelcontextprotocol/server-memory, server-filesystem, "
                "server-sequential-thinking and, through scripts/install-node-mcp, Node 22)")
    return None


def need_stdio_servers() -> None:
    """Skip the calling test without the servers; fail it under CI."""
    node_mcp.unless_installed(missing())
