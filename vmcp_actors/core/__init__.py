"""The gateway as a library: the capability interface, its value types, build and serve.

An embedder builds a core from a config, wraps it in decorators of its own and serves it,
the same way ``vmcp-actors serve`` does (docs/library.md walks through an example)::

    from vmcp_actors.core import Layer, build, serve

    class NoWrites(Layer):
        def lookup_tool(self, identity, name, deadline):
            route = self.inner.lookup_tool(identity, name, deadline)
            return route if route is not None and not name.endswith("_delete") else None
        ...

    serve(build("config.yaml").decorated(NoWrites), port=4483)

**The interface** (``UserCore``): ``list_*`` / ``lookup_*`` / call for tools, resources,
resource templates and prompts, ``describe_tool`` (one tool's definition as ``list_tools``
lists it, None when not listed), ``complete``, ``explain_tool`` and ``close``. The caller's
``Identity`` is always an explicit argument (``None``: anonymous) and so is the request's
``Deadline``; nothing is read from ambient state. Calls return an ``Exchange``: an iterator
of events (progress, a request for the client) that returns the result dict; a decorator
passes it along untouched, or answers itself with ``answered(result)``. Errors for the
client are ``JsonRpcError``.

**Decorators subtract.** A ``Layer`` holds the core below it (``self.inner``) and by
default passes everything through; override what you change. Each layer an embedder adds
is held to the rule: a client never sees a tool, resource or prompt the layer below did
not list (nor an edited definition of one), and no call reaches the layer unless the layer
below would take it. The core's composite tools and the optimizer's ``find_tool`` and
``call_tool`` are the only additions.

**Where layers go**, outermost first: optimizer -> the embedder's layers (the last added
outermost) -> Cedar authz -> advertising filter -> composite tools -> aggregated backends.
Each user (caller) has a stack of their own: a factory passed to ``decorated`` is called
once per user with that user's core, and its instance serves only that user.

Nothing here exposes an actor, a thread or a Flask object.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vmcp_actors.concurrency import Deadline
from vmcp_actors.config import VmcpConfig, config_from_mapping, load_config
from vmcp_actors.core._catalog import Route
from vmcp_actors.core._exchange import Exchange, Notification, ServerRequest, answered
from vmcp_actors.core._explain import (
    ABSENT,
    ADDS,
    HIDES,
    OFFERS,
    PASSES,
    UNLISTS,
    USES,
    Explanation,
    Finding,
)
from vmcp_actors.core._interface import Continuation, CoreLayer, LayerFactory, UserCore
from vmcp_actors.core._shared_names import Clash
from vmcp_actors.identity import Identity
from vmcp_actors.metrics import METRICS_DIR_ENV
from vmcp_actors.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    RESOURCE_NOT_FOUND,
    JsonRpcError,
)

# The interface's former name, kept for embedders' code written against it.
Capabilities = UserCore

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4483
EXPLAIN_TIMEOUT = 30.0


class Layer(CoreLayer):
    """Base of a decorator: everything passes through to ``inner`` until overridden."""

    @property
    def inner(self) -> UserCore:
        return self._inner


@dataclass(frozen=True)
class Core:
    """What ``serve`` runs: a config and the decorators over each user's core."""

    config: VmcpConfig
    layers: tuple[LayerFactory, ...] = ()

    def decorated(self, *factories: LayerFactory) -> Core:
        """This core with ``factories`` on top, in order (the last one outermost)."""
        return replace(self, layers=self.layers + tuple(factories))


def build(config: VmcpConfig | Mapping[str, Any] | str | os.PathLike[str]) -> Core:
    """A core from a config: a ``VmcpConfig``, the mapping a YAML file loads to, or a path.
    A bad config raises ``ConfigError`` (``.errors`` has every problem with its field path)."""
    if isinstance(config, VmcpConfig):
        return Core(config)
    if isinstance(config, Mapping):
        return Core(config_from_mapping(config))
    return Core(load_config(Path(config)))


class SeveralWorkersNeedSharedRecords(ValueError):
    """``workers`` above 1 with records in one process's memory."""


