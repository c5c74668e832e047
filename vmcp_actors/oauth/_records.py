"""Where the authorization server keeps its records: registered clients, sign-ins under way,
codes, consents, refresh families and tokens, the identity provider's tokens.

In memory by default (one process), or in the Redis the session records use, so any
worker of any VM completes any step of a flow. A record is a JSON object of one ``kind``
under a key, with a time to live; values in Redis are encrypted and authenticated with
the operator's key (its own purpose per kind), keys that name secrets are digests. The
few operations that must be atomic across workers are atomic in both stores: ``take``
(a code is used once), ``add`` (only if absent), ``update`` (optimistic, WATCH in Redis),
``acquire`` (one refresh of the identity provider's token at a time) and ``hit`` (a
counter per window, for registration limits). Every failure to reach Redis is
``StoreUnavailable``: the endpoint answers 503, never an OAuth error that would make a
client start over.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from vmcp_actors.signing import Signer, Unsealable
from vmcp_actors.users._store import StoreUnavailable

Change = Callable[[dict[str, Any]], dict[str, Any] | None]


class OAuthRecords(Protocol):
    def get(self, kind: str, key: str) -> dict[str, Any] | None: ...
    def put(self, kind: str, key: str, value: dict[str, Any], ttl: float) -> None: ...
    def add(self, kind: str, key: str, value: dict[str, Any], ttl: float) -> bool: ...
    def take(self, kind: str, key: str) -> dict[str, Any] | None: ...
    def delete(self, kind: str, key: str) -> None: ...
    def update(self, kind: str, key: str, change: Change, ttl: float | None = None) -> dict[str, Any] | None: ...
    def keys(self, kind: str) -> list[str]: ...
    def acquire(self, name: str, ttl: float) -> str | None: ...
    def release(self, name: str, holder: str) -> None: ...
    def hit(self, name: str, window: float) -> int: ...


# A kept token is renewed this long before it expires (or halfway through a shorter life).
EXPIRY_MARGIN = 30.0
# Its life when the server's answer says nothing usable of expires_in.
DEFAULT_LIFETIME = 3600.0


def kept_tokens(tokens: dict[str, Any], now: float) -> dict[str, Any]:
    """What of a token answer is kept: the tokens, when they expire and when to renew them:
    EXPIRY_MARGIN before the end, or halfway through a shorter life (a token given for 20 s
    is not due again the moment it arrives)."""
    expires_in = tokens.get("expires_in")
    lifetime = float(expires_in) if isinstance(expires_in, (int, float)) and not isinstance(expires_in, bool) \
        and expires_in > 0 else DEFAULT_LIFETIME
    return {"access_token": tokens["access_token"], "refresh_token": tokens.get("refresh_token"),
            "expires_at": now + lifetime, "refresh_at": now + lifetime - min(EXPIRY_MARGIN, lifetime / 2)}


def await_renewal(records: OAuthRecords, kind: str, key: str, lock: str, stale: dict[str, Any],
                  wait: float) -> tuple[str, dict[str, Any] | None]:
    """While another worker holds ``lock`` to renew the record ``kind``/``key``: what it left,
    waiting ``wait`` seconds at most. ``("renewed", record)``; ``("gone", None)``: the record
    went; ``("free", None)``: the lock went without a renewal (try it here); ``("late", None)``."""
    deadline = time.monotonic() + wait
    pause = threading.Event()
    while time.monotonic() < deadline:
        pause.wait(0.02)  # the other worker's result lands in the records
        kept = records.get(kind, key)
        if kept is None:
            return "gone", None
        if kept["expires_at"] != stale["expires_at"]:
            return "renewed", kept
        if records.get("lock", lock) is None:
            return "free", None
    return "late", None


class _Locks:
    """Locks over the records' own ``add`` and ``update``: a holder's mark that expires."""

    def acquire(self: Any, name: str, ttl: float) -> str | None:
        """A holder's mark (give it back to ``release``), or None when another holds ``name``."""
        holder = secrets.token_hex(8)
        return holder if self.add("lock", name, {"holder": holder}, ttl) else None

    def release(self: Any, name: str, holder: str) -> None:
        self.update("lock", name, lambda record: None if record.get("holder") == holder else record)


