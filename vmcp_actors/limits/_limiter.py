"""Which buckets a call must pass, the decision, and what a refusal says.

A client's ``tools/call`` passes the server's buckets (``rateLimiting.global`` or
``shared``, and ``perUser``) and the called tool's (``rateLimiting.tools``); a call the
gateway makes for the client (a composite's step, the optimizer's ``call_tool``) passes the
inner tool's only, so one client call spends one server token however many tools it runs.
The refusal is ToolHive's: HTTP 429, ``Retry-After``, JSON-RPC code 429 ``Rate limit
exceeded`` with ``data.retryAfterSeconds``.

With Redis unreachable the config's ``onStoreError`` decides: ``allow`` (fail open, the
default, as ToolHive does) or ``refuse`` (503 with Retry-After); either is logged at most
once per ``LOG_EVERY`` seconds.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from typing import Any

from vmcp_actors.config import RateLimitingConfig, TokenBucket
from vmcp_actors.identity import Identity
from vmcp_actors.limits._buckets import Bucket, MemoryBuckets, RedisBuckets, StoreFailed
from vmcp_actors.protocol import INTERNAL_ERROR, JsonRpcError

logger = logging.getLogger(__name__)

RATE_LIMITED = 429  # ToolHive's JSON-RPC code (outside the ranges the MCP specification reserves)
RATE_LIMITED_MESSAGE = "Rate limit exceeded"
STORE_DOWN_RETRY_AFTER = 1
LOG_EVERY = 10.0  # seconds between two log lines about an unreachable store


class RateLimited(JsonRpcError):
    """A refused call: HTTP 429 and ``Retry-After``; ``bucket`` says which one refused."""

    def __init__(self, retry_after: int, bucket: Bucket):
        super().__init__(RATE_LIMITED, RATE_LIMITED_MESSAGE, {"retryAfterSeconds": retry_after}, http_status=429)
        self.retry_after = retry_after
        self.bucket = bucket


def user_of(identity: Identity | None) -> str | None:
    """A per-user bucket's name for the caller (a digest: subjects may be emails)."""
    if identity is None or identity.is_anonymous:
        return None
    return hashlib.sha256(f"{identity.issuer}\0{identity.subject}".encode()).hexdigest()[:32]


