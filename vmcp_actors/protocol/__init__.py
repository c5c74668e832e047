"""JSON-RPC envelope, MCP constants and errors, SSE encoding. No actors, no Flask."""

from vmcp_actors.protocol.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    REQUEST_TIMEOUT,
    RESOURCE_NOT_FOUND,
    JsonRpcError,
    Message,
    error_response,
    json_value,
    parse_message,
    wire_bytes,
    result_response,
)
from vmcp_actors.protocol.mcp import (
    ACCEPTED_PROTOCOL_HEADER_VERSIONS,
    LATEST_PROTOCOL_VERSION,
    NEGOTIABLE_PROTOCOL_VERSIONS,
    TOOL_NAME,
    is_valid_tool_name,
    negotiate_protocol_version,
)
from vmcp_actors.protocol.sse import encode_sse_event, iter_sse_events

__all__ = [
    "ACCEPTED_PROTOCOL_HEADER_VERSIONS",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "LATEST_PROTOCOL_VERSION",
    "METHOD_NOT_FOUND",
    "NEGOTIABLE_PROTOCOL_VERSIONS",
    "PARSE_ERROR",
    "REQUEST_TIMEOUT",
    "RESOURCE_NOT_FOUND",
    "TOOL_NAME",
    "JsonRpcError",
    "Message",
    "encode_sse_event",
    "error_response",
    "json_value",
    "is_valid_tool_name",
    "iter_sse_events",
    "negotiate_protocol_version",
    "parse_message",
    "wire_bytes",
    "result_response",
]
