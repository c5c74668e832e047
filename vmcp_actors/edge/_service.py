"""The MCP endpoint below the view: one JSON-RPC message in, one Answer out.

The view does HTTP (checks, body, writing JSON or SSE) and the envelope; this decides what
a message means and runs it. Each request is classified by its revision: a 2025 one is
served in its session (``initialize`` opens one), a 2026-07-28 one by its caller's user
with no session. Either way the request starts here, within its one deadline, under one
error policy (``_answering``), and everything it holds is its ``RequestLifetime``'s; a
call is run by the one driver (``edge._driver``) with the client side of its revision.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import pykka

from vmcp_actors.concurrency import ASK_TIMEOUT, Deadline
from vmcp_actors.config import VmcpConfig
from vmcp_actors.core._dispatch import resume
from vmcp_actors.core._exchange import SESSION_ENDED, Notification
from vmcp_actors.core._interface import Continuation, reachable
from vmcp_actors.core._tasks import declares_tasks, tasks_extension_required
from vmcp_actors.edge._audit import AuditLog, timer
from vmcp_actors.edge._driver import CallRun, drive, response_for, started
from vmcp_actors.edge._legacy import RequestDeadlines, SessionSide, check_header_version
from vmcp_actors.edge._lifetime import (
    Answer,
    RequestLifetime,
    answer_call,
    replayed,
    settled,
    sse_text,
)
from vmcp_actors.edge._modern import (
    REMOVED_METHODS,
    CacheHints,
    ModernRequest,
    ParkedCalls,
    StatelessSide,
    StateSeal,
    WatchHangup,
    complete,
    discover_result,
    is_modern_request,
    modern_error,
    principal_of,
    read_modern,
)
from vmcp_actors.edge._task_watch import TaskWatch, finished
from vmcp_actors.identity import Identity, identity_key
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
from vmcp_actors.protocol.lifecycle import initialize
from vmcp_actors.protocol.mcp import (
    HEADER_MISMATCH,
    INPUT_REQUIRED_METHODS,
    LOGGING_LEVELS,
    META_LOG_LEVEL,
    NAMED_METHODS,
    SESSION_HEADER,
    param_header_mismatch,
)
from vmcp_actors.signing import Signer
from vmcp_actors.users import (
    CapReached,
    Directory,
    Lease,
    LiveSessions,
    StoreUnavailable,
    UserHandle,
    UserKey,
)
from vmcp_actors.users._actor import RESOURCE_UPDATED
from vmcp_actors.users._live import STREAMS_PER_IDENTITY, ListenStream, StreamShareReached
from vmcp_actors.users._records import SessionRecord, relayed_capabilities

logger = logging.getLogger(__name__)

# Call answers are resumable (event ids, a priming event) from this revision on.
RESUMABLE_SINCE = "2025-11-25"
_UNAVAILABLE = "Service Unavailable: the gateway is shutting down or overloaded"
# Seconds a client refused at a cap is told to wait: sessions and users go idle in seconds.
CAP_RETRY_AFTER = 5
STREAM_OPENING = ": stream open\n\n"  # a comment first: headers and a byte now, so the client knows it listens


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

    def answer(self, lifetime: RequestLifetime, request_id: Any = None) -> Answer:
        answer = settled(lifetime, 503, error_response(request_id, JsonRpcError(INTERNAL_ERROR, self.message,
                                                                                self.data)))
        if self.retry_after is not None:
            answer.headers["Retry-After"] = str(self.retry_after)
        return answer


# How many resources or tasks one listen stream may name, and when a caller refused a
# stream (its share is taken) may try again.
MAX_LISTENED = 100
STREAM_RETRY_AFTER = 5


def _refusal(status: int, message: str) -> JsonRpcError:
    return JsonRpcError(INVALID_REQUEST, message, http_status=status)


class McpService:
    def __init__(self, config: VmcpConfig, gateway: Any, directory: Directory, signer: Signer,
                 live: LiveSessions | None = None, parked: ParkedCalls | None = None,
                 remembered_instructions: Callable[[], str | None] | None = None, audit: AuditLog | None = None):
        """``remembered_instructions``: what the backends said in their last handshakes;
        ``audit``: the process's audit log (else one of its own)."""
        self._config = config
        self._remembered_instructions = remembered_instructions
        self._draining = threading.Event()  # set once, on SIGTERM
        self._audit = audit if audit is not None else AuditLog(config.audit)
        self.audit_oauth = self._audit.write_oauth
        self.audit_connection = self._audit.write_connection
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
    def store(self) -> Any:
        """The record store (read on request threads, never in an actor's loop)."""
        return self._directory.store

    @property
    def parked(self) -> ParkedCalls:
        return self._parked

    def stop(self) -> None:
        """The process stops: calls waiting for a client's retry end, their backends told."""
        self._parked.end_all()

    # -- POST ----------------------------------------------------------------------------

    def post(self, message: Message, identity: Identity | None, session_id: str | None,
             header_version: str | None, method_header: str | None = None, name_header: str | None = None,
             param_headers: dict[str, str] | None = None, watch_hangup: WatchHangup | None = None) -> Answer:
        """``watch_hangup``: how to learn that the client closed the request's connection
        (a 2026-07-28 client's cancellation)."""
        modern = message.method == "server/discover" or is_modern_request(
            header_version, ACCEPTED_PROTOCOL_HEADER_VERSIONS, session_id)
        if not modern and message.is_request and message.method == "initialize":
            return self._initialize(message, identity, header_version)
        lifetime = RequestLifetime(self._directory, None if modern else session_id)
        event_type = self._audit.event_type(message.method) if message.is_request else None
        if event_type is not None:
            lifetime.audited_by(self._auditor(event_type, message, identity, session_id, timer()))
        if modern:
            headers = {"version": header_version, "method": method_header, "name": name_header}
            return self._answering(lifetime, message.id, True, lambda: self._post_stateless(
                message, identity, headers, param_headers or {}, lifetime, watch_hangup))
        return self._answering(lifetime, message.id, False, lambda: self._post_in_session(
            message, identity, session_id, header_version, lifetime))

    def _answering(self, lifetime: RequestLifetime, request_id: Any, modern: bool,
                   work: Callable[[], Answer]) -> Answer:
        """The one error policy: whatever goes wrong before the answer, the client gets a
        clean JSON-RPC error and the request lets go of what it held."""
        try:
            return work()
        except Unavailable as refusal:
            return refusal.answer(lifetime, request_id)
        except StreamShareReached:
            answer = settled(lifetime, 429, error_response(request_id, JsonRpcError(
                INTERNAL_ERROR, f"Too Many Requests: this caller holds {STREAMS_PER_IDENTITY} streams of this "
                                "process already; close one, or retry later", {"retryAfterSeconds": STREAM_RETRY_AFTER})))
            answer.headers["Retry-After"] = str(STREAM_RETRY_AFTER)
            return answer
        except StoreUnavailable as error:
            logger.warning("%s", error)
            return Unavailable.store_down().answer(lifetime, request_id)
        except JsonRpcError as error:
            shaped = modern_error(error) if modern else error
            return settled(lifetime, shaped.http_status, error_response(request_id, shaped))
        except Exception as error:  # noqa: BLE001 - the client gets an answer whatever happened
            logger.error("request failed unexpectedly: %s", error.__class__.__name__, exc_info=error)
            return settled(lifetime, 500, error_response(request_id, JsonRpcError(INTERNAL_ERROR, "Internal error")))

    # -- 2025: sessions --------------------------------------------------------------------

    def _initialize(self, message: Message, identity: Identity | None, header_version: str | None) -> Answer:
        refused = check_header_version(header_version, None)
        if refused is not None:
            return Answer(refused.http_status, error_response(None, refused))
        try:
            outcome = initialize(message.params)
        except JsonRpcError as error:
            return Answer(body=error_response(message.id, error))
        lifetime = RequestLifetime(self._directory)
        if self._draining.is_set():
            return Unavailable("Service Unavailable: this gateway process is shutting down; initialize again "
                               "(another process serves new sessions)", 1).answer(lifetime, message.id)

        def open_session() -> Answer:
            # The store is written here, on the request's thread; the Gateway only decides. A
            # new session is a new user (its own backend sessions): there is no record to read.
            record = self._ask(self._gateway.admit_session(identity, outcome))
            try:
                self._directory.store.put_session(record)
            except BaseException:
                self._directory.forget_unwritten(record.session_id)  # no phantom session holds a place
                raise
            result = outcome.result(self._config.name)
            instructions = self._instructions()
            if instructions is not None:
                result["instructions"] = instructions
            return Answer(body=result_response(message.id, result),
                          headers={SESSION_HEADER: record.session_id}, session_id=record.session_id)

        return self._answering(lifetime, message.id, False, open_session)

    def _leased(self, session_id: str | None, identity: Identity | None, header_version: str | None,
                lifetime: RequestLifetime) -> Lease:
        """The caller's session held for the request, its version header checked."""
        if not session_id:
            raise _refusal(400, f"Bad Request: missing {SESSION_HEADER} header")
        lease = lifetime.lease(session_id, identity) if self._signer.is_session_id(session_id) else None
        if lease is None:  # a forged id is refused before any lookup; another person's is missing
            raise _refusal(404, "Session not found")
        refused = check_header_version(header_version, lease.session.protocol_version)
        if refused is not None:
            raise refused
        return lease

    def _post_in_session(self, message: Message, identity: Identity | None, session_id: str | None,
                         header_version: str | None, lifetime: RequestLifetime) -> Answer:
        lease = self._leased(session_id, identity, header_version, lifetime)
        session_id = lease.session.session_id
        if message.kind == "response":
            refused = self._live.answer(session_id, message)  # to a request the gateway sent this client
            return settled(lifetime, 202, None) if refused is None else \
                settled(lifetime, 400, error_response(None, refused))
        if message.kind == "notification" and message.method == "notifications/cancelled":
            params = message.params if isinstance(message.params, dict) else {}
            reason = params.get("reason")
            self._live.cancel(session_id, params.get("requestId"), reason if isinstance(reason, str) else None)
            return settled(lifetime, 202, None)
        if message.kind == "notification" and message.method != "notifications/roots/list_changed":
            return settled(lifetime, 202, None)  # nothing else a client notifies needs the gateway
        user = lease.user or self._revive(lease.session, identity, lifetime)
        if not lease.attached:
            self._ask(user.proxy.attach_session(session_id, identity))
            self._directory.mark_attached(session_id)
        if not message.is_request:  # the client's roots changed: every backend session hears it
            user.backends.notify_backends(identity, message.method, None)
            return settled(lifetime, 202, None)
        deadline = self._deadlines.for_request(message)
        message = self._own_name_resolved(self._with_session_level(message, lease), identity, user, deadline, lifetime)
        call = self._live.begin_call(session_id, message.id)
        side = SessionSide(self._live, lease.session, call, deadline, user)
        run = CallRun(started(lambda: user.dispatcher.handle(identity, message, deadline, session_id)), deadline)
        lifetime.run = run
        resumable = self._live if lease.session.protocol_version >= RESUMABLE_SINCE else None
        return answer_call(drive(run, side), lifetime, message.id, resumable)

    def _with_session_level(self, message: Message, lease: Lease) -> Message:
        """A session keeps its own log level. Its user's 2025 backends are told the most
        verbose level any of the user's sessions asked for; a 2026-07-28 backend hears a
        level per request (a session that set none gets everything, as from a 2025 backend).
        Each session then gets only its own level (``SessionSide.keep``)."""
        params = message.params
        if message.method == "logging/setLevel" and isinstance(params, dict) and params.get("level") in LOGGING_LEVELS:
            forwarded = self._directory.set_log_level(lease.session.session_id, params["level"])
            return replace(message, params={**params, "level": forwarded})
        if message.method in INPUT_REQUIRED_METHODS and isinstance(params, dict) \
                and isinstance(params.get("_meta", {}), dict):
            meta = {**params.get("_meta", {}), META_LOG_LEVEL: lease.session.log_level or LOGGING_LEVELS[0]}
            return replace(message, params={**params, "_meta": meta})
        return message

    def _instructions(self) -> str | None:
        """The backends' instructions for initialize and server/discover, as their last
        handshakes said (opening a session contacts no backend: until the gateway has met a
        backend once, its instructions are not known)."""
        if self._remembered_instructions is None:
            return None
        try:
            return self._remembered_instructions()
        except Exception:  # noqa: BLE001 - initialize is answered without them, not refused
            logger.warning("the backends' instructions could not be read", exc_info=True)
            return None

    def _revive(self, session: SessionRecord, identity: Identity | None, lifetime: RequestLifetime) -> UserHandle:
        """The session's user started (its first request) or its released actors revived,
        and held for the request."""
        key, declared = session.user, relayed_capabilities(session.client_capabilities)
        return self._held(key, lifetime,
                          lambda: self._gateway.revive_user(key, identity, self._directory.store.user(key), declared))

    def _held(self, key: UserKey, lifetime: RequestLifetime, start: Callable[[], Any]) -> UserHandle:
        """The user's live actors held for the request, started (``start``: the Gateway
        asked, with the user record read here) when they are not live."""
        user = lifetime.hold_user(key)
        for _ in range(2):  # released again between the start and the hold: once more
            if user is not None:
                return user
            self._ask(start())
            user = lifetime.hold_user(key)
        if user is None:
            raise Unavailable()
        return user

    # -- GET and DELETE ----------------------------------------------------------------------

    def open_stream(self, session_id: str | None, identity: Identity | None, header_version: str | None,
                    last_event_id: str | None = None) -> Answer:
        """``GET /mcp``: the session's standalone stream, held open until the client leaves
        (a newer stream of the same session replaces it); with ``Last-Event-ID``, the rest
        of a call's answer whose connection dropped."""
        if is_modern_request(header_version, ACCEPTED_PROTOCOL_HEADER_VERSIONS, session_id):
            return _not_in_modern("GET")
        lifetime = RequestLifetime(self._directory, session_id)
        return self._answering(lifetime, None, False, lambda: self._open_stream(
            session_id, identity, header_version, last_event_id, lifetime))

    def _open_stream(self, session_id: str | None, identity: Identity | None, header_version: str | None,
                     last_event_id: str | None, lifetime: RequestLifetime) -> Answer:
        lease = self._leased(session_id, identity, header_version, lifetime)
        session_id = lease.session.session_id
        if last_event_id:
            found = self._live.resume(session_id, last_event_id)
            if found is None:
                raise _refusal(404, "Not Found: no stream of this session to resume from that event id "
                                    "(unknown or expired)")
            call_stream, after = found
            return Answer(session_id=session_id, stream=replayed(call_stream.replay(after)), lifetime=lifetime)
        stream = self._live.open_stream(session_id, owner=identity_key(identity))
        if stream is None:
            answer = settled(lifetime, 405, error_response(None, _refusal(405, "Method Not Allowed: this process "
                                                                               "holds as many standalone streams as "
                                                                               "it can; calls work as before")))
            answer.headers["Allow"] = "POST, DELETE"
            return answer
        try:
            user = lease.user or self._revive(lease.session, identity, lifetime)
            # Answered once the backends' streams are open too: what a backend sends after
            # the client has its stream reaches it, as on a direct connection.
            self._ask(user.proxy.stream_opened(session_id, identity)).wait(ASK_TIMEOUT)
        except BaseException:
            self._live.close_stream(stream)
            raise

        def closed() -> None:
            if self._live.close_stream(stream):
                try:
                    user.proxy.stream_closed(session_id)
                except pykka.ActorDeadError:
                    pass

        lifetime.ends_with(closed)
        return Answer(session_id=session_id, stream=sse_text(stream.messages(), STREAM_OPENING), lifetime=lifetime)

    def delete(self, session_id: str | None, identity: Identity | None, header_version: str | None = None) -> Answer:
        if is_modern_request(header_version, ACCEPTED_PROTOCOL_HEADER_VERSIONS, session_id):
            return _not_in_modern("DELETE")
        if not session_id:
            return _error(400, f"Bad Request: missing {SESSION_HEADER} header")
        if not self._signer.is_session_id(session_id):
            return _error(404, "Session not found")

        def end_session() -> Answer:
            record = self._directory.remove_session(session_id, identity)  # the store, on this thread
            if record is None:
                return _error(404, "Session not found")
            self._live.cancel_all(session_id, SESSION_ENDED)  # its calls end with it
            self._ask(self._gateway.session_removed(record))
            return Answer(200)

        return self._answering(RequestLifetime(self._directory), None, False, end_session)

    # -- 2026-07-28: no session, the caller's user serves each request --------------------

    def _post_stateless(self, message: Message, identity: Identity | None, headers: dict[str, str | None],
                        param_headers: dict[str, str], lifetime: RequestLifetime,
                        watch_hangup: WatchHangup | None) -> Answer:
        if message.kind == "response":
            raise _refusal(400, "Bad Request: a 2026-07-28 client sends no responses (input goes in "
                                "inputResponses on a retry)")
        request = read_modern(message, headers)
        if not message.is_request:
            return settled(lifetime, 202, None)  # 2026-07-28 defines no client notifications over HTTP
        if message.method in REMOVED_METHODS:
            raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {message.method} (not part of "
                                                 f"{request.version})", http_status=404)
        if message.method == "server/discover":
            return settled(lifetime, 200, result_response(message.id, discover_result(
                self._config.name, self._instructions())))
        key = UserKey.of(identity, request.client_capabilities)
        user = self._held(key, lifetime, lambda: self._gateway.serve_user(
            key, identity, relayed_capabilities(request.client_capabilities), self._directory.store.user(key)))
        if message.method == "subscriptions/listen":
            return self._listen(message, identity, user, lifetime, request)
        method = message.method or ""
        deadline = self._deadlines.for_request(message)
        message = self._own_name_resolved(message, identity, user, deadline, lifetime)
        params = message.params if isinstance(message.params, dict) else {}
        named = NAMED_METHODS.get(method)
        name = params.get(named) if named else None
        side = StatelessSide(method, name, request, principal_of(key), self._seal, self._parked,
                             self._shaper(user, method), self._heard(user), watch_hangup)
        if method == "tools/call" and isinstance(name, str):  # every round of a call, continued or not
            self._check_param_headers(user, identity, name, params.get("arguments"), param_headers, deadline)
        if request.request_state is not None:
            state = self._seal.open(request.request_state, principal_of(key), method, name)
            if state["k"] == "c":
                return self._resume_parked(message, identity, user, state, side, name, lifetime)
            continuation = self._continuation(method, name, params, request, state)
        else:
            continuation = None
        takes_tasks = declares_tasks(request.client_capabilities)
        if continuation is not None:
            run = CallRun(started(lambda: resume(user.core, identity, continuation, deadline, takes_tasks)), deadline)
        else:
            dispatched = replace(message, params=request.params_for_dispatch(message.params))
            if method == "tasks/update" and "inputResponses" in params:
                dispatched = replace(dispatched, params={**dispatched.params, "inputResponses": params["inputResponses"]})
            run = CallRun(started(lambda: user.dispatcher.handle(identity, dispatched, deadline, modern=True,
                                                                 takes_tasks=takes_tasks)), deadline)
        lifetime.run = run
        side.attend(run)
        return answer_call(drive(run, side), lifetime, message.id)

    @staticmethod
    def _continuation(method: str, name: Any, params: Mapping[str, Any], request: ModernRequest,
                      state: Mapping[str, Any] | None) -> Continuation:
        if not isinstance(name, str):
            raise JsonRpcError(INVALID_PARAMS, f"{NAMED_METHODS.get(method, 'name')} is required and must be a string")
        arguments = params.get("arguments")
        dispatched = request.params_for_dispatch(params)
        backend_state = state.get("s") if state is not None else None
        return Continuation(method, name, arguments if isinstance(arguments, dict) else None,
                            dispatched.get("_meta") if isinstance(dispatched, dict) else None,
                            dict(request.input_responses or {}),
                            backend=str(state["b"]) if state is not None else None,
                            target=state.get("t") if state is not None else None,
                            backend_state=backend_state if isinstance(backend_state, str) else None)

    def _resume_parked(self, message: Message, identity: Identity | None, user: UserHandle,
                       state: Mapping[str, Any], side: StatelessSide, name: Any, lifetime: RequestLifetime) -> Answer:
        """A retry that answers a call parked in this process: the call goes on from where
        it waited (its policies asked again first)."""
        run = self._parked.take(state.get("c"))
        if run is None:
            elsewhere = state.get("w") != self._seal.worker
            raise JsonRpcError(INVALID_PARAMS, "Invalid requestState: the call it continues " + (
                "is held by another gateway process (a legacy backend's or a composite tool's call waits where it "
                "started); retry the original request without it" if elsewhere else
                "is no longer waiting (it was answered, or its deadline passed); retry the original request "
                "without it"))
        probe = Continuation(message.method or "", name if isinstance(name, str) else "", None, None, {})
        if not reachable(user.core, identity, probe, run.deadline):
            self._parked.park(run)  # not this caller's to go on with any more: it waits out its deadline
            raise probe.unknown()
        outcome = side.answer_parked(run)
        if outcome is not None:
            return settled(lifetime, *response_for(outcome, message.id))
        lifetime.run = run
        side.attend(run)
        return answer_call(drive(run, side), lifetime, message.id)

    def _shaper(self, user: UserHandle, method: str) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
        def shape(result: Mapping[str, Any]) -> dict[str, Any]:
            hints = self._cache_hints
            fresh_for = user.backends.freshness_ms()
            if fresh_for is not None and fresh_for < hints.list_ttl_ms:  # a backend's own hint bounds ours
                hints = replace(hints, list_ttl_ms=fresh_for)
            return complete(result, method, self._config.name, hints)

        return shape

    @staticmethod
    def _heard(user: UserHandle) -> Callable[[Notification], None]:
        """List changes and resource updates a call brings: the user's to hand to listeners."""
        def heard(notification: Notification) -> None:
            try:
                if notification.method == RESOURCE_UPDATED:
                    user.proxy.resource_updated(notification.message, None)
                else:
                    user.proxy.backend_changed(notification.origin)
            except pykka.ActorDeadError:
                pass

        return heard

    @staticmethod
    def _check_param_headers(user: UserHandle, identity: Identity | None, name: str, arguments: Any,
                             received: dict[str, str], deadline: Deadline) -> None:
        """A tool whose inputSchema marks arguments with ``x-mcp-header``: each such
        argument must come mirrored, and equal, in its ``Mcp-Param-*`` header (-32020)."""
        tool = user.core.describe_tool(identity, name, deadline)
        if tool is None:
            return  # the dispatcher answers an unknown tool
        problem = param_header_mismatch(tool.get("inputSchema"), arguments, received)
        if problem is not None:
            raise JsonRpcError(HEADER_MISMATCH, f"Header mismatch: {problem}", http_status=400)

    def _listen(self, message: Message, identity: Identity | None, user: UserHandle,
                lifetime: RequestLifetime, request: ModernRequest) -> Answer:
        """``subscriptions/listen``: the list changes, resource updates and task states the
        client opted in to, on this request's stream until the client closes it."""
        params = message.params if isinstance(message.params, dict) else {}
        wanted = params.get("notifications", {})
        uris = wanted.get("resourceSubscriptions", []) if isinstance(wanted, dict) else None
        if not isinstance(wanted, dict) or not isinstance(uris, list) or not all(isinstance(u, str) for u in uris):
            raise JsonRpcError(INVALID_PARAMS, "notifications must be an object; resourceSubscriptions a list of URIs")
        task_ids = wanted.get("taskIds")
        for what, named in (("resourceSubscriptions", uris), ("taskIds", task_ids)):
            if isinstance(named, list) and len(named) > MAX_LISTENED:
                raise JsonRpcError(INVALID_PARAMS, f"notifications.{what}: at most {MAX_LISTENED} on one listen "
                                                   "stream (open another for more)")
        watch = self._task_watch(task_ids, identity, user, request) if task_ids is not None else None
        listen_id = f"listen:{secrets.token_hex(12)}"
        agreed: dict[str, Any] = {flag: True for flag in ("toolsListChanged", "promptsListChanged",
                                                          "resourcesListChanged") if wanted.get(flag) is True}
        # The stream is registered before anything is subscribed: what a backend sends the
        # moment it is subscribed waits on it (after the acknowledgment), never dropped.
        stream = ListenStream(listen_id, message.id, {**agreed, "resourceSubscriptions": list(dict.fromkeys(uris))})
        try:
            opened = self._live.open_stream(listen_id, stream, owner=identity_key(identity))
        except StreamShareReached:
            if watch is not None:
                watch.stop()
            raise
        if opened is None:
            return settled(lifetime, 503, error_response(message.id, JsonRpcError(
                INTERNAL_ERROR, "Service Unavailable: this process holds as many streams as it can")))
        subscribed: list[str] = []

        def closed() -> None:
            if watch is not None:
                watch.stop()
            stream.client_left()
            self._live.close_stream(stream)
            try:
                user.proxy.stream_closed(listen_id)
            except pykka.ActorDeadError:
                pass
            self._unsubscribe_all(user, identity, listen_id, subscribed)

        lifetime.ends_with(closed)
        deadline = Deadline.after(ASK_TIMEOUT)
        for uri in dict.fromkeys(uris):
            try:
                user.core.subscribe_resource(identity, listen_id, uri, deadline)
                subscribed.append(uri)
            except JsonRpcError as error:
                logger.debug("listen: not subscribing to a resource: %s", error.message)
        if subscribed:
            agreed["resourceSubscriptions"] = subscribed
        if watch is not None:
            agreed["taskIds"] = watch.accept(task_ids)
        stream.agree(agreed)  # what the acknowledgment says, and all the stream takes from now on
        # Acknowledged once the backends' streams are open too: what a backend sends after the
        # acknowledgment reaches this stream (the specification's promise to the client).
        self._ask(user.proxy.stream_opened(listen_id, identity)).wait(ASK_TIMEOUT)
        if watch is not None:
            watch.push_to(stream.push)
            watch.start()
        return Answer(stream=sse_text(stream.messages()), lifetime=lifetime)

    @staticmethod
    def _task_watch(task_ids: Any, identity: Identity | None, user: UserHandle, request: ModernRequest) -> TaskWatch:
        """A watch of the tasks a listen stream names (their states as ``tasks/get`` answers them)."""
        if not isinstance(task_ids, list) or not all(isinstance(task_id, str) for task_id in task_ids):
            raise JsonRpcError(INVALID_PARAMS, "notifications.taskIds must be a list of task ids")
        if not declares_tasks(request.client_capabilities):
            raise tasks_extension_required()

        def fetch(handle: str) -> Mapping[str, Any]:
            answer = user.core.task_request(identity, "tasks/get", {"taskId": handle}, True,
                                            Deadline.after(ASK_TIMEOUT))
            return answer if isinstance(answer, Mapping) else finished(answer)

        return TaskWatch(fetch)

    @staticmethod
    def _unsubscribe_all(user: UserHandle, identity: Identity | None, subscriber: str, uris: list[str]) -> None:
        deadline = Deadline.after(ASK_TIMEOUT)
        for uri in uris:
            try:
                user.core.unsubscribe_resource(identity, subscriber, uri, deadline)
            except JsonRpcError:
                pass

    # -- internals -----------------------------------------------------------------------

    @staticmethod
    def _own_name_resolved(message: Message, identity: Identity | None, user: UserHandle, deadline: Deadline,
                           lifetime: RequestLifetime) -> Message:
        """A tools/call by a backend's own tool name (an MCP App's) as the call of the
        advertised tool it means (``McpDispatcher.tool_called``), before anything decides
        on it: every layer, the audit line and a 2026-07-28 call's sealed state see that
        name."""
        params = message.params
        if message.method != "tools/call" or not isinstance(params, dict) or not isinstance(params.get("name"), str):
            return message
        advertised = user.dispatcher.tool_called(identity, params["name"], deadline)
        if advertised == params["name"]:
            return message
        lifetime.own_name = (params["name"], advertised)
        return replace(message, params={**params, "name": advertised})

    def _auditor(self, event_type: str, message: Message, identity: Identity | None, session_id: str | None,
                 elapsed: Callable[[], float]) -> Callable[[RequestLifetime], None]:
        def write(lifetime: RequestLifetime) -> None:
            status, body = lifetime.outcome if lifetime.outcome is not None else (500, None)
            params, called_as = message.params, None
            if lifetime.own_name is not None and isinstance(params, dict):  # decided under the advertised name
                called_as, advertised = lifetime.own_name
                params = {**params, "name": advertised}
            self._audit.write(event_type, identity=identity, session_id=session_id, method=message.method or "",
                              params=params, backend=lifetime.run.backend if lifetime.run else None,
                              answer=body, http_status=status, seconds=elapsed(), called_as=called_as)

        return write

    def _ask(self, future: Any) -> Any:
        try:
            return future.get(timeout=ASK_TIMEOUT)
        except (pykka.ActorDeadError, pykka.Timeout):
            raise Unavailable() from None
        except CapReached as reached:
            raise Unavailable.at_cap(reached) from None


def _error(status: int, message: str) -> Answer:
    return Answer(status, error_response(None, _refusal(status, message)))


def _not_in_modern(method: str) -> Answer:
    answer = _error(405, f"Method Not Allowed: {method} has no meaning in MCP 2026-07-28 "
                         "(streams come from subscriptions/listen; there are no sessions)")
    answer.headers["Allow"] = "POST"
    return answer


def cache_hints_for(config: VmcpConfig) -> CacheHints:
    """Lists stay fresh as long as the discovery cache keeps a catalog; answers are
    ``private`` whenever who asks can change them (incoming authentication, per-user
    outgoing credentials, passthrough headers)."""
    outgoing = config.outgoing_auth
    per_caller = (config.incoming_auth.type != "anonymous" or bool(outgoing.passthrough_headers)
                  or any(auth.type == "token_exchange" for auth in (outgoing.default, *outgoing.backends.values())))
    return CacheHints(int(config.operational.discovery_cache_ttl * 1000), "private" if per_caller else "public")
