"""Asking a person to connect a backend that needs their own authorization.

A call that needs the connection (the backend's connect tool, or any call whose backend
says the person's authorization is missing or lapsed) is answered in the way the client
takes:

* a client that declared URL elicitation gets it in its revision, as an ``input_required``
  round of the call (``CONNECT_STATE``): a 2025 client is asked on the call's stream, and
  once it accepts, the call waits for the connect to finish, tells it
  ``notifications/elicitation/complete`` and goes on; a 2026-07-28 client's retry (sealed
  state, any worker) waits likewise and goes on;
* any other client gets a tool result with ``isError`` and the absolute connect link.

The link names nothing but a random ticket; the page it opens checks that the browser's
person is the caller before anything goes to the backend's authorization server.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any, Protocol

from vmcp_actors.backends import InputRequired
from vmcp_actors.concurrency import Deadline
from vmcp_actors.core._exchange import answered
from vmcp_actors.exceptions import ConnectionNeeded
from vmcp_actors.identity import Identity
from vmcp_actors.protocol import INVALID_PARAMS, JsonRpcError

# The requestState of a connect round (``vmcp-connect:<when it was asked>``) and the key of
# its one input request.
CONNECT_STATE = "vmcp-connect"
CONNECT_INPUT = "connect"
# Answer this long before the call's deadline when the connect has not finished by then.
ANSWER_MARGIN = 0.5

RawExchange = Generator[Any, None, dict[str, Any]]


class ConnectLinks(Protocol):
    """The connection service, as calls see it."""

    public_url: str  # where people's browsers reach the gateway

    def link(self, identity: Identity, backend: str, scopes: tuple[str, ...] = ()) -> tuple[str, str]:
        """A new connect link for the person and backend: ``(url, elicitation id)``."""

    def connected(self, identity: Identity | None, backend: str) -> bool: ...

    def now(self) -> float: ...

    def wait_connected(self, identity: Identity, backend: str, timeout: float, since: float = 0.0) -> bool:
        """Connected at ``since`` or later, waiting ``timeout`` at most."""


def takes_url_elicitation(capabilities: Mapping[str, Any]) -> bool:
    elicitation = capabilities.get("elicitation")
    return isinstance(elicitation, Mapping) and isinstance(elicitation.get("url"), Mapping)


def connect_result(text: str, *, error: bool) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": error}


def link_result(backend: str, url: str, why: str) -> dict[str, Any]:
    """For a client without URL elicitation: the link, for the person (and the model) to see."""
    return connect_result(f"{why}. Open this link in a browser to connect your {backend} account, then call the "
                          f"tool again: {url}", error=True)


def connecting(links: ConnectLinks, identity: Identity | None, backend: str, needed: ConnectionNeeded | None,
               url_elicitation: bool, params: Mapping[str, Any], then: Callable[[], RawExchange],
               deadline: Deadline) -> RawExchange:
    """The call that needs the connection: asks for it, and once it is there goes on
    with ``then`` (the call itself, or the connect tool's own answer)."""
    if identity is None:
        raise JsonRpcError(INVALID_PARAMS, f"backend {backend!r} needs a signed-in person")
    why = str(needed) if needed is not None else f"backend {backend!r} needs your authorization"
    scopes = needed.scopes if needed is not None else ()
    since = links.now()  # a connection already there (a 403 asked for more scopes) is not this connect
    url, elicitation = links.link(identity, backend, scopes)
    if not url_elicitation:
        return link_result(backend, url, why.rstrip("."))
    request = {"method": "elicitation/create",
               "params": {"mode": "url", "url": url, "elicitationId": elicitation,
                          "message": f"{why[0].upper()}{why[1:]}. Connect your {backend} account to continue."}}

    def retry(responses: Mapping[str, Any]) -> RawExchange:
        return (yield from after_answer(links, identity, backend, responses.get(CONNECT_INPUT), then, deadline,
                                        since, elicitation, url))

    yield InputRequired(backend, "tools/call", dict(params), {CONNECT_INPUT: request}, f"{CONNECT_STATE}:{since}",
                        retry, deadline)
    return connect_result("The connect was not answered.", error=True)


def asked_since(state: str | None) -> float | None:
    """When a connect round was asked, from its state; None for another request's state."""
    kind, _, when = (state or "").partition(":")
    if kind != CONNECT_STATE:
        return None
    try:
        return float(when)
    except ValueError:
        return None


def after_answer(links: ConnectLinks, identity: Identity, backend: str, answer: Any,
                 then: Callable[[], RawExchange], deadline: Deadline, since: float,
                 elicitation: str | None = None, url: str | None = None) -> RawExchange:
    """The client answered the connect request: wait (within the call's deadline) for the
    person to finish in the browser, then go on."""
    action = answer.get("action") if isinstance(answer, Mapping) else None
    if action != "accept":
        return connect_result(f"Not connected to {backend}: the request was "
                              f"{'declined' if action == 'decline' else 'cancelled'}.", error=True)
    if not links.wait_connected(identity, backend, max(0.0, deadline.remaining() - ANSWER_MARGIN), since):
        where = f" ({url})" if url else ""
        return connect_result(f"Not connected to {backend} yet: finish in the browser{where}, then call the tool "
                              "again.", error=True)
    if elicitation is not None:
        yield {"jsonrpc": "2.0", "method": "notifications/elicitation/complete",
               "params": {"elicitationId": elicitation}}
    return (yield from then())


def connected_answer(backend: str) -> Callable[[], RawExchange]:
    """The connect tool's own answer once the backend is connected."""

    return lambda: answered(connect_result(f"Connected to {backend}: its tools are in your tool list now.",
                                           error=False))

