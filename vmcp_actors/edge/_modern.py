"""The client edge of MCP 2026-07-28, and the translation between eras, in one place.

A 2026-07-28 request carries no session: its ``_meta`` says which revision, which client
capabilities and (optionally) which log level, and its headers mirror its method and name.
``read_modern`` checks all of that, in the specification's order. Results carry
``resultType``, the server's identity and, for lists and reads, cache hints.

What the revisions disagree on is translated here, both ways:

* A 2026-07-28 backend that answers ``input_required`` (an ``InputRequired`` event):
  a modern client gets the backend's input requests as they are, with a ``requestState``
  sealed by the gateway (which backend, the backend's own state, who asked, for what);
  a legacy client is asked each of them on the call's stream (``edge._legacy.SessionSide``) and the
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vmcp_actors import __version__
from vmcp_actors.backends import InputRequired
from vmcp_actors.concurrency import TimerHandle, call_later
from vmcp_actors.core._exchange import Notification, ServerRequest
from vmcp_actors.core._tasks import RELATED_TASK
from vmcp_actors.edge._driver import (
    MAX_INPUT_ROUNDS,
    Answered,
    CallRun,
    Failed,
    Outcome,
)
from vmcp_actors.protocol import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
    RESOURCE_NOT_FOUND,
    JsonRpcError,
    Message,
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
    NAME_HEADER_PARAMS,
    SUPPORTED_PROTOCOL_VERSIONS,
    UI_EXTENSION,
    UNSUPPORTED_PROTOCOL_VERSION,
    check_answer,
    decode_header_value,
    is_logged_at,
    missing_capability,
)
from vmcp_actors.signing import Signer, Unsealable

logger = logging.getLogger(__name__)

# Watches the client's connection: calls back when the client goes away, until unwatched.
WatchHangup = Callable[[Callable[[], None]], Callable[[], None]]

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
STATE_PURPOSE = "requestState"
# Server capabilities towards 2026-07-28 clients (no logging/setLevel, subscriptions
# through subscriptions/listen).
MODERN_SERVER_CAPABILITIES = {
    "tools": {"listChanged": True},
    "resources": {"subscribe": True, "listChanged": True},
    "prompts": {"listChanged": True},
    "completions": {},
    "logging": {},  # deprecated in 2026-07-28, still served: log messages at the level a request asks for
    # backends' tasks relayed (core._task_relay); MCP Apps passed through (core._shared_names)
    "extensions": {"io.modelcontextprotocol/tasks": {}, UI_EXTENSION: {}},
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
    named = NAME_HEADER_PARAMS.get(message.method or "")
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
    # tasks/update's inputResponses are its own params (a task's input), not a round of this request
    rounds = params is not None and message.method != "tasks/update"
    responses = params.get("inputResponses") if rounds else None
    state = params.get("requestState") if rounds else None
    if responses is not None and not isinstance(responses, dict):
        raise _refused(INVALID_PARAMS, "inputResponses must be an object")
    if state is not None and not isinstance(state, str):
        raise _refused(INVALID_PARAMS, "requestState must be a string")
    if (responses is not None or state is not None) and message.method not in INPUT_REQUIRED_METHODS:
        raise _refused(INVALID_PARAMS, f"{message.method} takes no inputResponses or requestState")
    if responses is not None and state is None:
        # Every input_required the gateway answers carries its sealed requestState: input
        # without one was never asked for, and must not pass as a continuation.
        raise _refused(INVALID_PARAMS, "inputResponses without requestState: the gateway asked for no input "
                                       "(send the requestState of the input_required answer back with them)")
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
        shaped["cacheScope"] = hints.scope
        if method == "resources/read":
            ttl = result.get("ttlMs")
            shaped["ttlMs"] = ttl if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl >= 0 else 0
            if result.get("cacheScope") != "public":  # the backend's answer may be for this caller only
                shaped["cacheScope"] = "private"
        else:
            shaped["ttlMs"] = hints.list_ttl_ms
    return shaped


def legacy_result(result: Mapping[str, Any]) -> Mapping[str, Any]:
    """A 2026-07-28 backend's result as a 2025 client gets it: without the fields of the
    newer revision (``resultType``, cache hints, the backend's ``io.modelcontextprotocol/``
    metadata such as its identity; the related task, which 2025-11-25 has too, stays)."""
    if not any(key in result for key in ("resultType", "ttlMs", "cacheScope", "_meta")):
        return result
    shaped = {key: value for key, value in result.items() if key not in ("resultType", "ttlMs", "cacheScope")}
    meta = shaped.get("_meta")
    if isinstance(meta, dict) and any(key.startswith(META_PREFIX) and key != RELATED_TASK for key in meta):
        kept = {key: value for key, value in meta.items() if not key.startswith(META_PREFIX) or key == RELATED_TASK}
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


class ParkedCalls:
    """The calls of this process that wait for a 2026-07-28 client's retry (a backend's
    request for the client, or a composite's elicitation step, answered as
    ``input_required``). Each is taken by exactly one retry; one nobody comes back for
    ends at its request's deadline (its backend gets an error for every request left
    unanswered)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _calls
        self._calls: dict[str, tuple[CallRun, TimerHandle]] = {}  # by id: the run and its deadline's timer

    def park(self, run: CallRun) -> None:
        run.parked = True
        run.give_back_place()  # it waits on its client: no bulkhead place until the retry comes
        timer = call_later(max(run.deadline.remaining(), 0.0), lambda: self._expire(run.id))
        with self._lock:
            self._calls[run.id] = (run, timer)

    def take(self, run_id: Any) -> CallRun | None:
        with self._lock:
            parked = self._calls.pop(run_id, None) if isinstance(run_id, str) else None
        if parked is None:
            return None
        run, timer = parked
        timer.cancel()
        run.parked = False
        return run

    def count(self) -> int:
        with self._lock:
            return len(self._calls)

    def end_all(self) -> None:
        with self._lock:
            parked, self._calls = list(self._calls.values()), {}
        for run, timer in parked:
            timer.cancel()
            abandon(run, "the gateway is shutting down")

    def _expire(self, run_id: str) -> None:
        run = self.take(run_id)
        if run is not None:
            abandon(run, "the client did not come back with the input before the call's deadline")


