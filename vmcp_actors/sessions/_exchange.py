"""What a call streams back before its answer, as typed events.

An Exchange is a generator the serving (web) thread drives: it yields events as the
backend streams them and returns the result object. Today an event is a Notification
(progress, logging) for the client; server-to-client requests will be a second kind,
carrying a way to answer them.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from vmcp_actors.exceptions import BackendError, BackendRpcError, BackendTimeout
from vmcp_actors.protocol import INTERNAL_ERROR, REQUEST_TIMEOUT, JsonRpcError


@dataclass(frozen=True)
class Notification:
    """A JSON-RPC notification for the client, sent before the answer."""

    message: dict[str, Any]

    @property
    def method(self) -> str | None:
        return self.message.get("method")


# Yields events, returns the result object; raises JsonRpcError.
Exchange = Generator[Notification, None, dict[str, Any]]


def to_jsonrpc_error(error: BaseException) -> JsonRpcError:
    """A backend failure as the client sees it: the backend's own error, or one naming the backend only."""
    if isinstance(error, JsonRpcError):
        return error
    if isinstance(error, BackendRpcError):
        return JsonRpcError(error.code, error.rpc_message, error.data)
    if isinstance(error, BackendTimeout):
        return JsonRpcError(REQUEST_TIMEOUT, str(error), {"backend": error.backend})
    if isinstance(error, BackendError):
        return JsonRpcError(INTERNAL_ERROR, str(error), {"backend": error.backend})
    return JsonRpcError(INTERNAL_ERROR, "Internal error")


def from_backend(exchange: Generator[dict[str, Any], None, dict[str, Any]]) -> Exchange:
    """A backend exchange as the client sees it: its messages as events, its failures
    as JsonRpcErrors."""
    try:
        while True:
            try:
                message = next(exchange)
            except StopIteration as answered:
                return answered.value
            yield Notification(message)
    except JsonRpcError:
        raise
    except Exception as error:  # noqa: BLE001 - every failure becomes a JSON-RPC error
        raise to_jsonrpc_error(error) from None
    finally:
        exchange.close()
