"""Liveness and readiness for load balancers and process supervisors."""

from __future__ import annotations

import pykka
from flask import Blueprint, Response

from vmcp_actors.web._installed import current_runtime
from vmcp_actors.web._responses import json_response

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> Response:
    return json_response({"status": "ok"})


@bp.get("/readyz")
def readyz() -> Response:
    if current_runtime().service.draining:
        return json_response({"status": "draining"}, 503)  # a balancer sends new clients elsewhere
    try:
        sessions = current_runtime().gateway.session_count().get(timeout=2.0)
    except (pykka.ActorDeadError, pykka.Timeout):
        return json_response({"status": "unavailable"}, 503)
    return json_response({"status": "ready", "sessions": sessions})
