"""Backends that are programs: the gateway starts them and speaks MCP over their stdin and
stdout (newline-delimited JSON-RPC), one ``MessageBus`` per child.

``ChildProcesses`` (one per gateway process) owns every child: a ``shared`` backend's one
child, serving every user, stopped after ``operational.processIdleTimeout`` without use;
a ``perUser`` backend's child per person, stopped when that person's user is released.
At most ``operational.maxProcesses`` children run at once: at the cap, the least recently
used per-user child with no call in flight is stopped, and the new one starts once it has
exited (it starts again when its user next calls); when every child is busy the call is
refused with ``ProcessesBusy`` (503, ``Retry-After``).

A child gets only the environment its config names, plus ``PATH``, ``HOME`` and ``LANG``,
and the credential of ``outgoingAuth.backends.<name>.tokenEnv``: never the gateway's
own secrets. Each stderr line is logged under the backend's name (credential values
replaced); the last one is kept for the admin state. A child runs in its backend's
sandbox (``_sandbox``). Children are started from one long-lived thread, their launcher
(bwrap or setpriv) setting ``PR_SET_PDEATHSIG``, so the kernel kills each when its
gateway worker dies, even by SIGKILL (the death signal follows the thread that forked);
they run in their own process group, which is what ``stop`` signals: SIGTERM, then
SIGKILL after a grace. Every exit is reaped by the child's reader thread.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import logging
import os
import queue
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vmcp_actors.backends import _sandbox as sandbox
from vmcp_actors.backends._bus import SEND_TIMEOUT, BusClient, MessageBus, NotRunning
from vmcp_actors.concurrency import TimerHandle, call_later
from vmcp_actors.config import BackendAuthConfig, BackendConfig, VmcpConfig
from vmcp_actors.config._model import USER_PLACEHOLDER
from vmcp_actors.exceptions import BackendError, BackendNotTried, BackendTimeout, BackendUnavailable
from vmcp_actors.protocol import wire_bytes

logger = logging.getLogger(__name__)
stderr_logger = logging.getLogger("vmcp_actors.backends.stderr")

# What a child inherits from the gateway's environment; everything else comes from config.
INHERITED_ENV = ("PATH", "HOME", "LANG")
MIN_REDACTED = 6  # env values at least this long are never logged from a child's stderr
SPAWN_TIMEOUT = 10.0  # seconds a start waits for the spawner thread to fork the child
# After SIGTERM, how long a child may take to exit before SIGKILL.
STOP_GRACE = 2.0
# The longest line read from a child's stdout; a longer one is skipped, whole.
MAX_LINE = 32 * 1024 * 1024
# How often idle shared children are looked for.
IDLE_SWEEP = 15.0
# Garbage lines logged as warnings per child; later ones only at debug level.
GARBAGE_WARNINGS = 5
# Retry-After (seconds) when every child is busy at the cap.
BUSY_RETRY_AFTER = 2
# How much of a stderr line is kept for the admin state.
LAST_LINE_CHARS = 300

class ProcessesBusy(BackendNotTried):
    """Every child the gateway may run is busy: the call is refused, to be retried."""

    retry_after = BUSY_RETRY_AFTER


def user_digest(owner: tuple[str, str] | None, headers: str = "") -> str:
    """A filesystem-safe name for a person (``{user}``): the same in every worker."""
    issuer, subject = owner if owner is not None else ("", "anonymous")
    return hashlib.sha256(f"{issuer}\0{subject}\0{headers}".encode()).hexdigest()[:24]


class _Spawner:
    """The one thread children are started from: PR_SET_PDEATHSIG (set by each child's
    launcher) fires when the thread that forked ends, so it must be one that lives as long
    as the process. Nothing runs between fork and exec (no ``preexec_fn``)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._pid = os.getpid()
        threading.Thread(target=self._run, name="vmcp-spawner", daemon=True).start()

    def popen(self, argv: list[str], env: dict[str, str], cwd: str | None) -> subprocess.Popen:
        """The started process; TimeoutError when the spawner has not started it within
        SPAWN_TIMEOUT (a process it starts later is killed, nobody would read it)."""
        done: cf.Future[subprocess.Popen] = cf.Future()
        self._jobs.put((argv, env, cwd, done))
        try:
            return done.result(timeout=SPAWN_TIMEOUT)
        except cf.TimeoutError:
            done.add_done_callback(_kill_late)
            raise TimeoutError(f"no process started within {SPAWN_TIMEOUT:g}s") from None

    def _run(self) -> None:
        while True:
            argv, env, cwd, done = self._jobs.get()
            try:
                done.set_result(subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                    start_new_session=True, close_fds=True))
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                done.set_exception(error)


