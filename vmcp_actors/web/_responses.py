"""JSON-RPC bodies in HTTP responses."""

from __future__ import annotations

import json
from typing import Any

from flask import Response

from vmcp_actors.protocol import JsonRpcError, error_response


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body, separators=(",", ":")), status=status, mimetype="application/json", headers=headers)


def rpc_error(status: int, code: int, message: str, request_id: Any = None) -> Response:
    return json_response(error_response(request_id, JsonRpcError(code, message)), status)
