"""Backend health and circuit breakers, per backend and across users.

* ``CircuitBreaker``: every HTTP exchange with a backend asks it first (``admit``) and
  reports how it went. After ``failureThreshold`` failures in a row (unreachable, timed
  out, HTTP 5xx) the circuit opens: calls fail at once with an error naming the backend,
  for ``timeout`` seconds; then one call goes through as a probe (half-open) and its
  outcome closes or reopens the circuit. The closed path reads one attribute: no lock.
* ``BackendHealth``: the board every reader shares (discovery skips unhealthy backends,
  the admin state shows it), written by the HealthMonitor.
* ``HealthMonitor``: a PooledActor that checks each backend every
  ``healthCheckInterval``, as nobody (static credentials only, never a user's token):
  a handshake once, then ``ping`` on that backend session (a 404 starts a new one; a
  2024-11-05 SSE backend's dropped stream is opened again). A process backend is
  checked without starting anything (``ChildProcesses.check``): its command is found,
  its live children answer ``ping``, none waits out a back-off after a crash. The
  check runs as pooled I/O and reports back with a message; the actor never waits.
  A check's outcome feeds the backend's circuit too, so a recovered backend closes it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vmcp_actors.backends._auth import HeaderInjection, OutgoingAuth, Unauthenticated
from vmcp_actors.backends._channel import BackendChannel, BackendEras, drain
from vmcp_actors.backends._http import McpHttpClient
from vmcp_actors.backends._models import Handshake
from vmcp_actors.concurrency import TimerHandle, call_later, run_in_thread, tell_quietly
from vmcp_actors.config import (
    BackendConfig,
    CircuitBreakerConfig,
    FailureHandlingConfig,
    VmcpConfig,
)
from vmcp_actors.exceptions import (
    BackendError,
    BackendHTTPError,
    BackendNotTried,
    BackendRpcError,
    BackendSessionExpired,
    BackendUnavailable,
)
from vmcp_actors.pooled import PooledActor

if TYPE_CHECKING:
    from vmcp_actors.backends._stdio import ChildProcesses

logger = logging.getLogger(__name__)

HEALTHY, DEGRADED, UNHEALTHY, UNKNOWN, UNAUTHENTICATED = (
    "healthy", "degraded", "unhealthy", "unknown", "unauthenticated")
CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
# A check answered in more than this share of healthCheckTimeout makes a backend degraded.
SLOW_SHARE = 0.5


class CircuitOpen(BackendNotTried):
    """The backend's circuit is open: the call was not sent."""


class CircuitBreaker:
    def __init__(self, backend: str, settings: CircuitBreakerConfig, clock: Callable[[], float] = time.monotonic):
        self.backend = backend
        self._threshold = settings.failure_threshold
        self._open_for = settings.timeout
        self._clock = clock
        self._lock = threading.Lock()  # guards the breaker's state, failure count and probe flag; never nested
        self.state = CLOSED
        self.failures = 0  # in a row
        self._opened_at = 0.0
        self._probing = False
        self.opened = 0  # how often it opened

    def admit(self) -> None:
        """Before an exchange: raises CircuitOpen instead of sending it."""
        if self.state is CLOSED:
            return
        with self._lock:
            if self.state is OPEN and self._clock() - self._opened_at >= self._open_for:
                self.state = HALF_OPEN
                self._probing = False
            if self.state is HALF_OPEN and not self._probing:
                self._probing = True  # this call is the probe
                return
            if self.state is CLOSED:
                return
            wait = max(0.0, self._open_for - (self._clock() - self._opened_at))
        what = "a probe call is under way" if self.state is HALF_OPEN else f"the next try in {wait:.0f}s"
        raise CircuitOpen(self.backend, f"backend {self.backend!r} is unavailable: its circuit is open after "
                                        f"{self._threshold} failed exchanges in a row ({what})")

    def succeeded(self) -> None:
        if self.state is CLOSED and not self.failures:
            return
        with self._lock:
            if self.state is not CLOSED:
                logger.warning("backend %r: circuit closed (it answers again)", self.backend)
            self.state, self.failures, self._probing = CLOSED, 0, False

    def failed(self) -> None:
        with self._lock:
            self.failures += 1
            if self.state is HALF_OPEN or (self.state is CLOSED and self.failures >= self._threshold):
                self.state, self._opened_at, self._probing = OPEN, self._clock(), False
                self.opened += 1
                logger.warning("backend %r: circuit open for %gs after %d failed exchanges in a row",
                               self.backend, self._open_for, self.failures)

    def snapshot(self) -> dict[str, Any]:
        return {"state": self.state, "failuresInARow": self.failures, "opened": self.opened}


