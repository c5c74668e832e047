"""A client that stops reading cannot make the gateway hold its notifications without
bound (issue 35). Its stream (a 2026-07-28 ``subscriptions/listen``, a 2025 standalone
GET) holds at most STREAM_BACKLOG unread messages; when a flood from a backend would pass
that, the stream ends: what waited is dropped at once, and the client's last event says
so (the error response to its listen request; an error log message on a 2025 stream). The
client then opens its stream again and is served as before.

The client here is a real HTTP client whose socket has a tiny receive buffer and which
reads nothing after the stream opens, so the gateway's writes block as they would on a
client that hung; the backend is a real SDK server sending resource updates on its
standalone stream."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from mcp.server.mcpserver import Context  # at module level: the SDK resolves the tool's annotations here

from tests.asking_backends import WATCHED_URI, AskingBackend
from tests.gateway import MCP_HEADERS, backend_entry, wait_until
from tests.integration.test_modern import META, MODERN, Listener, answer, modern_post
from vmcp_actors.users._live import STREAM_BACKLOG

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

FLOOD = 4 * STREAM_BACKLOG + 500  # updates the backend sends: far more than a stalled stream may hold
# Bytes of padding in each: the sockets between the gateway and the stalled client hold a
# few MB whatever the client's window (the gateway's send buffer grows up to tcp_wmem's
# 4 MB), so a few hundred such updates fill them, and the rest must wait in the gateway.
PAD = 16 * 1024


class FloodingBackend(AskingBackend):
    """The asking backend, plus ``flood(uri, count, pad)``: ``count`` resource updates for
    ``uri`` on its standalone stream, each numbered and padded, then the answer."""

    def __init__(self, name: str) -> None:
        from mcp import types

        super().__init__(name)

        async def flood(uri: str, count: int, pad: int, ctx: Context) -> str:
            """Tell subscribers ``uri`` changed, ``count`` times."""
            padding = "x" * pad
            for n in range(count):
                await ctx.session.send_notification(types.ResourceUpdatedNotification(
                    params=types.ResourceUpdatedNotificationParams(uri=uri, _meta={"example.test/n": n,
                                                                                    "example.test/pad": padding})))
            return f"sent {count}"

        self.server.add_tool(flood)


class _SmallWindow(http.client.HTTPConnection):
    """A connection whose receive buffer is as small as the kernel allows (set before
    connecting, so the TCP window stays small)."""

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(self.timeout)
        self.sock.connect((self.host, self.port))
        self.kept = self.sock  # the response keeps reading it after the connection lets go of it


class StalledClient:
    """One streamed request whose answer is read only when the test says so."""

    def __init__(self, gateway, method: str, headers: dict[str, str], body: bytes | None = None):
        self.connection = _SmallWindow(gateway.host, gateway.port, timeout=30)
        self.connection.request(method, "/mcp", body=body, headers=headers)
        self.response = self.connection.getresponse()
        assert self.response.status == 200, self.response.read()
        assert self.response.getheader("Content-Type", "").startswith("text/event-stream")

    def messages(self) -> Iterator[dict[str, Any]]:
        """Each JSON-RPC message of the stream, until it ends."""
        data: list[str] = []
        while True:
            line = self.response.readline()
            if not line:
                return
            text = line.decode().rstrip("\r\n")
            if text.startswith("data:"):
                data.append(text[5:].lstrip())
            elif text == "" and data:
                yield json.loads("\n".join(data))
                data = []

    def close(self) -> None:
        try:
            self.connection.kept.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.connection.close()


def stalled_listen(gateway) -> StalledClient:
    body = json.dumps({"jsonrpc": "2.0", "id": "sub-1", "method": "subscriptions/listen", "params": {
        "notifications": {"resourceSubscriptions": [WATCHED_URI]}, "_meta": META}}).encode()
    return StalledClient(gateway, "POST", {**MCP_HEADERS, "MCP-Protocol-Version": MODERN,
                                           "Mcp-Method": "subscriptions/listen"}, body)


def stalled_standalone(gateway, session: str) -> StalledClient:
    return StalledClient(gateway, "GET", {**MCP_HEADERS, "Accept": "text/event-stream", "Mcp-Session-Id": session})


@pytest.fixture
def flooding():
    backend = FloodingBackend("flood").start()
    yield backend
    backend.stop()


def live_counts(gateway) -> dict[str, Any]:
    return gateway.app.extensions["vmcp_actors"].service._live.counts()


class BacklogWatch:
    """The deepest backlog of any client stream, sampled while a flood goes on."""

    def __init__(self, gateway):
        self._gateway = gateway
        self.deepest = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.deepest = max(self.deepest, live_counts(self._gateway).get("deepestStreamBacklog") or 0)
            self._stop.wait(0.001)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.deepest


def flood_and_read(gateway, stalled: StalledClient, flood) -> list[dict[str, Any]]:
    """The flood (``flood()`` makes the backend send it), while the client reads nothing;
    then everything the client gets, to the end of its stream."""
    watch = BacklogWatch(gateway)
    try:
        assert flood() == f"sent {FLOOD}"
        # The stalled stream ends once the flood passes its bound (the gateway still has the
        # flood's tail in flight when the call is answered, so this waits for that, not a time).
        fell_behind = wait_until(lambda: live_counts(gateway).get("streamsFellBehind") == 1, timeout=30)
    finally:
        deepest = watch.stop()
    assert deepest <= STREAM_BACKLOG, f"a stalled client's stream held {deepest} messages"
    assert fell_behind, f"the stalled stream never ended for falling behind: {live_counts(gateway)}"
    assert live_counts(gateway)["deepestStreamBacklog"] == 0  # what waited was dropped at once
    return list(stalled.messages())


def test_a_listen_stream_that_stops_reading_ends_with_an_error_instead_of_growing(start_gateway, flooding):
    gateway = start_gateway({"name": "slow", "backends": [backend_entry("flood", flooding, "legacy")]})
    stalled = stalled_listen(gateway)
    try:
        ack = next(stalled.messages())
        assert ack["method"] == "notifications/subscriptions/acknowledged", ack

        def flood() -> str:
            called = answer(modern_post(gateway.url, "tools/call", {"name": "flood_flood", "arguments": {
                "uri": WATCHED_URI, "count": FLOOD, "pad": PAD}}))
            return called["result"]["content"][0]["text"]

        got = flood_and_read(gateway, stalled, flood)
    finally:
        stalled.close()
    updates, last = got[:-1], got[-1]
    assert all(m["method"] == "notifications/resources/updated" for m in updates)
    numbers = [m["params"]["_meta"]["example.test/n"] for m in updates]
    assert numbers == list(range(len(numbers))), "what the client got came in order, without gaps"
    assert len(updates) < FLOOD
    assert last["id"] == "sub-1" and last["error"]["code"] == -32603, last
    assert "fell behind" in last["error"]["message"] and "listen again" in last["error"]["message"]
    assert last["error"]["data"]["dropped"] >= 1
    wait_until(lambda: live_counts(gateway)["standaloneStreams"] == 0, timeout=10)

    again = Listener(gateway.url, {"resourceSubscriptions": [WATCHED_URI]})  # listening again works
    try:
        assert again.next()["method"] == "notifications/subscriptions/acknowledged"
        touched = answer(modern_post(gateway.url, "tools/call", {"name": "flood_touch", "arguments": {
            "uri": WATCHED_URI}}))
        assert touched["result"]["content"][0]["text"].startswith("touched")
        assert again.next()["params"]["uri"] == WATCHED_URI
    finally:
        again.close()


def test_a_2025_standalone_stream_that_stops_reading_ends_with_an_error_log_message(start_gateway, flooding):
    gateway = start_gateway({"name": "slow", "backends": [backend_entry("flood", flooding, "legacy")]})
    session = gateway.initialize()
    assert "result" in gateway.rpc(session, "resources/subscribe", {"uri": WATCHED_URI})
    stalled = stalled_standalone(gateway, session)
    try:
        assert wait_until(lambda: live_counts(gateway)["standaloneStreams"] == 1, timeout=10)

        def flood() -> str:
            called = gateway.rpc(session, "tools/call", {"name": "flood_flood", "arguments": {
                "uri": WATCHED_URI, "count": FLOOD, "pad": PAD}})
            return called["result"]["content"][0]["text"]

        got = flood_and_read(gateway, stalled, flood)
    finally:
        stalled.close()
    updates, last = got[:-1], got[-1]
    assert all(m["method"] == "notifications/resources/updated" for m in updates) and len(updates) < FLOOD
    assert last["method"] == "notifications/message" and last["params"]["level"] == "error", last
    assert "fell behind" in last["params"]["data"]["error"] and last["params"]["data"]["dropped"] >= 1
