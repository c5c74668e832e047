"""Where a stdio child runs: in a bubblewrap sandbox (``bwrap``, Debian's ``bubblewrap``),
or, with ``sandbox.mode: none``, as the gateway's own user seeing what it sees.

In the sandbox (``launch``) a child gets:

* user, PID, IPC, UTS and cgroup namespaces of its own and no capabilities: it sees no
  other process (the gateway's, another user's child), so neither their environment nor
  their memory;
* the filesystem read-only, a private empty ``/tmp`` (its ``HOME`` is ``/tmp/home``
  unless its ``env`` names one), its own ``/proc`` and a minimal ``/dev``;
* writable: the directories its args and env values name (absolute paths: what a server
  is given to work in, as a desktop client gives server-filesystem its directories), the
  directory of a file an env value names (a server's data file, rewritten through a
  temporary file beside it), its ``{user}`` paths and ``sandbox.writable``; its command's
  installation, the gateway's own code, the files its args name and its cwd stay visible
  (read-only) even under ``/tmp``;
* unseen (an empty directory, or a file that cannot be opened, in their place): the config
  files the gateway read (they hold other backends' keys), ``/run`` and ``/var/run``
  (sockets), the usual credential files under the gateway's ``HOME`` (``HIDDEN_IN_HOME``)
  and ``sandbox.hidden``;
* for a path with ``{user}`` (in args, env values, cwd, ``writable``): the directory that
  holds the ``{user}`` part shows only this user's entry (``_Mounts.own_entry``): no user
  sees another's files;
* with ``network: false``, a network namespace of its own (loopback only).

Every child is started without ``preexec_fn`` (running Python between fork and exec in a
threaded process can deadlock): the kernel's parent-death signal is set by bwrap
(``--die-with-parent``) or, unsandboxed, by ``setpriv --pdeathsig KILL`` (util-linux).
"""

from __future__ import annotations

import functools
import logging
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import PurePosixPath

from vmcp_actors.config import BackendConfig, VmcpConfig, config_files_read
from vmcp_actors.config._model import USER_PLACEHOLDER

logger = logging.getLogger(__name__)

BWRAP = "bwrap"
SETPRIV = "setpriv"
SANDBOX_HOME = "/tmp/home"
# Credentials the gateway's user may keep under its HOME: never shown to a child.
HIDDEN_IN_HOME = (".ssh", ".gnupg", ".aws", ".azure", ".config/gcloud", ".config/gh", ".kube", ".docker",
                  ".netrc", ".npmrc", ".pypirc", ".git-credentials", ".pgpass", ".vault-token")
HIDDEN_ALWAYS = ("/run", "/var/run")  # sockets (Docker, D-Bus, databases) a child must not reach
SEEN_AGAIN = ("/run/systemd/resolve",)
# Never writable because args or env name them (``/dev/null``, ``/``): only ``writable`` grants these.
NEVER_GRANTED = frozenset({"/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/opt", "/proc", "/run",
                           "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/tmp", "/home", "/root"})  # under a hidden path, but what /etc/resolv.conf may point at
SHADOW_DIRECTORY = ".vmcp-sandbox"  # where each user's {user} files are kept, a directory per user
PROBE_TIMEOUT = 10.0  # seconds the one trial run of bwrap may take


class SandboxUnavailable(Exception):
    """bubblewrap is not installed, or cannot make a sandbox on this machine."""


def problems(config: VmcpConfig) -> list[str]:
    """One ``backends[i].sandbox.mode: why`` line per sandboxed stdio backend that cannot
    run here, and one for code mode's workers (empty when every one can): the gateway
    refuses to start instead."""
    sandboxed = [index for index, backend in enumerate(config.backends)
                 if backend.is_process and backend.sandbox.enabled]
    scripts = config.code_mode.enabled and config.code_mode.worker_isolation == "bubblewrap"
    if not sandboxed and not scripts:
        return []
    try:
        bubblewrap_works()
    except SandboxUnavailable as why:
        found = [f"backends[{index}].sandbox.mode: {why}; install it (Debian: apt-get install bubblewrap), or "
                 f"set sandbox.mode: none to run {config.backends[index].name!r} unsandboxed" for index in sandboxed]
        if scripts:
            found.append(f"codeMode.workerIsolation: {why}; install it (Debian: apt-get install bubblewrap), or set "
                         "codeMode.workerIsolation: none to run the script sandbox's workers as the gateway's user")
        return found
    return []


