"""The gateway as authorization server over several workers (issue 36): its records in one
real Redis, so any worker completes any step of a sign-in (through a real nginx round
robin, and step by step to alternating workers), a signing key rotates without logging
anyone out, the identity provider's token is refreshed once per expiry however many
workers refresh a grant at once, Redis going away is a 503 (never a 401 or an OAuth error
that would make a client start over), and no secret lies in Redis in plaintext.

The workers are in-process gateways (tests.oauth_gateway.FixedPortGateway) sharing the
records, in front of oidc-provider (tests.oidc_idp), driven by headless Chromium."""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jwt
import pytest
import redis
import requests
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from tests.backends import sdk_backend
from tests.gateway import answer_of, backend_entry, wait_until
from tests.integration.test_deploy import Nginx, rendered_site
from tests.oauth_browser import browser, need_browser, sign_in_pages
from tests.oauth_gateway import RECORDS_KEY_ENV, RawOAuthClient, SignInGateway, mcp_post, new_signing_key
from tests.ports import free_port
from vmcp_actors.oauth._keys import load_signing_key
from vmcp_actors.oauth._server import digest
from vmcp_actors.oauth._tokens import GRANT_RECHECK
from vmcp_actors.web._installed import EXTENSION_KEY

PREFIX = "oa36:"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {},
               "io.modelcontextprotocol/clientInfo": {"name": "oauth-workers", "version": "0"}}
HOP_BY_HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive", "content-encoding"}


@pytest.fixture(scope="module")
def driver():
    need_browser()
    with browser() as chrome:
        yield chrome


@pytest.fixture(scope="module")
def backend():
    served = sdk_backend("alpha", ["echo"])
    yield served
    served.stop()


def forget_everyone(driver: Any) -> None:
    """No cookie of any server (no IdP session, no gateway sign-in cookie): the next sign-in starts afresh."""
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})


@pytest.fixture()
def fresh_browser(driver):
    forget_everyone(driver)
    return driver


def shared_records(redis_server: Any) -> dict[str, Any]:
    """The config that puts the authorization server's records in Redis, encrypted with one key."""
    return {"sessionStorage": {"provider": "redis", "address": redis_server.address, "keyPrefix": PREFIX},
            "operational": {"signingKeyEnv": RECORDS_KEY_ENV}}


def two_workers(backend: Any, redis_server: Any, **options: Any) -> SignInGateway:
    return SignInGateway([backend_entry("alpha", backend)], workers=2, extra=shared_records(redis_server), **options)


def runtime_of(worker: Any) -> Any:
    return worker.app.extensions[EXTENSION_KEY]


def echo(base: str, token: str, text: str) -> requests.Response:
    """A stateless (2026-07-28) tools/call of alpha_echo with ``token`` on ``base``."""
    return mcp_post(f"{base}/mcp", token, {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                           "params": {"name": "alpha_echo", "arguments": {"text": text},
                                                      "_meta": MODERN_META}},
                    **{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "alpha_echo"})


def echoed(base: str, token: str, text: str) -> str:
    answer = echo(base, token, text)
    assert answer.status_code == 200, answer.text
    return answer_of(answer)["result"]["content"][0]["text"]


def refresh(base: str, client: RawOAuthClient, refresh_token: str) -> requests.Response:
    return requests.post(f"{base}/oauth/token", data={"grant_type": "refresh_token", "refresh_token": refresh_token,
                                                      "client_id": client.client_id}, timeout=30)


def revoke(base: str, client: RawOAuthClient, token: str) -> requests.Response:
    return requests.post(f"{base}/oauth/revoke", data={"token": token, "token_type_hint": "refresh_token",
                                                       "client_id": client.client_id}, timeout=10)


def grant_of(access_token: str) -> str:
    return jwt.decode(access_token, options={"verify_signature": False})["grant"]


# --- 1. any worker completes any step ------------------------------------------------------

STEPS = {("POST", "/oauth/register"): "register", ("GET", "/oauth/authorize"): "authorize",
         ("GET", "/oauth/callback"): "IdP callback", ("GET", "/oauth/consent"): "consent page",
         ("POST", "/oauth/consent"): "consent form", ("POST", "/oauth/token"): "token",
         ("POST", "/oauth/revoke"): "revoke", ("POST", "/mcp"): "mcp"}


