"""One actor per user: sessions of a user share its backend connections and keep their
own state; idle users are released and revived from their records; session ids are
signed; one deadline per request; the fixes found while reshaping."""

from __future__ import annotations

import asyncio
import threading

import pykka
import pytest
import requests

from tests.backends import delayed_backend, restartable_backend, sse_backend
from tests.gateway import admin_get, answer_of, backend_entry, sse_messages, wait_until
from vmcp_actors.config import config_from_mapping
from vmcp_actors.runtime import start_runtime
from vmcp_actors.users._actor import UserActor
from vmcp_actors.users._store import MemoryRecordStore
from vmcp_actors.web import create_app, stop_app

ADMIN_ENV, ADMIN_TOKEN = "VMCP_ADMIN_TOKEN", "admin-secret-for-tests"


def _actors(kind: str) -> list[pykka.ActorRef]:
    return [ref for ref in pykka.ActorRegistry.get_all() if ref.actor_class.__name__ == kind]


def _open(gateway, capabilities: dict | None = None, version: str = "2025-11-25") -> str:
    response = gateway.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": capabilities or {}, "clientInfo": {"name": "t", "version": "1"}}})
    assert response.status_code == 200, response.text
    return response.headers["Mcp-Session-Id"]


def _call(gateway, session_id: str, name: str, text: str = "x", request_id: int = 1) -> requests.Response:
    return gateway.post({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                         "params": {"name": name, "arguments": {"text": text}}}, session_id)


def _text(gateway, session_id: str, name: str, text: str = "x") -> str:
    answer = gateway.rpc(session_id, "tools/call", {"name": name, "arguments": {"text": text}})
    assert "result" in answer, answer
    return answer["result"]["content"][0]["text"]


# -- sessions of one user ---------------------------------------------------------------------


def test_sessions_of_one_person_have_their_own_connections_log_level_and_capabilities(
        start_gateway, monkeypatch):
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    with sse_backend() as sse:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("sse", sse)],
                                 "admin": {"tokenEnv": ADMIN_ENV}})
        quiet = _open(gateway, {"sampling": {}, "experimental": {"x": {}}})
        chatty = _open(gateway, {"sampling": {}})
        assert gateway.rpc(quiet, "logging/setLevel", {"level": "error"})["result"] == {}

        quiet_answer = _call(gateway, quiet, "sse_echo", "q")
        chatty_events = sse_messages(_call(gateway, chatty, "sse_echo", "c"))
        # The backend logs at info: the session that asked for errors only does not get it
        # (nothing left to stream, so its answer is plain JSON); the other one does.
        assert quiet_answer.headers["Content-Type"].startswith("application/json")
        assert answer_of(quiet_answer)["result"]["content"][0]["text"] == "sse:q"
        assert [m.get("method") for m in chatty_events] == ["notifications/message", None]

        # Each client session is a user of its own, with its own backend session, as two
        # direct clients would be; each told what its client declared.
        assert sse.initialize_count == 2
        assert len({m.session_id for m in sse.requests("tools/call")}) == 2
        assert len(_actors("UserActor")) == 2 and len(_actors("BackendConnection")) == 2
        declared = [m.params.get("capabilities") for m in sse.requests("initialize")]
        assert sorted(declared, key=len) == [{"sampling": {}}, {"sampling": {}}]

        state = admin_get(gateway, token=ADMIN_TOKEN).json()
        rows = {row["id"]: row for row in state["sessions"]}
        assert rows[quiet]["clientCapabilities"] == {"sampling": {}, "experimental": {"x": {}}}
        assert rows[chatty]["clientCapabilities"] == {"sampling": {}}
        assert (rows[quiet]["logLevel"], rows[chatty]["logLevel"]) == ("error", None)
        assert [(user["user"], [b["backend"] for b in user["backends"]]) for user in state["users"]] == \
            [("anonymous", ["sse"])] * 2


