"""The client edge of MCP 2026-07-28, and the translation between eras, in one place.

A 2026-07-28 request carries no session: its ``_meta`` says which revision, which client
capabilities and (optionally) which log level, and its headers mirror its method and name.
``read_modern`` checks all of that, in the specification's order. Results carry
``resultType``, the server's identity and, for lists and reads, cache hints.

What the revisions disagree on is translated here, both ways:

* A 2026-07-28 backend that answers ``input_required`` (an ``InputRequired`` event):
  a modern client gets the backend's input requests as they are, with a ``requestState``
  sealed by the gateway (which backend, the backend's own state, who asked, for what);
  a legacy client is asked each of them on the call's stream (``gather_input``) and the
  backend is asked again with the answers, so the client sees one ordinary call.
* A request for the client during a call (``ServerRequest``: a legacy backend's
  elicitation, sampling or roots request, or a composite's elicitation step): a legacy
  client is asked on the call's stream; a modern client gets ``input_required`` and the
  call waits, parked in this process (``ParkedCalls``), for the client's retry to answer.

A sealed state that names a backend is process-independent (any gateway process holding
the key can go on with it); one that names a parked call works only in the process that
parked it, and says so anywhere else.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from vmcp_actors import __version__
from vmcp_actors.backends import CallOpened, InputRequired
from vmcp_actors.concurrency import Deadline, TimerHandle, call_later
from vmcp_actors.core._exchange import (
    CallCancelled,
    Exchange,
    Notification,
    RelayEvent,
    ServerRequest,
    from_backend,
)
from vmcp_actors.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
    RESOURCE_NOT_FOUND,
    JsonRpcError,
    Message,
    error_response,
    result_response,
)
from vmcp_actors.protocol.mcp import (
    CACHEABLE_METHODS,
    HEADER_MISMATCH,
    INPUT_REQUIRED_METHODS,
    LOGGING_LEVELS,
    META_CLIENT_CAPABILITIES,
    META_CLIENT_INFO,
    META_LOG_LEVEL,
    META_PREFIX,
    META_PROTOCOL_VERSION,
    META_SERVER_INFO,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    MODERN_PROTOCOL_VERSIONS,
    NAMED_METHODS,
    SUPPORTED_PROTOCOL_VERSIONS,
    UNSUPPORTED_PROTOCOL_VERSION,
    check_answer,
    decode_header_value,
    is_logged_at,
    missing_capability,
)
from vmcp_actors.signing import Signer, Unsealable

logger = logging.getLogger(__name__)

# HTTP statuses of a 2026-07-28 error answer (the specification names these; other
# errors of a method are answered 200 with the error in the body).
MODERN_ERROR_STATUS = {
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    MISSING_REQUIRED_CLIENT_CAPABILITY: 400,
    UNSUPPORTED_PROTOCOL_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}
# Methods of the 2025 era that 2026-07-28 removed: a modern client asking gets -32601.
REMOVED_METHODS = frozenset({"initialize", "ping", "logging/setLevel", "resources/subscribe",
                             "resources/unsubscribe"})
# How long a sealed requestState that names a backend may come back (a parked call's
# lasts as long as the call's deadline).
BACKEND_STATE_TTL = 600.0
# Input rounds one call may take before the gateway gives up on it.
MAX_INPUT_ROUNDS = 16
STATE_PURPOSE = "requestState"
# Server capabilities towards 2026-07-28 clients (no logging/setLevel, subscriptions
# through subscriptions/listen).
MODERN_SERVER_CAPABILITIES = {
    "tools": {"listChanged": True},
    "resources": {"subscribe": True, "listChanged": True},
    "prompts": {"listChanged": True},
    "completions": {},
}


@dataclass(frozen=True)
class ModernRequest:
    """What a 2026-07-28 request says about itself."""

    version: str
    client_capabilities: Mapping[str, Any]
    client_info: Mapping[str, Any]
    log_level: str | None
    meta: dict[str, Any] | None  # its _meta without the protocol's own keys (a progress token, trace context)
    input_responses: Mapping[str, Any] | None
    request_state: str | None

    def params_for_dispatch(self, params: Any) -> Any:
        """The request's params as the capability stack takes them: the protocol keys of
        ``_meta`` and the round's input taken out (the gateway answers those itself)."""
        if not isinstance(params, dict):
            return params
        cleaned = {key: value for key, value in params.items() if key not in ("_meta", "inputResponses", "requestState")}
        meta = dict(self.meta or {})
        if self.log_level is not None:
            meta[META_LOG_LEVEL] = self.log_level  # a 2026-07-28 backend sends logs only when asked
        if meta:
            cleaned["_meta"] = meta
        return cleaned


