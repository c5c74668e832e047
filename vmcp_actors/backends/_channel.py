"""BackendChannel: running exchanges with one backend, for one user.

The BackendConnection actor owns the connection's state: it starts the handshake (one at
a time, renewed once when the backend forgets our session) and publishes it here. A web
thread serving a tool call then runs the HTTP exchange itself (``request``), relaying
the backend's streamed notifications as they arrive, with no message to the actor on the
way; it waits for a handshake at most until its request's deadline. Pooled work (composite
steps, forwarded settings) uses ``submit``, which chains on the handshake and the renewal
with callbacks and never blocks a pooled thread on another job. Safe for concurrent use:
it holds the thread-safe HTTP client, a locked id counter, immutable settings and the
published handshake (one atomic reference).

Every exchange waits at most the backend's timeout, and never past the deadline of the
request it serves.
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
from vmcp_actors.concurrency import ASK_TIMEOUT, Deadline, on_settled, run_in_thread, settle_from
from vmcp_actors.exceptions import (
    BackendError,
    BackendProtocolError,
    BackendRpcError,
    BackendSessionExpired,
    BackendTimeout,
    BackendUnavailable,
)
from vmcp_actors.identity import Identity, forwarded_headers_of
from vmcp_actors.protocol import LATEST_PROTOCOL_VERSION, NEGOTIABLE_PROTOCOL_VERSIONS

CLIENT_INFO = {"name": "vmcp-actors", "version": __version__}

Exchange = Generator[dict[str, Any], None, dict[str, Any]]


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
        self._connection: Any = None  # ActorProxy[BackendConnection], attached when it is created
        self._handshake: cf.Future[Handshake] | None = None

    # -- the BackendConnection actor only ------------------------------------------------

    def attach(self, connection: Any) -> None:
        self._connection = connection

    def publish_handshake(self, handshake: cf.Future[Handshake] | None) -> None:
        self._handshake = handshake

    def perform_handshake(self, identity: Identity | None) -> Handshake:
        """initialize, then notifications/initialized. A pooled job: it is shared by every
        request of the user, so it waits the backend's timeout, not one request's deadline."""
        params = {"protocolVersion": LATEST_PROTOCOL_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO}
        message = {"jsonrpc": "2.0", "id": self._ids.next(), "method": "initialize", "params": params}
        headers = self.headers_for(identity)
        reply = self._client.post(
            message, session_id=None, protocol_version=None, timeout=self.timeout, extra_headers=headers
        )
        result = self._result_of(reply.message, "initialize")
        version = result.get("protocolVersion")
        if version not in NEGOTIABLE_PROTOCOL_VERSIONS:
            raise BackendProtocolError(self.name, f"backend {self.name!r} negotiated protocol version "
                                                  f"{str(version)[:40]!r}, which the gateway does not speak "
                                                  f"({', '.join(NEGOTIABLE_PROTOCOL_VERSIONS)})")
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
        """End the backend session (DELETE), best effort, then close the HTTP pool."""
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

    def close(self) -> None:
        """Close the HTTP pool, leaving the backend session alive (its record may revive it)."""
        self._client.close()

    def headers_for(self, identity: Identity | None) -> dict[str, str]:
        """The caller's passthrough headers, then this backend's authentication for the caller."""
        headers = dict(forwarded_headers_of(identity))
        headers.update(self._auth.headers(identity))
        return headers

    # -- web threads ---------------------------------------------------------------------

    def request(self, identity: Identity | None, method: str, params: dict[str, Any] | None,
                deadline: Deadline) -> Exchange:
        """Yield the notifications the backend streams, return its result.

        Raises BackendRpcError when the backend answers with a JSON-RPC error, and another
        BackendError when the exchange fails (which the connection records as its last error).
        """
        try:
            handshake = self._await(self._handshake_future(identity), deadline)
            try:
                return (yield from self.exchange_with(identity, handshake, method, params, deadline))
            except BackendSessionExpired:
                # The backend restarted: re-initialize once, transparently, and retry.
                # (A 404 comes before any streamed event, so nothing was relayed twice.)
                renewed = self._await(self._ask_connection("renew_handshake", identity, handshake.session_id), deadline)
                return (yield from self.exchange_with(identity, renewed, method, params, deadline))
        except BackendRpcError:
            raise  # the backend answered; the connection itself is fine
        except BackendError as exc:
            self._tell_connection("exchange_failed", str(exc))
            raise

    # -- pooled work ---------------------------------------------------------------------

    def submit(self, identity: Identity | None, method: str, params: dict[str, Any] | None,
               deadline: Deadline) -> cf.Future[dict[str, Any]]:
        """``request`` for pooled work: the result lands in the returned future. The
        exchange runs as one pooled job once the handshake is there (a renewal after a 404
        likewise), chained by callbacks: no pooled thread waits for another job."""
        outcome: cf.Future[dict[str, Any]] = cf.Future()

        def attempt(handshake_future: cf.Future[Handshake], renewed: bool) -> None:
            error = handshake_future.exception()
            if error is not None:
                self._fail(outcome, error)
                return
            handshake = handshake_future.result()
            job = run_in_thread(self.call_with, identity, handshake, method, params, deadline)

            def finished(done: cf.Future[dict[str, Any]]) -> None:
                failure = done.exception()
                if isinstance(failure, BackendSessionExpired) and not renewed:
                    try:
                        renewal = self._ask_connection("renew_handshake", identity, handshake.session_id)
                    except BackendError as exc:
                        self._fail(outcome, exc)
                        return
                    on_settled(renewal, lambda settled: attempt(settled, True))
                    return
                if failure is not None:
                    self._fail(outcome, failure)
                else:
                    settle_from(outcome, done)

            on_settled(job, finished)

        try:
            first = self._handshake_future(identity)
        except BackendError as exc:
            self._fail(outcome, exc)
            return outcome
        on_settled(first, lambda settled: attempt(settled, False))
        return outcome

    def exchange_with(self, identity: Identity | None, handshake: Handshake, method: str,
                      params: dict[str, Any] | None, deadline: Deadline | None = None) -> Exchange:
        """One exchange on the backend session ``handshake`` names (no renewal here)."""
        timeout = self.timeout if deadline is None else deadline.cap(self.timeout)
        if timeout <= 0:
            raise BackendTimeout(self.name, f"backend {self.name!r}: the request's deadline passed before the "
                                            f"exchange could start")
        headers = self.headers_for(identity)  # per request: a refreshed caller token is used at once
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self._ids.next(), "method": method}
        if params is not None:
            message["params"] = params
        answer = yield from self._client.exchange(
            message,
            session_id=handshake.session_id,
            protocol_version=handshake.protocol_version,
            timeout=timeout,
            extra_headers=headers,
        )
        return self._result_of(answer, method)

    def call_with(self, identity: Identity | None, handshake: Handshake, method: str,
                  params: dict[str, Any] | None, deadline: Deadline | None = None) -> dict[str, Any]:
        """``exchange_with`` for the gateway's own use: notifications dropped, result returned."""
        return drain(self.exchange_with(identity, handshake, method, params, deadline))

    # -- internals -----------------------------------------------------------------------

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

    def _handshake_future(self, identity: Identity | None) -> cf.Future[Handshake]:
        published = self._handshake
        if published is None or (published.done() and published.exception() is not None):
            published = self._ask_connection("handshake", identity)  # starts one if needed
        return published

    def _await(self, handshake: cf.Future[Handshake], deadline: Deadline) -> Handshake:
        try:
            return handshake.result(timeout=deadline.remaining())
        except cf.TimeoutError:
            raise BackendTimeout(self.name, f"backend {self.name!r} did not complete its handshake within "
                                            "the request's deadline") from None

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

    def _fail(self, outcome: cf.Future[Any], error: BaseException) -> None:
        if isinstance(error, BackendError) and not isinstance(error, BackendRpcError):
            self._tell_connection("exchange_failed", str(error))
        try:
            outcome.set_exception(error)
        except cf.InvalidStateError:
            pass


def drain(exchange: Exchange) -> dict[str, Any]:
    """Run an exchange to its end, dropping its notifications; its result."""
    try:
        while True:
            next(exchange)
    except StopIteration as answered:
        return answered.value
    finally:
        exchange.close()
