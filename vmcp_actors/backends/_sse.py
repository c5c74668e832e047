"""Backends of the 2024-11-05 HTTP+SSE transport (``transport: sse``): a GET opens the
server's event stream, whose first ``endpoint`` event says where to POST messages; every
answer and every message of the server comes back on that stream.

One stream per user's channel (it is that user's session, opened with its credentials),
carried by a ``MessageBus``: a dropped stream is opened again on the next use and given
the same ``initialize`` first, so the channel never notices.

Every GET and POST goes through the backend's ``McpHttpClient``, as a streamable HTTP
backend's would: its pools (the environment's proxies and CA bundle, no netrc), its
circuit breaker, its metrics, no redirects, and the deadline of the call it is for.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Generator, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from vmcp_actors.backends._bus import SEND_TIMEOUT, BusClient, MessageBus
from vmcp_actors.backends._http import McpHttpClient, PostResult, _split_lines, close_response, response_socket
from vmcp_actors.exceptions import (
    BackendError,
    BackendHTTPError,
    BackendProtocolError,
    BackendSessionExpired,
)
from vmcp_actors.protocol import wire_bytes
from vmcp_actors.protocol.sse import iter_sse_events

if TYPE_CHECKING:
    from vmcp_actors.backends._health import CircuitBreaker

logger = logging.getLogger(__name__)

_CHUNK = 64 * 1024
# Idle connections one user's client keeps to an SSE backend: its stream and a few POSTs.
_POOL_SIZE = 10


class _CallDeadline(threading.local):
    # The bus opens links and sends messages inside a call's steps, on whichever thread
    # drives the call, without passing its deadline on: the client leaves it here.
    due: tuple[float, float] | None = None  # (monotonic deadline, the call's timeout)


_CALL = _CallDeadline()


@contextmanager
def _within(due: tuple[float, float]) -> Iterator[None]:
    before, _CALL.due = _CALL.due, due
    try:
        yield
    finally:
        _CALL.due = before


def _each_step_within(due: tuple[float, float], steps: Generator[dict, None, dict]) -> Generator[dict, None, dict]:
    """``steps`` with ``due`` as the deadline of each of its steps, on the thread that runs it."""
    try:
        while True:
            with _within(due):
                try:
                    streamed = next(steps)
                except StopIteration as answered:
                    return answered.value
            yield streamed
    finally:
        steps.close()


def _deadline_here() -> tuple[float, float]:
    """The deadline of the call this thread runs; outside any call (a cancellation sent
    from an abort, a refusal from the reader), the bus's SEND_TIMEOUT."""
    return _CALL.due or (time.monotonic() + SEND_TIMEOUT, SEND_TIMEOUT)


