"""Paging long lists to the client behind an opaque cursor."""

from __future__ import annotations

import base64
import json
from typing import Any

from vmcp_actors.protocol import INVALID_PARAMS, JsonRpcError


def paginate(items: tuple[dict[str, Any], ...], key: str, params: Any, page_size: int) -> dict[str, Any]:
    """One page of ``items`` as a list result under ``key``, with ``nextCursor`` when more remain."""
    offset = _decode_cursor(_cursor_of(params), key)
    if offset > len(items):
        raise JsonRpcError(INVALID_PARAMS, "Invalid cursor")
    end = offset + page_size
    result: dict[str, Any] = {key: list(items[offset:end])}
    if end < len(items):
        result["nextCursor"] = _encode_cursor(key, end)
    return result


def _cursor_of(params: Any) -> Any:
    return params.get("cursor") if isinstance(params, dict) else None


def _encode_cursor(key: str, offset: int) -> str:
    raw = json.dumps([key, offset], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: Any, key: str) -> int:
    if cursor is None:
        return 0
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        kind, offset = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (TypeError, ValueError, UnicodeDecodeError, AttributeError):
        raise JsonRpcError(INVALID_PARAMS, "Invalid cursor") from None
    if kind != key or not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise JsonRpcError(INVALID_PARAMS, "Invalid cursor")
    return offset
