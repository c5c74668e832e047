"""The FastMCP proxy over one MCP backend, served with streamable HTTP on a loopback port:
the peer bench/compare.py's overhead measures beside our gateway.

    .venv-fastmcp/bin/python bench/_fastmcp_proxy.py BACKEND_URL PORT

Run with the venv of scripts/install-fastmcp: it imports fastmcp and nothing of this
project (that venv has none of its dependencies). The proxy is FastMCP's recommended one,
``create_proxy(BACKEND_URL)`` with its defaults (a fresh backend client per request, its
era mirroring the front request's), served by ``run(transport="http")`` (uvicorn, one
process, FastMCP's default logging) at ``/mcp``. ``GET /readyz`` answers 200 with
``fastmcp VERSION`` once it serves (the harness's readiness probe). Ends on SIGTERM
(uvicorn's own handler).
"""

from __future__ import annotations

import argparse

import fastmcp
from fastmcp.server import create_proxy
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend_url", help="the backend's MCP endpoint, e.g. http://127.0.0.1:8001/mcp")
    parser.add_argument("port", type=int, help="the loopback port to serve on")
    args = parser.parse_args()

    proxy = create_proxy(args.backend_url, name="bench-fastmcp-proxy")

    @proxy.custom_route("/readyz", methods=["GET"])
    async def readyz(_request: Request) -> Response:
        return PlainTextResponse(f"fastmcp {fastmcp.__version__}")

    print(f"fastmcp {fastmcp.__version__}: proxy to {args.backend_url} on http://127.0.0.1:{args.port}/mcp",
          flush=True)
    proxy.run(transport="http", host="127.0.0.1", port=args.port, path="/mcp", show_banner=False)


if __name__ == "__main__":
    main()
