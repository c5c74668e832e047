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
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pykka

from vmcp_actors import __version__
from vmcp_actors.backends._backoff import HandshakeBackoff
from vmcp_actors.backends._auth import OutgoingAuth, PersonalOAuth, Unauthenticated
from vmcp_actors.backends._http import STREAM_OPEN, Abort, McpHttpClient
from vmcp_actors.backends._models import Handshake, compose_instructions
from vmcp_actors.concurrency import (
    ASK_TIMEOUT,
    Deadline,
    on_settled,
    run_call,
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
    NAME_HEADER_PARAMS,
    encode_header_value,
)
from vmcp_actors.shared_cache import SharedCache
from vmcp_actors.limits import Bulkheads, Place, QueueTimeout

logger = logging.getLogger(__name__)

CLIENT_INFO = {"name": "vmcp-actors", "version": __version__}


@dataclass(frozen=True)
class BackendRequest:
    """A request the backend sent us (sampling, elicitation, roots, ping), during a call
    or on its standalone stream. ``reply`` takes ``{"result": ...}`` or ``{"error": ...}``
    and sends it back under the backend's own id (``id``), on the backend session it came
    from."""

    backend: str
    method: str
    params: Mapping[str, Any]
    reply: Callable[[dict[str, Any]], None]
    id: Any = None


@dataclass(frozen=True)
class CallOpened:
    """First of an exchange's events: ``cancel(reason)`` ends it (the backend is told with
    notifications/cancelled under the id the gateway gave the request); ``leave()`` only
    closes the stream (the request's work goes on at the backend); ``place``: a tools/call's
    place at the backend's bulkhead (None without one), which a parked call gives back."""

    backend: str
    cancel: Callable[[str | None], None]
    leave: Callable[[], None] = lambda: None
    place: Place | None = None


NO_LONGER_WANTED = "the caller no longer wants the answer (its composite run ended)"


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
_OPENING = {LEGACY: "initialize", MODERN: "server/discover"}


class _NotThisEra(Exception):
    """A ``server/discover`` answer that offers no 2026-07-28."""


# How long what a backend speaks is remembered: a backend upgraded meanwhile is probed
# again after this.
ERA_REMEMBERED_FOR = 3600.0
ERA_NAMESPACE = "backend-eras"
INSTRUCTIONS_NAMESPACE = "backend-instructions"
# What another process's handshake said (or that none is recorded) is read from the shared
# level at most this often per backend: every initialize asks, Redis need not answer each.
SHARED_INSTRUCTIONS_FRESH = 10.0
# How a backend of the other revision refuses our first message: a JSON-RPC error with one
# of these codes (-32022: unsupported protocol version), or one of these HTTP statuses.
REFUSAL_CODES = frozenset({-32022, -32600, -32601, -32602})
REFUSAL_STATUSES = frozenset({400, 404, 405, 406, 415})


