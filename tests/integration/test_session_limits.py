"""Caps on sessions and live users (issue 13): at ``operational.maxSessions`` (and per
caller at ``maxSessionsPerIdentity``) the least recently used idle session is evicted (its
client gets 404 and initializes again); at ``maxLiveUsers`` the least recently used idle
user is released (its records stay; its next request revives it). When nothing is idle,
the request gets 503 with Retry-After. All show in the admin state and the logs."""

from __future__ import annotations

import asyncio
import threading
import time

import pykka
import pytest

from tests.backends import RawMcpBackend, restartable_backend, sdk_backend
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


def _actors(kind: str) -> list[pykka.ActorRef]:
    return [ref for ref in pykka.ActorRegistry.get_all() if ref.actor_class.__name__ == kind]


def limits(gateway) -> dict:
    return admin_get(gateway, token=ADMIN_TOKEN).json()["sessionLimits"]


def hold_calls(raw: RawMcpBackend) -> threading.Event:
    """Every tools/call the raw backend gets waits until the returned event is set (or 30 s),
    then answers as before: a call in flight for as long as a test needs one."""
    release = threading.Event()
    answer = raw.handlers["tools/call"]

    async def held(call):
        for _ in range(3000):
            if release.is_set():
                break
            await asyncio.sleep(0.01)
        return await answer(call)

    raw.handlers["tools/call"] = held
    return release


def call_in_flight(gateway, raw: RawMcpBackend, session_id: str, tool: str, release: threading.Event):
    """A held call of ``tool`` on ``session_id`` (on a thread of its own), once the backend has it."""
    call = threading.Thread(target=gateway.rpc, args=(session_id, "tools/call", {
        "name": tool, "arguments": {"text": "held"}}))
    call.start()
    try:
        raw.wait_for("tools/call", timeout=10)  # the call is in flight
    except BaseException:
        release.set()
        call.join(timeout=30)
        raise
    return call


def test_at_the_cap_the_least_recently_used_idle_session_is_evicted(start_gateway, backend, caplog):
    gateway = start_gateway(config(backend, maxSessions=2))
    first, second = gateway.initialize(), gateway.initialize()
    time.sleep(0.01)  # distinct last-use times even on a coarse clock
    assert ping(gateway, first) == 200  # first is now the more recently used
    third = open_session(gateway)
    assert third.status_code == 200
    assert ping(gateway, second) == 404  # evicted: the client initializes again, as the spec allows
    assert ping(gateway, first) == 200 and ping(gateway, third.headers["Mcp-Session-Id"]) == 200
    assert limits(gateway) == {"maxSessions": 2, "maxSessionsPerIdentity": 0, "evicted": 1, "refused": 0}
    assert any("evicted: operational.maxSessions (2) reached" in r.getMessage() for r in caplog.records)


def test_when_every_session_is_busy_a_new_one_gets_503_with_retry_after(start_gateway):
    with restartable_backend("plain") as raw:
        release = hold_calls(raw)
        gateway = start_gateway(config(raw, maxSessions=1))
        busy = gateway.initialize()
        call = call_in_flight(gateway, raw, busy, "plain_echo", release)
        try:
            refused = open_session(gateway)
            assert refused.status_code == 503
            assert refused.headers["Retry-After"] == "5"
            assert refused.json()["error"]["data"] == {"limit": "maxSessions"}
        finally:
            release.set()
            call.join(timeout=30)
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


# -- live users (threads follow them: a UserActor plus one connection per backend) -----------


def _open_as(gateway, capabilities: dict) -> str:
    """A session of its own user: anonymous callers declaring other capabilities are
    other users (their backend sessions are told other capabilities)."""
    response = gateway.post({**INIT, "params": {**INIT["params"], "capabilities": capabilities}})
    assert response.status_code == 200, response.text
    return response.headers["Mcp-Session-Id"]


def _echo(gateway, session_id: str, text: str) -> dict:
    return gateway.rpc(session_id, "tools/call", {"name": "rs_echo", "arguments": {"text": text}})


def _live_users(gateway) -> list[dict]:
    return admin_get(gateway, token=ADMIN_TOKEN).json()["users"]