def is_modern_request(header_version: str | None, legacy_versions: frozenset[str], session_id: str | None) -> bool:
    """A request of the stateless era: its MCP-Protocol-Version header names no 2025
    revision. A session id it carries is ignored, as the specification says, when the
    header names 2026-07-28 or later; with an older unknown revision it is a 2025
    session's request with a bad header."""
    if header_version is None or header_version in legacy_versions:
        return False
    return not session_id or header_version >= MODERN_PROTOCOL_VERSIONS[-1]


def read_modern(message: Message, headers: Mapping[str, str | None]) -> ModernRequest:
    """The request's metadata, checked as the specification orders it: the ``_meta``
    envelope (-32602), the headers against the body (-32020), the revision (-32022).
    ``headers``: MCP-Protocol-Version, Mcp-Method and Mcp-Name values (None when absent)."""
    params = message.params if isinstance(message.params, dict) else None
    meta = params.get("_meta") if params is not None else None
    if not isinstance(meta, dict):
        raise _refused(INVALID_PARAMS, f"params._meta must be an object carrying {META_PROTOCOL_VERSION} and "
                                       f"{META_CLIENT_CAPABILITIES}")
    missing = [key for key in (META_PROTOCOL_VERSION, META_CLIENT_CAPABILITIES) if key not in meta]
    if missing:
        raise _refused(INVALID_PARAMS, f"params._meta is missing {', '.join(missing)}")
    version = meta[META_PROTOCOL_VERSION]
    if headers.get("version") is None or headers.get("version") != version:
        raise _refused(HEADER_MISMATCH, "Header mismatch: MCP-Protocol-Version does not match "
                                        f"params._meta[{META_PROTOCOL_VERSION!r}]")
    if headers.get("method") != message.method:
        raise _refused(HEADER_MISMATCH, "Header mismatch: Mcp-Method does not match the body's method")
    named = NAMED_METHODS.get(message.method or "")
    if named is not None and params is not None and params.get(named) is not None:
        header_name = headers.get("name")
        decoded = decode_header_value(header_name) if header_name is not None else None
        if decoded != params.get(named):
            raise _refused(HEADER_MISMATCH, f"Header mismatch: Mcp-Name does not match the body's {named}")
    if not isinstance(version, str):
        raise _refused(INVALID_PARAMS, "the protocol version in params._meta must be a string")
    if version not in MODERN_PROTOCOL_VERSIONS:
        raise _refused(UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version",
                       {"supported": list(SUPPORTED_PROTOCOL_VERSIONS), "requested": version[:64]})
    capabilities = meta[META_CLIENT_CAPABILITIES]
    if not isinstance(capabilities, dict):
        raise _refused(INVALID_PARAMS, f"params._meta[{META_CLIENT_CAPABILITIES!r}] must be an object")
    client_info = meta.get(META_CLIENT_INFO)
    level = meta.get(META_LOG_LEVEL)
    if level is not None and level not in LOGGING_LEVELS:
        raise _refused(INVALID_PARAMS, f"params._meta[{META_LOG_LEVEL!r}] must be one of {', '.join(LOGGING_LEVELS)}")
    responses = params.get("inputResponses") if params is not None else None
    state = params.get("requestState") if params is not None else None
    if responses is not None and not isinstance(responses, dict):
        raise _refused(INVALID_PARAMS, "inputResponses must be an object")
    if state is not None and not isinstance(state, str):
        raise _refused(INVALID_PARAMS, "requestState must be a string")
    if (responses is not None or state is not None) and message.method not in INPUT_REQUIRED_METHODS:
        raise _refused(INVALID_PARAMS, f"{message.method} takes no inputResponses or requestState")
    own = {key: value for key, value in meta.items() if not key.startswith(META_PREFIX)}
    return ModernRequest(version, capabilities, client_info if isinstance(client_info, dict) else {}, level,
                         own or None, responses, state)


