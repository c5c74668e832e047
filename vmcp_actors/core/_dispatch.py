"""MCP methods over a user's core: parameter checks, pagination, routing.

``handle`` answers a result dict, or an Exchange for the edge's call driver to run, and
raises ``JsonRpcError`` for what the client got wrong. ``initialize``, ``server/discover``
and the revisions' own checks are the edge's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from vmcp_actors.concurrency import Deadline
from vmcp_actors.core._exchange import Exchange
from vmcp_actors.core._interface import Continuation, UnknownTool, UserCore
from vmcp_actors.core._pagination import paginate
from vmcp_actors.core._shared_names import OwnName, chosen_meaning
from vmcp_actors.core._tasks import (
    TaskRequest,
    requested_task,
    task_requested,
    tasks_extension_required,
)
from vmcp_actors.identity import Identity
from vmcp_actors.protocol import INVALID_PARAMS, METHOD_NOT_FOUND, JsonRpcError, Message
from vmcp_actors.protocol.mcp import LOGGING_LEVELS

logger = logging.getLogger(__name__)


class AmbiguousToolName(JsonRpcError):
    """A call by an own name several of the caller's tools share, with no rule to pick one."""

    def __init__(self, name: str, advertised: tuple[str, ...]):
        super().__init__(INVALID_PARAMS, f"Tool name {name!r} is ambiguous: it is the own name of several tools "
                                         f"({', '.join(advertised)}), and a call by it does not say which; call one "
                                         f"of those names", {"tools": list(advertised)})


class McpDispatcher:
    def __init__(self, capabilities: UserCore, *, page_size: int,
                 unavailable: Callable[[], Mapping[str, str]] | None = None,
                 discovered: Callable[[Deadline], bool] | None = None,
                 own_names: Callable[[Identity | None, str, Deadline], tuple[OwnName, ...]] | None = None):
        """``unavailable``: the backends the caller's catalog misses now, and why (an
        unknown tool's error names them: the tool may be theirs). ``discovered``: waits,
        within the deadline, for a discovery still under way (True once it has ended).
        ``own_names``: the advertised tools a backend's own tool name may mean."""
        self._capabilities = capabilities
        self._own_names = own_names
        self._unavailable = unavailable
        self._discovered = discovered
        self._page_size = page_size
        self._methods: dict[str, Callable[[Identity | None, dict[str, Any], Deadline], Any]] = {
            "ping": lambda identity, params, deadline: {},
            "tools/list": self._list("tools", capabilities.list_tools),
            "resources/list": self._list("resources", capabilities.list_resources),
            "resources/templates/list": self._list("resourceTemplates", capabilities.list_resource_templates),
            "prompts/list": self._list("prompts", capabilities.list_prompts),
            "tools/call": self._call_tool,
            "resources/read": self._read_resource,
            "prompts/get": self._get_prompt,
            "completion/complete": self._complete,
            "logging/setLevel": self._set_logging_level,
        }

    def handle(self, identity: Identity | None, request: Message, deadline: Deadline,
               session_id: str = "", *, modern: bool = False, takes_tasks: bool = False) -> dict[str, Any] | Exchange:
        """``session_id``: the client session asking (subscriptions are a session's own).
        ``modern``: a 2026-07-28 client; ``takes_tasks``: one that declared the tasks
        extension (a 2025 client asks for a task with ``params.task``)."""
        method = request.method or ""
        handler = self._methods.get(method)
        if method in ("resources/subscribe", "resources/unsubscribe") and session_id:
            handler = self._subscription(method, session_id)
        if method.startswith("tasks/"):
            if modern and not takes_tasks:
                raise tasks_extension_required()
            handler = self._task_method(method, modern)
        if handler is None:
            raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
        params = request.params if request.params is not None else {}
        if not isinstance(params, dict):
            raise JsonRpcError(INVALID_PARAMS, "params must be an object")
        task = _task_requested(params, modern, takes_tasks) if method == "tools/call" else None
        if task is None:
            return handler(identity, params, deadline)
        # Every 2025 call sets one (AWAITED): the variable itself, not ``task_requested``'s
        # context manager, so a call that meets no task runs none of the tasks' code.
        token = requested_task.set(task)
        try:
            return handler(identity, params if task.awaited else
                           {key: value for key, value in params.items() if key != "task"}, deadline)
        finally:
            requested_task.reset(token)

    def tool_called(self, identity: Identity | None, name: str, deadline: Deadline) -> str:
        """The name a tools/call of ``name`` is decided and made under: ``name`` itself,
        unless it is not advertised and is a backend's own name for a tool the caller can
        call (an MCP App calls its server's tools by the names its server gave them). An
        own name several such tools share goes to the one ranked first by priorityOrder;
        with none ranked first, the call is refused (``AmbiguousToolName``). Only tools
        the caller can call are considered, so the answer reveals no other."""
        meanings = self._own_names(identity, name, deadline) if self._own_names is not None else ()
        if not meanings or self._capabilities.lookup_tool(identity, name, deadline) is not None:
            return name
        reachable = tuple(meaning for meaning in meanings
                          if self._capabilities.lookup_tool(identity, meaning.advertised, deadline) is not None)
        if not reachable:
            return name  # an unknown tool, as any name the caller cannot reach
        chosen = chosen_meaning(reachable)
        if chosen is None:
            raise AmbiguousToolName(name, tuple(meaning.advertised for meaning in reachable))
        return chosen.advertised

    # -- handlers: return a result dict, or an exchange that yields notifications ------

    def _list(self, key: str, lister: Callable[[Identity | None, Deadline], tuple[dict[str, Any], ...]]):
        def handler(identity: Identity | None, params: dict[str, Any], deadline: Deadline) -> dict[str, Any]:
            return paginate(lister(identity, deadline), key, params, self._page_size)

        return handler

    def _subscription(self, method: str, session_id: str):
        change = (self._capabilities.subscribe_resource if method == "resources/subscribe"
                  else self._capabilities.unsubscribe_resource)

        def handler(identity: Identity | None, params: dict[str, Any], deadline: Deadline) -> dict[str, Any]:
            return change(identity, session_id, _required_string(params, "uri"), deadline)

        return handler

    def _task_method(self, method: str, modern: bool):
        def handler(identity: Identity | None, params: dict[str, Any], deadline: Deadline) -> Any:
            return self._capabilities.task_request(identity, method, params, modern, deadline)

        return handler

    def _call_tool(self, identity, params, deadline):
        name = _required_string(params, "name")
        arguments, meta = _optional_object(params, "arguments"), _optional_object(params, "_meta")
        try:
            try:
                return self._capabilities.call_tool(identity, name, arguments, meta, deadline)
            except UnknownTool:
                # Not among the backends ready when the discovery budget ended: one still
                # starting may offer it, and a client connected to it directly would wait.
                if self._discovered is None:
                    raise
                logger.debug("tools/call of %r waits for the discovery under way", name)
                if not self._discovered(deadline):
                    raise
                name = self.tool_called(identity, name, deadline)  # a late backend's own name, maybe
                return self._capabilities.call_tool(identity, name, arguments, meta, deadline)
        except UnknownTool as unknown:
            missing = self._unavailable() if self._unavailable is not None else {}
            if not missing:
                raise
            raise UnknownTool(unknown.tool, missing) from None

    def _read_resource(self, identity, params, deadline):
        uri = _required_string(params, "uri")
        return self._capabilities.read_resource(identity, uri, _optional_object(params, "_meta"), deadline)

    def _get_prompt(self, identity, params, deadline):
        name = _required_string(params, "name")
        return self._capabilities.get_prompt(
            identity, name, _optional_object(params, "arguments"), _optional_object(params, "_meta"), deadline
        )

    def _complete(self, identity, params, deadline):
        ref = params.get("ref")
        if not isinstance(ref, dict) or ref.get("type") not in ("ref/prompt", "ref/resource"):
            raise JsonRpcError(INVALID_PARAMS, "ref must be an object of type ref/prompt or ref/resource")
        _required_string(ref, "name" if ref["type"] == "ref/prompt" else "uri", where="ref.")
        argument = params.get("argument")
        if not isinstance(argument, dict) or not isinstance(argument.get("name"), str):
            raise JsonRpcError(INVALID_PARAMS, "argument must be an object with a name")
        return self._capabilities.complete(identity, params, deadline)

    def _set_logging_level(self, identity, params, deadline):
        level = params.get("level")
        if level not in LOGGING_LEVELS:
            raise JsonRpcError(INVALID_PARAMS, f"level must be one of {', '.join(LOGGING_LEVELS)}")
        return self._capabilities.set_logging_level(identity, level, deadline)


