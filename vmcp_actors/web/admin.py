"""Operator endpoints behind the admin bearer token."""

from __future__ import annotations

import hmac

from flask import Blueprint, Response, request

from vmcp_actors.gateway import collect_admin_state
from vmcp_actors.web._responses import json_response
from vmcp_actors.web._runtime import current_runtime

bp = Blueprint("admin", __name__, url_prefix="/admin")


@bp.before_request
def require_admin_token() -> Response | None:
    expected = current_runtime().admin_token
    if expected is None:
        return json_response({"error": "not found"}, 404)  # admin is off unless a token is configured
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(), expected.encode()):
        return json_response({"error": "admin token required"}, 401, {"WWW-Authenticate": 'Bearer realm="vmcp-admin"'})
    return None


@bp.get("/state")
def state() -> Response:
    return json_response(collect_admin_state(current_runtime().gateway))