def _refused(code: int, message: str, data: Any = None) -> JsonRpcError:
    return JsonRpcError(code, message, data, http_status=MODERN_ERROR_STATUS.get(code, 400))


def modern_error(error: JsonRpcError) -> JsonRpcError:
    """An error as a 2026-07-28 client gets it: resource not found is -32602, and the
    HTTP status the specification names for the code."""
    code = INVALID_PARAMS if error.code == RESOURCE_NOT_FOUND else error.code
    status = MODERN_ERROR_STATUS.get(code, error.http_status)
    return JsonRpcError(code, error.message, error.data, http_status=status)


def server_info(name: str) -> dict[str, str]:
    return {"name": name, "version": __version__}


def discover_result(name: str, instructions: str | None = None) -> dict[str, Any]:
    """``server/discover``: every revision the gateway speaks, its capabilities, its identity."""
    result: dict[str, Any] = {
        "resultType": "complete",
        "supportedVersions": list(SUPPORTED_PROTOCOL_VERSIONS),
        "capabilities": {key: dict(value) for key, value in MODERN_SERVER_CAPABILITIES.items()},
        "_meta": {META_SERVER_INFO: server_info(name)},
        "ttlMs": 3_600_000,  # the gateway's own capabilities change only with its config
        "cacheScope": "public",
    }
    if instructions:
        result["instructions"] = instructions
    return result


@dataclass(frozen=True)
class CacheHints:
    """What the gateway tells 2026-07-28 clients about caching its answers."""

    list_ttl_ms: int  # how long a list stays fresh (bounded by the backends' own hints)
    scope: str  # "private" when answers depend on who asks, else "public"


def complete(result: Mapping[str, Any], method: str, name: str, hints: CacheHints,
             read_ttl_ms: int | None = None) -> dict[str, Any]:
    """A result as a 2026-07-28 client gets it: ``resultType``, the server's identity and,
    for lists and reads, cache hints."""
    shaped = dict(result)
    shaped.setdefault("resultType", "complete")
    meta = dict(shaped["_meta"]) if isinstance(shaped.get("_meta"), dict) else {}
    meta[META_SERVER_INFO] = server_info(name)
    shaped["_meta"] = meta
    if method in CACHEABLE_METHODS and shaped["resultType"] == "complete":
        if method == "resources/read":
            ttl = result.get("ttlMs")
            shaped["ttlMs"] = ttl if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl >= 0 else 0
        else:
            shaped["ttlMs"] = hints.list_ttl_ms
        shaped["cacheScope"] = hints.scope
    return shaped


def legacy_result(result: Mapping[str, Any]) -> Mapping[str, Any]:
    """A 2026-07-28 backend's result as a 2025 client gets it: without the fields of the
    newer revision (``resultType``, cache hints, the backend's ``io.modelcontextprotocol/``
    metadata such as its identity)."""
    if not any(key in result for key in ("resultType", "ttlMs", "cacheScope", "_meta")):
        return result
    shaped = {key: value for key, value in result.items() if key not in ("resultType", "ttlMs", "cacheScope")}
    meta = shaped.get("_meta")
    if isinstance(meta, dict) and any(key.startswith(META_PREFIX) for key in meta):
        kept = {key: value for key, value in meta.items() if not key.startswith(META_PREFIX)}
        if kept:
            shaped["_meta"] = kept
        else:
            del shaped["_meta"]
    return shaped


# -- sealed requestState ----------------------------------------------------------------