def test_a_client_declaring_other_capabilities_gets_backend_sessions_that_were_told_them(start_gateway):
    """A backend session is told one set of client capabilities (what its clients can
    answer): sessions of one person that declare another set get their own."""
    with sse_backend() as sse:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("sse", sse)]})
        plain, asking = _open(gateway), _open(gateway, {"elicitation": {"form": {}}, "roots": {"listChanged": True}})
        assert _text(gateway, plain, "sse_echo") == _text(gateway, asking, "sse_echo") == "sse:x"
        assert sse.initialize_count == 2 and len(_actors("UserActor")) == 2
        declared = sorted((m.params.get("capabilities") for m in sse.requests("initialize")), key=len)
        assert declared == [{}, {"elicitation": {"form": {}}, "roots": {"listChanged": True}}]


# -- release and revival ----------------------------------------------------------------------


def _released_after_a_call(start_gateway, raw, cache_ttl: str):
    """A gateway whose users are released after 200 ms idle; a session that made one
    call, its user's actors since released. (gateway, session id)"""
    gateway = start_gateway({"name": "t", "backends": [backend_entry("rs", raw)], "operational": {
        "userIdleTimeout": "200ms", "sessionTTL": "30s", "discoveryCacheTTL": cache_ttl}})
    sid = gateway.initialize()
    assert _text(gateway, sid, "rs_echo", "before") == "restartable:before"
    assert wait_until(lambda: not _actors("UserActor") and not _actors("BackendConnection"), timeout=10)
    return gateway, sid


@pytest.mark.parametrize("cache_ttl", ["30s", "0"], ids=["catalog-cached", "rediscovered"])
def test_an_idle_user_is_released_and_revived_with_its_backend_session(start_gateway, cache_ttl):
    with restartable_backend() as raw:
        gateway, sid = _released_after_a_call(start_gateway, raw, cache_ttl)
        (backend_session,) = raw.sessions
        assert _text(gateway, sid, "rs_echo", "after") == "restartable:after"
        assert len(_actors("UserActor")) == 1
        assert raw.initialize_count == 1  # the recorded backend session was used as it was
        assert {m.session_id for m in raw.requests("tools/call")} == {backend_session}
        assert raw.deleted_sessions == []


@pytest.mark.parametrize("cache_ttl", ["30s", "0"], ids=["catalog-cached", "rediscovered"])
def test_a_revived_user_whose_backend_forgot_the_session_initializes_again(start_gateway, cache_ttl):
    with restartable_backend() as raw:
        gateway, sid = _released_after_a_call(start_gateway, raw, cache_ttl)
        raw.forget_sessions()  # the backend restarted while the user was released

        assert _text(gateway, sid, "rs_echo", "after") == "restartable:after"
        assert raw.initialize_count == 2
        assert len(raw.sessions) == 1


def test_ending_a_released_users_last_session_ends_its_backend_session(start_gateway):
    with restartable_backend() as raw:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("rs", raw)],
                                 "operational": {"userIdleTimeout": "200ms"}})
        sid = gateway.initialize()
        assert _text(gateway, sid, "rs_echo") == "restartable:x"
        (backend_session,) = raw.sessions
        assert wait_until(lambda: not _actors("UserActor"), timeout=10)
        assert requests.delete(gateway.url, headers={"Mcp-Session-Id": sid}, timeout=10).status_code == 200
        assert wait_until(lambda: raw.deleted_sessions, timeout=10) == [backend_session]
        assert not _actors("UserActor")  # ended without starting its actors again


# -- signed session ids -----------------------------------------------------------------------


