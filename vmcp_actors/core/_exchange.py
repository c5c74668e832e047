"""What a call streams back before its answer, as typed events.

An Exchange is a generator the serving (web) thread drives: it yields events as the
backend (or a composite run) streams them and returns the result object. Three kinds:

* ``Notification``: a JSON-RPC notification for the client (progress, logging).
* ``ServerRequest``: a request for the client (sampling, elicitation, roots, ping) with a
  way to answer it; the gateway gives it an id of its own on the client session and
  routes the client's answer back through ``respond``.
* ``CallOpened``: not for the client; ``cancel`` ends the call (notifications/cancelled).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

from vmcp_actors.backends import BackendRequest, CallOpened, InputRequired, drain
from vmcp_actors.exceptions import (
    BackendCancelled,
    BackendError,
    BackendRpcError,
    BackendTimeout,
)
from vmcp_actors.protocol import INTERNAL_ERROR, REQUEST_TIMEOUT, JsonRpcError


@dataclass(frozen=True)
class Notification:
    """A JSON-RPC notification for the client, sent before the answer."""

    message: dict[str, Any]
    origin: str = ""  # the backend that sent it ("" when the gateway did)

    @property
    def method(self) -> str | None:
        return self.message.get("method")


@dataclass(frozen=True)
class ServerRequest:
    """A request for the client. ``respond`` takes the client's answer as
    ``{"result": ...}`` or ``{"error": {...}}``, exactly once (the gateway answers with an
    error itself when the client cannot or does not)."""

    method: str
    params: Mapping[str, Any]
    respond: Callable[[dict[str, Any]], None]
    origin: str = ""  # the backend (or composite step) asking, for logs and errors


# The reason a call is cancelled with when its client ends the session: not a cancellation
# by the client (which expects no answer), so what can still answer does, with an error.
SESSION_ENDED = "the client ended its session"


class CallCancelled(JsonRpcError):
    """The client cancelled the call: nothing more is written for it."""

    def __init__(self) -> None:
        super().__init__(INTERNAL_ERROR, "Request cancelled")


# Yields events, returns the result object; raises JsonRpcError.
Exchange = Generator[Notification | ServerRequest | CallOpened | InputRequired, None, dict[str, Any]]


def to_jsonrpc_error(error: BaseException) -> JsonRpcError:
    """A backend failure as the client sees it: the backend's own error, or one naming the backend only."""
    if isinstance(error, JsonRpcError):
        return error
    if isinstance(error, BackendCancelled):
        return CallCancelled()
    if isinstance(error, BackendRpcError):
        return JsonRpcError(error.code, error.rpc_message, error.data)
    retry_after = getattr(error, "retry_after", None)
    if isinstance(error, BackendError) and retry_after is not None:  # busy for now: HTTP 503, Retry-After
        return JsonRpcError(INTERNAL_ERROR, str(error), {"backend": error.backend, "retryAfterSeconds": retry_after},
                            http_status=503)
    if isinstance(error, BackendTimeout):
        return JsonRpcError(REQUEST_TIMEOUT, str(error), {"backend": error.backend})
    if isinstance(error, BackendError):
        return JsonRpcError(INTERNAL_ERROR, str(error), {"backend": error.backend})
    return JsonRpcError(INTERNAL_ERROR, "Internal error")


def as_event(streamed: Any, origin: str) -> Notification | ServerRequest | CallOpened:
    """What a backend channel yields, as an event of the client edge."""
    if isinstance(streamed, BackendRequest):
        return ServerRequest(streamed.method, streamed.params, streamed.reply, streamed.backend)
    if isinstance(streamed, (CallOpened, InputRequired)):
        return streamed
    return Notification(streamed, origin)


def from_backend(exchange: Generator[Any, None, dict[str, Any]], origin: str = "",
                 shown: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> Exchange:
    """A backend exchange as the client sees it: its messages as events (``shown``: a
    notification as clients see it, a shared ui:// URI rewritten), its failures as
    JsonRpcErrors."""
    try:
        while True:
            try:
                streamed = next(exchange)
            except StopIteration as answered:
                return answered.value
            if shown is not None and isinstance(streamed, dict):
                streamed = shown(streamed)
            yield as_event(streamed, origin)
    except JsonRpcError:
        raise
    except Exception as error:  # noqa: BLE001 - every failure becomes a JSON-RPC error
        raise to_jsonrpc_error(error) from None
    finally:
        exchange.close()


def drained(exchange: Generator[Any, None, dict[str, Any]]) -> dict[str, Any]:
    """A backend exchange run to its answer with nothing relayed (``drain``), its failures
    as JsonRpcErrors: a request the gateway makes for its own ends."""
    try:
        return drain(exchange)
    except BackendError as error:
        raise to_jsonrpc_error(error) from None


def answered(result: dict[str, Any]) -> Exchange:
    """An exchange with nothing to stream: the gateway's own answer (find_tool, for one)."""
    return result
    yield  # makes this a generator  # noqa: unreachable
