"""The admin state: asked by a web thread so the gateway's loop stays free."""

from __future__ import annotations

from typing import Any

import pykka

from vmcp_actors.concurrency import ASK_TIMEOUT


def collect_admin_state(gateway: Any) -> dict[str, Any]:
    overview = gateway.overview().get(timeout=ASK_TIMEOUT)
    asked = [(actor.proxy().snapshot(), facts) for actor, facts in overview["sessions"]]
    sessions = []
    for future, facts in asked:
        try:
            sessions.append({**future.get(timeout=ASK_TIMEOUT), **facts})
        except (pykka.ActorDeadError, pykka.Timeout):
            continue  # ended while we asked
    return {
        "uptime": round(overview["uptime"], 3),
        "discoveryCache": overview["discoveryCache"],
        "workflows": overview["workflows"],
        "sessions": sessions,
    }