class MemoryOAuthRecords(_Locks):
    """Dictionaries with expiry; one process."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()  # guards _records and _counters; only update's change runs under it
        self._records: dict[tuple[str, str], tuple[float, str]] = {}  # (kind, key) -> (expires, JSON)
        self._counters: dict[str, tuple[float, int]] = {}
        self._clock = clock
        self._writes = 0

    def _live(self, kind: str, key: str) -> str | None:
        """Under ``_lock``: the JSON of a record not expired."""
        kept = self._records.get((kind, key))
        if kept is None:
            return None
        if kept[0] <= self._clock():
            del self._records[(kind, key)]
            return None
        return kept[1]

    def _sweep(self) -> None:
        """Under ``_lock``: every thousandth write drops what expired, so unused records do not pile up."""
        self._writes += 1
        if self._writes % 1000:
            return
        now = self._clock()
        for gone in [where for where, (expires, _) in self._records.items() if expires <= now]:
            del self._records[gone]
        for gone in [name for name, (expires, _) in self._counters.items() if expires <= now]:
            del self._counters[gone]

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        with self._lock:
            text = self._live(kind, key)
        return json.loads(text) if text is not None else None

    def put(self, kind: str, key: str, value: dict[str, Any], ttl: float) -> None:
        text = json.dumps(value)
        with self._lock:
            self._sweep()
            self._records[(kind, key)] = (self._clock() + ttl, text)

    def add(self, kind: str, key: str, value: dict[str, Any], ttl: float) -> bool:
        text = json.dumps(value)
        with self._lock:
            if self._live(kind, key) is not None:
                return False
            self._sweep()
            self._records[(kind, key)] = (self._clock() + ttl, text)
            return True

    def take(self, kind: str, key: str) -> dict[str, Any] | None:
        with self._lock:
            text = self._live(kind, key)
            self._records.pop((kind, key), None)
        return json.loads(text) if text is not None else None

    def delete(self, kind: str, key: str) -> None:
        with self._lock:
            self._records.pop((kind, key), None)

    def update(self, kind: str, key: str, change: Change, ttl: float | None = None) -> dict[str, Any] | None:
        """``change(record)`` replaces the record, keeping its expiry or living ``ttl`` from
        now (None deletes it); the new record, or None when there was none (never revived)."""
        with self._lock:
            text = self._live(kind, key)
            if text is None:
                return None
            changed = change(json.loads(text))
            if changed is None:
                del self._records[(kind, key)]
                return None
            expires = self._records[(kind, key)][0] if ttl is None else self._clock() + ttl
            self._records[(kind, key)] = (expires, json.dumps(changed))
            return changed

    def keys(self, kind: str) -> list[str]:
        now = self._clock()
        with self._lock:
            return [key for (of_kind, key), (expires, _) in self._records.items() if of_kind == kind and expires > now]

    def hit(self, name: str, window: float) -> int:
        with self._lock:
            now = self._clock()
            expires, count = self._counters.get(name, (0.0, 0))
            if expires <= now:
                expires, count = now + window, 0
            self._counters[name] = (expires, count + 1)
            return count + 1


class RedisOAuthRecords(_Locks):
    """The records in Redis under ``{prefix}oa:{kind}:{key}``, encrypted per kind."""

    def __init__(self, client: Any, signer: Signer, prefix: str) -> None:
        self._redis = client
        self._signer = signer
        self._prefix = prefix + "oa:"

    def _key(self, kind: str, key: str) -> str:
        return f"{self._prefix}{kind}:{key}"

    def _seal(self, kind: str, value: dict[str, Any]) -> bytes:
        return self._signer.encrypt(f"oauth {kind}", json.dumps(value).encode())

    def _open(self, kind: str, blob: bytes | None) -> dict[str, Any] | None:
        if blob is None:
            return None
        try:
            return json.loads(self._signer.decrypt(f"oauth {kind}", blob))
        except Unsealable:
            return None  # written under another key: as good as absent

    def _command(self, run: Callable[[], Any]) -> Any:
        import redis

        try:
            return run()
        except redis.RedisError as error:
            raise StoreUnavailable(f"session storage (Redis) failed: {error.__class__.__name__}") from None

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        return self._open(kind, self._command(lambda: self._redis.get(self._key(kind, key))))

    def put(self, kind: str, key: str, value: dict[str, Any], ttl: float) -> None:
        blob = self._seal(kind, value)
        self._command(lambda: self._redis.set(self._key(kind, key), blob, px=max(1, int(ttl * 1000))))

    def add(self, kind: str, key: str, value: dict[str, Any], ttl: float) -> bool:
        blob = self._seal(kind, value)
        return bool(self._command(lambda: self._redis.set(self._key(kind, key), blob, px=max(1, int(ttl * 1000)),
                                                          nx=True)))

    def take(self, kind: str, key: str) -> dict[str, Any] | None:
        return self._open(kind, self._command(lambda: self._redis.getdel(self._key(kind, key))))

    def delete(self, kind: str, key: str) -> None:
        self._command(lambda: self._redis.delete(self._key(kind, key)))

    def update(self, kind: str, key: str, change: Change, ttl: float | None = None) -> dict[str, Any] | None:
        import redis

        name = self._key(kind, key)

        def transaction() -> dict[str, Any] | None:
            with self._redis.pipeline() as pipe:
                while True:
                    try:
                        pipe.watch(name)
                        current = self._open(kind, pipe.get(name))
                        if current is None:
                            pipe.unwatch()
                            return None
                        changed = change(current)
                        pipe.multi()
                        if changed is None:
                            pipe.delete(name)
                        else:
                            pipe.set(name, self._seal(kind, changed), **(
                                {"keepttl": True} if ttl is None else {"px": max(1, int(ttl * 1000))}))
                        pipe.execute()
                        return changed
                    except redis.WatchError:
                        continue  # another worker changed it first: decide again on its record
        return self._command(transaction)

    def keys(self, kind: str) -> list[str]:
        start = len(self._prefix) + len(kind) + 1
        pattern = _glob_escaped(f"{self._prefix}{kind}:") + "*"  # a keyPrefix may hold *, ? or [
        found = self._command(lambda: list(self._redis.scan_iter(match=pattern, count=500)))
        return [(name.decode() if isinstance(name, bytes) else name)[start:] for name in found]

    def hit(self, name: str, window: float) -> int:
        counter = f"{self._prefix}hits:{name}"

        def count() -> int:
            with self._redis.pipeline() as pipe:
                pipe.incr(counter)
                pipe.pexpire(counter, max(1, int(window * 1000)), nx=True)
                return int(pipe.execute()[0])
        return self._command(count)


def _glob_escaped(text: str) -> str:
    """``text`` matched literally by Redis's glob-style MATCH."""
    return "".join("\\" + char if char in "\\*?[]^" else char for char in text)
