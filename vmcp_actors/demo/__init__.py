"""Demo backends for trying the gateway locally.

``start_demo_backends()`` starts two deterministic MCP servers (``weather`` and
``notes``, see :mod:`vmcp_actors.demo.servers`) on ephemeral loopback ports, and
``demo_config_mapping()`` turns them into a gateway configuration. ``mcp`` and
``uvicorn`` come from the ``demo`` extra and are only imported when a demo starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from vmcp_actors.demo._serve import DEMO_EXTRA_MESSAGE, require_demo_extra

if TYPE_CHECKING:  # pragma: no cover
    from vmcp_actors.demo._serve import ServedApp

__all__ = [
    "DEMO_EXTRA_MESSAGE",
    "DEMO_PREFIX_FORMAT",
    "demo_config_mapping",
    "start_demo_backends",
    "stop_demo_backends",
]

DEMO_GATEWAY_NAME = "demo"
DEMO_PREFIX_FORMAT = "{workload}_"


def start_demo_backends(host: str = "127.0.0.1") -> list[tuple[str, ServedApp]]:
    """Start every demo server on its own ephemeral port; returns ``(name, served)`` pairs.

    The caller owns the servers: stop them with :func:`stop_demo_backends` (or each
    ``served.stop()``). If one fails to start, the ones already running are stopped.
    """
    require_demo_extra("mcp")
    require_demo_extra("uvicorn")
    from vmcp_actors.demo._serve import serve_asgi_in_thread
    from vmcp_actors.demo.servers import DEMO_SERVER_FACTORIES

    started: list[tuple[str, ServedApp]] = []
    try:
        for name, factory in DEMO_SERVER_FACTORIES.items():
            app = factory().streamable_http_app(host=host)
            started.append((name, serve_asgi_in_thread(app, host=host, name=name)))
    except BaseException:
        stop_demo_backends(started)
        raise
    return started


def stop_demo_backends(backends: Iterable[tuple[str, ServedApp]]) -> None:
    for _, served in backends:
        served.stop()


def demo_config_mapping(backends: Sequence[tuple[str, ServedApp]]) -> dict[str, Any]:
    """The gateway configuration (the dict a YAML config file would load to) for ``backends``."""
    return {
        "name": DEMO_GATEWAY_NAME,
        "backends": [
            {"name": name, "url": served.url + "/mcp", "transport": "streamable-http"} for name, served in backends
        ],
        "aggregation": {
            "conflictResolution": "prefix",
            "conflictResolutionConfig": {"prefixFormat": DEMO_PREFIX_FORMAT},
        },
    }
