"""Sessions in Redis (issue 13): any gateway process serves any session from its record,
with a real redis-server, real official-SDK backends and two gateways sharing one key."""

from __future__ import annotations

import pytest
import redis as redis_client

from tests.backends import sdk_backend
from tests.gateway import backend_entry, wait_until
from tests.integration.test_identity import INIT, bearer
from vmcp_actors.signing import Signer
from vmcp_actors.users._records import SessionRecord, UserKey, UserRecord
from vmcp_actors.users._redis_store import RedisRecordStore
from vmcp_actors.users._store import StoreUnavailable

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

KEY_ENV, KEY = "SHARED_SIGNING_KEY", "shared-signing-key-0123456789abcdef"


@pytest.fixture(autouse=True)
def signing_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)


@pytest.fixture
def backend():
    served = sdk_backend("plain", ["echo", "whoami"])
    yield served
    served.stop()


def config(backend, redis_server, **extra) -> dict:
    return {"name": "shared", "backends": [backend_entry("plain", backend)],
            "operational": {"signingKeyEnv": KEY_ENV},
            "sessionStorage": {"provider": "redis", "address": redis_server.address, "db": 0, "keyPrefix": "t:"},
            **extra}


def rpc(gateway, session_id: str, method: str, params: dict | None = None, request_id: int = 1):
    message = {"jsonrpc": "2.0", "id": request_id, "method": method, **({"params": params} if params else {})}
    return gateway.post(message, session_id, headers={"MCP-Protocol-Version": "2025-11-25"})


# -- the store ----------------------------------------------------------------------------------


def store(redis_server, key: bytes = KEY.encode(), prefix: str = "u:") -> RedisRecordStore:
    return RedisRecordStore.connect(redis_server.address, 0, None, Signer(key), key_prefix=prefix, session_ttl=60)


def test_records_round_trip_encrypted_and_updates_are_transactions(redis_server):
    records = store(redis_server)
    user = UserKey("https://idp", "alice")
    session = SessionRecord(session_id="a" * 64, user=user, protocol_version="2025-11-25", created=1.0, last_used=2.0)
    records.put_session(session)
    records.put_user(UserRecord(user, created=1.0))
    assert records.session(session.session_id) == session
    assert records.sessions_of(user) == [session]
    records.update_session(session.session_id, lambda r: r.with_log_level("debug"))
    assert records.session(session.session_id).log_level == "debug"
    raw = redis_client.Redis(port=redis_server.port)
    stored = b"".join(raw.get(name) or b"" for name in raw.keys("u:*") if raw.type(name) == b"string")
    assert b"alice" not in stored and b"2025-11-25" not in stored  # encrypted at rest
    assert store(redis_server, key=b"another-key-of-32-bytes-at-least!").session(session.session_id) is None
    assert records.delete_session(session.session_id) == session.with_log_level("debug")
    assert records.session(session.session_id) is None and records.sessions_of(user) == []
    assert records.delete_user(user).key == user


def test_live_tasks_are_indexed_apart_from_ended_ones_in_redis(redis_server):
    from tests.unit.test_task_records import assert_live_tasks_are_indexed_apart

    records = store(redis_server)
    assert_live_tasks_are_indexed_apart(records)
    raw = redis_client.Redis(port=redis_server.port)
    assert raw.smembers("u:lt:owner") == {b"t2"} and raw.smembers("u:ot:owner") == {b"t1", b"t2"}
    assert 0 < raw.ttl("u:lt:owner") <= 600


def test_redis_down_is_store_unavailable_and_redis_back_is_served(redis_server):
    records = store(redis_server)
    redis_server.stop()
    with pytest.raises(StoreUnavailable):
        records.session("x" * 64)
    assert records.ping() is False
    redis_server.start()
    assert records.session("x" * 64) is None and records.ping() is True


# -- two gateways, one store ----------------------------------------------------------------------


