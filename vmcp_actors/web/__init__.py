"""The Flask front end: app factory and blueprints (mcp, admin, health)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from flask import Flask, Response
from werkzeug.exceptions import HTTPException

from vmcp_actors.config import VmcpConfig
from vmcp_actors.gateway import Unavailable
from vmcp_actors.layers import LayerFactory
from vmcp_actors.sessions import StoreUnavailable
from vmcp_actors.protocol import INTERNAL_ERROR, INVALID_REQUEST
from vmcp_actors.web import admin, admin_page, health, mcp, metrics, wellknown
from vmcp_actors.web._responses import rpc_error
from vmcp_actors.web._runtime import Runtime, current_runtime, install, start_runtime

logger = logging.getLogger(__name__)

__all__ = ["Runtime", "create_app", "current_runtime", "stop_app"]


def create_app(config: VmcpConfig, *, host: str = "127.0.0.1", test_config: dict[str, Any] | None = None,
               layers: Sequence[LayerFactory] = ()) -> Flask:
    """Build the app and start its actors. Call inside the process that serves (never before a fork).
    ``layers``: an embedder's decorators over each user's core (see ``vmcp_actors.core``)."""
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.operational.max_request_body_bytes
    if test_config:
        app.config.update(test_config)
    install(app, start_runtime(config, host, layers))
    app.register_blueprint(mcp.bp)
    app.register_blueprint(admin.bp)
    app.register_blueprint(admin_page.bp)
    app.register_blueprint(health.bp)
    app.register_blueprint(metrics.bp)
    app.register_blueprint(wellknown.bp)
    _register_error_handlers(app)
    return app


def stop_app(app: Flask, timeout: float = 5.0) -> None:
    app.extensions["vmcp_actors"].stop(timeout)


def _register_error_handlers(app: Flask) -> None:
    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> Response:
        code = INVALID_REQUEST if (error.code or 500) < 500 else INTERNAL_ERROR
        response = rpc_error(error.code or 500, code, f"{error.name}")
        if error.code == 405:
            response.headers["Allow"] = ", ".join(error.valid_methods or [])  # type: ignore[attr-defined]
        return response

    @app.errorhandler(StoreUnavailable)
    def store_unavailable(error: StoreUnavailable) -> Response:
        logger.warning("%s", error)
        refusal = Unavailable.store_down()
        response = rpc_error(503, INTERNAL_ERROR, refusal.message)
        response.headers["Retry-After"] = str(refusal.retry_after)
        return response

    @app.errorhandler(Exception)
    def unexpected(error: Exception) -> Response:
        logger.error("unhandled error serving a request: %s", error.__class__.__name__, exc_info=error)
        return rpc_error(500, INTERNAL_ERROR, "Internal error")
