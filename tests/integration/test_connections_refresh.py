"""A person's token at a backend is refreshed once per expiry however many workers need it
at once (issue 37): two connection services, as two workers, over one real Redis, against a
real token endpoint that counts the refresh grants it answers and rotates refresh tokens
(reusing a rotated-away one is refused, as a strict authorization server does)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import redis
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from tests.gateway import wait_until
from tests.ports import free_port
from vmcp_actors.config import config_from_mapping
from vmcp_actors.identity import Identity
from vmcp_actors.oauth._connections import Connections, person_key
from vmcp_actors.oauth._records import RedisOAuthRecords
from vmcp_actors.signing import Signer

PREFIX = "c37:"
ALICE = Identity("https://idp.example", "alice")


class TokenEndpoint:
    """RFC 8414 metadata and a token endpoint that rotates refresh tokens, on a loopback port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.refreshes = 0
        self.refused = 0
        self.live_refresh = "rt-0"
        self._lock = threading.Lock()
        self._gate = threading.Event()  # answers wait here: the racing callers all arrive first
        self._gate.set()
        self._server = make_server("127.0.0.1", self.port, self._app, threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def hold(self) -> None:
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    @Request.application
    def _app(self, request: Request) -> Response:
        if request.path == "/.well-known/oauth-authorization-server":
            return Response(json.dumps({"issuer": self.issuer, "authorization_endpoint": f"{self.issuer}/authorize",
                                        "token_endpoint": f"{self.issuer}/token",
                                        "token_endpoint_auth_methods_supported": ["client_secret_basic"]}),
                            mimetype="application/json")
        if request.path == "/token" and request.form.get("grant_type") == "refresh_token":
            self._gate.wait(10)
            with self._lock:
                if request.form.get("refresh_token") != self.live_refresh:
                    self.refused += 1
                    return Response(json.dumps({"error": "invalid_grant"}), 400, mimetype="application/json")
                self.refreshes += 1
                self.live_refresh = f"rt-{self.refreshes}"
                body = {"access_token": f"at-{self.refreshes}", "refresh_token": self.live_refresh,
                        "expires_in": 600, "token_type": "Bearer"}
            return Response(json.dumps(body), mimetype="application/json")
        return Response("not found", 404)

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(5)


@pytest.fixture
def setup(redis_server):
    endpoint = TokenEndpoint()
    config = config_from_mapping({
        "name": "gw", "backends": [{"name": "saas", "url": "http://127.0.0.1:1/mcp"}],
        "incomingAuth": {"type": "oidc", "oidc": {"issuer": "https://idp.example", "audience": "gw",
                                                  "clientId": "gw", "clientSecretEnv": "GW_SECRET"}},
        "outgoingAuth": {"backends": {"saas": {"type": "oauth", "oauth": {
            "issuer": endpoint.issuer, "clientId": "gateway", "clientSecretEnv": "SAAS_SECRET"}}}},
        "operational": {"publicUrl": "https://gw.example"}})
    client = redis.Redis.from_url(f"redis://{redis_server.address}")
    signer = Signer(b"records-key-0123456789abcdef-connections")
    workers = [Connections(config, RedisOAuthRecords(client, signer, PREFIX), {"saas": "s3cret"}) for _ in range(2)]
    try:
        yield endpoint, workers, client
    finally:
        endpoint.stop()
        client.close()


def connected_until_due(worker: Connections) -> None:
    """Alice's connection, as a connect stored it, already due for its refresh."""
    worker.records.put("connection", f"{person_key(ALICE)}|saas", {
        "access_token": "at-0", "refresh_token": "rt-0", "expires_at": 10**10, "refresh_at": 0,
        "backend": "saas", "person": [ALICE.issuer, ALICE.subject],
        "client": {"client_id": "gateway", "client_secret": "s3cret", "method": "client_secret_basic"},
        "scopes": [], "since": 0}, 3600)


def test_two_workers_racing_refresh_once_and_both_get_the_new_token(setup):
    endpoint, workers, client = setup
    connected_until_due(workers[0])
    endpoint.hold()
    got: list[str] = []
    callers = [threading.Thread(target=lambda worker=worker: got.append(worker.token(ALICE, "saas")))
               for worker in workers for _ in range(8)]
    for caller in callers:
        caller.start()
    # One holds the lock in Redis (its refresh held at the endpoint); the rest wait for its result.
    assert wait_until(lambda: client.exists(f"{PREFIX}oa:lock:connection-refresh:{person_key(ALICE)}|saas"), 10)
    endpoint.release()
    for caller in callers:
        caller.join(15)
    assert got == ["at-1"] * 16
    assert (endpoint.refreshes, endpoint.refused) == (1, 0)  # once, and no rotated-away token spent twice
    assert sum(worker.refreshes for worker in workers) == 1
    stored = b"".join(client.get(key) or b"" for key in client.scan_iter(match=f"{PREFIX}*"))
    assert b"at-1" not in stored and b"rt-1" not in stored  # encrypted at rest
