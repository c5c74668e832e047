"""The JSON-RPC 2.0 envelope as MCP uses it: one message per HTTP body, no batches."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# MCP-specific codes.
RESOURCE_NOT_FOUND = -32002
REQUEST_TIMEOUT = -32001


class JsonRpcError(Exception):
    """An error that becomes a JSON-RPC error object for the client.

    ``http_status`` is the status of the HTTP answer that carries it: 200 for ordinary
    method errors, 4xx/5xx where the transport rules call for one.
    """

    def __init__(self, code: int, message: str, data: Any = None, *, http_status: int = 200):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.http_status = http_status

    def to_dict(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


@dataclass(frozen=True)
class Message:
    """One parsed JSON-RPC message.

    ``kind`` is ``request`` (method and id), ``notification`` (method, no id) or
    ``response`` (id with result or error, sent by a client answering a server request).
    """

    kind: str
    method: str | None
    id: str | int | None
    params: Any  # a response's result, or its error object
    is_error: bool = False  # a response carrying an error

    @property
    def is_request(self) -> bool:
        return self.kind == "request"


def _valid_id(value: Any) -> bool:
    # JSON-RPC allows strings and numbers; MCP forbids null ids on requests.
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


# Twenty digits in a row may be an integer beyond 64 bits, which orjson would read as a float.
_LONG_DIGITS = re.compile(rb"[0-9]{20}")


def json_value(text: bytes | str) -> Any:
    """JSON text as Python values, by json's rules, with orjson's speed where they agree.
    What orjson refuses (NaN, UTF-16, a lone surrogate, deep nesting) or might read
    otherwise (an integer beyond 64 bits, which it makes a float) json reads, or refuses
    as it always did (a ValueError)."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if _LONG_DIGITS.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


def wire_bytes(message: Any) -> bytes:
    """``message`` as compact UTF-8 JSON. A string JSON may carry but UTF-8 cannot (a lone
    surrogate, ``"\\ud800"``) goes escaped, as the client sent it, for the backend to judge;
    what orjson cannot write (that, an integer beyond 64 bits) json writes."""
    try:
        return orjson.dumps(message)
    except TypeError:
        pass
    try:
        return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(message, separators=(",", ":")).encode("ascii")


def parse_message(body: bytes | str) -> Message:
    """Parse one JSON-RPC message or raise JsonRpcError (-32700 / -32600)."""
    try:
        payload = json_value(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise JsonRpcError(PARSE_ERROR, f"Parse error: {exc.__class__.__name__}") from None
    except RecursionError:  # ~1,000 levels of arrays or objects
        raise JsonRpcError(PARSE_ERROR, "Parse error: nested too deeply") from None
    if isinstance(payload, list):
        raise JsonRpcError(INVALID_REQUEST, "Invalid Request: batches are not supported; send one message per request")
    if not isinstance(payload, dict):
        raise JsonRpcError(INVALID_REQUEST, "Invalid Request: the body must be a JSON-RPC object")
    if payload.get("jsonrpc") != "2.0":
        raise JsonRpcError(INVALID_REQUEST, "Invalid Request: 'jsonrpc' must be \"2.0\"")
    params = payload.get("params")
    if params is not None and not isinstance(params, (dict, list)):
        raise JsonRpcError(INVALID_REQUEST, "Invalid Request: 'params' must be an object")
    if "method" in payload:
        method = payload["method"]
        if not isinstance(method, str) or not method:
            raise JsonRpcError(INVALID_REQUEST, "Invalid Request: 'method' must be a non-empty string")
        if "id" not in payload:
            return Message("notification", method, None, params)
        if not _valid_id(payload["id"]):
            raise JsonRpcError(INVALID_REQUEST, "Invalid Request: 'id' must be a string or an integer")
        return Message("request", method, payload["id"], params)
    if "id" in payload and ("result" in payload or "error" in payload):
        if "error" in payload:
            return Message("response", None, payload["id"], payload["error"], is_error=True)
        return Message("response", None, payload["id"], payload["result"])
    raise JsonRpcError(INVALID_REQUEST, "Invalid Request: neither a request, a notification nor a response")


def result_response(request_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def error_response(request_id: Any, error: JsonRpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": error.to_dict()}