class BackendEras:
    """What each backend speaks, as handshakes found out: per era, True (it answered),
    False (it refused) or unknown. Process-wide and thread-safe; with a shared second level
    (records in Redis) every process learns from the first, so a new process does not probe
    again. A handshake skips an era the backend is known to refuse; what is learned is
    forgotten after ERA_REMEMBERED_FOR. ``pinned`` (from config) is never probed."""

    def __init__(self, pinned: Mapping[str, str] | None = None, shared: SharedCache | None = None,
                 urls: Mapping[str, str] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()  # guards the facts learned per backend; never nested
        self._pinned = dict(pinned or {})
        self._shared = shared
        self._urls = dict(urls or {})  # the shared level is keyed by name and URL: a moved backend is new
        self._clock = clock
        self._known: dict[str, tuple[dict[str, bool], float]] = {}  # backend -> (era -> speaks, learned at)
        self._instructions: dict[str, str | None] = {}  # backend -> what its last handshake said
        # backend -> (what the shared level held: an entry, or None for none, read at)
        self._read_shared: dict[str, tuple[dict[str, Any] | None, float]] = {}

    def said(self, backend: str, instructions: str | None) -> None:
        """A handshake's ``instructions`` (None: it gave none), kept for the next clients."""
        with self._lock:
            if self._instructions.get(backend, "") == instructions:
                return
            self._instructions[backend] = instructions
        if self._shared is not None:
            self._shared.put(INSTRUCTIONS_NAMESPACE, self._shared_key(backend), {"text": instructions},
                             ERA_REMEMBERED_FOR)

    def instructions(self, backends: list[str]) -> str | None:
        """What ``backends`` said in their handshakes, composed (``compose_instructions``),
        from this process or the shared level: no backend is contacted."""
        with self._lock:
            known = {name: self._instructions[name] for name in backends if name in self._instructions}
        if self._shared is not None:
            for name in backends:
                if name not in known:
                    entry = self._shared_instructions(name)
                    if entry is not None:
                        known[name] = entry["text"]
        return compose_instructions(known)

    def _shared_instructions(self, backend: str) -> dict[str, Any] | None:
        """The shared level's entry for ``backend`` (None: none), read again once
        SHARED_INSTRUCTIONS_FRESH has passed."""
        now = self._clock()
        with self._lock:
            read = self._read_shared.get(backend)
        if read is not None and now - read[1] < SHARED_INSTRUCTIONS_FRESH:
            return read[0]
        assert self._shared is not None
        entry = self._shared.get(INSTRUCTIONS_NAMESPACE, self._shared_key(backend))
        if not (isinstance(entry, dict) and isinstance(entry.get("text"), (str, type(None)))):
            entry = None
        with self._lock:
            self._read_shared[backend] = (entry, now)
        return entry

    def pinned(self, backend: str) -> str | None:
        return self._pinned.get(backend)

    def speaks(self, backend: str, era: str) -> bool | None:
        """Whether ``backend`` speaks ``era`` (None: not known). May read the shared level:
        call it off actor loops (handshakes run on the I/O pool)."""
        pinned = self._pinned.get(backend)
        if pinned is not None:
            return era == pinned
        return self._facts(backend).get(era)

    def get(self, backend: str) -> str | None:
        """The era a backend is first spoken to in, as known in this process: pinned,
        ``modern`` when it answers 2026-07-28, ``legacy`` when it refuses it."""
        pinned = self._pinned.get(backend)
        if pinned is not None:
            return pinned
        with self._lock:
            facts = self._fresh(backend)
        modern = facts.get(MODERN)
        return None if modern is None else MODERN if modern else LEGACY

    def learn(self, backend: str, era: str, speaks: bool) -> None:
        with self._lock:
            facts = {**self._fresh(backend), era: speaks}
            self._known[backend] = (facts, self._clock())
        if self._shared is not None:
            self._shared.put(ERA_NAMESPACE, self._shared_key(backend), facts, ERA_REMEMBERED_FOR)

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            names = list(self._known)
        known = {name: era for name in names if (era := self.get(name)) is not None}
        return {**known, **self._pinned}

    def _facts(self, backend: str) -> dict[str, bool]:
        with self._lock:
            facts = self._fresh(backend)
        if facts or self._shared is None:
            return facts
        shared = self._shared.get(ERA_NAMESPACE, self._shared_key(backend))
        if not isinstance(shared, dict):
            return {}
        facts = {era: value for era, value in shared.items() if era in (MODERN, LEGACY) and isinstance(value, bool)}
        with self._lock:
            self._known[backend] = (facts, self._clock())  # forgotten here when the shared entry is, about
        return facts

    def _fresh(self, backend: str) -> dict[str, bool]:
        """Under the lock: what is known of ``backend`` and not yet forgotten."""
        entry = self._known.get(backend)
        if entry is None:
            return {}
        if self._clock() - entry[1] > ERA_REMEMBERED_FOR:
            del self._known[backend]
            return {}
        return entry[0]

    def _shared_key(self, backend: str) -> list[str]:
        return [backend, self._urls.get(backend, "")]


_STREAMED, _INTERJECTED, _ANSWERED, _FAILED = "streamed", "interjected", "answered", "failed"
_Mailbox = queue.Queue  # of (kind, value): what the reader thread and interjections bring
# What a call's reader thread queues for a client that has not read it yet. Past it the
# reader waits, and the backend's stream with it, as on a direct connection (nothing is
# dropped); a request interjected into a full mailbox is not delivered to that call.
CALL_MAILBOX = 256


class _CallsInFlight:
    """The mailboxes of one backend session's calls that take interjected requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the open mailboxes; never nested
        self._open: list[_Mailbox] = []

    def open(self) -> _Mailbox:
        mailbox: _Mailbox = queue.Queue(maxsize=CALL_MAILBOX)
        with self._lock:
            self._open.append(mailbox)
        return mailbox

    def close(self, mailbox: _Mailbox, backend: str) -> None:
        with self._lock:
            self._open.remove(mailbox)
        # A request interjected as the call ended: no one will read it, so it is refused.
        while True:
            try:
                kind, value = mailbox.get_nowait()
            except queue.Empty:
                return
            if kind is _INTERJECTED:
                logger.warning("backend %r asked for %s outside a call just as the call ended; refused",
                               backend, value.method)
                value.reply({"error": {"code": INTERNAL_ERROR,
                                       "message": f"{value.method}: the call it was delivered to ended"}})

    def deliver_to_only(self, request: BackendRequest) -> bool:
        with self._lock:
            if len(self._open) != 1:
                return False
            try:
                self._open[0].put_nowait((_INTERJECTED, request))
            except queue.Full:  # its client is not reading the call: the request goes elsewhere
                return False
            return True


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
                 request_id_base: int = 0, prefers_legacy: bool = False, bulkheads: Bulkheads | None = None,
                 backoff: HandshakeBackoff | None = None, backoff_owner: str = ""):
        """``backoff``: failed handshakes remembered across channels, for ``backoff_owner``
        (whose credentials or process the channel uses)."""
        self.name = name
        self._backoff = backoff
        self._backoff_owner = backoff_owner
        self._bulkheads = bulkheads  # backends[].maxConcurrentCalls: tools/call wait for a place
        self.timeout = timeout
        self._eras = eras if eras is not None else BackendEras()
        # The user's clients are 2025 sessions that take requests: 2025 first (see UserKey).
        self._prefers_legacy = prefers_legacy
        self.era_reason: str | None = None  # why the last handshake speaks its era (admin state)
        # What the gateway declares at initialize: what the user's clients declared.
        self._client_capabilities = dict(client_capabilities or {})
        self._client = client
        self._auth = auth if auth is not None else Unauthenticated()
        self._ids = _RequestIds(request_id_base)
        self._connection: Any = None  # ActorProxy[BackendConnection], attached when it is created
        self._handshake: cf.Future[Handshake] | None = None
        self._calls = _CallsInFlight()

    @property
    def personal(self) -> Any:
        """The connection service when each person connects this backend (type oauth), else None."""
        return self._auth.tokens if isinstance(self._auth, PersonalOAuth) else None

    @property
    def takes_requests(self) -> bool:
        """The gateway declared sampling, elicitation or roots to this backend (its user's
        clients did): on a 2025 session it may then ask for them, outside a call too, so
        its standalone stream stays open and calls take requests that arrive there."""
        return any(name in self._client_capabilities for name in ("sampling", "elicitation", "roots"))

    def interject(self, request: BackendRequest) -> bool:
        """A request the backend sent outside any call: delivered into this user's one call
        in flight on this backend session, as if it came on that call's stream. False
        (nothing done) when no call, or more than one, is in flight."""
        return self._calls.deliver_to_only(request)

    # -- the BackendConnection actor only ------------------------------------------------

    def attach(self, connection: Any) -> None:
        self._connection = connection

    def publish_handshake(self, handshake: cf.Future[Handshake] | None) -> None:
        self._handshake = handshake

    def perform_handshake(self, identity: Identity | None) -> Handshake:
        """What the backend speaks and offers. The user's preferred era first (2026-07-28:
        ``server/discover``, no session; 2025: initialize, then notifications/initialized),
        the other when the backend refuses it (or is known to); what worked, and what was
        refused, is remembered for the backend. A pooled job: it is shared by every request
        of the user, so it waits the backend's timeout, not one request's deadline. Its
        instructions are remembered for the backend (what initialize tells clients). While
        the backend backs off after a failed handshake, it fails at once."""
        try:
            if self._backoff is None:
                handshake = self._handshake_in_some_era(identity)
            else:
                with self._backoff.attempt(self.name, self._backoff_owner):
                    handshake = self._handshake_in_some_era(identity)
        except BackendHTTPError as error:
            raise self._refusal(identity, error) from None
        self._eras.said(self.name, handshake.instructions)
        return handshake

    def _handshake_in_some_era(self, identity: Identity | None) -> Handshake:
        pinned = self._eras.pinned(self.name)
        if pinned is not None:
            handshake = self._attempt(pinned, identity, strict=True)
            assert handshake is not None
            self.era_reason = f"pinned in the config (protocol: {pinned})"
            return handshake
        preferred = (LEGACY, MODERN) if self._prefers_legacy else (MODERN, LEGACY)
        order = [era for era in preferred if self._eras.speaks(self.name, era) is not False] or list(preferred)
        for era in order:
            handshake = self._attempt(era, identity, strict=era == order[-1])
            if handshake is not None:
                self._eras.learn(self.name, era, True)
                self.era_reason = self._why(era, skipped=era != preferred[0])
                return handshake
            self._eras.learn(self.name, era, False)
        raise AssertionError("the last era is attempted strictly")  # pragma: no cover

    def _attempt(self, era: str, identity: Identity | None, strict: bool) -> Handshake | None:
        """A handshake in ``era``; None when the backend refuses it as one of the other
        revision would (``strict``: that refusal is raised)."""
        try:
            return self._discover(identity) if era == MODERN else self._initialize(identity)
        except BackendRpcError as refused:
            # Only a refusal says the backend speaks no such revision (and is remembered):
            # a version or method error, or a 4xx one; another error (an internal one, a
            # 5xx) fails this handshake and is tried again next time.
            if strict or (refused.code not in REFUSAL_CODES and refused.status not in REFUSAL_STATUSES):
                raise
            logger.debug("backend %r refused %s (%d)", self.name, _OPENING[era], refused.code)
            return None
        except BackendHTTPError as refused:
            if strict or refused.status not in REFUSAL_STATUSES:
                raise
            logger.debug("backend %r refused %s (HTTP %d)", self.name, _OPENING[era], refused.status)
            return None
        except _NotThisEra:
            if strict:
                raise BackendProtocolError(self.name, f"backend {self.name!r} does not speak "
                                                      f"{MODERN_PROTOCOL_VERSION} (its server/discover answer "
                                                      "does not offer it)") from None
            return None

    def _why(self, era: str, skipped: bool) -> str:
        """For the admin state: why this user's connection speaks ``era``."""
        if era == MODERN and not skipped:
            return f"the backend speaks {MODERN_PROTOCOL_VERSION} (it answers server/discover)"
        if era == LEGACY and not skipped:
            return ("it serves a 2025 client session: a 2025 backend session of its own keeps that client's "
                    "state, and takes sampling, elicitation or roots, as directly")
        if era == LEGACY:
            return f"the backend speaks no {MODERN_PROTOCOL_VERSION} (it refuses server/discover)"
        return (f"the backend speaks only {MODERN_PROTOCOL_VERSION} (it refuses initialize): what it asks is "
                "translated for this user's 2025 clients")

    def _discover(self, identity: Identity | None) -> Handshake:
        """The backend's ``server/discover`` answer as a handshake. Raises _NotThisEra when
        it answers without offering 2026-07-28."""
        message = {"jsonrpc": "2.0", "id": self._ids.next(), "method": "server/discover",
                   "params": {"_meta": self.modern_meta()}}
        headers = {**self.headers_for(identity), METHOD_HEADER: "server/discover"}
        reply = self._client.post(message, session_id=None, protocol_version=MODERN_PROTOCOL_VERSION,
                                  timeout=self.timeout, extra_headers=headers)
        answer = reply.message
        error = answer.get("error") if isinstance(answer, dict) else None
        if isinstance(error, dict):  # a refusal (method, version) or a bad moment: _attempt tells which
            code = error.get("code")
            raise BackendRpcError(self.name, code if isinstance(code, int) else INTERNAL_ERROR,
                                  str(error.get("message", ""))[:500], error.get("data"))
        if not isinstance(answer, dict) or not isinstance(answer.get("result"), dict):
            raise _NotThisEra()
        result = answer["result"]
        versions = result.get("supportedVersions")
        if not isinstance(versions, list) or MODERN_PROTOCOL_VERSION not in versions:
            raise _NotThisEra()
        capabilities = result.get("capabilities")
        meta = result.get("_meta")
        server_info = meta.get(META_SERVER_INFO) if isinstance(meta, dict) else None
        return Handshake(
            session_id=None,
            protocol_version=MODERN_PROTOCOL_VERSION,
            capabilities=MappingProxyType(dict(capabilities) if isinstance(capabilities, dict) else {}),
            server_info=MappingProxyType(dict(server_info) if isinstance(server_info, dict) else {}),
            instructions=_instructions(result),
        )

    def modern_meta(self, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A 2026-07-28 request's ``_meta``: the caller's own keys (a progress token, the
        log level it asked for) with the gateway's revision, capabilities and identity."""
        merged = dict(meta or {})
        merged[META_PROTOCOL_VERSION] = MODERN_PROTOCOL_VERSION
        asked = merged.get(META_CLIENT_CAPABILITIES)
        capabilities = dict(self._client_capabilities)
        if isinstance(asked, Mapping) and isinstance(asked.get("extensions"), Mapping):
            # a call's own extensions (the tasks extension when its client takes a task)
            capabilities["extensions"] = {**(capabilities.get("extensions") or {}), **asked["extensions"]}
        merged[META_CLIENT_CAPABILITIES] = capabilities
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
            instructions=_instructions(result),
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
        exchange runs as one job of the calls' own pool (``run_call``) once the handshake is
        there (a renewal after a 404 likewise), chained by callbacks: no pooled thread waits
        for another job. Cancelling the future drops a call not sent yet and cancels one in
        flight."""
        outcome: cf.Future[dict[str, Any]] = cf.Future()

        def attempt(handshake_future: cf.Future[Handshake], renewed: bool) -> None:
            error = handshake_future.exception()
            if error is not None:
                self._fail(outcome, error)
                return
            if outcome.cancelled():
                return
            handshake = handshake_future.result()
            job = run_call(self.call_with, identity, handshake, method, params, deadline, headers, outcome)

            def finished(done: cf.Future[dict[str, Any]]) -> None:
                if outcome.cancelled():
                    return  # nobody waits: nor is the connection at fault
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

    def _refusal(self, identity: Identity | None, error: BackendHTTPError) -> BackendError:
        """A 401 or 403 to a person's own token: they are asked to connect (again)."""
        if not isinstance(self._auth, PersonalOAuth) or error.status not in (401, 403):
            return error
        try:
            sent = self._auth.headers(identity)
        except BackendError as needed:
            return needed  # it lapsed meanwhile: that says it
        return self._auth.refused(identity, error.status, error.challenge, sent) or error

    def exchange_with(self, identity: Identity | None, handshake: Handshake, method: str,
                      params: dict[str, Any] | None, deadline: Deadline | None = None,
                      extra_headers: Mapping[str, str] | None = None) -> Exchange:
        """One exchange on the backend session ``handshake`` names (no renewal here).
        ``extra_headers``: a 2026-07-28 call's ``Mcp-Param-*`` headers."""
        try:
            return (yield from self._exchange_with(identity, handshake, method, params, deadline, extra_headers))
        except BackendHTTPError as error:
            raise self._refusal(identity, error) from None

    def _exchange_with(self, identity: Identity | None, handshake: Handshake, method: str,
                       params: dict[str, Any] | None, deadline: Deadline | None = None,
                       extra_headers: Mapping[str, str] | None = None) -> Exchange:
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

        # A call that may be asked for something from outside (see interject) is read by a
        # thread of its own while this one waits on its mailbox; any other is read here.
        mailbox = self._calls.open() if self.takes_requests and not handshake.is_modern \
            and not getattr(self._client, "routes_requests", False) else None
        place = self._bulkheads.place(self.name) if self._bulkheads is not None and method == "tools/call" else None
        yield CallOpened(self.name, cancel, abort.abort, place)
        try:
            self._take_place(place, deadline, timeout, abort)
        except BaseException:
            if mailbox is not None:
                self._calls.close(mailbox, self.name)
            raise
        try:
            if deadline is not None:
                timeout = deadline.cap(self.timeout)  # less what the wait for a place took
            return (yield from self._sent(method, message, handshake, headers, timeout, abort, mailbox))
        except BackendTimeout:
            # The gateway stops waiting: the backend is told, as MCP asks of a sender that gives up.
            cancel(f"no answer within {timeout:g} s: the gateway stopped waiting")
            raise
        finally:
            if place is not None:
                place.leave()

    def _take_place(self, place: Place | None, deadline: Deadline | None, timeout: float, abort: Abort) -> None:
        """A place at the backend's bulkhead for a tools/call (waited for within the deadline)."""
        if place is None:
            return
        try:
            place.take(deadline if deadline is not None else Deadline(timeout), lambda: abort.aborted)
        except QueueTimeout:
            if abort.aborted:
                raise BackendCancelled(self.name, "cancelled while it waited for a place") from None
            raise BackendTimeout(self.name, f"backend {self.name!r}: the request's deadline passed while it waited "
                                            f"for one of the backend's {self._bulkheads.limit(self.name)} places "
                                            "(maxConcurrentCalls)") from None

    def _sent(self, method: str, message: dict[str, Any], handshake: Handshake, headers: dict[str, str],
              timeout: float, abort: Abort, mailbox: Any) -> Exchange:
        exchange = self._client.exchange(
            message,
            session_id=handshake.session_id,
            protocol_version=handshake.protocol_version,
            timeout=timeout,
            extra_headers=headers,
            abort=abort,
        )
        if mailbox is not None:
            try:
                answer = yield from self._read_with_interjections(exchange, abort, mailbox, timeout, handshake, headers)
            finally:
                self._calls.close(mailbox, self.name)
            return self._result_of(answer, method)
        try:
            while True:
                try:
                    streamed = next(exchange)
                except StopIteration as answered:
                    return self._result_of(answered.value, method)
                yield self._incoming(streamed, handshake, headers)
        finally:
            exchange.close()

    def _read_with_interjections(self, exchange: Generator[Any, None, Any], abort: Abort, mailbox: _Mailbox,
                                 timeout: float, handshake: Handshake, headers: dict[str, str]) -> Generator[Any, None, Any]:
        """The exchange's messages and the requests interjected into the call, in arrival
        order; returns the backend's answer. A ``vmcp-call-<backend>`` thread reads the
        exchange into the mailbox (and closes it); closing this generator aborts that read."""

        def last(item: tuple[str, Any]) -> None:  # the waiting thread reads it, or has emptied the mailbox
            try:
                mailbox.put(item, timeout=timeout + 5.0)
            except queue.Full:
                logger.debug("backend %r: a call's end found no one reading", self.name)

        def read() -> None:
            try:
                while True:
                    try:
                        streamed = next(exchange)
                    except StopIteration as answered:
                        last((_ANSWERED, answered.value))
                        return
                    while True:  # a full mailbox: the client reads slowly, the backend's stream waits
                        try:
                            mailbox.put((_STREAMED, streamed), timeout=1.0)
                            break
                        except queue.Full:
                            if abort.aborted:
                                raise BackendCancelled(self.name, "the call was given up") from None
            except BaseException as error:  # noqa: BLE001 - the waiting thread raises it
                last((_FAILED, error))
            finally:
                exchange.close()

        threading.Thread(target=read, name=f"vmcp-call-{self.name}", daemon=True).start()
        # The read ends within its timeout (or at abort); this margin only guards against a bug.
        give_up_at = time.monotonic() + timeout + 5.0
        finished = False
        try:
            while True:
                try:
                    kind, value = mailbox.get(timeout=max(give_up_at - time.monotonic(), 0.0))
                except queue.Empty:
                    raise BackendTimeout(self.name, f"backend {self.name!r} did not answer within "
                                                    f"{timeout:g} s") from None
                if kind is _STREAMED:
                    yield self._incoming(value, handshake, headers)
                elif kind is _INTERJECTED:
                    yield value
                elif kind is _ANSWERED:
                    finished = True
                    return value
                else:
                    finished = True
                    raise value
        finally:
            if not finished:
                abort.abort()  # the reader stops and closes the exchange

    def listen(self, identity: Identity | None, handshake: Handshake, abort: Abort,
               resource_uris: frozenset[str] = frozenset()) -> Iterator[Any]:
        """The backend's standalone stream: STREAM_OPEN once the backend has it, then
        notifications (dicts) and BackendRequests, until the backend ends it or ``abort`` is called. A 2026-07-28 backend's is its
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
            if message is STREAM_OPEN:
                yield message
                continue
            if handshake.is_modern:
                message = _without_subscription_id(message)
                if message.get("method") == "notifications/subscriptions/acknowledged":
                    yield STREAM_OPEN
                    continue
            yield self._incoming(message, handshake, headers)

    def handshake(self, identity: Identity | None, deadline: Deadline) -> Handshake:
        """The backend's handshake, made first when there is none yet (within ``deadline``)."""
        return self._await(self._handshake_future(identity), deadline)

    def answer(self, identity: Identity | None, request_id: Any, answer: dict[str, Any], deadline: Deadline) -> None:
        """Answer a request the backend sent on this user's backend session (``{"result"}``
        or ``{"error"}`` under the backend's ``request_id``), from any worker: the session
        is the user's, not the stream's."""
        handshake = self.handshake(identity, deadline)
        self._client.post({"jsonrpc": "2.0", "id": request_id, **answer}, session_id=handshake.session_id,
                          protocol_version=handshake.protocol_version, timeout=deadline.cap(self.timeout),
                          extra_headers=self.headers_for(identity))

    def capabilities(self) -> Mapping[str, Any]:
        """What the backend's current handshake declared ({} before there is one)."""
        published = self._handshake
        if published is not None and published.done() and published.exception() is None:
            return published.result().capabilities
        return {}

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
                  extra_headers: Mapping[str, str] | None = None, wanted: cf.Future[Any] | None = None) -> dict[str, Any]:
        """``exchange_with`` for the gateway's own use: notifications dropped, result
        returned. A call whose ``wanted`` future is cancelled first is not sent at all, and
        one in flight when it is, is cancelled."""
        if wanted is not None and wanted.cancelled():
            raise BackendCancelled(self.name, NO_LONGER_WANTED)
        return drain(self.exchange_with(identity, handshake, method, params, deadline, extra_headers), wanted)

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
            named = NAME_HEADER_PARAMS.get(method)
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

        return BackendRequest(self.name, message["method"], params if isinstance(params, dict) else {}, reply, backend_id)

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


def drain(exchange: Exchange, wanted: cf.Future[Any] | None = None) -> dict[str, Any]:
    """Run an exchange to its end, dropping its notifications; its result. There is no
    client to ask on the gateway's own calls, so a backend's request is refused at once.
    When ``wanted`` is cancelled meanwhile, the call is cancelled (the backend told)."""
    try:
        while True:
            event = next(exchange)
            if isinstance(event, CallOpened) and wanted is not None:
                on_settled(wanted, lambda done, opened=event: done.cancelled() and opened.cancel(NO_LONGER_WANTED))
            elif isinstance(event, BackendRequest):
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


# Longer instructions are cut: they go into every client's context, whatever a backend sends.
MAX_INSTRUCTIONS = 16 * 1024


def _instructions(result: Mapping[str, Any]) -> str | None:
    """The handshake's ``instructions``, when it gave a usable one."""
    text = result.get("instructions")
    return text[:MAX_INSTRUCTIONS] if isinstance(text, str) and text else None
