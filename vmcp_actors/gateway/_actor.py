"""Gateway: the root actor. Session registry, identity binding, idle reaping."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pykka

from vmcp_actors.config import VmcpConfig
from vmcp_actors.identity import Identity, identity_key
from vmcp_actors.sessions import McpDispatcher, SessionActor

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionHandle:
    """What a web thread needs to serve one request of a session."""

    session_id: str
    protocol_version: str
    dispatcher: McpDispatcher


@dataclass(frozen=True)
class SessionRecord:
    handle: SessionHandle
    actor: pykka.ActorRef[SessionActor]
    owner: tuple[str, str] | None
    created: float
    last_used: float  # time.monotonic()
    in_flight: int = 0  # requests being served; such a session is never idle


class Gateway(pykka.ThreadingActor):
    def __init__(self, config: VmcpConfig, *, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self._config = config
        self._clock = clock
        self._sessions: dict[str, SessionRecord] = {}
        self._started = time.time()
        self._reaper: threading.Timer | None = None

    def on_start(self) -> None:
        self._schedule_reaping()

    def on_stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for record in self._sessions.values():
            _stop_quietly(record.actor)
        self._sessions.clear()

    # -- sessions ------------------------------------------------------------------------

    def create_session(self, identity: Identity | None, protocol_version: str) -> SessionHandle:
        session_id = secrets.token_hex(16)
        actor = SessionActor.start(session_id, identity, self._config)
        dispatcher = actor.proxy().dispatcher().get(timeout=5.0)
        handle = SessionHandle(session_id, protocol_version, dispatcher)
        now = self._clock()
        self._sessions[session_id] = SessionRecord(handle, actor, identity_key(identity), time.time(), now)
        logger.info("session %s created", short_id(session_id))
        return handle

    def find_session(self, session_id: str, identity: Identity | None) -> SessionHandle | None:
        """The session, if it exists and belongs to this caller. The caller must tell
        ``request_finished`` when done: until then the session is not idle."""
        record = self._sessions.get(session_id)
        if record is None or record.owner != identity_key(identity):
            return None  # another person's session looks exactly like a missing one
        self._sessions[session_id] = replace(record, last_used=self._clock(), in_flight=record.in_flight + 1)
        return record.handle

    def request_finished(self, session_id: str) -> None:
        """A request found with ``find_session`` is answered: the idle clock starts now."""
        record = self._sessions.get(session_id)
        if record is not None:
            self._sessions[session_id] = replace(record, last_used=self._clock(), in_flight=max(0, record.in_flight - 1))

    def end_session(self, session_id: str, identity: Identity | None) -> bool:
        record = self._sessions.get(session_id)
        if record is None or record.owner != identity_key(identity):
            return False
        del self._sessions[session_id]
        _stop_quietly(record.actor)
        logger.info("session %s ended by the client", short_id(session_id))
        return True

    def reap_idle(self) -> int:
        ttl = self._config.operational.session_ttl
        now = self._clock()
        idle = [
            sid for sid, record in self._sessions.items() if record.in_flight == 0 and now - record.last_used >= ttl
        ]
        for session_id in idle:
            _stop_quietly(self._sessions.pop(session_id).actor)
            logger.info("session %s reaped after %gs idle", short_id(session_id), ttl)
        self._schedule_reaping()
        return len(idle)

    # -- operators -----------------------------------------------------------------------

    def overview(self) -> dict[str, Any]:
        """Gateway-level facts plus the session actors to ask for details (asked by the caller,
        so a large registry never holds the gateway's loop)."""
        now = self._clock()
        return {
            "uptime": time.time() - self._started,
            "sessions": [
                (record.actor, {
                    "created": record.created,
                    "idleSeconds": round(now - record.last_used, 3),
                    "inFlight": record.in_flight,
                })
                for record in self._sessions.values()
            ],
        }

    def session_count(self) -> int:
        return len(self._sessions)

    # -- internals -----------------------------------------------------------------------

    def _schedule_reaping(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()  # one timer chain, however reap_idle was reached
        interval = min(max(self._config.operational.session_ttl / 4, 0.05), 30.0)
        proxy = self.actor_ref.proxy()

        def tick() -> None:
            try:
                proxy.reap_idle()
            except pykka.ActorDeadError:
                pass

        self._reaper = threading.Timer(interval, tick)
        self._reaper.daemon = True
        self._reaper.start()


def short_id(session_id: str) -> str:
    """Enough of a session id to correlate log lines, too little to use it."""
    return session_id[:8]


def _stop_quietly(actor: pykka.ActorRef[Any]) -> None:
    try:
        actor.stop(block=False)
    except pykka.ActorDeadError:
        pass
