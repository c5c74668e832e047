"""Carrying one request's outcome from exchange threads back to the web thread.

Notifications a backend streams before its result (progress, logging) are queued in
arrival order; the final response ends the stream. The web layer answers JSON when
the first event is already final, and SSE otherwise.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from vmcp_actors.protocol import INTERNAL_ERROR, REQUEST_TIMEOUT, JsonRpcError, error_response, result_response

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RelayEvent:
    message: dict[str, Any]
    final: bool = False
    http_status: int = 200


class Relay:
    def __init__(self, request_id: Any, timeout: float):
        self._request_id = request_id
        self._timeout = timeout
        self._events: queue.SimpleQueue[RelayEvent] = queue.SimpleQueue()

    @classmethod
    def answered(cls, request_id: Any, result: Any) -> Relay:
        relay = cls(request_id, 0)
        relay._events.put(RelayEvent(result_response(request_id, result), final=True))
        return relay

    @classmethod
    def failed(cls, request_id: Any, error: JsonRpcError) -> Relay:
        relay = cls(request_id, 0)
        relay._finish_with_error(error)
        return relay

    def notify(self, message: dict[str, Any]) -> None:
        """Called from exchange threads for each notification the backend streams."""
        self._events.put(RelayEvent(message))

    def settle(self, future: cf.Future[Any]) -> Relay:
        future.add_done_callback(self._on_done)
        return self

    def events(self) -> Iterator[RelayEvent]:
        """Notifications in arrival order, then exactly one final event."""
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                event = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                yield RelayEvent(
                    error_response(self._request_id, JsonRpcError(REQUEST_TIMEOUT, "Request timed out")), final=True
                )
                return
            yield event
            if event.final:
                return

    def _on_done(self, future: cf.Future[Any]) -> None:
        error = future.exception()
        if error is None:
            self._events.put(RelayEvent(result_response(self._request_id, future.result()), final=True))
        elif isinstance(error, JsonRpcError):
            self._finish_with_error(error)
        else:
            logger.error("request failed unexpectedly: %s", error.__class__.__name__, exc_info=error)
            self._finish_with_error(JsonRpcError(INTERNAL_ERROR, "Internal error"))

    def _finish_with_error(self, error: JsonRpcError) -> None:
        self._events.put(RelayEvent(error_response(self._request_id, error), final=True, http_status=error.http_status))
