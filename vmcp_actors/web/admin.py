"""Operator endpoints behind the admin bearer token."""

from __future__ import annotations

from flask import Blueprint, Response, request

from vmcp_actors.protocol import JsonRpcError
from vmcp_actors.users._admin import NotServedYet, collect_admin_state, explain_for_admin
from vmcp_actors.web._installed import current_runtime
from vmcp_actors.web._responses import json_response
from vmcp_actors.web._security import bearer_matches

bp = Blueprint("admin", __name__, url_prefix="/admin")


@bp.before_request
def require_admin_token() -> Response | None:
    expected = current_runtime().admin_token
    if expected is None:
        return json_response({"error": "not found"}, 404)  # admin is off unless a token is configured
    if not bearer_matches(expected):
        return json_response({"error": "admin token required"}, 401, {"WWW-Authenticate": 'Bearer realm="vmcp-admin"'})
    return None


@bp.get("/state")
def state() -> Response:
    runtime = current_runtime()
    return json_response(collect_admin_state(runtime.gateway, runtime.service.parked.count(), runtime.processes,
                                             runtime.tasks, runtime.limits_state(), store=runtime.service.store,
                                scripts=runtime.scripts()))


@bp.get("/explain")
def explain() -> Response:
    """``?tool=NAME&session=ID`` (or ``&user=SUBJECT`` for a live user without a session):
    why that caller does or does not see the tool, each layer's finding innermost first."""
    tool = request.args.get("tool", "")
    session_id, subject = request.args.get("session"), request.args.get("user")
    if not tool or bool(session_id) == bool(subject):
        return json_response({"error": "give tool, and one of session or user"}, 400)
    try:
        found = explain_for_admin(current_runtime().gateway, current_runtime().service.store, tool, session_id=session_id, subject=subject)
    except JsonRpcError as error:  # the user's backends could not be discovered
        return json_response({"error": error.message}, 503)
    except NotServedYet as error:
        return json_response({"error": str(error)}, 409)
    if found is None:
        return json_response({"error": "no such session" if session_id else "no live user with that subject"}, 404)
    return json_response(found)


@bp.get("/oauth")
def oauth_overview() -> Response:
    """Registered clients and live grants (``incomingAuth.type: oauth``); never a token."""
    oauth = current_runtime().oauth
    if oauth is None:
        return json_response({"error": "the gateway is not an authorization server here"}, 404)
    return json_response(oauth.overview())


@bp.get("/connections")
def connections_overview() -> Response:
    """Every person's connections to backends of type oauth (backend, scopes, since,
    state) and the refreshes this process made; never a token."""
    connect = current_runtime().connect
    if connect is None:
        return json_response({"error": "no backend here is of outgoingAuth type oauth"}, 404)
    return json_response(connect.connections.overview())


@bp.post("/oauth/revoke")
def oauth_revoke() -> Response:
    """``{"grant": id}``, ``{"user": subject}`` or ``{"client": client id}``: ends those grants."""
    oauth = current_runtime().oauth
    if oauth is None:
        return json_response({"error": "the gateway is not an authorization server here"}, 404)
    body = request.get_json(silent=True)
    chosen = {name: body[name] for name in ("grant", "user", "client")
              if isinstance(body, dict) and isinstance(body.get(name), str) and body[name]}
    if len(chosen) != 1:
        return json_response({"error": "give exactly one of grant, user or client"}, 400)
    return json_response({"ended": oauth.end_grants(**chosen)})
