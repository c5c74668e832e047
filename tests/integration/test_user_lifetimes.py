"""How long a user lives when both eras use it: a 2025 session ending never ends a user
that 2026-07-28 requests (no session) are using. Real official-SDK backend and clients."""

from __future__ import annotations

import asyncio
import threading

import anyio
import mcp

from tests.backends import sdk_backend
from tests.gateway import backend_entry, run_client


async def _default_mode(url: str, work) -> None:
    async with mcp.Client(url) as client:  # the default mode: 2026-07-28, no session
        await work(client)


PREFIX = {"conflictResolution": "prefix", "conflictResolutionConfig": {"prefixFormat": "{workload}_"}}


class _SessionsEnded:
    """How many legacy sessions ended, and an official-SDK tool, ``overlap``, that answers only
    once ``at_least`` of them ended while it ran (or after 20 s, with 'no session ended')."""

    def __init__(self, at_least: int) -> None:
        self.at_least = at_least
        self.count = 0
        self._lock = threading.Lock()

    def one_more(self) -> None:
        with self._lock:
            self.count += 1

    async def overlap(self) -> str:
        """Answer once legacy sessions of the same user ended during the call."""
        start = self.count
        with anyio.move_on_after(20):
            while self.count < start + self.at_least:
                await anyio.sleep(0.01)
            return "overlapped"
        return "no session ended"


def test_ending_legacy_sessions_does_not_break_sessionless_calls_of_the_same_user(start_gateway):
    """Every anonymous caller is one user. While 2026-07-28 clients call a tool on a
    legacy-only backend, 2025 clients open a session, call and end it; each sessionless call
    lasts until two such sessions ended, and they all answer (the user is not ended under them)."""
    ended = _SessionsEnded(at_least=2)
    with sdk_backend("slow", ["echo"], extra_tools=[ended.overlap]) as slow:
        gateway = start_gateway({"name": "gw", "backends": [backend_entry("slow", slow, "legacy")],
                                 "aggregation": PREFIX})
        failures: list[str] = []
        answered: list[str] = []
        stop = threading.Event()

        async def modern_calls(client: mcp.Client) -> None:
            for _ in range(4):
                result = await client.call_tool("slow_overlap", {})
                if result.is_error or result.content[0].text != "overlapped":
                    failures.append(str(result))
                else:
                    answered.append("overlapped")

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
                ended.one_more()

        moderns = [threading.Thread(target=modern_client) for _ in range(3)]
        legacy = threading.Thread(target=legacy_clients)
        for thread in moderns:
            thread.start()
        legacy.start()
        for thread in moderns:
            thread.join(timeout=120)
        stop.set()
        legacy.join(timeout=30)
        assert failures == []
        assert len(answered) == 12