@dataclass
class _Status:
    state: str = UNKNOWN
    failures: int = 0  # checks failed in a row
    checked_at: float | None = None
    latency: float | None = None
    last_error: str | None = None


class BackendHealth:
    """The shared board: each backend's health state (when monitored) and its breaker
    (when enabled). Readers take no lock; the monitor writes whole values."""

    def __init__(self, config: VmcpConfig, clock: Callable[[], float] = time.monotonic):
        handling = config.operational.failure_handling
        self.settings: FailureHandlingConfig | None = handling
        self._clock = clock
        self._status = {backend.name: _Status() for backend in config.backends} if handling else {}
        self._breakers = ({backend.name: CircuitBreaker(backend.name, handling.circuit_breaker, clock)
                           for backend in config.backends}
                          if handling is not None and handling.circuit_breaker.enabled else {})

    @property
    def monitored(self) -> bool:
        return self.settings is not None

    def breaker(self, backend: str) -> CircuitBreaker | None:
        return self._breakers.get(backend)

    def state(self, backend: str) -> str:
        status = self._status.get(backend)
        return status.state if status is not None else UNKNOWN

    def skip_reason(self, backend: str) -> str | None:
        """Why discovery should not wait for this backend now; None when it may."""
        status = self._status.get(backend)
        if status is not None and status.state == UNHEALTHY:
            return (f"backend {backend!r} is unhealthy ({status.failures} health checks failed in a row); "
                    "skipped until a check succeeds")
        breaker = self._breakers.get(backend)
        if breaker is not None and breaker.state is OPEN:
            return f"backend {backend!r} is unavailable: its circuit is open"
        return None

    def record(self, backend: str, outcome: str, latency: float | None, error: str | None) -> None:
        """A check's outcome: ok, failed or unauthenticated."""
        settings = self.settings
        assert settings is not None
        before = self._status.get(backend, _Status())
        failures = before.failures + 1 if outcome == "failed" else 0
        if outcome == "unauthenticated":
            state = UNAUTHENTICATED
        elif failures >= settings.unhealthy_threshold:
            state = UNHEALTHY
        elif failures or (latency is not None and latency > settings.health_check_timeout * SLOW_SHARE):
            state = DEGRADED
        else:
            state = HEALTHY
        self._status[backend] = _Status(state, failures, self._clock(), latency, error)
        if state != before.state and not (before.state == UNKNOWN and state == HEALTHY):
            log = logger.warning if state in (UNHEALTHY, UNAUTHENTICATED, DEGRADED) else logger.info
            log("backend %r is %s%s", backend, state, f": {error}" if error else "")
        breaker = self._breakers.get(backend)
        if breaker is not None:
            if outcome == "failed":
                breaker.failed()
            else:
                breaker.succeeded()

    def snapshot(self) -> dict[str, Any]:
        now = self._clock()
        names = sorted(set(self._status) | set(self._breakers))
        rows = {}
        for name in names:
            row: dict[str, Any] = {}
            status = self._status.get(name)
            if status is not None:
                row.update({
                    "state": status.state,
                    "failedChecksInARow": status.failures,
                    "lastCheckSecondsAgo": round(now - status.checked_at, 3) if status.checked_at else None,
                    "lastCheckMs": round(status.latency * 1000, 1) if status.latency is not None else None,
                    "lastError": status.last_error,
                })
            breaker = self._breakers.get(name)
            if breaker is not None:
                row["circuit"] = breaker.snapshot()
            rows[name] = row
        return rows


def static_auth(auth: OutgoingAuth | None) -> OutgoingAuth:
    """What a health check may send: a static header, never anything derived from a user."""
    return auth if isinstance(auth, HeaderInjection) else Unauthenticated()


@dataclass(frozen=True)
class _Checked:
    backend: str
    outcome: str
    latency: float | None
    error: str | None
    handshake: Handshake | None


@dataclass(frozen=True)
class _CheckDue:
    backend: str


