"""Users and what stays of them: the Gateway (one per process), one UserActor per user
owning its backend connections and catalog, session and user records and their stores,
the directory of what is live here, and the client streams this process holds."""

from vmcp_actors.users._actor import SessionServices, UserActor, UserHandle, start_user
from vmcp_actors.users._directory import Directory, Lease
from vmcp_actors.users._gateway import CapReached, Gateway, short_id
from vmcp_actors.users._live import LiveSessions
from vmcp_actors.users._records import SessionRecord, UserKey, UserRecord
from vmcp_actors.users._redis_store import RedisRecordStore
from vmcp_actors.users._store import MemoryRecordStore, RecordStore, StoreUnavailable

__all__ = [
    "CapReached",
    "Directory",
    "Gateway",
    "Lease",
    "LiveSessions",
    "MemoryRecordStore",
    "RecordStore",
    "RedisRecordStore",
    "SessionRecord",
    "SessionServices",
    "StoreUnavailable",
    "UserActor",
    "UserHandle",
    "UserKey",
    "UserRecord",
    "short_id",
    "start_user",
]
