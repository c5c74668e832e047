"""JSON-RPC bodies in HTTP responses, and the app's answers to errors a view raised."""

from __future__ import annotations

import logging
from typing import Any

from flask import Response
from werkzeug.exceptions import HTTPException

from vmcp_actors.edge._service import Unavailable
from vmcp_actors.protocol import INTERNAL_ERROR, INVALID_REQUEST, JsonRpcError, error_response, wire_bytes
from vmcp_actors.users._store import StoreUnavailable

logger = logging.getLogger("vmcp_actors.web")


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(wire_bytes(body), status=status, mimetype="application/json", headers=headers)


def rpc_error(status: int, code: int, message: str, request_id: Any = None) -> Response:
    return json_response(error_response(request_id, JsonRpcError(code, message)), status)


def error_answer(error: Exception) -> Response:
    """What a client is answered when serving its request raised ``error``."""
    if isinstance(error, HTTPException):
        code = INVALID_REQUEST if (error.code or 500) < 500 else INTERNAL_ERROR
        response = rpc_error(error.code or 500, code, f"{error.name}")
        if error.code == 405:
            response.headers["Allow"] = ", ".join(error.valid_methods or [])  # type: ignore[attr-defined]
        return response
    if isinstance(error, StoreUnavailable):
        logger.warning("%s", error)
        refusal = Unavailable.store_down()
        response = rpc_error(503, INTERNAL_ERROR, refusal.message)
        response.headers["Retry-After"] = str(refusal.retry_after)
        return response
    logger.error("unhandled error serving a request: %s", error.__class__.__name__, exc_info=error)
    return rpc_error(500, INTERNAL_ERROR, "Internal error")
