"""The rule that decorators subtract, enforced for the layers an embedder adds.

``SubtractOnly`` stands between an embedder's layer and the stack below it. Whatever the
layer answers, a client sees no tool, resource, template or prompt the layer below did not
list (and sees the layer below's own definition of it, never an edited one), and no call,
read or get reaches the layer unless the layer below would take it too. A layer can hide
things; it cannot add, rename or redefine them. Only the core's composite tools and the
optimizer's two meta-tools add, and they are not behind this guard.
"""

from __future__ import annotations

from typing import Any

from vmcp_actors.concurrency import Deadline
from vmcp_actors.core._catalog import Route
from vmcp_actors.core._exchange import Exchange
from vmcp_actors.core._explain import Explanation, generic_finding
from vmcp_actors.core._interface import (
    UnknownTool,
    CoreLayer,
    PerList,
    UserCore,
    reachable,
)
from vmcp_actors.identity import Identity
from vmcp_actors.protocol import INVALID_PARAMS, RESOURCE_NOT_FOUND, JsonRpcError


def _kept(cache: PerList[tuple[dict[str, Any], ...]], below: tuple[dict[str, Any], ...], answered: Any,
          key: str) -> tuple[dict[str, Any], ...]:
    """The entries of ``below`` that ``answered`` kept, in ``below``'s order and definitions:
    the same tuple while ``below`` and what the layer kept stay the same (so the layers above
    derive from it once)."""
    keep = frozenset(entry.get(key) for entry in answered if isinstance(entry, dict)) if answered is not None \
        else frozenset()
    return cache.get(below, lambda: tuple(entry for entry in below if entry.get(key) in keep), keep)


def refuse_unknown_prompt_ref(layer: UserCore, identity: Identity | None, params: Any,
                              deadline: Deadline) -> None:
    """A completion of a prompt ``layer`` does not offer gets the answer an unknown prompt gets."""
    ref = params.get("ref") if isinstance(params, dict) else None
    if isinstance(ref, dict) and ref.get("type") == "ref/prompt" and isinstance(ref.get("name"), str) \
            and layer.lookup_prompt(identity, ref["name"], deadline) is None:
        raise JsonRpcError(INVALID_PARAMS, f"Unknown prompt: {ref['name']}")


class SubtractOnly(CoreLayer):
    """``layer`` (built over ``inner``) as the stack sees it: never more than ``inner``."""

    def __init__(self, layer: UserCore, inner: UserCore):
        super().__init__(inner)
        self._layer = layer
        self.layer_name = getattr(layer, "layer_name", "") or type(layer).__name__
        self._kept_tools: PerList[tuple[dict[str, Any], ...]] = PerList()
        self._kept_resources: PerList[tuple[dict[str, Any], ...]] = PerList()
        self._kept_templates: PerList[tuple[dict[str, Any], ...]] = PerList()
        self._kept_prompts: PerList[tuple[dict[str, Any], ...]] = PerList()

    # -- tools ---------------------------------------------------------------------------

    def list_tools(self, identity: Identity | None, deadline: Deadline) -> tuple[dict[str, Any], ...]:
        return _kept(self._kept_tools, self._inner.list_tools(identity, deadline),
                     self._layer.list_tools(identity, deadline), "name")

    def lookup_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> Route | None:
        below = self._inner.lookup_tool(identity, name, deadline)
        if below is None or self._layer.lookup_tool(identity, name, deadline) is None:
            return None
        return below  # the route below: a layer cannot point a name elsewhere

    def call_tool(self, identity, name, arguments, meta, deadline) -> Exchange:
        if self.lookup_tool(identity, name, deadline) is None:
            raise UnknownTool(name)
        return self._layer.call_tool(identity, name, arguments, meta, deadline)

    # -- resources -----------------------------------------------------------------------

    def list_resources(self, identity, deadline):
        return _kept(self._kept_resources, self._inner.list_resources(identity, deadline),
                     self._layer.list_resources(identity, deadline), "uri")

    def list_resource_templates(self, identity, deadline):
        return _kept(self._kept_templates, self._inner.list_resource_templates(identity, deadline),
                     self._layer.list_resource_templates(identity, deadline), "uriTemplate")

    def lookup_resource(self, identity, uri, deadline):
        below = self._inner.lookup_resource(identity, uri, deadline)
        if below is None or self._layer.lookup_resource(identity, uri, deadline) is None:
            return None
        return below

    def read_resource(self, identity, uri, meta, deadline) -> Exchange:
        if self.lookup_resource(identity, uri, deadline) is None:
            raise JsonRpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": uri})
        return self._layer.read_resource(identity, uri, meta, deadline)

    # -- prompts -------------------------------------------------------------------------

    def list_prompts(self, identity, deadline):
        return _kept(self._kept_prompts, self._inner.list_prompts(identity, deadline),
                     self._layer.list_prompts(identity, deadline), "name")

    def lookup_prompt(self, identity, name, deadline):
        below = self._inner.lookup_prompt(identity, name, deadline)
        if below is None or self._layer.lookup_prompt(identity, name, deadline) is None:
            return None
        return below

    def get_prompt(self, identity, name, arguments, meta, deadline) -> Exchange:
        if self.lookup_prompt(identity, name, deadline) is None:
            raise JsonRpcError(INVALID_PARAMS, f"Unknown prompt: {name}")
        return self._layer.get_prompt(identity, name, arguments, meta, deadline)

    # -- the rest goes to the layer ------------------------------------------------------

    def complete(self, identity, params, deadline):
        refuse_unknown_prompt_ref(self, identity, params, deadline)
        return self._layer.complete(identity, params, deadline)

    def set_logging_level(self, identity, level, deadline):
        return self._layer.set_logging_level(identity, level, deadline)

    def subscribe_resource(self, identity, subscriber, uri, deadline):
        if self.lookup_resource(identity, uri, deadline) is None:
            raise JsonRpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": uri})
        return self._layer.subscribe_resource(identity, subscriber, uri, deadline)

    def unsubscribe_resource(self, identity, subscriber, uri, deadline):
        return self._layer.unsubscribe_resource(identity, subscriber, uri, deadline)

    def resume(self, identity, continuation, deadline):
        """Through the layer, when the layer below would take it too."""
        if not reachable(self, identity, continuation, deadline):
            raise continuation.unknown()
        return self._layer.resume(identity, continuation, deadline)

    def explain_tool(self, identity: Identity | None, name: str, deadline: Deadline) -> Explanation:
        """The layer's own explanation when it gives one, its verdict held to what it may do."""
        listed = self.describe_tool(identity, name, deadline) is not None
        callable_ = self.lookup_tool(identity, name, deadline) is not None
        explain = getattr(self._layer, "explain_tool", None)
        if callable(explain):
            explained: Explanation = explain(identity, name, deadline)
            return Explanation(name, listed, callable_, explained.findings)
        below = self._inner.explain_tool(identity, name, deadline)
        return below.with_finding(generic_finding(self.layer_name, below, listed, callable_),
                                  listed=listed, callable=callable_)

    def close(self) -> None:
        self._layer.close()