def test_a_forged_session_id_is_refused_before_any_lookup(start_gateway, monkeypatch):
    lookups: list[str] = []
    original = MemoryRecordStore.session

    def counted(store, session_id):
        lookups.append(session_id)
        return original(store, session_id)

    monkeypatch.setattr(MemoryRecordStore, "session", counted)
    with restartable_backend() as raw:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("rs", raw)]})
        sid = gateway.initialize()
        forged = [sid[:32] + ("0" if sid[32] != "0" else "1") + sid[33:],  # the right nonce, a wrong tag
                  "f" * 64, sid.upper(), sid[:-1], "../" + sid]
        lookups.clear()
        for bad in forged:
            response = gateway.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, bad)
            assert response.status_code == 404, bad
            assert requests.delete(gateway.url, headers={"Mcp-Session-Id": bad}, timeout=10).status_code == 404
        assert lookups == []
        assert gateway.rpc(sid, "ping") == {"jsonrpc": "2.0", "id": 1, "result": {}}
        assert lookups  # a genuine id is looked up


def test_a_configured_signing_key_is_read_from_the_environment(start_gateway, monkeypatch):
    monkeypatch.setenv("VMCP_SIGNING_KEY", "k" * 40)
    with restartable_backend() as raw:
        config = {"name": "t", "backends": [backend_entry("rs", raw)],
                  "operational": {"signingKeyEnv": "VMCP_SIGNING_KEY"}}
        one = start_gateway(config)
        sid = one.initialize()
        from vmcp_actors.signing import Signer

        assert Signer(b"k" * 40).is_session_id(sid)
        assert not Signer(b"j" * 40).is_session_id(sid)
        monkeypatch.setenv("VMCP_SIGNING_KEY", "short")
        with pytest.raises(Exception, match="signingKeyEnv"):
            create_app(start_runtime(config_from_mapping(config)))


# -- one deadline per request -----------------------------------------------------------------


def test_a_request_whose_deadline_ends_mid_discovery_answers_in_time(start_gateway):
    """The backend's list is held until the first request has answered; the request's
    deadline is 1 s. It answers by its deadline, discovery goes on, and the next request is
    served from it."""
    # Every round trip takes 0.3 s: the held list goes out late enough to be released well
    # within its own 1 s timeout.
    with delayed_backend(delay=0.3) as slow:
        answered = threading.Event()
        tool_list = slow.handlers["tools/list"]

        async def held_list(call):
            while not answered.is_set():
                await asyncio.sleep(0.01)
            return tool_list(call)

        slow.handlers["tools/list"] = held_list
        gateway = start_gateway({"name": "t", "backends": [backend_entry("slow", slow)],
                                 "operational": {"timeouts": {"default": "1s"}}})
        sid = gateway.initialize()
        try:
            response = gateway.post({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}, sid)
        finally:
            answered.set()
        # Discovery could not have ended before this answer: the request gave up waiting for it
        # at its deadline (-32001), not after it.
        assert response.status_code == 200
        assert response.json()["error"]["code"] == -32001, response.text

        def listed():
            answer = gateway.rpc(sid, "tools/list")
            return "result" in answer and [t["name"] for t in answer["result"]["tools"]]

        assert wait_until(listed, timeout=10) == ["slow_echo", "slow_sleep"]
        # the discovery that outlived the first request
        assert slow.initialize_count == 1 and len(slow.requests("tools/list")) == 1