def test_a_session_opened_on_one_gateway_is_served_by_another(start_gateway, backend, redis_server):
    first = start_gateway(config(backend, redis_server))
    second = start_gateway(config(backend, redis_server))
    opened = first.post(INIT)
    assert opened.status_code == 200
    session_id = opened.headers["Mcp-Session-Id"]
    assert rpc(first, session_id, "logging/setLevel", {"level": "warning"}).status_code == 200
    called = rpc(second, session_id, "tools/call", {"name": "plain_echo", "arguments": {"text": "hi"}})
    assert called.status_code == 200, called.text
    assert called.json()["result"]["content"][0]["text"] == "plain:hi"
    listed = rpc(second, session_id, "tools/list")
    assert sorted(t["name"] for t in listed.json()["result"]["tools"]) == ["plain_echo", "plain_whoami"]
    # the record carries what the first gateway negotiated: the log level set there holds here
    assert second.app.extensions["vmcp_actors"].service._directory.store.session(session_id).log_level == "warning"
    import requests
    ended = requests.delete(first.url, headers={"Mcp-Session-Id": session_id, "MCP-Protocol-Version": "2025-11-25"},
                            timeout=10)
    assert ended.status_code in (200, 204)
    assert rpc(second, session_id, "ping").status_code == 404  # ended everywhere


def test_another_callers_session_id_is_404_on_every_gateway(start_gateway, backend, redis_server):
    from tests.idp import LocalIdP

    idp = LocalIdP().start()
    try:
        oidc = {"incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": "vmcp"}}}
        first = start_gateway(config(backend, redis_server, **oidc))
        second = start_gateway(config(backend, redis_server, **oidc))
        alice, bob = idp.issue_token("alice", "vmcp"), idp.issue_token("bob", "vmcp")
        session_id = first.post(INIT, headers=bearer(alice)).headers["Mcp-Session-Id"]
        for gateway in (first, second):
            stolen = gateway.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, session_id,
                                  headers={"MCP-Protocol-Version": "2025-11-25", **bearer(bob)})
            assert stolen.status_code == 404
        mine = second.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, session_id,
                           headers={"MCP-Protocol-Version": "2025-11-25", **bearer(alice)})
        assert mine.status_code == 200
    finally:
        idp.stop()


def test_forged_session_ids_cost_redis_nothing(start_gateway, backend, redis_server):
    """A flood of forged or foreign-key ids is refused (404) on the signature alone: Redis
    sees no lookup for them (its own command counter says so)."""
    gateway = start_gateway(config(backend, redis_server))
    genuine = gateway.initialize()
    other_key = Signer(b"another-gateway-key-0123456789abcdef").new_session_id()
    forged = [genuine[:32] + ("0" if genuine[32] != "0" else "1") + genuine[33:], "f" * 64, other_key]
    watcher = redis_client.Redis(host="127.0.0.1", port=redis_server.port)

    def gets() -> int:
        stats = watcher.info("commandstats")
        return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("get", "mget", "exists", "watch"))

    before = gets()
    for round_ in range(100):
        bad = forged[round_ % len(forged)]
        assert rpc(gateway, bad, "tools/list").status_code == 404
    assert gets() - before < 5  # the reaper's own reads at most; none per forged request
    assert rpc(gateway, genuine, "ping").status_code == 200
    assert gets() > before  # a genuine id is looked up


def test_with_redis_down_requests_get_503_and_the_gateway_recovers(start_gateway, backend, redis_server):
    gateway = start_gateway(config(backend, redis_server))
    session_id = gateway.initialize()
    redis_server.stop()
    down = rpc(gateway, session_id, "ping")
    assert down.status_code == 503 and down.headers["Retry-After"] == "1"
    assert "session storage" in down.json()["error"]["message"]
    assert gateway.post(INIT).status_code == 503
    redis_server.start()  # an empty Redis: the old session is gone, a new one works
    assert rpc(gateway, session_id, "ping").status_code == 404
    fresh = gateway.initialize()
    assert rpc(gateway, fresh, "tools/call", {"name": "plain_echo", "arguments": {"text": "back"}}).status_code == 200


