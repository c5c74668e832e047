"""A backend's instructions reach the client through the gateway (never worse than a direct
connection): one backend's text as it is, several under a heading each (by name), in
initialize (2025) and in server/discover (2026-07-28). Opening a session contacts no
backend, so they are what the backends said at their last handshake: a gateway that has
not met a backend yet does not know them."""

from __future__ import annotations

import asyncio
import socket

import mcp
import pytest

from tests.backends import sdk_backend
from tests.gateway import backend_entry

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def instructions_seen(url: str, mode: str, list_tools: bool = False) -> str | None:
    async def main() -> str | None:
        async with mcp.Client(url, mode=mode) as client:
            if list_tools:
                await client.list_tools()
            return client.instructions

    return asyncio.run(main())


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_one_backends_instructions_are_passed_on_as_they_are(start_gateway, mode):
    with sdk_backend("alpha", ["echo"]) as alpha:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("alpha", alpha)]})
        direct = instructions_seen(alpha.url + "/mcp", mode)
        assert direct == "test backend alpha"
        assert instructions_seen(gateway.url, mode, list_tools=True) is None, "no backend was met yet"
        assert instructions_seen(gateway.url, mode) == direct


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_several_backends_instructions_come_under_their_names(start_gateway, mode):
    with sdk_backend("alpha", ["echo"]) as alpha, sdk_backend("beta", ["echo"]) as beta:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("beta", beta), backend_entry("alpha", alpha)]})
        instructions_seen(gateway.url, mode, list_tools=True)
        assert instructions_seen(gateway.url, mode) == (
            "## alpha\n\ntest backend alpha\n\n## beta\n\ntest backend beta")


def test_a_backend_that_cannot_be_reached_leaves_the_others_instructions(start_gateway):
    with socket.create_server(("127.0.0.1", 0)) as taken:  # bound, never accepting: refused
        unused_port = taken.getsockname()[1]
    with sdk_backend("alpha", ["echo"]) as alpha:
        gateway = start_gateway({"name": "t", "backends": [
            backend_entry("alpha", alpha), {"name": "gone", "url": f"http://127.0.0.1:{unused_port}/mcp"}]})
        instructions_seen(gateway.url, "legacy", list_tools=True)
        assert instructions_seen(gateway.url, "legacy") == "test backend alpha"


def test_another_process_with_shared_records_knows_them(start_gateway, redis_server, monkeypatch):
    monkeypatch.setenv("INSTRUCTIONS_SIGNING_KEY", "instructions-signing-key-0123456789abcdef")
    with sdk_backend("alpha", ["echo"]) as alpha:
        config = {"name": "t", "backends": [backend_entry("alpha", alpha)],
                  "operational": {"signingKeyEnv": "INSTRUCTIONS_SIGNING_KEY"},
                  "sessionStorage": {"provider": "redis", "address": redis_server.address}}
        first, second = start_gateway(config), start_gateway(config)
        instructions_seen(first.url, "legacy", list_tools=True)
        assert instructions_seen(second.url, "auto") == "test backend alpha"


def test_the_shared_level_is_read_at_most_once_per_backend_while_fresh(redis_server):
    from vmcp_actors.backends._channel import SHARED_INSTRUCTIONS_FRESH, BackendEras
    from vmcp_actors.shared_cache import SharedCache
    from vmcp_actors.signing import Signer
    from vmcp_actors.users._redis_store import RedisRecordStore

    class CountingRedis:
        """The real client, counting the reads an initialize costs."""

        def __init__(self, client):
            self.client, self.gets = client, 0

        def get(self, name):
            self.gets += 1
            return self.client.get(name)

        def __getattr__(self, name):
            return getattr(self.client, name)

    now = [100.0]
    key = Signer(b"instructions-signing-key-0123456789abcdef")
    client = CountingRedis(RedisRecordStore.connect(redis_server.address, 0, None, key, key_prefix="t:",
                                                    session_ttl=60).client)
    shared = SharedCache(client, key, "t:")
    writer, reader = BackendEras(shared=shared), BackendEras(shared=shared, clock=lambda: now[0])
    writer.said("alpha", "from alpha")
    for _ in range(50):  # "beta" said nothing anywhere: that is remembered for a while too
        assert reader.instructions(["alpha", "beta"]) == "from alpha"
    assert client.gets == 2
    writer.said("beta", "from beta")
    now[0] += SHARED_INSTRUCTIONS_FRESH
    assert reader.instructions(["alpha", "beta"]) == "## alpha\n\nfrom alpha\n\n## beta\n\nfrom beta"
    assert client.gets == 4
