"""A client's stream through the gateway is as good as a direct one from the moment it is
answered: a 2026-07-28 client's subscriptions/listen is acknowledged, and a 2025 client's
standalone stream (GET) answered, only once the gateway's own streams to its backends are
open. A notification the backend sends right after is never lost, however slow the backend
is to open its stream (here it answers its GET half a second late)."""

from __future__ import annotations

import pytest
import requests

from tests.asking_backends import WATCHED_URI, AskingBackend
from tests.gateway import MCP_HEADERS, StreamReader, backend_entry
from tests.integration.test_modern import Listener, answer, modern_post

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

GET_DELAY = 0.5  # seconds the backend takes to answer its standalone stream's GET


class SlowStreamBackend(AskingBackend):
    """The asking backend, answering each GET (its standalone stream) ``GET_DELAY`` late."""

    def start(self, **options) -> SlowStreamBackend:
        import anyio

        from vmcp_actors.demo._serve import serve_asgi_in_thread

        app = self.server.streamable_http_app()

        async def slow_streams(scope, receive, send):
            if scope["type"] == "http" and scope["method"] == "GET":
                await anyio.sleep(GET_DELAY)
            await app(scope, receive, send)

        self._served = serve_asgi_in_thread(slow_streams, name=self.name)
        return self


@pytest.fixture
def slow_backend():
    backend = SlowStreamBackend("asking").start()
    yield backend
    backend.stop()


def config(backend) -> dict:
    return {"name": "ready", "backends": [backend_entry("asking", backend, "legacy")]}


def test_an_update_right_after_the_listen_acknowledgment_reaches_the_stream(start_gateway, slow_backend):
    gateway = start_gateway(config(slow_backend))
    listener = Listener(gateway.url, {"resourceSubscriptions": [WATCHED_URI]})
    try:
        assert listener.next()["method"] == "notifications/subscriptions/acknowledged"
        touched = answer(modern_post(gateway.url, "tools/call", {"name": "asking_touch",
                                                                 "arguments": {"uri": WATCHED_URI}}))
        assert touched["result"]["content"][0]["text"].startswith("touched"), touched
        update = listener.next(timeout=10)
        assert update["method"] == "notifications/resources/updated" and update["params"]["uri"] == WATCHED_URI
    finally:
        listener.close()


def test_an_update_right_after_the_standalone_stream_is_answered_reaches_it(start_gateway, slow_backend):
    gateway = start_gateway(config(slow_backend))
    session = gateway.initialize()
    stream = standalone_stream(gateway.url, session)  # returns once the gateway has answered the GET
    try:
        assert "result" in gateway.rpc(session, "resources/subscribe", {"uri": WATCHED_URI})
        touched = gateway.rpc(session, "tools/call", {"name": "asking_touch", "arguments": {"uri": WATCHED_URI}})
        assert touched["result"]["content"][0]["text"].startswith("touched"), touched
        update = stream.next(timeout=10)
        assert update["method"] == "notifications/resources/updated" and update["params"]["uri"] == WATCHED_URI
    finally:
        stream.close()


def standalone_stream(url: str, session: str) -> StreamReader:
    """A 2025 session's standalone stream (GET), returned once the gateway has answered it."""
    response = requests.get(url, headers={**MCP_HEADERS, "Accept": "text/event-stream", "Mcp-Session-Id": session},
                            stream=True, timeout=30)
    assert response.status_code == 200, response.text
    return StreamReader(response)


def test_a_backend_that_never_answers_its_stream_delays_the_answer_only_boundedly():
    """StreamsReady.wait gives up at its bound: a stuck backend stream never hangs a client."""
    import concurrent.futures as cf

    import pykka

    from vmcp_actors.backends import StreamsReady

    never: cf.Future = cf.Future()
    answered = pykka.ThreadingFuture()
    answered.set(never)
    ready: cf.Future = cf.Future()
    ready.set_result(None)
    settled = pykka.ThreadingFuture()
    settled.set(ready)
    assert StreamsReady((settled,)).wait(5) is True
    assert StreamsReady((settled, answered)).wait(0.05) is False
    assert StreamsReady(()).wait(0) is True

