"""The Flask front end: the app factory over a started runtime, and the blueprints (mcp,
admin, admin page, health, metrics, well-known)."""

from __future__ import annotations

from typing import Any

from flask import Flask
from werkzeug.exceptions import HTTPException

from vmcp_actors.runtime import Runtime
from vmcp_actors.users._store import StoreUnavailable
from vmcp_actors.web import admin, admin_page, connections, health, mcp, metrics, oauth, wellknown
from vmcp_actors.web._installed import EXTENSION_KEY, current_runtime, install
from vmcp_actors.web._responses import error_answer

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
    app.wsgi_app = mcp.McpPosts(app)  # type: ignore[method-assign]
    return app


def stop_app(app: Flask, timeout: float = 5.0) -> None:
    app.extensions[EXTENSION_KEY].stop(timeout)


def _register_error_handlers(app: Flask) -> None:
    for raised in (HTTPException, StoreUnavailable, Exception):
        app.register_error_handler(raised, error_answer)
