"""BackendConnection: one backend, one user session.

The actor owns the connection's state: the handshake (started once, renewed once when
the backend forgets our session), the state machine, the last error and the discovered
lists. It never waits on the network in its loop: the handshake and discovery run on
worker threads and report back with messages, and calls run on the caller's thread
through the connection's BackendChannel, so concurrent calls to one backend overlap.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pykka

from vmcp_actors.backends._auth import OutgoingAuth
from vmcp_actors.backends._channel import BackendChannel
from vmcp_actors.backends._http import McpHttpClient
from vmcp_actors.backends._models import BackendCapabilities, ConnectionSnapshot, ConnectionState, Handshake
from vmcp_actors.concurrency import failed, run_in_thread
from vmcp_actors.config import BackendConfig
from vmcp_actors.exceptions import BackendError, BackendProtocolError, BackendRpcError, BackendTimeout, BackendUnavailable
from vmcp_actors.identity import Identity
from vmcp_actors.protocol import METHOD_NOT_FOUND

logger = logging.getLogger(__name__)

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


class BackendConnection(pykka.ThreadingActor):
    """One backend MCP session on behalf of one user session."""

    def __init__(self, backend: BackendConfig, *, timeout: float, auth: OutgoingAuth | None = None,
                 client: McpHttpClient | None = None):
        super().__init__()
        self._name = backend.name
        self._url = display_url(backend.url)
        self._timeout = timeout
        self._channel = BackendChannel(
            backend.name, client if client is not None else McpHttpClient(backend.name, backend.url), timeout, auth
        )
        self._handshake_identity: Identity | None = None
        self._state = ConnectionState.NEW
        self._last_error: str | None = None
        self._handshake: cf.Future[Handshake] | None = None
        self._discovery: cf.Future[BackendCapabilities] | None = None
        self._discovered: BackendCapabilities | None = None

    def on_start(self) -> None:
        self._self = self.actor_ref.proxy()
        self._channel.attach(self._self)

    def on_stop(self) -> None:
        self._state = ConnectionState.CLOSED
        self._channel.publish_handshake(None)
        handshake = _result_or_none(self._handshake)
        if handshake is not None and handshake.session_id:
            # End the backend session off the actor thread so stopping stays prompt.
            run_in_thread(self._channel.close_remote, handshake, self._handshake_identity)

    # -- asked by the SessionActor and by channels; each answers at once -----------------

    def channel(self) -> BackendChannel:
        return self._channel

    def handshake(self, identity: Identity | None) -> cf.Future[Handshake]:
        """The current handshake, started if there is none or the last one failed."""
        if self._state is ConnectionState.CLOSED:
            return failed(BackendUnavailable(self._name, f"backend {self._name!r} connection is closed"))
        if self._handshake is None or _failed(self._handshake):
            self._state = ConnectionState.INITIALIZING
            self._handshake_identity = identity
            self._handshake = run_in_thread(self._channel.perform_handshake, identity)
            self._handshake.add_done_callback(self._report_to_self("handshake_finished"))
            self._channel.publish_handshake(self._handshake)
        return self._handshake

    def renew_handshake(self, identity: Identity | None, expired_session_id: str | None) -> cf.Future[Handshake]:
        """The backend forgot ``expired_session_id``: start one new handshake (once, however many ask)."""
        current = _result_or_none(self._handshake)
        if current is not None and current.session_id == expired_session_id:
            logger.info("backend %r forgot its session; re-initializing", self._name)
            self._handshake = None
        return self.handshake(identity)

    def discover(self, identity: Identity | None) -> cf.Future[BackendCapabilities]:
        """The backend's lists, fetched once per connection; a failed discovery is retried."""
        if self._state is ConnectionState.CLOSED:
            return failed(BackendUnavailable(self._name, f"backend {self._name!r} connection is closed"))
        if self._discovery is None or _failed(self._discovery):
            handshake = self.handshake(identity)
            self._discovery = run_in_thread(self._run_discovery, identity, handshake)
            self._discovery.add_done_callback(self._report_to_self("discovery_finished"))
        return self._discovery

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

    # -- told by worker threads and channels ---------------------------------------------

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

    def _report_to_self(self, method: str) -> Callable[[cf.Future[Any]], None]:
        proxy = self._self

        def report(future: cf.Future[Any]) -> None:
            try:
                getattr(proxy, method)(future)  # fire and forget: never .get() here
            except pykka.ActorDeadError:
                pass  # the connection was closed meanwhile; nobody needs the news

        return report

    # -- discovery, on worker threads ----------------------------------------------------

    def _run_discovery(self, identity: Identity | None, handshake: cf.Future[Handshake]) -> BackendCapabilities:
        capabilities = self._channel.await_handshake(handshake).capabilities
        wanted = [(method, key) for capability, method, key in DISCOVERY_LISTS if capability in capabilities]
        # All lists at once: discovery then takes one round trip after the handshake, not four.
        futures = {method: run_in_thread(self._list_all, identity, method, key) for method, key in wanted}
        lists = {method: self._await(future, self._timeout * 3) for method, future in futures.items()}
        return BackendCapabilities(
            backend=self._name,
            capabilities=capabilities,
            tools=lists.get("tools/list", ()),
            resources=lists.get("resources/list", ()),
            resource_templates=lists.get("resources/templates/list", ()),
            prompts=lists.get("prompts/list", ()),
        )

    def _list_all(self, identity: Identity | None, method: str, key: str) -> tuple[dict[str, Any], ...]:
        try:
            return self._follow_pages(identity, method, key)
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

    def _follow_pages(self, identity: Identity | None, method: str, key: str) -> tuple[dict[str, Any], ...]:
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(MAX_PAGES):
            result = self._channel.call(identity, method, {"cursor": cursor} if cursor else None)
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

    def _await(self, future: cf.Future[Any], timeout: float) -> Any:
        try:
            return future.result(timeout=timeout)
        except cf.TimeoutError:
            raise BackendTimeout(self._name, f"backend {self._name!r} did not answer within {timeout:g}s") from None


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
