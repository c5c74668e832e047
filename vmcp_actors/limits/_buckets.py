"""Token buckets: where their levels live and how one decision over several is made.

A decision takes every bucket that applies to a call (the server's, the caller's, the
tool's) and spends one token from each only when each has one: a call refused by its
tool's bucket spends nothing from the server's. ``MemoryBuckets`` keeps the levels in this
process, each bucket under its own lock (a decision takes its buckets' locks in key order,
so no lock is shared by every request); ``RedisBuckets`` keeps them in Redis and decides
in one script run (atomic, on Redis's clock), so several workers admit together exactly
what one would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vmcp_actors.concurrency import refuse_on_actor_loop
from vmcp_actors.config import TokenBucket

SWEEP_EVERY = 4096  # decisions between two sweeps of idle buckets (memory)


@dataclass(frozen=True)
class Bucket:
    """One bucket a call must pass: its key (where its level lives), what it is (for
    operators: ``kind`` is global, perUser, tool or toolPerUser) and its size."""

    key: str
    kind: str
    tool: str | None
    spec: TokenBucket


class StoreFailed(Exception):
    """The buckets' store could not decide (Redis unreachable)."""


class _Level:
    __slots__ = ("lock", "tokens", "at", "spec", "gone")

    def __init__(self, spec: TokenBucket, at: float):
        self.lock = threading.Lock()
        self.spec = spec
        self.tokens = float(spec.max_tokens)
        self.at = at
        self.gone = False  # swept: a decision that raced the sweep takes a fresh level

    def full_again(self, now: float) -> bool:
        return self.tokens + max(0.0, now - self.at) * self.spec.rate >= self.spec.max_tokens


class MemoryBuckets:
    shared = False

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._levels: dict[str, _Level] = {}
        self._decisions = 0  # approximate (unlocked): only paces the sweeps

    def decide(self, buckets: Sequence[Bucket]) -> tuple[int, float]:
        """(-1, 0) when every bucket gave a token; else (index of the first that had
        none, seconds until it has one). Never on an actor's loop: with Redis, a round trip."""
        refuse_on_actor_loop("a rate-limit decision")
        ordered = sorted(range(len(buckets)), key=lambda index: buckets[index].key)
        while True:
            now = self._clock()
            levels = [self._levels.get(buckets[index].key)
                      or self._levels.setdefault(buckets[index].key, _Level(buckets[index].spec, now))
                      for index in ordered]
            for level in levels:
                level.lock.acquire()
            try:
                if any(level.gone for level in levels):
                    continue
                return self._decided(buckets, ordered, levels, self._clock())
            finally:
                for level in reversed(levels):
                    level.lock.release()
                self._tick()

    @staticmethod
    def _decided(buckets: Sequence[Bucket], ordered: list[int], levels: list[_Level], now: float) -> tuple[int, float]:
        refilled = {}
        for index, level in zip(ordered, levels):
            spec = buckets[index].spec
            refilled[index] = min(spec.max_tokens, level.tokens + max(0.0, now - level.at) * spec.rate)
        short = [index for index in range(len(buckets)) if refilled[index] < 1]
        if short:
            first = short[0]
            return first, (1 - refilled[first]) / buckets[first].spec.rate
        for index, level in zip(ordered, levels):
            level.tokens, level.at = refilled[index] - 1, now
        return -1, 0.0

    def _tick(self) -> None:
        self._decisions += 1
        if self._decisions % SWEEP_EVERY == 0:
            self.sweep()

    def sweep(self, idle: float = 3600.0) -> int:
        """Forget buckets untouched for ``idle`` seconds that are full again (a per-user
        bucket of someone gone: forgetting it changes nothing); how many were forgotten."""
        now, forgotten = self._clock(), 0
        for key, level in list(self._levels.items()):
            with level.lock:
                if now - level.at >= idle and level.full_again(now):
                    level.gone = True
                    self._levels.pop(key, None)
                    forgotten += 1
        return forgotten

    def level(self, bucket: Bucket) -> float:
        """The bucket's tokens now (admin state), without spending any."""
        level = self._levels.get(bucket.key)
        if level is None:
            return float(bucket.spec.max_tokens)
        with level.lock:
            return min(bucket.spec.max_tokens, level.tokens + max(0.0, self._clock() - level.at) * bucket.spec.rate)


# KEYS: the buckets; ARGV: maxTokens and rate (tokens per second) of each, in turn.
# Returns {0, "0"} when every bucket gave a token, else {index of the first without one
# (1-based), seconds until it has one (a string: Lua numbers go back as integers)}.
_DECIDE = """
local now = redis.call('TIME')
now = tonumber(now[1]) + tonumber(now[2]) / 1000000
local levels = {}
for i = 1, #KEYS do
  local max, rate = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local kept = redis.call('HMGET', KEYS[i], 't', 'at')
  local tokens = tonumber(kept[1])
  if tokens == nil then
    tokens = max
  else
    tokens = math.min(max, tokens + math.max(0, now - tonumber(kept[2])) * rate)
  end
  if tokens < 1 then
    return {i, tostring((1 - tokens) / rate)}
  end
  levels[i] = tokens
end
for i = 1, #KEYS do
  local max, rate = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  redis.call('HSET', KEYS[i], 't', tostring(levels[i] - 1), 'at', tostring(now))
  redis.call('EXPIRE', KEYS[i], math.ceil(2 * max / rate) + 1)
end
return {0, '0'}
"""


class RedisBuckets:
    shared = True

    def __init__(self, client: Any):
        self._redis = client
        self._script = client.register_script(_DECIDE)

    def decide(self, buckets: Sequence[Bucket]) -> tuple[int, float]:
        import redis

        args: list[Any] = []
        for bucket in buckets:
            args += [bucket.spec.max_tokens, repr(bucket.spec.rate)]
        try:
            refused, wait = self._script(keys=[bucket.key for bucket in buckets], args=args)
        except (redis.RedisError, OSError) as error:
            raise StoreFailed(type(error).__name__) from None
        return int(refused) - 1, float(wait)

    def level(self, bucket: Bucket) -> float | None:
        """The bucket's tokens as last written (admin state); None when Redis is away."""
        import redis

        try:
            kept = self._redis.hmget(bucket.key, "t", "at")
            now = self._redis.time()
        except (redis.RedisError, OSError):
            return None
        if kept[0] is None:
            return float(bucket.spec.max_tokens)
        elapsed = max(0.0, now[0] + now[1] / 1_000_000 - float(kept[1]))
        return min(bucket.spec.max_tokens, float(kept[0]) + elapsed * bucket.spec.rate)