def principal_of(user: Any) -> list[str]:
    """Whom a sealed state belongs to: issuer, subject and passthrough-header digest."""
    return [user.issuer, user.subject, user.headers]


@dataclass(frozen=True)
class StateSeal:
    """Seals and opens the gateway's own ``requestState``. ``worker`` names this process,
    so a state of a call parked here is told apart from one of another process."""

    signer: Signer
    worker: str = field(default_factory=lambda: secrets.token_hex(8))

    def for_backend(self, event: InputRequired, principal: list[str], method: str, name: Any) -> str:
        target = event.params.get("name", event.params.get("uri"))
        return self.signer.seal(STATE_PURPOSE, {"k": "b", "b": event.backend, "s": event.state, "t": target,
                                                "u": principal, "m": method, "n": name}, BACKEND_STATE_TTL)

    def for_parked(self, parked_id: str, principal: list[str], method: str, name: Any, ttl: float) -> str:
        return self.signer.seal(STATE_PURPOSE, {"k": "c", "c": parked_id, "w": self.worker, "u": principal,
                                                "m": method, "n": name}, max(ttl, 1.0))

    def open(self, token: str, principal: list[str], method: str, name: Any) -> dict[str, Any]:
        """The state's contents; -32602 when it is not the gateway's, has expired, or was
        made for another caller or another request."""
        try:
            state = self.signer.unseal(STATE_PURPOSE, token)
        except Unsealable as why:
            logger.info("refused a requestState: %s", why)
            raise _refused(INVALID_PARAMS, "Invalid requestState: not issued by this gateway, altered or expired") \
                from None
        if state.get("u") != principal or state.get("m") != method or state.get("n") != name:
            logger.info("refused a requestState made for another caller or request")
            raise _refused(INVALID_PARAMS, "Invalid requestState: it was issued for another caller or request")
        if state.get("k") not in ("b", "c"):
            raise _refused(INVALID_PARAMS, "Invalid requestState")
        return state


# -- calls parked for a modern client's retry -------------------------------------------


@dataclass
class ParkedCall:
    """A call waiting for a 2026-07-28 client to answer the requests it was sent in an
    ``input_required`` result; the next retry takes it and drives it on."""

    id: str
    exchange: Exchange
    pending: dict[str, ServerRequest]
    principal: list[str]
    deadline: Deadline
    cancel: Any = None  # from CallOpened: tells the backend the call is over
    rounds: int = 0
    timer: TimerHandle | None = None


