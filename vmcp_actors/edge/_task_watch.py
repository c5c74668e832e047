"""``notifications/tasks`` on a 2026-07-28 client's ``subscriptions/listen`` stream.

The gateway watches the tasks a listen stream names by asking their owners, the way the
client would (``tasks/get``, at each task's ``pollIntervalMs``), on one ``vmcp-task-watch``
thread per stream that names tasks, and pushes each task's state when it changes: the
whole ``tasks/get`` answer, as the extension says a notification carries. Watching ends
with the stream, or when every task has ended. It works the same whatever revision the
task's backend speaks, and on whichever worker the stream lands.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from vmcp_actors.core._exchange import ServerRequest
from vmcp_actors.core._tasks import TERMINAL
from vmcp_actors.protocol import METHOD_NOT_FOUND, JsonRpcError

logger = logging.getLogger(__name__)

# The bounds of how often a task is asked (seconds), whatever its pollIntervalMs says.
POLL_AT_LEAST = 0.25
POLL_AT_MOST = 30.0
POLL_DEFAULT = 1.0
# What changes between two polls that counts as news (lastUpdatedAt alone does not).
_NEWS = ("status", "statusMessage", "inputRequests", "result", "error")


class TaskWatch:
    """``fetch(handle)`` answers a task's state (``tasks/get``) or raises JsonRpcError;
    ``push_to`` names where notifications go (the stream, once it is open)."""

    def __init__(self, fetch: Callable[[str], Mapping[str, Any]]):
        self._fetch = fetch
        self._push: Callable[[dict[str, Any]], None] = lambda message: None
        self._stopped = threading.Event()
        self._last: dict[str, Mapping[str, Any]] = {}

    def accept(self, handles: list[str]) -> list[str]:
        """The tasks this stream will hear about: those whose owner answers for this caller
        (each one's state is pushed at once, so a change before the stream opened is not lost)."""
        accepted = []
        for handle in dict.fromkeys(handles):
            try:
                self._last[handle] = self._fetch(handle)
            except JsonRpcError as error:
                logger.debug("listen: not watching a task: %s", error.message)
                continue
            accepted.append(handle)
        return accepted

    def push_to(self, push: Callable[[dict[str, Any]], None]) -> None:
        self._push = push

    def start(self) -> None:
        for state in self._last.values():
            self._notify(state)
        if any(state.get("status") not in TERMINAL for state in self._last.values()):
            threading.Thread(target=self._run, name="vmcp-task-watch", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval()):
            running = [handle for handle, state in self._last.items() if state.get("status") not in TERMINAL]
            if not running:
                return
            for handle in running:
                try:
                    state = self._fetch(handle)
                except JsonRpcError as error:
                    logger.debug("listen: a watched task is gone: %s", error.message)
                    state = {**self._last[handle], "status": "failed",
                             "error": {"code": error.code, "message": error.message}}
                if any(state.get(key) != self._last[handle].get(key) for key in _NEWS):
                    self._notify(state)
                self._last[handle] = state

    def _interval(self) -> float:
        asked = [state.get("pollIntervalMs") for state in self._last.values()]
        given = [value / 1000 for value in asked if isinstance(value, (int, float)) and not isinstance(value, bool)]
        return min(max(min(given, default=POLL_DEFAULT), POLL_AT_LEAST), POLL_AT_MOST)

    def _notify(self, state: Mapping[str, Any]) -> None:
        params = {key: value for key, value in state.items() if key not in ("resultType", "_meta")}
        self._push({"jsonrpc": "2.0", "method": "notifications/tasks", "params": params})


def finished(exchange: Any) -> dict[str, Any]:
    """A core exchange run to its answer, what it streams dropped (a ``tasks/get`` streams
    nothing the watch could pass on; a request for the client is refused: no client waits)."""
    try:
        while True:
            event = next(exchange)
            if isinstance(event, ServerRequest):
                event.respond({"error": {"code": METHOD_NOT_FOUND, "message": "no client takes part in this request"}})
    except StopIteration as answered:
        return answered.value
    finally:
        exchange.close()

