"""Handshakes that failed, remembered across a worker's users and client sessions.

Every client session has backend sessions of its own, so without a memory each new
session would try a stuck or dead backend again and wait out its timeout. A handshake
that failed to reach its backend (timed out, refused, the child exited, an unreadable
answer) backs the backend off, for its owner (a person, or everyone for a shared
process): handshakes fail at once, naming the backend and why, until the back-off
ends; it doubles with each failure in a row. A handshake that has been under way longer
than the backend's discovery budget makes the others not wait for it either. A refused
credential (401/403) is not a reason to back off: the next caller may bring another.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from vmcp_actors.exceptions import (
    BackendAuthError,
    BackendError,
    BackendHTTPError,
    BackendNotTried,
    BackendUnavailable,
)

FIRST_BACKOFF = 2.0
MOST_BACKOFF = 60.0


@dataclass
class _State:
    failures: int = 0
    not_before: float = 0.0
    why: str = ""
    attempts: int = 0  # under way now
    oldest_started: float | None = None  # when the oldest one under way began


class HandshakeBackoff:
    """Thread-safe; one per process. Keyed by (backend, owner)."""

    def __init__(self, patience: Callable[[str], float] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        """``patience(backend)``: how long a handshake under way is waited for by others
        (the backend's discovery budget); None: always."""
        self._patience = patience
        self._clock = clock
        self._lock = threading.Lock()  # guards _states; nothing is called under it
        self._states: dict[tuple[str, str], _State] = {}

    def refusal(self, backend: str, owner: str) -> str | None:
        """Why a handshake with ``backend`` for ``owner`` should fail at once; None: try it."""
        now = self._clock()
        with self._lock:
            state = self._states.get((backend, owner))
            if state is None:
                return None
            if now < state.not_before:
                return (f"backend {backend!r} is not available: {state.why} (tried again in "
                        f"{state.not_before - now:.0f}s)")
            patience = self._patience(backend) if self._patience is not None else None
            if patience is not None and state.oldest_started is not None and now - state.oldest_started > patience:
                return (f"backend {backend!r} is not available: its handshake has not answered for "
                        f"{now - state.oldest_started:.0f}s")
        return None

    @contextmanager
    def attempt(self, backend: str, owner: str) -> Iterator[None]:
        """Run a handshake: refused at once while backing off (BackendUnavailable), and
        its outcome remembered."""
        why = self.refusal(backend, owner)
        if why is not None:
            raise BackendUnavailable(backend, why)
        key = (backend, owner)
        started = self._clock()
        with self._lock:
            state = self._states.setdefault(key, _State())
            state.attempts += 1
            if state.oldest_started is None:
                state.oldest_started = started
        try:
            yield
        except (BackendAuthError, BackendNotTried):  # nothing learned of the backend itself
            self._ended(key, None)
            raise
        except BackendHTTPError as error:
            self._ended(key, None if error.status in (401, 403) else str(error))
            raise
        except BackendError as error:
            self._ended(key, str(error) or type(error).__name__)
            raise
        except BaseException:
            self._ended(key, None)
            raise
        else:
            self._ended(key, None, succeeded=True)

    def snapshot(self) -> dict[str, dict[str, float | int | str]]:
        """Backends backing off now, for anyone (for the admin state): never an owner, and
        the longest back-off when several owners back off."""
        now = self._clock()
        with self._lock:
            backing_off = sorted(((backend, state) for (backend, _owner), state in self._states.items()
                                  if now < state.not_before), key=lambda entry: entry[1].not_before)
            return {backend: {"failures": state.failures, "retryInSeconds": round(state.not_before - now, 1),
                              "why": state.why} for backend, state in backing_off}

    def _ended(self, key: tuple[str, str], why: str | None, *, succeeded: bool = False) -> None:
        now = self._clock()
        with self._lock:
            state = self._states.get(key)
            if state is None:
                return
            state.attempts -= 1
            state.oldest_started = None if state.attempts <= 0 else state.oldest_started
            if succeeded:
                state.failures, state.not_before, state.why = 0, 0.0, ""
            elif why is not None:
                state.failures += 1
                state.not_before = now + min(FIRST_BACKOFF * 2 ** (state.failures - 1), MOST_BACKOFF)
                state.why = why
            if state.attempts <= 0 and not state.failures:
                del self._states[key]
