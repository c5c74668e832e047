"""vmcp-actors: a virtual MCP server built on pykka actors."""

__version__ = "0.1.0"
