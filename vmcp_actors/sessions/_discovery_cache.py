"""Discovery results per identity, so a reconnecting client does not pay discovery again.

The key is the caller (issuer + subject, and the passthrough headers, which a backend
may answer by) and the backend set. Only complete catalogs are kept: a catalog in which
some backend failed is never cached, so an error is never served from here.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

from vmcp_actors.config import VmcpConfig
from vmcp_actors.identity import Identity, forwarded_headers_of, identity_key
from vmcp_actors.sessions._aggregation import Catalog


def discovery_key(identity: Identity | None, config: VmcpConfig) -> Hashable:
    backend_set = tuple((b.name, b.url) for b in sorted(config.backends, key=lambda b: b.name))
    return (identity_key(identity), forwarded_headers_of(identity), backend_set)


class DiscoveryCache:
    def __init__(self, ttl: float, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic):
        self._ttl = ttl
        self._max = max_entries
        self._clock = clock
        self._entries: OrderedDict[Hashable, tuple[Catalog, float]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self._ttl > 0

    def get(self, key: Hashable) -> Catalog | None:
        if not self.enabled:
            return None
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and self._clock() < entry[1]:
                self.hits += 1
                return entry[0]
            self._entries.pop(key, None)
            self.misses += 1
            return None

    def put(self, key: Hashable, catalog: Catalog) -> None:
        if not self.enabled or catalog.failures or catalog.errors or not catalog.has_backends:
            return  # errors are never cached
        ttl = self._ttl
        hints = [found.ttl_ms for found in catalog.backends.values() if found.ttl_ms is not None]
        if hints:  # a 2026-07-28 backend's own freshness hint bounds how long its lists are kept
            ttl = min(ttl, min(hints) / 1000)
            if ttl <= 0:
                return
        with self._lock:
            self._entries[key] = (catalog, self._clock() + ttl)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def stats(self) -> dict[str, int | float]:
        with self._lock:
            return {"ttlSeconds": self._ttl, "entries": len(self._entries), "hits": self.hits, "misses": self.misses}
