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
import logging
import threading
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pykka

from vmcp_actors import __version__
from vmcp_actors.backends._auth import OutgoingAuth, Unauthenticated
from vmcp_actors.backends._http import Abort, McpHttpClient
from vmcp_actors.backends._models import Handshake
from vmcp_actors.concurrency import (
    ASK_TIMEOUT,
    Deadline,
    on_settled,
    run_in_thread,
    settle_from,
)
from vmcp_actors.exceptions import (
    BackendCancelled,
    BackendError,
    BackendHTTPError,
    BackendProtocolError,
    BackendRpcError,
    BackendSessionExpired,
    BackendTimeout,
    BackendUnavailable,
)
from vmcp_actors.identity import Identity, forwarded_headers_of
from vmcp_actors.protocol import (
    INTERNAL_ERROR,
    LATEST_PROTOCOL_VERSION,
    METHOD_NOT_FOUND,
    NEGOTIABLE_PROTOCOL_VERSIONS,
)
from vmcp_actors.protocol.mcp import (
    META_CLIENT_CAPABILITIES,
    META_CLIENT_INFO,
    META_PREFIX,
    META_PROTOCOL_VERSION,
    META_SERVER_INFO,
    META_SUBSCRIPTION_ID,
    METHOD_HEADER,
    MODERN_PROTOCOL_VERSION,
    NAME_HEADER,
    NAMED_METHODS,
    encode_header_value,
)

logger = logging.getLogger(__name__)

CLIENT_INFO = {"name": "vmcp-actors", "version": __version__}


@dataclass(frozen=True)
class BackendRequest:
    """A request the backend sent us (sampling, elicitation, roots, ping), during a call
    or on its standalone stream. ``reply`` takes ``{"result": ...}`` or ``{"error": ...}``
    and sends it back under the backend's own id, on the backend session it came from."""

    backend: str
    method: str
    params: Mapping[str, Any]
    reply: Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class CallOpened:
    """First of an exchange's events: ``cancel(reason)`` ends it (the backend is told with
    notifications/cancelled under the id the gateway gave the request)."""

    backend: str
    cancel: Callable[[str | None], None]


@dataclass(frozen=True)
class InputRequired:
    """A 2026-07-28 backend answered ``input_required``: it needs ``requests`` (key ->
    {method, params}) answered before it can finish. ``retry(responses)`` is the same
    request again with the answers and the backend's ``state`` (a new Exchange). The
    exchange that yields this returns the backend's interim result if driven on."""

    backend: str
    method: str
    params: Mapping[str, Any]  # what the backend was sent (its own names), without the round's input
    requests: Mapping[str, Any]
    state: str | None
    retry: Callable[[Mapping[str, Any]], Generator[Any, None, dict[str, Any]]]
    deadline: Deadline


# Yields CallOpened, then notifications (dicts), BackendRequests and InputRequired; returns the result.
Exchange = Generator[Any, None, dict[str, Any]]

LEGACY, MODERN = "legacy", "modern"


class BackendEras:
    """Which era each backend speaks, as its first handshake found out (process-wide and
    thread-safe): later handshakes with it skip the ``server/discover`` probe when it is
    a legacy backend, and every user's connection starts from what is known."""

    def __init__(self, pinned: Mapping[str, str] | None = None) -> None:
        self._lock = threading.Lock()  # guards the eras probed per backend; never nested
        self._pinned = dict(pinned or {})  # from config: never probed
        self._known: dict[str, str] = {}

    def get(self, backend: str) -> str | None:
        with self._lock:
            return self._pinned.get(backend) or self._known.get(backend)

    def is_pinned(self, backend: str) -> bool:
        return backend in self._pinned

    def remember(self, backend: str, era: str) -> None:
        with self._lock:
            self._known[backend] = era

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            return {**self._known, **self._pinned}


