"""One driver for every call, read and get, in both revisions.

``drive`` runs a request's exchange (whatever the core returned: a result at once, or a
backend's or a composite run's stream of events) on the request's thread and yields what
the client gets: ``Write`` for each message before the answer, then exactly one outcome
(``Answered``, ``Failed`` or ``Cancelled``). Outcomes are typed values; the edge turns
them into JSON-RPC once (``response_for``).

What a revision's client makes of the events is its ``ClientSide``: the 2025 side
(``edge._legacy.SessionSide``) writes a backend's mid-call request on the call's stream;
the 2026-07-28 side (``edge._modern.StatelessSide``) answers ``input_required`` and parks
the call. Every failure, from starting the call to its last event, goes through the one
error ladder here.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from vmcp_actors.backends import CallOpened, InputRequired
from vmcp_actors.concurrency import Deadline
from vmcp_actors.core._exchange import (
    CallCancelled,
    Exchange,
    Notification,
    ServerRequest,
)
from vmcp_actors.limits import Place, QueueTimeout
from vmcp_actors.protocol import (
    INTERNAL_ERROR,
    REQUEST_TIMEOUT,
    JsonRpcError,
    error_response,
    result_response,
)

logger = logging.getLogger(__name__)

# Input rounds one call may take (a backend's input_required, answered) before the
# gateway gives up on it.
MAX_INPUT_ROUNDS = 16


@dataclass(frozen=True)
class Write:
    """A message for the client before the answer: a notification, or a request for it."""

    message: dict[str, Any]


@dataclass(frozen=True)
class Answered:
    """The request's result, shaped for the client's revision."""

    result: Mapping[str, Any]


@dataclass(frozen=True)
class Failed:
    """The request's error, with the HTTP status the client's revision gives it."""

    error: JsonRpcError


@dataclass(frozen=True)
class Cancelled:
    """The client cancelled the request: no answer is written (MCP says none is sent)."""


Outcome = Answered | Failed | Cancelled
OUTCOMES = (Answered, Failed, Cancelled)


def response_for(outcome: Outcome, request_id: Any) -> tuple[int, dict[str, Any] | None]:
    """The outcome as the HTTP status and JSON-RPC body the client gets (None: no body)."""
    if isinstance(outcome, Answered):
        return 200, result_response(request_id, dict(outcome.result))
    if isinstance(outcome, Failed):
        return outcome.error.http_status, error_response(request_id, outcome.error)
    return 202, None


@dataclass
class CallRun:
    """A call's backend side as it is driven: its exchange (replaced by the retry after an
    input round), how to cancel it, the backend it reached, its place at that backend's
    bulkhead, and the client's answers it waits for while parked (a 2026-07-28 client's
    retry brings them). A parked call holds no bulkhead place: it gives it back when it
    parks and takes one again, like a new call, before the retry's answers reach the backend."""

    exchange: Exchange
    deadline: Deadline
    cancel: Callable[[str | None], None] | None = None
    backend: str | None = None
    place: Place | None = None
    pending: dict[str, ServerRequest] = field(default_factory=dict)
    rounds: int = 0
    parked: bool = False
    _id: str | None = None

    @property
    def id(self) -> str:
        """Its name while parked (made when first asked: most calls are never parked)."""
        if self._id is None:
            self._id = secrets.token_urlsafe(12)
        return self._id

    def give_back_place(self) -> None:
        """The call parks: it waits on its client, so its bulkhead place is free meanwhile."""
        if self.place is not None:
            self.place.give_back()

    def take_place_again(self) -> None:
        """The client's retry came: a place again before the backend hears the answers,
        waited for as a new call waits, until the call's deadline (then -32001)."""
        if self.place is None:
            return
        try:
            self.place.take(self.deadline)
        except QueueTimeout:
            raise JsonRpcError(REQUEST_TIMEOUT, f"backend {self.place.backend!r}: the call's deadline passed while "
                                                "its continuation waited for a place (maxConcurrentCalls)",
                               {"backend": self.place.backend}) from None


def started(start: Callable[[], Exchange | Mapping[str, Any]]) -> Exchange:
    """An exchange whose first step starts the request (``start`` answers a result or an
    exchange): what starting raises fails the request like any later failure."""
    begun = start()
    if isinstance(begun, Mapping):
        return dict(begun)
    return (yield from begun)


class ClientSide(Protocol):
    """What one revision's client makes of a call's events."""

    def keep(self, notification: Notification) -> bool:
        """Write this notification to the client (its log level, its subscriptions)?"""

    def opened(self, run: CallRun) -> None:
        """The call reached a backend or started a run: ``run.cancel`` ends it."""

    def asked(self, request: ServerRequest, run: CallRun) -> Write | Outcome | None:
        """A backend's request for the client: a message on the call's stream, the call's
        outcome (it waits for the client's next request), or None (answered at once)."""

    def input_required(self, event: InputRequired, run: CallRun) -> Iterator[Write] | Outcome:
        """A 2026-07-28 backend needs input: the messages that ask the client (and
        ``run.exchange`` replaced by the retry), or the call's outcome."""

    def answered(self, result: Mapping[str, Any]) -> Outcome:
        """The backend's result as this client gets it."""

    def failed(self, error: JsonRpcError) -> Outcome:
        """An error as this client gets it."""

    def left(self, run: CallRun) -> None:
        """The client went away before the answer."""

    def finished(self, run: CallRun) -> None:
        """The call is over, however it ended."""


def drive(run: CallRun, side: ClientSide) -> Iterator[Write | Outcome]:
    """The call's messages in arrival order, then exactly one outcome."""
    answered = False
    try:
        while True:
            event = next(run.exchange)
            if isinstance(event, Notification):
                if side.keep(event):
                    yield Write(event.message)
            elif isinstance(event, ServerRequest):
                step = side.asked(event, run)
                if isinstance(step, Write):
                    yield step
                elif step is not None:
                    answered = True
                    yield step
                    return
            elif isinstance(event, CallOpened):
                run.cancel = event.cancel
                run.backend = run.backend or event.backend or None
                run.place = event.place if event.place is not None else run.place
                side.opened(run)
            elif isinstance(event, InputRequired):
                run.rounds += 1
                if run.rounds > MAX_INPUT_ROUNDS:
                    raise JsonRpcError(INTERNAL_ERROR, f"backend {event.backend!r} asked for input more than "
                                                       f"{MAX_INPUT_ROUNDS} times in one call")
                step = side.input_required(event, run)
                if isinstance(step, OUTCOMES):
                    answered = True
                    yield step
                    return
                yield from step
    except StopIteration as done:
        answered = True
        yield side.answered(done.value)
    except CallCancelled:
        answered = True
        yield Cancelled()
    except JsonRpcError as error:
        answered = True
        yield side.failed(error)
    except Exception as error:  # noqa: BLE001 - the client gets an answer whatever happened
        answered = True
        logger.error("request failed unexpectedly: %s", error.__class__.__name__, exc_info=error)
        yield side.failed(JsonRpcError(INTERNAL_ERROR, "Internal error"))
    finally:
        if not answered:
            side.left(run)
        if not run.parked:
            run.exchange.close()  # the client went away mid-stream: the backend exchange ends too
        side.finished(run)