def resume(core: UserCore, identity: Identity | None, continuation: Continuation, deadline: Deadline,
           takes_tasks: bool) -> Exchange:
    """``core.resume``: a 2026-07-28 client's retry (with its input) of a call, which may
    become a task when the client declared the extension."""
    if not takes_tasks or continuation.method != "tools/call":
        return core.resume(identity, continuation, deadline)
    with task_requested(TaskRequest(True, {})):
        return core.resume(identity, continuation, deadline)


AWAITED = TaskRequest(False, {}, awaited=True)


def _task_requested(params: dict[str, Any], modern: bool, takes_tasks: bool) -> TaskRequest | None:
    """The task a tools/call's client accepts: a 2025 client's ``params.task``, or any
    call of a 2026-07-28 client that declared the extension; a 2025 client's call without
    one waits for any task its backend makes (``AWAITED``)."""
    if modern:
        return TaskRequest(True, {}) if takes_tasks else None
    task = params.get("task")
    if task is None:
        return AWAITED
    if not isinstance(task, dict):
        raise JsonRpcError(INVALID_PARAMS, "task must be an object")
    return TaskRequest(False, task)


def _required_string(params: dict[str, Any], key: str, where: str = "") -> str:
    value = params.get(key)
    if not isinstance(value, str) or not value:
        raise JsonRpcError(INVALID_PARAMS, f"{where}{key} is required and must be a string")
    return value


def _optional_object(params: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = params.get(key)
    if value is not None and not isinstance(value, dict):
        raise JsonRpcError(INVALID_PARAMS, f"{key} must be an object")
    return value
