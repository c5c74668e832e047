"""The core interface over a session's backends (DESIGN.md, "The core interface").

``AggregatedBackends`` is the innermost implementation; decorators (advertising filter,
composite tools) wrap the same interface. Identity is always an explicit argument.
Methods block only the calling (web) thread, never an actor: list and lookup methods
wait for the session's catalog; calls return an Exchange, a generator the caller drives
on its own thread, which yields the backend's streamed notifications as they arrive and
returns the result.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Generator, Mapping
from typing import Any, Protocol

import pykka

from vmcp_actors.backends import BackendChannel
from vmcp_actors.concurrency import ASK_TIMEOUT, run_in_thread
from vmcp_actors.exceptions import BackendError, BackendRpcError, BackendTimeout
from vmcp_actors.identity import Identity
from vmcp_actors.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    REQUEST_TIMEOUT,
    RESOURCE_NOT_FOUND,
    JsonRpcError,
)
from vmcp_actors.sessions._aggregation import Catalog, InternalTool, Route

# Yields notifications (JSON-RPC messages), returns the result object; raises JsonRpcError.
Exchange = Generator[dict[str, Any], None, dict[str, Any]]


class Capabilities(Protocol):
    """What a session offers its client. Safe for concurrent use."""

    def list_tools(self, identity: Identity | None) -> tuple[dict[str, Any], ...]: ...
    def lookup_tool(self, identity: Identity | None, name: str) -> Route | None: ...
    def call_tool(self, identity: Identity | None, name: str, arguments: dict[str, Any] | None,
                  meta: dict[str, Any] | None) -> Exchange: ...
    def list_resources(self, identity: Identity | None) -> tuple[dict[str, Any], ...]: ...
    def list_resource_templates(self, identity: Identity | None) -> tuple[dict[str, Any], ...]: ...
    def lookup_resource(self, identity: Identity | None, uri: str) -> str | None: ...
    def read_resource(self, identity: Identity | None, uri: str, meta: dict[str, Any] | None) -> Exchange: ...
    def list_prompts(self, identity: Identity | None) -> tuple[dict[str, Any], ...]: ...
    def lookup_prompt(self, identity: Identity | None, name: str) -> Route | None: ...
    def get_prompt(self, identity: Identity | None, name: str, arguments: dict[str, Any] | None,
                   meta: dict[str, Any] | None) -> Exchange: ...
    def complete(self, identity: Identity | None, params: dict[str, Any]) -> Exchange | dict[str, Any]: ...
    def set_logging_level(self, identity: Identity | None, level: str) -> dict[str, Any]: ...
    def close(self) -> None: ...


class CapabilitiesLayer:
    """Base of the decorators over ``Capabilities``: every method passes through to the
    layer below; a decorator overrides what it changes (the advertising filter and the
    composite tools both change only tools)."""

    def __init__(self, inner: Capabilities):
        self._inner = inner

    def list_tools(self, identity):
        return self._inner.list_tools(identity)

    def lookup_tool(self, identity, name):
        return self._inner.lookup_tool(identity, name)

    def call_tool(self, identity, name, arguments, meta):
        return self._inner.call_tool(identity, name, arguments, meta)

    def list_resources(self, identity):
        return self._inner.list_resources(identity)

    def list_resource_templates(self, identity):
        return self._inner.list_resource_templates(identity)

    def lookup_resource(self, identity, uri):
        return self._inner.lookup_resource(identity, uri)

    def read_resource(self, identity, uri, meta):
        return self._inner.read_resource(identity, uri, meta)

    def list_prompts(self, identity):
        return self._inner.list_prompts(identity)

    def lookup_prompt(self, identity, name):
        return self._inner.lookup_prompt(identity, name)

    def get_prompt(self, identity, name, arguments, meta):
        return self._inner.get_prompt(identity, name, arguments, meta)

    def complete(self, identity, params):
        return self._inner.complete(identity, params)

    def set_logging_level(self, identity, level):
        return self._inner.set_logging_level(identity, level)

    def close(self) -> None:
        self._inner.close()


class ConflictingNames(JsonRpcError):
    """Aggregation left clashes that the config must resolve (manual strategy)."""

    def __init__(self, errors: tuple[str, ...]):
        super().__init__(INTERNAL_ERROR, "Tool names conflict: " + "; ".join(errors), {"conflicts": list(errors)})


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


def _translated(exchange: Generator[dict[str, Any], None, dict[str, Any]]) -> Exchange:
    """The same exchange, its failures turned into JsonRpcErrors for the client."""
    try:
        return (yield from exchange)
    except JsonRpcError:
        raise
    except Exception as error:  # noqa: BLE001 - every failure becomes a JSON-RPC error
        raise to_jsonrpc_error(error) from None


class AggregatedBackends:
    """The session's backends seen as one server, through the session's catalog."""

    def __init__(self, session: Any, channels: Mapping[str, BackendChannel], discovery_timeout: float):
        self._session = session  # ActorProxy[SessionActor]
        self._channels = channels
        self._discovery_timeout = discovery_timeout
        self._published: cf.Future[Catalog] | None = None

    # -- catalog -----------------------------------------------------------------------

    def publish(self, catalog: cf.Future[Catalog]) -> None:
        """Called by the SessionActor whenever its catalog changes (one atomic assignment)."""
        self._published = catalog

    def catalog(self, identity: Identity | None) -> Catalog:
        published = self._published
        if published is not None and published.done() and published.exception() is None:
            ready = published.result()
            if ready.has_backends and not ready.failures and not ready.errors:
                return ready  # complete: nothing for the SessionActor to decide, no message needed
        try:
            pending = self._session.catalog(identity).get(timeout=ASK_TIMEOUT)
            catalog: Catalog = pending.result(timeout=self._discovery_timeout)
        except (pykka.ActorDeadError, pykka.Timeout, cf.TimeoutError):
            raise NoBackendsAvailable() from None
        if not catalog.has_backends:
            raise NoBackendsAvailable()
        if catalog.errors:
            raise ConflictingNames(catalog.errors)
        return catalog

    def lookup_internal(self, identity: Identity | None, name: str) -> InternalTool | None:
        """For composite steps: any tool, advertised or hidden, by advertised name or ``workload.tool``."""
        return self.catalog(identity).resolve_internal(name)

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

    def call_tool(self, identity, name, arguments, meta) -> Exchange:
        route = self.lookup_tool(identity, name)
        if route is None:
            raise JsonRpcError(INVALID_PARAMS, f"Unknown tool: {name}")
        return self.call_route(identity, route, arguments, meta)

    def call_route(self, identity: Identity | None, route: Route, arguments: dict[str, Any] | None,
                   meta: dict[str, Any] | None = None) -> Exchange:
        """Call the backend tool ``route`` leads to (composite steps use it for hidden tools too)."""
        params = _with_meta({"name": route.original_name, "arguments": arguments or {}}, meta)
        return self._request(identity, route.backend, "tools/call", params)

    def read_resource(self, identity, uri, meta) -> Exchange:
        backend = self.lookup_resource(identity, uri)
        if backend is None:
            raise JsonRpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": uri})
        return self._request(identity, backend, "resources/read", _with_meta({"uri": uri}, meta))

    def get_prompt(self, identity, name, arguments, meta) -> Exchange:
        route = self.lookup_prompt(identity, name)
        if route is None:
            raise JsonRpcError(INVALID_PARAMS, f"Unknown prompt: {name}")
        params = _with_meta({"name": route.original_name, "arguments": arguments or {}}, meta)
        return self._request(identity, route.backend, "prompts/get", params)

    def complete(self, identity, params) -> Exchange | dict[str, Any]:
        ref = params["ref"]
        catalog = self.catalog(identity)
        if ref["type"] == "ref/prompt":
            route = catalog.prompt_routes.get(ref["name"])
            if route is None:
                raise JsonRpcError(INVALID_PARAMS, f"Unknown prompt: {ref['name']}")
            backend, ref = route.backend, {**ref, "name": route.original_name}
        else:
            backend = catalog.route_template(ref["uri"]) or catalog.resource_owners.get(ref["uri"])
            if backend is None:
                raise JsonRpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": ref["uri"]})
        if not catalog.backends[backend].supports("completions"):
            return {"completion": {"values": [], "hasMore": False}}
        return self._request(identity, backend, "completion/complete", {**params, "ref": ref})

    def set_logging_level(self, identity, level) -> dict[str, Any]:
        """Forwarded to every backend that has logging, in the background: the answer waits for none."""
        for backend, found in self.catalog(identity).backends.items():
            if found.supports("logging"):
                run_in_thread(self._channels[backend].call, identity, "logging/setLevel", {"level": level})
        return {}

    def close(self) -> None:
        """Nothing to release here: the SessionActor owns the connections."""

    def _request(self, identity, backend, method, params) -> Exchange:
        return _translated(self._channels[backend].request(identity, method, params))


def _with_meta(params: dict[str, Any], meta: dict[str, Any] | None) -> dict[str, Any]:
    if meta:
        params["_meta"] = meta
    return params
