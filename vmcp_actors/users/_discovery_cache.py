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
from typing import Any

from vmcp_actors.backends import DiscoveredBackend, plain_json
from vmcp_actors.concurrency import run_in_thread
from vmcp_actors.config import AggregationConfig, VmcpConfig
from vmcp_actors.core._catalog import Catalog, build_catalog
from vmcp_actors.identity import Identity, forwarded_headers_of, identity_key
from vmcp_actors.shared_cache import SharedCache


def discovery_key(identity: Identity | None, config: VmcpConfig, features: str = "") -> Hashable:
    """``features``: the digest of the capabilities declared to backends (an extension a
    client declares may change what a backend lists). A person's client sessions that
    declare the same share their catalog."""
    backend_set = tuple((b.name, b.url) for b in sorted(config.backends, key=lambda b: b.name))
    return (identity_key(identity), forwarded_headers_of(identity), backend_set, features)


class DiscoveryCache:
    """``shared``: a second level in Redis (``SharedCache``), read on a local miss and written
    with every put; its catalogs are rebuilt here with ``aggregation`` (the same config).
    On an actor's loop only ``local`` is read; ``shared`` (a Redis round trip) runs on the
    I/O pool, and ``put`` writes the shared level there."""

    def __init__(self, ttl: float, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic,
                 shared: SharedCache | None = None, aggregation: AggregationConfig | None = None):
        self._shared = shared if aggregation is not None else None
        self._aggregation = aggregation
        self._ttl = ttl
        self._max = max_entries
        self._clock = clock
        self._entries: OrderedDict[Hashable, tuple[Catalog, float]] = OrderedDict()
        self._lock = threading.Lock()  # guards the cached catalogs and their order; never nested
        self.hits = 0
        self.misses = 0
        self.shared_hits = 0  # local misses the shared level answered

    @property
    def enabled(self) -> bool:
        return self._ttl > 0

    @property
    def shares(self) -> bool:
        """Whether a local miss is to be looked up in the shared level (``shared``)."""
        return self.enabled and self._shared is not None

    def get(self, key: Hashable) -> Catalog | None:
        """The catalog kept for ``key``: this process's, else the shared level's (never on an
        actor's loop)."""
        found = self.local(key)
        return found if found is not None or not self.shares else self.shared(key)

    def local(self, key: Hashable) -> Catalog | None:
        """This process's catalog for ``key`` (no I/O). A miss counts here unless the
        shared level is still to be read (``shares``)."""
        if not self.enabled:
            return None
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and self._clock() < entry[1]:
                self.hits += 1
                return entry[0]
            self._entries.pop(key, None)
            if self._shared is None:
                self.misses += 1
            return None

    def shared(self, key: Hashable) -> Catalog | None:
        """After a local miss: the shared level's catalog for ``key`` (a Redis round trip),
        kept here too."""
        shared = self._from_shared(key)
        with self._lock:
            if shared is None:
                self.misses += 1
                return None
            catalog, ttl = shared
            self.hits += 1
            self.shared_hits += 1
            self._keep(key, catalog, ttl)
            return catalog

    def _from_shared(self, key: Hashable) -> tuple[Catalog, float] | None:
        if self._shared is None or self._aggregation is None:
            return None
        found = self._shared.get("catalog", key)
        if not isinstance(found, dict) or not isinstance(found.get("backends"), dict):
            return None
        try:
            discovered = {name: capabilities_from_json(value) for name, value in found["backends"].items()}
        except (KeyError, TypeError, ValueError):
            return None
        ttl = float(found.get("expires", 0)) - time.time()
        return (build_catalog(discovered, {}, self._aggregation), ttl) if ttl > 0 else None

    def put(self, key: Hashable, catalog: Catalog) -> None:
        if not self.enabled or catalog.failures or catalog.errors or catalog.unconnected or not catalog.backends:
            return  # errors are never cached
        ttl = self._ttl
        hints = [found.ttl_ms for found in catalog.backends.values() if found.ttl_ms is not None]
        if hints:  # a 2026-07-28 backend's own freshness hint bounds how long its lists are kept
            ttl = min(ttl, min(hints) / 1000)
            if ttl <= 0:
                return
        with self._lock:
            self._keep(key, catalog, ttl)
        if self._shared is not None:  # a Redis round trip: on the I/O pool, never the caller's loop
            run_in_thread(self._shared.put, "catalog", key, {"expires": time.time() + ttl, "backends": {
                name: capabilities_to_json(found) for name, found in catalog.backends.items()}}, ttl)

    def _keep(self, key: Hashable, catalog: Catalog, ttl: float) -> None:
        """Under the lock."""
        self._entries[key] = (catalog, self._clock() + ttl)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def stats(self) -> dict[str, int | float | bool]:
        with self._lock:
            return {"ttlSeconds": self._ttl, "entries": len(self._entries), "hits": self.hits, "misses": self.misses,
                    "shared": self._shared is not None, "sharedHits": self.shared_hits}


def capabilities_to_json(found: DiscoveredBackend) -> dict[str, Any]:
    return {"backend": found.backend, "capabilities": plain_json(found.capabilities), "tools": list(found.tools),
            "resources": list(found.resources), "resourceTemplates": list(found.resource_templates),
            "prompts": list(found.prompts), "ttlMs": found.ttl_ms}


def capabilities_from_json(data: dict[str, Any]) -> DiscoveredBackend:
    lists = {key: tuple(data.get(key) or ()) for key in ("tools", "resources", "resourceTemplates", "prompts")}
    if not all(isinstance(item, dict) for values in lists.values() for item in values):
        raise ValueError("list entries must be objects")
    return DiscoveredBackend(backend=str(data["backend"]), capabilities=dict(data["capabilities"]),
                               tools=lists["tools"], resources=lists["resources"],
                               resource_templates=lists["resourceTemplates"], prompts=lists["prompts"],
                               ttl_ms=data.get("ttlMs"))