def test_concurrent_requests_during_discovery_share_it_and_later_sessions_use_its_catalog(start_gateway):
    """A session's concurrent requests share its one discovery; a later session of the same
    person gets that catalog from the cache, and opens its own backend session only when
    it first needs one (a call)."""
    with delayed_backend(delay=0.2) as slow:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("slow", slow)]})
        sid = gateway.initialize()
        answers: dict[int, dict] = {}
        threads = [threading.Thread(target=lambda n=n: answers.__setitem__(n, gateway.rpc(sid, "tools/list",
                                                                                            request_id=n)))
                   for n in range(1, 7)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert len(answers) == 6 and all("result" in answer for answer in answers.values()), answers
        assert slow.initialize_count == 1 and len(slow.requests("tools/list")) == 1

        later = gateway.initialize()
        assert "result" in gateway.rpc(later, "tools/list")
        assert slow.initialize_count == 1 and len(slow.requests("tools/list")) == 1


# -- fixes found on the way -------------------------------------------------------------------


def test_a_streamed_answer_whose_body_is_never_read_still_finishes_the_request(monkeypatch):
    """Bookkeeping in the response's close hook: an unread SSE body must not leave its
    session 'in flight' forever (it would never be reaped)."""
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    with sse_backend() as sse:
        app = create_app(start_runtime(config_from_mapping({"name": "t", "backends": [backend_entry("sse", sse)],
                                                            "operational": {"sessionTTL": "400ms"},
                                                            "admin": {"tokenEnv": ADMIN_ENV}})))
        try:
            client = app.test_client()
            headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
            opened = client.post("/mcp", headers=headers, json={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                 "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                            "clientInfo": {"name": "t", "version": "1"}}})
            sid = opened.headers["Mcp-Session-Id"]
            streamed = client.post("/mcp", headers={**headers, "Mcp-Session-Id": sid}, buffered=False, json={
                "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "sse_echo", "arguments": {}}})
            assert streamed.mimetype == "text/event-stream"
            streamed.close()  # the server closes the response without reading the body

            def sessions() -> list[str]:  # the admin view: a request on the session would use it
                state = client.get("/admin/state", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
                return [row["id"] for row in state.get_json()["sessions"]]

            assert wait_until(lambda: sid not in sessions(), timeout=10)  # reaped: nothing left in flight
            probe = client.post("/mcp", headers={**headers, "Mcp-Session-Id": sid},
                                json={"jsonrpc": "2.0", "id": 2, "method": "ping"})
            assert probe.status_code == 404
        finally:
            stop_app(app)


def test_initialize_does_not_wait_for_the_users_actors_to_start(start_gateway, monkeypatch):
    original = UserActor.on_start if hasattr(UserActor, "on_start") else None
    release, started = threading.Event(), threading.Event()

    def held_start(self):
        release.wait(30)  # the user's actor starts only when the test lets it
        started.set()
        if original is not None:
            original(self)

    monkeypatch.setattr(UserActor, "on_start", held_start)
    with restartable_backend() as raw:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("rs", raw)]})
        try:
            sid = gateway.initialize()
            assert not started.is_set()  # initialized while the user's actor was still starting
        finally:
            release.set()
        assert _text(gateway, sid, "rs_echo") == "restartable:x"  # served once the actor runs


def test_the_version_header_may_not_be_newer_than_the_session_negotiated(start_gateway):
    with restartable_backend() as raw:
        gateway = start_gateway({"name": "t", "backends": [backend_entry("rs", raw)]})
        sid = _open(gateway, version="2025-06-18")
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        newer = gateway.post(ping, sid, headers={"MCP-Protocol-Version": "2025-11-25"})
        assert newer.status_code == 400 and "2025-06-18" in newer.json()["error"]["message"]
        for version in ("2025-06-18", "2025-03-26"):
            assert gateway.post(ping, sid, headers={"MCP-Protocol-Version": version}).status_code == 200


def test_a_backend_negotiating_a_revision_the_gateway_does_not_speak_is_refused(start_gateway, monkeypatch):
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    with restartable_backend() as old, restartable_backend("good") as good:
        old.protocol_version = "2025-03-26"  # tolerated in a client's header, never negotiated
        gateway = start_gateway({"name": "t", "backends": [backend_entry("old", old), backend_entry("good", good)],
                                 "admin": {"tokenEnv": ADMIN_ENV}})
        sid = gateway.initialize()
        tools = gateway.rpc(sid, "tools/list")["result"]["tools"]
        assert [t["name"] for t in tools] == ["good_echo", "good_sleep"]
        (row,) = admin_get(gateway, token=ADMIN_TOKEN).json()["sessions"]
        states = {b["backend"]: b for b in row["backends"]}
        assert states["old"]["state"] == "failed"
        assert "2025-03-26" in states["old"]["lastError"]
