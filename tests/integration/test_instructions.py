"""A backend's instructions reach the client through the gateway (never worse than a direct
connection): one backend's text as it is, several under a heading each (by name), in initialize
(2025) and in server/discover (2026-07-28)."""

from __future__ import annotations

import asyncio
import socket

import mcp
import pytest

from tests.backends import sdk_backend
from tests.gateway import backend_entry

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def instructions_seen(url: str, mode: str) -> str | None:
    async def main() -> str | None:
        async with mcp.Client(url, mode=mode) as client:
            return client.instructions

    return asyncio.run(main())


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_one_backends_instructions_are_passed_on_as_they_are(start_gateway, mode):
    with sdk_backend("alpha", ["echo"]) as alpha:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("alpha", alpha)]})
        direct = instructions_seen(alpha.url + "/mcp", mode)
        assert direct == "test backend alpha"
        assert instructions_seen(gateway.url, mode) == direct


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_several_backends_instructions_come_under_their_names(start_gateway, mode):
    with sdk_backend("alpha", ["echo"]) as alpha, sdk_backend("beta", ["echo"]) as beta:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("beta", beta), backend_entry("alpha", alpha)]})
        assert instructions_seen(gateway.url, mode) == (
            "## alpha\n\ntest backend alpha\n\n## beta\n\ntest backend beta")


def test_a_backend_that_cannot_be_reached_leaves_initialize_answered(start_gateway):
    with socket.create_server(("127.0.0.1", 0)) as taken:  # bound, never accepting: refused
        unused_port = taken.getsockname()[1]
    with sdk_backend("alpha", ["echo"]) as alpha:
        gateway = start_gateway({"name": "t", "backends": [
            backend_entry("alpha", alpha), {"name": "gone", "url": f"http://127.0.0.1:{unused_port}/mcp"}]})
        assert instructions_seen(gateway.url, "legacy") == "test backend alpha"
