"""Real OAuth MCP clients signing in to the gateway as their authorization server (issue 36):
mcp-remote, the TypeScript SDK's client and the Python SDK's ``OAuthClientProvider``
(tests/oauth_clients.py), each going through the whole flow in a headless browser (the
gateway's consent page and the upstream IdP's login and consent pages), then listing and
calling tools through the gateway. A second session of each signs in from what it stored,
without the browser. The Python SDK also signs in with a client ID metadata document served
over HTTPS on loopback; a client keeps working past its access token's life by refreshing;
and two people signed in through two clients at once each get their own catalog (a Cedar
policy on the IdP's subject).

Needs ``scripts/install-node-mcp`` (oidc-provider, the TypeScript SDK, mcp-remote) and
``scripts/install-browser`` (headless Chromium): skips without them, fails under CI.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jwt
import pykka
import pytest
import requests
from mcp.shared.exceptions import MCPError

from tests.backends import sdk_backend
from tests.gateway import backend_entry, wait_until
from tests.node_mcp import need_node_mcp
from tests.oauth_browser import GATEWAY_CONSENT, IDP_CONSENT, IDP_LOGIN, browser, need_browser, sign_in_pages
from tests.oauth_clients import (
    CimdDocumentServer,
    McpRemoteClient,
    PythonSdkClient,
    ToolCall,
    TsSdkClient,
    no_browser,
)
from tests.oauth_gateway import ADMIN_TOKEN, SignInGateway
from tests.ports import free_port

pytestmark = pytest.mark.timeout(120)

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# The IdP's people. carol signs in wherever one person is enough; alice and bob only in the
# test of two people at once, so what the gateway shows of them comes from that test.
USERS = {login: {"email": f"{login}@example.com", "name": login.title()} for login in ("alice", "bob", "carol")}
# alpha_whoami is alice's only (principal: the IdP's subject); alpha_echo everyone's.
POLICIES = ['permit(principal, action, resource) unless { resource == Tool::"alpha_whoami" };',
            'permit(principal == Client::"alice", action == Action::"call_tool", resource == Tool::"alpha_whoami");']
EVERY_TOOL = ["alpha_echo", "alpha_whoami"]
# Every page of a first sign-in, once each (in the order the gateway sends the browser through them).
FULL_SIGN_IN = sorted([IDP_LOGIN, IDP_CONSENT, GATEWAY_CONSENT])


@pytest.fixture(autouse=True)
def stop_all_actors():
    """Overrides the conftest fixture: the module's gateway serves every test, so its
    actors outlive a test; the module's fixture stops it (and a test's own gateway, its)."""
    yield


@dataclass
class Setup:
    gateway: SignInGateway
    driver: Any
    document: CimdDocumentServer
    cimd_callback_port: int  # the redirect URI's port in the document: the CIMD client's


@pytest.fixture(scope="module")
def setup():
    need_browser()
    need_node_mcp()
    backend = sdk_backend("alpha", ["echo", "whoami"])
    cimd_callback_port = free_port()
    gateway = None
    try:
        with CimdDocumentServer([f"http://127.0.0.1:{cimd_callback_port}/callback"],
                                client_name="vmcp-actors CIMD test client") as document:
            # The document is on loopback: only an allowedHosts entry lets the gateway fetch it,
            # and only with the trustme CA that signed its certificate.
            cimd = {"allowedHosts": [urlsplit(document.url).netloc], "caBundle": document.ca_pem_path}
            gateway = SignInGateway([backend_entry("alpha", backend)], oauth={"cimd": cimd}, idp={"users": USERS},
                                    extra={"audit": {"enabled": True}}, authz={"type": "cedar", "policies": POLICIES})
            with browser() as driver:
                yield Setup(gateway, driver, document, cimd_callback_port)
    finally:
        if gateway is not None:
            gateway.stop()
        backend.stop()
        pykka.ActorRegistry.stop_all(block=True, timeout=5)


# -- the person at the browser -----------------------------------------------------------------


@dataclass
class SignIn:
    pages: list[str]  # the pages acted on, sorted (the gateway decides the order)
    client_domain: str  # what the gateway's consent page said about who publishes the client


@dataclass
class Person:
    """A client's ``open_url``: ``login`` signing in through ``driver`` in a fresh browser
    session (no cookies: the IdP's login and consent pages come every time), up to the client's
    redirect URI (``stop_prefix``). The gateway's consent page is read (``#client-domain``),
    then loaded again (a GET only shows it) and approved. Clients call ``open_url`` on a
    thread of their own: the lock keeps the driver to one thread at a time."""

    driver: Any
    issuer: str
    login: str
    stop_prefix: str
    sign_ins: list[SignIn] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, authorization_url: str) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        with self._lock:
            self.driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
            consent = f"{self.issuer}/oauth/consent"
            _, before = sign_in_pages(self.driver, authorization_url, login=self.login, stop_prefix=consent)
            domain = WebDriverWait(self.driver, 15).until(
                lambda d: d.find_element(By.ID, "client-domain")).text
            _, after = sign_in_pages(self.driver, self.driver.current_url, login=self.login,
                                     stop_prefix=self.stop_prefix)
            self.sign_ins.append(SignIn(sorted(before + after), domain))


def authorization_request(url: str) -> dict[str, str]:
    return {key: values[0] for key, values in parse_qs(urlsplit(url).query).items()}


def admin_oauth(gateway: SignInGateway) -> dict[str, Any]:
    answer = requests.get(f"{gateway.issuer}/admin/oauth", headers=ADMIN, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()


def grants_of(gateway: SignInGateway, client_id: str) -> set[str]:
    """Who holds a live grant for ``client_id``."""
    return {grant["user"] for grant in admin_oauth(gateway)["grants"] if grant["client_id"] == client_id}


def oauth_audit(caplog: Any, event: str) -> list[dict[str, Any]]:
    """The gateway's audit lines about its authorization server's ``event``, as dicts."""
    lines = [json.loads(record.getMessage()) for record in caplog.records if record.name == "vmcp_actors.audit"]
    return [line for line in lines if line.get("type") == "oauth" and line.get("event") == event]


# -- each client signs in through the browser, then from what it stored ------------------------

# Each client as a test starts it, and the revision it speaks to the gateway (mcp-remote: its
# stdio client's, passed through by its default --protocol legacy). The Python SDK's two modes
# differ: "legacy" initializes a 2025-11-25 session, "auto" finds 2026-07-28 by server/discover
# and keeps no session.
CLIENTS = {
    "mcp-remote": (lambda tmp_path: McpRemoteClient(config_dir=tmp_path / "mcp-remote"), "2025-11-25"),
    "ts-sdk": (lambda tmp_path: TsSdkClient(store=tmp_path / "ts-store.json"), "2025-11-25"),
    "python-sdk-legacy": (lambda tmp_path: PythonSdkClient(mode="legacy"), "2025-11-25"),
    "python-sdk-auto": (lambda tmp_path: PythonSdkClient(mode="auto"), "2026-07-28"),
}
PYTHON_SDK_CLIENT_INFO = "mcp"  # the name mcp.Client gives in clientInfo


def sessions_of(gateway: SignInGateway, subject: str, client_name: str) -> list[str]:
    """The revisions of the gateway's live sessions of ``subject`` opened by ``client_name``."""
    state = requests.get(f"{gateway.issuer}/admin/state", headers=ADMIN, timeout=10).json()
    return [session["protocolVersion"] for session in state["sessions"]
            if session["subject"] == subject and session["clientInfo"].get("name") == client_name]


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_real_client_signs_in_through_both_consent_pages_then_reuses_its_tokens(setup, tmp_path, kind):
    gateway = setup.gateway
    make, version = CLIENTS[kind]
    client = make(tmp_path)
    carol = Person(setup.driver, gateway.issuer, "carol", client.redirect_uri)
    during: list[list[str]] = []  # the Python SDK: its sessions at the gateway, while it is connected
    look = {"before_call": lambda: during.append(sessions_of(gateway, "carol", PYTHON_SDK_CLIENT_INFO))} \
        if isinstance(client, PythonSdkClient) else {}

    first = client.run(gateway.mcp_url, carol, ToolCall("alpha_echo", {"text": kind}), **look)
    assert [sign_in.pages for sign_in in carol.sign_ins] == [FULL_SIGN_IN]
    assert carol.sign_ins[0].client_domain.startswith("unverified")  # registered dynamically
    assert len(first.authorization_urls) == 1
    assert first.authorization_urls[0].startswith(f"{gateway.issuer}/oauth/authorize?")
    asked = authorization_request(first.authorization_urls[0])
    assert asked["resource"] == gateway.mcp_url and asked["code_challenge_method"] == "S256"
    registered = client.registered()
    assert asked["client_id"] == registered["client_id"] and not registered["client_id"].startswith("https://")
    if first.callback is not None:  # mcp-remote keeps its callback to itself (and checks iss: RFC 9207)
        assert first.callback.get("iss") == gateway.issuer
    assert first.tools == ["alpha_echo"]  # alpha_whoami is alice's
    assert (first.call_text, first.call_is_error) == (f"alpha:{kind}", False)
    assert first.protocol_version == version
    if look:
        assert during == [[version] if kind == "python-sdk-legacy" else []]
    assert not first.reused_tokens
    stored = client.stored_tokens()
    assert stored["refresh_token"] and stored["token_type"].lower() == "bearer"
    assert jwt.decode(stored["access_token"], options={"verify_signature": False})["sub"] == "carol"
    assert grants_of(gateway, registered["client_id"]) == {"carol"}
    rows = [row for row in admin_oauth(gateway)["clients"] if row["clientId"] == registered["client_id"]]
    assert [(row["kind"], row["verifiedDomain"], row["grants"]) for row in rows] == [("dcr", None, 1)]

    second = client.run(gateway.mcp_url, no_browser, ToolCall("alpha_echo", {"text": "again"}))
    assert second.reused_tokens and not second.refreshed
    assert len(carol.sign_ins) == 1
    assert second.tools == ["alpha_echo"]
    assert (second.call_text, second.call_is_error) == ("alpha:again", False)
    assert second.protocol_version == version


# -- a client ID metadata document -------------------------------------------------------------


def test_the_python_sdk_signs_in_with_a_metadata_document_the_gateway_fetched_and_shows_verified(setup):
    gateway, document = setup.gateway, setup.document
    metadata = requests.get(f"{gateway.issuer}/.well-known/oauth-authorization-server", timeout=10).json()
    assert metadata["client_id_metadata_document_supported"] is True
    client = PythonSdkClient(mode="auto", cimd_url=document.url, callback_port=setup.cimd_callback_port)
    assert document.document["redirect_uris"] == [client.redirect_uri]
    carol = Person(setup.driver, gateway.issuer, "carol", client.redirect_uri)
    fetches_before = document.fetches

    first = client.run(gateway.mcp_url, carol, ToolCall("alpha_echo", {"text": "cimd"}))
    assert document.fetches > fetches_before  # the gateway fetched the document, over https
    assert document.last_headers["Accept"] == "application/json"
    assert [sign_in.pages for sign_in in carol.sign_ins] == [FULL_SIGN_IN]
    assert carol.sign_ins[0].client_domain.startswith("localhost ")  # verified: the document's host
    asked = authorization_request(first.authorization_urls[0])
    assert asked["client_id"] == document.url
    assert client.registered()["client_id"] == document.url  # no registration: the URL is the id
    assert first.callback == {"iss": gateway.issuer}
    assert (first.call_text, first.call_is_error) == ("alpha:cimd", False)
    assert first.protocol_version == "2026-07-28"
    assert grants_of(gateway, document.url) == {"carol"}
    rows = [row for row in admin_oauth(gateway)["clients"] if row["clientId"] == document.url]
    assert [(row["kind"], row["grants"]) for row in rows] == [("cimd", 1)]

    second = client.run(gateway.mcp_url, no_browser, ToolCall("alpha_echo", {"text": "again"}))
    assert second.reused_tokens and (second.call_text, second.call_is_error) == ("alpha:again", False)


# -- refreshing past the access token's life ---------------------------------------------------

ACCESS_TOKEN_TTL = 2  # seconds: short enough to wait out, long enough to list tools within


@pytest.fixture(scope="module")
def short_lived(setup):
    """A gateway of its own whose access tokens live ACCESS_TOKEN_TTL seconds (the module's
    browser signs in to it)."""
    backend = sdk_backend("alpha", ["echo"])
    try:
        gateway = SignInGateway([backend_entry("alpha", backend)], oauth={"accessTokenTtl": f"{ACCESS_TOKEN_TTL}s"},
                                extra={"audit": {"enabled": True}})
        try:
            yield gateway
        finally:
            gateway.stop()
    finally:
        backend.stop()


def token_grants(caplog: Any, client_id: str) -> list[str]:
    """The grant types of the tokens the gateway issued to ``client_id``, in order (its audit lines)."""
    return [line["grant_type"] for line in oauth_audit(caplog, "token") if line.get("client") == client_id]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_python_sdk_session_outlasting_its_access_token_refreshes_and_keeps_working(setup, short_lived, caplog,
                                                                                      mode):
    gateway = short_lived
    client = PythonSdkClient(mode=mode)
    carol = Person(setup.driver, gateway.issuer, "carol", client.redirect_uri)
    outlived: list[str] = []

    def outlive_the_token() -> None:
        """Between the list and the call: wait (time is what is under test) until the access
        token is past the life the gateway gave it, by the SDK's own reckoning."""
        tokens = client.storage.tokens
        assert tokens.expires_in == ACCESS_TOKEN_TTL
        outlived.append(tokens.access_token)
        assert wait_until(lambda: time.time() > client.storage.saved_at + tokens.expires_in, timeout=10)

    with caplog.at_level(logging.INFO, logger="vmcp_actors.audit"):
        run = client.run(gateway.mcp_url, carol, ToolCall("alpha_echo", {"text": "late"}),
                         before_call=outlive_the_token)
    assert len(carol.sign_ins) == 1 and run.tools == ["alpha_echo"]
    assert (run.call_text, run.call_is_error) == ("alpha:late", False)
    client_id = client.registered()["client_id"]
    grants = token_grants(caplog, client_id)
    assert grants[0] == "authorization_code" and grants[-1] == "refresh_token", grants
    assert set(grants[1:]) == {"refresh_token"}, grants
    old = jwt.decode(outlived[0], options={"verify_signature": False})
    new = jwt.decode(client.storage.tokens.access_token, options={"verify_signature": False})
    assert new["iat"] >= old["exp"]  # the call went with a token issued after the first one's end
    assert (new["sub"], new["grant"]) == ("carol", old["grant"])  # the same sign-in, refreshed


def test_mcp_remote_refreshes_a_stored_token_past_its_life_without_the_browser(setup, short_lived, caplog, tmp_path):
    gateway = short_lived
    client = McpRemoteClient(config_dir=tmp_path / "mcp-remote")
    carol = Person(setup.driver, gateway.issuer, "carol", client.redirect_uri)
    first = client.run(gateway.mcp_url, carol, ToolCall("alpha_echo", {"text": "first"}))
    assert len(carol.sign_ins) == 1 and (first.call_text, first.call_is_error) == ("alpha:first", False)
    stored = client.stored_tokens()
    assert stored["expires_in"] == ACCESS_TOKEN_TTL
    # time is what is under test: the stored token's life (mcp-remote's expires_at, in ms) ends
    assert wait_until(lambda: time.time() * 1000 > stored["expires_at"], timeout=10)

    with caplog.at_level(logging.INFO, logger="vmcp_actors.audit"):
        second = client.run(gateway.mcp_url, no_browser, ToolCall("alpha_echo", {"text": "second"}))
    assert second.reused_tokens and second.refreshed
    assert (second.call_text, second.call_is_error) == ("alpha:second", False)
    # mcp-remote refreshes a token with less than a minute left before each request it sends, so
    # with a 2 s life every request of the session refreshes: several grants, all refreshes
    grants = token_grants(caplog, client.registered()["client_id"])
    assert grants and set(grants) == {"refresh_token"}, grants
    assert client.stored_tokens()["access_token"] != stored["access_token"]


# -- two people through two clients at once ----------------------------------------------------


def test_two_people_signed_in_through_two_clients_at_once_get_their_own_catalogs(setup, tmp_path):
    gateway = setup.gateway
    alice_client = TsSdkClient(store=tmp_path / "alice.json")
    bob_client = PythonSdkClient(mode="auto")
    with browser() as bobs_browser:  # bob signs in on a browser of his own, at the same time
        alice = Person(setup.driver, gateway.issuer, "alice", alice_client.redirect_uri)
        bob = Person(bobs_browser, gateway.issuer, "bob", bob_client.redirect_uri)
        with ThreadPoolExecutor(2) as pool:
            alices = pool.submit(alice_client.run, gateway.mcp_url, alice, ToolCall("alpha_whoami"))
            bobs = pool.submit(bob_client.run, gateway.mcp_url, bob, ToolCall("alpha_echo", {"text": "bob"}))
            alices, bobs = alices.result(), bobs.result()
    assert [sign_in.pages for sign_in in alice.sign_ins + bob.sign_ins] == [FULL_SIGN_IN, FULL_SIGN_IN]
    assert sorted(alices.tools) == EVERY_TOOL and (alices.call_text, alices.call_is_error) == ("alpha", False)
    assert sorted(bobs.tools) == ["alpha_echo"] and (bobs.call_text, bobs.call_is_error) == ("alpha:bob", False)
    for client, login in ((alice_client, "alice"), (bob_client, "bob")):
        claims = jwt.decode(client.stored_tokens()["access_token"], options={"verify_signature": False})
        assert (claims["sub"], claims["email"]) == (login, f"{login}@example.com")
        assert grants_of(gateway, client.registered()["client_id"]) == {login}
    state = requests.get(f"{gateway.issuer}/admin/state", headers=ADMIN, timeout=10).json()
    assert {"alice", "bob"} <= {user["user"] for user in state["users"]}

    # bob cannot call what he was not shown, even by name
    with pytest.raises(MCPError, match="Unknown tool: alpha_whoami"):
        bob_client.run(gateway.mcp_url, no_browser, ToolCall("alpha_whoami"))
