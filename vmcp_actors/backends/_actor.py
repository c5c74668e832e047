"""BackendConnection: one backend, one user session.

The actor owns the connection's state (handshake, state machine, last error, counts).
Every HTTP exchange runs on its own thread and reports back with a message, so a slow
call never holds the actor's loop and concurrent calls to one backend overlap.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
from collections.abc import Callable
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pykka

from vmcp_actors import __version__
from vmcp_actors.backends._http import McpHttpClient
from vmcp_actors.backends._models import BackendCapabilities, ConnectionSnapshot, ConnectionState, Handshake
from vmcp_actors.concurrency import ASK_TIMEOUT, failed, run_in_thread
from vmcp_actors.config import BackendConfig
from vmcp_actors.exceptions import (
    BackendError,
    BackendProtocolError,
    BackendRpcError,
    BackendSessionExpired,
    BackendTimeout,
    BackendUnavailable,
)
from vmcp_actors.identity import Identity
from vmcp_actors.protocol import LATEST_PROTOCOL_VERSION, METHOD_NOT_FOUND
from vmcp_actors.protocol.mcp import ACCEPTED_PROTOCOL_HEADER_VERSIONS

logger = logging.getLogger(__name__)

CLIENT_INFO = {"name": "vmcp-actors", "version": __version__}
# Lists a backend may advertise without implementing: -32601 on these means "empty".
TOLERATED_LISTS = frozenset({"resources/list", "resources/templates/list", "prompts/list"})
# (capability, method, result key) in the order discovery asks for them.
DISCOVERY_LISTS = (
    ("tools", "tools/list", "tools"),
    ("resources", "resources/list", "resources"),
    ("resources", "resources/templates/list", "resourceTemplates"),
    ("prompts", "prompts/list", "prompts"),
)
MAX_PAGES = 1000


def display_url(url: str) -> str:
    """The URL for operator logs: no userinfo, query or fragment, which may carry secrets."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


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