def whole_flow(issuer: str, driver: Any) -> dict[str, Any]:
    """Register, sign in (authorize, the consent page and form, the IdP and its callback, in
    the order the gateway takes them), token, /mcp, refresh, /mcp with the new token,
    revoke: every request to ``issuer``. What came back."""
    client = RawOAuthClient(issuer)
    try:
        first = client.sign_in(driver, "alice")
        assert first["_redirect"]["iss"] == issuer
        initialized = mcp_post(f"{issuer}/mcp", first["access_token"], INIT)
        assert initialized.status_code == 200, initialized.text
        assert echoed(issuer, first["access_token"], "one") == "alpha:one"
        renewed = refresh(issuer, client, first["refresh_token"])
        assert renewed.status_code == 200, renewed.text
        second = renewed.json()
        assert echoed(issuer, second["access_token"], "two") == "alpha:two"
        assert revoke(issuer, client, second["refresh_token"]).status_code == 200
        return {"client": client, "first": first, "second": second}
    finally:
        client.stop()


@pytest.mark.slow  # nginx in front of the workers (docs/testing.md)
def test_a_whole_sign_in_through_nginx_round_robin_is_served_by_both_workers(tmp_path, redis_server, backend,
                                                                              fresh_browser):
    listen = free_port()
    gateway = two_workers(backend, redis_server, proxied=True, issuer_port=listen)
    nginx = Nginx(tmp_path / "nginx", rendered_site(listen, [worker.port for worker in gateway.gateways]))
    try:
        nginx.start(listen)
        done = whole_flow(gateway.issuer, fresh_browser)
        client, second = done["client"], done["second"]
        for base in gateway.worker_urls:  # the revoked family is over on every worker
            assert refresh(base, client, second["refresh_token"]).json()["error"] == "invalid_grant"
            # a worker that saw the grant live within GRANT_RECHECK learns of its end at its next check
            assert wait_until(lambda base=base: echo(base, second["access_token"], "x").status_code == 401,
                              timeout=GRANT_RECHECK + 5)
        served = [[STEPS[method, path] for method, path, status in worker.served
                   if (method, path) in STEPS and status < 400] for worker in gateway.gateways]
    finally:
        nginx.stop()
        gateway.stop()
    # nginx took turns: both workers served steps of the one sign-in, and together all of them
    assert all(any(step != "mcp" for step in steps) for steps in served), served
    assert set(served[0]) | set(served[1]) == set(STEPS.values()), served
    assert nginx.access_log().count("/oauth/") >= 7  # every OAuth step went through nginx


class StepRouter:
    """A proxy on the issuer's port that sends the requests of a flow (``/oauth/...``,
    ``/mcp``) to the workers in strict turn, starting with ``first``, and records (step,
    worker, status). Anything else (a browser's favicon request) goes to the first worker,
    unrecorded and taking no turn."""

    def __init__(self, port: int, workers: list[str]):
        self.workers = workers
        self.next = 0
        self.landed: list[tuple[str, int, int]] = []
        self._lock = threading.Lock()  # guards next and landed
        self._server = make_server("127.0.0.1", port, self._app, threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="step-router", daemon=True)
        self._thread.start()

    def start_with(self, first: int) -> None:
        with self._lock:
            self.next, self.landed = first, []

    def _app(self, environ: Any, start_response: Any) -> Any:
        request = Request(environ)
        step = STEPS.get((request.method, request.path))
        worker = 0
        if step:
            with self._lock:
                worker, self.next = self.next, (self.next + 1) % len(self.workers)
        query = environ.get("QUERY_STRING", "")
        url = self.workers[worker] + request.path + (f"?{query}" if query else "")
        headers = {name: value for name, value in request.headers.items() if name.lower() not in HOP_BY_HOP}
        forwarded = requests.request(request.method, url, data=request.get_data(), headers=headers,
                                     allow_redirects=False, timeout=30)
        if step:
            with self._lock:
                self.landed.append((step, worker, forwarded.status_code))
        kept = [(name, value) for name, value in forwarded.raw.headers.items() if name.lower() not in HOP_BY_HOP]
        return Response(forwarded.content, status=forwarded.status_code, headers=kept)(environ, start_response)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


# What whole_flow sends, in whatever order the sign-in pages come: two token requests
# (code, refresh), three /mcp calls.
FLOW_STEPS = Counter({"register": 1, "authorize": 1, "IdP callback": 1, "consent page": 1, "consent form": 1,
                      "token": 2, "mcp": 3, "revoke": 1})


