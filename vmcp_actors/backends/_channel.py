"""BackendChannel: running exchanges with one backend on the caller's own thread.

The BackendConnection actor owns the connection's state: it starts the handshake (one at
a time, renewed once when the backend forgets our session) and publishes it here. A web
thread serving a tool call then runs the HTTP exchange itself, relaying the backend's
streamed notifications as they arrive, with no message to the actor on the way. Safe
for concurrent use: it holds the thread-safe HTTP client, a locked id counter, immutable
settings and the published handshake (one atomic reference).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Generator
from types import MappingProxyType
from typing import Any

import pykka

from vmcp_actors import __version__
from vmcp_actors.backends._auth import OutgoingAuth, Unauthenticated
from vmcp_actors.backends._http import McpHttpClient
from vmcp_actors.backends._models import Handshake
from vmcp_actors.concurrency import ASK_TIMEOUT
from vmcp_actors.exceptions import (
    BackendError,
    BackendProtocolError,
    BackendRpcError,
    BackendSessionExpired,
    BackendTimeout,
    BackendUnavailable,
)
from vmcp_actors.identity import Identity, forwarded_headers_of
from vmcp_actors.protocol import LATEST_PROTOCOL_VERSION
from vmcp_actors.protocol.mcp import ACCEPTED_PROTOCOL_HEADER_VERSIONS

CLIENT_INFO = {"name": "vmcp-actors", "version": __version__}


class _RequestIds:
    """JSON-RPC ids unique per backend session: client ids are only unique per client
    session, and the gateway's own requests share the backend session too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0

    def next(self) -> int:
        with self._lock:
            self._next += 1
            return self._next


