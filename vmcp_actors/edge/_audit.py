"""The audit log (``audit``): one JSON line per tool call, resource read and prompt get,
written when its answer is done: time, component, event type, user (issuer, subject),
the session's short id, method, the advertised name, the backend that served it,
outcome and duration. Arguments and results only when the config includes them (cut to
``maxDataSize``); never a token, a full session id or a backend's URL.

Lines go to ``logFile`` (created 0600, appended) or, without one, to the
``vmcp_actors.audit`` logger (the process's log, as Cedar's decisions).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from vmcp_actors.config import AuditConfig
from vmcp_actors.decorators._code_mode import SCRIPT_META
from vmcp_actors.identity import Identity, subject_of
from vmcp_actors.limits import RATE_LIMITED

EVENT_TYPES = {"tools/call": "mcp_tool_call", "resources/read": "mcp_resource_read", "prompts/get": "mcp_prompt_get",
               "tasks/get": "mcp_task", "tasks/result": "mcp_task", "tasks/update": "mcp_task", "tasks/cancel": "mcp_task"}
TARGETS = {"tools/call": "name", "resources/read": "uri", "prompts/get": "name"}
# How much of a task's handle an audit line keeps: enough to follow one task, no more.
TASK_PREFIX = 12


class AuditLog:
    def __init__(self, config: AuditConfig):
        self._config = config
        # The event type a request of a method is audited as (None: not audited), decided
        # here once: with audit off, each request's look-up is a dict's, and nothing more.
        self.event_type: Callable[[str | None], str | None] = \
            {method: event for method, event in EVENT_TYPES.items() if config.records(event)}.get
        self._logger = logging.getLogger("vmcp_actors.audit")
        if config.enabled and config.log_file:
            # Its own logger and file: audit lines do not mix with the process log.
            self._logger = logging.getLogger("vmcp_actors.audit.file")
            self._logger.propagate = False
            self._logger.setLevel(logging.INFO)
            os.close(os.open(config.log_file, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600))
            handler = logging.FileHandler(config.log_file, encoding="utf-8")
            handler.setFormatter(logging.Formatter("%(message)s"))
            for previous in self._logger.handlers:  # a gateway started again in this process
                previous.close()
            self._logger.handlers = [handler]

    def write(self, event_type: str, *, identity: Identity | None, session_id: str | None, method: str,
              params: Any, backend: str | None, answer: dict[str, Any] | None, http_status: int,
              seconds: float, called_as: str | None = None, script: str | None = None) -> None:
        """``called_as``: the backend's own tool name the client called by (an MCP App's),
        when ``params`` names the advertised tool it meant; ``script``: the code mode
        script that made the call (else the script tool's answer names its run)."""
        params = params if isinstance(params, dict) else {}
        target = params.get(TARGETS[method]) if method in TARGETS else None
        line: dict[str, Any] = {
            "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "component": self._config.component,
            "type": event_type,
            "user": {"issuer": identity.issuer or None if identity is not None else None,
                     "subject": subject_of(identity)},
            "session": session_id[:8] if session_id else None,
            "method": method,
            "name": target if isinstance(target, str) else None,
            **({"calledAs": called_as} if called_as is not None else {}),
            "backend": backend,
            "outcome": _outcome(answer, http_status),
            "durationMs": round(seconds * 1000, 1),
        }
        script = script or _script_of(answer)
        if script is not None:
            line["script"] = script
        task = _task_of(params, answer)
        if task is not None:
            line["task"] = task[:TASK_PREFIX]
        if self._config.include_request_data:
            data = params.get("arguments") if method != "resources/read" else None
            line["request"] = _cut(data, self._config.max_data_size)
        if self._config.include_response_data and answer is not None:
            line["response"] = _cut(answer.get("result", answer.get("error")), self._config.max_data_size)
        self._logger.info("%s", json.dumps(line, separators=(",", ":"), ensure_ascii=False))

    def write_script_call(self, identity: Identity | None, script: str, tool: str, arguments: Any,
                          backend: str | None, result: dict[str, Any] | None, error: Any, seconds: float) -> None:
        """A code mode script's tool call: a ``mcp_tool_call`` line as a client's, with
        ``script`` (the run's id, which the script tool's own line carries too)."""
        event_type = self.event_type("tools/call")
        if event_type is None:
            return
        answer = {"result": result} if result is not None else {"error": error.to_dict() if error is not None else {}}
        self.write(event_type, identity=identity, session_id=None, method="tools/call",
                   params={"name": tool, "arguments": arguments}, backend=backend, answer=answer,
                   http_status=200 if error is None else error.http_status, seconds=seconds, script=script)

    def write_oauth(self, event: str, outcome: str, details: dict[str, Any]) -> None:
        """One line per authorization-server event (``type: oauth``): what happened to
        which client and person, never a token, code or secret."""
        self._write_event("oauth", event, outcome, details)

    def write_connection(self, event: str, outcome: str, details: dict[str, Any]) -> None:
        """One line per event of a person's connection to a backend (``type: connection``)."""
        self._write_event("connection", event, outcome, details)

    def _write_event(self, kind: str, event: str, outcome: str, details: dict[str, Any]) -> None:
        if not self._config.records(kind):
            return
        line = {"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "component": self._config.component, "type": kind, "event": event, "outcome": outcome,
                **{name: value for name, value in details.items() if value is not None}}
        self._logger.info("%s", json.dumps(line, separators=(",", ":"), ensure_ascii=False))


def _script_of(answer: dict[str, Any] | None) -> str | None:
    """The run id the script tool's result names (``_meta``), for its own audit line."""
    result = answer.get("result") if isinstance(answer, dict) else None
    meta = result.get("_meta") if isinstance(result, dict) else None
    run = meta.get(SCRIPT_META) if isinstance(meta, dict) else None
    found = run.get("id") if isinstance(run, dict) else None
    return found if isinstance(found, str) else None


def _outcome(answer: dict[str, Any] | None, http_status: int) -> str:
    if answer is None:
        return "success" if http_status < 400 else "error"
    if "error" in answer:
        error = answer["error"] if isinstance(answer["error"], dict) else {}
        return "rate_limited" if error.get("code") == RATE_LIMITED and http_status == 429 else "error"
    result = answer.get("result")
    if isinstance(result, dict) and (result.get("resultType") == "task" or isinstance(result.get("task"), dict)):
        return "task_created"
    if isinstance(result, dict) and isinstance(result.get("taskId"), str) and isinstance(result.get("status"), str):
        return f"task_{result['status']}"  # a task's state as tasks/get (or a 2025 tasks/cancel) answered it
    if isinstance(result, dict) and result.get("isError") is True:
        return "tool_error"
    if isinstance(result, dict) and result.get("resultType") == "input_required":
        return "input_required"
    return "success"


def _task_of(params: dict[str, Any], answer: dict[str, Any] | None) -> str | None:
    """The task a line is about: the one a call created, or the one a tasks/* request named."""
    result = answer.get("result") if isinstance(answer, dict) else None
    if isinstance(result, dict):
        created = result.get("task") if isinstance(result.get("task"), dict) else result
        if result.get("resultType") == "task" or created is not result:
            task_id = created.get("taskId")
            return task_id if isinstance(task_id, str) else None
    task_id = params.get("taskId")
    return task_id if isinstance(task_id, str) else None


def _cut(value: Any, limit: int) -> Any:
    """``value`` as it is when its JSON fits in ``limit`` bytes, else its JSON cut to it."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    if len(text.encode("utf-8")) <= limit:
        return value
    return {"truncated": text.encode("utf-8")[:limit].decode("utf-8", "ignore")}


def timer() -> Callable[[], float]:
    started = time.monotonic()
    return lambda: time.monotonic() - started