def test_every_step_of_a_sign_in_completes_on_the_other_worker_than_the_step_before(redis_server, backend,
                                                                                     fresh_browser):
    gateway = two_workers(backend, redis_server, proxied=True)
    router = StepRouter(gateway.port, gateway.worker_urls)
    served: dict[str, set[int]] = {}
    try:
        for first in (0, 1):  # twice, so each worker serves each step
            forget_everyone(fresh_browser)
            router.start_with(first)
            whole_flow(gateway.issuer, fresh_browser)
            landed = list(router.landed)
            assert [status for _, _, status in landed if status >= 400] == [], landed
            assert Counter(step for step, _, _ in landed) == FLOW_STEPS, landed
            # strict turns: each step read what the step before wrote on the other worker
            assert [worker for _, worker, _ in landed] == [(first + n) % 2 for n in range(len(landed))], landed
            for step, worker, _ in landed:
                served.setdefault(step, set()).add(worker)
    finally:
        router.stop()
        gateway.stop()
    assert served == {step: {0, 1} for step in FLOW_STEPS}, served


# --- 2. a key rotation logs nobody out -----------------------------------------------------


def jwks_kids(base: str) -> set[str]:
    return {key["kid"] for key in requests.get(f"{base}/oauth/jwks", timeout=5).json()["keys"]}


def test_a_new_signing_key_with_the_old_one_as_previous_keeps_everyone_signed_in(redis_server, backend,
                                                                                  fresh_browser):
    gateway = two_workers(backend, redis_server)
    client = RawOAuthClient(gateway.issuer)
    try:
        old_pem = gateway.signing_key
        old_kid, new_pem = load_signing_key(old_pem).kid, new_signing_key()
        new_kid = load_signing_key(new_pem).kid
        token = client.sign_in(fresh_browser, "alice")
        assert jwt.get_unverified_header(token["access_token"])["kid"] == old_kid

        gateway.restart(signing_key=new_pem, previous_key=old_pem)  # same Redis, same records key
        for base in gateway.worker_urls:
            assert jwks_kids(base) == {old_kid, new_kid}
            assert echoed(base, token["access_token"], "old") == "alpha:old"
        renewed = refresh(gateway.worker_urls[1], client, token["refresh_token"])
        assert renewed.status_code == 200, renewed.text
        fresh = renewed.json()
        assert jwt.get_unverified_header(fresh["access_token"])["kid"] == new_kid
        assert echoed(gateway.worker_urls[0], fresh["access_token"], "new") == "alpha:new"

        gateway.restart(signing_key=new_pem)  # the old key retired: what it signed no longer verifies
        assert jwks_kids(gateway.issuer) == {new_kid}
        refused = echo(gateway.issuer, token["access_token"], "old")
        assert refused.status_code == 401 and "invalid_token" in refused.headers["WWW-Authenticate"]
        assert echoed(gateway.worker_urls[1], fresh["access_token"], "still") == "alpha:still"
        assert refresh(gateway.issuer, client, fresh["refresh_token"]).status_code == 200
    finally:
        client.stop()
        gateway.stop()


# --- 3. the IdP's token is refreshed once per expiry, whoever asks ------------------------

GRANTS = 3
RACERS = 8  # concurrent refreshes of one grant, half on each worker
EXPIRIES = 2