def _kill_late(started: cf.Future[subprocess.Popen]) -> None:
    if started.exception() is None:
        process = started.result()
        process.kill()
        process.wait(timeout=STOP_GRACE)


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _spawn(argv: list[str], env: dict[str, str], cwd: str | None) -> subprocess.Popen:
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner._pid != os.getpid():
            _spawner = _Spawner()
        spawner = _spawner
    return spawner.popen(argv, env, cwd)


class ChildLink:
    """One running child: a ``Link`` of its bus. Its reader thread hands each stdout line
    to the bus; its stderr thread logs."""

    def __init__(self, bus: MessageBus, process: subprocess.Popen, secrets: tuple[str, ...],
                 on_exit: Callable[[ChildLink], None]):
        self.bus = bus
        self.process = process
        self.started = time.monotonic()
        self.last_stderr: str | None = None
        self._secrets = tuple(sorted(set(secrets), key=len, reverse=True))  # values never to log, longest first
        self._on_exit = on_exit
        self._write_lock = threading.Lock()  # one message at a time on stdin
        self._stopping = False
        self._garbage = 0
        self.ended = threading.Event()  # set once the process is reaped and its exit reported
        # The credential it was started with, and how to read one from a call's headers.
        self._credential: str | None = None
        self._credential_of: Callable[[Mapping[str, str]], str | None] | None = None
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        os.set_blocking(process.stdin.fileno(), False)
        name = bus.backend
        threading.Thread(target=self._read, name=f"vmcp-stdio-{name}", daemon=True).start()
        threading.Thread(target=self._read_stderr, name=f"vmcp-stderr-{name}", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def carries(self, credential: str | None, credential_of: Callable[[Mapping[str, str]], str | None]) -> None:
        self._credential, self._credential_of = credential, credential_of

    def outdated(self, headers: Mapping[str, str]) -> bool:
        """Whether a call's headers carry another credential than the child started with
        (a person's token was refreshed or renewed): the bus starts it again when idle."""
        if self._credential_of is None:
            return False
        current = self._credential_of(headers)
        return current is not None and current != self._credential

    @property
    def stopping(self) -> bool:
        """Asked to stop (it may still be exiting)."""
        return self._stopping

    def send(self, message: dict[str, Any], headers: Mapping[str, str] | None = None) -> None:
        """``headers`` are not a child's: its credential went into its environment."""
        data = wire_bytes(message) + b"\n"
        deadline = time.monotonic() + SEND_TIMEOUT
        with self._write_lock:
            view = memoryview(data)
            while view:
                try:
                    if self._stopping or self.process.stdin is None:
                        raise ValueError("stopped")
                    written = os.write(self.process.stdin.fileno(), view)
                except BlockingIOError:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise BackendTimeout(self.bus.backend, f"backend {self.bus.backend!r} reads no input") from None
                    select.select([], [self.process.stdin], [], min(left, 1.0))
                    continue
                except (BrokenPipeError, OSError, ValueError):
                    raise BackendUnavailable(self.bus.backend, f"backend {self.bus.backend!r} has exited") from None
                view = view[written:]

    def close(self) -> None:
        """SIGTERM to the child's process group, SIGKILL after STOP_GRACE; the reader reaps it."""
        if self._stopping:
            return
        self._stopping = True
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()  # a well-behaved server exits on end of input
        except OSError:
            pass
        _signal_group(self.process, signal.SIGTERM)
        call_later(STOP_GRACE, lambda: _signal_group(self.process, signal.SIGKILL)
                   if self.process.poll() is None else None)

    def stop_now(self, grace: float) -> None:
        """For shutdown: signal, wait up to ``grace``, kill, reap."""
        self.close()
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(self.process, signal.SIGKILL)
            try:
                self.process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                logger.error("backend %r: process %d did not die", self.bus.backend, self.process.pid)

    def rss_bytes(self) -> int | None:
        """The resident memory of the child and what it started (its sandbox's processes)."""
        pids, total, seen = [self.process.pid], 0, False
        while pids:
            pid = pids.pop()
            try:
                with open(f"/proc/{pid}/statm") as statm:
                    total += int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
                seen = True
                with open(f"/proc/{pid}/task/{pid}/children") as children:
                    pids += [int(child) for child in children.read().split()]
            except (OSError, ValueError, IndexError):
                continue
        return total if seen else None

    def redacted(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "[redacted]")
        return text

    def _read(self) -> None:
        stdout = self.process.stdout
        try:
            while True:
                line = stdout.readline(MAX_LINE + 1)
                if not line:
                    break
                if len(line) > MAX_LINE and not line.endswith(b"\n"):
                    self._skip_rest(stdout)
                    self._garbage_line("a line longer than the limit")
                    continue
                if not line.strip():
                    continue
                try:
                    message = json.loads(line)
                except ValueError:
                    self._garbage_line("a line that is not JSON")
                    continue
                if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
                    self._garbage_line("a line that is not a JSON-RPC message")
                    continue
                self.bus.received(self, message)
        except (OSError, ValueError):
            pass  # the pipe closed under us: the process is ending
        code = self._reap()
        why = f"its process exited with code {code}" if code is not None and code >= 0 else \
            f"its process was killed by signal {-code}" if code is not None else "its output ended"
        try:
            if not self._stopping:
                self.bus.lost(self, why)
            self._on_exit(self)
        finally:
            self.ended.set()

    def _reap(self) -> int | None:
        try:
            return self.process.wait(timeout=STOP_GRACE + 2.0)
        except subprocess.TimeoutExpired:
            _signal_group(self.process, signal.SIGKILL)  # it closed its output but lives on
            try:
                return self.process.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                return None

    def _skip_rest(self, stdout: Any) -> None:
        while True:
            chunk = stdout.readline(MAX_LINE)
            if not chunk or chunk.endswith(b"\n"):
                return

    def _garbage_line(self, what: str) -> None:
        self._garbage += 1
        level = logging.WARNING if self._garbage <= GARBAGE_WARNINGS else logging.DEBUG
        logger.log(level, "backend %r wrote %s on stdout; skipped", self.bus.backend, what)

    def _read_stderr(self) -> None:
        stderr = self.process.stderr
        try:
            for raw in iter(lambda: stderr.readline(64 * 1024), b""):
                text = self.redacted(raw.decode("utf-8", "replace").rstrip())
                if text:
                    self.last_stderr = text[:LAST_LINE_CHARS]
                    stderr_logger.info("backend %r: %s", self.bus.backend, text)
        except (OSError, ValueError):
            pass


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, sig)  # the child leads its own group (start_new_session)
    except (ProcessLookupError, PermissionError):
        try:
            process.send_signal(sig)
        except (ProcessLookupError, OSError):
            pass


