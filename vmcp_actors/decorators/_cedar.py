"""Cedar policies as a decorator over the capability interface (ToolHive's entity model).

Every request is a Cedar request: the principal ``Client::"<sub>"`` with every token
claim as an attribute ``claim_<name>`` and its groups as parents (``THVGroup::"<group>"``,
from ``groupClaimName`` or else the first of ``groups``, ``roles``, ``cognito:groups``,
plus ``roleClaimName``); the action ``Action::"call_tool"``, ``"get_prompt"`` or
``"read_resource"``; the resource ``Tool::"<name>"``, ``Prompt::"<name>"`` or
``Resource::"<uri>"`` with ``name``, ``operation``, ``feature``, a tool's annotation hints,
and the call's scalar arguments as ``arg_<name>``; the context holds the claims and the
arguments too. A list holds exactly what a call without arguments would be allowed (as
ToolHive filters lists), so list and call decide alike, per caller. A denied call gets
the answer an unknown name gets (nothing is revealed) and an audit line says who was
denied what. A policy error denies.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cedarpy

from vmcp_actors.concurrency import Deadline
from vmcp_actors.config import AuthzConfig
from vmcp_actors.config._cedar import parse_entities
from vmcp_actors.core._admitted import AUTHZ, admitted
from vmcp_actors.core._catalog import Route, by_name
from vmcp_actors.core._exchange import Exchange
from vmcp_actors.core._explain import HIDES, PASSES, Explanation, Finding
from vmcp_actors.core._interface import (
    UnknownTool,
    CoreLayer,
    PerList,
    UserCore,
    reachable,
)
from vmcp_actors.decorators._guard import refuse_unknown_prompt_ref
from vmcp_actors.identity import ANONYMOUS, Identity
from vmcp_actors.protocol import INVALID_PARAMS, RESOURCE_NOT_FOUND, JsonRpcError

logger = logging.getLogger(__name__)
audit = logging.getLogger("vmcp_actors.audit")

DEFAULT_GROUP_CLAIMS = ("groups", "roles", "cognito:groups")
ANNOTATION_HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
DECISION_CACHE_SIZE = 20_000  # argument-free decisions kept per layer (one layer per user)

CALL_TOOL, GET_PROMPT, READ_RESOURCE = "call_tool", "get_prompt", "read_resource"
_FEATURE = {CALL_TOOL: ("Tool", "call", "tool"), GET_PROMPT: ("Prompt", "get", "prompt"),
            READ_RESOURCE: ("Resource", "read", "resource")}


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reasons: tuple[str, ...]  # the policies that decided (ids: policy0, policy1, ...)
    errors: tuple[str, ...]


class CedarPolicies:
    """The configured policies and entities, parsed once for the process. Thread-safe."""

    def __init__(self, config: AuthzConfig):
        self._policies = cedarpy.PolicySet.from_str("\n".join(config.policies))
        self._entities = parse_entities(config.entities_json)
        self._group_claim = config.group_claim_name
        self._role_claim = config.role_claim_name
        self._group_type = config.group_entity_type

    def principal(self, identity: Identity | None) -> Principal:
        claims = dict(identity.claims) if identity is not None and not identity.is_anonymous else {}
        subject = claims.get("sub") if isinstance(claims.get("sub"), str) else \
            (identity.subject if identity is not None and not identity.is_anonymous else ANONYMOUS)
        claims.setdefault("sub", subject)
        return Principal(subject, _attributes("claim_", claims), self._groups(claims))

    def decide(self, principal: Principal, action: str, name: str, hints: Mapping[str, Any] | None = None,
               arguments: Mapping[str, Any] | None = None) -> Decision:
        kind, operation, feature = _FEATURE[action]
        arguments_attrs = _arguments(arguments or {})
        resource_attrs: dict[str, Any] = {"name": name, "operation": operation, "feature": feature, **arguments_attrs}
        if kind == "Resource":
            resource_attrs["uri"] = name
        for hint in ANNOTATION_HINTS:
            if isinstance((hints or {}).get(hint), bool):
                resource_attrs[hint] = hints[hint]  # type: ignore[index]
        entities = self._entities + [
            {"uid": {"type": "Client", "id": principal.subject}, "attrs": principal.claims,
             "parents": [{"type": self._group_type, "id": group} for group in principal.groups]},
            {"uid": {"type": "Action", "id": action}, "attrs": {"operation": action}, "parents": []},
            {"uid": {"type": kind, "id": name}, "attrs": resource_attrs, "parents": []},
        ]
        request = {"principal": {"type": "Client", "id": principal.subject},
                   "action": {"type": "Action", "id": action},
                   "resource": {"type": kind, "id": name},
                   "context": {**principal.claims, **arguments_attrs}}
        result = cedarpy.is_authorized(request, self._policies, entities)
        errors = tuple(str(error) for error in result.diagnostics.errors)
        if errors:
            logger.warning("Cedar policy evaluation failed for %s on %s::%s (denied): %s", action, kind,
                           json.dumps(name), "; ".join(errors))
        return Decision(bool(result.allowed) and not errors, tuple(result.diagnostics.reasons), errors)

    def _groups(self, claims: Mapping[str, Any]) -> tuple[str, ...]:
        groups: list[str] = []
        names = [self._group_claim] if self._group_claim else []
        found = next((_claim(claims, name) for name in names + list(DEFAULT_GROUP_CLAIMS)
                      if _claim(claims, name) is not None), None)
        groups.extend(_strings(found))
        if self._role_claim:
            groups.extend(_strings(_claim(claims, self._role_claim)))
        return tuple(dict.fromkeys(groups))


@dataclass(frozen=True)
class Principal:
    subject: str
    claims: dict[str, Any]  # claim_<name> -> Cedar value
    groups: tuple[str, ...]

    @functools.cached_property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps([self.subject, self.claims, self.groups], sort_keys=True,
                                         default=str).encode()).hexdigest()


class CedarAuthz(CoreLayer):
    """What the policies let this caller list and call; everything else is not there."""

    layer_name = "authz (Cedar)"

    def __init__(self, inner: UserCore, policies: CedarPolicies):
        super().__init__(inner)
        self._policies = policies
        self._lock = threading.Lock()  # guards _decided (the decision cache)
        self._decided: dict[tuple[str, str, str, str], Decision] = {}
        # Derived once per list the layer below answers (and per principal for what is allowed).
        self._definitions: PerList[dict[str, dict[str, Any]]] = PerList()
        self._allowed_tools: PerList[tuple[tuple[dict[str, Any], ...], dict[str, dict[str, Any]]]] = PerList()
        self._allowed_prompts: PerList[tuple[dict[str, Any], ...]] = PerList()
        self._allowed_resources: PerList[tuple[dict[str, Any], ...]] = PerList()

    # -- decisions -----------------------------------------------------------------------

    def _decide(self, identity: Identity | None, action: str, name: str, hints: Mapping[str, Any] | None = None,
                arguments: Mapping[str, Any] | None = None, principal: Principal | None = None) -> Decision:
        principal = principal if principal is not None else self._policies.principal(identity)
        if arguments and _arguments(arguments):
            return self._policies.decide(principal, action, name, hints, arguments)
        key = (principal.digest, action, name, _hint_key(hints))
        with self._lock:
            decided = self._decided.get(key)
        if decided is None:
            decided = self._policies.decide(principal, action, name, hints)
            with self._lock:
                if len(self._decided) >= DECISION_CACHE_SIZE:
                    self._decided.clear()  # a caller whose claims keep changing: start over
                self._decided[key] = decided
        return decided

    def _denied(self, identity: Identity | None, action: str, name: str) -> None:
        audit_denied(identity, action, name)

    def _tool_hints(self, identity: Identity | None, name: str, deadline: Deadline) -> Mapping[str, Any] | None:
        tools = self._inner.list_tools(identity, deadline)
        tool = self._definitions.get(tools, lambda: by_name(tools)).get(name)
        return tool_hints(tool) if tool is not None else None

    def _allowed_entries(self, cache: PerList[tuple[dict[str, Any], ...]], identity: Identity | None,
                         entries: tuple[dict[str, Any], ...], action: str, key: str) -> tuple[dict[str, Any], ...]:
        """The prompts or resources below this caller may get or read: once per list and principal."""
        principal = self._policies.principal(identity)
        return cache.get(entries, lambda: tuple(
            entry for entry in entries
            if self._decide(identity, action, str(entry.get(key)), principal=principal).allowed), principal.digest)

    # -- tools ---------------------------------------------------------------------------

    def list_tools(self, identity: Identity | None, deadline: Deadline) -> tuple[dict[str, Any], ...]:
        return self._allowed(identity, deadline)[0]

    def describe_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> dict[str, Any] | None:
        return self._allowed(identity, deadline)[1].get(name)

    def _allowed(self, identity: Identity | None,
                 deadline: Deadline) -> tuple[tuple[dict[str, Any], ...], dict[str, dict[str, Any]]]:
        """The tools below this caller may call (without arguments), and them by name: decided
        once per list and principal (the optimizer and describe_tool ask often)."""
        tools = self._inner.list_tools(identity, deadline)
        principal = self._policies.principal(identity)

        def allowed() -> tuple[tuple[dict[str, Any], ...], dict[str, dict[str, Any]]]:
            kept = tuple(tool for tool in tools if self._decide(identity, CALL_TOOL, str(tool.get("name")),
                                                                tool_hints(tool), principal=principal).allowed)
            return kept, by_name(kept)

        return self._allowed_tools.get(tools, allowed, principal.digest)

    def lookup_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> Route | None:
        route = self._inner.lookup_tool(identity, name, deadline)
        if route is None or not self._decide(identity, CALL_TOOL, name,
                                             self._tool_hints(identity, name, deadline)).allowed:
            return None
        return route

    def call_tool(self, identity, name, arguments, meta, deadline) -> Exchange:
        route = self._inner.lookup_tool(identity, name, deadline)
        if route is None:
            raise UnknownTool(name)
        if not self._decide(identity, CALL_TOOL, name, self._tool_hints(identity, name, deadline), arguments).allowed:
            self._denied(identity, CALL_TOOL, name)
            raise UnknownTool(name)  # as for no such tool: nothing revealed
        with admitted(AUTHZ, name):
            return self._inner.call_tool(identity, name, arguments, meta, deadline)

    # -- prompts -------------------------------------------------------------------------

    def list_prompts(self, identity, deadline):
        return self._allowed_entries(self._allowed_prompts, identity, self._inner.list_prompts(identity, deadline),
                                     GET_PROMPT, "name")

    def lookup_prompt(self, identity, name, deadline):
        route = self._inner.lookup_prompt(identity, name, deadline)
        return route if route is not None and self._decide(identity, GET_PROMPT, name).allowed else None

    def get_prompt(self, identity, name, arguments, meta, deadline) -> Exchange:
        if self._inner.lookup_prompt(identity, name, deadline) is None:
            raise JsonRpcError(INVALID_PARAMS, f"Unknown prompt: {name}")
        if not self._decide(identity, GET_PROMPT, name, None, arguments).allowed:
            self._denied(identity, GET_PROMPT, name)
            raise JsonRpcError(INVALID_PARAMS, f"Unknown prompt: {name}")
        with admitted(AUTHZ, name):
            return self._inner.get_prompt(identity, name, arguments, meta, deadline)

    # -- resources (templates are listed as they are: each read decides by its URI) -------

    def list_resources(self, identity, deadline):
        return self._allowed_entries(self._allowed_resources, identity,
                                     self._inner.list_resources(identity, deadline), READ_RESOURCE, "uri")

    def lookup_resource(self, identity, uri, deadline):
        backend = self._inner.lookup_resource(identity, uri, deadline)
        return backend if backend is not None and self._decide(identity, READ_RESOURCE, uri).allowed else None

    def read_resource(self, identity, uri, meta, deadline) -> Exchange:
        self._refuse_unreadable(identity, uri, deadline)
        with admitted(AUTHZ, uri):
            return self._inner.read_resource(identity, uri, meta, deadline)

    def subscribe_resource(self, identity, subscriber, uri, deadline):
        self._refuse_unreadable(identity, uri, deadline)
        return self._inner.subscribe_resource(identity, subscriber, uri, deadline)

    def _refuse_unreadable(self, identity: Identity | None, uri: str, deadline: Deadline) -> None:
        """A resource the policies deny is not found (a missing one is the layer below's to answer)."""
        if self._inner.lookup_resource(identity, uri, deadline) is not None \
                and not self._decide(identity, READ_RESOURCE, uri).allowed:
            self._denied(identity, READ_RESOURCE, uri)
            raise JsonRpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": uri})

    def complete(self, identity, params, deadline):
        refuse_unknown_prompt_ref(self, identity, params, deadline)
        return self._inner.complete(identity, params, deadline)

    def resume(self, identity, continuation, deadline):
        """Decided again, with the request's arguments, as the first round was."""
        name, method = continuation.name, continuation.method
        if method == "resources/read":
            action, hints = READ_RESOURCE, None
        elif method == "prompts/get":
            action, hints = GET_PROMPT, None
        else:
            action, hints = CALL_TOOL, self._tool_hints(identity, name, deadline)
        if not reachable(self._inner, identity, continuation, deadline):
            raise continuation.unknown()
        arguments = continuation.arguments if method != "resources/read" else None
        if not self._decide(identity, action, name, hints, arguments).allowed:
            self._denied(identity, action, name)
            raise continuation.unknown()
        with admitted(AUTHZ, name):
            return self._inner.resume(identity, continuation, deadline)

    # -- explain -------------------------------------------------------------------------

    def finding(self, identity: Identity | None, name: str, deadline: Deadline, below: Explanation,
                listed: bool, callable_: bool) -> Finding:
        if not below.callable:
            return super().finding(identity, name, deadline, below, listed, callable_)
        principal = self._policies.principal(identity)
        decision = self._decide(identity, CALL_TOOL, name, self._tool_hints(identity, name, deadline))
        who = f'Client::"{principal.subject}"' + (f" (groups: {', '.join(principal.groups)})" if principal.groups
                                                  else "")
        asked = f'Action::"call_tool" on Tool::"{name}"'
        details = (("principal", principal.subject), ("groups", list(principal.groups)),
                   ("policies", list(decision.reasons)))
        if decision.allowed:
            return Finding(self.layer_name, PASSES, f"{', '.join(decision.reasons)} permit {asked} for {who}", details)
        if decision.errors:
            why = "a policy failed to evaluate (denied): " + "; ".join(decision.errors)
        elif decision.reasons:
            why = f"forbidden by {', '.join(decision.reasons)}"
        else:
            why = "no policy permits it"
        return Finding(self.layer_name, HIDES, f"{asked} for {who}: {why}", details)


def _hint_key(hints: Mapping[str, Any] | None) -> tuple[tuple[str, bool], ...]:
    return tuple((hint, hints[hint]) for hint in ANNOTATION_HINTS if isinstance((hints or {}).get(hint), bool)) \
        if hints else ()


def audit_denied(identity: Identity | None, action: str, name: str) -> None:
    audit.info("%s", json.dumps({"event": "authz.denied", "issuer": identity.issuer if identity else "",
                                 "subject": identity.subject if identity else ANONYMOUS,
                                 "action": action, "resource": name}, sort_keys=True))


def tool_hints(tool: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A tool's annotations, which policies may read (``readOnlyHint``, ...)."""
    annotations = tool.get("annotations")
    return annotations if isinstance(annotations, Mapping) else None


def _claim(claims: Mapping[str, Any], path: str) -> Any:
    """A claim by name, or by a dotted path into nested claims (``realm_access.roles``)."""
    if path in claims:
        return claims[path]
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, (list, tuple)):
        return [item for item in value if isinstance(item, str) and item]
    return []


def _cedar_value(value: Any) -> Any:
    """A JSON value as Cedar takes it (no floats, no nulls): None when it has no Cedar form."""
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if -(2 ** 63) <= value < 2 ** 63 else str(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() else str(value)
    if isinstance(value, (list, tuple)):
        return [converted for item in value if (converted := _cedar_value(item)) is not None]
    if isinstance(value, Mapping):
        return {str(key): converted for key, item in value.items() if (converted := _cedar_value(item)) is not None}
    return None


def _attributes(prefix: str, values: Mapping[str, Any]) -> dict[str, Any]:
    return {prefix + str(key): converted for key, value in values.items()
            if (converted := _cedar_value(value)) is not None}


def _arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """ToolHive's ``arg_<name>`` for scalar arguments; ``arg_<name>_present`` for the rest."""
    out: dict[str, Any] = {}
    for key, value in arguments.items():
        if isinstance(value, (bool, str, int, float)):
            out[f"arg_{key}"] = _cedar_value(value)
        elif value is not None:
            out[f"arg_{key}_present"] = True
    return out
