"""The core interface over a session's backends (DESIGN.md, "The core interface").

``AggregatedBackends`` is the innermost implementation; decorators (advertising filter,
composite tools) wrap the same interface. Identity is always an explicit argument.
Methods block only the calling (web) thread, never an actor: list and lookup methods
wait for the session's catalog; calls return a future with the backend's result.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import pykka

from vmcp_actors.concurrency import ASK_TIMEOUT, failed, resolved
from vmcp_actors.exceptions import BackendError, BackendRpcError, BackendTimeout
from vmcp_actors.identity import Identity
from vmcp_actors.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    REQUEST_TIMEOUT,
    RESOURCE_NOT_FOUND,
    JsonRpcError,
)
from vmcp_actors.sessions._aggregation import Catalog, Route

NotificationSink = Callable[[dict[str, Any]], None]


class Capabilities(Protocol):
    """What a session offers its client. Safe for concurrent use."""

    def list_tools(self, identity: Identity | None) -> tuple[dict[str, Any], ...]: ...
    def lookup_tool(self, identity: Identity | None, name: str) -> Route | None: ...
    def call_tool(self, identity: Identity | None, name: str, arguments: dict[str, Any] | None,
                  meta: dict[str, Any] | None, on_notification: NotificationSink | None = None) -> cf.Future[dict[str, Any]]: ...
    def list_resources(self, identity: Identity | None) -> tuple[dict[str, Any], ...]: ...
    def list_resource_templates(self, identity: Identity | None) -> tuple[dict[str, Any], ...]: ...
    def lookup_resource(self, identity: Identity | None, uri: str) -> str | None: ...
    def read_resource(self, identity: Identity | None, uri: str, meta: dict[str, Any] | None,
                      on_notification: NotificationSink | None = None) -> cf.Future[dict[str, Any]]: ...
    def list_prompts(self, identity: Identity | None) -> tuple[dict[str, Any], ...]: ...
    def lookup_prompt(self, identity: Identity | None, name: str) -> Route | None: ...
    def get_prompt(self, identity: Identity | None, name: str, arguments: dict[str, Any] | None,
                   meta: dict[str, Any] | None, on_notification: NotificationSink | None = None) -> cf.Future[dict[str, Any]]: ...
    def complete(self, identity: Identity | None, params: dict[str, Any]) -> cf.Future[dict[str, Any]]: ...
    def set_logging_level(self, identity: Identity | None, level: str) -> cf.Future[dict[str, Any]]: ...
    def close(self) -> None: ...


class NoBackendsAvailable(JsonRpcError):
    def __init__(self) -> None:
        super().__init__(INTERNAL_ERROR, "No backend is available for this session; try again later", http_status=503)


def to_jsonrpc_error(error: BaseException) -> JsonRpcError:
    """A backend failure as the client sees it: the backend's own error, or one naming the backend only."""
    if isinstance(error, JsonRpcError):
        return error
    if isinstance(error, BackendRpcError):
        return JsonRpcError(error.code, error.rpc_message, error.data)
    if isinstance(error, BackendTimeout):
        return JsonRpcError(REQUEST_TIMEOUT, str(error), {"backend": error.backend})
    if isinstance(error, BackendError):
        return JsonRpcError(INTERNAL_ERROR, str(error), {"backend": error.backend})
    return JsonRpcError(INTERNAL_ERROR, "Internal error")


def _translated(future: cf.Future[Any]) -> cf.Future[Any]:
    """A future with the same result, whose failure is a JsonRpcError."""
    out: cf.Future[Any] = cf.Future()

    def copy(done: cf.Future[Any]) -> None:
        error = done.exception()
        if error is None:
            out.set_result(done.result())
        else:
            out.set_exception(to_jsonrpc_error(error))

    future.add_done_callback(copy)
    return out


