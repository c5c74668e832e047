"""The MCP endpoint's work below the view: one JSON-RPC message in, one Answer out.

The view does HTTP (checks, body, JSON or SSE writing) and the JSON-RPC envelope; this
decides what a message means: initialize opens a session, ``server/discover`` and the
version header are checked, a session's request is served by its user's actors (revived
from the user record when they were released), within the request's one deadline, with
log messages filtered to the session's own level.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pykka

from vmcp_actors.backends import CallOpened
from vmcp_actors.concurrency import ASK_TIMEOUT, Deadline
from vmcp_actors.config import VmcpConfig
from vmcp_actors.core._dispatch import LOGGING_LEVELS
from vmcp_actors.core._exchange import Notification, ServerRequest
from vmcp_actors.edge._audit import AuditLog, timer, watched
from vmcp_actors.edge._legacy import RequestDeadlines, check_header_version, initialize
from vmcp_actors.edge._modern import (
    REMOVED_METHODS,
    CacheHints,
    ModernCall,
    ModernRequest,
    ParkedCalls,
    StateSeal,
    complete,
    discover_result,
    is_modern_request,
    modern_error,
    principal_of,
    read_modern,
)
from vmcp_actors.edge._relay import Relay, RelayEvent, error_event
from vmcp_actors.identity import Identity
from vmcp_actors.protocol import (
    ACCEPTED_PROTOCOL_HEADER_VERSIONS,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    JsonRpcError,
    Message,
    error_response,
    result_response,
)
from vmcp_actors.protocol.mcp import (
    HEADER_MISMATCH,
    INPUT_REQUIRED_METHODS,
    META_LOG_LEVEL,
    NAMED_METHODS,
    SESSION_HEADER,
    is_logged_at,
    param_header_mismatch,
)
from vmcp_actors.signing import Signer
from vmcp_actors.users._actor import LIST_CHANGED, RESOURCE_UPDATED, UserHandle
from vmcp_actors.users._directory import Directory, Lease
from vmcp_actors.users._gateway import CapReached
from vmcp_actors.users._live import Call, CallStream, ListenStream, LiveSessions
from vmcp_actors.users._records import SessionRecord, UserKey, relayed_capabilities
from vmcp_actors.users._store import StoreUnavailable

logger = logging.getLogger(__name__)


class Unavailable(Exception):
    """The request cannot be served now (503): the actor system did not answer (shutting
    down or overloaded), a cap is reached with nothing idle, or records cannot be read."""

    def __init__(self, message: str = "", retry_after: int | None = None, data: dict[str, Any] | None = None):
        super().__init__(message or _UNAVAILABLE)
        self.message = message or _UNAVAILABLE
        self.retry_after = retry_after
        self.data = data

    @classmethod
    def at_cap(cls, reached: CapReached) -> Unavailable:
        what = ("serves as many users at once as it may and every one has a request in flight"
                if reached.cap.endswith("maxLiveUsers")
                else "holds as many sessions as it may and every one is in use")
        return cls(f"Service Unavailable: the gateway {what}; retry later", CAP_RETRY_AFTER,
                   {"limit": reached.cap.rsplit(".", 1)[-1]})

    @classmethod
    def store_down(cls) -> Unavailable:
        """The record store (Redis) cannot be reached: retry in a second."""
        return cls("Service Unavailable: session storage cannot be reached; retry", 1)

    def refuse(self, answer: Answer, request_id: Any = None) -> Answer:
        """``answer`` made this 503 (its close hooks kept: the lease still ends)."""
        error = JsonRpcError(INTERNAL_ERROR, self.message, self.data)
        answer.status, answer.body = 503, error_response(request_id, error)
        if self.retry_after is not None:
            answer.headers["Retry-After"] = str(self.retry_after)
        return answer


@dataclass
class Answer:
    """What to send back: the events of a relay (the first final one makes it JSON, else
    SSE), or one JSON body, or only a status. ``close()`` must run once the response is
    done, however it ends (the view registers it as the response's close hook)."""

    status: int = 200
    body: dict[str, Any] | None = None
    events: Iterator[RelayEvent] | None = None
    stream: Iterator[dict[str, Any] | None] | None = None  # a standalone stream: messages, None to keep alive
    replay: Iterator[str | None] | None = None  # a resumed call stream: encoded events, None to keep alive
    resumable: Callable[[], CallStream] | None = None  # makes an SSE answer resumable (2025-11-25 sessions)
    live: LiveSessions | None = None
    headers: dict[str, str] = field(default_factory=dict)
    session_id: str | None = None
    on_close: list[Callable[[], None]] = field(default_factory=list)
    served_by: UserHandle | None = None  # the user whose actors served it (for the audit log)

    def close(self) -> None:
        callbacks, self.on_close = self.on_close, []
        for callback in callbacks:
            callback()


def _error(status: int, code: int, message: str, request_id: Any = None) -> Answer:
    return Answer(status, error_response(request_id, JsonRpcError(code, message)))


def _not_in_modern(method: str) -> Answer:
    answer = _error(405, INVALID_REQUEST, f"Method Not Allowed: {method} has no meaning in MCP 2026-07-28 "
                                          "(streams come from subscriptions/listen; there are no sessions)")
    answer.headers["Allow"] = "POST"
    return answer


# Call answers are resumable (event ids, a priming event) from this revision on.
RESUMABLE_SINCE = "2025-11-25"
_UNAVAILABLE = "Service Unavailable: the gateway is shutting down or overloaded"
# Seconds a client refused at a cap is told to wait: sessions and users go idle in seconds.
CAP_RETRY_AFTER = 5


class McpService:
    def __init__(self, config: VmcpConfig, gateway: Any, directory: Directory, signer: Signer,
                 live: LiveSessions | None = None, parked: ParkedCalls | None = None):
        self._config = config
        self._draining = threading.Event()  # set once, on SIGTERM
        self._audit = AuditLog(config.audit)
        self._live = live if live is not None else LiveSessions()
        self._gateway = gateway  # ActorProxy[Gateway]
        self._directory = directory
        self._signer = signer
        self._deadlines = RequestDeadlines(config)
        self._seal = StateSeal(signer)
        self._parked = parked if parked is not None else ParkedCalls()
        self._cache_hints = cache_hints_for(config)

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def drain(self) -> None:
        """SIGTERM: refuse new sessions, end the standalone streams (their clients reopen
        them elsewhere: a stream would hold the process for the whole grace period), let
        the calls in flight finish."""
        self._draining.set()
        closed = self._live.close_streams()
        if closed:
            logger.info("draining: %d standalone stream(s) ended; their clients reconnect elsewhere", closed)

    @property
    def parked(self) -> ParkedCalls:
        return self._parked

    def post(self, message: Message, identity: Identity | None, session_id: str | None,
             header_version: str | None, method_header: str | None = None, name_header: str | None = None,
             param_headers: dict[str, str] | None = None) -> Answer:
        elapsed = timer()
        answer = self._post(message, identity, session_id, header_version, method_header, name_header, param_headers)
        event_type = self._audit.event_type(message.method) if message.is_request else None
        if event_type is None:
            return answer
        seen: list[RelayEvent] = []
        if answer.events is not None:
            answer.events = watched(answer.events, seen)

        def write() -> None:
            final = seen[-1] if seen else None
            self._audit.write(event_type, identity=identity, session_id=session_id or answer.session_id,
                              method=message.method or "", params=message.params,
                              backend=_backend_of(answer.served_by, identity, message),
                              answer=final.message if final is not None else answer.body,
                              http_status=final.http_status if final is not None else answer.status,
                              seconds=elapsed())

        answer.on_close.insert(0, write)  # before the lease ends (the user may be released after)
        return answer

    def _post(self, message: Message, identity: Identity | None, session_id: str | None,
              header_version: str | None, method_header: str | None, name_header: str | None,
              param_headers: dict[str, str] | None) -> Answer:
        if message.method == "server/discover" or is_modern_request(header_version, ACCEPTED_PROTOCOL_HEADER_VERSIONS,
                                                                     session_id):
            return self._post_modern(message, identity,
                                     {"version": header_version, "method": method_header, "name": name_header},
                                     param_headers or {})
        if message.is_request and message.method == "initialize":
            refused = check_header_version(header_version, None)
            if refused is not None:
                return Answer(refused.http_status, error_response(None, refused))
            return self._initialize(message, identity)
        lease, answer = self._begin(session_id, identity, header_version, message.id)
        if lease is None:
            return answer
        assert session_id is not None
        if message.kind == "response":
            refused = self._live.answer(session_id, message)  # to a request the gateway sent this client
            answer.status = 202 if refused is None else 400
            answer.body = None if refused is None else error_response(None, refused)
            return answer
        if message.kind == "notification" and message.method == "notifications/cancelled":
            params = message.params if isinstance(message.params, dict) else {}
            reason = params.get("reason")
            self._live.cancel(session_id, params.get("requestId"), reason if isinstance(reason, str) else None)
            answer.status = 202
            return answer
        if message.kind == "notification" and message.method != "notifications/roots/list_changed":
            answer.status = 202  # nothing else a client notifies needs the gateway
            return answer
        try:
            user = lease.user or self._revive(lease, identity, answer)
            if not lease.attached:
                self._ask(user.proxy.attach_session(session_id, identity))
                self._directory.mark_attached(session_id)
        except Unavailable as unavailable:
            return unavailable.refuse(answer, message.id)
        if not message.is_request:  # the client's roots changed: every backend session hears it
            user.backends.notify_backends(identity, message.method, None)
            answer.status = 202
            return answer
        answer.served_by = user
        answer.events = self._dispatch(user, lease, message, identity)
        if lease.session.protocol_version >= RESUMABLE_SINCE:
            answer.resumable = lambda: self._live.open_call_stream(session_id)
            answer.live = self._live
        return answer

    def open_stream(self, session_id: str | None, identity: Identity | None, header_version: str | None,
                    last_event_id: str | None = None) -> Answer:
        """``GET /mcp``: the session's standalone stream, held open until the client leaves
        (a newer stream of the same session replaces it); with ``Last-Event-ID``, the rest
        of a call's answer whose connection dropped."""
        if is_modern_request(header_version, ACCEPTED_PROTOCOL_HEADER_VERSIONS, session_id):
            return _not_in_modern("GET")
        lease, answer = self._begin(session_id, identity, header_version)
        if lease is None:
            return answer
        assert session_id is not None
        if last_event_id:
            found = self._live.resume(session_id, last_event_id)
            if found is None:
                answer.status = 404
                answer.body = error_response(None, JsonRpcError(INVALID_REQUEST, "Not Found: no stream of this session "
                                                                "to resume from that event id (unknown or expired)"))
                return answer
            call_stream, after = found
            answer.replay = call_stream.replay(after)
            return answer
        stream = self._live.open_stream(session_id)
        if stream is None:
            answer.status = 405
            answer.body = error_response(None, JsonRpcError(INVALID_REQUEST, "Method Not Allowed: this process holds "
                                                            "as many standalone streams as it can; calls work as before"))
            answer.headers["Allow"] = "POST, DELETE"
            return answer
        try:
            user = lease.user or self._revive(lease, identity, answer)
            self._ask(user.proxy.stream_opened(session_id, identity))
        except Unavailable as unavailable:
            self._live.close_stream(stream)
            return unavailable.refuse(answer)

        def closed() -> None:
            if self._live.close_stream(stream):
                try:
                    user.proxy.stream_closed(session_id)
                except pykka.ActorDeadError:
                    pass

        answer.on_close.insert(0, closed)
        answer.stream = stream.messages()
        return answer

    def delete(self, session_id: str | None, identity: Identity | None, header_version: str | None = None) -> Answer:
        if is_modern_request(header_version, ACCEPTED_PROTOCOL_HEADER_VERSIONS, session_id):
            return _not_in_modern("DELETE")
        if not session_id:
            return _error(400, INVALID_REQUEST, f"Bad Request: missing {SESSION_HEADER} header")
        if not self._signer.is_session_id(session_id):
            return _error(404, INVALID_REQUEST, "Session not found")
        try:
            ended = self._ask(self._gateway.end_session(session_id, identity))
        except Unavailable as unavailable:
            return unavailable.refuse(Answer())
        return Answer(200) if ended else _error(404, INVALID_REQUEST, "Session not found")

    # -- 2026-07-28: no session, the caller's user actor serves each request ---------------

    def _post_modern(self, message: Message, identity: Identity | None, headers: dict[str, str | None],
                     param_headers: dict[str, str]) -> Answer:
        if message.kind == "response":
            return _error(400, INVALID_REQUEST, "Bad Request: a 2026-07-28 client sends no responses (input goes "
                                                "in inputResponses on a retry)")
        try:
            request = read_modern(message, headers)
        except JsonRpcError as refused:
            return Answer(refused.http_status, error_response(message.id, refused))
        if not message.is_request:
            return Answer(202)  # 2026-07-28 defines no client notifications over HTTP: nothing to do
        if message.method == "server/discover":
            return Answer(body=result_response(message.id, discover_result(self._config.name)))
        if message.method in REMOVED_METHODS:
            refused = JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {message.method} (not part of "
                                                     f"{request.version})", http_status=404)
            return Answer(404, error_response(message.id, refused))
        key = UserKey.of(identity, request.client_capabilities)
        answer = Answer()
        try:
            user = self._hold_user(key, identity, request, answer)
        except Unavailable as unavailable:
            return unavailable.refuse(answer, message.id)
        answer.served_by = user
        if message.method == "subscriptions/listen":
            return self._listen(message, request, identity, user, answer)
        params = message.params if isinstance(message.params, dict) else {}
        named = NAMED_METHODS.get(message.method or "")
        name = params.get(named) if named else None
        deadline = self._deadlines.for_request(message)
        method = message.method or ""

        def shape(result: dict[str, Any]) -> dict[str, Any]:
            hints = self._cache_hints
            fresh_for = user.backends.freshness_ms()
            if fresh_for is not None and fresh_for < hints.list_ttl_ms:  # a backend's own hint bounds ours
                hints = replace(hints, list_ttl_ms=fresh_for)
            return complete(result, method, self._config.name, hints)

        def heard(notification: Notification) -> None:
            try:
                if notification.method == RESOURCE_UPDATED:
                    user.proxy.resource_updated(notification.message, None)
                else:
                    user.proxy.backend_changed(notification.origin)
            except pykka.ActorDeadError:
                pass

        call = ModernCall(message.id, method, name, request, principal_of(key), self._seal, self._parked, shape,
                          heard, deadline)
        try:
            if request.request_state is not None:
                answer.events = self._continue(call, message, request, identity, user, key, name, deadline)
                return answer
            if method == "tools/call" and isinstance(name, str):
                self._check_param_headers(user, identity, name, params.get("arguments"), param_headers, deadline)
            if request.input_responses is not None:
                # Answers without a state of ours (the backend asked without one, or the client
                # offers them up front) go to the backend that serves the name, if it is modern.
                exchange = self._unsolicited_input(user, identity, message, request, name, deadline)
                if exchange is not None:
                    answer.events = call.events(Relay.streaming(message.id, exchange))
                    return answer
            dispatched = replace(message, params=request.params_for_dispatch(message.params))
            relay = user.dispatcher.handle(identity, dispatched, deadline)
        except JsonRpcError as error:
            shaped = modern_error(error)
            answer.status, answer.body = shaped.http_status, error_response(message.id, shaped)
            return answer
        except Exception as error:  # noqa: BLE001 - the client gets an answer whatever happened
            logger.error("request failed unexpectedly: %s", error.__class__.__name__, exc_info=error)
            answer.status, answer.body = 500, error_response(message.id, JsonRpcError(INTERNAL_ERROR, "Internal error"))
            return answer
        answer.events = call.events(relay)
        return answer

    @staticmethod
    def _unsolicited_input(user: UserHandle, identity: Identity | None, message: Message, request: ModernRequest,
                           name: Any, deadline: Deadline) -> Any:
        """The exchange that hands ``inputResponses`` sent without a requestState to the
        2026-07-28 backend serving the tool, prompt or resource; None when there is none
        (the answers are then ignored, as the specification lets a server do)."""
        if not isinstance(name, str):
            return None
        params = message.params if isinstance(message.params, dict) else {}
        found = _looked_up(user, identity, message.method or "", name, deadline)
        if message.method == "resources/read":
            backend = found
            forwarded: dict[str, Any] = {"uri": name}
        else:
            route = found
            backend = route.backend if route is not None else None
            forwarded = {"name": route.original_name if route is not None else name,
                         "arguments": params.get("arguments") or {}}
        if backend is None or not user.backends.speaks_modern(backend):
            return None
        meta = dict(request.meta or {})
        if request.log_level is not None:
            meta[META_LOG_LEVEL] = request.log_level
        if meta:
            forwarded["_meta"] = meta
        forwarded["inputResponses"] = dict(request.input_responses or {})
        return user.backends.resume(identity, backend, message.method or "", forwarded, deadline)

    @staticmethod
    def _check_param_headers(user: UserHandle, identity: Identity | None, name: str, arguments: Any,
                             received: dict[str, str], deadline: Deadline) -> None:
        """A tool whose inputSchema marks arguments with ``x-mcp-header``: each such
        argument must come mirrored, and equal, in its ``Mcp-Param-*`` header (-32020)."""
        tool = next((t for t in user.capabilities.list_tools(identity, deadline) if t.get("name") == name), None)
        if tool is None:
            return  # the dispatcher answers an unknown tool
        problem = param_header_mismatch(tool.get("inputSchema"), arguments, received)
        if problem is not None:
            raise JsonRpcError(HEADER_MISMATCH, f"Header mismatch: {problem}", http_status=400)

    def _continue(self, call: ModernCall, message: Message, request: ModernRequest, identity: Identity | None,
                  user: UserHandle, key: UserKey, name: Any, deadline: Deadline) -> Iterator[RelayEvent]:
        """A retry carrying the gateway's requestState: the parked call it names goes on,
        or the backend it names is asked again with the client's input."""
        assert request.request_state is not None and message.method is not None
        state = self._seal.open(request.request_state, principal_of(key), message.method, name)
        if state["k"] == "c":
            parked = self._parked.take(state.get("c"))
            if parked is None:
                elsewhere = state.get("w") != self._seal.worker
                raise JsonRpcError(INVALID_PARAMS, "Invalid requestState: the call it continues "
                                   + ("is held by another gateway process (a legacy backend's or a composite "
                                      "tool's call waits where it started); retry the original request without it"
                                      if elsewhere else "is no longer waiting (it was answered, or its deadline "
                                      "passed); retry the original request without it"))
            return call.resume(parked)
        if not isinstance(name, str) or _looked_up(user, identity, message.method, name, deadline) is None:
            # Policies are asked again: a grant withdrawn since the first round holds now.
            what = "Resource not found" if message.method == "resources/read" else \
                f"Unknown {'tool' if message.method == 'tools/call' else 'prompt'}: {name}"
            raise JsonRpcError(INVALID_PARAMS, what)  # -32602 for every not-found in 2026-07-28
        params = message.params if isinstance(message.params, dict) else {}
        target = state.get("t")
        backend_params: dict[str, Any] = {"uri": target} if message.method == "resources/read" else \
            {"name": target, "arguments": params.get("arguments") or {}}
        if request.meta:
            backend_params["_meta"] = dict(request.meta)
        if request.log_level is not None:
            backend_params.setdefault("_meta", {})[META_LOG_LEVEL] = request.log_level
        backend_params["inputResponses"] = dict(request.input_responses or {})
        if isinstance(state.get("s"), str):
            backend_params["requestState"] = state["s"]
        exchange = user.backends.resume(identity, str(state.get("b")), message.method, backend_params, deadline)
        return call.events(Relay.streaming(message.id, exchange))

    def _listen(self, message: Message, request: ModernRequest, identity: Identity | None, user: UserHandle,
                answer: Answer) -> Answer:
        """``subscriptions/listen``: the list changes and resource updates the client opted
        in to, on this request's stream until the client closes it."""
        params = message.params if isinstance(message.params, dict) else {}
        wanted = params.get("notifications", {})
        uris = wanted.get("resourceSubscriptions", []) if isinstance(wanted, dict) else None
        if not isinstance(wanted, dict) or not isinstance(uris, list) or not all(isinstance(u, str) for u in uris):
            refused = modern_error(JsonRpcError(INVALID_PARAMS, "notifications must be an object; "
                                                                "resourceSubscriptions a list of URIs"))
            answer.status, answer.body = refused.http_status, error_response(message.id, refused)
            return answer
        listen_id = f"listen:{secrets.token_hex(12)}"
        deadline = Deadline.after(ASK_TIMEOUT)
        subscribed = []
        for uri in dict.fromkeys(uris):
            try:
                user.capabilities.subscribe_resource(identity, listen_id, uri, deadline)
                subscribed.append(uri)
            except JsonRpcError as error:
                logger.debug("listen: not subscribing to a resource: %s", error.message)
        agreed: dict[str, Any] = {flag: True for flag in ("toolsListChanged", "promptsListChanged",
                                                          "resourcesListChanged") if wanted.get(flag) is True}
        if subscribed:
            agreed["resourceSubscriptions"] = subscribed
        stream = self._live.open_stream(listen_id, ListenStream(listen_id, message.id, agreed))
        if stream is None:
            self._unsubscribe_all(user, identity, listen_id, subscribed)
            answer.status, answer.body = 503, error_response(message.id, JsonRpcError(
                INTERNAL_ERROR, "Service Unavailable: this process holds as many streams as it can"))
            return answer
        try:
            self._ask(user.proxy.stream_opened(listen_id, identity))
        except Unavailable as unavailable:
            self._live.close_stream(stream)
            return unavailable.refuse(answer, message.id)

        def closed() -> None:
            assert isinstance(stream, ListenStream)
            stream.client_left()
            self._live.close_stream(stream)
            try:
                user.proxy.stream_closed(listen_id)
            except pykka.ActorDeadError:
                pass
            self._unsubscribe_all(user, identity, listen_id, subscribed)

        answer.on_close.insert(0, closed)
        answer.stream = stream.messages()
        return answer

    @staticmethod
    def _unsubscribe_all(user: UserHandle, identity: Identity | None, subscriber: str, uris: list[str]) -> None:
        deadline = Deadline.after(ASK_TIMEOUT)
        for uri in uris:
            try:
                user.capabilities.unsubscribe_resource(identity, subscriber, uri, deadline)
            except JsonRpcError:
                pass

    def _hold_user(self, key: UserKey, identity: Identity | None, request: ModernRequest,
                   answer: Answer) -> UserHandle:
        """The caller's user actor (started or revived when it is not live), held until
        the answer is done."""
        user = self._directory.hold_user(key)
        for _ in range(2):  # released again between the start and the hold: once more
            if user is not None:
                answer.on_close.append(lambda: self._directory.finish("", key))
                return user
            self._ask(self._gateway.serve_user(key, identity, relayed_capabilities(request.client_capabilities)))
            user = self._directory.hold_user(key)
        raise Unavailable()

    # -- internals -----------------------------------------------------------------------

    def _begin(self, session_id: str | None, identity: Identity | None, header_version: str | None,
               request_id: Any = None) -> tuple[Lease | None, Answer]:
        """The caller's session held for this request (released in the answer's close
        hook) and its version header checked; or no lease and the refusal."""
        if not session_id:
            return None, _error(400, INVALID_REQUEST, f"Bad Request: missing {SESSION_HEADER} header", request_id)
        lease = self._directory.begin(session_id, identity) if self._signer.is_session_id(session_id) else None
        if lease is None:  # a forged id is refused here, before any lookup
            refused = _error(404, INVALID_REQUEST, "Session not found", request_id)
            refused.session_id = session_id
            return None, refused
        answer = Answer(session_id=session_id)
        held_user = lease.user.key if lease.user is not None else None
        answer.on_close.append(lambda: self._directory.finish(session_id, held_user))
        refused_version = check_header_version(header_version, lease.session.protocol_version)
        if refused_version is not None:
            answer.status, answer.body = refused_version.http_status, error_response(None, refused_version)
            return None, answer
        return lease, answer

    def _initialize(self, message: Message, identity: Identity | None) -> Answer:
        try:
            outcome = initialize(message.params)
        except JsonRpcError as error:
            return Answer(body=error_response(message.id, error))
        if self._draining.is_set():
            return Unavailable("Service Unavailable: this gateway process is shutting down; initialize again "
                               "(another process serves new sessions)", 1).refuse(Answer(), message.id)
        try:
            record = self._ask(self._gateway.open_session(identity, outcome))
        except Unavailable as unavailable:
            return unavailable.refuse(Answer(), message.id)
        return Answer(body=result_response(message.id, outcome.result(self._config.name)),
                      headers={SESSION_HEADER: record.session_id}, session_id=record.session_id)

    def _revive(self, lease: Lease, identity: Identity | None, answer: Answer) -> UserHandle:
        """Revive the user's released actors and hold them for this request."""
        key = lease.session.user
        for _ in range(2):  # released again between the revival and the hold: once more
            self._ask(self._gateway.revive_user(key, identity))
            user = self._directory.hold_user(key)
            if user is not None:
                answer.on_close.append(lambda: self._directory.finish("", key))
                return user
        raise Unavailable()

    def _dispatch(self, user: UserHandle, lease: Lease, message: Message,
                  identity: Identity | None) -> Iterator[RelayEvent]:
        deadline = self._deadlines.for_request(message)
        record = lease.session
        if message.method == "logging/setLevel" and isinstance(message.params, dict) \
                and message.params.get("level") in LOGGING_LEVELS:
            # The session keeps its own level; the user's backends send the most verbose
            # level any of its sessions asked for, and each session gets only its own.
            forwarded = self._directory.set_log_level(record.session_id, message.params["level"])
            message = replace(message, params={**message.params, "level": forwarded})
        elif message.method in INPUT_REQUIRED_METHODS and isinstance(message.params, dict) \
                and isinstance(message.params.get("_meta", {}), dict):
            # A 2026-07-28 backend hears a level per request, not from logging/setLevel (a
            # 2025 backend is not sent the key). A session that set none gets everything, as
            # from a 2025 backend; the Relay filters to the session's level either way.
            meta = {**message.params.get("_meta", {}), META_LOG_LEVEL: record.log_level or LOGGING_LEVELS[0]}
            message = replace(message, params={**message.params, "_meta": meta})
        call = self._live.begin_call(record.session_id, message.id)
        try:
            relay = user.dispatcher.handle(identity, message, deadline, record.session_id)
        except Exception as error:  # noqa: BLE001 - the client gets an answer whatever happened
            logger.error("request failed unexpectedly: %s", error.__class__.__name__, exc_info=error)
            self._live.end_call(call)
            return _only(error_event(message.id, JsonRpcError(INTERNAL_ERROR, "Internal error")))
        return relay.events(_ClientCall(self._live, record, call, deadline, user))

    def _ask(self, future: Any) -> Any:
        try:
            return future.get(timeout=ASK_TIMEOUT)
        except (pykka.ActorDeadError, pykka.Timeout):
            raise Unavailable() from None
        except CapReached as reached:
            raise Unavailable.at_cap(reached) from None
        except StoreUnavailable as error:
            logger.warning("%s", error)
            raise Unavailable.store_down() from None


def _backend_of(user: UserHandle | None, identity: Identity | None, message: Message) -> str | None:
    """For the audit log: the backend that serves the request's target, if it is known."""
    params = message.params if isinstance(message.params, dict) else {}
    name = params.get("uri" if message.method == "resources/read" else "name")
    if user is None or not isinstance(name, str):
        return None
    try:
        found = _looked_up(user, identity, message.method or "", name, Deadline.after(1.0))
    except Exception:  # noqa: BLE001 - the line is written without it
        return None
    return found if isinstance(found, str) or found is None else getattr(found, "backend", None)


def _only(event: RelayEvent) -> Iterator[RelayEvent]:
    """One event as the relay's kind of iterator (a generator: the view closes it)."""
    yield event


def _looked_up(user: UserHandle, identity: Identity | None, method: str, name: str, deadline: Deadline) -> Any:
    """What the user's outermost layer finds for a request's target: the resource's backend
    for ``resources/read``, else the tool's or prompt's route; None when it is not there."""
    capabilities = user.capabilities
    if method == "resources/read":
        return capabilities.lookup_resource(identity, name, deadline)
    lookup = capabilities.lookup_tool if method == "tools/call" else capabilities.lookup_prompt
    return lookup(identity, name, deadline)


def cache_hints_for(config: VmcpConfig) -> CacheHints:
    """Lists stay fresh as long as the discovery cache keeps a catalog; answers are
    ``private`` whenever who asks can change them (incoming authentication, per-user
    outgoing credentials, passthrough headers)."""
    outgoing = config.outgoing_auth
    per_caller = (config.incoming_auth.type != "anonymous" or bool(outgoing.passthrough_headers)
                  or any(auth.type == "token_exchange" for auth in (outgoing.default, *outgoing.backends.values())))
    return CacheHints(int(config.operational.discovery_cache_ttl * 1000), "private" if per_caller else "public")


class _ClientCall:
    """A client session's side of one call (see ``ClientSide``): the session's log level
    and subscriptions decide what it hears, requests for the client get the session's
    own ids, list changes and resource updates go through the user (to every session
    they concern, once)."""

    def __init__(self, live: LiveSessions, session: SessionRecord, call: Call, deadline: Deadline, user: UserHandle):
        self._live = live
        self._session = session
        self._call = call
        self._deadline = deadline
        self._user = user

    def keep(self, notification: Notification) -> bool:
        method = notification.method
        try:
            if method in LIST_CHANGED:
                self._user.proxy.backend_changed(notification.origin)  # the gateway tells clients after the rebuild
                return False
            if method == RESOURCE_UPDATED:
                params = notification.message.get("params")
                subscribed = isinstance(params, dict) and params.get("uri") in self._session.subscriptions
                self._user.proxy.resource_updated(notification.message, self._session.session_id if subscribed else None)
                return subscribed
        except pykka.ActorDeadError:
            return False
        return is_logged_at(notification.message, self._session.log_level)

    def ask(self, request: ServerRequest) -> dict[str, Any] | None:
        return self._live.ask(self._session.session_id, request, self._session.client_capabilities, self._deadline,
                              self._call)

    def opened(self, event: CallOpened) -> None:
        self._live.call_opened(self._call, event.cancel)

    def finished(self) -> None:
        self._live.end_call(self._call)
