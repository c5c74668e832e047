"""The innermost core: a user's backends seen as one server, through the user's catalog.

List and lookup methods read the catalog the UserActor published, without a message, once
it is usable (discovered, with at least one backend; some may be missing). Before that the
UserActor is asked, within the request's deadline. A catalog missing backends reminds the
UserActor now and then (``retry_failed``, never waited for) so it retries them in the
background when their time comes. Calls return an Exchange the request's thread drives.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pykka

from vmcp_actors.backends import BackendChannel
from vmcp_actors.concurrency import ASK_TIMEOUT, Deadline
from vmcp_actors.exceptions import ConnectionNeeded
from vmcp_actors.core._admitted import Requirements, refuse_unless_admitted
from vmcp_actors.core._catalog import RESOURCE_UPDATED, Catalog, InternalTool, Route, connect_tool_name
from vmcp_actors.core._connect import (
    CONNECT_INPUT,
    ConnectLinks,
    RawExchange,
    after_answer,
    asked_since,
    connect_result,
    connected_answer,
    connecting,
    takes_url_elicitation,
)
from vmcp_actors.core._exchange import Exchange, drained, from_backend
from vmcp_actors.core._explain import ABSENT, OFFERS, Explanation, Finding
from vmcp_actors.core._interface import Continuation, UnknownTool
from vmcp_actors.core._shared_names import OwnName, chosen_meaning
from vmcp_actors.core._task_relay import AskedStore, TaskRelay
from vmcp_actors.core._tasks import TASKS_EXTENSION, TaskHandles, requested_task
from vmcp_actors.identity import Identity
from vmcp_actors.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
    RESOURCE_NOT_FOUND,
    JsonRpcError,
)
from vmcp_actors.protocol.mcp import param_headers_for
from vmcp_actors.signing import Signer

# When a request's deadline ends before discovery does, it stops waiting this much
# earlier, to answer with what discovery found so far.
ANSWER_MARGIN = 0.1
# A served catalog missing backends reminds the UserActor at most this often; the actor
# decides whether their retry is due (users' RETRY_FAILED_AFTER, or RETRY_WHEN_HEALTHY once
# health checks see one of them answer again: neither is shorter than this).
REMIND_RETRY_EVERY = 1.0
# Retry-After (seconds) when no backend could be discovered (every one down, or busy).
NO_BACKENDS_RETRY_AFTER = 2


class ConflictingNames(JsonRpcError):
    """Aggregation left clashes that the config must resolve (manual strategy)."""

    def __init__(self, errors: tuple[str, ...]):
        super().__init__(INTERNAL_ERROR, "Tool names conflict: " + "; ".join(errors), {"conflicts": list(errors)})


class NoBackendsAvailable(JsonRpcError):
    """HTTP 503 with Retry-After: a catalog without backends is not kept, so the next
    request discovers again."""

    def __init__(self) -> None:
        super().__init__(INTERNAL_ERROR, "No backend is available for this session; try again later",
                         {"retryAfterSeconds": NO_BACKENDS_RETRY_AFTER}, http_status=503)


class BackendsMissing(JsonRpcError):
    """``partialFailureMode: fail``: a request needs every backend, and some are missing."""

    def __init__(self, failures: Mapping[str, str]):
        super().__init__(INTERNAL_ERROR, "Not every backend is available (partialFailureMode: fail): "
                         + "; ".join(failures[name] for name in sorted(failures)),
                         {"unavailable": sorted(failures)})


class DiscoveryTimedOut(JsonRpcError):
    """The request's deadline ended before any backend was discovered (discovery goes on)."""

    def __init__(self) -> None:
        super().__init__(REQUEST_TIMEOUT, "Request timed out: the backends were not discovered within the "
                                          "request's deadline; try again")


