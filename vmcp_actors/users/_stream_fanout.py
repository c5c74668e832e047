"""What a backend sends outside calls, to every gateway process (``sessionStorage: redis``).

A backend session has one standalone stream, held by the process whose user opened it
first; the user's sessions may have their client streams in other processes. So each
UserActor publishes the notifications its backend streams bring (resource updates, list
changes, log messages) on one Redis channel, and every other process hands them to its own
live UserActor of that user, which delivers them to the client streams it holds and
refreshes its own catalog. A backend's request for a client is not fanned out: it is
answered where its stream is.

Messages are JSON encrypted with the signing key (they may carry resource URIs and log
text). Each process skips its own. The listener is one daemon thread per process; when
Redis goes away it waits and subscribes again, and what was published meanwhile is lost
(notifications, not records).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections.abc import Callable
from typing import Any

from vmcp_actors.signing import Signer, Unsealable
from vmcp_actors.users._records import UserKey

logger = logging.getLogger(__name__)

RESUBSCRIBE_AFTER = 1.0  # seconds, doubling up to RESUBSCRIBE_AFTER_MOST while Redis is away
RESUBSCRIBE_AFTER_MOST = 30.0
PURPOSE = "stream fanout"

Deliver = Callable[[UserKey, str, dict[str, Any]], None]  # user, backend, notification


class StreamFanout:
    def __init__(self, client: Any, signer: Signer, key_prefix: str):
        self._redis = client
        self._signer = signer
        self._channel = f"{key_prefix}streams"
        self._origin = secrets.token_hex(8)  # this process
        self._deliver: Deliver | None = None
        self._stopping = threading.Event()  # set once at stop: the subscriber thread leaves
        self._thread: threading.Thread | None = None
        self._pubsub: Any = None
        self.published = 0
        self.delivered = 0

    def start(self, deliver: Deliver) -> None:
        self._deliver = deliver
        self._thread = threading.Thread(target=self._listen, name="vmcp-stream-fanout", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        pubsub = self._pubsub
        if pubsub is not None:
            try:
                pubsub.close()
            except Exception:  # noqa: BLE001 - closing a connection that may be gone already
                pass

    def publish(self, user: UserKey, backend: str, message: dict[str, Any]) -> None:
        """Tell the other processes (best effort: a notification lost while Redis is away
        is lost, as on a dropped stream)."""
        import redis

        payload = json.dumps({"o": self._origin, "u": user.to_json(), "b": backend, "m": message},
                             separators=(",", ":")).encode()
        try:
            self._redis.publish(self._channel, self._signer.encrypt(PURPOSE, payload))
            self.published += 1
        except (redis.RedisError, TypeError, ValueError) as error:
            logger.debug("stream fanout: not published (%s)", type(error).__name__)

    def _listen(self) -> None:
        import redis

        wait = RESUBSCRIBE_AFTER
        while not self._stopping.is_set():
            try:
                self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                self._pubsub.subscribe(self._channel)
                wait = RESUBSCRIBE_AFTER
                while not self._stopping.is_set():
                    message = self._pubsub.get_message(timeout=1.0)
                    if message is not None and message.get("type") == "message":
                        self._received(message["data"])
            except (redis.RedisError, OSError, ValueError) as error:
                if self._stopping.is_set():
                    return
                logger.warning("stream fanout: Redis went away (%s); subscribing again in %gs",
                               type(error).__name__, wait)
                self._stopping.wait(wait)
                wait = min(wait * 2, RESUBSCRIBE_AFTER_MOST)
            finally:
                pubsub, self._pubsub = self._pubsub, None
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:  # noqa: BLE001
                        pass

    def _received(self, data: bytes) -> None:
        try:
            payload = json.loads(self._signer.decrypt(PURPOSE, data))
            if payload.get("o") == self._origin:
                return
            user, backend, message = UserKey.from_json(payload["u"]), str(payload["b"]), payload["m"]
        except (Unsealable, ValueError, KeyError, TypeError):
            logger.warning("stream fanout: a message this gateway cannot read was dropped")
            return
        if isinstance(message, dict) and self._deliver is not None:
            self.delivered += 1
            self._deliver(user, backend, message)
