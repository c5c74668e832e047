"""The per-app objects the views share: the gateway actor and what the app was started with."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import pykka
from flask import Flask, current_app

from vmcp_actors.config import VmcpConfig
from vmcp_actors.exceptions import ConfigError
from vmcp_actors.gateway import Gateway, SessionDirectory

logger = logging.getLogger(__name__)

EXTENSION_KEY = "vmcp_actors"


@dataclass(frozen=True)
class Runtime:
    config: VmcpConfig
    gateway: Any  # ActorProxy[Gateway]
    sessions: SessionDirectory  # read by web threads on every request
    admin_token: str | None
    allowed_hosts: frozenset[str]
    any_host: bool

    def stop(self, timeout: float = 5.0) -> None:
        try:
            self.gateway.actor_ref.stop(block=True, timeout=timeout)
        except (pykka.ActorDeadError, pykka.Timeout):
            pass


def start_runtime(config: VmcpConfig, bind_host: str) -> Runtime:
    admin_token = _admin_token(config)
    extra_hosts = {h.lower() for h in config.operational.allowed_hosts}
    allowed = {"localhost", "127.0.0.1", "::1"} | extra_hosts
    if bind_host not in ("0.0.0.0", "::", ""):
        allowed.add(bind_host.lower().strip("[]"))
    elif not extra_hosts:
        logger.warning(
            "listening on all interfaces but operational.allowedHosts is empty: only localhost Host headers are accepted"
        )
    sessions = SessionDirectory(time.monotonic)
    gateway = Gateway.start(config, sessions).proxy()
    return Runtime(config, gateway, sessions, admin_token, frozenset(allowed - {"*"}), "*" in extra_hosts)


def current_runtime() -> Runtime:
    return current_app.extensions[EXTENSION_KEY]


def install(app: Flask, runtime: Runtime) -> None:
    app.extensions[EXTENSION_KEY] = runtime


def _admin_token(config: VmcpConfig) -> str | None:
    name = config.admin.token_env
    if name is None:
        return None
    value = os.environ.get(name, "")
    if not value:
        raise ConfigError([f"admin.tokenEnv: environment variable {name} is not set or empty"])
    return value