class CatalogBoard:
    """The user's catalog as its UserActor last published it (one atomic reference), so
    web threads read a usable catalog without a message; and when a web thread last
    reminded the actor of the backends that catalog misses."""

    def __init__(self) -> None:
        self.current: cf.Future[Catalog] | None = None
        self._reminded_at: float | None = None
        self._budget: tuple[cf.Future[Catalog], float] | None = None  # a discovery and when its budget ends
        # guards only _reminded_at and _budget (check and set); nothing else is done under it
        self._lock = threading.Lock()

    def budget_left(self, discovery: cf.Future[Catalog], budget: float) -> float:
        """How much of ``budget`` is left for requests waiting on ``discovery``: it is spent
        once per discovery, from the first request that waited on it."""
        now = time.monotonic()
        with self._lock:
            if self._budget is None or self._budget[0] is not discovery:
                self._budget = (discovery, now + budget)
            return max(0.0, self._budget[1] - now)

    def publish(self, catalog: cf.Future[Catalog] | None) -> None:
        self.current = catalog

    def remind_due(self) -> bool:
        """True at most once per REMIND_RETRY_EVERY seconds (for the one thread that reminds)."""
        now = time.monotonic()
        with self._lock:
            if self._reminded_at is not None and now - self._reminded_at < REMIND_RETRY_EVERY:
                return False
            self._reminded_at = now
            return True


