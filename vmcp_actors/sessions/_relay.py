"""One request's answer as a sequence of events for the web layer to write.

An exchange yields the events a backend streams before its result (progress, logging)
and then returns the result. The web thread drives it: if the first event is already
final the answer is JSON, otherwise SSE with every event in arrival order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from vmcp_actors.protocol import INTERNAL_ERROR, JsonRpcError, error_response, result_response
from vmcp_actors.sessions._exchange import Exchange, Notification

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RelayEvent:
    message: dict[str, Any]
    final: bool = False
    http_status: int = 200
    event: Notification | None = None  # what the exchange yielded, for events before the answer


class Relay:
    def __init__(self, request_id: Any, exchange: Exchange | None = None, final: RelayEvent | None = None):
        self._request_id = request_id
        self._exchange = exchange
        self._final = final
        self._keep: Callable[[Notification], bool] = lambda event: True

    @classmethod
    def answered(cls, request_id: Any, result: Any) -> Relay:
        return cls(request_id, final=RelayEvent(result_response(request_id, result), final=True))

    @classmethod
    def failed(cls, request_id: Any, error: JsonRpcError) -> Relay:
        return cls(request_id, final=error_event(request_id, error))

    @classmethod
    def streaming(cls, request_id: Any, exchange: Exchange) -> Relay:
        return cls(request_id, exchange=exchange)

    def only(self, keep: Callable[[Notification], bool]) -> Relay:
        """Relay only the events ``keep`` accepts (a session's log level, say)."""
        self._keep = keep
        return self

    def events(self) -> Iterator[RelayEvent]:
        """Events in arrival order, then exactly one final event."""
        if self._exchange is None:
            yield self._final
            return
        try:
            while True:
                event = next(self._exchange)
                if self._keep(event):
                    yield RelayEvent(event.message, event=event)
        except StopIteration as answered:
            yield RelayEvent(result_response(self._request_id, answered.value), final=True)
        except JsonRpcError as error:
            yield error_event(self._request_id, error)
        except Exception as error:  # noqa: BLE001 - the client gets an answer whatever happened
            logger.error("request failed unexpectedly: %s", error.__class__.__name__, exc_info=error)
            yield error_event(self._request_id, JsonRpcError(INTERNAL_ERROR, "Internal error"))
        finally:
            self._exchange.close()  # the client went away mid-stream: end the backend exchange too


def error_event(request_id: Any, error: JsonRpcError) -> RelayEvent:
    return RelayEvent(error_response(request_id, error), final=True, http_status=error.http_status)
