"""The core interface over a user's backends.

``AggregatedBackends`` is the innermost implementation; decorators (advertising filter,
composite tools) wrap the same interface. Identity is always an explicit argument, and
so is the request's ``Deadline``, which every wait below it uses. Methods block only the
calling (web) thread, never an actor: list and lookup methods wait for the user's
catalog; calls return an Exchange, a generator the caller drives on its own thread,
which yields the backend's streamed events as they arrive and returns the result.

``describe_tool(identity, name, deadline)`` is one tool's definition exactly as
``list_tools`` lists it (None when it is not listed), without listing every tool: what a
request needs of one tool (its ``inputSchema``, say, for a 2026-07-28 call's
``Mcp-Param-*`` headers). ``list_tools``, ``describe_tool`` and ``lookup_tool`` apply the
same visibility in every layer.

Once a user's catalog is published, a request reads it without a message, and every
layer derives what it needs from it (its list, an index by name, its decisions) once per
catalog (``PerList``), so listing and looking up cost no further waits.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from vmcp_actors.concurrency import Deadline
from vmcp_actors.core._catalog import Route, by_name
from vmcp_actors.core._exchange import Exchange
from vmcp_actors.core._explain import (
    Explanation,
    Finding,
    generic_finding,
)
from vmcp_actors.identity import Identity
from vmcp_actors.protocol import INVALID_PARAMS, RESOURCE_NOT_FOUND, JsonRpcError


class UnknownTool(JsonRpcError):
    """No tool by that name for this caller (the same answer whether it does not exist or
    is hidden). ``unavailable``: backends not discovered now, which may offer it."""

    def __init__(self, name: str, unavailable: Mapping[str, str] | None = None):
        message = f"Unknown tool: {name}"
        if unavailable:
            message += ("; not available now, so their tools are missing: "
                        + "; ".join(unavailable[backend] for backend in sorted(unavailable)))
        super().__init__(INVALID_PARAMS, message,
                         {"unavailableBackends": sorted(unavailable)} if unavailable else None)
        self.tool = name


@dataclass(frozen=True)
class Continuation:
    """A request that goes on with the client's input (2026-07-28): the retry of a call, get
    or read a backend answered ``input_required``, with the gateway's sealed
    ``requestState`` (``backend``, ``target`` and ``backend_state`` come from it; the edge
    refuses input that brings none). Every layer decides it again, as a new request."""

    method: str  # tools/call, prompts/get or resources/read
    name: str  # the tool's or prompt's name, or the resource's URI, as the layer asked sees it
    arguments: Mapping[str, Any] | None
    meta: Mapping[str, Any] | None
    input_responses: Mapping[str, Any]
    backend: str | None = None
    target: str | None = None  # the backend's own name or URI
    backend_state: str | None = None

    def unknown(self) -> JsonRpcError:
        """The error a name this caller cannot reach gets (the same as a missing one)."""
        if self.method == "resources/read":
            return JsonRpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": self.name})
        if self.method == "tools/call":
            return UnknownTool(self.name)
        return JsonRpcError(INVALID_PARAMS, f"Unknown prompt: {self.name}")


def reachable(core: UserCore, identity: Identity | None, continuation: Continuation, deadline: Deadline) -> bool:
    """Whether ``core`` still offers what ``continuation`` goes on with (policies asked again)."""
    if continuation.method == "resources/read":
        return core.lookup_resource(identity, continuation.name, deadline) is not None
    lookup = core.lookup_tool if continuation.method == "tools/call" else core.lookup_prompt
    return lookup(identity, continuation.name, deadline) is not None


class UserCore(Protocol):
    """What a user's sessions offer their clients. Safe for concurrent use."""

    def list_tools(self, identity: Identity | None, deadline: Deadline) -> tuple[dict[str, Any], ...]: ...
    def lookup_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> Route | None: ...
    def describe_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> dict[str, Any] | None: ...
    def call_tool(self, identity: Identity | None, name: str, arguments: dict[str, Any] | None,
                  meta: dict[str, Any] | None, deadline: Deadline) -> Exchange: ...
    def list_resources(self, identity: Identity | None, deadline: Deadline) -> tuple[dict[str, Any], ...]: ...
    def list_resource_templates(self, identity: Identity | None, deadline: Deadline) -> tuple[dict[str, Any], ...]: ...
    def lookup_resource(self, identity: Identity | None, uri: str, deadline: Deadline) -> str | None: ...
    def read_resource(self, identity: Identity | None, uri: str, meta: dict[str, Any] | None,
                      deadline: Deadline) -> Exchange: ...
    def list_prompts(self, identity: Identity | None, deadline: Deadline) -> tuple[dict[str, Any], ...]: ...
    def lookup_prompt(self, identity: Identity | None, name: str, deadline: Deadline) -> Route | None: ...
    def get_prompt(self, identity: Identity | None, name: str, arguments: dict[str, Any] | None,
                   meta: dict[str, Any] | None, deadline: Deadline) -> Exchange: ...
    def complete(self, identity: Identity | None, params: dict[str, Any],
                 deadline: Deadline) -> Exchange | dict[str, Any]: ...
    def set_logging_level(self, identity: Identity | None, level: str, deadline: Deadline) -> dict[str, Any]: ...
    def subscribe_resource(self, identity: Identity | None, subscriber: str, uri: str,
                           deadline: Deadline) -> dict[str, Any]: ...
    def unsubscribe_resource(self, identity: Identity | None, subscriber: str, uri: str,
                             deadline: Deadline) -> dict[str, Any]: ...
    def resume(self, identity: Identity | None, continuation: Continuation, deadline: Deadline) -> Exchange: ...
    def task_request(self, identity: Identity | None, method: str, params: dict[str, Any], modern: bool,
                     deadline: Deadline) -> Exchange | dict[str, Any]: ...
    def explain_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> Explanation: ...
    def close(self) -> None: ...