def test_at_the_live_user_cap_the_least_recently_used_idle_user_is_released_and_revives_on_use(
        start_gateway, caplog):
    with restartable_backend() as raw:
        gateway = start_gateway({"name": "limits", "backends": [backend_entry("rs", raw)],
                                 "operational": {"maxLiveUsers": 2}, "admin": {"tokenEnv": ADMIN_ENV}})
        first, second = _open_as(gateway, {}), _open_as(gateway, {"roots": {}})
        assert "result" in _echo(gateway, first, "a") and "result" in _echo(gateway, second, "b")
        assert "result" in _echo(gateway, first, "a2")  # second is now the least recently used
        third = _open_as(gateway, {"sampling": {}})
        assert "result" in _echo(gateway, third, "c")
        assert len(_live_users(gateway)) == 2 and len(_actors("UserActor")) == 2
        state = admin_get(gateway, token=ADMIN_TOKEN).json()
        assert state["liveUserLimits"] == {"maxLiveUsers": 2, "released": 1, "refused": 0}
        assert state["actorWorkers"]["maxWorkers"] == 8  # the connections' shared threads
        assert any("operational.maxLiveUsers (2) reached" in r.getMessage() for r in caplog.records)

        # The released user's session still works: revived from its record, on the same
        # backend session (no new handshake), releasing the least recently used again.
        handshakes = raw.initialize_count
        assert _echo(gateway, second, "b2")["result"]["content"][0]["text"] == "restartable:b2"
        assert raw.initialize_count == handshakes == 3
        assert len(_actors("UserActor")) == 2
        assert admin_get(gateway, token=ADMIN_TOKEN).json()["liveUserLimits"]["released"] == 2


def test_when_every_live_user_is_busy_another_user_gets_503_with_retry_after(start_gateway):
    with restartable_backend() as raw:
        gateway = start_gateway({"name": "limits", "backends": [backend_entry("rs", raw)],
                                 "operational": {"maxLiveUsers": 1}, "admin": {"tokenEnv": ADMIN_ENV}})
        release = hold_calls(raw)
        busy = _open_as(gateway, {})
        call = call_in_flight(gateway, raw, busy, "rs_echo", release)  # its user cannot be released
        other = _open_as(gateway, {})  # a session starts no user: its first request does
        try:
            refused = gateway.post({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}, other)
            assert refused.status_code == 503
            assert refused.headers["Retry-After"] == "5"
            assert refused.json()["error"]["data"] == {"limit": "maxLiveUsers"}
            assert "users at once" in refused.json()["error"]["message"]
        finally:
            release.set()
            call.join(timeout=30)
        # idle again: it makes room
        assert "result" in _echo(gateway, other, "x") and "result" in _echo(gateway, busy, "y")
        limits_now = admin_get(gateway, token=ADMIN_TOKEN).json()["liveUserLimits"]
        assert limits_now["refused"] == 1 and limits_now["released"] == 2
        assert len(_actors("UserActor")) == 1


def test_a_released_sessions_revival_refused_at_the_cap_keeps_its_session(start_gateway):
    """A session whose user cannot be revived now gets 503 (not 404) and works later."""
    with restartable_backend() as raw:
        gateway = start_gateway({"name": "limits", "backends": [backend_entry("rs", raw)],
                                 "operational": {"maxLiveUsers": 1}, "admin": {"tokenEnv": ADMIN_ENV}})
        release = hold_calls(raw)
        waiting = _open_as(gateway, {})
        busy = _open_as(gateway, {"roots": {}})  # releases the first user
        call = call_in_flight(gateway, raw, busy, "rs_echo", release)
        try:
            refused = gateway.post({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}, waiting)
            assert refused.status_code == 503 and refused.json()["id"] == 5
        finally:
            release.set()
            call.join(timeout=30)
        assert "result" in _echo(gateway, waiting, "later")
        sessions = admin_get(gateway, token=ADMIN_TOKEN).json()["sessions"]
        assert all(row["inFlight"] == 0 for row in sessions)  # the refused request held nothing


def test_the_live_user_cap_is_checked_in_the_config():
    from vmcp_actors.config import config_from_mapping
    from vmcp_actors.exceptions import ConfigError

    base = {"name": "x", "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}]}
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({**base, "operational": {"maxLiveUsers": 0}})
    assert list(caught.value.errors) == ["operational.maxLiveUsers: must be between 1 and 100000"]
    assert config_from_mapping(base).operational.max_live_users == 1000
