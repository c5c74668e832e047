"""How long a user lives when both eras use it: a 2025 session ending never ends a user
that 2026-07-28 requests (no session) are using. Real official-SDK backend and clients."""

from __future__ import annotations

import asyncio
import threading

import mcp

from tests.backends import sdk_backend
from tests.gateway import backend_entry, run_client


async def _default_mode(url: str, work) -> None:
    async with mcp.Client(url) as client:  # the default mode: 2026-07-28, no session
        await work(client)


PREFIX = {"conflictResolution": "prefix", "conflictResolutionConfig": {"prefixFormat": "{workload}_"}}


def test_ending_legacy_sessions_does_not_break_sessionless_calls_of_the_same_user(start_gateway):
    """Every anonymous caller is one user. While 2026-07-28 clients call a slow tool on a
    legacy-only backend, 2025 clients open a session, call and end it; the sessionless
    calls all answer (the user is not ended under them)."""
    with sdk_backend("slow", ["sleep", "echo"]) as slow:
        gateway = start_gateway({"name": "gw", "backends": [backend_entry("slow", slow, "legacy")],
                                 "aggregation": PREFIX})
        failures: list[str] = []
        answered: list[str] = []
        stop = threading.Event()

        async def modern_calls(client: mcp.Client) -> None:
            for _ in range(4):
                result = await client.call_tool("slow_sleep", {"seconds": 0.6})
                if result.is_error or result.content[0].text != "slept":
                    failures.append(str(result))
                else:
                    answered.append("slept")

        async def legacy_session(client: mcp.Client) -> None:
            result = await client.call_tool("slow_echo", {"text": "x"})
            assert result.content[0].text == "slow:x"

        def modern_client() -> None:
            try:
                asyncio.run(_default_mode(gateway.url, modern_calls))
            except Exception as error:  # noqa: BLE001 - reported below
                failures.append(repr(error))

        def legacy_clients() -> None:
            while not stop.is_set():  # each one opens a session, calls and DELETEs it
                try:
                    run_client(gateway.url, legacy_session)
                except Exception as error:  # noqa: BLE001 - reported below
                    failures.append(f"legacy: {error!r}")
                    return

        moderns = [threading.Thread(target=modern_client) for _ in range(3)]
        legacy = threading.Thread(target=legacy_clients)
        for thread in moderns:
            thread.start()
        legacy.start()
        for thread in moderns:
            thread.join(timeout=60)
        stop.set()
        legacy.join(timeout=30)
        assert failures == []
        assert len(answered) == 12