# A decorator factory: called with a user's core, returns the decorated core.
LayerFactory = Callable[["UserCore"], "UserCore"]

T = TypeVar("T")


class PerList(Generic[T]):
    """What a layer derives from the layer below's answer, derived once per answer.

    One slot: the value is kept while the layer below answers with the same object (a
    catalog's tuple is the same object for as long as that catalog is served) and the same
    ``key`` (the caller's principal, say). The slot holds the answer itself, so its id is
    never another object's while it is cached. Safe for concurrent use without a lock: the
    slot is replaced in one assignment, and two threads that find it stale at once only
    derive it twice; nothing waits on anything while deriving.
    """

    def __init__(self) -> None:
        self._slot: tuple[object, Hashable, T] | None = None

    def get(self, below: object, derive: Callable[[], T], key: Hashable = None) -> T:
        slot = self._slot
        if slot is not None and slot[0] is below and slot[1] == key:
            return slot[2]
        value = derive()
        self._slot = (below, key, value)
        return value

    def clear(self) -> None:
        self._slot = None


class CoreLayer:
    """Base of the decorators over ``UserCore``: every method passes through to the
    layer below; a decorator overrides what it changes (the advertising filter and the
    composite tools both change only tools).

    ``layer_name`` names the layer in explanations (``explain_tool``); ``finding`` says what
    the layer did with a tool, by default read from its own answers next to the layer below's.
    """

    layer_name = ""

    def __init__(self, inner: UserCore):
        self._inner = inner
        self._tools_by_name: PerList[dict[str, dict[str, Any]]] = PerList()

    def list_tools(self, identity, deadline):
        return self._inner.list_tools(identity, deadline)

    def lookup_tool(self, identity, name, deadline):
        return self._inner.lookup_tool(identity, name, deadline)

    def describe_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> dict[str, Any] | None:
        """By default: ``name`` in this layer's own list (indexed once per list), so it
        agrees with ``list_tools`` whatever the layer overrides."""
        tools = self.list_tools(identity, deadline)
        return self._tools_by_name.get(tools, lambda: by_name(tools)).get(name)

    def call_tool(self, identity, name, arguments, meta, deadline):
        return self._inner.call_tool(identity, name, arguments, meta, deadline)

    def list_resources(self, identity, deadline):
        return self._inner.list_resources(identity, deadline)

    def list_resource_templates(self, identity, deadline):
        return self._inner.list_resource_templates(identity, deadline)

    def lookup_resource(self, identity, uri, deadline):
        return self._inner.lookup_resource(identity, uri, deadline)

    def read_resource(self, identity, uri, meta, deadline):
        return self._inner.read_resource(identity, uri, meta, deadline)

    def list_prompts(self, identity, deadline):
        return self._inner.list_prompts(identity, deadline)

    def lookup_prompt(self, identity, name, deadline):
        return self._inner.lookup_prompt(identity, name, deadline)

    def get_prompt(self, identity, name, arguments, meta, deadline):
        return self._inner.get_prompt(identity, name, arguments, meta, deadline)

    def complete(self, identity, params, deadline):
        return self._inner.complete(identity, params, deadline)

    def set_logging_level(self, identity, level, deadline):
        return self._inner.set_logging_level(identity, level, deadline)

    def subscribe_resource(self, identity, subscriber, uri, deadline):
        return self._inner.subscribe_resource(identity, subscriber, uri, deadline)

    def unsubscribe_resource(self, identity, subscriber, uri, deadline):
        return self._inner.unsubscribe_resource(identity, subscriber, uri, deadline)

    def resume(self, identity, continuation, deadline):
        """By default a layer lets a continued request through when it still offers its
        name (so what a layer hides cannot be reached by a retry either)."""
        if not reachable(self, identity, continuation, deadline):
            raise continuation.unknown()
        return self._inner.resume(identity, continuation, deadline)

    def task_request(self, identity, method, params, modern, deadline):
        """``tasks/*`` (``modern``: the client speaks 2026-07-28): the task's owner answers."""
        return self._inner.task_request(identity, method, params, modern, deadline)

    def explain_tool(self, identity, name, deadline) -> Explanation:
        below = self._inner.explain_tool(identity, name, deadline)
        listed = self.describe_tool(identity, name, deadline) is not None
        callable_ = self.lookup_tool(identity, name, deadline) is not None
        finding = self.finding(identity, name, deadline, below, listed, callable_)
        return below.with_finding(finding, listed=listed, callable=callable_)

    def finding(self, identity: Identity | None, name: str, deadline: Deadline, below: Explanation,
                listed: bool, callable_: bool) -> Finding:
        return generic_finding(self.layer_name or type(self).__name__, below, listed, callable_)

    def close(self) -> None:
        self._inner.close()