class HealthMonitor(PooledActor):
    """Checks every backend on its own schedule; one check per backend at a time."""

    def __init__(self, config: VmcpConfig, health: BackendHealth, outgoing_auth: Mapping[str, OutgoingAuth],
                 eras: BackendEras, processes: ChildProcesses | None = None):
        super().__init__()
        settings = config.operational.failure_handling
        assert settings is not None
        self._settings = settings
        self._health = health
        self._channels = {
            backend.name: BackendChannel(backend.name, _health_client(backend), settings.health_check_timeout,
                                         static_auth(outgoing_auth.get(backend.name)), None, eras)
            for backend in config.backends if not backend.is_process}
        self._processes = processes
        self._process_backends = {backend.name: backend for backend in config.backends
                                  if backend.is_process and processes is not None}
        self._handshakes: dict[str, Handshake | None] = {name: None for name in self._channels}
        self._timers: dict[str, TimerHandle] = {}
        self._stopped = False

    def on_start(self) -> None:
        for name in [*self._channels, *self._process_backends]:
            self._check(name)  # at once: a backend that is down at start is known soon

    def on_stop(self) -> None:
        self._stopped = True
        for timer in self._timers.values():
            timer.cancel()
        for name, channel in self._channels.items():
            handshake = self._handshakes.get(name)
            if handshake is not None and handshake.session_id:
                run_in_thread(channel.close_remote, handshake, None)
            else:
                channel.close()

    def on_receive(self, message: Any) -> None:
        if isinstance(message, _Checked):
            self._handshakes[message.backend] = message.handshake
            self._health.record(message.backend, message.outcome, message.latency, message.error)
            if not self._stopped:
                ref = self.actor_ref
                self._timers[message.backend] = call_later(
                    self._settings.health_check_interval, lambda: tell_quietly(ref, _CheckDue(message.backend)))
        elif isinstance(message, _CheckDue) and not self._stopped:
            self._check(message.backend)

    def _check(self, name: str) -> None:
        ref = self.actor_ref
        if name in self._process_backends:
            assert self._processes is not None
            done = run_in_thread(check_processes, self._processes, self._process_backends[name],
                                 self._settings.health_check_timeout)
        else:
            done = run_in_thread(check_backend, self._channels[name], self._handshakes[name])
        done.add_done_callback(lambda future: tell_quietly(ref, future.result()))


def _health_client(backend: BackendConfig) -> Any:
    if backend.transport == "sse":
        from vmcp_actors.backends._sse import LegacySseClient  # noqa: PLC0415 - only configs that use it
        return LegacySseClient(backend.name, backend.url or "")
    return McpHttpClient(backend.name, backend.url or "", pool_size=1)


def check_processes(processes: ChildProcesses, backend: BackendConfig, timeout: float) -> _Checked:
    """One health check of a process backend (pooled I/O). Never raises."""
    try:
        passed, latency, error = processes.check(backend, timeout)
    except Exception as error:  # noqa: BLE001 - a check never dies silently
        logger.exception("health check of backend %r failed unexpectedly", backend.name)
        return _Checked(backend.name, "failed", None, type(error).__name__, None)
    return _Checked(backend.name, "ok" if passed else "failed", latency, error, None)


def check_backend(channel: BackendChannel, handshake: Handshake | None) -> _Checked:
    """One health check (pooled I/O): a ping on the health session, opened when there is
    none or the backend forgot it. Never raises."""
    started = time.monotonic()
    for attempt in range(2):
        try:
            if handshake is None:
                handshake = channel.perform_handshake(None)
            drain(channel.exchange_with(None, handshake, "ping", None))
            return _Checked(channel.name, "ok", time.monotonic() - started, None, handshake)
        except BackendSessionExpired:
            handshake = None  # a new backend session, once
            if attempt:
                return _Checked(channel.name, "failed", None, "its sessions expire at once", None)
        except BackendRpcError:
            # It answered (a backend without ping still speaks JSON-RPC): it is up.
            return _Checked(channel.name, "ok", time.monotonic() - started, None, handshake)
        except BackendHTTPError as error:
            if error.status in (401, 403):
                return _Checked(channel.name, "unauthenticated", time.monotonic() - started,
                                f"answers HTTP {error.status} without a user's credentials", handshake)
            return _Checked(channel.name, "failed", None, str(error), None)
        except BackendError as error:
            return _Checked(channel.name, "failed", None, str(error), None)
        except Exception as error:  # noqa: BLE001 - a check never dies silently
            logger.exception("health check of backend %r failed unexpectedly", channel.name)
            return _Checked(channel.name, "failed", None, type(error).__name__, None)
    return _Checked(channel.name, "failed", None, "no answer", None)
