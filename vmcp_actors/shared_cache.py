"""A second level for the process's caches, shared by every process in Redis: discovered
catalogs and exchanged tokens, so a new worker neither rediscovers nor re-exchanges what
another already did (``sessionStorage.provider: redis``).

Entry names are keyed digests (HMAC with the signing key) of the same keys the local caches
use, so Redis learns no subject or header; values are JSON encrypted with that key (an
exchanged token is a credential). The shared level is a help, never a dependency: when
Redis cannot be reached, a get is a miss and a put is skipped, and the caller goes on.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from vmcp_actors.signing import Signer, Unsealable

logger = logging.getLogger(__name__)


class SharedCache:
    def __init__(self, client: Any, signer: Signer, key_prefix: str):
        self._redis = client
        self._signer = signer
        self._prefix = key_prefix

    def _name(self, namespace: str, key: Any) -> str:
        return f"{self._prefix}c:{namespace}:{self._signer.digest(namespace, json.dumps(key, default=str))}"

    def get(self, namespace: str, key: Any) -> Any:
        import redis

        try:
            blob = self._redis.get(self._name(namespace, key))
            return None if blob is None else json.loads(self._signer.decrypt(f"cache {namespace}", blob))
        except (redis.RedisError, Unsealable, ValueError) as error:
            logger.debug("shared cache %s: a miss (%s)", namespace, type(error).__name__)
            return None

    def put(self, namespace: str, key: Any, value: Any, ttl: float) -> None:
        import redis

        if ttl < 1:
            return  # Redis keeps whole seconds: too short to share
        try:
            blob = self._signer.encrypt(f"cache {namespace}", json.dumps(value, separators=(",", ":")).encode())
            self._redis.set(self._name(namespace, key), blob, ex=int(ttl))
        except (redis.RedisError, TypeError, ValueError) as error:
            logger.debug("shared cache %s: not stored (%s)", namespace, type(error).__name__)
