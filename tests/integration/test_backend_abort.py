"""A call cancelled before its backend has begun to answer ends on the wire at once (a
2026-07-28 backend learns of a cancellation only from its stream closing), and the
cancellation counts nothing against the backend's circuit."""

from __future__ import annotations

import threading

import pytest

from tests.backends import hanging_backend
from vmcp_actors.backends import McpHttpClient
from vmcp_actors.backends._http import Abort
from vmcp_actors.exceptions import BackendCancelled

EXCHANGE_TIMEOUT = 60.0  # what a request that ignored the abort would wait out


def test_an_abort_before_the_response_begins_ends_the_request_at_once():
    backend = hanging_backend()  # takes the request, never answers
    client = McpHttpClient("hanging", backend.mcp_url)
    abort = Abort()
    outcome: list[BaseException] = []

    def call() -> None:
        exchange = client.exchange({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                    "params": {"name": "echo", "arguments": {}}},
                                   session_id=None, protocol_version="2026-07-28", timeout=EXCHANGE_TIMEOUT,
                                   abort=abort)
        try:
            next(exchange)
        except BaseException as error:  # noqa: BLE001 - recorded for the test
            outcome.append(error)

    try:
        caller = threading.Thread(target=call)
        caller.start()
        backend.wait_for("tools/call", timeout=30)  # the request reached the backend, which holds it
        abort.abort()
        # Ended while the backend still held the request (it is let go only when stopped, below),
        # and long before the exchange's own timeout: the abort ended it.
        caller.join(timeout=EXCHANGE_TIMEOUT / 2)
        assert not caller.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], BackendCancelled), outcome
    finally:
        client.close()
        backend.stop()


def test_an_abort_before_sending_sends_nothing():
    backend = hanging_backend()
    client = McpHttpClient("hanging", backend.mcp_url)
    abort = Abort()
    abort.abort()
    try:
        exchange = client.exchange({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo"}},
                                   session_id=None, protocol_version="2026-07-28", timeout=5.0, abort=abort)
        with pytest.raises(BackendCancelled):
            next(exchange)
        assert backend.received == []
    finally:
        client.close()
        backend.stop()
