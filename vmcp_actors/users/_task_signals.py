"""How a worker reaches the worker that runs a task, and tells whether it still lives.

A ``tasks/update`` or ``tasks/cancel`` may come to any worker; the run it is about lives in
one (the task record's ``runner``). In one process (records in memory) the signal is a
method call. With records in Redis (``RedisTaskSignals``) each worker that runs tasks has a
mailbox, the list ``{keyPrefix}tm:{runner}``, which one daemon thread empties with a
blocking pop (a signal waits there, unlike a published message, if the thread is between
two pops), and a heartbeat key ``{keyPrefix}tw:{runner}`` it renews every second with a
five-second expiry: a task whose runner's heartbeat is gone was left by a dead worker.
Signals are JSON encrypted with the signing key (an answer to a question may be personal).
The thread starts with the first task this worker runs.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections.abc import Callable
from typing import Any

from vmcp_actors.signing import Signer, Unsealable

logger = logging.getLogger(__name__)

PURPOSE = "task signal"
HEARTBEAT_EVERY = 1.0  # seconds; also the blocking pop's timeout
HEARTBEAT_TTL = 5  # seconds without a beat before a runner counts as dead
MAILBOX_TTL = 60  # seconds a signal to a runner that never reads it is kept
RETRY_AFTER = 1.0  # seconds, while Redis is away

Receive = Callable[[dict[str, Any]], None]


class LocalTaskSignals:
    """One process: every runner is this one."""

    def __init__(self) -> None:
        self.runner_id = secrets.token_hex(8)
        self._receive: Receive | None = None

    def start(self, receive: Receive) -> None:
        self._receive = receive

    def send(self, runner: str, signal: dict[str, Any]) -> bool:
        """Whether ``runner`` was reached (here: whether it is this process)."""
        if runner != self.runner_id or self._receive is None:
            return False
        self._receive(signal)
        return True

    def alive(self, runner: str) -> bool:
        return runner == self.runner_id

    def stop(self) -> None:
        self._receive = None


class RedisTaskSignals(LocalTaskSignals):
    def __init__(self, client: Any, signer: Signer, key_prefix: str):
        super().__init__()
        self._redis = client
        self._signer = signer
        self._prefix = key_prefix
        self._lock = threading.Lock()  # guards _thread (started once)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def _mailbox(self, runner: str) -> str:
        return f"{self._prefix}tm:{runner}"

    def _heartbeat(self, runner: str) -> str:
        return f"{self._prefix}tw:{runner}"

    def start(self, receive: Receive) -> None:
        """Beat now (the task about to be recorded must look alive at once) and listen."""
        super().start(receive)
        self._beat()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._listen, name="vmcp-task-signals", daemon=True)
                self._thread.start()

    def send(self, runner: str, signal: dict[str, Any]) -> bool:
        import redis

        if super().send(runner, signal):
            return True
        payload = self._signer.encrypt(PURPOSE, json.dumps(signal, separators=(",", ":")).encode())
        try:
            pipe = self._redis.pipeline()
            pipe.rpush(self._mailbox(runner), payload)
            pipe.expire(self._mailbox(runner), MAILBOX_TTL)
            pipe.execute()
            return True
        except redis.RedisError as error:
            logger.warning("task signal not sent (%s)", type(error).__name__)
            return False

    def alive(self, runner: str) -> bool:
        import redis

        if super().alive(runner):
            return True
        try:
            return bool(self._redis.exists(self._heartbeat(runner)))
        except redis.RedisError:
            return True  # unknown: a task is not declared dead on a Redis hiccup

    def stop(self) -> None:
        super().stop()
        self._stopping.set()
        thread = self._thread
        if thread is not None:
            thread.join(HEARTBEAT_EVERY * 3)
        try:
            self._redis.delete(self._heartbeat(self.runner_id))
        except Exception:  # noqa: BLE001 - stopping: Redis may be gone already
            pass

    def _beat(self) -> None:
        self._redis.set(self._heartbeat(self.runner_id), b"1", ex=HEARTBEAT_TTL)

    def _listen(self) -> None:
        import redis

        while not self._stopping.is_set():
            try:
                self._beat()
                popped = self._redis.blpop([self._mailbox(self.runner_id)], timeout=HEARTBEAT_EVERY)
            except (redis.RedisError, OSError) as error:
                logger.warning("task signals: Redis went away (%s); trying again", type(error).__name__)
                self._stopping.wait(RETRY_AFTER)
                continue
            if popped is not None:
                self._received(popped[1])

    def _received(self, data: bytes) -> None:
        try:
            signal = json.loads(self._signer.decrypt(PURPOSE, data))
        except (Unsealable, ValueError):
            logger.warning("task signals: a signal this gateway cannot read was dropped")
            return
        receive = self._receive
        if isinstance(signal, dict) and receive is not None:
            try:
                receive(signal)
            except Exception:  # noqa: BLE001 - one bad signal must not end the listener
                logger.exception("task signals: a signal could not be handled")
