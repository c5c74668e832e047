"""The floor for bench.floor: a Flask view that forwards each POST /mcp to one backend with
requests and returns its body as is, served by gunicorn with the gateway's own settings
(vmcp_actors/web/gunicorn_settings.py). No actors, no parsing, no session logic: what
this web stack costs before the gateway does anything.

    python -m bench._floor_app --port P --backend URL
"""

from __future__ import annotations

import argparse
from typing import Any


def create_app(backend_url: str) -> Any:
    import requests
    from flask import Flask, Response, request

    app = Flask(__name__)
    http = requests.Session()
    forwarded = ("accept", "content-type", "mcp-session-id", "mcp-protocol-version")

    @app.post("/mcp")
    def forward() -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() in forwarded}
        answer = http.post(backend_url, data=request.get_data(), headers=headers, timeout=30)
        response = Response(answer.content, status=answer.status_code, content_type=answer.headers.get("content-type"))
        if "mcp-session-id" in answer.headers:
            response.headers["Mcp-Session-Id"] = answer.headers["mcp-session-id"]
        return response

    @app.get("/readyz")
    def ready() -> str:
        return "ok"

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", required=True)
    args = parser.parse_args()

    from gunicorn.app.base import BaseApplication

    from vmcp_actors.web.gunicorn_settings import SETTINGS

    class FloorApplication(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            for key, value in {**SETTINGS, "bind": f"127.0.0.1:{args.port}"}.items():
                self.cfg.set(key, value)

        def load(self) -> Any:
            return create_app(args.backend)

    FloorApplication().run()


if __name__ == "__main__":
    main()
