"""Backends of the 2024-11-05 HTTP+SSE transport (``transport: sse``): a GET opens the
server's event stream, whose first ``endpoint`` event says where to POST messages; every
answer and every message of the server comes back on that stream.

One stream per user's channel (it is that user's session, opened with its credentials),
carried by a ``MessageBus``: a dropped stream is opened again on the next use and given
the same ``initialize`` first, so the channel never notices.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests

from vmcp_actors.backends._bus import BusClient, MessageBus
from vmcp_actors.backends._http import McpHttpClient, _split_lines
from vmcp_actors.exceptions import (
    BackendError,
    BackendHTTPError,
    BackendProtocolError,
    BackendSessionExpired,
    BackendUnavailable,
)
from vmcp_actors.protocol.sse import iter_sse_events

logger = logging.getLogger(__name__)

# How long the GET may take to bring its endpoint event, and a POST its answer.
CONNECT_TIMEOUT = 10.0
POST_TIMEOUT = 30.0
_CHUNK = 64 * 1024


class SseLink:
    """One open event stream and its endpoint: a ``Link`` of the channel's bus."""

    def __init__(self, bus: MessageBus, http: requests.Session, url: str, headers: Mapping[str, str]):
        self._bus = bus
        self._http = http
        self._headers = dict(headers)
        self._closed = threading.Event()
        try:
            self._stream = http.get(url, headers={**self._headers, "Accept": "text/event-stream"},
                                    stream=True, timeout=(CONNECT_TIMEOUT, CONNECT_TIMEOUT))
        except requests.RequestException as error:
            raise BackendUnavailable(bus.backend, f"backend {bus.backend!r} could not be reached: "
                                                  f"{type(error).__name__}") from None
        if self._stream.status_code != 200:
            self._stream.close()
            raise BackendHTTPError(bus.backend, f"backend {bus.backend!r} answered HTTP {self._stream.status_code} "
                                                "to its event stream's GET", status=self._stream.status_code)
        self._events = iter_sse_events(_split_lines(self._chunks()))
        self.endpoint = self._read_endpoint(url)
        McpHttpClient._set_read_timeout(self._stream, None)  # events come when they come
        threading.Thread(target=self._read, name=f"vmcp-sse-{bus.backend}", daemon=True).start()

    def send(self, message: dict[str, Any], headers: Mapping[str, str] | None = None) -> None:
        """POST ``message`` with the call's ``headers``: a credential renewed since the stream
        opened (an exchanged token expires) goes along at once, and on the link's own
        messages after it; without them, the latest this link was given."""
        if headers is not None:
            self._headers = dict(headers)
        body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        try:
            answer = self._http.post(self.endpoint, data=body, timeout=(CONNECT_TIMEOUT, POST_TIMEOUT),
                                     headers={**self._headers, "Content-Type": "application/json"})
        except requests.RequestException as error:
            raise BackendUnavailable(self._bus.backend, f"backend {self._bus.backend!r} could not be reached: "
                                                        f"{type(error).__name__}") from None
        answer.close()
        if answer.status_code == 404:
            # The server no longer knows this stream's session (it restarted; the stream was
            # cut off without the gateway hearing of it): the link is dead however open it
            # looks. The channel re-initializes on a new one and sends the message again.
            self._bus.lost(self, "its session is gone (HTTP 404 to a message)")
            self.close()
            raise BackendSessionExpired(self._bus.backend, f"backend {self._bus.backend!r} no longer knows our "
                                                           "session (HTTP 404)", status=404)
        if not 200 <= answer.status_code < 300:
            raise BackendHTTPError(self._bus.backend, f"backend {self._bus.backend!r} answered HTTP "
                                                      f"{answer.status_code} to a message", status=answer.status_code)

    def close(self) -> None:
        """Ends the stream at once: its socket is shut down first, so the reader's blocked
        read returns and closing waits for nothing."""
        self._closed.set()
        sock = getattr(getattr(self._stream.raw, "connection", None), "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._stream.close()

    def _chunks(self) -> Iterator[bytes]:
        read1 = getattr(self._stream.raw, "read1", None)
        if read1 is None:
            yield from self._stream.iter_content(_CHUNK)
            return
        while chunk := read1(_CHUNK, decode_content=True):
            yield chunk

    def _read_endpoint(self, url: str) -> str:
        try:
            for event in self._events:
                if event.event == "endpoint":
                    endpoint = urljoin(url, event.data.strip())
                    if urlsplit(endpoint)[:2] != urlsplit(url)[:2]:
                        raise BackendProtocolError(self._bus.backend, f"backend {self._bus.backend!r} named an "
                                                                      "endpoint on another origin")
                    return endpoint
        except (requests.RequestException, OSError, UnicodeDecodeError) as error:
            self._stream.close()
            raise BackendUnavailable(self._bus.backend, f"backend {self._bus.backend!r} sent no endpoint: "
                                                        f"{type(error).__name__}") from None
        except BackendError:
            self._stream.close()
            raise
        self._stream.close()
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

    def __init__(self, backend: str, url: str, *, one_client: bool = False):
        """``one_client``: the connection serves one client session (else a person's
        2026-07-28 requests, among which a request outside a call cannot be placed)."""
        http = requests.Session()
        http.trust_env = False  # no netrc credentials for backends (as the HTTP client)
        bus = MessageBus(backend, lambda bus, headers: SseLink(bus, http, url, headers), one_client=one_client)
        super().__init__(bus, lambda _view: (bus.close(), http.close()))

    def __repr__(self) -> str:  # never the URL
        return f"LegacySseClient(backend={self.backend_name!r})"