def abandon(run: CallRun, why: str) -> None:
    """End a call no client will answer: its requests fail, its backend is told, its exchange closes."""
    for request in run.pending.values():
        request.respond({"error": {"code": REQUEST_TIMEOUT, "message": why}})
    run.pending.clear()
    if run.cancel is not None:
        try:
            run.cancel(why)
        except Exception:  # noqa: BLE001 - best effort: the exchange is closed below anyway
            logger.debug("cancelling a parked call failed", exc_info=True)
    run.exchange.close()


# -- a 2026-07-28 client in one call ------------------------------------------------------


class StatelessSide:
    """A 2026-07-28 client in one call (see ``edge._driver.ClientSide``): log messages only
    at the level the request asked for (none when it asked for none), list changes and
    resource updates to the user (they belong on ``subscriptions/listen`` streams), a
    backend's request for the client as ``input_required`` with the call parked here, a
    2026-07-28 backend's ``input_required`` passed on under a sealed ``requestState``."""

    def __init__(self, method: str, name: Any, request: ModernRequest, principal: list[str], seal: StateSeal,
                 parked: ParkedCalls, shape: Callable[[Mapping[str, Any]], dict[str, Any]],
                 on_stream_notification: Callable[[Notification], None], watch_hangup: WatchHangup | None = None):
        self._method = method
        self._name = name
        self._request = request
        self._principal = principal
        self._seal = seal
        self._parked = parked
        self._shape = shape  # a result as the client gets it
        self._on_stream_notification = on_stream_notification  # list changes, resource updates
        self._keys = itertools.count(1)
        self._watch_hangup = watch_hangup
        self._unwatch: Callable[[], None] | None = None
        self._gone_lock = threading.Lock()  # orders the client's hang-up against the call's opening
        self._gone = False

    def attend(self, run: CallRun) -> None:
        """Watch the client's connection while ``run`` goes on: closing it cancels the call
        (2026-07-28: a client disconnect is the cancellation), even before anything is written."""
        if self._watch_hangup is not None:
            self._unwatch = self._watch_hangup(lambda: self._hung_up(run))

    def _hung_up(self, run: CallRun) -> None:
        with self._gone_lock:
            cancel = run.cancel
            self._gone = cancel is None  # not opened yet: cancelled as it opens
        if cancel is not None:
            logger.info("a 2026-07-28 client closed its %s request: the call is cancelled", self._method)
            cancel("the client closed its request")

    def keep(self, notification: Notification) -> bool:
        method = notification.method
        if method in ("notifications/tools/list_changed", "notifications/prompts/list_changed",
                      "notifications/resources/list_changed", "notifications/resources/updated"):
            self._on_stream_notification(notification)
            return False
        if method == "notifications/message":
            return self._request.log_level is not None and is_logged_at(notification.message, self._request.log_level)
        return method != "notifications/elicitation/complete"  # removed in 2026-07-28

    def opened(self, run: CallRun) -> None:
        with self._gone_lock:
            gone = self._gone  # the client left before the call reached its backend
        if gone and run.cancel is not None:
            run.cancel("the client closed its request")

    def asked(self, request: ServerRequest, run: CallRun) -> Outcome | None:
        why_not = missing_capability(request.method, request.params, self._request.client_capabilities)
        if why_not is not None:
            request.respond({"error": {"code": METHOD_NOT_FOUND, "message": why_not}})
            return None
        run.pending[f"input-{run.id[:6]}-{next(self._keys)}"] = request
        return self.park(run)

    def input_required(self, event: InputRequired, run: CallRun) -> Outcome:
        state = self._seal.for_backend(event, self._principal, self._method, self._name)
        return self._input_required({key: dict(value) for key, value in event.requests.items()}, state)

    def answered(self, result: Mapping[str, Any]) -> Outcome:
        return Answered(self._shape(result))

    def failed(self, error: JsonRpcError) -> Outcome:
        return Failed(modern_error(error))

    def left(self, run: CallRun) -> None:
        if run.cancel is not None:
            run.cancel("the client closed its stream")  # in 2026-07-28, that is the cancellation

    def finished(self, run: CallRun) -> None:
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()

    def park(self, run: CallRun) -> Outcome:
        """The call waits here for the client's retry: ``input_required`` with what it asks."""
        requests = {key: {"method": asked.method, "params": dict(asked.params)} for key, asked in run.pending.items()}
        self._parked.park(run)
        state = self._seal.for_parked(run.id, self._principal, self._method, self._name, run.deadline.remaining())
        return self._input_required(requests, state)

    def answer_parked(self, run: CallRun) -> Outcome | None:
        """A parked call taken by this retry: its answers go to whoever asked. The outcome
        when the call cannot go on yet (still unanswered: parked again; too many rounds),
        else None: drive it on."""
        try:
            run.take_place_again()  # before the backend hears an answer and goes on working
        except JsonRpcError as error:
            abandon(run, error.message)
            return self.failed(error)
        for key, answer in (self._request.input_responses or {}).items():
            asked = run.pending.get(key)
            if asked is None:
                continue  # not one of ours: ignored, as the specification says
            problem = check_answer(asked.method, Message("response", None, key, answer)) \
                if isinstance(answer, dict) else "the answer must be an object"
            if problem is None:
                del run.pending[key]
                asked.respond({"result": answer})
        run.rounds += 1
        if run.rounds > MAX_INPUT_ROUNDS:
            abandon(run, "too many input rounds")
            # the client's doing (answers that answer nothing): refused as its request
            return self.failed(JsonRpcError(INVALID_PARAMS, f"the call took more than {MAX_INPUT_ROUNDS} input rounds"))
        if run.pending:
            return self.park(run)
        return None

    def _input_required(self, requests: dict[str, Any], state: str | None) -> Outcome:
        result: dict[str, Any] = {"resultType": "input_required"}
        if requests:
            result["inputRequests"] = requests
        if state is not None:
            result["requestState"] = state
        return Answered(self._shape(result))
