"""Demo backends for trying the gateway locally.

``start_demo_backends()`` starts two deterministic MCP servers (``weather`` and
``notes``, see :mod:`vmcp_actors.demo.servers`) on ephemeral loopback ports, and
``demo_config_mapping()`` turns them into a gateway configuration. ``mcp`` and
``uvicorn`` come from the ``demo`` extra and are only imported when a demo starts.
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from vmcp_actors.backends._sandbox import SandboxUnavailable, bubblewrap_works
from vmcp_actors.demo._serve import DEMO_EXTRA_MESSAGE, require_demo_extra

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # pragma: no cover
    from vmcp_actors.demo._serve import ServedApp

__all__ = [
    "DEMO_COMPOSITE_TOOLS",
    "DEMO_EXTRA_MESSAGE",
    "DEMO_PREFIX_FORMAT",
    "demo_config_mapping",
    "start_demo_backends",
    "stop_demo_backends",
]

DEMO_GATEWAY_NAME = "demo"
DEMO_PREFIX_FORMAT = "{workload}_"

# Composite tools over the demo backends (docs/composite-tools.md walks through them).
DEMO_COMPOSITE_TOOLS: list[dict[str, Any]] = [
    {
        "name": "trip_brief",
        "description": "Forecast, current conditions and related notes for a trip, gathered in parallel",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "A city the weather backend knows, e.g. Oslo"},
                "days": {"type": "integer", "description": "Forecast length, 1-7 days", "default": 3},
            },
            "required": ["city"],
        },
        "steps": [
            {"id": "forecast", "tool": "weather.get_forecast",
             "arguments": {"city": "{{ params.city }}", "days": "{{ params.days }}"}},
            {"id": "now", "tool": "weather.current_conditions", "arguments": {"city": "{{ params.city }}"}},
            {"id": "notes", "tool": "notes.search", "arguments": {"query": "{{ params.city }}"},
             "onError": {"action": "continue"}, "defaultResults": {"result": "(notes unavailable)"}},
        ],
        "output": {
            "properties": {
                "city": {"type": "string", "value": "{{ params.city }}"},
                "forecast": {"type": "string", "value": "{{ steps.forecast.output.result }}"},
                "conditions": {"type": "object", "value": "{{ steps.now.output }}",
                               "description": "Current conditions, as the weather backend reports them"},
                "notes": {"type": "string", "value": "{{ steps.notes.output.result }}", "default": ""},
            },
            "required": ["city", "forecast", "conditions"],
        },
    },
    {
        "name": "compare_cities",
        "description": "Current conditions for several cities at once (one call per city, in parallel)",
        "parameters": {
            "type": "object",
            "properties": {"cities": {"type": "array", "items": {"type": "string"}, "default": ["Oslo", "Lisbon"]}},
        },
        "steps": [
            {"id": "each", "type": "forEach", "collection": "{{ params.cities }}", "itemVar": "city",
             "maxParallel": 4, "step": {"tool": "weather.current_conditions", "arguments": {"city": "{{ forEach.city }}"}}},
        ],
        "output": {
            "properties": {"cities": {"type": "array", "value": "{{ steps.each.output }}",
                                      "description": "One conditions object per city, in the order asked"}},
        },
    },
]


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


def _sandbox_here() -> bool:
    try:
        bubblewrap_works()
    except SandboxUnavailable:
        logger.info("demo: bubblewrap cannot run here, so the clock backend runs unsandboxed "
                    "(apt-get install bubblewrap to see it sandboxed)")
        return False
    return True


def demo_config_mapping(backends: Sequence[tuple[str, ServedApp]]) -> dict[str, Any]:
    """The gateway configuration (the dict a YAML config file would load to) for ``backends``."""
    return {
        "name": DEMO_GATEWAY_NAME,
        "backends": [
            *({"name": name, "url": served.url + "/mcp", "transport": "streamable-http"} for name, served in backends),
            # A program the gateway starts and speaks to over stdio: in a sandbox where this
            # machine can make one (Debian's bubblewrap), else as the demo's own user.
            {"name": "clock", "transport": "stdio", "command": sys.executable, "args": ["-m", "vmcp_actors.demo.clock"],
             "sandbox": {"mode": "bubblewrap" if _sandbox_here() else "none"}},
        ],
        "aggregation": {
            "conflictResolution": "prefix",
            "conflictResolutionConfig": {"prefixFormat": DEMO_PREFIX_FORMAT},
        },
        "compositeTools": copy.deepcopy(DEMO_COMPOSITE_TOOLS),
    }
