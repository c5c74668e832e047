"""A runnable embedder: the gateway over the demo backends, with a decorator of our own.

    python examples/filtering_decorator.py [--port 4483]

``ReadOnlyAgent`` holds only the core below it and a policy of its own. It lists the
tools, resources and prompts the policy allows and refuses the rest exactly as an unknown
name is refused: every call, read and get decides through the matching ``lookup_*``
first, so what is not listed cannot be called. It can only subtract: the gateway serves
it behind a guard, so even a buggy policy cannot surface anything the core below did not
list, nor reach a call that core would refuse.

It imports nothing but the public interface, ``vmcp_actors.core``.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vmcp_actors.core import (
    INVALID_PARAMS,
    RESOURCE_NOT_FOUND,
    Deadline,
    Identity,
    JsonRpcError,
    Layer,
    UserCore,
    build,
    demo,
    serve,
)


@dataclass(frozen=True)
class Policy:
    """What an agent may use: tools by their annotations, resources and prompts by pattern."""

    allow_tool: Callable[[Mapping[str, Any]], bool]
    resource_patterns: tuple[str, ...] = ("*",)
    prompt_patterns: tuple[str, ...] = ("*",)

    def allows_resource(self, uri: str) -> bool:
        return any(fnmatch.fnmatchcase(uri, pattern) for pattern in self.resource_patterns)

    def allows_prompt(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.prompt_patterns)


def read_only(tool: Mapping[str, Any]) -> bool:
    annotations = tool.get("annotations") or {}
    return annotations.get("readOnlyHint") is True


# The demo's read-only agent: read-only tools, the weather resources, no prompts.
READ_ONLY_AGENT = Policy(allow_tool=read_only, resource_patterns=("weather://*",), prompt_patterns=())


class ReadOnlyAgent(Layer):
    """The core below minus what ``policy`` does not allow."""

    layer_name = "read-only agent"

    def __init__(self, inner: UserCore, policy: Policy = READ_ONLY_AGENT):
        super().__init__(inner)
        self.policy = policy

    # Tools: the list and the lookup share one decision.
    def list_tools(self, identity: Identity | None, deadline: Deadline) -> tuple[dict[str, Any], ...]:
        return tuple(tool for tool in self.inner.list_tools(identity, deadline) if self.policy.allow_tool(tool))

    def lookup_tool(self, identity, name, deadline):
        route = self.inner.lookup_tool(identity, name, deadline)
        if route is None:
            return None
        tool = self.inner.describe_tool(identity, name, deadline)  # its definition, as the layer below lists it
        return route if tool is not None and self.policy.allow_tool(tool) else None

    def call_tool(self, identity, name, arguments, meta, deadline):
        if self.lookup_tool(identity, name, deadline) is None:
            raise JsonRpcError(INVALID_PARAMS, f"Unknown tool: {name}")  # as for a name that does not exist
        return self.inner.call_tool(identity, name, arguments, meta, deadline)

    # Resources and prompts follow the same pattern.
    def list_resources(self, identity, deadline):
        return tuple(r for r in self.inner.list_resources(identity, deadline) if self.policy.allows_resource(r["uri"]))

    def list_resource_templates(self, identity, deadline):
        return tuple(t for t in self.inner.list_resource_templates(identity, deadline)
                     if self.policy.allows_resource(t["uriTemplate"]))

    def lookup_resource(self, identity, uri, deadline):
        found = self.inner.lookup_resource(identity, uri, deadline)
        return found if found is not None and self.policy.allows_resource(uri) else None

    def read_resource(self, identity, uri, meta, deadline):
        if self.lookup_resource(identity, uri, deadline) is None:
            raise JsonRpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": uri})
        return self.inner.read_resource(identity, uri, meta, deadline)

    def list_prompts(self, identity, deadline):
        return tuple(p for p in self.inner.list_prompts(identity, deadline) if self.policy.allows_prompt(p["name"]))

    def lookup_prompt(self, identity, name, deadline):
        found = self.inner.lookup_prompt(identity, name, deadline)
        return found if found is not None and self.policy.allows_prompt(name) else None

    def get_prompt(self, identity, name, arguments, meta, deadline):
        if self.lookup_prompt(identity, name, deadline) is None:
            raise JsonRpcError(INVALID_PARAMS, f"Unknown prompt: {name}")
        return self.inner.get_prompt(identity, name, arguments, meta, deadline)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4483)
    args = parser.parse_args(argv)
    with demo() as config:
        core = build(config).decorated(ReadOnlyAgent)
        print(f"gateway with the read-only agent decorator on http://{args.host}:{args.port}/mcp", flush=True)
        return serve(core, host=args.host, port=args.port)


if __name__ == "__main__":
    sys.exit(main())