class AggregatedBackends:
    """The user's backends seen as one server, through the user's catalog."""

    def __init__(self, user: Any, channels: Mapping[str, BackendChannel], board: CatalogBoard,
                 fail_on_partial: bool = False,
                 record_subscription: Callable[[str, str, bool], None] | None = None,
                 task_handles: TaskHandles | None = None, page_size: int = 100,
                 asked: AskedStore | None = None, discovery_budget: float | None = None,
                 client_capabilities: Mapping[str, Any] | None = None):
        """``discovery_budget``: how long a first discovery waits for backends before it
        answers with those that were ready (None: until the request's deadline).
        ``client_capabilities``: what the user's client declared (URL elicitation is how
        it is asked to connect a backend)."""
        self._user = user  # ActorProxy[UserActor]
        self._discovery_budget = discovery_budget
        self._channels = channels
        self._board = board
        self._tasks = TaskRelay(channels, self.catalog, task_handles or TaskHandles(Signer.generated(), ""),
                                page_size, asked)
        # (subscriber, uri, subscribed): written to the subscriber's session record on the
        # request's thread (a store round trip; never on the user actor's loop).
        self._record_subscription = record_subscription
        self._fail_on_partial = fail_on_partial  # operational.failureHandling.partialFailureMode: fail
        self._required = Requirements()  # what a call must have been decided by (the stack says: require)
        self._url_elicitation = takes_url_elicitation(client_capabilities or {})
        # Backends each person connects (type oauth): their connect tools stay callable once connected.
        self._connectable = {connect_tool_name(name): name for name, channel in channels.items()
                             if channel.personal is not None}

    # -- catalog -----------------------------------------------------------------------

    def catalog(self, identity: Identity | None, deadline: Deadline) -> Catalog:
        published = self._board.current
        if published is not None and published.done() and published.exception() is None \
                and published.result().has_backends:
            catalog: Catalog = published.result()  # usable: read without a message
            if catalog.missing and self._board.remind_due():
                self._remind_retry(identity)
        else:
            catalog = self._discovered(identity, deadline)
        if catalog.errors:
            raise ConflictingNames(catalog.errors)
        if catalog.failures and self._fail_on_partial:
            raise BackendsMissing(catalog.failures)
        return catalog

    def _discovered(self, identity: Identity | None, deadline: Deadline) -> Catalog:
        """Ask the UserActor (first discovery, or none usable yet); what was found so far
        when the discovery budget (or the deadline) ends before discovery does. With no
        backend found by then, it waits on for the first one, until the deadline."""
        with self._user_answering():
            pending = self._user.catalog(identity).get(timeout=deadline.cap(ASK_TIMEOUT))
            until_deadline = max(0.0, deadline.remaining() - ANSWER_MARGIN)
            budget = until_deadline if self._discovery_budget is None else \
                min(self._board.budget_left(pending, self._discovery_budget), until_deadline)
            try:
                catalog: Catalog = pending.result(timeout=budget)
            except cf.TimeoutError:
                # Discovery goes on (late backends join with list_changed); answer with what it found.
                catalog = self._user.catalog_so_far().get(timeout=deadline.cap(ASK_TIMEOUT))
                if catalog is None or not catalog.has_backends:
                    catalog = self._first_found(identity, pending, deadline)
        if not catalog.has_backends:
            raise NoBackendsAvailable()
        return catalog

    def _first_found(self, identity: Identity | None, pending: cf.Future[Catalog], deadline: Deadline) -> Catalog:
        """Past the budget with no backend found: whatever discovery has once the first
        backend is in (or the whole round ends), within the deadline."""
        first = self._user.first_backend().get(timeout=deadline.cap(ASK_TIMEOUT))
        cf.wait((pending, first), timeout=max(0.0, deadline.remaining() - ANSWER_MARGIN),
                return_when=cf.FIRST_COMPLETED)
        if pending.done():
            return pending.result()
        catalog = self._user.catalog_so_far().get(timeout=deadline.cap(ASK_TIMEOUT))
        if catalog is None or not catalog.has_backends:
            raise DiscoveryTimedOut()
        return catalog

    def _remind_retry(self, identity: Identity | None) -> None:
        """Fire and forget: the UserActor retries the missing backends if their time has come."""
        try:
            self._user.retry_failed(identity)  # its future is not waited for
        except pykka.ActorDeadError:
            pass  # the user is stopping; the next request gets a new one

    def discovered(self, deadline: Deadline) -> bool:
        """Whether a discovery that was under way (a request was answered with the backends
        ready when its budget ended) has ended, waiting for it until the deadline."""
        published = self._board.current
        if published is None or published.done():
            return False
        try:
            published.result(timeout=max(0.0, deadline.remaining() - ANSWER_MARGIN))
        except Exception:  # noqa: BLE001 - timed out, or no catalog: the name stays unknown
            return False
        return True

    def unavailable(self) -> Mapping[str, str]:
        """The backends the published catalog misses, and why (while discovery goes on,
        what it has not found yet: asked of the UserActor)."""
        published = self._board.current
        if published is not None and published.done():
            return published.result().failures if published.exception() is None else {}
        try:
            so_far = self._user.catalog_so_far().get(timeout=ASK_TIMEOUT)
        except (pykka.ActorDeadError, pykka.Timeout):
            return {}
        return so_far.failures if so_far is not None else {}

    def freshness_ms(self) -> int | None:
        """The shortest ttlMs the user's 2026-07-28 backends gave their lists (None: no hint)."""
        published = self._board.current
        if published is None:
            return None
        if not published.done():
            return 0  # still discovering (a request was answered with what was ready): list again
        if published.exception() is not None:
            return None
        catalog = published.result()
        if catalog.missing:
            return 0  # a missing backend may join at any time
        hints = [found.ttl_ms for found in catalog.backends.values() if found.ttl_ms is not None]
        return min(hints) if hints else None

    def lookup_internal(self, identity: Identity | None, name: str, deadline: Deadline) -> InternalTool | None:
        """For composite steps: any tool, advertised or hidden, by advertised name or ``workload.tool``."""
        return self.catalog(identity, deadline).resolve_internal(name)

    def list_tools(self, identity: Identity | None, deadline: Deadline) -> tuple[dict[str, Any], ...]:
        return self.catalog(identity, deadline).tools

    def list_resources(self, identity: Identity | None, deadline: Deadline) -> tuple[dict[str, Any], ...]:
        return self.catalog(identity, deadline).resources

    def list_resource_templates(self, identity: Identity | None, deadline: Deadline) -> tuple[dict[str, Any], ...]:
        return self.catalog(identity, deadline).resource_templates

    def list_prompts(self, identity: Identity | None, deadline: Deadline) -> tuple[dict[str, Any], ...]:
        return self.catalog(identity, deadline).prompts

    def own_names(self, identity: Identity | None, name: str, deadline: Deadline) -> tuple[OwnName, ...]:
        """The advertised tools ``name`` may mean when it is a backend's own name, not advertised."""
        return self.catalog(identity, deadline).own_names.get(name, ())

    def lookup_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> Route | None:
        route = self.catalog(identity, deadline).tool_routes.get(name)
        if route is None and name in self._connectable:  # listed only while unconnected, callable always
            return Route(self._connectable[name], name, name, connect=True)
        return route

    def describe_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> dict[str, Any] | None:
        return self.catalog(identity, deadline).tool_definitions.get(name)

    def lookup_prompt(self, identity: Identity | None, name: str, deadline: Deadline) -> Route | None:
        return self.catalog(identity, deadline).prompt_routes.get(name)

    def lookup_resource(self, identity: Identity | None, uri: str, deadline: Deadline) -> str | None:
        return self.catalog(identity, deadline).route_resource(uri)

    def explain_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> Explanation:
        """The innermost findings: which backends offer ``name`` (by advertised, overridden
        or original name), what overrides and conflict resolution made of it."""
        catalog = self.catalog(identity, deadline)
        listed = name in catalog.tool_routes
        findings = [_offered(found, name, catalog) for found in catalog.internal_tools.values()
                     if name in (found.advertised_as, found.route.original_name, found.route.resolved_name)]
        meanings = catalog.own_names.get(name)
        if meanings:
            findings.append(_own_name_finding(name, meanings))
        if not findings:
            reason = "no backend of this caller offers a tool by that name"
            if catalog.failures:
                reason += "; not discovered: " + ", ".join(sorted(catalog.failures))
            findings.append(Finding("backends", ABSENT, reason))
        return Explanation(name, listed, listed, tuple(findings))

    # -- calls -------------------------------------------------------------------------

    def require(self, requirements: Requirements) -> None:
        """What a call must have been decided by to reach a backend (the stack's layers)."""
        self._required = requirements

    def call_tool(self, identity, name, arguments, meta, deadline) -> Exchange:
        route = self.lookup_tool(identity, name, deadline)
        if route is None:
            raise UnknownTool(name)
        refuse_unless_admitted(name, self._required.client)
        return self.call_route(identity, route, arguments, meta, deadline)

    def call_route(self, identity: Identity | None, route: Route, arguments: dict[str, Any] | None,
                   meta: dict[str, Any] | None, deadline: Deadline) -> Exchange:
        """Call the backend tool ``route`` leads to, on this thread."""
        if route.connect:
            return from_backend(self._connect(identity, route, deadline), route.backend)
        params = _with_meta({"name": route.original_name, "arguments": arguments or {}}, meta)
        headers = self._param_headers(identity, route, arguments, deadline)
        channel = self._channels[route.backend]
        task = requested_task.get()
        asked = task is not None and not task.awaited  # the client accepts a task of this call
        # A call the client accepts no task of meets the task relay only at a backend that
        # may make one anyway (it is awaited then); any other call passes none of its code.
        awaited = not asked and _makes_tasks(channel)
        if asked or (awaited and task is not None):
            tool = self._backend_tool(identity, route, deadline) if asked else None
            params = self._tasks.call_params(route.backend, tool, params, task)

        def start() -> RawExchange:
            return channel.request(identity, "tools/call", params, deadline, headers)

        raw = self._connected_first(identity, route, params, start, deadline) \
            if channel.personal is not None else start()
        exchange = from_backend(raw, route.backend, self._shown_updates(identity, route.backend, deadline))
        if asked:
            return self._tasks.call(route.backend, exchange, task)
        return self._tasks.unasked(identity, route.backend, exchange, deadline) if awaited else exchange

    def _connect(self, identity: Identity | None, route: Route, deadline: Deadline) -> RawExchange:
        """The connect tool: asks the person to connect, unless they have."""
        links = self._channels[route.backend].personal
        assert links is not None
        if links.connected(identity, route.backend):
            return connect_result(f"Already connected to {route.backend}. To connect again (another account, more "
                                  f"scopes), disconnect it first at {links.public_url}/connections", error=False)
        return (yield from connecting(links, identity, route.backend, None, self._url_elicitation,
                                      {"name": route.original_name, "arguments": {}},
                                      connected_answer(route.backend), deadline))

    def _connected_first(self, identity: Identity | None, route: Route, params: Mapping[str, Any],
                         start: Callable[[], RawExchange], deadline: Deadline) -> RawExchange:
        """A call to a backend of the person's own: when their authorization is missing or
        lapsed, they are asked to connect, and the call goes on once they have."""
        try:
            return (yield from start())
        except ConnectionNeeded as needed:
            links = self._channels[route.backend].personal
            assert links is not None
            return (yield from connecting(links, identity, route.backend, needed, self._url_elicitation, params,
                                          start, deadline))

    def task_request(self, identity: Identity | None, method: str, params: dict[str, Any], modern: bool,
                     deadline: Deadline) -> Exchange | dict[str, Any]:
        return self._tasks.request(identity, method, params, modern, deadline)

    def list_tasks(self, identity: Identity | None, params: dict[str, Any], deadline: Deadline,
                   first: tuple[dict[str, Any], ...]) -> dict[str, Any]:
        """A 2025 client's ``tasks/list``: ``first`` (the gateway's own), then the backends'."""
        return self._tasks.list(identity, params, deadline, first)

    def submit_route(self, identity: Identity | None, route: Route, arguments: dict[str, Any] | None,
                     deadline: Deadline) -> cf.Future[dict[str, Any]]:
        """``call_route`` as pooled work (composite steps, hidden tools too): the result
        lands in the future; nothing blocks on the way."""
        if self._required.step:
            found = self.catalog(identity, deadline).internal_tools.get((route.backend, route.original_name))
            called_as = found.called_as if found is not None else InternalTool(route, {}, None).called_as
            refuse_unless_admitted(called_as, self._required.step)
        params = {"name": route.original_name, "arguments": arguments or {}}
        headers = self._param_headers(identity, route, arguments, deadline)
        return self._channels[route.backend].submit(identity, "tools/call", params, deadline, headers)

    def read_resource(self, identity, uri, meta, deadline) -> Exchange:
        catalog = self.catalog(identity, deadline)
        target = catalog.resource_target(uri)
        if target is None:
            raise JsonRpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": uri})
        refuse_unless_admitted(uri, self._required.reads)
        backend, own_uri = target
        read = self._request(identity, backend, "resources/read", _with_meta({"uri": own_uri}, meta), deadline)
        return read if own_uri == uri else _contents_shown(read, backend, catalog)

    def get_prompt(self, identity, name, arguments, meta, deadline) -> Exchange:
        route = self.lookup_prompt(identity, name, deadline)
        if route is None:
            raise JsonRpcError(INVALID_PARAMS, f"Unknown prompt: {name}")
        refuse_unless_admitted(name, self._required.reads)
        params = _with_meta({"name": route.original_name, "arguments": arguments or {}}, meta)
        return self._request(identity, route.backend, "prompts/get", params, deadline)

    def complete(self, identity, params, deadline) -> Exchange | dict[str, Any]:
        ref = params["ref"]
        catalog = self.catalog(identity, deadline)
        if ref["type"] == "ref/prompt":
            route = catalog.prompt_routes.get(ref["name"])
            if route is None:
                raise JsonRpcError(INVALID_PARAMS, f"Unknown prompt: {ref['name']}")
            backend, ref = route.backend, {**ref, "name": route.original_name}
        else:
            template = catalog.route_template(ref["uri"])
            target = (template.backend, template.own_template or template.uri_template) if template is not None \
                else catalog.resource_target(ref["uri"])
            if target is None:
                raise JsonRpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": ref["uri"]})
            backend, ref = target[0], {**ref, "uri": target[1]}
        if not catalog.backends[backend].supports("completions"):
            return {"completion": {"values": [], "hasMore": False}}
        return self._request(identity, backend, "completion/complete", {**params, "ref": ref}, deadline)

    def set_logging_level(self, identity, level, deadline) -> dict[str, Any]:
        """Forwarded to every backend that has logging, in the background: the answer waits for none."""
        for backend, found in self.catalog(identity, deadline).backends.items():
            if found.supports("logging") and not self._channels[backend].speaks_modern():
                self._channels[backend].submit(identity, "logging/setLevel", {"level": level}, deadline)
        return {}

    def subscribe_resource(self, identity, subscriber, uri, deadline) -> dict[str, Any]:
        """Subscribe at the backend that owns ``uri`` and note ``subscriber`` (a client
        session) as one to tell of its updates."""
        backend, own_uri = self._subscribable(identity, uri, deadline)
        # Noted first, the backend streams open, then the backend told: an update it sends
        # the moment it is subscribed reaches the subscriber, as on a direct connection.
        with self._user_answering():
            streams = self._user.subscribed(subscriber, uri).get(timeout=deadline.cap(ASK_TIMEOUT))
        streams.wait(deadline.cap(ASK_TIMEOUT))
        if not self._channels[backend].speaks_modern():  # a 2026-07-28 backend hears it in subscriptions/listen
            try:
                self._call(identity, backend, "resources/subscribe", {"uri": own_uri}, deadline)
            except Exception:
                try:  # not subscribed after all
                    self._user.unsubscribed(subscriber, uri).get(timeout=ASK_TIMEOUT)
                except (pykka.ActorDeadError, pykka.Timeout):
                    pass
                raise
        if self._record_subscription is not None:
            self._record_subscription(subscriber, uri, True)
        return {}

    def unsubscribe_resource(self, identity, subscriber, uri, deadline) -> dict[str, Any]:
        """The backend is told only when no other session of the user still listens."""
        backend, own_uri = self._subscribable(identity, uri, deadline)
        if self._record_subscription is not None:
            self._record_subscription(subscriber, uri, False)
        with self._user_answering():
            last = self._user.unsubscribed(subscriber, uri).get(timeout=deadline.cap(ASK_TIMEOUT))
        if last and not self._channels[backend].speaks_modern():
            self._call(identity, backend, "resources/unsubscribe", {"uri": own_uri}, deadline)
        return {}

    def speaks_modern(self, backend: str) -> bool:
        channel = self._channels.get(backend)
        return channel is not None and channel.speaks_modern()

    def resume(self, identity: Identity | None, continuation: Continuation, deadline: Deadline) -> Exchange:
        """A request that goes on with the client's input, to the backend that asked for it
        (named by the sealed state), or, unasked, to the backend serving the name when it
        speaks 2026-07-28 (else the input is ignored, as the specification lets a server
        do, and the request is an ordinary one). The name must still be offered."""
        method, name = continuation.method, continuation.name
        since = asked_since(continuation.backend_state) if method == "tools/call" else None
        if since is not None:
            return self._connect_resumed(identity, continuation, since, deadline)
        route = None
        if method == "resources/read":
            found = self.catalog(identity, deadline).resource_target(name)
            if found is None:
                raise continuation.unknown()
            refuse_unless_admitted(name, self._required.reads)
            backend, target = found
        else:
            route = (self.lookup_tool if method == "tools/call" else self.lookup_prompt)(identity, name, deadline)
            if route is None:
                raise continuation.unknown()
            refuse_unless_admitted(name, self._required.client if method == "tools/call" else self._required.reads)
            backend, target = route.backend, route.original_name
        if continuation.backend is not None:
            if continuation.backend not in self._channels:
                raise JsonRpcError(INVALID_PARAMS, "Invalid requestState: its backend is not configured here")
            backend, target = continuation.backend, continuation.target or target
        elif not self.speaks_modern(backend):
            arguments = dict(continuation.arguments) if continuation.arguments is not None else None
            meta = dict(continuation.meta) if continuation.meta else None
            if method == "tools/call":
                return self.call_tool(identity, name, arguments, meta, deadline)
            if method == "prompts/get":
                return self.get_prompt(identity, name, arguments, meta, deadline)
            return self.read_resource(identity, name, meta, deadline)
        params: dict[str, Any] = {"uri": target} if method == "resources/read" else \
            {"name": target, "arguments": dict(continuation.arguments or {})}
        if continuation.meta:
            params["_meta"] = dict(continuation.meta)
        params["inputResponses"] = dict(continuation.input_responses)
        if continuation.backend_state is not None:
            params["requestState"] = continuation.backend_state
        # Each round is a tools/call of its own: its tool's Mcp-Param-* headers go along again.
        headers = self._param_headers(identity, route, continuation.arguments, deadline) \
            if method == "tools/call" and route is not None and route.backend == backend else None
        task = requested_task.get() if method == "tools/call" else None
        if task is None:
            exchange = self._request(identity, backend, method, params, deadline, headers)
            if method == "resources/read" and target != name:  # a rewritten ui:// URI
                return _contents_shown(exchange, backend, self.catalog(identity, deadline))
            return exchange
        params = self._tasks.call_params(backend, None, params, task)
        return self._tasks.call(backend, self._request(identity, backend, method, params, deadline, headers), task)

    def _connect_resumed(self, identity: Identity | None, continuation: Continuation, since: float,
                         deadline: Deadline) -> Exchange:
        """A 2026-07-28 client's retry after it was asked to connect: once the person has,
        the call goes on (a new call to the backend, or the connect tool's answer)."""
        route = self.lookup_tool(identity, continuation.name, deadline)
        if route is None or route.backend != continuation.backend or identity is None:
            raise continuation.unknown()
        refuse_unless_admitted(continuation.name, self._required.client)
        links = self._channels[route.backend].personal
        if links is None:
            raise continuation.unknown()
        arguments = dict(continuation.arguments) if continuation.arguments is not None else None
        meta = dict(continuation.meta) if continuation.meta else None
        if route.connect:
            then = connected_answer(route.backend)
        else:
            params = _with_meta({"name": route.original_name, "arguments": arguments or {}}, meta)
            headers = self._param_headers(identity, route, arguments, deadline)
            channel = self._channels[route.backend]

            def then() -> RawExchange:
                return channel.request(identity, "tools/call", params, deadline, headers)

        answer = continuation.input_responses.get(CONNECT_INPUT)
        return from_backend(after_answer(links, identity, route.backend, answer, then, deadline, since),
                            route.backend)

    def notify_backends(self, identity: Identity | None, method: str, params: dict[str, Any] | None) -> None:
        """A client notification every backend session of the user should hear (roots changed)."""
        for channel in self._channels.values():
            channel.notify_if_open(identity, method, params)

    def close(self) -> None:
        """Nothing to release here: the UserActor owns the connections."""

    def _param_headers(self, identity: Identity | None, route: Route, arguments: dict[str, Any] | None,
                       deadline: Deadline) -> dict[str, str] | None:
        """The ``Mcp-Param-*`` headers a 2026-07-28 backend's tool asks its arguments mirrored in."""
        if not self._channels[route.backend].speaks_modern():
            return None
        tool = self._backend_tool(identity, route, deadline)
        return param_headers_for(tool.get("inputSchema"), arguments or {}) if tool else None

    def _backend_tool(self, identity: Identity | None, route: Route, deadline: Deadline) -> dict[str, Any] | None:
        """The tool as its backend lists it."""
        found = self.catalog(identity, deadline).backends.get(route.backend)
        return next((t for t in found.tools if t.get("name") == route.original_name), None) if found else None

    def _subscribable(self, identity: Identity | None, uri: str, deadline: Deadline) -> tuple[str, str]:
        """The backend that serves ``uri`` and the URI as it knows it."""
        catalog = self.catalog(identity, deadline)
        target = catalog.resource_target(uri)
        if target is None:
            raise JsonRpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": uri})
        resources = catalog.backends[target[0]].capabilities.get("resources")
        if not isinstance(resources, Mapping) or not resources.get("subscribe"):
            raise JsonRpcError(METHOD_NOT_FOUND, "Subscriptions are not supported for this resource", {"uri": uri})
        return target

    @contextlib.contextmanager
    def _user_answering(self) -> Iterator[None]:
        """Around an ask of the UserActor: a dead or silent actor is no backend available."""
        try:
            yield
        except (pykka.ActorDeadError, pykka.Timeout):
            raise NoBackendsAvailable() from None

    def _call(self, identity, backend, method, params, deadline) -> dict[str, Any]:
        return drained(self._channels[backend].request(identity, method, params, deadline))

    def _request(self, identity, backend, method, params, deadline, headers=None) -> Exchange:
        return from_backend(self._channels[backend].request(identity, method, params, deadline, headers), backend,
                            self._shown_updates(identity, backend, deadline))

    def _shown_updates(self, identity: Identity | None, backend: str,
                       deadline: Deadline) -> Callable[[dict[str, Any]], dict[str, Any]]:
        """How ``backend``'s notifications in a call reach its client: a resource update with
        a shared ui:// URI rewritten. The catalog is read only when an update comes, not on
        every call."""
        def shown(message: dict[str, Any]) -> dict[str, Any]:
            if message.get("method") != RESOURCE_UPDATED:
                return message
            return self.catalog(identity, deadline).shown_update(backend, message)

        return shown