class BackendConnection(pykka.ThreadingActor):
    """One backend MCP session on behalf of one user session."""

    def __init__(self, backend: BackendConfig, *, timeout: float, client: McpHttpClient | None = None):
        super().__init__()
        self._name = backend.name
        self._url = display_url(backend.url)
        self._timeout = timeout
        self._client = client if client is not None else McpHttpClient(backend.name, backend.url)
        self._ids = _RequestIds()
        self._state = ConnectionState.NEW
        self._last_error: str | None = None
        self._handshake: cf.Future[Handshake] | None = None
        self._discovery: cf.Future[BackendCapabilities] | None = None
        self._discovered: BackendCapabilities | None = None

    def on_start(self) -> None:
        self._self = self.actor_ref.proxy()

    def on_stop(self) -> None:
        self._state = ConnectionState.CLOSED
        handshake = _result_or_none(self._handshake)
        if handshake is not None and handshake.session_id:
            # End the backend session off the actor thread so stopping stays prompt.
            run_in_thread(self._close_remote, handshake, name=f"vmcp-close-{self._name}")

    # -- asked by the SessionActor; each answers at once --------------------------------

    def discover(self, identity: Identity | None) -> cf.Future[BackendCapabilities]:
        """The backend's lists, fetched once per connection; a failed discovery is retried."""
        if self._state is ConnectionState.CLOSED:
            return failed(BackendUnavailable(self._name, f"backend {self._name!r} connection is closed"))
        if self._discovery is None or _failed(self._discovery):
            handshake = self._current_handshake(identity)
            self._discovery = run_in_thread(
                self._run_discovery, identity, handshake, name=f"vmcp-discover-{self._name}"
            )
            self._discovery.add_done_callback(self._report_to_self("discovery_finished"))
        return self._discovery

    def request(
        self,
        identity: Identity | None,
        method: str,
        params: dict[str, Any] | None,
        on_notification: Callable[[dict[str, Any]], None] | None = None,
    ) -> cf.Future[dict[str, Any]]:
        """Send one request; the future holds the backend's result or raises a BackendError."""
        if self._state is ConnectionState.CLOSED:
            return failed(BackendUnavailable(self._name, f"backend {self._name!r} connection is closed"))
        handshake = self._current_handshake(identity)
        return run_in_thread(
            self._run_request, identity, handshake, method, params, on_notification, name=f"vmcp-call-{self._name}"
        )

    def renew_handshake(self, identity: Identity | None, expired_session_id: str | None) -> cf.Future[Handshake]:
        """The backend forgot ``expired_session_id``: start one new handshake (once, however many ask)."""
        current = _result_or_none(self._handshake)
        if current is not None and current.session_id == expired_session_id:
            logger.info("backend %r forgot its session; re-initializing", self._name)
            self._handshake = None
        return self._current_handshake(identity)

    def snapshot(self) -> ConnectionSnapshot:
        handshake = _result_or_none(self._handshake)
        found = self._discovered
        return ConnectionSnapshot(
            backend=self._name,
            state=self._state.value,
            protocol_version=handshake.protocol_version if handshake else None,
            tools=len(found.tools) if found else 0,
            resources=len(found.resources) if found else 0,
            prompts=len(found.prompts) if found else 0,
            last_error=self._last_error,
        )

    # -- told by exchange threads ------------------------------------------------------

    def handshake_finished(self, future: cf.Future[Handshake]) -> None:
        if future is not self._handshake or self._state is ConnectionState.CLOSED:
            return  # a stale handshake, replaced by a renewal
        error = future.exception()
        if error is None:
            self._state = ConnectionState.READY
        else:
            self._fail(error)

    def discovery_finished(self, future: cf.Future[BackendCapabilities]) -> None:
        if future is not self._discovery or self._state is ConnectionState.CLOSED:
            return
        error = future.exception()
        if error is None:
            self._discovered = future.result()
            self._state = ConnectionState.READY
        else:
            self._fail(error)

    def exchange_failed(self, message: str) -> None:
        self._last_error = message

    # -- internals on the actor thread --------------------------------------------------

    def _fail(self, error: BaseException) -> None:
        self._state = ConnectionState.FAILED
        self._last_error = _describe(self._name, error)

    def _current_handshake(self, identity: Identity | None) -> cf.Future[Handshake]:
        if self._handshake is None or _failed(self._handshake):
            self._state = ConnectionState.INITIALIZING
            self._handshake = run_in_thread(self._run_handshake, identity, name=f"vmcp-init-{self._name}")
            self._handshake.add_done_callback(self._report_to_self("handshake_finished"))
        return self._handshake

    def _report_to_self(self, method: str) -> Callable[[cf.Future[Any]], None]:
        proxy = self._self

        def report(future: cf.Future[Any]) -> None:
            try:
                getattr(proxy, method)(future)  # fire and forget: never .get() here
            except pykka.ActorDeadError:
                pass  # the connection was closed meanwhile; nobody needs the news

        return report

    # -- exchange threads: touch only the client, the id counter and immutable values ---

    def _run_handshake(self, identity: Identity | None) -> Handshake:
        params = {"protocolVersion": LATEST_PROTOCOL_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO}
        result, session_id = self._post_request(None, "initialize", params)
        version = result.get("protocolVersion")
        if version not in ACCEPTED_PROTOCOL_HEADER_VERSIONS:
            raise BackendProtocolError(self._name, f"backend {self._name!r} negotiated unsupported protocol version {version!r}")
        capabilities = result.get("capabilities")
        server_info = result.get("serverInfo")
        handshake = Handshake(
            session_id=session_id,
            protocol_version=version,
            capabilities=MappingProxyType(dict(capabilities) if isinstance(capabilities, dict) else {}),
            server_info=MappingProxyType(dict(server_info) if isinstance(server_info, dict) else {}),
        )
        self._client.post(
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            session_id=session_id,
            protocol_version=version,
            timeout=self._timeout,
        )
        return handshake

    def _run_request(
        self,
        identity: Identity | None,
        handshake: cf.Future[Handshake],
        method: str,
        params: dict[str, Any] | None,
        on_notification: Callable[[dict[str, Any]], None] | None,
    ) -> dict[str, Any]:
        try:
            return self._call(identity, handshake, method, params, on_notification)
        except BackendRpcError:
            raise  # the backend answered; the connection itself is fine
        except BackendError as exc:
            self._tell_self("exchange_failed", _describe(self._name, exc))
            raise

    def _run_discovery(self, identity: Identity | None, handshake: cf.Future[Handshake]) -> BackendCapabilities:
        capabilities = self._await_handshake(handshake).capabilities
        wanted = [(method, key) for capability, method, key in DISCOVERY_LISTS if capability in capabilities]
        # All lists at once: discovery then takes one round trip after the handshake, not four.
        futures = {
            method: run_in_thread(self._list_all, identity, handshake, method, key, name=f"vmcp-list-{self._name}")
            for method, key in wanted
        }
        lists = {method: self._await(future, self._timeout * 3) for method, future in futures.items()}
        return BackendCapabilities(
            backend=self._name,
            capabilities=capabilities,
            tools=lists.get("tools/list", ()),
            resources=lists.get("resources/list", ()),
            resource_templates=lists.get("resources/templates/list", ()),
            prompts=lists.get("prompts/list", ()),
        )

    def _list_all(
        self, identity: Identity | None, handshake: cf.Future[Handshake], method: str, key: str
    ) -> tuple[dict[str, Any], ...]:
        try:
            return self._follow_pages(identity, handshake, method, key)
        except BackendRpcError as exc:
            if method in TOLERATED_LISTS and exc.code == METHOD_NOT_FOUND:
                logger.warning(
                    "backend %r at %s advertised the capability but answered %s with -32601; treating the list as empty",
                    self._name,
                    self._url,
                    method,
                )
                return ()
            raise

    def _follow_pages(
        self, identity: Identity | None, handshake: cf.Future[Handshake], method: str, key: str
    ) -> tuple[dict[str, Any], ...]:
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(MAX_PAGES):
            result = self._call(identity, handshake, method, {"cursor": cursor} if cursor else None)
            page = result.get(key, [])
            if not isinstance(page, list):
                raise BackendProtocolError(self._name, f"backend {self._name!r} answered {method} without a {key} list")
            items.extend(item for item in page if isinstance(item, dict))
            cursor = result.get("nextCursor")
            if not cursor:
                return tuple(items)
            if not isinstance(cursor, str) or cursor in seen:
                raise BackendProtocolError(self._name, f"backend {self._name!r} sent a bad or repeated {method} cursor")
            seen.add(cursor)
        raise BackendProtocolError(self._name, f"backend {self._name!r} paged {method} more than {MAX_PAGES} times")

    def _call(
        self,
        identity: Identity | None,
        handshake: cf.Future[Handshake],
        method: str,
        params: dict[str, Any] | None,
        on_notification: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        current = self._await_handshake(handshake)
        try:
            return self._post_request(current, method, params, on_notification)[0]
        except BackendSessionExpired:
            # The backend restarted: re-initialize once, transparently, and retry.
            try:
                renewal = self._self.renew_handshake(identity, current.session_id).get(timeout=ASK_TIMEOUT)
            except (pykka.ActorDeadError, pykka.Timeout):
                raise BackendUnavailable(self._name, f"backend {self._name!r} connection is closed") from None
            return self._post_request(self._await_handshake(renewal), method, params, on_notification)[0]

    def _post_request(
        self,
        handshake: Handshake | None,
        method: str,
        params: dict[str, Any] | None,
        on_notification: Callable[[dict[str, Any]], None] | None = None,
    ) -> tuple[dict[str, Any], str | None]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self._ids.next(), "method": method}
        if params is not None:
            message["params"] = params
        reply = self._client.post(
            message,
            session_id=handshake.session_id if handshake else None,
            protocol_version=handshake.protocol_version if handshake else None,
            timeout=self._timeout,
            on_notification=on_notification,
        )
        answer = reply.message
        if not isinstance(answer, dict):
            raise BackendProtocolError(self._name, f"backend {self._name!r} sent no answer to {method}")
        if "error" in answer:
            error = answer["error"] if isinstance(answer["error"], dict) else {}
            code = error.get("code")
            raise BackendRpcError(
                self._name,
                code if isinstance(code, int) else -32603,
                str(error.get("message", "")),
                error.get("data"),
            )
        result = answer.get("result")
        if not isinstance(result, dict):
            raise BackendProtocolError(self._name, f"backend {self._name!r} answered {method} without a result object")
        return result, reply.session_id

    def _await_handshake(self, handshake: cf.Future[Handshake]) -> Handshake:
        # The handshake is two exchanges (initialize, then the initialized notification).
        return self._await(handshake, self._timeout * 2)

    def _await(self, future: cf.Future[Any], timeout: float) -> Any:
        try:
            return future.result(timeout=timeout)
        except cf.TimeoutError:
            raise BackendTimeout(self._name, f"backend {self._name!r} did not answer within {timeout:g}s") from None

    def _tell_self(self, method: str, *args: Any) -> None:
        try:
            getattr(self._self, method)(*args)
        except pykka.ActorDeadError:
            pass

    def _close_remote(self, handshake: Handshake) -> None:
        try:
            self._client.delete_session(
                handshake.session_id, protocol_version=handshake.protocol_version, timeout=min(self._timeout, 2.0)
            )
        finally:
            self._client.close()


def _failed(future: cf.Future[Any]) -> bool:
    return future.done() and future.exception() is not None


def _result_or_none(future: cf.Future[Any] | None) -> Any:
    if future is None or not future.done() or future.exception() is not None:
        return None
    return future.result()


def _describe(backend: str, error: BaseException) -> str:
    """An error message fit for admin output: BackendErrors name no URL; others get a generic line."""
    if isinstance(error, BackendError):
        return str(error)
    return f"backend {backend!r} failed: {error.__class__.__name__}"