def test_redis_storage_needs_the_shared_signing_key():
    from vmcp_actors.config import config_from_mapping
    from vmcp_actors.exceptions import ConfigError
    from vmcp_actors.runtime import start_runtime
    from vmcp_actors.web import create_app

    loaded = config_from_mapping({"name": "x", "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}],
                                  "sessionStorage": {"provider": "redis", "address": "127.0.0.1:1"}})
    with pytest.raises(ConfigError) as caught:
        create_app(start_runtime(loaded))
    assert "operational.signingKeyEnv" in caught.value.errors[0]
    with pytest.raises(ConfigError) as caught:
        config_from_mapping({"name": "x", "backends": [{"name": "a", "url": "http://127.0.0.1:1/mcp"}],
                             "sessionStorage": {"provider": "redis", "address": "no-port", "db": 16}})
    assert list(caught.value.errors) == [
        "sessionStorage.address: must be host:port (127.0.0.1:6379, redis.internal:6379, [::1]:6379)",
        "sessionStorage.db: must be between 0 and 15",
    ]


# -- several gunicorn workers ---------------------------------------------------------------------


def test_serve_refuses_several_workers_without_shared_records(tmp_path, backend):
    from tests.integration.test_cli import VMCP, CliProcess, write_config

    path = write_config(tmp_path / "config.yaml", {"name": "w", "backends": [backend_entry("plain", backend)]})
    refused = CliProcess([VMCP, "serve", "--config", str(path), "--workers", "2"], tmp_path, "serve")
    assert refused.run_to_end() == 2
    assert "sessionStorage.provider: redis" in refused.stderr


def test_two_gunicorn_workers_serve_one_session_and_survive_a_killed_worker(tmp_path, backend, redis_server):
    import os
    import re
    import signal

    import requests

    from tests.integration.test_cli import VMCP, CliProcess, write_config
    from tests.ports import free_port

    port = free_port()
    path = write_config(tmp_path / "config.yaml", config(backend, redis_server))
    with CliProcess([VMCP, "serve", "--config", str(path), "--port", str(port), "--workers", "2"], tmp_path,
                    "serve", env={KEY_ENV: KEY}) as served:
        base = f"http://127.0.0.1:{port}"
        served.wait_ready(base)
        url = base + "/mcp"
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        opened = requests.post(url, json=INIT, headers=headers, timeout=30)
        session = {**headers, "Mcp-Session-Id": opened.headers["Mcp-Session-Id"], "MCP-Protocol-Version": "2025-11-25"}

        def call(n: int) -> requests.Response:
            # A new connection each time: gunicorn hands it to either worker.
            with requests.Session() as http:
                return http.post(url, json={"jsonrpc": "2.0", "id": n, "method": "tools/call",
                                            "params": {"name": "plain_echo", "arguments": {"text": str(n)}}},
                                 headers={**session, "Connection": "close"}, timeout=30)

        answers = [call(n) for n in range(12)]
        assert all(a.status_code == 200 and f"plain:{n}" in a.text for n, a in enumerate(answers)), \
            [a.status_code for a in answers]
        workers = [int(pid) for pid in re.findall(r"Booting worker with pid: (\d+)", served.stderr)]
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)  # mid-session: the other worker (and the respawned one) go on
        after = [call(n) for n in range(100, 108)]
        assert all(a.status_code == 200 for a in after), [a.status_code for a in after]
        os.kill(workers[1], signal.SIGKILL)  # now only workers that never saw the session are left
        restored = [call(n) for n in range(200, 204)]
        assert all(a.status_code == 200 and f"plain:{200 + i}" in a.text for i, a in enumerate(restored)), \
            [a.status_code for a in restored]
        # The arbiter respawns the second killed worker on its own time (the calls above may
        # all have gone to the first respawn): its boot line is waited for.
        assert wait_until(lambda: len(re.findall(r"Booting worker with pid", served.stderr)) >= 4, timeout=30)