class _RequestIds:
    """JSON-RPC ids unique per backend session: client ids are only unique per client
    session, and the gateway's own requests share the backend session too. ``base``: where
    a channel starts counting; processes that share users' records (and so their backend
    sessions) each start at a random base, so their ids do not meet."""

    def __init__(self, base: int = 0) -> None:
        self._lock = threading.Lock()  # guards the next request id; never nested
        self._next = base

    def next(self) -> int:
        with self._lock:
            self._next += 1
            return self._next


class BackendChannel:
    def __init__(self, name: str, client: McpHttpClient, timeout: float, auth: OutgoingAuth | None = None,
                 client_capabilities: Mapping[str, Any] | None = None, eras: BackendEras | None = None,
                 request_id_base: int = 0):
        self.name = name
        self.timeout = timeout
        self._eras = eras if eras is not None else BackendEras()
        # What the gateway declares at initialize: what the user's clients declared.
        self._client_capabilities = dict(client_capabilities or {})
        self._client = client
        self._auth = auth if auth is not None else Unauthenticated()
        self._ids = _RequestIds(request_id_base)
        self._connection: Any = None  # ActorProxy[BackendConnection], attached when it is created
        self._handshake: cf.Future[Handshake] | None = None

    # -- the BackendConnection actor only ------------------------------------------------

    def attach(self, connection: Any) -> None:
        self._connection = connection

    def publish_handshake(self, handshake: cf.Future[Handshake] | None) -> None:
        self._handshake = handshake

    def perform_handshake(self, identity: Identity | None) -> Handshake:
        """What the backend speaks and offers: ``server/discover`` first (a 2026-07-28
        backend answers it: no session), else initialize, then notifications/initialized.
        Which one worked is remembered for the backend. A pooled job: it is shared by every
        request of the user, so it waits the backend's timeout, not one request's deadline."""
        era = self._eras.get(self.name)
        if era != LEGACY:
            discovered = self._discover(identity, probing=era is None)
            if discovered is not None:
                self._eras.remember(self.name, MODERN)
                return discovered
            self._eras.remember(self.name, LEGACY)
        return self._initialize(identity)

    def _discover(self, identity: Identity | None, probing: bool) -> Handshake | None:
        """The backend's ``server/discover`` answer as a handshake; None when it answers
        as a server of an earlier revision would (a JSON-RPC error or a 4xx)."""
        message = {"jsonrpc": "2.0", "id": self._ids.next(), "method": "server/discover",
                   "params": {"_meta": self.modern_meta()}}
        headers = {**self.headers_for(identity), METHOD_HEADER: "server/discover"}
        try:
            reply = self._client.post(message, session_id=None, protocol_version=MODERN_PROTOCOL_VERSION,
                                      timeout=self.timeout, extra_headers=headers)
        except BackendRpcError as refused:
            logger.debug("backend %r refused server/discover (%d): not a %s backend", self.name, refused.code,
                         MODERN_PROTOCOL_VERSION)
            if not probing and self._eras.is_pinned(self.name):
                raise
            return None
        except BackendHTTPError as refused:
            if refused.status in (400, 404, 405, 406, 415) and not (not probing and self._eras.is_pinned(self.name)):
                return None
            raise
        answer = reply.message
        if not isinstance(answer, dict) or "error" in answer or not isinstance(answer.get("result"), dict):
            if self._eras.is_pinned(self.name):
                raise BackendProtocolError(self.name, f"backend {self.name!r} does not answer server/discover")
            return None
        result = answer["result"]
        versions = result.get("supportedVersions")
        if not isinstance(versions, list) or MODERN_PROTOCOL_VERSION not in versions:
            return None
        capabilities = result.get("capabilities")
        meta = result.get("_meta")
        server_info = meta.get(META_SERVER_INFO) if isinstance(meta, dict) else None
        return Handshake(
            session_id=None,
            protocol_version=MODERN_PROTOCOL_VERSION,
            capabilities=MappingProxyType(dict(capabilities) if isinstance(capabilities, dict) else {}),
            server_info=MappingProxyType(dict(server_info) if isinstance(server_info, dict) else {}),
        )

    def modern_meta(self, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A 2026-07-28 request's ``_meta``: the caller's own keys (a progress token, the
        log level it asked for) with the gateway's revision, capabilities and identity."""
        merged = dict(meta or {})
        merged[META_PROTOCOL_VERSION] = MODERN_PROTOCOL_VERSION
        merged[META_CLIENT_CAPABILITIES] = dict(self._client_capabilities)
        merged[META_CLIENT_INFO] = CLIENT_INFO
        return merged

    def _initialize(self, identity: Identity | None) -> Handshake:
        params = {"protocolVersion": LATEST_PROTOCOL_VERSION, "capabilities": self._client_capabilities,
                  "clientInfo": CLIENT_INFO}
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
                deadline: Deadline, headers: Mapping[str, str] | None = None) -> Exchange:
        """Yield the notifications the backend streams, return its result.

        Raises BackendRpcError when the backend answers with a JSON-RPC error, and another
        BackendError when the exchange fails (which the connection records as its last error).
        """
        try:
            handshake = self._await(self._handshake_future(identity), deadline)
            try:
                result = yield from self.exchange_with(identity, handshake, method, params, deadline, headers)
                if handshake.is_modern and result.get("resultType") == "input_required":
                    yield self._input_required(identity, method, params, result, deadline, headers)
                return result
            except BackendSessionExpired:
                # The backend restarted: re-initialize once, transparently, and retry.
                # (A 404 comes before any streamed event, so nothing was relayed twice.)
                renewed = self._await(self._ask_connection("renew_handshake", identity, handshake.session_id), deadline)
                return (yield from self.exchange_with(identity, renewed, method, params, deadline, headers))
        except (BackendRpcError, BackendCancelled):
            raise  # the backend answered, or the client cancelled: the connection itself is fine
        except BackendError as exc:
            self._tell_connection("exchange_failed", str(exc))
            raise

    def _input_required(self, identity: Identity | None, method: str, params: dict[str, Any] | None,
                        result: dict[str, Any], deadline: Deadline,
                        headers: Mapping[str, str] | None) -> InputRequired:
        base = {key: value for key, value in (params or {}).items() if key not in ("inputResponses", "requestState")}
        requests = result.get("inputRequests")
        state = result.get("requestState")
        if not isinstance(requests, dict) or not all(isinstance(r, dict) for r in requests.values()):
            requests = {}
        if not requests and not isinstance(state, str):
            raise BackendProtocolError(self.name, f"backend {self.name!r} answered input_required with neither "
                                                  "inputRequests nor requestState")

        def retry(responses: Mapping[str, Any]) -> Exchange:
            again: dict[str, Any] = {**base, "inputResponses": dict(responses)}
            if isinstance(state, str):
                again["requestState"] = state
            return self.request(identity, method, again, deadline, headers)

        return InputRequired(self.name, method, MappingProxyType(base), MappingProxyType(requests),
                             state if isinstance(state, str) else None, retry, deadline)

    # -- pooled work ---------------------------------------------------------------------

    def submit(self, identity: Identity | None, method: str, params: dict[str, Any] | None,
               deadline: Deadline, headers: Mapping[str, str] | None = None) -> cf.Future[dict[str, Any]]:
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
            job = run_in_thread(self.call_with, identity, handshake, method, params, deadline, headers)

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
                      params: dict[str, Any] | None, deadline: Deadline | None = None,
                      extra_headers: Mapping[str, str] | None = None) -> Exchange:
        """One exchange on the backend session ``handshake`` names (no renewal here).
        ``extra_headers``: a 2026-07-28 call's ``Mcp-Param-*`` headers."""
        timeout = self.timeout if deadline is None else deadline.cap(self.timeout)
        if timeout <= 0:
            raise BackendTimeout(self.name, f"backend {self.name!r}: the request's deadline passed before the "
                                            f"exchange could start")
        headers = self.headers_for(identity)  # per request: a refreshed caller token is used at once
        if extra_headers and handshake.is_modern:
            headers.update(extra_headers)
        request_id = self._ids.next()
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        params = self._params_for(handshake, method, params, headers)
        if params is not None:
            message["params"] = params
        abort = Abort()

        def cancel(reason: str | None) -> None:
            abort.abort()
            if handshake.is_modern:
                return  # closing the stream is the cancellation in 2026-07-28
            cancelled: dict[str, Any] = {"requestId": request_id}
            if reason:
                cancelled["reason"] = reason
            self._send_later(handshake, headers, {"jsonrpc": "2.0", "method": "notifications/cancelled",
                                                  "params": cancelled})

        yield CallOpened(self.name, cancel)
        exchange = self._client.exchange(
            message,
            session_id=handshake.session_id,
            protocol_version=handshake.protocol_version,
            timeout=timeout,
            extra_headers=headers,
            abort=abort,
        )
        try:
            while True:
                try:
                    streamed = next(exchange)
                except StopIteration as answered:
                    return self._result_of(answered.value, method)
                yield self._incoming(streamed, handshake, headers)
        finally:
            exchange.close()

    def listen(self, identity: Identity | None, handshake: Handshake, abort: Abort,
               resource_uris: frozenset[str] = frozenset()) -> Iterator[Any]:
        """The backend's standalone stream: notifications (dicts) and BackendRequests,
        until the backend ends it or ``abort`` is called. A 2026-07-28 backend's is its
        answer to ``subscriptions/listen`` for every list change and ``resource_uris``."""
        headers = self.headers_for(identity)
        request = None
        if handshake.is_modern:
            request = {"jsonrpc": "2.0", "id": self._ids.next(), "method": "subscriptions/listen",
                       "params": self._params_for(handshake, "subscriptions/listen",
                                                  {"notifications": _listen_filter(resource_uris)}, headers)}
        for message in self._client.listen(session_id=handshake.session_id, protocol_version=handshake.protocol_version,
                                           extra_headers=headers, abort=abort, connect_timeout=self.timeout,
                                           request=request):
            if handshake.is_modern:
                message = _without_subscription_id(message)
                if message.get("method") == "notifications/subscriptions/acknowledged":
                    continue
            yield self._incoming(message, handshake, headers)

    def speaks_modern(self) -> bool:
        """Whether the backend's current handshake is of the 2026-07-28 era."""
        published = self._handshake
        return bool(published is not None and published.done() and published.exception() is None
                    and published.result().is_modern)

    def notify_if_open(self, identity: Identity | None, method: str, params: dict[str, Any] | None = None) -> None:
        """``notify`` on the current backend session, if there is one (a backend not yet
        initialized learns what it needs at its initialize)."""
        published = self._handshake
        if published is not None and published.done() and published.exception() is None:
            self.notify(identity, published.result(), method, params)

    def notify(self, identity: Identity | None, handshake: Handshake, method: str,
               params: dict[str, Any] | None = None) -> None:
        """Send the backend a notification (a client's roots change, say), in the background."""
        if handshake.is_modern:
            return  # 2026-07-28 has no client notifications over HTTP: each request says what it needs
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        try:
            headers = self.headers_for(identity)
        except BackendError as exc:
            logger.debug("not forwarding %s to backend %r: %s", method, self.name, exc)
            return
        self._send_later(handshake, headers, message)

    def call_with(self, identity: Identity | None, handshake: Handshake, method: str,
                  params: dict[str, Any] | None, deadline: Deadline | None = None,
                  extra_headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        """``exchange_with`` for the gateway's own use: notifications dropped, result returned."""
        return drain(self.exchange_with(identity, handshake, method, params, deadline, extra_headers))

    # -- internals -----------------------------------------------------------------------

    def _params_for(self, handshake: Handshake, method: str, params: dict[str, Any] | None,
                    headers: dict[str, str]) -> dict[str, Any] | None:
        """A request's params in the backend's revision. To a 2026-07-28 backend every
        request carries the revision, capabilities and client info in ``_meta`` and mirrors
        its method (and name) in headers (added to ``headers``); to an earlier one the
        2026-07-28 keys of ``_meta`` are not sent."""
        meta = params.get("_meta") if params else None
        if handshake.is_modern:
            params = {**(params or {}), "_meta": self.modern_meta(meta if isinstance(meta, dict) else None)}
            headers[METHOD_HEADER] = method
            named = NAMED_METHODS.get(method)
            if named is not None and isinstance(params.get(named), str):
                headers[NAME_HEADER] = encode_header_value(params[named])
            return params
        if isinstance(meta, dict) and any(key.startswith(META_PREFIX) for key in meta):
            kept = {key: value for key, value in meta.items() if not key.startswith(META_PREFIX)}
            params = {key: value for key, value in params.items() if key != "_meta"}
            if kept:
                params["_meta"] = kept
        return params

    def _incoming(self, message: dict[str, Any], handshake: Handshake, headers: dict[str, str]) -> Any:
        """A streamed message as it goes up: a notification as it is, a request with a way to answer it."""
        if "id" not in message:
            return message
        backend_id = message["id"]
        params = message.get("params")

        def reply(answer: dict[str, Any]) -> None:
            self._send_later(handshake, headers, {"jsonrpc": "2.0", "id": backend_id, **answer})

        return BackendRequest(self.name, message["method"], params if isinstance(params, dict) else {}, reply)

    def _send_later(self, handshake: Handshake, headers: dict[str, str], message: dict[str, Any]) -> None:
        """POST a response or notification to the backend session on a pooled thread (202 expected)."""

        def send() -> None:
            try:
                self._client.post(message, session_id=handshake.session_id,
                                  protocol_version=handshake.protocol_version, timeout=self.timeout,
                                  extra_headers=headers)
            except BackendError as exc:
                logger.debug("backend %r did not take our %s: %s", self.name,
                             message.get("method", "answer"), type(exc).__name__)

        run_in_thread(send)

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


def _listen_filter(resource_uris: frozenset[str]) -> dict[str, Any]:
    wanted: dict[str, Any] = {"toolsListChanged": True, "promptsListChanged": True, "resourcesListChanged": True}
    if resource_uris:
        wanted["resourceSubscriptions"] = sorted(resource_uris)
    return wanted


def _without_subscription_id(message: dict[str, Any]) -> dict[str, Any]:
    """A listen stream's notification as the gateway's clients get it (their own
    subscriptions tag it again)."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or META_SUBSCRIPTION_ID not in meta:
        return message
    rest = {key: value for key, value in meta.items() if key != META_SUBSCRIPTION_ID}
    params = {key: value for key, value in params.items() if key != "_meta"}
    if rest:
        params["_meta"] = rest
    return {**message, "params": params}


def drain(exchange: Exchange) -> dict[str, Any]:
    """Run an exchange to its end, dropping its notifications; its result. There is no
    client to ask on the gateway's own calls, so a backend's request is refused at once."""
    try:
        while True:
            event = next(exchange)
            if isinstance(event, BackendRequest):
                event.reply({"error": {"code": METHOD_NOT_FOUND,
                                       "message": f"{event.method} is not available: no client takes part in "
                                                  "this call (a composite step or the gateway's own request)"}})
            elif isinstance(event, InputRequired):
                asked = ", ".join(sorted({str(r.get("method")) for r in event.requests.values()})) or "input"
                raise BackendRpcError(event.backend, INTERNAL_ERROR,
                                      f"backend {event.backend!r} asked for {asked}, which no client can give here "
                                      "(a composite step or the gateway's own request)")
    except StopIteration as answered:
        return answered.value
    finally:
        exchange.close()
