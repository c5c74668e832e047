"""The revision probe remembers only refusals (issue 35): a 2026-07-28-only backend whose
``server/discover`` has one bad moment (an internal error) is tried again, not written off
as "speaks no 2026-07-28" for an hour (which, in Redis, would hide it from every worker)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.backends import SdkBackend, build_sdk_server
from tests.asgi_bodies import read_body, replaying
from tests.eras import ModernOnly, _answer, _error, _message
from tests.gateway import backend_entry, wait_until
from tests.task_backends import modern_post
from vmcp_actors.demo._serve import serve_asgi_in_thread

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("ignore::DeprecationWarning")]


class DiscoverFailsOnce:
    """ASGI middleware: the first ``server/discover`` gets a JSON-RPC internal error (HTTP 200)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.failed = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            body = await read_body(receive)
            message = _message(body)
            if message.get("method") == "server/discover" and not self.failed:
                self.failed = True
                await _answer(send, 200, _error(message.get("id"), -32603, "Internal error: warming up"))
                return
            receive = replaying(body, receive)
        await self.app(scope, receive, send)


@pytest.fixture
def flaky_modern_backend():
    backend = SdkBackend("new", build_sdk_server("new", ["echo"], ()))
    app = backend.server.streamable_http_app(stateless_http=True)
    backend._served = serve_asgi_in_thread(DiscoverFailsOnce(ModernOnly(app)), name="new-flaky")
    yield backend
    backend.stop()


def test_one_internal_error_to_server_discover_is_not_remembered_as_a_refusal(start_gateway, flaky_modern_backend):
    gateway = start_gateway({"name": "t", "backends": [backend_entry("new", flaky_modern_backend)]})
    first = modern_post(gateway.url, "tools/list", {}).json()
    assert "error" in first, first  # that one moment: no backend could be discovered

    def listed() -> list[str] | None:
        answer = modern_post(gateway.url, "tools/list", {}).json()
        return [tool["name"] for tool in answer["result"]["tools"]] if "result" in answer else None

    # After the handshake's back-off (2 s) it is probed again, and answers.
    tools = wait_until(listed, timeout=20, interval=0.25)
    assert tools and all(name.startswith("new_") for name in tools), tools
