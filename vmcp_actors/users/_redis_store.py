"""Records in Redis: what lets any gateway process serve any session (``sessionStorage``).

Each record is JSON, encrypted and authenticated with the operator's key (AES-256-GCM,
derived from ``operational.signingKeyEnv``; a backend session id is a credential), under
``{keyPrefix}s:{session id}`` and ``{keyPrefix}u:{digest of the user key}``. A set per user
(``{keyPrefix}us:{digest}``) lists its session ids. Sessions expire ``sessionTTL`` after
their last write (the directory writes a busy session's last use once a second); a user
record and its set live twice that, renewed with each of its sessions' writes, so a user
outlives its last session long enough to be ended. The gateway's own tasks are under
``{keyPrefix}t:{task id}``, expiring with the record's ``expires``; a set per owner
(``{keyPrefix}ot:{owner}``) lists their ids, and another (``{keyPrefix}lt:{owner}``) the
ids of those not ended, so the per-user cap reads live tasks only. What a backend's 2025-11-25 task asked,
held for a 2026-07-28 client until it answers, is under ``{keyPrefix}q:{key}``. Updates
are optimistic transactions (WATCH), so two processes changing one record do not lose
either change.

Every failure to reach Redis is ``StoreUnavailable``: the request gets 503 and nothing in
the process breaks; the next request tries again.

No Redis command is sent from an actor's message loop: the store's methods check
(``off_actor_loops``), and so does every connection of its client (``_OffLoopConnection``),
which the shared caches, rate-limit buckets, bulkheads, fanout and task signals use too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from functools import cache
from typing import Any

from vmcp_actors.concurrency import refuse_on_actor_loop
from vmcp_actors.core._task_records import TaskRecord
from vmcp_actors.signing import Signer, Unsealable
from vmcp_actors.users._records import SessionRecord, UserKey, UserRecord
from vmcp_actors.users._store import StoreUnavailable, off_actor_loops

logger = logging.getLogger(__name__)

SOCKET_TIMEOUT = 2.0  # seconds for one Redis command: an unreachable Redis is a fast 503
USER_TTL_FACTOR = 2


@cache
def _off_loop_connection_class() -> type:
    """A Redis connection that refuses to send from an actor's loop (every command of a
    client, pipelines, scripts and pub/sub included, is sent through ``send_packed_command``)."""
    import redis

    class _OffLoopConnection(redis.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            refuse_on_actor_loop("Redis")
            super().send_packed_command(command, check_health)

    return _OffLoopConnection


@off_actor_loops
class RedisRecordStore:
    shared = True

    def __init__(self, client: Any, signer: Signer, *, key_prefix: str, session_ttl: float):
        self._redis = client
        self._signer = signer
        self._prefix = key_prefix
        self._session_ttl = max(1, int(session_ttl))
        self._user_ttl = self._session_ttl * USER_TTL_FACTOR

    @classmethod
    def connect(cls, address: str, db: int, password: str | None, signer: Signer, *, key_prefix: str,
                session_ttl: float) -> RedisRecordStore:
        import redis
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry

        host, _, port = address.rpartition(":")
        # One quick retry (a dropped pooled connection), then the request gets its 503.
        pool = redis.ConnectionPool(connection_class=_off_loop_connection_class(),
                                    host=host.strip("[]") or "127.0.0.1", port=int(port), db=db, password=password,
                                    socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT,
                                    health_check_interval=30,
                                    retry=Retry(ExponentialBackoff(cap=0.2, base=0.05), retries=1))
        return cls(redis.Redis(connection_pool=pool), signer, key_prefix=key_prefix, session_ttl=session_ttl)

    @property
    def client(self) -> Any:
        """The Redis connection pool, for the shared caches (``SharedCache``)."""
        return self._redis

    # -- keys and values -----------------------------------------------------------------

    def _session_key(self, session_id: str) -> str:
        return f"{self._prefix}s:{session_id}"

    def _user_digest(self, key: UserKey) -> str:
        return hashlib.sha256(json.dumps(key.to_json()).encode()).hexdigest()[:32]

    def _user_key(self, key: UserKey) -> str:
        return f"{self._prefix}u:{self._user_digest(key)}"

    def _index_key(self, key: UserKey) -> str:
        return f"{self._prefix}us:{self._user_digest(key)}"

    def _task_key(self, task_id: str) -> str:
        return f"{self._prefix}t:{task_id}"

    def _owner_tasks_key(self, owner: str) -> str:
        return f"{self._prefix}ot:{owner}"

    def _live_tasks_key(self, owner: str) -> str:
        return f"{self._prefix}lt:{owner}"

    def _asked_key(self, key: str) -> str:
        return f"{self._prefix}q:{key}"

    def _encode(self, purpose: str, record: SessionRecord | UserRecord | TaskRecord) -> bytes:
        return self._signer.encrypt(purpose, json.dumps(record.to_json(), separators=(",", ":")).encode())

    def _decode_session(self, blob: bytes | None) -> SessionRecord | None:
        return self._decode(blob, "session record", SessionRecord.from_json)

    def _decode_user(self, blob: bytes | None) -> UserRecord | None:
        return self._decode(blob, "user record", UserRecord.from_json)

    def _decode(self, blob: bytes | None, purpose: str, parse: Callable[[Any], Any]) -> Any:
        if blob is None:
            return None
        try:
            return parse(json.loads(self._signer.decrypt(purpose, blob)))
        except (Unsealable, ValueError) as error:
            # Another key's record, or a damaged one: as good as absent (logged, never shown).
            logger.warning("a %s in Redis could not be read (%s); treated as absent", purpose, type(error).__name__)
            return None

    def _run(self, work: Callable[[], Any]) -> Any:
        import redis

        try:
            return work()
        except redis.RedisError as error:
            raise StoreUnavailable(f"session storage (Redis) cannot be reached: {type(error).__name__}") from None

    # -- sessions ------------------------------------------------------------------------

    def session(self, session_id: str) -> SessionRecord | None:
        return self._decode_session(self._run(lambda: self._redis.get(self._session_key(session_id))))

    def put_session(self, record: SessionRecord) -> None:
        def work() -> None:
            pipe = self._redis.pipeline()
            pipe.set(self._session_key(record.session_id), self._encode("session record", record),
                     ex=self._session_ttl)
            pipe.sadd(self._index_key(record.user), record.session_id)
            pipe.expire(self._index_key(record.user), self._user_ttl)
            pipe.expire(self._user_key(record.user), self._user_ttl)
            pipe.execute()
        self._run(work)

    def delete_session(self, session_id: str) -> SessionRecord | None:
        def work() -> SessionRecord | None:
            record = self._decode_session(self._redis.getdel(self._session_key(session_id)))
            if record is not None:
                self._redis.srem(self._index_key(record.user), session_id)
            return record
        return self._run(work)

    def sessions_of(self, key: UserKey) -> list[SessionRecord]:
        return self._run(lambda: self._indexed(self._index_key(key), self._session_key, self._decode_session))

    def _indexed(self, index: str, key_of: Callable[[str], str], decode: Callable[[bytes | None], Any]) -> list[Any]:
        """The records whose ids the set ``index`` lists (expired ones leave their ids
        behind: those are tidied up)."""
        ids = sorted(member.decode() for member in self._redis.smembers(index))
        blobs = self._redis.mget([key_of(record_id) for record_id in ids]) if ids else []
        gone = [record_id for record_id, blob in zip(ids, blobs) if blob is None]
        if gone:
            self._redis.srem(index, *gone)
        return [record for blob in blobs if (record := decode(blob)) is not None]

    def update_session(self, session_id: str, change: Callable[[SessionRecord], SessionRecord]) -> None:
        name = self._session_key(session_id)

        def update(pipe: Any) -> None:
            current = self._decode_session(pipe.get(name))
            if current is None:
                return  # deleted meanwhile: nothing to change
            changed = change(current)
            pipe.multi()
            pipe.set(name, self._encode("session record", changed), ex=self._session_ttl)
            pipe.expire(self._index_key(current.user), self._user_ttl)
            pipe.expire(self._user_key(current.user), self._user_ttl)

        self._run(lambda: self._redis.transaction(update, name))

    # -- users ---------------------------------------------------------------------------

    def user(self, key: UserKey) -> UserRecord | None:
        return self._decode_user(self._run(lambda: self._redis.get(self._user_key(key))))

    def put_user(self, record: UserRecord) -> None:
        self._run(lambda: self._redis.set(self._user_key(record.key), self._encode("user record", record),
                                          ex=self._user_ttl))

    def update_user(self, key: UserKey, change: Callable[[UserRecord], UserRecord]) -> None:
        name = self._user_key(key)

        def update(pipe: Any) -> None:
            current = self._decode_user(pipe.get(name))
            if current is None:
                return
            pipe.multi()
            pipe.set(name, self._encode("user record", change(current)), ex=self._user_ttl)

        self._run(lambda: self._redis.transaction(update, name))

    def delete_user(self, key: UserKey) -> UserRecord | None:
        def work() -> UserRecord | None:
            record = self._decode_user(self._redis.getdel(self._user_key(key)))
            self._redis.delete(self._index_key(key))
            return record
        return self._run(work)

    # -- the gateway's own tasks ---------------------------------------------------------

    def _decode_task(self, blob: bytes | None) -> TaskRecord | None:
        return self._decode(blob, "task record", TaskRecord.from_json)

    def task(self, task_id: str) -> TaskRecord | None:
        return self._decode_task(self._run(lambda: self._redis.get(self._task_key(task_id))))

    def _write_task(self, pipe: Any, record: TaskRecord) -> None:
        keep = max(1, math.ceil(record.expires - time.time()))
        pipe.set(self._task_key(record.task_id), self._encode("task record", record), ex=keep)
        indexes, live = [self._owner_tasks_key(record.owner)], self._live_tasks_key(record.owner)
        if record.terminal:
            pipe.srem(live, record.task_id)
        else:
            indexes.append(live)
        for index in indexes:
            pipe.sadd(index, record.task_id)
            # An index outlives every task in it (a later write extends it again).
            pipe.expire(index, keep, gt=True)
            pipe.expire(index, keep, nx=True)

    def put_task(self, record: TaskRecord) -> None:
        def work() -> None:
            pipe = self._redis.pipeline()
            self._write_task(pipe, record)
            pipe.execute()
        self._run(work)

    def update_task(self, task_id: str, change: Callable[[TaskRecord], TaskRecord]) -> TaskRecord | None:
        name = self._task_key(task_id)

        def update(pipe: Any) -> TaskRecord | None:
            current = self._decode_task(pipe.get(name))
            if current is None:
                return None
            changed = change(current)
            pipe.multi()
            self._write_task(pipe, changed)
            return changed

        return self._run(lambda: self._redis.transaction(update, name, value_from_callable=True))

    def tasks_of(self, owner: str) -> list[TaskRecord]:
        return self._owner_tasks(self._owner_tasks_key(owner), owner)

    def live_tasks_of(self, owner: str) -> list[TaskRecord]:
        records = self._owner_tasks(self._live_tasks_key(owner), owner)
        return [record for record in records if not record.terminal]  # ended between the index and the read

    def _owner_tasks(self, index: str, owner: str) -> list[TaskRecord]:
        records = self._run(lambda: self._indexed(index, self._task_key, self._decode_task))
        return sorted((record for record in records if record.owner == owner), key=lambda record: record.created)

    # -- what backends' tasks asked ----------------------------------------------------------

    def asked(self, key: str) -> dict[str, Any] | None:
        return self._decode(self._run(lambda: self._redis.get(self._asked_key(key))), "asked questions",
                            lambda data: data if isinstance(data, dict) else None)

    def put_asked(self, key: str, questions: dict[str, Any], ttl: float) -> None:
        if not questions or ttl <= 0:
            self._run(lambda: self._redis.delete(self._asked_key(key)))
            return
        blob = self._signer.encrypt("asked questions", json.dumps(questions, separators=(",", ":")).encode())
        self._run(lambda: self._redis.set(self._asked_key(key), blob, ex=max(1, math.ceil(ttl))))

    def ping(self) -> bool:
        """For /readyz: whether Redis answers now."""
        try:
            return bool(self._run(self._redis.ping))
        except StoreUnavailable:
            return False
