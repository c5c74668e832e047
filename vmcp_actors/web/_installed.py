"""Where the app keeps the runtime it was given (one per app, in ``app.extensions``)."""

from __future__ import annotations

from flask import Flask, current_app

from vmcp_actors.runtime import Runtime

EXTENSION_KEY = "vmcp_actors"


def current_runtime() -> Runtime:
    return current_app.extensions[EXTENSION_KEY]


def install(app: Flask, runtime: Runtime) -> None:
    app.extensions[EXTENSION_KEY] = runtime