# A child's key: its backend, its person's digest (perUser, perSession) and its client
# session's digest (perSession).
_ChildKey = tuple[str, str | None, str | None]


@dataclass(eq=False)
class _Child:
    """A bus, what it was made for, and who uses it."""

    backend: BackendConfig
    user: str | None  # the person's digest for a perUser backend
    bus: MessageBus
    views: set[BusClient] = field(default_factory=set)
    link: ChildLink | None = None
    starting: bool = False  # past the room check, its process not yet linked: counted under the cap
    waits_for: ChildLink | None = None  # while starting: the stopped process whose place it takes


@dataclass(frozen=True)
class ProcessSnapshot:
    """The admin view of one child."""

    backend: str
    user: str | None  # a digest, never the subject
    pid: int | None
    up_seconds: float | None
    restarts: int
    rss_bytes: int | None
    last_stderr: str | None
    calls: int

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "user": self.user[:8] if self.user else None, "pid": self.pid,
                "uptimeSeconds": self.up_seconds, "restarts": self.restarts, "rssBytes": self.rss_bytes,
                "lastStderr": self.last_stderr, "calls": self.calls}


class ChildProcesses:
    """Every child of this gateway process (thread-safe)."""

    def __init__(self, config: VmcpConfig):
        self._config = config
        self._max = config.operational.max_processes
        self._idle_timeout = config.operational.process_idle_timeout
        self._lock = threading.Lock()  # guards _children and _stopped; never held while starting or stopping one
        self._children: dict[_ChildKey, _Child] = {}
        # Every child process not yet reaped, whoever it belonged to: what the cap counts,
        # so one stopped (idle, released, making room) counts until it has exited.
        self._running: set[ChildLink] = set()
        self._restarts: dict[str, int] = {backend.name: 0 for backend in config.backends if backend.is_process}
        self._stopped = False
        self._sweeper: TimerHandle | None = None

    def client(self, backend: BackendConfig, owner: tuple[str, str] | None = None,
               headers_digest: str = "", client_capabilities: Mapping[str, Any] | None = None,
               client_session: str = "") -> BusClient:
        """A channel's view of the backend's child (started on first use). ``owner`` and
        ``headers_digest``: whose child, for a perUser backend; ``client_session`` too
        (a digest of the client session's id), for a perSession one."""
        user = user_digest(owner, headers_digest) if backend.per_user else None
        key = (backend.name, user, client_session if backend.per_session else None)
        with self._lock:
            child = self._children.get(key)
            if child is None:
                child = _Child(backend, user, MessageBus(
                    backend.name, lambda bus, headers, key=key: self._open(key, headers),
                    one_client=backend.per_session and bool(client_session),
                    on_lost=lambda why, name=backend.name: self._lost(name, why),
                    opening_params=None if backend.per_user else _shared_opening(client_capabilities)))
                self._children[key] = child
            view = BusClient(child.bus, lambda released, key=key: self._released(key, released))
            child.views.add(view)
            self._sweep_later()
        return view

    def snapshot(self) -> list[ProcessSnapshot]:
        with self._lock:
            children = list(self._children.values())
        shots = []
        for child in children:
            link = child.link
            if link is None:
                continue
            shots.append(ProcessSnapshot(child.backend.name, child.user, link.pid,
                                         round(time.monotonic() - link.started, 1), child.bus.restarts,
                                         link.rss_bytes(), link.last_stderr, child.bus.calls()))
        return shots

    def restarts(self) -> dict[str, int]:
        """Per backend: how often its children ended without being asked to and started again."""
        with self._lock:
            return dict(self._restarts)

    def check(self, backend: BackendConfig, timeout: float) -> tuple[bool, float | None, str | None]:
        """A health check of a process backend, starting nothing: its command is found, no
        child of it waits out a back-off after a crash, and its live children answer
        ``ping`` (not counted as use: checks keep no child alive). A perUser backend fails
        only when none of its children answers (one user's child is not everyone's backend).
        (passed, slowest answer in seconds or None when none runs, what failed)."""
        try:
            command = _resolved_command(backend)
        except BackendUnavailable as error:
            return False, None, str(error)
        if not os.access(command, os.X_OK) or os.path.isdir(command):
            return False, None, f"backend {backend.name!r}: its command cannot be run"
        with self._lock:
            buses = [child.bus for (name, *_), child in self._children.items() if name == backend.name]
        deadline = time.monotonic() + timeout
        slowest: float | None = None
        failed: list[str] = []
        for bus in buses:
            why = bus.restarting()
            if why is not None:
                failed.append(f"backend {backend.name!r} ended: {why}")
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                break
            started = time.monotonic()
            try:
                for _streamed in bus.request({"jsonrpc": "2.0", "id": "health", "method": "ping"}, left, probe=True):
                    pass  # nothing a ping's backend sends along matters; its answer (or error) does
            except NotRunning:
                continue
            except BackendError as error:
                failed.append(str(error))
                continue
            slowest = max(slowest or 0.0, time.monotonic() - started)
        if failed and (not backend.per_user or slowest is None):
            more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            return False, None, failed[0] + more
        return True, slowest, None

    def live_count(self) -> int:
        """Child processes not yet reaped (those stopping included)."""
        with self._lock:
            return len(self._running)

    def stop_all(self, grace: float = STOP_GRACE) -> None:
        """At shutdown: every child stopped and reaped (SIGTERM, SIGKILL after ``grace``)."""
        with self._lock:
            self._stopped = True
            children, self._children = list(self._children.values()), {}
            links = {child.link for child in children if child.link is not None} | self._running
            if self._sweeper is not None:
                self._sweeper.cancel()
        for child in children:
            child.bus.close()
        stoppers = [threading.Thread(target=link.stop_now, args=(grace,), daemon=True) for link in links]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join(grace + 2.0)

    # -- inside ----------------------------------------------------------------------------

    def _open(self, key: _ChildKey, headers: Mapping[str, str] | None) -> ChildLink:
        """The bus's opener: make room under the cap, then start the child."""
        with self._lock:
            if self._stopped:
                raise BackendUnavailable(key[0], f"backend {key[0]!r} was stopped")
            child = self._children.get(key)
            if child is None:
                raise BackendUnavailable(key[0], f"backend {key[0]!r} was released")
            place, evicted = self._make_room(child)
            child.starting, child.waits_for = True, place
        link = None
        try:
            if evicted:
                logger.info("backend %r: stopped the least recently used per-user process (pid %d) to make room "
                            "(operational.maxProcesses %d)", place.bus.backend, place.pid, self._max)
            if place is not None:
                place.close()  # (a no-op when it is stopping already)
                if not place.ended.wait(STOP_GRACE + 2.0):  # its exit first: never one over the cap
                    logger.warning("backend %r: process %d has not exited yet; starting another anyway",
                                   place.bus.backend, place.pid)
            link = self._start(key, child, headers)
        finally:
            with self._lock:
                child.starting, child.waits_for = False, None
                child.link = link
                if link is not None and link.process.returncode is None:  # else its exit was already reported
                    self._running.add(link)
        backend = child.backend
        logger.info("backend %r: started process %d%s", backend.name, link.pid, " for a user" if child.user else "")
        return link

    def _start(self, key: _ChildKey, child: _Child, headers: Mapping[str, str] | None) -> ChildLink:
        backend = child.backend
        env, secrets = self._environment(backend, child.user, headers)
        argv = [_resolved_command(backend), *(_with_user(arg, child.user) for arg in backend.args)]
        cwd = _with_user(backend.cwd, child.user) if backend.cwd else None
        try:
            argv, env = sandbox.launch(backend, argv, env, cwd, child.user)
            process = _spawn(argv, env, cwd)
        except sandbox.SandboxUnavailable as why:
            raise BackendUnavailable(backend.name, f"backend {backend.name!r} could not be started: {why}") from None
        except (OSError, ValueError) as error:
            raise BackendUnavailable(backend.name, f"backend {backend.name!r} could not be started: "
                                                   f"{type(error).__name__}: {getattr(error, 'strerror', '') or ''}"
                                     .rstrip(": ")) from None
        link = ChildLink(child.bus, process, secrets, lambda ended: self._exited(key, ended))
        auth = self._config.outgoing_auth.for_backend(backend.name)
        if auth.token_env is not None and auth.type in ("oauth", "token_exchange"):  # per person, and it changes
            link.carries(_credential(auth, headers or {}), lambda given: _credential(auth, given))
        return link

    def _make_room(self, wanting: _Child) -> tuple[ChildLink | None, bool]:
        """(Under _lock.) Room for one more child: (None, False) when there is some; else
        the process whose place it takes, once that has exited: one already stopping that
        no other start waits for, or else (True) the least recently used per-user child
        with nothing in flight, retired now. Raises ProcessesBusy when none can go."""
        waited = {child.waits_for for child in self._children.values() if child.starting} - {None}
        starting = sum(1 for child in self._children.values()
                       if child.starting and child is not wanting and child.waits_for not in self._running)
        if len(self._running) + starting < self._max:
            return None, False
        for link in self._running:
            if link.stopping and link not in waited:
                return link, False
        linked = sorted((child for child in self._children.values() if child.backend.per_user and child.link is not None),
                        key=lambda child: child.bus.last_used)
        for child in linked:  # least recently used first; a child in use (or being initialized) is kept
            if child.bus.retire_if_idle("stopped to make room for another user's process") is not None:
                link, child.link = child.link, None
                return link, True
        raise ProcessesBusy(wanting.backend.name, f"backend {wanting.backend.name!r} cannot start: all "
                                                  f"{self._max} processes of this worker are busy; retry soon")

    def _environment(self, backend: BackendConfig, user: str | None,
                     headers: Mapping[str, str] | None) -> tuple[dict[str, str], tuple[str, ...]]:
        env = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
        given = {name: _with_user(value, user) for name, value in backend.env.items()}
        env.update(given)
        auth = self._config.outgoing_auth.for_backend(backend.name)
        # Values given under env: are where mcpServers files put API keys: none is logged
        # (short ones, a level or a flag, would redact every word that contains them).
        secrets: tuple[str, ...] = tuple(value for value in given.values() if len(value) >= MIN_REDACTED)
        if auth.token_env is not None:
            credential = _credential(auth, headers or {})
            if credential is None:
                raise BackendUnavailable(backend.name, f"backend {backend.name!r} cannot start without its "
                                                       "credential")
            env[auth.token_env] = credential
            secrets = (*secrets, credential)
        return env, secrets

    def _released(self, key: _ChildKey, view: BusClient) -> None:
        """A channel is done: a perUser child whose last channel went is stopped now."""
        with self._lock:
            child = self._children.get(key)
            if child is None:
                return
            child.views.discard(view)
            if child.views or not child.backend.per_user:
                return
            del self._children[key]
        child.bus.close()
        if child.link is not None:
            child.link.close()

    def _exited(self, key: _ChildKey, link: ChildLink) -> None:
        with self._lock:
            self._running.discard(link)
            child = self._children.get(key)
            if child is not None and child.link is link:
                child.link = None

    def _lost(self, backend: str, why: str) -> None:
        with self._lock:
            self._restarts[backend] = self._restarts.get(backend, 0) + 1

    def _sweep_later(self) -> None:
        """(Under _lock.) Look for idle shared children soon, unless already due."""
        if self._sweeper is None and not self._stopped:
            self._sweeper = call_later(IDLE_SWEEP, self._sweep)

    def _sweep(self) -> None:
        now = time.monotonic()
        stopping: list[ChildLink] = []
        with self._lock:
            self._sweeper = None
            for child in self._children.values():
                link = child.link
                if link is not None and not child.backend.per_user \
                        and now - child.bus.last_used >= self._idle_timeout \
                        and child.bus.retire_if_idle(f"process {link.pid} idle for {self._idle_timeout:.0f}s; "
                                                     "stopping it") is not None:
                    child.link = None
                    stopping.append(link)
            if self._children:
                self._sweep_later()
        for link in stopping:
            link.close()