def serve(core: Core, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, workers: int = 1) -> int:
    """Serve ``core`` under gunicorn until SIGTERM or Ctrl-C (what ``vmcp-actors serve`` runs).
    The actors start in each worker process, after gunicorn forks. ``workers`` above 1 needs
    ``sessionStorage.provider: redis``: any worker may get any request of a session."""
    if workers < 1:
        raise ValueError("workers must be at least 1")
    if workers > 1 and core.config.session_storage.provider != "redis":
        raise SeveralWorkersNeedSharedRecords(
            f"{workers} workers need sessions every worker can read: set sessionStorage.provider: redis (with "
            "sessionStorage.address and operational.signingKeyEnv); with the default memory storage each worker "
            "would answer 404 to the sessions of the others")
    from gunicorn.app.base import BaseApplication

    from vmcp_actors.web.gunicorn_settings import SETTINGS

    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    class GatewayApplication(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            for key, value in {**SETTINGS, "bind": bind, "workers": workers,
                               # gunicorn takes whole seconds
                               "graceful_timeout": max(1, math.ceil(core.config.operational.shutdown_grace_period)),
                               }.items():
                self.cfg.set(key, value)

        def load(self) -> Any:
            from vmcp_actors.runtime import start_runtime
            from vmcp_actors.web import create_app

            return create_app(start_runtime(core.config, host, core.layers))

    # Several workers add up their metrics through files in one directory (vmcp_actors.metrics).
    made_metrics_dir = workers > 1 and METRICS_DIR_ENV not in os.environ
    if made_metrics_dir:
        os.environ[METRICS_DIR_ENV] = tempfile.mkdtemp(prefix="vmcp-metrics-")
    try:
        GatewayApplication().run()
    finally:
        if made_metrics_dir:
            shutil.rmtree(os.environ.pop(METRICS_DIR_ENV), ignore_errors=True)
    return 0


class Running:
    """A core served in this process on a background thread (``start``): for tests, and
    for programs that serve alongside other work. ``stop()`` ends it and its actors."""

    def __init__(self, core: Core, host: str, port: int):
        from werkzeug.serving import make_server

        from vmcp_actors.runtime import start_runtime
        from vmcp_actors.web import create_app

        self._app = create_app(start_runtime(core.config, host, core.layers))
        self._server = make_server(host, port, self._app, threaded=True)
        self.host = host
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="vmcp-serve", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/mcp"

    def stop(self) -> None:
        from vmcp_actors.web import stop_app

        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        stop_app(self._app)


def start(core: Core, *, host: str = DEFAULT_HOST, port: int = 0) -> Running:
    """Serve ``core`` on a background thread (port 0: any free port); see ``Running``."""
    return Running(core, host, port)


def explain(core: Core, tool: str, identity: Identity | None = None, *,
            timeout: float = EXPLAIN_TIMEOUT) -> Explanation:
    """Why ``identity`` does or does not see ``tool``: the user's stack is started (its
    backends discovered with that caller's credentials), asked, and stopped again."""
    with _user_served(core, identity, timeout) as (user, deadline):
        return user.core.explain_tool(identity, tool, deadline)


@dataclass(frozen=True)
class Discovery:
    """What discovering a caller's backends found: the names and URIs two or more of them
    claim (and what the gateway does about each), and the backends that did not answer."""

    clashes: tuple[Clash, ...]
    failures: Mapping[str, str]


def discover(core: Core, identity: Identity | None = None, *, timeout: float = EXPLAIN_TIMEOUT) -> Discovery:
    """Discover ``identity``'s backends as a request would (``vmcp-actors validate --discover``)."""
    with _user_served(core, identity, timeout) as (user, deadline):
        catalog = user.backends.catalog(identity, deadline)
        return Discovery(catalog.clashes, dict(catalog.failures))


@contextlib.contextmanager
def _user_served(core: Core, identity: Identity | None, timeout: float) -> Iterator[tuple[Any, Deadline]]:
    """A runtime of its own serving ``identity``'s stack, stopped on leaving."""
    from vmcp_actors.runtime import start_runtime
    from vmcp_actors.users._records import UserKey

    runtime = start_runtime(core.config, DEFAULT_HOST, core.layers)
    try:
        deadline = Deadline.after(timeout)
        key = UserKey.of(identity, {})
        yield runtime.gateway.serve_user(key, identity, {}, runtime.service.store.user(key)).get(timeout=timeout), \
            deadline
    finally:
        runtime.stop()


@contextlib.contextmanager
def demo() -> Iterator[VmcpConfig]:
    """The bundled demo backends (weather, notes) running, and a config over them; they
    stop when the block ends. Needs the ``demo`` extra."""
    from vmcp_actors.demo import (
        demo_config_mapping,
        start_demo_backends,
        stop_demo_backends,
    )

    backends = start_demo_backends()
    try:
        yield config_from_mapping(demo_config_mapping(backends))
    finally:
        stop_demo_backends(backends)


__all__ = [
    "ABSENT",
    "ADDS",
    "Capabilities",
    "Clash",
    "Continuation",
    "Core",
    "Deadline",
    "Discovery",
    "Exchange",
    "Explanation",
    "Finding",
    "HIDES",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "Identity",
    "JsonRpcError",
    "Layer",
    "LayerFactory",
    "Notification",
    "OFFERS",
    "PASSES",
    "RESOURCE_NOT_FOUND",
    "Route",
    "Running",
    "SeveralWorkersNeedSharedRecords",
    "ServerRequest",
    "UNLISTS",
    "USES",
    "UserCore",
    "VmcpConfig",
    "answered",
    "build",
    "demo",
    "discover",
    "explain",
    "serve",
    "start",
]