class RateLimiter:
    """The process's rate limits (thread-safe)."""

    def __init__(self, config: RateLimitingConfig, buckets: MemoryBuckets | RedisBuckets, key_prefix: str = ""):
        self.config = config
        self._buckets = buckets
        self._prefix = f"{key_prefix}rl:"
        self._tools = {tool.name: tool for tool in config.tools}
        self._lock = threading.Lock()  # guards the counters below and _logged_at
        self._refused: dict[tuple[str, str], int] = {}  # (kind, tool or "") -> refusals
        self._store_failures = 0
        self._logged_at = -math.inf
        self._unknown: dict[str, str] = {}  # configured tool name -> why it limits nothing

    @property
    def shared(self) -> bool:
        return self._buckets.shared

    def limits(self, tool: str) -> bool:
        """Whether ``tool`` has buckets of its own."""
        return tool in self._tools

    def buckets_for(self, identity: Identity | None, tool: str | None, *, client_call: bool = True) -> list[Bucket]:
        """The buckets a call of ``tool`` passes, server's first. ``client_call``: the
        client's own tools/call (else a call the gateway makes for one: its tool's only)."""
        user = user_of(identity)
        found: list[Bucket] = []
        if client_call:
            self._add(found, "global", None, self.config.shared, "g")
            if user is not None:
                self._add(found, "perUser", None, self.config.per_user, f"u:{user}")
        limits = self._tools.get(tool) if tool is not None else None
        if limits is not None:
            self._add(found, "tool", tool, limits.shared, f"t:{tool}")
            if user is not None:
                self._add(found, "toolPerUser", tool, limits.per_user, f"ut:{user}:{tool}")
        return found

    def _add(self, found: list[Bucket], kind: str, tool: str | None, spec: TokenBucket | None, key: str) -> None:
        if spec is not None:
            found.append(Bucket(self._prefix + key, kind, tool, spec))

    def admit(self, identity: Identity | None, tool: str | None, *, client_call: bool = True) -> None:
        """Spend a token from each bucket the call passes, or raise ``RateLimited``
        (spending none)."""
        buckets = self.buckets_for(identity, tool, client_call=client_call)
        if not buckets:
            return
        try:
            refused, wait = self._buckets.decide(buckets)
        except StoreFailed as failure:
            self._store_failed(str(failure))
            return
        if refused < 0:
            return
        bucket = buckets[refused]
        with self._lock:
            key = (bucket.kind, bucket.tool or "")
            self._refused[key] = self._refused.get(key, 0) + 1
        raise RateLimited(max(1, math.ceil(wait)), bucket)

    def _store_failed(self, reason: str) -> None:
        refuse = self.config.on_store_error == "refuse"
        with self._lock:
            self._store_failures += 1
            now = time.monotonic()
            log = now - self._logged_at >= LOG_EVERY
            if log:
                self._logged_at = now
        if log:
            logger.warning("rate limits cannot be checked: Redis unreachable (%s); calls are %s (onStoreError: %s)",
                           reason, "refused with 503" if refuse else "let through unchecked",
                           self.config.on_store_error)
        if refuse:
            raise JsonRpcError(INTERNAL_ERROR, "Rate limits cannot be checked right now; try again shortly",
                               {"retryAfterSeconds": STORE_DOWN_RETRY_AFTER}, http_status=503)

    def check_names(self, advertised: set[str]) -> None:
        """Say (once per name, logged and in the admin state) which configured tools no
        client can call: tools are discovered per user, so this is known only once a
        catalog is, not when the config loads."""
        for index, tool in enumerate(self.config.tools):
            if tool.name in advertised or tool.name in self._unknown:
                continue
            shown = sorted(advertised)
            names = ", ".join(shown[:30]) + (f", and {len(shown) - 30} more" if len(shown) > 30 else "")
            message = (f"rateLimiting.tools[{index}].name: no advertised tool is named {tool.name!r}, so it limits "
                       f"nothing; the advertised tools are: {names or 'none'}")
            with self._lock:
                self._unknown[tool.name] = message
            logger.warning("config: %s", message)

    # -- operators ----------------------------------------------------------------------------

    def level(self, bucket: Bucket) -> float | None:
        """The bucket's tokens now, spending none (None: its store cannot say)."""
        return self._buckets.level(bucket)

    def refusals(self) -> dict[tuple[str, str], int]:
        """(bucket kind, tool or "") -> calls refused by it since start (this process)."""
        with self._lock:
            return dict(self._refused)

    def store_failures(self) -> int:
        with self._lock:
            return self._store_failures

    def state(self) -> dict[str, Any]:
        """The configured limits and this process's refusals (admin state): no user's key."""
        def spec(bucket: TokenBucket | None) -> dict[str, Any] | None:
            return None if bucket is None else {"maxTokens": bucket.max_tokens, "refillPeriodSeconds": bucket.refill_period}

        shared = self.buckets_for(None, None)
        levels = {bucket.kind: self._buckets.level(bucket) for bucket in shared}
        return {
            "store": "redis" if self.shared else "memory",
            "onStoreError": self.config.on_store_error,
            "global": spec(self.config.shared), "perUser": spec(self.config.per_user),
            "globalTokens": levels.get("global"),
            "tools": [{"name": tool.name, "global": spec(tool.shared), "perUser": spec(tool.per_user),
                       "globalTokens": next((self._buckets.level(bucket) for bucket in
                                             self.buckets_for(None, tool.name, client_call=False)), None)}
                      for tool in self.config.tools],
            "refusals": [{"kind": kind, "tool": tool or None, "count": count}
                         for (kind, tool), count in sorted(self.refusals().items())],
            "storeFailures": self.store_failures(),
            "problems": sorted(self._unknown.values()),
        }
