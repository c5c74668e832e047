"""Caps on sessions (issue 13): at ``operational.maxSessions`` (and per caller at
``maxSessionsPerIdentity``) the least recently used idle session is evicted (its client
gets 404 and initializes again); when every session is busy, a new initialize gets 503
with Retry-After. Both show in the admin state and the logs."""

from __future__ import annotations

import threading
import time

import pytest

from tests.backends import sdk_backend
from tests.gateway import admin_get, backend_entry
from tests.idp import LocalIdP
from tests.integration.test_identity import INIT, bearer

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ADMIN_ENV, ADMIN_TOKEN = "LIMITS_ADMIN_TOKEN", "limits-adm1n-Tq4"
AUD = "vmcp"


@pytest.fixture
def backend():
    served = sdk_backend("plain", ["echo", "sleep"])
    yield served
    served.stop()


@pytest.fixture(autouse=True)
def admin_token(monkeypatch):
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)


def config(backend, **operational) -> dict:
    return {"name": "limits", "backends": [backend_entry("plain", backend)], "operational": operational,
            "admin": {"tokenEnv": ADMIN_ENV}}


def ping(gateway, session_id: str, token: str | None = None) -> int:
    headers = {"MCP-Protocol-Version": "2025-11-25", **bearer(token)}
    return gateway.post({"jsonrpc": "2.0", "id": 9, "method": "ping"}, session_id, headers=headers).status_code


def open_session(gateway, token: str | None = None):
    return gateway.post(INIT, headers=bearer(token))


def limits(gateway) -> dict:
    return admin_get(gateway, token=ADMIN_TOKEN).json()["sessionLimits"]


def test_at_the_cap_the_least_recently_used_idle_session_is_evicted(start_gateway, backend, caplog):
    gateway = start_gateway(config(backend, maxSessions=2))
    first, second = gateway.initialize(), gateway.initialize()
    time.sleep(0.01)
    assert ping(gateway, first) == 200  # first is now the more recently used
    third = open_session(gateway)
    assert third.status_code == 200
    assert ping(gateway, second) == 404  # evicted: the client initializes again, as the spec allows
    assert ping(gateway, first) == 200 and ping(gateway, third.headers["Mcp-Session-Id"]) == 200
    assert limits(gateway) == {"maxSessions": 2, "maxSessionsPerIdentity": 0, "evicted": 1, "refused": 0}
    assert any("evicted: operational.maxSessions (2) reached" in r.getMessage() for r in caplog.records)


def test_when_every_session_is_busy_a_new_one_gets_503_with_retry_after(start_gateway, backend):
    gateway = start_gateway(config(backend, maxSessions=1))
    busy = gateway.initialize()
    call = threading.Thread(target=gateway.rpc, args=(busy, "tools/call", {"name": "plain_sleep",
                                                                            "arguments": {"seconds": 1.5}}))
    call.start()
    try:
        time.sleep(0.5)  # the call is in flight
        refused = open_session(gateway)
        assert refused.status_code == 503
        assert refused.headers["Retry-After"] == "5"
        assert refused.json()["error"]["data"] == {"limit": "maxSessions"}
    finally:
        call.join(timeout=10)
    assert open_session(gateway).status_code == 200  # idle again: it makes room
    assert limits(gateway)["refused"] == 1 and limits(gateway)["evicted"] == 1


def test_a_caller_at_their_own_cap_evicts_their_own_session_only(start_gateway, backend):
    idp = LocalIdP().start()
    try:
        gateway = start_gateway({**config(backend, maxSessionsPerIdentity=1, maxSessions=10),
                                 "incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUD}}})
        alice, bob = idp.issue_token("alice", AUD), idp.issue_token("bob", AUD)
        bobs = open_session(gateway, bob).headers["Mcp-Session-Id"]
        alices_first = open_session(gateway, alice).headers["Mcp-Session-Id"]
        alices_second = open_session(gateway, alice).headers["Mcp-Session-Id"]
        assert ping(gateway, alices_first, alice) == 404
        assert ping(gateway, alices_second, alice) == 200 and ping(gateway, bobs, bob) == 200
        assert limits(gateway)["evicted"] == 1
    finally:
        idp.stop()


def test_the_caps_are_checked_in_the_config():
    from vmcp_actors.config import config_from_mapping
    from vmcp_actors.exceptions import ConfigError

    base = {"name": "x", "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}]}
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({**base, "operational": {"maxSessions": 0, "maxSessionsPerIdentity": -1}})
    assert list(caught.value.errors) == [
        "operational.maxSessions: must be between 1 and 1000000",
        "operational.maxSessionsPerIdentity: must be between 0 (no cap of its own) and 1000000",
    ]
    loaded = config_from_mapping(base).operational
    assert (loaded.max_sessions, loaded.max_sessions_per_identity) == (1000, 0)


def test_a_flood_of_bare_initializes_keeps_threads_bounded_and_serves_a_new_client(start_gateway, backend):
    """The flood of issue 13 at a smaller count: sessions stay at the cap (the oldest idle
    ones evicted), threads do not grow with them, and a new client is served."""
    import requests

    gateway = start_gateway(config(backend, maxSessions=50))
    first = gateway.initialize()
    assert ping(gateway, first) == 200
    before = threading.active_count()
    with requests.Session() as http:
        for _ in range(400):
            response = http.post(gateway.url, json=INIT, headers={"Accept": "application/json, text/event-stream",
                                                                  "Content-Type": "application/json"}, timeout=10)
            assert response.status_code == 200
    grown = threading.active_count() - before
    assert grown < 20, f"{grown} more threads after 400 bare initializes"
    assert limits(gateway)["evicted"] >= 350
    assert admin_get(gateway, token=ADMIN_TOKEN).json()["sessions"].__len__() <= 50
    fresh = gateway.initialize()
    called = gateway.rpc(fresh, "tools/call", {"name": "plain_echo", "arguments": {"text": "still here"}})
    assert called["result"]["content"][0]["text"] == "plain:still here"