class AggregatedBackends:
    """The session's backends seen as one server, through the session's catalog."""

    def __init__(self, session: Any, connections: Mapping[str, Any], discovery_timeout: float):
        self._session = session  # ActorProxy[SessionActor]
        self._connections = connections  # backend name -> ActorProxy[BackendConnection]
        self._discovery_timeout = discovery_timeout

    # -- catalog -----------------------------------------------------------------------

    def catalog(self, identity: Identity | None) -> Catalog:
        try:
            pending = self._session.catalog(identity).get(timeout=ASK_TIMEOUT)
            catalog: Catalog = pending.result(timeout=self._discovery_timeout)
        except (pykka.ActorDeadError, pykka.Timeout, cf.TimeoutError):
            raise NoBackendsAvailable() from None
        if not catalog.has_backends:
            raise NoBackendsAvailable()
        return catalog

    def list_tools(self, identity: Identity | None) -> tuple[dict[str, Any], ...]:
        return self.catalog(identity).tools

    def list_resources(self, identity: Identity | None) -> tuple[dict[str, Any], ...]:
        return self.catalog(identity).resources

    def list_resource_templates(self, identity: Identity | None) -> tuple[dict[str, Any], ...]:
        return self.catalog(identity).resource_templates

    def list_prompts(self, identity: Identity | None) -> tuple[dict[str, Any], ...]:
        return self.catalog(identity).prompts

    def lookup_tool(self, identity: Identity | None, name: str) -> Route | None:
        return self.catalog(identity).tool_routes.get(name)

    def lookup_prompt(self, identity: Identity | None, name: str) -> Route | None:
        return self.catalog(identity).prompt_routes.get(name)

    def lookup_resource(self, identity: Identity | None, uri: str) -> str | None:
        return self.catalog(identity).route_resource(uri)

    # -- calls -------------------------------------------------------------------------

    def call_tool(self, identity, name, arguments, meta, on_notification=None):
        route = self.lookup_tool(identity, name)
        if route is None:
            return failed(JsonRpcError(INVALID_PARAMS, f"Unknown tool: {name}"))
        params = _with_meta({"name": route.original_name, "arguments": arguments or {}}, meta)
        return self._request(identity, route.backend, "tools/call", params, on_notification)

    def read_resource(self, identity, uri, meta, on_notification=None):
        backend = self.lookup_resource(identity, uri)
        if backend is None:
            return failed(JsonRpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": uri}))
        return self._request(identity, backend, "resources/read", _with_meta({"uri": uri}, meta), on_notification)

    def get_prompt(self, identity, name, arguments, meta, on_notification=None):
        route = self.lookup_prompt(identity, name)
        if route is None:
            return failed(JsonRpcError(INVALID_PARAMS, f"Unknown prompt: {name}"))
        params = _with_meta({"name": route.original_name, "arguments": arguments or {}}, meta)
        return self._request(identity, route.backend, "prompts/get", params, on_notification)

    def complete(self, identity, params):
        ref = params.get("ref")
        catalog = self.catalog(identity)
        if ref.get("type") == "ref/prompt":
            route = catalog.prompt_routes.get(ref.get("name"))
            if route is None:
                return failed(JsonRpcError(INVALID_PARAMS, f"Unknown prompt: {ref.get('name')}"))
            backend, ref = route.backend, {**ref, "name": route.original_name}
        else:
            backend = catalog.route_template(ref.get("uri")) or catalog.resource_owners.get(ref.get("uri"))
            if backend is None:
                return failed(JsonRpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": ref.get("uri")}))
        if not catalog.backends[backend].supports("completions"):
            return resolved({"completion": {"values": [], "hasMore": False}})
        return self._request(identity, backend, "completion/complete", {**params, "ref": ref}, None)

    def set_logging_level(self, identity, level):
        """Forwarded to every backend that has logging; the answer waits for none of them."""
        catalog = self.catalog(identity)
        for backend, found in catalog.backends.items():
            if found.supports("logging"):
                self._request(identity, backend, "logging/setLevel", {"level": level}, None)
        return resolved({})

    def close(self) -> None:
        """Nothing to release here: the SessionActor owns the connections."""

    def _request(self, identity, backend, method, params, on_notification):
        try:
            pending = self._connections[backend].request(identity, method, params, on_notification)
            return _translated(pending.get(timeout=ASK_TIMEOUT))
        except (pykka.ActorDeadError, pykka.Timeout):
            return failed(JsonRpcError(INTERNAL_ERROR, f"backend {backend!r} connection is closed", {"backend": backend}))


def _with_meta(params: dict[str, Any], meta: dict[str, Any] | None) -> dict[str, Any]:
    if meta:
        params["_meta"] = meta
    return params