def test_a_subscription_made_on_one_gateway_is_delivered_by_another(start_gateway, redis_server):
    """A backend session has one standalone stream, held by the first gateway (it has the
    subscription); the update it brings is fanned out over Redis to the second gateway,
    whose user delivers it to the session's client stream there."""
    from tests.asking_backends import asking_backend
    from tests.integration.test_client_requests import (
        OTHER_URI,
        WATCHED_URI,
        _config,
        _open,
        _Stream,
    )

    with asking_backend() as backend:
        shared = {"operational": {"signingKeyEnv": KEY_ENV},
                  "sessionStorage": {"provider": "redis", "address": redis_server.address, "keyPrefix": "fan:"}}
        first = start_gateway({**_config(("asking", backend)), **shared})
        second = start_gateway({**_config(("asking", backend)), **shared})
        # Both gateways listen on the fanout channel (each subscribes on a thread of its own at start).
        listeners = redis_client.Redis(port=redis_server.port)
        assert wait_until(lambda: listeners.pubsub_numsub("fan:streams")[0][1] == 2, timeout=10)
        session_id = _open(first, {})
        assert first.rpc(session_id, "resources/subscribe", {"uri": WATCHED_URI})["result"] == {}
        # Answered once the second gateway's user has its backend stream (or knows it gets none).
        stream = _Stream(second, session_id)
        try:
            # The last touch marks the end: once its update is here, one for OTHER_URI (touched
            # before it) would have been delivered too.
            for uri in (WATCHED_URI, OTHER_URI, WATCHED_URI):
                assert "result" in second.rpc(session_id, "tools/call", {"name": "asking_touch",
                                                                          "arguments": {"uri": uri}})

            def updates() -> list[str]:
                return [m["params"]["uri"] for m in stream.messages
                        if m.get("method") == "notifications/resources/updated"]

            assert wait_until(lambda: len(updates()) >= 2, timeout=10), updates()
            assert updates() == [WATCHED_URI, WATCHED_URI]
        finally:
            for gateway in (second, first):  # they end the streams (a client-side close waits for a keep-alive)
                gateway.stop()
            stream.close()


# -- the shared caches ------------------------------------------------------------------------


def test_an_exchanged_token_is_shared_and_redis_down_is_only_a_miss(redis_server):
    from vmcp_actors.backends import ExchangedTokenCache
    from vmcp_actors.shared_cache import SharedCache

    shared = SharedCache(store(redis_server).client, Signer(KEY.encode()), "t:")
    client = redis_client.Redis(port=redis_server.port)
    first, second = ExchangedTokenCache(shared=shared), ExchangedTokenCache(shared=shared)
    fetched: list[str] = []

    def fetch() -> tuple[str, float]:
        fetched.append("x")
        return "exchanged-token-value", 300.0

    key = ("github", "https://idp", "alice", "digest")
    assert first.get_or_fetch(key, fetch) == "exchanged-token-value"
    assert second.get_or_fetch(key, fetch) == "exchanged-token-value"
    assert fetched == ["x"]  # the second process did not exchange again
    raw = b"".join(client.get(name) or b"" for name in client.keys("t:c:*"))
    assert b"exchanged-token-value" not in raw and b"alice" not in b"".join(client.keys("t:c:*"))
    redis_server.stop()
    other = ("github", "https://idp", "bob", "digest")
    assert ExchangedTokenCache(shared=shared).get_or_fetch(other, fetch) == "exchanged-token-value"
    assert fetched == ["x", "x"]  # Redis down: a miss, the exchange goes on


def test_a_catalog_discovered_by_one_gateway_serves_the_other(start_gateway, backend, redis_server):
    from tests.gateway import admin_get

    # Spoken to as a 2025 backend: the SDK's 2026-07-28 lists say ttlMs 0, which caches nothing.
    admin = {"admin": {"tokenEnv": KEY_ENV}, "backends": [backend_entry("plain", backend, "legacy")]}
    first = start_gateway(config(backend, redis_server, **admin))
    second = start_gateway(config(backend, redis_server, **admin))
    listed = rpc(first, first.initialize(), "tools/list").json()["result"]["tools"]
    again = rpc(second, second.initialize(), "tools/list").json()["result"]["tools"]
    assert again == listed
    cache = admin_get(second, token=KEY).json()["discoveryCache"]
    assert cache["shared"] is True and cache["sharedHits"] == 1
