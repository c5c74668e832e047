"""The per-app objects the views share: the gateway actor and what the app was started with."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import pykka
from flask import Flask, current_app

from vmcp_actors.backends import build_outgoing_auth
from vmcp_actors.config import VmcpConfig, config_warnings
from vmcp_actors.gateway import Gateway, SessionDirectory
from vmcp_actors.sessions import DiscoveryCache, SessionServices
from vmcp_actors.web._auth import Authenticator, build_authenticator

logger = logging.getLogger(__name__)

EXTENSION_KEY = "vmcp_actors"


@dataclass(frozen=True)
class Runtime:
    config: VmcpConfig
    gateway: Any  # ActorProxy[Gateway]
    sessions: SessionDirectory  # read by web threads on every request
    authenticator: Authenticator
    admin_token: str | None = field(repr=False)
    allowed_hosts: frozenset[str]
    any_host: bool

    def stop(self, timeout: float = 5.0) -> None:
        try:
            self.gateway.actor_ref.stop(block=True, timeout=timeout)
        except (pykka.ActorDeadError, pykka.Timeout):
            pass


def start_runtime(config: VmcpConfig, bind_host: str) -> Runtime:
    for warning in config_warnings(config):
        logger.warning("config: %s", warning)
    # Every secret the config names is read now; unset ones stop the start with their paths.
    outgoing_auth = build_outgoing_auth(config)
    admin_token = os.environ[config.admin.token_env] if config.admin.token_env else None
    extra_hosts = {h.lower() for h in config.operational.allowed_hosts}
    allowed = {"localhost", "127.0.0.1", "::1"} | extra_hosts
    if bind_host not in ("0.0.0.0", "::", ""):
        allowed.add(bind_host.lower().strip("[]"))
    elif not extra_hosts:
        logger.warning(
            "listening on all interfaces but operational.allowedHosts is empty: only localhost Host headers are accepted"
        )
    sessions = SessionDirectory(time.monotonic)
    services = SessionServices(outgoing_auth, DiscoveryCache(config.operational.discovery_cache_ttl))
    gateway = Gateway.start(config, sessions, services).proxy()
    authenticator = build_authenticator(config.incoming_auth.oidc if config.incoming_auth.type == "oidc" else None)
    return Runtime(config, gateway, sessions, authenticator, admin_token, frozenset(allowed - {"*"}),
                   "*" in extra_hosts)


def current_runtime() -> Runtime:
    return current_app.extensions[EXTENSION_KEY]


def install(app: Flask, runtime: Runtime) -> None:
    app.extensions[EXTENSION_KEY] = runtime
