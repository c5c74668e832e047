"""Issue 36: the gateway as authorization server, its tokens' cost, a login, refreshes at scale.

``incomingAuth.type: oauth``, in front of oidc-provider (tests/oidc_idp.py): what its
tokens cost, what a login takes, and refreshes at 1,000 a minute over two workers sharing
Redis. Four parts, one run:

1. **Validation**, in this process: ``authenticate()`` per /mcp request, the gateway's own
   JWT (``GatewayTokenAuthenticator``: signature, claims, the grant still live, looked up
   at most every GRANT_RECHECK seconds per grant) vs an IdP's JWT under ``type: oidc``
   (``OidcAuthenticator``, JWKS cached; tests/idp.py ``LocalIdP``'s tokens). Modes
   interleaved in rounds; us per call.
2. **Echo overhead**: two gateways served as in production (``vmcp-actors serve``,
   gunicorn), one ``type: oauth`` (its token from a real sign-in), one ``type: oidc`` (a
   LocalIdP token), the same SDK echo backend (tests/backends.py, uvicorn in this
   process: the calls are sequential, so it shares no GIL with concurrent clients); one
   thread, calls rotating direct / oauth / oidc; p50 of each and the ratios.
3. **A full login** as an MCP client does it against the oauth gateway: the 401 on /mcp,
   protected-resource and authorization-server metadata, registration, the browser's
   authorization (headless Chromium through oidc-provider's login and consent pages and
   the gateway's consent page), the token request, the first /mcp call. HTTP requests
   counted per origin (the browser's from Chrome's performance log), wall time; median
   of several logins, each in a fresh browser (no IdP session).
4. **Refresh load**: two gunicorn gateways sharing a local redis-server behind nginx
   (deploy/nginx.conf, as tests/integration/test_deploy.py runs it); G grants signed in
   through nginx, then two refresh loops per grant (one per worker, each following its own
   rotation; the first refresh of both uses the same token, within the grace period), the
   two at the same moments, at RATE refreshes a minute in total for DURATION seconds. Every EXPIRY_EVERY seconds the
   IdP's token of every grant is marked past its life in the shared records (the bench
   holds the records key), so the expected number of upstream refreshes is exact: one per
   grant per mark. Targets: no family lost (every refresh answered 200, and afterwards
   every grant still refreshes on both workers and calls a tool); upstream refresh_token
   requests (counted by the IdP) == marks x grants; none refused by the IdP.

    .venv/bin/python -m bench.oauth [--grants 20] [--rate 1000] [--duration 60] [--logins 5]
                                    [--calls 400] [--validations 1000]
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
import yaml

from bench._common import (
    Check,
    McpClient,
    _die_with_parent,
    _stop_process,
    _tail,
    _wait_ready,
    gateway,
    interleaved_calls,
    median,
    parse_args,
    percentile,
    print_header,
    record,
    run_benchmark,
    table,
    vmcp_actors_invocation,
)

ROUNDS = 4
WARMUP = 20
AUDIENCE = "https://bench-oidc.example/mcp"
RECORDS_KEY = "bench-records-key-0123456789abcdef"
PREFIX = "bench36:"
EXPIRY_EVERY = 12.0  # seconds between the marks that end the IdP's tokens' life
EXPIRY_FIRST = 3.0  # the first mark, after the load starts
EXPIRY_TAIL = 5.0  # no mark in the last seconds: every grant refreshes after the last one
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
               "MCP-Protocol-Version": "2025-11-25"}


# --- 1. validation ------------------------------------------------------------------------


def rsa_pem() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def gateway_token_modes(redis_client: Any) -> dict[str, Callable[[], Any]]:
    """authenticate() of the gateway's own tokens: ES256 and RS256 keys, records in memory
    and in Redis (the grant seen live within GRANT_RECHECK, and looked up every call)."""
    from tests.oauth_gateway import new_signing_key
    from vmcp_actors.config import config_from_mapping
    from vmcp_actors.oauth import build_oauth, oauth_secrets
    from vmcp_actors.oauth._server import Person
    from vmcp_actors.oauth._tokens import GRANT_RECHECK, GatewayTokenAuthenticator
    from vmcp_actors.signing import Signer

    issuer = "http://127.0.0.1:9"

    def service(pem: str, shared: Any) -> tuple[Any, str]:
        config = config_from_mapping({
            "name": "bench", "backends": [{"name": "echo", "url": "http://127.0.0.1:9/mcp"}],
            "incomingAuth": {"type": "oauth", "oauth": {
                "issuer": issuer, "signingKeyEnv": "BENCH_KEY",
                "upstream": {"issuer": "http://127.0.0.1:8", "clientId": "gw", "clientSecretEnv": "BENCH_SECRET"}}}})
        values = {"BENCH_KEY": pem, "BENCH_SECRET": "not-used"}
        held = oauth_secrets(config, lambda path, name: values.get(name) if name else None)
        built = build_oauth(config, held, shared, Signer(RECORDS_KEY.encode()))
        person = Person("https://idp.example", "alice", {"email": "alice@example.com"})
        grant = built.server.grants.start(person, "dcr_bench", config.incoming_auth.oauth.resource, "", {
            "access_token": "idp-at", "refresh_token": "idp-rt", "expires_at": time.time() + 3600})
        token = built.server.keys.sign({"iss": issuer, "sub": "alice", "aud": config.incoming_auth.oauth.resource,
                                        "client_id": "dcr_bench", "grant": grant.grant_id, "idp": person.issuer,
                                        "email": "alice@example.com"}, 3600)
        return built, f"Bearer {token}"

    ec, rsa = new_signing_key(), rsa_pem()
    memory_ec, memory_ec_token = service(ec, None)
    memory_rsa, memory_rsa_token = service(rsa, None)
    redis_ec, redis_ec_token = service(ec, redis_client)
    ticks = iter(range(1, 1 << 62))
    every_call = GatewayTokenAuthenticator(redis_ec.server, carries_upstream_token=False,
                                           clock=lambda: next(ticks) * (GRANT_RECHECK + 1))
    return {
        "gateway token ES256, records in memory": lambda: memory_ec.authenticator.authenticate(memory_ec_token),
        "gateway token RS256, records in memory": lambda: memory_rsa.authenticator.authenticate(memory_rsa_token),
        "gateway token ES256, records in Redis (grant seen live < 5 s ago)":
            lambda: redis_ec.authenticator.authenticate(redis_ec_token),
        "gateway token ES256, records in Redis, grant read every call": lambda: every_call.authenticate(redis_ec_token),
    }


def idp_token_modes(idp: Any) -> dict[str, Callable[[], Any]]:
    from vmcp_actors.config import config_from_mapping
    from vmcp_actors.edge._auth import OidcAuthenticator

    config = config_from_mapping({"name": "bench", "backends": [{"name": "echo", "url": "http://127.0.0.1:9/mcp"}],
                                  "incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer,
                                                                            "audience": AUDIENCE}}})
    authenticator = OidcAuthenticator(config.incoming_auth.oidc)
    rs256 = "Bearer " + idp.issue_token("alice", AUDIENCE, expires_in=3600)
    es256 = "Bearer " + idp.issue_token("alice", AUDIENCE, expires_in=3600, algorithm="ES256")
    return {"IdP token RS256 under type oidc": lambda: authenticator.authenticate(rs256),
            "IdP token ES256 under type oidc": lambda: authenticator.authenticate(es256)}


def validation(calls: int) -> dict[str, float]:
    import redis

    from tests.idp import LocalIdP
    from tests.redis_server import RedisServer

    server = RedisServer().start()
    try:
        with LocalIdP("bench-idp") as idp:
            client = redis.Redis(port=server.port)
            modes = {**gateway_token_modes(client), **idp_token_modes(idp)}
            for name, run in modes.items():  # warm (JWKS fetched, connection open) and right
                identity = run()
                assert identity.subject == "alice", (name, identity)
            wall = dict.fromkeys(modes, 0.0)
            for round_no in range(ROUNDS):
                for name in (list(modes) if round_no % 2 == 0 else list(modes)[::-1]):
                    run = modes[name]
                    started = time.perf_counter()
                    for _ in range(calls):
                        run()
                    wall[name] += time.perf_counter() - started
            client.close()
    finally:
        server.close()
    per = {name: wall[name] / (calls * ROUNDS) * 1e6 for name in modes}
    baseline = per["IdP token RS256 under type oidc"]
    print(f"### 1. token validation per /mcp request ({calls} calls x {ROUNDS} rounds per mode, interleaved)\n")
    print(table(["mode", "us per authenticate()", "/ IdP RS256 (oidc)"],
                [(name, f"{value:.0f}", f"{value / baseline:.2f}") for name, value in per.items()]))
    for name, value in per.items():
        record(f"validation: {name}: us", round(value, 1))
    return per


# --- serving ------------------------------------------------------------------------------


@contextlib.contextmanager
def served(config: dict[str, Any], port: int, env: dict[str, str], directory: Path, name: str) -> Iterator[str]:
    """``vmcp-actors serve`` (gunicorn) on ``port``, chosen first: the issuer, and the IdP's
    redirect URI, must be known before it starts."""
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    log = directory / f"{name}.log"
    run = vmcp_actors_invocation()
    base = f"http://127.0.0.1:{port}"
    with open(log, "ab") as out:
        proc = subprocess.Popen([*run.argv, "serve", "--config", str(path), "--host", "127.0.0.1", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=run.cwd,
                                env={**(run.env or os.environ), **env}, preexec_fn=_die_with_parent)
    try:
        if not _wait_ready(proc, base, 30.0):
            raise RuntimeError(f"{name} did not become ready:\n{_tail(log)}")
        yield base
    finally:
        _stop_process(proc)


def oauth_env(idp: Any, signing_key: str) -> dict[str, str]:
    from tests.oauth_gateway import (
        ADMIN_TOKEN,
        ADMIN_TOKEN_ENV,
        RECORDS_KEY_ENV,
        SIGNING_KEY_ENV,
        UPSTREAM_SECRET_ENV,
    )

    return {UPSTREAM_SECRET_ENV: idp.client_secret, SIGNING_KEY_ENV: signing_key, RECORDS_KEY_ENV: RECORDS_KEY,
            ADMIN_TOKEN_ENV: ADMIN_TOKEN}


def oauth_config(issuer: str, idp: Any, backend_url: str, **extra: Any) -> dict[str, Any]:
    from tests.oauth_gateway import ADMIN_TOKEN_ENV, oauth_block

    return {"name": "bench-oauth", "backends": [{"name": "echo", "url": backend_url}],
            "incomingAuth": {"type": "oauth", "oauth": oauth_block(issuer, idp, registrationsPerMinute=1000)},
            "admin": {"tokenEnv": ADMIN_TOKEN_ENV}, **extra}


@contextlib.contextmanager
def logging_browser() -> Iterator[Any]:
    """Headless Chromium (tests/oauth_browser.py's options) with Chrome's performance log on."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from tests.oauth_browser import _chromium, missing

    why = missing()
    if why is not None:
        raise RuntimeError(why)
    chromium, driver = _chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    chrome = webdriver.Chrome(service=Service(str(driver)), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


def fresh_browser(driver: Any) -> None:
    """No cookies (no IdP session, no sign-in cookie) and an empty performance log."""
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    driver.get_log("performance")


def sign_in(driver: Any, issuer: str, login: str, base: str | None = None) -> tuple[Any, dict[str, Any]]:
    """A registered client and its token answer, from a whole sign-in in a fresh browser."""
    from tests.oauth_gateway import RawOAuthClient

    fresh_browser(driver)
    client = RawOAuthClient(issuer, base=base)
    try:
        return client, client.sign_in(driver, login)
    finally:
        client.stop()


# --- 2. echo through both gateways -----------------------------------------------------------


def echo_overhead(calls: int, backend_url: str, oauth_base: str, oauth_token: str, idp: Any) -> dict[str, float]:
    extra = {"incomingAuth": {"type": "oidc", "oidc": {"issuer": idp.issuer, "audience": AUDIENCE}}}
    with gateway({"echo": backend_url}, extra=extra) as oidc_gateway:
        idp_token = idp.issue_token("alice", AUDIENCE, expires_in=3600)
        clients = {"direct": McpClient(backend_url),
                   "gateway, its own token (oauth)": McpClient(f"{oauth_base}/mcp",
                                                               headers={"Authorization": f"Bearer {oauth_token}"}),
                   "gateway, IdP token (oidc)": McpClient(oidc_gateway.url,
                                                          headers={"Authorization": f"Bearer {idp_token}"})}
        tool = {name: "echo" if name == "direct" else "echo_echo" for name in clients}
        samples = interleaved_calls(clients, tool, calls, lambda n: f"echo:{n}", WARMUP)
    p50 = {name: median(values) * 1000 for name, values in samples.items()}
    p99 = {name: percentile(values, 99) * 1000 for name, values in samples.items()}
    print(f"\n### 2. echo, sequential ({calls} calls per mode, rotating; legacy client with a session)\n")
    print(table(["mode", "p50", "p99", "p50 overhead over direct"],
                [(name, f"{p50[name]:.2f} ms", f"{p99[name]:.2f} ms",
                  "" if name == "direct" else f"+{p50[name] - p50['direct']:.2f} ms") for name in clients]))
    oauth, oidc = p50["gateway, its own token (oauth)"], p50["gateway, IdP token (oidc)"]
    print(f"\noauth / oidc: p50 {oauth / oidc:.2f}, overhead {(oauth - p50['direct']) / (oidc - p50['direct']):.2f} "
          f"({oauth - oidc:+.2f} ms)")
    for name in clients:
        record(f"echo p50: {name}: ms", round(p50[name], 3))
    return p50


# --- 3. a full login -------------------------------------------------------------------------


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def one_login(driver: Any, issuer: str, idp: Any, login: str) -> dict[str, Any]:
    """A client's first contact to its first /mcp answer; what it took."""
    from tests.oauth_browser import sign_in_pages
    from tests.oauth_gateway import RawOAuthClient

    fresh_browser(driver)
    codes_before = idp.token_requests().get("authorization_code", 0)
    http = requests.Session()
    client_requests = 0
    started = time.perf_counter()
    refused = http.post(f"{issuer}/mcp", json=INIT, headers=MCP_HEADERS, timeout=10)
    assert refused.status_code == 401, refused.text
    resource_metadata = refused.headers["WWW-Authenticate"].split('resource_metadata="')[1].split('"')[0]
    authorization_server = http.get(resource_metadata, timeout=10).json()["authorization_servers"][0]
    metadata = http.get(f"{authorization_server}/.well-known/oauth-authorization-server", timeout=10).json()
    client_requests += 3
    client = RawOAuthClient(issuer)  # POST /oauth/register
    client_requests += 1
    try:
        session, verifier = client.session(), secrets.token_urlsafe(48)
        url, state = client.authorization_url(session, verifier)
        _, pages = sign_in_pages(driver, url, login=login, stop_prefix=client.catcher.redirect_uri)
        redirect = client.catcher.wait()
        assert redirect["state"] == state
        token = session.fetch_token(metadata["token_endpoint"], code=redirect["code"], code_verifier=verifier,
                                    resource=f"{issuer}/mcp")
        answered = http.post(f"{issuer}/mcp", json=INIT, timeout=10,
                             headers={**MCP_HEADERS, "Authorization": f"Bearer {token['access_token']}"})
        client_requests += 2
        assert answered.status_code == 200, answered.text
        elapsed = time.perf_counter() - started
        browser = Counter()
        for entry in driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":  # one per request, redirects included
                sent = message["params"]["request"]["url"]
                if sent.startswith("http"):
                    browser[{origin(issuer): "gateway", idp.issuer: "IdP",
                             origin(client.catcher.redirect_uri): "client's redirect URI"}.get(origin(sent),
                                                                                                "other")] += 1
    finally:
        client.stop()
        http.close()
    return {"seconds": elapsed, "client": client_requests, "browser": browser, "pages": pages,
            "gateway to IdP token requests": idp.token_requests().get("authorization_code", 0) - codes_before}


def logins(driver: Any, issuer: str, idp: Any, count: int) -> list[dict[str, Any]]:
    one_login(driver, issuer, idp, "warm-up")  # the gateway reads the IdP's metadata and keys once
    done = [one_login(driver, issuer, idp, f"person-{n}") for n in range(count)]
    print(f"\n### 3. a full login, first contact to first /mcp answer (median of {count}, each in a fresh browser)\n")
    rows = []
    for n, login in enumerate(done, 1):
        browser = login["browser"]
        rows.append((n, f"{login['seconds'] * 1000:.0f} ms", login["client"],
                     ", ".join(f"{where} {browser[where]}" for where in sorted(browser)), sum(browser.values()),
                     login["gateway to IdP token requests"], " > ".join(login["pages"])))
    print(table(["login", "wall", "client requests", "browser requests by origin", "browser total",
                 "gateway -> IdP token requests", "pages acted on"], rows))
    seconds = median([login["seconds"] for login in done])
    total = median([login["client"] + sum(login["browser"].values()) + login["gateway to IdP token requests"]
                    for login in done])
    print(f"\nmedian: {seconds * 1000:.0f} ms, {total:.0f} HTTP requests in all")
    record("login: median ms", round(seconds * 1000, 1))
    record("login: median requests", total)
    return done


# --- 4. refreshes at RATE a minute over two workers ----------------------------------------------


def refresh_load(driver: Any, idp: Any, backend_url: str, ports: dict[str, int], signing_key: str, grants: int,
                 rate: float, duration: float, directory: Path) -> list[Check]:
    import redis

    from tests.integration.test_deploy import Nginx, rendered_site
    from tests.oauth_gateway import ADMIN_TOKEN, RECORDS_KEY_ENV
    from tests.redis_server import RedisServer
    import jwt

    from vmcp_actors.oauth._records import RedisOAuthRecords
    from vmcp_actors.signing import Signer

    server = RedisServer().start()
    issuer = f"http://127.0.0.1:{ports['nginx']}"
    config = oauth_config(issuer, idp, backend_url, **{
        "sessionStorage": {"provider": "redis", "address": server.address, "keyPrefix": PREFIX},
        "operational": {"signingKeyEnv": RECORDS_KEY_ENV}})
    env = oauth_env(idp, signing_key)
    nginx = Nginx(directory / "nginx", rendered_site(ports["nginx"], [ports["worker-1"], ports["worker-2"]]))
    try:
        with served(config, ports["worker-1"], env, directory, "worker-1") as first, \
                served(config, ports["worker-2"], env, directory, "worker-2") as second:
            nginx.start(ports["nginx"])
            workers = [first, second]
            signing_in = time.perf_counter()
            signed = [sign_in(driver, issuer, f"user-{n:03d}") for n in range(grants)]
            signing_in = time.perf_counter() - signing_in
            connection = redis.Redis(port=server.port)
            records = RedisOAuthRecords(connection, Signer(RECORDS_KEY.encode()), PREFIX)
            grant_ids = [jwt.decode(token["access_token"], options={"verify_signature": False})["grant"]
                         for _, token in signed]
            before = idp.token_requests().get("refresh_token", 0)
            refused_before = idp.failed_token_requests().get("refresh_token", 0)
            outcome = run_load(signed, grant_ids, records, workers, rate, duration)
            upstream = idp.token_requests().get("refresh_token", 0) - before
            refused = idp.failed_token_requests().get("refresh_token", 0) - refused_before
            per_worker = [requests.get(f"{base}/admin/oauth", timeout=10,
                                       headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()["upstreamRefreshes"]
                          for base in workers]
            lost = families_lost(signed, outcome["tokens"], workers, issuer)
            connection.close()
    finally:
        nginx.stop()
        server.close()
    answers = outcome["answers"]
    ok = [seconds for status, seconds in answers if status == 200]
    statuses = Counter(status for status, _ in answers)
    expected = outcome["expired"]
    print(f"\n### 4. refreshes over two workers sharing Redis ({grants} grants, two refresh loops each, "
          f"{rate:g}/min asked for {duration:g} s; {len(outcome['marks'])} expiry marks)\n")
    print(table(["measure", "value"], [
        ("sign-ins through nginx before the load", f"{grants} in {signing_in:.1f} s"),
        ("refreshes sent", len(answers)),
        ("rate achieved", f"{len(answers) / outcome['seconds'] * 60:.0f} a minute over {outcome['seconds']:.1f} s"),
        ("answered 200", len(ok)),
        ("other answers", ", ".join(f"{status}: {n}" for status, n in sorted(statuses.items()) if status != 200)
         or "none"),
        ("refresh latency p50 / p99", f"{percentile(ok, 50) * 1000:.1f} / {percentile(ok, 99) * 1000:.1f} ms"
         if ok else "-"),
        ("IdP tokens marked past their life", f"{expected} ({len(outcome['marks'])} marks, each over every live "
                                              f"grant of {grants})"),
        ("upstream refresh_token requests (IdP's count)", upstream),
        ("  of which the IdP refused", refused),
        ("upstream refreshes per worker (admin)", " + ".join(str(n) for n in per_worker)),
        ("families lost", lost),
    ]))
    record("refresh: answered", len(ok))
    record("refresh: families lost", lost)
    record("refresh: upstream", upstream)
    return [
        Check("refresh load: no family lost", f"{lost} of {grants}; {len(answers) - len(ok)} refreshes not 200",
              "0 and 0", lost == 0 and len(ok) == len(answers)),
        Check("refresh load: upstream refreshes == expiries", f"{upstream} for {expected} (refused: {refused})",
              f"== {expected} (> 0), none refused",
              0 < expected == upstream and refused == 0 and sum(per_worker) == upstream),
        Check("refresh load: rate", f"{len(answers) / outcome['seconds'] * 60:.0f} a minute",
              f">= 0.95 x {rate:g}", len(answers) / outcome["seconds"] * 60 >= 0.95 * rate),
    ]


def run_load(signed: list[tuple[Any, dict[str, Any]]], grant_ids: list[str], records: Any, workers: list[str],
             rate: float, duration: float) -> dict[str, Any]:
    """Two refresh loops per grant (slot 2g on the first worker, 2g + 1 on the second), the
    grants evenly spread at ``rate`` a minute in all, both loops of a grant at the same
    moments (so after each mark the two workers race to refresh its IdP token); a marker
    thread ends the IdP's tokens' life."""
    slots = len(signed) * 2
    interval = slots * 60.0 / rate  # between two refreshes of one loop
    lock = threading.Lock()  # guards answers
    answers: list[tuple[int, float]] = []
    tokens = [dict(signed[slot // 2][1]) for slot in range(slots)]
    start = time.monotonic() + 1.0
    end = start + duration
    marks: list[float] = []
    expired = [0]

    def loop(slot: int) -> None:
        client, base = signed[slot // 2][0], workers[slot % 2]
        http = requests.Session()
        pause = threading.Event()
        n = 0
        while (at := start + ((slot // 2) / (slots // 2) + n) * interval) < end:
            pause.wait(max(0.0, at - time.monotonic()))  # the schedule, not a stand-in for an event
            sent = time.perf_counter()
            try:
                answer = http.post(f"{base}/oauth/token", timeout=30, data={
                    "grant_type": "refresh_token", "refresh_token": tokens[slot]["refresh_token"],
                    "client_id": client.client_id})
                status = answer.status_code
            except requests.RequestException:
                status = 0
            with lock:
                answers.append((status, time.perf_counter() - sent))
            if status == 200:
                tokens[slot] = answer.json()
            n += 1
        http.close()

    def marker() -> None:
        pause = threading.Event()
        at = start + EXPIRY_FIRST
        while at < end - EXPIRY_TAIL:
            pause.wait(max(0.0, at - time.monotonic()))
            for grant in grant_ids:
                if records.update("upstream", grant, lambda kept: {**kept, "expires_at": time.time() - 1}) is not None:
                    expired[0] += 1
            marks.append(at - start)
            at += EXPIRY_EVERY

    threads = [threading.Thread(target=loop, args=(slot,), name=f"refresh-{slot}", daemon=True)
               for slot in range(slots)]
    threads.append(threading.Thread(target=marker, name="expiry-marker", daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(duration + 60)
    if any(thread.is_alive() for thread in threads):
        raise RuntimeError("refresh loops still running")
    return {"answers": answers, "tokens": tokens, "marks": marks, "expired": expired[0], "seconds": duration}


def families_lost(signed: list[tuple[Any, dict[str, Any]]], tokens: list[dict[str, Any]], workers: list[str],
                  issuer: str) -> int:
    """Grants of which a loop's latest refresh token no longer refreshes (on the other
    worker) or whose latest access token no longer calls a tool."""
    lost = 0
    for grant, (client, _) in enumerate(signed):
        fine = True
        for slot in (2 * grant, 2 * grant + 1):
            answer = requests.post(f"{workers[(slot + 1) % 2]}/oauth/token", timeout=30, data={
                "grant_type": "refresh_token", "refresh_token": tokens[slot]["refresh_token"],
                "client_id": client.client_id})
            fine = fine and answer.status_code == 200
            if answer.status_code == 200:
                with McpClient(f"{issuer}/mcp", headers={"Authorization": f"Bearer {answer.json()['access_token']}"}) \
                        as mcp:
                    mcp.initialize()
                    fine = fine and mcp.call_tool("echo_echo", {"text": "kept"})["content"][0]["text"] == "echo:kept"
        lost += 0 if fine else 1
    return lost


# --- the run ------------------------------------------------------------------------------------


def body(args: Any) -> list[Check]:
    from tests.backends import sdk_backend
    from tests.idp import LocalIdP
    from tests.oauth_gateway import new_signing_key
    from tests.oidc_idp import OidcIdP
    from tests.ports import free_port  # below the ephemeral range: chosen now, bound later

    print_header("oauth: the gateway as authorization server (issue 36)", "gunicorn", [
        "IdP: oidc-provider (tests/oidc_idp.py) for sign-ins; tests/idp.py LocalIdP for type oidc tokens",
        "browser: headless Chromium (tests/oauth_browser.py); Redis: a local redis-server; nginx: deploy/nginx.conf",
        "backend: the SDK echo backend (tests/backends.py sdk_backend), uvicorn in this process",
    ])
    validation(args.validations)
    ports = {"oauth": free_port(), "nginx": free_port(), "worker-1": free_port(), "worker-2": free_port()}
    signing_key = new_signing_key()
    with contextlib.ExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vmcp-bench-oauth-")))
        backend = sdk_backend("echo", ["echo"])
        stack.callback(backend.stop)
        backend_url = f"{backend.url}/mcp"
        idp = stack.enter_context(OidcIdP([f"http://127.0.0.1:{ports[name]}/oauth/callback"
                                           for name in ("oauth", "nginx")]))
        oidc_idp = stack.enter_context(LocalIdP("bench-idp"))
        driver = stack.enter_context(logging_browser())
        issuer = f"http://127.0.0.1:{ports['oauth']}"
        oauth_base = stack.enter_context(served(oauth_config(issuer, idp, backend_url), ports["oauth"],
                                                oauth_env(idp, signing_key), directory, "oauth"))
        _, token = sign_in(driver, issuer, "alice")
        echo_overhead(args.calls, backend_url, oauth_base, token["access_token"], oidc_idp)
        logins(driver, issuer, idp, args.logins)
        return refresh_load(driver, idp, backend_url, ports, signing_key, args.grants, args.rate, args.duration,
                            directory)


def main() -> None:
    def extra(parser: Any) -> None:
        parser.add_argument("--grants", type=int, default=20, help="grants refreshing in part 4")
        parser.add_argument("--rate", type=float, default=1000.0, help="refreshes a minute in part 4, in total")
        parser.add_argument("--duration", type=float, default=60.0, help="seconds of refresh load in part 4")
        parser.add_argument("--logins", type=int, default=5, help="logins measured in part 3")
        parser.add_argument("--calls", type=int, default=400, help="sequential echo calls per mode in part 2")
        parser.add_argument("--validations", type=int, default=1000, help="authenticate() calls per mode per round")

    args = parse_args(__doc__.splitlines()[0], extra=extra,
                      gunicorn_only="bench.oauth serves its gateways with gunicorn only (on ports chosen first, two "
                                    "of them sharing Redis)")
    run_benchmark(lambda: body(args), watchdog=max(300.0, args.duration + 240.0))


if __name__ == "__main__":
    main()
