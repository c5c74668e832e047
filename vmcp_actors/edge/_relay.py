"""One request's answer as a sequence of events for the web layer to write.

An exchange yields the events a backend streams before its result (progress, logging,
requests for the client) and then returns the result. The web thread drives it: if the
first event is already final the answer is JSON, otherwise SSE with every event in
arrival order. What the client's session decides (which notifications it wants, the ids
of requests sent to it, cancellation) is the ``ClientSide`` of the call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Protocol

from vmcp_actors.backends import CallOpened, InputRequired
from vmcp_actors.core._exchange import (
    CallCancelled,
    Exchange,
    Notification,
    RelayEvent,
    ServerRequest,
)
from vmcp_actors.edge._modern import MAX_INPUT_ROUNDS, gather_input, legacy_result
from vmcp_actors.protocol import (
    INTERNAL_ERROR,
    METHOD_NOT_FOUND,
    JsonRpcError,
    error_response,
    result_response,
)

logger = logging.getLogger(__name__)


class ClientSide(Protocol):
    """The client session's part in one call."""

    def keep(self, notification: Notification) -> bool:
        """Relay this notification (its log level, its subscriptions)?"""

    def ask(self, request: ServerRequest) -> dict[str, Any] | None:
        """The message that sends ``request`` to the client on this call's stream, or
        None when the request was answered at once (the client cannot take it)."""

    def opened(self, event: CallOpened) -> None:
        """The call reached a backend (or a run started): how to cancel it."""

    def finished(self) -> None:
        """The call's stream is done, however it ended."""


class NoClient:
    """A call no client session takes part in: requests for the client are refused."""

    def keep(self, notification: Notification) -> bool:
        return True

    def ask(self, request: ServerRequest) -> dict[str, Any] | None:
        request.respond({"error": {"code": METHOD_NOT_FOUND, "message": f"{request.method} is not available here"}})
        return None

    def opened(self, event: CallOpened) -> None:
        pass

    def finished(self) -> None:
        pass


class Relay:
    def __init__(self, request_id: Any, exchange: Exchange | None = None, final: RelayEvent | None = None):
        self._request_id = request_id
        self._exchange = exchange
        self._final = final

    @classmethod
    def answered(cls, request_id: Any, result: Any) -> Relay:
        return cls(request_id, final=RelayEvent(result_response(request_id, result), final=True))

    @classmethod
    def failed(cls, request_id: Any, error: JsonRpcError) -> Relay:
        return cls(request_id, final=error_event(request_id, error))

    @classmethod
    def streaming(cls, request_id: Any, exchange: Exchange) -> Relay:
        return cls(request_id, exchange=exchange)

    @property
    def exchange(self) -> Exchange | None:
        return self._exchange

    @property
    def final(self) -> RelayEvent | None:
        return self._final

    def events(self, client: ClientSide | None = None) -> Iterator[RelayEvent]:
        """Events in arrival order, then exactly one final event."""
        client = client if client is not None else NoClient()
        if self._exchange is None:
            client.finished()
            yield self._final
            return
        rounds = 0
        try:
            while True:
                event = next(self._exchange)
                if isinstance(event, Notification):
                    if client.keep(event):
                        yield RelayEvent(event.message, event=event)
                elif isinstance(event, ServerRequest):
                    message = client.ask(event)
                    if message is not None:
                        yield RelayEvent(message)
                elif isinstance(event, CallOpened):
                    client.opened(event)
                elif isinstance(event, InputRequired):
                    # A 2026-07-28 backend needs input: this client is asked on the call's
                    # stream, and the backend asked again with its answers.
                    rounds += 1
                    if rounds > MAX_INPUT_ROUNDS:
                        raise JsonRpcError(INTERNAL_ERROR, f"backend {event.backend!r} asked for input more than "
                                                           f"{MAX_INPUT_ROUNDS} times in one call")
                    for item in gather_input(event, client.ask):
                        if isinstance(item, RelayEvent):
                            yield item
                        else:
                            self._exchange.close()
                            self._exchange = item
        except StopIteration as answered:
            yield RelayEvent(result_response(self._request_id, legacy_result(answered.value)), final=True)
        except CallCancelled:
            # The client cancelled: it expects no answer (MCP says none is sent).
            yield RelayEvent(None, final=True)
        except JsonRpcError as error:
            yield error_event(self._request_id, error)
        except Exception as error:  # noqa: BLE001 - the client gets an answer whatever happened
            logger.error("request failed unexpectedly: %s", error.__class__.__name__, exc_info=error)
            yield error_event(self._request_id, JsonRpcError(INTERNAL_ERROR, "Internal error"))
        finally:
            self._exchange.close()  # the client went away mid-stream: end the backend exchange too
            client.finished()


def error_event(request_id: Any, error: JsonRpcError) -> RelayEvent:
    return RelayEvent(error_response(request_id, error), final=True, http_status=error.http_status)
