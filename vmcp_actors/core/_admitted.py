"""The door every backend ``tools/call``, ``prompts/get`` and ``resources/read`` passes: it
goes out only when each decision the config asks for was made for that tool, prompt or
resource, on the way in, by the layer that makes it.

Each deciding layer, having let a call of ``name`` through, stamps it (``admitted``) for
as long as the call goes on below it; ``AggregatedBackends`` checks the stamps
(``refuse_unless_admitted``) before it asks a backend, against what the stack requires
(``Requirements``: set by ``DecoratorStack.build`` from the config). A way in that skips a
layer, a new entry point or a new layer that forgets to decide, is refused there, loudly
(-32603 and an error log), instead of reaching the backend. The stamps live in a context
variable: set where the call is made, on the thread that makes it, gone when the outermost
stamping layer returns, so nothing carries over to the thread's next call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from vmcp_actors.protocol import INTERNAL_ERROR, JsonRpcError

logger = logging.getLogger(__name__)

AUTHZ, FILTER, LIMITS = "Cedar authz", "advertising filter", "rate limits"

_stamps: ContextVar[set[tuple[str, str]] | None] = ContextVar("admitted", default=None)


@dataclass(frozen=True)
class Requirements:
    """What a client's call (``client``), a composite step's (``step``) and a prompt's
    get or a resource's read (``reads``, by the prompt's name or the resource's URI) must
    have been decided by. Empty (a core built without the stack, in tests): nothing is
    checked."""

    client: frozenset[str] = frozenset()
    step: frozenset[str] = frozenset()
    reads: frozenset[str] = frozenset()


@contextmanager
def admitted(check: str, name: str) -> Iterator[None]:
    """``check`` let a call of ``name`` through: stamped while the block runs."""
    stamps = _stamps.get()
    token = _stamps.set(stamps := set()) if stamps is None else None
    stamps.add((check, name))
    try:
        yield
    finally:
        if token is not None:
            _stamps.reset(token)


def refuse_unless_admitted(name: str, required: frozenset[str]) -> None:
    """Raises when a request for ``name`` lacks a decision ``required`` names."""
    if not required:
        return
    stamps = _stamps.get() or set()
    missing = sorted(check for check in required if (check, name) not in stamps)
    if missing:
        logger.error("refused a request for %r that %s did not decide: a way in skips a layer (a bug)", name,
                     " and ".join(missing))
        raise JsonRpcError(INTERNAL_ERROR, f"the request for {name!r} was not admitted; nothing was sent")
