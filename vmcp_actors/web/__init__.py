"""The Flask front end: the app factory over a started runtime, and the blueprints (mcp,
admin, admin page, health, metrics, well-known)."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response
from werkzeug.exceptions import HTTPException

from vmcp_actors.edge._service import Unavailable
from vmcp_actors.protocol import INTERNAL_ERROR, INVALID_REQUEST
from vmcp_actors.runtime import Runtime
from vmcp_actors.users._store import StoreUnavailable
from vmcp_actors.web import admin, admin_page, connections, health, mcp, metrics, oauth, wellknown
from vmcp_actors.web._installed import EXTENSION_KEY, current_runtime, install
from vmcp_actors.web._responses import rpc_error

logger = logging.getLogger(__name__)

__all__ = ["Runtime", "create_app", "current_runtime", "stop_app"]


def create_app(runtime: Runtime, test_config: dict[str, Any] | None = None) -> Flask:
    """The app over a started runtime (``vmcp_actors.runtime.start_runtime``, called inside
    the process that serves, never before a fork); ``stop_app`` stops the runtime."""
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = runtime.config.operational.max_request_body_bytes
    if test_config:
        app.config.update(test_config)
    install(app, runtime)
    app.register_blueprint(mcp.bp)
    app.register_blueprint(admin.bp)
    app.register_blueprint(admin_page.bp)
    app.register_blueprint(health.bp)
    app.register_blueprint(metrics.bp)
    app.register_blueprint(wellknown.bp)
    app.register_blueprint(oauth.bp)
    app.register_blueprint(connections.bp)
    _register_error_handlers(app)
    return app


def stop_app(app: Flask, timeout: float = 5.0) -> None:
    app.extensions[EXTENSION_KEY].stop(timeout)


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
