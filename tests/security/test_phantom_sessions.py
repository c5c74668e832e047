"""A session whose record could not be written never existed (issue 35): its initialize is
refused (503, Retry-After) and it holds no place under the session caps."""

from __future__ import annotations

import pytest

from tests.backends import sdk_backend
from tests.gateway import admin_get, backend_entry
from vmcp_actors.users._store import StoreUnavailable

pytestmark = [pytest.mark.timeout(60)]


def test_a_failed_record_write_leaves_no_session_behind(start_gateway, monkeypatch):
    monkeypatch.setenv("PHANTOM_ADMIN_TOKEN", "phantom-admin-token")
    with sdk_backend("plain", ["echo"]) as backend:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("plain", backend)],
                                 "operational": {"maxSessions": 1}, "admin": {"tokenEnv": "PHANTOM_ADMIN_TOKEN"}})
        directory = gateway.app.extensions["vmcp_actors"].service._directory
        store = directory.store
        written = store.put_session

        def store_down(record):
            raise StoreUnavailable("the record store is down")

        monkeypatch.setattr(store, "put_session", store_down)
        for _ in range(3):
            refused = gateway.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
            assert refused.status_code == 503 and refused.headers.get("Retry-After"), refused.text
        assert directory.session_count() == 0
        monkeypatch.setattr(store, "put_session", written)
        session = gateway.initialize()  # the one place under maxSessions: 1 is free
        assert gateway.rpc(session, "tools/call", {"name": "plain_echo", "arguments": {"text": "x"}}
                           )["result"]["content"][0]["text"] == "plain:x"
        assert directory.session_count() == 1
        limits = admin_get(gateway, token="phantom-admin-token").json()["sessionLimits"]
        assert limits["evicted"] == 0, limits  # no phantom had to make room for it