def _shared_opening(client_capabilities: Mapping[str, Any] | None) -> dict[str, Any]:
    """A shared child's initialize: told every capability the gateway relays, since any
    user may be the one it asks (a request nobody in its call can answer is refused)."""
    from vmcp_actors.backends._channel import CLIENT_INFO, LATEST_PROTOCOL_VERSION  # noqa: PLC0415 - no cycle at import
    capabilities = dict(client_capabilities) if client_capabilities else {
        "sampling": {}, "elicitation": {"form": {}, "url": {}}, "roots": {"listChanged": True}}
    return {"protocolVersion": LATEST_PROTOCOL_VERSION, "capabilities": capabilities, "clientInfo": CLIENT_INFO}


def _credential(auth: BackendAuthConfig, headers: Mapping[str, str]) -> str | None:
    """The value a process's tokenEnv carries: the injected header's value, or the
    exchanged token (without its ``Bearer`` scheme)."""
    lowered = {name.lower(): value for name, value in headers.items()}
    if auth.type == "header_injection" and auth.header_injection is not None:
        return lowered.get(auth.header_injection.header_name.lower())
    value = lowered.get("authorization")
    if value is not None and value[:7].lower() == "bearer ":
        return value[7:]
    return value


def _with_user(text: str, user: str | None) -> str:
    return text.replace(USER_PLACEHOLDER, user) if user is not None else text


def _resolved_command(backend: BackendConfig) -> str:
    """The command as given when it is a path, else looked up on the child's PATH."""
    command = backend.command or ""
    if os.sep in command:
        return command
    found = shutil.which(command, path=os.environ.get("PATH"))
    if found is None:
        raise BackendUnavailable(backend.name, f"backend {backend.name!r}: command {command!r} is not on PATH")
    return found

