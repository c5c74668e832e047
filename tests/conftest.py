"""Shared fixtures: every test stops the actors and servers it starts."""

from __future__ import annotations

import os

import pykka
import pytest

from tests.gateway import QuickStopGatewayServer
from vmcp_actors.concurrency import CHECK_STORE_CALLS_ENV, check_store_calls

# Every test: a store call on an actor's message loop raises StoreOnActorLoop (in this
# process, and in the gateway processes tests start).
os.environ[CHECK_STORE_CALLS_ENV] = "1"
check_store_calls(True)


@pytest.fixture(autouse=True)
def stop_all_actors():
    yield
    pykka.ActorRegistry.stop_all(block=True, timeout=5)


@pytest.fixture
def start_gateway():
    """Factory: start the gateway on a real HTTP server for a config mapping; stopped after the test
    (a server that notices shutdown in milliseconds: many tests start one)."""
    started: list[QuickStopGatewayServer] = []

    def start(config: dict, **kwargs) -> QuickStopGatewayServer:
        server = QuickStopGatewayServer(config, **kwargs).start()
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.stop()


@pytest.fixture
def redis_server():
    """A real redis-server on a free loopback port (installed by scripts/install-redis)."""
    import shutil

    from tests.redis_server import RedisServer

    if shutil.which("redis-server") is None and not os.path.exists("/usr/bin/redis-server"):
        pytest.fail("redis-server is not installed: run scripts/install-redis (the README's test set-up does)")
    server = RedisServer().start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def everything():
    """server-everything (the TypeScript reference server) on a loopback port, per module
    (installed by scripts/install-node-mcp: skips without it, fails under CI)."""
    from tests import node_mcp

    node_mcp.need_node_mcp()
    server = node_mcp.EverythingServer()
    yield server
    server.stop()