class ParkedCalls:
    """The calls of this process that wait for a modern client's retry. Each is taken by
    exactly one retry; one nobody comes back for ends at its request's deadline (its
    backend gets an error for every request left unanswered)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[str, ParkedCall] = {}

    def park(self, call: ParkedCall) -> None:
        with self._lock:
            self._calls[call.id] = call
        call.timer = call_later(max(call.deadline.remaining(), 0.0), lambda: self._expire(call.id))

    def take(self, parked_id: Any) -> ParkedCall | None:
        with self._lock:
            call = self._calls.pop(parked_id, None) if isinstance(parked_id, str) else None
        if call is not None and call.timer is not None:
            call.timer.cancel()
        return call

    def count(self) -> int:
        with self._lock:
            return len(self._calls)

    def end_all(self) -> None:
        with self._lock:
            calls, self._calls = list(self._calls.values()), {}
        for call in calls:
            _abandon(call, "the gateway is shutting down")

    def _expire(self, parked_id: str) -> None:
        call = self.take(parked_id)
        if call is not None:
            _abandon(call, "the client did not come back with the input before the call's deadline")


def _abandon(call: ParkedCall, why: str) -> None:
    for request in call.pending.values():
        request.respond({"error": {"code": REQUEST_TIMEOUT, "message": why}})
    if call.cancel is not None:
        try:
            call.cancel(why)
        except Exception:  # noqa: BLE001 - best effort: the exchange is closed below anyway
            logger.debug("cancelling a parked call failed", exc_info=True)
    call.exchange.close()


# -- driving a call for a modern client ---------------------------------------------------


class ModernCall:
    """One 2026-07-28 request's answer: the call's events as the client gets them. Log
    messages only at the level the request asked for (none when it asked for none), list
    changes and resource updates to the user (they belong on ``subscriptions/listen``
    streams), requests for the client as ``input_required``."""

    def __init__(self, request_id: Any, method: str, name: Any, request: ModernRequest, principal: list[str],
                 seal: StateSeal, parked: ParkedCalls, shape: Any, on_stream_notification: Any,
                 deadline: Deadline):
        self._request_id = request_id
        self._method = method
        self._name = name
        self._request = request
        self._principal = principal
        self._seal = seal
        self._parked = parked
        self._shape = shape  # result dict -> the result as the client gets it
        self._on_stream_notification = on_stream_notification  # list changes, resource updates
        self._deadline = deadline
        self._keys = itertools.count(1)

    def events(self, relay: Any) -> Iterator[RelayEvent]:
        exchange = relay.exchange
        if exchange is None:
            yield self._final_of(relay.final)
            return
        yield from self._drive(ParkedCall(secrets.token_urlsafe(12), exchange, {}, self._principal, self._deadline))

    def resume(self, call: ParkedCall) -> Iterator[RelayEvent]:
        """A parked call taken by this retry: the answers go to whoever asked, then on."""
        responses = self._request.input_responses or {}
        for key, answer in responses.items():
            asked = call.pending.get(key)
            if asked is None:
                continue  # not one of ours: ignored, as the specification says
            problem = check_answer(asked.method, Message("response", None, key, answer)) \
                if isinstance(answer, dict) else "the answer must be an object"
            if problem is None:
                del call.pending[key]
                asked.respond({"result": answer})
        call.rounds += 1
        if call.rounds > MAX_INPUT_ROUNDS:
            _abandon(call, "too many input rounds")
            yield self._error(JsonRpcError(INTERNAL_ERROR, f"the call took more than {MAX_INPUT_ROUNDS} input rounds"))
            return
        if call.pending:  # still unanswered: asked again
            yield self._park(call)
            return
        yield from self._drive(call)

    def _drive(self, call: ParkedCall) -> Iterator[RelayEvent]:
        parked = False
        answered = False
        try:
            while True:
                event = next(call.exchange)
                if isinstance(event, Notification):
                    if self._keep(event):
                        yield RelayEvent(event.message, event=event)
                elif isinstance(event, ServerRequest):
                    why_not = missing_capability(event.method, event.params, self._request.client_capabilities)
                    if why_not is not None:
                        event.respond({"error": {"code": METHOD_NOT_FOUND, "message": why_not}})
                        continue
                    call.pending[f"input-{next(self._keys)}"] = event
                    parked = True
                    answered = True
                    yield self._park(call)
                    return
                elif isinstance(event, InputRequired):
                    answered = True
                    state = self._seal.for_backend(event, self._principal, self._method, self._name)
                    requests = {key: dict(value) for key, value in event.requests.items()}
                    yield self._input_required(requests, state)
                    return
                elif isinstance(event, CallOpened):
                    call.cancel = event.cancel
        except StopIteration as done:
            answered = True
            yield RelayEvent(result_response(self._request_id, self._shape(done.value)), final=True)
        except CallCancelled:
            answered = True
            yield RelayEvent(None, final=True)
        except JsonRpcError as error:
            answered = True
            yield self._error(error)
        except Exception as error:  # noqa: BLE001 - the client gets an answer whatever happened
            answered = True
            logger.error("request failed unexpectedly: %s", error.__class__.__name__, exc_info=error)
            yield self._error(JsonRpcError(INTERNAL_ERROR, "Internal error"))
        finally:
            if not parked:
                if not answered and call.cancel is not None:
                    # The client closed the stream: in 2026-07-28 that is the cancellation.
                    call.cancel("the client closed its stream")
                call.exchange.close()

    def _park(self, call: ParkedCall) -> RelayEvent:
        requests = {key: {"method": asked.method, "params": dict(asked.params)} for key, asked in call.pending.items()}
        self._parked.park(call)
        state = self._seal.for_parked(call.id, self._principal, self._method, self._name, call.deadline.remaining())
        return self._input_required(requests, state)

    def _input_required(self, requests: dict[str, Any], state: str | None) -> RelayEvent:
        result: dict[str, Any] = {"resultType": "input_required"}
        if requests:
            result["inputRequests"] = requests
        if state is not None:
            result["requestState"] = state
        return RelayEvent(result_response(self._request_id, self._shape(result)), final=True)

    def _keep(self, notification: Notification) -> bool:
        method = notification.method
        if method in ("notifications/tools/list_changed", "notifications/prompts/list_changed",
                      "notifications/resources/list_changed", "notifications/resources/updated"):
            self._on_stream_notification(notification)
            return False
        if method == "notifications/message":
            return self._request.log_level is not None and is_logged_at(notification.message, self._request.log_level)
        return method != "notifications/elicitation/complete"  # removed in 2026-07-28

    def _final_of(self, event: RelayEvent | None) -> RelayEvent:
        assert event is not None
        message = event.message or {}
        if "error" in message:
            error = message["error"]
            return self._error(JsonRpcError(error.get("code", INTERNAL_ERROR), error.get("message", ""),
                                            error.get("data"), http_status=event.http_status))
        return RelayEvent(result_response(self._request_id, self._shape(message.get("result", {}))), final=True)

    def _error(self, error: JsonRpcError) -> RelayEvent:
        shaped = modern_error(error)
        return RelayEvent(error_response(self._request_id, shaped), final=True, http_status=shaped.http_status)


# -- a legacy client answering a modern backend's input requests ----------------------------


class InputAnswers:
    """The answers to one ``input_required`` round, as a legacy client gives them on the
    call's stream (each request goes out as an ordinary request for the client)."""

    def __init__(self, event: InputRequired):
        self._event = event
        self._lock = threading.Lock()
        self._answers: dict[str, Any] = {}
        self._failure: dict[str, Any] | None = None
        self._done = threading.Event()
        if not event.requests:
            self._done.set()

    def requests(self) -> Iterator[ServerRequest]:
        for key, asked in self._event.requests.items():
            params = asked.get("params")
            yield ServerRequest(str(asked.get("method", "")), params if isinstance(params, dict) else {},
                                lambda answer, key=key: self._settle(key, answer), self._event.backend)

    def wait(self) -> dict[str, Any]:
        """The results by key, once every request is answered; a JSON-RPC error when one
        was refused or the call's deadline passed first."""
        if not self._done.wait(max(self._event.deadline.remaining(), 0.0)):
            raise JsonRpcError(REQUEST_TIMEOUT, "the client did not answer the backend's requests before the "
                                                "call's deadline", {"backend": self._event.backend})
        if self._failure is not None:
            code = self._failure.get("code")
            raise JsonRpcError(code if isinstance(code, int) else INTERNAL_ERROR,
                               str(self._failure.get("message", "the client refused the backend's request")),
                               {"backend": self._event.backend})
        return dict(self._answers)

    def _settle(self, key: str, answer: dict[str, Any]) -> None:
        with self._lock:
            if "error" in answer:
                self._failure = answer["error"] if isinstance(answer["error"], dict) else {}
                self._done.set()
                return
            self._answers[key] = answer.get("result")
            if len(self._answers) == len(self._event.requests):
                self._done.set()


def gather_input(event: InputRequired, ask: Any) -> Iterator[RelayEvent | Exchange]:
    """For a legacy client: each input request asked on the call's stream (``ask`` returns
    the message to write, or None when the request was answered at once), then the
    backend's exchange asked again with the answers (the last item)."""
    answers = InputAnswers(event)
    for request in answers.requests():
        message = ask(request)
        if message is not None:
            yield RelayEvent(message)
    responses = answers.wait()
    yield from_backend(event.retry(responses), event.backend)
