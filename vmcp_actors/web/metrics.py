"""GET /metrics: Prometheus text, for a scraper (a token of its own when
``admin.metricsTokenEnv`` is set; open otherwise, as scrapers expect)."""

from __future__ import annotations

from flask import Blueprint, Response

from vmcp_actors.metrics import exposition
from vmcp_actors.web._installed import current_runtime
from vmcp_actors.web._responses import json_response
from vmcp_actors.web._security import bearer_matches

bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
def metrics() -> Response:
    runtime = current_runtime()
    expected = runtime.metrics_token
    if expected is not None:
        if not bearer_matches(expected):
            return json_response({"error": "metrics token required"}, 401,
                                 {"WWW-Authenticate": 'Bearer realm="vmcp-metrics"'})
    if runtime.metrics is None:
        return json_response({"error": "not found"}, 404)
    body, content_type = exposition(runtime.metrics)
    return Response(body, 200, {"Content-Type": content_type})