class SseLink:
    """One open event stream and its endpoint: a ``Link`` of the channel's bus."""

    def __init__(self, bus: MessageBus, client: McpHttpClient, url: str, headers: Mapping[str, str]):
        self._bus = bus
        self._client = client
        self._headers = dict(headers)
        self._closed = threading.Event()
        deadline, timeout = _deadline_here()
        self._stream = client._send("GET", {**self._headers, "Accept": "text/event-stream"}, None, deadline, timeout,
                                    url=url)
        if self._stream.status != 200:
            close_response(self._stream)
            raise BackendHTTPError(bus.backend, f"backend {bus.backend!r} answered HTTP {self._stream.status} "
                                                "to its event stream's GET", status=self._stream.status)
        self._endpoint_due: tuple[float, float] | None = (deadline, timeout)  # until the endpoint event came
        self._events = iter_sse_events(_split_lines(self._chunks()))
        self.endpoint = self._read_endpoint(url, timeout)
        McpHttpClient._set_read_timeout(self._stream, None)  # events come when they come
        threading.Thread(target=self._read, name=f"vmcp-sse-{bus.backend}", daemon=True).start()

    def send(self, message: dict[str, Any], headers: Mapping[str, str] | None = None) -> None:
        """POST ``message`` with the call's ``headers``: a credential renewed since the stream
        opened (an exchanged token expires) goes along at once, and on the link's own
        messages after it; without them, the latest this link was given."""
        if headers is not None:
            self._headers = dict(headers)
        body = wire_bytes(message)
        deadline, timeout = _deadline_here()
        answer = self._client._send("POST", {**self._headers, "Content-Type": "application/json"}, body,
                                    deadline, timeout, url=self.endpoint)
        try:
            if 200 <= answer.status < 300:
                self._client._drain(answer, deadline, timeout)  # so its connection goes back to the pool
        finally:
            close_response(answer)
        if answer.status == 404:
            # The server no longer knows this stream's session (it restarted; the stream was
            # cut off without the gateway hearing of it): the link is dead however open it
            # looks. The channel re-initializes on a new one and sends the message again.
            self._bus.lost(self, "its session is gone (HTTP 404 to a message)")
            self.close()
            raise BackendSessionExpired(self._bus.backend, f"backend {self._bus.backend!r} no longer knows our "
                                                           "session (HTTP 404)", status=404)
        if not 200 <= answer.status < 300:
            raise BackendHTTPError(self._bus.backend, f"backend {self._bus.backend!r} answered HTTP "
                                                      f"{answer.status} to a message", status=answer.status)

    def close(self) -> None:
        """Ends the stream at once: its socket is shut down first, so the reader's blocked
        read returns and closing waits for nothing."""
        self._closed.set()
        sock = response_socket(self._stream)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        close_response(self._stream)

    def _chunks(self) -> Iterator[bytes]:
        read1 = self._stream.read1
        while True:
            if self._endpoint_due is not None:  # a backend trickling comments cannot hold the opener past it
                McpHttpClient._set_read_timeout(self._stream, self._client._remaining(*self._endpoint_due))
            chunk = read1(_CHUNK, decode_content=True)
            if not chunk:
                return
            yield chunk

    def _read_endpoint(self, url: str, timeout: float) -> str:
        try:
            for event in self._events:
                if event.event == "endpoint":
                    endpoint = urljoin(url, event.data.strip())
                    if urlsplit(endpoint)[:2] != urlsplit(url)[:2]:
                        raise BackendProtocolError(self._bus.backend, f"backend {self._bus.backend!r} named an "
                                                                      "endpoint on another origin")
                    return endpoint
        except BackendError:
            close_response(self._stream)
            raise
        except UnicodeDecodeError:
            close_response(self._stream)
            raise BackendProtocolError(self._bus.backend, f"backend {self._bus.backend!r} sent an event that is "
                                                          "not UTF-8") from None
        except Exception as error:  # noqa: BLE001 - mapped as the HTTP client maps a body read's failure
            close_response(self._stream)
            raise self._client._map_exception(error, timeout) from None
        finally:
            self._endpoint_due = None
        close_response(self._stream)
        raise BackendProtocolError(self._bus.backend, f"backend {self._bus.backend!r} ended its event stream "
                                                      "before naming an endpoint")

    def _read(self) -> None:
        why = "its event stream ended"
        try:
            for event in self._events:
                if event.event not in ("", "message") or not event.data.strip():
                    continue
                try:
                    message = json.loads(event.data)
                except ValueError:
                    logger.warning("backend %r sent an event that is not JSON; skipped", self._bus.backend)
                    continue
                if isinstance(message, dict):
                    self._bus.received(self, message)
        except Exception as error:  # noqa: BLE001 - whatever ended the stream, the bus hears it
            why = f"its event stream broke ({type(error).__name__})"
        if not self._closed.is_set():
            self._bus.lost(self, why)


class LegacySseClient(BusClient):
    """A channel's client for a 2024-11-05 HTTP+SSE backend: its own stream and session."""

    def __init__(self, backend: str, url: str, *, one_client: bool = False, breaker: CircuitBreaker | None = None):
        """``one_client``: the connection serves one client session (else a person's
        2026-07-28 requests, among which a request outside a call cannot be placed).
        ``breaker``: the backend's circuit, shared with every user's client."""
        http = McpHttpClient(backend, url, breaker=breaker, pool_size=_POOL_SIZE)
        bus = MessageBus(backend, lambda bus, headers: SseLink(bus, http, url, headers), one_client=one_client)
        super().__init__(bus, lambda _view: (bus.close(), http.close()))

    def post(self, message: dict, *, timeout: float, **rest: Any) -> PostResult:
        with _within((time.monotonic() + timeout, timeout)):
            return super().post(message, timeout=timeout, **rest)

    def exchange(self, request: dict, *, timeout: float, **rest: Any) -> Generator[dict, None, dict]:
        steps = super().exchange(request, timeout=timeout, **rest)
        return _each_step_within((time.monotonic() + timeout, timeout), steps)

    def __repr__(self) -> str:  # never the URL
        return f"LegacySseClient(backend={self.backend_name!r})"