def _offered(found: InternalTool, name: str, catalog: Catalog) -> Finding:
    route = found.route
    said = [f"backend {route.backend!r} offers it as {route.original_name!r}"]
    if route.resolved_name != route.original_name:
        said.append(f"an override renames it {route.resolved_name!r}")
    if found.advertised_as is None:
        lost = [problem for problem in catalog.problems
                if f"{route.resolved_name!r} of backend {route.backend!r}" in problem
                or f"{route.original_name!r} of backend {route.backend!r}" in problem]
        said.append("it is not advertised: " + ("; ".join(lost) if lost else "conflict resolution left it out"))
    elif found.advertised_as != route.resolved_name:
        said.append(f"conflict resolution advertises it as {found.advertised_as!r}")
    else:
        said.append(f"advertised as {found.advertised_as!r}")
    details = (("backend", route.backend), ("originalName", route.original_name),
               ("resolvedName", route.resolved_name), ("advertisedAs", found.advertised_as))
    return Finding("backends", OFFERS, "; ".join(said), details)


def _own_name_finding(name: str, meanings: tuple[OwnName, ...]) -> Finding:
    """What a call by ``name``, a backend's own name that is not advertised, does."""
    chosen = chosen_meaning(meanings)
    tools = ", ".join(meaning.advertised for meaning in meanings)
    if chosen is not None:
        reason = (f"not advertised by this name, but it is {chosen.backend}'s own name for {chosen.advertised}: "
                  f"a call by it (an app's) is a call of {chosen.advertised}, decided under that name")
        if len(meanings) > 1:
            reason += f" ({chosen.backend} comes first in priorityOrder of {tools})"
    else:
        reason = (f"not advertised by this name; it is the own name of {tools}: a call by it is refused as "
                  f"ambiguous unless priorityOrder lists one of their backends first")
    return Finding("backends", OFFERS, reason, (("ownName", name), ("means", chosen.advertised if chosen else None),
                                                ("tools", tools)))


def _contents_shown(read: Exchange, backend: str, catalog: Catalog) -> Exchange:
    """A read of a rewritten URI: its contents' URIs as the client asked for them."""
    result = yield from read
    contents = result.get("contents")
    if not isinstance(contents, list):
        return result
    shown = [{**item, "uri": catalog.shown_uri(backend, item["uri"])}
             if isinstance(item, dict) and isinstance(item.get("uri"), str) else item for item in contents]
    return {**result, "contents": shown}


def _makes_tasks(channel: BackendChannel) -> bool:
    """Whether ``channel``'s backend may answer a call with a task: its current handshake
    declared tasks (a 2026-07-28 backend the extension, a 2025-11-25 one the capability)."""
    capabilities = channel.capabilities()
    if channel.speaks_modern():
        extensions = capabilities.get("extensions")
        return isinstance(extensions, Mapping) and TASKS_EXTENSION in extensions
    return "tasks" in capabilities


def _with_meta(params: dict[str, Any], meta: dict[str, Any] | None) -> dict[str, Any]:
    if meta:
        params["_meta"] = meta
    return params