def test_concurrent_refreshes_on_both_workers_refresh_the_idps_token_once_per_expiry(redis_server, backend,
                                                                                    fresh_browser):
    # The IdP's access tokens live 2 minutes; the gateway refreshes them 30 s before they
    # end (EXPIRY_MARGIN), so a renewed one stays fresh far longer than a round takes. The
    # test ends each token's life itself, in the shared records, instead of waiting for it.
    # (With a life under EXPIRY_MARGIN every check would find the token stale: no "once
    # per expiry" to count.)
    gateway = two_workers(backend, redis_server, idp={"access_token_ttl": 120})
    clients = [RawOAuthClient(gateway.issuer) for _ in range(GRANTS)]
    records = runtime_of(gateway.gateway).oauth.records
    try:
        tokens = []
        for client in clients:
            forget_everyone(fresh_browser)
            tokens.append(client.sign_in(fresh_browser, "alice"))
        before = gateway.idp.token_requests().get("refresh_token", 0)
        answers: list[requests.Response] = []
        for _expiry in range(EXPIRIES):
            for token in tokens:
                kept = records.update("upstream", grant_of(token["access_token"]),
                                      lambda record: {**record, "expires_at": time.time() - 1})
                assert kept is not None  # the IdP's token of this grant is now past its life
            start = threading.Barrier(GRANTS * RACERS)
            round_answers: list[Any] = [None] * (GRANTS * RACERS)

            def race(index: int) -> None:
                client, token = clients[index // RACERS], tokens[index // RACERS]
                start.wait(10)
                round_answers[index] = refresh(gateway.worker_urls[index % 2], client, token["refresh_token"])

            threads = [threading.Thread(target=race, args=(index,)) for index in range(GRANTS * RACERS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert not any(thread.is_alive() for thread in threads)
            answers.extend(round_answers)
            assert all(answer is not None and answer.status_code == 200 for answer in round_answers), \
                [(answer.status_code, answer.text[:200]) for answer in round_answers
                 if answer is not None and answer.status_code != 200]
            tokens = [round_answers[grant * RACERS + RACERS - 1].json() for grant in range(GRANTS)]
        upstream = gateway.idp.token_requests().get("refresh_token", 0) - before
        refused = gateway.idp.failed_token_requests().get("refresh_token", 0)
        for grant, token in enumerate(tokens):  # no family lost: each still refreshes and calls tools
            assert echoed(gateway.worker_urls[grant % 2], token["access_token"], "kept") == "alpha:kept"
            assert refresh(gateway.worker_urls[(grant + 1) % 2], clients[grant],
                           token["refresh_token"]).status_code == 200
    finally:
        for client in clients:
            client.stop()
        gateway.stop()
    assert len(answers) == EXPIRIES * GRANTS * RACERS
    assert upstream == EXPIRIES * GRANTS, f"{upstream} upstream refreshes for {EXPIRIES * GRANTS} expiries"
    assert refused == 0


# --- 4. Redis away: 503, then everything again ---------------------------------------------


def test_with_redis_down_a_valid_token_gets_503_never_401_and_all_works_once_it_is_back(redis_server, backend,
                                                                                       fresh_browser):
    gateway = two_workers(backend, redis_server)
    client = RawOAuthClient(gateway.issuer)
    try:
        token = client.sign_in(fresh_browser, "alice")
        cold, warm = gateway.worker_urls
        assert echoed(warm, token["access_token"], "up") == "alpha:up"  # warm has now seen the grant live
        redis.Redis(port=redis_server.port).save()  # what Redis holds survives its restart
        redis_server.stop()
        for base in (cold, warm):
            session = mcp_post(f"{base}/mcp", token["access_token"], INIT)  # a session lives in Redis
            assert session.status_code == 503, (base, session.status_code, session.text[:300])
            stateless = echo(base, token["access_token"], "down")
            # cold must ask Redis whether the grant is live; warm saw it live within
            # GRANT_RECHECK, and a stateless call needs nothing else of Redis
            assert stateless.status_code in ((503,) if base == cold else (200, 503)), \
                (base, stateless.status_code, stateless.text[:300])
            unavailable = refresh(base, client, token["refresh_token"])
            assert unavailable.status_code == 503, unavailable.text
            assert unavailable.json()["error"] == "temporarily_unavailable"
            assert unavailable.headers["Retry-After"]
            assert revoke(base, client, token["refresh_token"]).status_code == 503
            registration = requests.post(f"{base}/oauth/register", json={
                "redirect_uris": ["http://127.0.0.1:9/cb"], "token_endpoint_auth_method": "none"}, timeout=10)
            assert registration.status_code == 503 and registration.json()["error"] == "temporarily_unavailable"
            authorize = requests.get(f"{base}/oauth/authorize", params={
                "response_type": "code", "client_id": client.client_id, "redirect_uri": client.catcher.redirect_uri,
                "code_challenge": "a" * 43, "code_challenge_method": "S256"}, allow_redirects=False, timeout=10)
            assert authorize.status_code == 503 and "Location" not in authorize.headers

        redis_server.start()
        renewed = refresh(gateway.worker_urls[0], client, token["refresh_token"])
        assert renewed.status_code == 200, renewed.text
        for base in gateway.worker_urls:
            assert mcp_post(f"{base}/mcp", token["access_token"], INIT).status_code == 200
            assert echoed(base, renewed.json()["access_token"], "back") == "alpha:back"
        forget_everyone(fresh_browser)
        newcomer = RawOAuthClient(gateway.issuer)  # a registration and a whole sign-in, too
        try:
            signed_in = newcomer.sign_in(fresh_browser, "bob")
        finally:
            newcomer.stop()
        assert echoed(warm, signed_in["access_token"], "bob") == "alpha:bob"
    finally:
        client.stop()
        gateway.stop()


# --- 5. nothing secret in Redis in plaintext ----------------------------------------------


def stored(connection: redis.Redis) -> dict[bytes, bytes]:
    """Every key under the prefix and all it holds, as bytes, whatever the key's type."""
    found: dict[bytes, bytes] = {}
    for key in connection.scan_iter(match=f"{PREFIX}*", count=500):
        kind = connection.type(key).decode()
        if kind == "string":
            parts = [connection.get(key) or b""]
        elif kind == "hash":
            parts = [part for pair in connection.hgetall(key).items() for part in pair]
        elif kind == "list":
            parts = connection.lrange(key, 0, -1)
        elif kind == "set":
            parts = list(connection.smembers(key))
        elif kind == "zset":
            parts = connection.zrange(key, 0, -1)
        elif kind == "stream":
            parts = [part for _, fields in connection.xrange(key) for pair in fields.items() for part in pair]
        else:
            raise AssertionError(f"a {kind} under {key!r}")
        found[key] = b"\x00".join(parts)
    return found


def assert_nowhere(connection: redis.Redis, secrets_by_name: dict[str, str], kinds: set[str]) -> None:
    held = stored(connection)
    present = {key.decode().split(":")[2] for key in held if key.startswith(f"{PREFIX}oa:".encode())}
    assert kinds <= present, (kinds, present)  # the records that hold these secrets are there
    for name, secret in secrets_by_name.items():
        assert len(secret) >= 16, name
        found = [key for key, value in held.items() if secret.encode() in key or secret.encode() in value]
        assert not found, f"{name} in plaintext under {found}"  # the keys only: never the secret itself


def test_no_token_code_or_secret_is_in_redis_in_plaintext(redis_server, backend, fresh_browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    gateway = two_workers(backend, redis_server)
    client = RawOAuthClient(gateway.issuer, auth_method="client_secret_basic")
    records = runtime_of(gateway.gateway).oauth.records
    connection = redis.Redis(port=redis_server.port)
    try:
        assert client.client_secret
        session, verifier = client.session(), secrets.token_urlsafe(48)
        url, _ = client.authorization_url(session, verifier)
        consent = f"{gateway.issuer}/oauth/consent"
        sign_in_pages(fresh_browser, url, login="alice", stop_prefix=consent)
        flow = records.get("flow", parse_qs(urlsplit(fresh_browser.current_url).query)["flow"][0])
        kept = {"the client secret": client.client_secret, "the upstream PKCE verifier": flow["verifier"],
                "the consent form's CSRF token": flow["csrf"]}
        kept.update({f"the IdP's {name}": flow["upstream"][name]  # when the IdP came before the consent page
                     for name in ("access_token", "refresh_token") if "upstream" in flow})
        assert_nowhere(connection, kept, {"flow", "client"})

        WebDriverWait(fresh_browser, 10).until(lambda d: d.find_elements(By.ID, "approve"))[0].click()
        WebDriverWait(fresh_browser, 10).until(lambda d: not d.current_url.startswith(consent))
        if not fresh_browser.current_url.startswith(client.catcher.redirect_uri):  # on to the IdP's pages
            sign_in_pages(fresh_browser, fresh_browser.current_url, login="alice",
                          stop_prefix=client.catcher.redirect_uri)
        code = client.catcher.wait()["code"]
        upstream = records.get("code", digest(code))["upstream"]
        kept.update({"the code": code, "the IdP's access_token": upstream["access_token"],
                     "the IdP's refresh_token": upstream["refresh_token"]})
        assert_nowhere(connection, kept, {"code", "client"})

        token = session.fetch_token(f"{gateway.issuer}/oauth/token", code=code, code_verifier=verifier,
                                    resource=gateway.mcp_url)
        renewed = refresh_confidential(gateway.worker_urls[1], client, token["refresh_token"])
        kept.update({"the first refresh token": token["refresh_token"],
                     "the second refresh token": renewed["refresh_token"], "the access token": renewed["access_token"]})
        assert_nowhere(connection, kept, {"client", "grant", "upstream", "refresh", "used_code"})
    finally:
        connection.close()
        client.stop()
        gateway.stop()


def refresh_confidential(base: str, client: RawOAuthClient, refresh_token: str) -> dict[str, Any]:
    answer = requests.post(f"{base}/oauth/token", data={"grant_type": "refresh_token", "refresh_token": refresh_token},
                           auth=(client.client_id, client.client_secret), timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()
