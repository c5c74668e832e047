"""The admin state: asked by a web thread so the gateway's loop stays free."""

from __future__ import annotations

from typing import Any

import pykka

from vmcp_actors.concurrency import ASK_TIMEOUT, Deadline
from vmcp_actors.users._directory import session_records

EXPLAIN_TIMEOUT = 30.0  # discovery may run for a revived user


def collect_admin_state(gateway: Any, parked_calls: int = 0, processes: Any = None,
                        tasks: Any = None, limits: dict[str, Any] | None = None, *, store: Any,
                        scripts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``store``: the record store, whose session records are read here (not in the
    gateway's loop); ``parked_calls``: the calls waiting here for a 2026-07-28 client's retry (the edge's);
    ``processes``: the stdio backends' children of this worker (None: none configured);
    ``tasks``: the composite tasks (``CompositeTasks``), of which this worker's runs are
    shown (rows with an id prefix, never a handle); ``limits``: the rate limits and
    bulkheads (``Runtime.limits_state``); ``scripts``: the code mode scripts this worker runs
    (``ScriptsRunning.snapshot``: ids, users, calls under way; never a script's text)."""
    script_rows = scripts or []
    overview = gateway.overview().get(timeout=ASK_TIMEOUT)
    task_rows = tasks.running() if tasks is not None else []
    asked = [(user, user.proxy.snapshot(), idle, in_flight) for user, idle, in_flight in overview["users"]]
    users: dict[Any, dict[str, Any]] = {}
    for user, future, idle, in_flight in asked:
        try:
            snapshot = future.get(timeout=ASK_TIMEOUT)
        except (pykka.ActorDeadError, pykka.Timeout):
            continue  # released while we asked
        users[user.key] = {
            **snapshot,
            "idleSeconds": idle,
            "inFlight": in_flight,
            "compositeProblems": list(user.composites.problems()) if user.composites is not None else [],
            "workflowRuns": user.composites.running() if user.composites is not None else [],
            "tasks": [row for row in task_rows if row["user"] == user.key.label],
            "scripts": [row for row in script_rows if row["user"] == user.key.label],
        }
    sessions = []
    for record, activity in session_records(store, overview["sessions"]):
        user = users.get(record.user)
        sessions.append({
            "id": record.session_id,
            "subject": record.user.label,
            "created": record.created,
            "protocolVersion": record.protocol_version,
            "clientCapabilities": record.to_json()["clientCapabilities"],
            "clientInfo": record.to_json()["clientInfo"],
            "logLevel": record.log_level,
            **activity,
            # The user's facts, as each of its sessions sees them ("released": not live).
            "userState": "live" if user is not None else "released",
            "catalogFromCache": bool(user and user["sessionCatalogFromCache"].get(record.session_id)),
            "catalogErrors": user["catalogErrors"] if user else [],
            "catalogProblems": user["catalogProblems"] if user else [],
            "catalogClashes": user["catalogClashes"] if user else [],
            "compositeProblems": user["compositeProblems"] if user else [],
            "workflowRuns": user["workflowRuns"] if user else [],
            "backends": user["backends"] if user else [],
            "subscriptions": sorted(record.subscriptions),
        })
    return {
        "uptime": round(overview["uptime"], 3),
        "discoveryCache": overview["discoveryCache"],
        "workflows": overview["workflows"],
        "workers": overview["workers"],
        "actorWorkers": overview["actorWorkers"],
        "clients": {**overview["clients"], "parkedCalls": parked_calls, "sessionlessUsers": overview["sessionlessUsers"]},
        "backendEras": overview["backendEras"],
        "backendHealth": overview["backendHealth"],
        "backendBackoff": overview["backendBackoff"],
        "sessionLimits": overview["sessionLimits"],
        "liveUserLimits": overview["liveUserLimits"],
        "users": [{key: value for key, value in user.items() if key != "sessionCatalogFromCache"}
                  for user in users.values()],
        "sessions": sessions,
        "processes": [child.to_dict() for child in processes.snapshot()] if processes is not None else [],
        "processRestarts": processes.restarts() if processes is not None else {},
        "tasks": task_rows,
        "scripts": script_rows,
        **(limits or {"rateLimits": None, "bulkheads": {}}),
    }


class NotServedYet(Exception):
    """The session's caller is not known to this process yet: nothing to explain as them."""


def explain_for_admin(gateway: Any, store: Any, tool: str, *, session_id: str | None = None,
                      subject: str | None = None) -> dict[str, Any] | None:
    """Why the caller of ``session_id`` (or the live user ``subject``) does or does not see
    ``tool``, layer by layer; None when no such session or live user exists. The records
    are read here, on the asking thread."""
    session = store.session(session_id) if session_id else None
    if session_id and session is None:
        return None
    user_record = store.user(session.user) if session is not None else None
    user = gateway.user_to_explain(session, user_record, subject).get(timeout=ASK_TIMEOUT)
    if user is None:
        return None
    try:
        identity = user.proxy.caller().get(timeout=ASK_TIMEOUT)
    except (pykka.ActorDeadError, pykka.Timeout):
        return None
    if identity is None and user.key.owner is not None:
        raise NotServedYet("this session has made no request since its user started: its caller's claims, which "
                           "policies decide on, are not known here (explain it after its next request)")
    explanation = user.core.explain_tool(identity, tool, Deadline.after(EXPLAIN_TIMEOUT))
    return {**explanation.to_json(), "subject": user.key.label, **({"session": session_id} if session_id else {})}