@functools.cache
def bubblewrap_works() -> str:
    """bwrap's path, once it has made one sandbox here; else SandboxUnavailable."""
    found = shutil.which(BWRAP)
    if found is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed")
    try:
        trial = subprocess.run([found, *_isolation(network=True), "--ro-bind", "/", "/", "--proc", "/proc",
                                "--dev", "/dev", "true"], capture_output=True, timeout=PROBE_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SandboxUnavailable(f"bubblewrap cannot run: {type(error).__name__}") from None
    if trial.returncode != 0:
        said = trial.stderr.decode("utf-8", "replace").strip().splitlines()
        raise SandboxUnavailable(f"bubblewrap cannot make a sandbox here ({said[-1] if said else 'no reason given'})")
    return found


def launch(backend: BackendConfig, argv: list[str], env: dict[str, str], cwd: str | None,
           user: str | None) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start ``argv`` as ``backend``'s sandbox says, with the
    parent-death signal set by the launcher (never by ``preexec_fn``)."""
    if not backend.sandbox.enabled:
        setpriv = shutil.which(SETPRIV)
        if setpriv is None:  # without util-linux: the child is stopped at shutdown only
            return argv, env
        return [setpriv, "--pdeathsig", "KILL", "--", *argv], env
    bwrap = bubblewrap_works()
    env = dict(env)
    if "HOME" not in backend.env:
        env["HOME"] = SANDBOX_HOME
    mounts = _Mounts()
    for path in _hidden(backend):
        mounts.hide(path)
    templates = [text for text in (*backend.args, *backend.env.values(), backend.cwd or "", *backend.sandbox.writable)
                 if text.startswith("/") and USER_PLACEHOLDER in text]
    for template in templates:
        mounts.own_entry(template, user)
    for path in backend.sandbox.writable:
        if USER_PLACEHOLDER not in path:
            os.makedirs(path, exist_ok=True)
            mounts.writable(path)
    # What config names as it is ({user} paths are the user's own entries above, and no more).
    named_args = [arg for arg, template in zip(argv[1:], backend.args) if USER_PLACEHOLDER not in template]
    given = [env[name] for name, template in backend.env.items()
             if USER_PLACEHOLDER not in template and env.get(name, "").startswith("/")]
    for path in (*named_args, *given):
        if path.startswith("/") and os.path.isdir(path) and os.path.realpath(path) not in NEVER_GRANTED:
            mounts.writable(path)
    for path in given:  # a file env names is data the server keeps: its directory, for a safe rewrite
        directory = os.path.dirname(path)
        if (os.path.isfile(path) or not os.path.lexists(path)) and os.path.isdir(directory) \
                and os.path.realpath(directory) not in NEVER_GRANTED:
            mounts.writable(directory)
    for path in (*_installation(argv[0]), *_gateways_own(), *named_args, cwd or ""):
        if path.startswith("/") and os.path.exists(path):
            mounts.visible(path)
    launcher = [bwrap, *_isolation(backend.sandbox.network), "--die-with-parent", *mounts.arguments()]
    if cwd is not None:
        launcher += ["--chdir", cwd]
    return [*launcher, "--", *argv], env


def _installation(command: str) -> list[str]:
    """What a command needs to run, wherever it is installed (under /tmp, say): the prefix
    it lives in (``<prefix>/bin/<command>``: a virtualenv, a Node package), as it is named
    and where its links lead, else its directory."""
    places = []
    for path in dict.fromkeys((os.path.abspath(command), os.path.realpath(command))):
        directory = os.path.dirname(path)
        places.append(os.path.dirname(directory) if os.path.basename(directory) == "bin" else directory)
    return places


@functools.cache
def _gateways_own() -> tuple[str, ...]:
    """The gateway's own code and environment (read-only): a child may be the gateway's
    Python running one of its modules (the demo's clock), and none of it is secret."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../vmcp_actors/..
    return tuple(dict.fromkeys((sys.prefix, os.path.dirname(package_root))))


def script_worker_launcher(binary: str, directory: str) -> str:
    """An executable in ``directory`` (private to the gateway) that starts ``binary``, a
    script sandbox worker, in bubblewrap: namespaces of its own, no network, no
    capabilities, nothing of the filesystem but its binary, the system libraries, the time
    zones and a private ``/tmp`` (the worker pool runs it with the worker's arguments)."""
    bwrap = bubblewrap_works()
    mounts = ["--ro-bind", binary, "/monty"]
    for system in ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/share/zoneinfo"):
        mounts += ["--ro-bind-try", system, system]
    # No --die-with-parent: its signal comes when the *thread* that started the worker ends
    # (a script's, while the pool lives on); a worker ends when its pipes close instead.
    command = [bwrap, *_isolation(network=False), "--unshare-all", "--new-session",
               "--clearenv", *mounts, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/",
               "/monty"]
    launcher = os.path.join(directory, "monty-worker")
    with open(launcher, "w", encoding="utf-8") as script:
        script.write("#!/bin/sh\nexec " + " ".join(shlex.quote(part) for part in command) + ' "$@"\n')
    os.chmod(launcher, 0o700)
    return launcher


def _isolation(network: bool) -> list[str]:
    namespaces = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not network:
        namespaces.append("--unshare-net")
    return [*namespaces, "--cap-drop", "ALL"]


def _hidden(backend: BackendConfig) -> Iterable[str]:
    yield from HIDDEN_ALWAYS
    yield from sorted(config_files_read())
    home = os.environ.get("HOME")
    if home and home.startswith("/"):
        yield from (os.path.join(home, entry) for entry in HIDDEN_IN_HOME)
    yield from backend.sandbox.hidden


class _Mounts:
    """bwrap's mount arguments, in an order where a deeper path's mount comes after the
    mounts above it (bwrap applies them in order: a later one covers an earlier one)."""

    def __init__(self) -> None:
        self._covers: dict[str, list[str]] = {"/tmp": ["--tmpfs", "/tmp"]}  # path -> the mount covering it
        self._hidden: set[str] = set()  # covered paths nothing visible by default may show again
        self._binds: dict[str, str] = {}  # path -> --bind (writable) or --ro-bind (visible)

    def hide(self, path: str) -> None:
        path = os.path.realpath(path)  # a symlink (/var/run -> /run) is hidden where it leads
        if path == "/" or not os.path.exists(path):
            return
        self._covers[path] = ["--tmpfs", path] if os.path.isdir(path) else ["--ro-bind", "/dev/null", path]
        self._hidden.add(path)

    def own_entry(self, template: str, user: str | None) -> None:
        """The directory holding ``{user}`` shows only this user's entry. A directory
        (``/data/{user}/...``, ``/data/{user}``) is created when missing and shown alone; a
        file (a name with a dot: ``/data/{user}.json``) lives in a directory of the user's own,
        ``/data/.vmcp-sandbox/<user>/``, shown as ``/data``, so that a server can write it
        the safe way (a temporary file beside it, renamed over it); ``/data/<user>.json``
        is a symbolic link to it."""
        if user is None:
            return
        parts = PurePosixPath(os.path.normpath(template)).parts
        at = next(index for index, part in enumerate(parts) if USER_PLACEHOLDER in part)
        holder = os.path.realpath(str(PurePosixPath(*parts[:at])))
        if holder == "/":
            return
        own = os.path.join(holder, parts[at].replace(USER_PLACEHOLDER, user))
        if at < len(parts) - 1 or os.path.isdir(own) or "." not in parts[at]:
            os.makedirs(own, exist_ok=True)
            self._covers.setdefault(holder, ["--tmpfs", holder])
            self._binds[os.path.realpath(own)] = "--bind"
            return
        shadow = os.path.join(holder, SHADOW_DIRECTORY, user)
        os.makedirs(shadow, exist_ok=True)
        kept = os.path.join(shadow, os.path.basename(own))
        if os.path.isfile(own) and not os.path.islink(own) and not os.path.lexists(kept):
            os.replace(own, kept)  # written before it was sandboxed
        if not os.path.lexists(own):  # the configured path still leads to it, for the operator's tools
            os.symlink(os.path.relpath(kept, holder), own)
        self._covers[holder] = ["--bind", shadow, holder]

    def writable(self, path: str) -> None:
        self._binds[os.path.realpath(path)] = "--bind"

    def visible(self, path: str) -> None:
        self._binds.setdefault(os.path.realpath(path), "--ro-bind")

    def arguments(self) -> list[str]:
        """Each mount after those above it, so a deeper one is never covered by a shallower
        one: a config file hidden inside a visible checkout, a user's entry in its hidden
        directory, a hidden path inside a writable one."""
        binds = {path: kind for path, kind in self._binds.items()
                 if kind == "--bind" or (not any(_under(path, hidden) for hidden in self._hidden)  # hidden on purpose
                                         and any(_under(path, covered) for covered in self._covers))}  # else: seen
        mounts: list[tuple[tuple[int, str], int, list[str]]] = []
        emptied: list[str] = []  # directories covered by a tmpfs: made read-only once the rest is in place
        for path, cover in self._covers.items():
            if path != "/tmp" and _under(path, "/tmp") and cover[0] != "--bind" \
                    and not any(_under(path, bound) or _under(bound, path) for bound in binds):
                continue  # a hiding cover of what the child's own /tmp does not have anyway
            mounts.append((_depth(path), 0, cover))
            if cover[0] == "--tmpfs" and path != "/tmp":
                emptied.append(path)
        mounts.append((_depth(SANDBOX_HOME), 0, ["--dir", SANDBOX_HOME]))
        for path in SEEN_AGAIN:
            if os.path.isdir(path) and any(_under(path, hidden) for hidden in self._hidden):
                mounts.append((_depth(path), 1, ["--ro-bind", path, path]))
        mounts += [(_depth(path), 1, [kind, path, path]) for path, kind in binds.items()]
        ordered: list[str] = ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
        for _depth_of, _kind, words in sorted(mounts, key=lambda mount: (mount[0][0], mount[1], mount[0][1])):
            ordered += words
        for path in sorted(emptied, key=_depth):  # what covers a path shows nothing new, and takes nothing
            ordered += ["--remount-ro", path]
        return ordered


def _depth(path: str) -> tuple[int, str]:
    return path.count("/"), path


def _under(path: str, above: str) -> bool:
    return path == above or path.startswith(above.rstrip("/") + "/")