class BackendChannel:
    def __init__(self, name: str, client: McpHttpClient, timeout: float, auth: OutgoingAuth | None = None):
        self.name = name
        self.timeout = timeout
        self._client = client
        self._auth = auth if auth is not None else Unauthenticated()
        self._ids = _RequestIds()
        self._connection: Any = None  # ActorProxy[BackendConnection], attached on start
        self._handshake: cf.Future[Handshake] | None = None

    # -- the BackendConnection actor only ------------------------------------------------

    def attach(self, connection: Any) -> None:
        self._connection = connection

    def publish_handshake(self, handshake: cf.Future[Handshake] | None) -> None:
        self._handshake = handshake

    def perform_handshake(self, identity: Identity | None) -> Handshake:
        """initialize, then notifications/initialized. Runs on a worker thread."""
        params = {"protocolVersion": LATEST_PROTOCOL_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO}
        message = {"jsonrpc": "2.0", "id": self._ids.next(), "method": "initialize", "params": params}
        headers = self.headers_for(identity)
        reply = self._client.post(
            message, session_id=None, protocol_version=None, timeout=self.timeout, extra_headers=headers
        )
        result = self._result_of(reply.message, "initialize")
        version = result.get("protocolVersion")
        if version not in ACCEPTED_PROTOCOL_HEADER_VERSIONS:
            raise BackendProtocolError(self.name, f"backend {self.name!r} negotiated unsupported protocol version {version!r}")
        capabilities = result.get("capabilities")
        server_info = result.get("serverInfo")
        self._client.post(
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            session_id=reply.session_id,
            protocol_version=version,
            timeout=self.timeout,
            extra_headers=headers,
        )
        return Handshake(
            session_id=reply.session_id,
            protocol_version=version,
            capabilities=MappingProxyType(dict(capabilities) if isinstance(capabilities, dict) else {}),
            server_info=MappingProxyType(dict(server_info) if isinstance(server_info, dict) else {}),
        )

    def close_remote(self, handshake: Handshake, identity: Identity | None) -> None:
        try:
            headers = self.headers_for(identity)
        except BackendError:
            headers = {}  # best effort: the backend reaps the session itself then
        try:
            self._client.delete_session(
                handshake.session_id,
                protocol_version=handshake.protocol_version,
                timeout=min(self.timeout, 2.0),
                extra_headers=headers,
            )
        finally:
            self._client.close()

    def headers_for(self, identity: Identity | None) -> dict[str, str]:
        """The caller's passthrough headers, then this backend's authentication for the caller."""
        headers = dict(forwarded_headers_of(identity))
        headers.update(self._auth.headers(identity))
        return headers

    # -- any thread ----------------------------------------------------------------------

    def request(
        self, identity: Identity | None, method: str, params: dict[str, Any] | None
    ) -> Generator[dict[str, Any], None, dict[str, Any]]:
        """Yield the notifications the backend streams, return its result.

        Raises BackendRpcError when the backend answers with a JSON-RPC error, and another
        BackendError when the exchange fails (which the connection records as its last error).
        """
        try:
            handshake = self._ready_handshake(identity)
            try:
                return (yield from self._exchange(identity, handshake, method, params))
            except BackendSessionExpired:
                # The backend restarted: re-initialize once, transparently, and retry.
                # (A 404 comes before any streamed event, so nothing was relayed twice.)
                renewed = self._renewed_handshake(identity, handshake)
                return (yield from self._exchange(identity, renewed, method, params))
        except BackendRpcError:
            raise  # the backend answered; the connection itself is fine
        except BackendError as exc:
            self._tell_connection("exchange_failed", str(exc))
            raise

    def call(self, identity: Identity | None, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
        """``request`` for the gateway's own use: notifications dropped, result returned."""
        exchange = self.request(identity, method, params)
        while True:
            try:
                next(exchange)
            except StopIteration as answered:
                return answered.value

    # -- internals -----------------------------------------------------------------------

    def _exchange(
        self, identity: Identity | None, handshake: Handshake, method: str, params: dict[str, Any] | None
    ) -> Generator[dict[str, Any], None, dict[str, Any]]:
        headers = self.headers_for(identity)  # per request: a refreshed caller token is used at once
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self._ids.next(), "method": method}
        if params is not None:
            message["params"] = params
        answer = yield from self._client.exchange(
            message,
            session_id=handshake.session_id,
            protocol_version=handshake.protocol_version,
            timeout=self.timeout,
            extra_headers=headers,
        )
        return self._result_of(answer, method)

    def _result_of(self, answer: Any, method: str) -> dict[str, Any]:
        if not isinstance(answer, dict):
            raise BackendProtocolError(self.name, f"backend {self.name!r} sent no answer to {method}")
        if "error" in answer:
            error = answer["error"] if isinstance(answer["error"], dict) else {}
            code = error.get("code")
            raise BackendRpcError(
                self.name, code if isinstance(code, int) else -32603, str(error.get("message", "")), error.get("data")
            )
        result = answer.get("result")
        if not isinstance(result, dict):
            raise BackendProtocolError(self.name, f"backend {self.name!r} answered {method} without a result object")
        return result

    def _ready_handshake(self, identity: Identity | None) -> Handshake:
        published = self._handshake
        if published is None or (published.done() and published.exception() is not None):
            published = self._ask_connection("handshake", identity)  # starts one if needed
        return self.await_handshake(published)

    def _renewed_handshake(self, identity: Identity | None, expired: Handshake) -> Handshake:
        return self.await_handshake(self._ask_connection("renew_handshake", identity, expired.session_id))

    def await_handshake(self, handshake: cf.Future[Handshake]) -> Handshake:
        # The handshake is two exchanges (initialize, then the initialized notification).
        limit = self.timeout * 2
        try:
            return handshake.result(timeout=limit)
        except cf.TimeoutError:
            raise BackendTimeout(self.name, f"backend {self.name!r} did not answer within {limit:g}s") from None

    def _ask_connection(self, method: str, *args: Any) -> cf.Future[Handshake]:
        try:
            return getattr(self._connection, method)(*args).get(timeout=ASK_TIMEOUT)
        except (pykka.ActorDeadError, pykka.Timeout, AttributeError):
            raise BackendUnavailable(self.name, f"backend {self.name!r} connection is closed") from None

    def _tell_connection(self, method: str, *args: Any) -> None:
        try:
            getattr(self._connection, method)(*args)
        except pykka.ActorDeadError:
            pass
