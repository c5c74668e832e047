"""Connect on first use (issue 37) for several people: a real OAuth-protected MCP backend
(``tests.connect_backend``: the SDK's resource server, oidc-provider as its authorization
server with registration, PKCE, resource indicators, JWT access tokens, rotated refresh
tokens and revocation), the gateway as its clients' authorization server in front of
oidc-provider, a headless browser for the people. Each person's MCP client is Authlib's
(``RawOAuthClient``) without URL elicitation: it gets the connect link in an isError result.

Whose token reaches the backend is told by the backend itself (its ``whoami`` tool answers
the token's subject); what the gateway keeps is read from its admin API, its pages and, for
the tokens the assertions look for, its records. No assertion message shows a token.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import pykka
import pytest
import requests

from tests.connect_backend import WhoamiBackend
from tests.gateway import answer_of
from tests.oauth_browser import POLL, browser, need_browser, sign_in_pages
from tests.oauth_gateway import ADMIN_TOKEN, RawOAuthClient, SignInGateway, mcp_post
from vmcp_actors.web._installed import EXTENSION_KEY
from vmcp_actors.web.connections import BROWSER_COOKIE

BACKEND = "whoami"
TOOL = "whoami_whoami"  # the backend's tool, as the gateway lists it
CONNECT_TOOL = "connect_whoami"
# The backend's access tokens live 4 s: the gateway renews them halfway, so every test
# also runs across refreshes, and a grant ended at the backend's server shows within one.
ACCESS_TOKEN_TTL = 4
SETTLE = 30.0  # the most an eventually consistent view (a session's tool list) may take
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
LINK = re.compile(r"(https?://\S+/connect/\S+)$")
TICKET = re.compile(r"^[A-Za-z0-9_-]{20,100}$")


@pytest.fixture(autouse=True)
def stop_all_actors():
    """Overrides the conftest fixture: the module's gateway serves every test; the module's
    fixture stops it."""
    yield


@dataclass(frozen=True)
class World:
    """What the module's tests share: the gateway (and its IdP), the backend (and its
    authorization server), one browser that each person uses in turn."""

    gateway: SignInGateway
    backend: WhoamiBackend
    driver: Any
    logs: list[str] = field(repr=False)  # every log line of the gateway's code (vmcp_actors.*) in the module
    events_before: dict[tuple[str, str], float] = field(default_factory=dict)  # the metrics before the pair

    @property
    def callback(self) -> str:
        return f"{self.gateway.issuer}/connect/callback"


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def gateway_logs() -> Iterator[list[str]]:
    """The gateway's log lines, at every level (audit lines included)."""
    lines: list[str] = []
    logger = logging.getLogger("vmcp_actors")
    handler, level = _Lines(lines), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture(scope="module")
def world():
    need_browser()
    backend = WhoamiBackend(access_token_ttl=ACCESS_TOKEN_TTL)
    gateway = None
    try:
        with gateway_logs() as logs:
            gateway = SignInGateway([{"name": BACKEND, "url": backend.mcp_url}],
                                    extra={"outgoingAuth": {"backends": {BACKEND: {"type": "oauth"}}},
                                           "audit": {"enabled": True}})
            with browser() as driver:
                yield World(gateway, backend, driver, logs)
    finally:
        if gateway is not None:
            gateway.stop()
        backend.stop()
        pykka.ActorRegistry.stop_all(block=True, timeout=5)


# -- people and their MCP clients ---------------------------------------------------------


@dataclass
class Person:
    """A signed-in person's MCP client (no URL elicitation) with its gateway session."""

    login: str
    gateway_tokens: dict[str, Any] = field(repr=False)  # the gateway's answer to the client's sign-in
    session: str
    mcp_url: str
    cookie: str = field(default="", repr=False)  # their browser's connect cookie, once they connected

    @property
    def token(self) -> str:
        return self.gateway_tokens["access_token"]

    def rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        answer = mcp_post(self.mcp_url, self.token, {"jsonrpc": "2.0", "id": 2, "method": method, "params": params},
                          **{"Mcp-Session-Id": self.session})
        assert answer.status_code == 200, (answer.status_code, answer.text[:300])
        return answer_of(answer)

    def tools(self) -> list[str]:
        listed = self.rpc("tools/list", {})
        return [tool["name"] for tool in listed["result"]["tools"]]

    def call(self, name: str) -> dict[str, Any]:
        """The call's result (its error, should there be one, fails the test)."""
        called = self.rpc("tools/call", {"name": name, "arguments": {}})
        assert "result" in called, called
        return called["result"]

    def whoami(self) -> dict[str, Any]:
        """What the backend said of the token the call came with: ``{"sub", "tokens"}``."""
        result = self.call(TOOL)
        assert result.get("isError") is not True, result
        return result["structuredContent"]

    def asked_to_connect(self) -> str:
        """Call the connect tool, which must answer with the connect link; the link."""
        result = self.call(CONNECT_TOOL)
        assert result.get("isError") is True, result
        text = result["content"][0]["text"]
        found = LINK.search(text)
        assert found, text
        return found.group(1)

    def wait_for_tools(self, wanted: list[str] | None = None, without: str | None = None) -> list[str]:
        """The session's tool list once it has ``wanted`` and not ``without`` (a connect
        reaches a session's list a moment after the callback)."""
        deadline = time.monotonic() + SETTLE
        while True:
            names = self.tools()
            if all(name in names for name in wanted or ()) and without not in names:
                return names
            assert time.monotonic() < deadline, f"{self.login}'s tools stayed {names}"
            time.sleep(0.1)  # polling an eventually consistent list


def sign_in(world: World, login: str) -> Person:
    """``login`` signs in to their MCP client (in a browser of their own: the cookies of
    whoever used it before are gone) and opens a session."""
    world.driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    client = RawOAuthClient(world.gateway.issuer, name=f"{login}'s app")
    try:
        tokens = client.sign_in(world.driver, login)
    finally:
        client.stop()
    opened = mcp_post(world.gateway.mcp_url, tokens["access_token"], INIT)
    assert opened.status_code == 200, opened.text[:300]
    session = opened.headers["Mcp-Session-Id"]
    mcp_post(world.gateway.mcp_url, tokens["access_token"], {"jsonrpc": "2.0", "method": "notifications/initialized"},
             **{"Mcp-Session-Id": session})
    return Person(login, tokens, session, world.gateway.mcp_url)


def connect_in_browser(world: World, link: str, login: str) -> None:
    """The person opens ``link`` in their browser and goes through the pages to the
    gateway's callback, which must say connected."""
    sign_in_pages(world.driver, link, login=login, stop_prefix=world.callback)
    message = page_message(world)
    assert message.startswith(f"Connected to {BACKEND}."), message


def connected(world: World, person: Person) -> None:
    """``person`` connects the backend from the link their client was given, and its
    tool takes the connect tool's place in their session."""
    assert person.tools() == [CONNECT_TOOL]
    connect_in_browser(world, person.asked_to_connect(), person.login)
    person.cookie = browser_cookie(world)
    person.wait_for_tools([TOOL], without=CONNECT_TOOL)


@pytest.fixture(scope="module")
def pair(world) -> tuple[Person, Person]:
    """Alice and Bob, each signed in to their client and connected (each test leaves them so)."""
    world.events_before.update(connection_events(world))
    alice = sign_in(world, "alice")
    connected(world, alice)
    bob = sign_in(world, "bob")  # the browser is bob's from here on
    connected(world, bob)
    return alice, bob


def element(world: World, selector: str) -> Any:
    """The element of the browser's page at ``selector`` (CSS), once the page has it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(world.driver, SETTLE, poll_frequency=POLL).until(
        lambda driver: (driver.find_elements(By.CSS_SELECTOR, selector) or [False])[0])


def page_message(world: World) -> str:
    """The text of the gateway page's message, once the page has one."""
    return element(world, "#message").text


def press(world: World, selector: str) -> str:
    """Press the button at ``selector`` on the browser's page: the URL of the page its
    form's navigation led to. A navigation the page's own Content-Security-Policy
    blocks fails the test, naming the directive."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    world.driver.execute_script("window.vmcpBlocked = null; document.addEventListener('securitypolicyviolation', "
                                "event => { window.vmcpBlocked = event.violatedDirective; });")
    element(world, selector).click()
    # "blocked: <directive>" while this page stays; "left" once another page has replaced it.
    outcome = WebDriverWait(world.driver, SETTLE, poll_frequency=POLL, ignored_exceptions=(WebDriverException,)).until(
        lambda driver: driver.execute_script(
            "if ('vmcpBlocked' in window) return window.vmcpBlocked && 'blocked: ' + window.vmcpBlocked;"
            "return document.readyState === 'complete' && 'left';"))
    assert outcome == "left", f"the page's own Content-Security-Policy ({outcome}) blocked its form's navigation"
    return world.driver.current_url


def browser_cookie(world: World) -> str:
    """The browser's connect cookie (who it is to the gateway's connect pages)."""
    cookie = world.driver.get_cookie(BROWSER_COOKIE)
    assert cookie is not None, "the browser has no connect cookie"
    return cookie["value"]


# -- what the gateway and the backend's server keep ---------------------------------------


def overview(world: World) -> tuple[dict[str, Any], str]:
    """``GET /admin/connections``: its JSON and its text."""
    answer = requests.get(f"{world.gateway.issuer}/admin/connections",
                          headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
    assert answer.status_code == 200, answer.text[:300]
    return answer.json(), answer.text


def connected_people(world: World) -> dict[str, dict[str, Any]]:
    """The admin overview's rows for this backend, by person."""
    rows = overview(world)[0]["connections"]
    return {row["user"]: row for row in rows if row["backend"] == BACKEND}


def stored(world: World, login: str) -> dict[str, Any] | None:
    """The gateway's connection record of ``login`` (with the backend's tokens: for the
    assertions that look for them, never for a message)."""
    connections = world.gateway.gateway.app.extensions[EXTENSION_KEY].connect.connections
    for key in connections.records.keys("connection"):
        record = connections.records.get("connection", key)
        if record is not None and record["person"][1] == login and record["backend"] == BACKEND:
            return record
    return None


def has_record(world: World, login: str) -> bool:
    return stored(world, login) is not None


def backend_tokens(world: World, *logins: str) -> list[str]:
    tokens = []
    for login in logins:
        record = stored(world, login)
        assert record is not None, f"no connection stored for {login}"
        tokens += [token for token in (record["access_token"], record.get("refresh_token")) if token]
    return tokens


def shows_any(text: str, tokens: list[str]) -> bool:
    """Whether any of ``tokens`` is in ``text``. (Assertions take its answer from a name:
    pytest would show the arguments of a call in the assert statement itself.)"""
    return any(token in text for token in tokens)


def connection_events(world: World) -> dict[tuple[str, str], float]:
    """The counts of the ``vmcp_connection_events`` family on /metrics, by (event, outcome)."""
    text = requests.get(f"{world.gateway.issuer}/metrics", timeout=10).text
    counts: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("vmcp_connection_events") and "{" in line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            if name not in ("vmcp_connection_events", "vmcp_connection_events_total"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', rest.partition("}")[0]))
            counts[(labels.get("event", ""), labels.get("outcome", ""))] = float(rest.rpartition(" ")[2])
    return counts


def post_form(world: World, action: str, form: dict[str, str], cookie: str) -> requests.Response:
    """A form of the /connections page posted by the browser of ``cookie``, from the page's origin."""
    return requests.post(f"{world.gateway.issuer}/connections/{action}", data=form, cookies={BROWSER_COOKIE: cookie},
                         headers={"Origin": world.gateway.issuer}, allow_redirects=False, timeout=10)


def with_query(url: str, **changes: str | None) -> str:
    """``url`` with its query's parameters changed (None: left out)."""
    parts = urlsplit(url)
    query = {name: values[0] for name, values in parse_qs(parts.query).items()}
    changed = {name: value for name, value in {**query, **changes}.items() if value is not None}
    return urlunsplit(parts._replace(query=urlencode(changed)))


def open_callback(url: str, cookie: str | None) -> requests.Response:
    """The browser (its connect cookie, or none) coming back to the gateway at ``url``."""
    return requests.get(url, cookies={BROWSER_COOKIE: cookie} if cookie else {}, allow_redirects=False, timeout=15)


def held_back_callback(world: World, link: str, cookie: str, login: str) -> str:
    """A real authorization response for ``link``'s connect, held back: the browser of
    ``cookie`` opens the link (the gateway starts a flow and sends it to the backend's
    server), and ``login`` authorizes there; the redirect back, not yet followed."""
    started = requests.get(link, cookies={BROWSER_COOKIE: cookie}, allow_redirects=False, timeout=15)
    assert started.status_code == 303, started.status_code
    location = started.headers["Location"]
    assert location.startswith(f"{world.backend.auth.issuer}/auth?"), "the link did not lead to the backend's server"
    return world.backend.auth.authorize(location, login, stop_prefix=world.callback)


# -- the tests -------------------------------------------------------------------------------


def test_two_people_connect_the_same_backend_and_each_call_carries_their_own_token(world, pair):
    alice, bob = pair
    events_before = world.events_before
    assert bob.whoami()["sub"] == "bob"
    assert alice.whoami()["sub"] == "alice", "bob's connect replaced alice's"

    # The backend took each person's own token, and never got a gateway token.
    for person in (alice, bob):
        took = world.backend.accepted(stored(world, person.login)["access_token"])
        assert took, f"the backend never took the token the gateway keeps for {person.login}"
        sent = any(world.backend.received(person.gateway_tokens[name]) for name in ("access_token", "refresh_token"))
        assert not sent, f"{person.login}'s gateway token reached the backend"

    # The operator sees both connections, without a token.
    people = connected_people(world)
    assert {"alice", "bob"} <= set(people), people
    assert people["alice"]["state"] == people["bob"]["state"] == "connected"
    _, text = overview(world)
    tokens = backend_tokens(world, "alice", "bob") + [alice.token, bob.token]
    shown = shows_any(text, tokens)
    assert not shown, "GET /admin/connections shows a token"
    named = "access_token" in text or "refresh_token" in text
    assert not named, "GET /admin/connections has a token field"

    # Bob's own page (his browser) lists the connection, without a token.
    page = requests.get(f"{world.gateway.issuer}/connections", cookies={BROWSER_COOKIE: bob.cookie}, timeout=10)
    assert re.search(rf'id="backend-{BACKEND}">.*?class="state">connected<', page.text, re.S), page.text[:500]
    shown = shows_any(page.text, tokens)
    assert not shown, "the /connections page shows a token"

    # Counted and logged, without a token.
    events = connection_events(world)
    assert events.get(("connect", "ok"), 0) - events_before.get(("connect", "ok"), 0) == 2, events
    audit = [json.loads(line) for line in world.logs if line.startswith("{") and '"type":"connection"' in line]
    connects = {line.get("user") for line in audit if (line["event"], line["outcome"]) == ("connect", "ok")}
    assert {"alice", "bob"} <= connects, audit
    logged = shows_any("\n".join(world.logs), tokens + backend_tokens(world, "alice", "bob"))
    assert not logged, "the gateway logged a token"


def test_disconnecting_revokes_at_the_backends_server_and_leaves_the_other_connected(world, pair):
    dave, carol = pair  # alice stays; bob disconnects
    assert world.backend.auth.grants().get(carol.login) == 1 and world.backend.auth.grants().get(dave.login) == 1
    revoked_before = world.backend.auth.revoked_at_endpoint()
    cookie = carol.cookie

    # The page's disconnect form needs its csrf value: without it (or with another) nothing changes.
    for form in ({"backend": BACKEND}, {"backend": BACKEND, "csrf": secrets.token_urlsafe(24)}):
        refused = post_form(world, "disconnect", form, cookie)
        assert refused.status_code == 403, refused.status_code
    assert carol.login in connected_people(world)

    # The form as the page has it, sent from the page's origin.
    page = requests.get(f"{world.gateway.issuer}/connections", cookies={BROWSER_COOKIE: cookie}, timeout=10)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf and f'id="disconnect-{BACKEND}"' in page.text, "the page has no disconnect form"
    done = post_form(world, "disconnect", {"csrf": csrf.group(1), "backend": BACKEND}, cookie)
    assert done.status_code == 303 and done.headers["Location"] == "/connections", done.status_code

    # Revoked at the backend's server (its revocation endpoint ended the grant), gone here.
    assert world.backend.auth.revoked_at_endpoint() == revoked_before + 1
    assert carol.login not in world.backend.auth.grants()
    assert world.backend.auth.grants().get(dave.login) == 1
    assert carol.login not in connected_people(world) and dave.login in connected_people(world)

    # The other's calls go on; this one is asked to connect again, and once connected, works again.
    assert dave.whoami()["sub"] == dave.login
    carol.wait_for_tools([CONNECT_TOOL], without=TOOL)
    world.driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    connect_in_browser(world, carol.asked_to_connect(), carol.login)
    carol.cookie = browser_cookie(world)
    carol.wait_for_tools([TOOL], without=CONNECT_TOOL)
    assert carol.whoami()["sub"] == carol.login
    assert dave.whoami()["sub"] == dave.login


def test_the_connections_pages_buttons_connect_and_disconnect_in_a_browser(world):
    # Lena, in a browser of her own, opens her connections page: the gateway asks the
    # identity provider who she is, then lists the backend as not connected.
    world.driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    page = f"{world.gateway.issuer}/connections"
    sign_in_pages(world.driver, page, login="lena", stop_prefix=page)
    assert element(world, f"#backend-{BACKEND} .state").text == "not connected"

    at_gateway = press(world, f"#connect-{BACKEND}").startswith(world.gateway.issuer)
    assert not at_gateway, f"the connect was refused: {page_message(world)!r}"
    sign_in_pages(world.driver, None, login="lena", stop_prefix=world.callback)
    message = page_message(world)
    assert message.startswith(f"Connected to {BACKEND}."), message
    assert world.backend.auth.grants().get("lena") == 1
    assert connected_people(world)["lena"]["state"] == "connected"

    # And its Disconnect button disconnects, revoking at the backend's server.
    revoked_before = world.backend.auth.revoked_at_endpoint()
    world.driver.get(page)
    press(world, f"#disconnect-{BACKEND}")
    # The page again, now with a connect button; or a page saying why not.
    shown = element(world, f"#connect-{BACKEND}, #message")
    assert shown.get_attribute("id") == f"connect-{BACKEND}", f"the disconnect was refused: {shown.text!r}"
    assert element(world, f"#backend-{BACKEND} .state").text == "not connected"
    assert world.backend.auth.revoked_at_endpoint() == revoked_before + 1  # revoked there
    assert "lena" not in world.backend.auth.grants()
    assert "lena" not in connected_people(world)


def test_a_grant_ended_at_the_backends_server_asks_that_person_to_connect_again(world, pair):
    erin, frank = pair  # alice's grant ends; bob's goes on
    refreshes_before = overview(world)[0]["refreshes"]
    assert world.backend.auth.revoke_person(erin.login) == 1

    # Erin's access token lives out its few seconds; the gateway's next renewal is refused,
    # and her next call gets the connect link.
    deadline = time.monotonic() + SETTLE
    while True:
        result = erin.call(TOOL)
        if result.get("isError"):
            break
        assert result["structuredContent"]["sub"] == erin.login, result
        assert time.monotonic() < deadline, "erin's calls went on after her grant was ended"
        time.sleep(0.2)  # her token's remaining life: the refresh is the event, due within 4 s
    link = LINK.search(result["content"][0]["text"])
    assert link, result
    assert erin.login not in connected_people(world)

    # Frank's connection was renewed meanwhile (his token is as old as hers) and goes on.
    assert frank.whoami()["sub"] == frank.login
    assert overview(world)[0]["refreshes"] > refreshes_before
    assert frank.login in connected_people(world)

    world.driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    connect_in_browser(world, link.group(1), erin.login)
    erin.cookie = browser_cookie(world)
    erin.wait_for_tools([TOOL], without=CONNECT_TOOL)
    assert erin.whoami()["sub"] == erin.login


def test_a_callback_with_a_wrong_state_or_issuer_or_seen_before_stores_nothing(world):
    gina = sign_in(world, "gina")
    link = gina.asked_to_connect()
    # Her browser opens the link and goes as far as the backend's server: the gateway knows
    # the browser is gina's. Her authorizations there are then held back, one per case.
    sign_in_pages(world.driver, link, login="gina", stop_prefix=f"{world.backend.auth.issuer}/")
    cookie = browser_cookie(world)
    events_before = connection_events(world)

    answer = held_back_callback(world, link, cookie, "gina")
    iss = parse_qs(urlsplit(answer).query)["iss"]
    assert iss == [world.backend.auth.issuer], iss
    wrong_state = open_callback(with_query(answer, state=secrets.token_urlsafe(24)), cookie)
    assert wrong_state.status_code == 400, wrong_state.status_code
    assert "gina" not in connected_people(world)
    # The same answer from a browser that did not start the flow is refused too (and ends it).
    other_browser = open_callback(answer, None)
    assert other_browser.status_code == 400, other_browser.status_code
    assert open_callback(answer, cookie).status_code == 400  # the flow is over
    assert "gina" not in connected_people(world)

    # An answer naming another issuer (a mix-up), or none from a server that names itself (RFC 9207).
    for change in ({"iss": world.gateway.idp.issuer}, {"iss": None}):
        answer = held_back_callback(world, link, cookie, "gina")
        mixed_up = open_callback(with_query(answer, **change), cookie)
        assert mixed_up.status_code == 400, (change, mixed_up.status_code)
        assert "another authorization server" in mixed_up.text, change
        assert open_callback(answer, cookie).status_code == 400  # a refused answer ends its flow
        assert "gina" not in connected_people(world) and not has_record(world, "gina")

    events = connection_events(world)
    assert events.get(("callback", "issuer_mismatch"), 0) > events_before.get(("callback", "issuer_mismatch"), 0)
    assert events.get(("callback", "other_browser"), 0) > events_before.get(("callback", "other_browser"), 0)

    # A good answer connects once; the same callback URL opened again is refused, changing nothing.
    answer = held_back_callback(world, link, cookie, "gina")
    first = open_callback(answer, cookie)
    assert first.status_code == 200 and "Connected to whoami" in first.text, first.status_code
    kept = stored(world, "gina")
    assert has_record(world, "gina") and "gina" in connected_people(world)
    replayed = open_callback(answer, cookie)
    assert replayed.status_code == 400, replayed.status_code
    unchanged = stored(world, "gina") == kept
    assert unchanged, "the replayed callback changed gina's connection"
    gina.wait_for_tools([TOOL], without=CONNECT_TOOL)
    assert gina.whoami()["sub"] == "gina"


def test_a_connect_link_is_absolute_names_no_one_and_serves_its_person_once(world):
    hank = sign_in(world, "hank")
    links = [hank.asked_to_connect(), hank.asked_to_connect()]  # a new link each time
    assert links[0] != links[1]
    for link in links:
        holds_token = shows_any(link, [hank.token, hank.gateway_tokens["refresh_token"]])
        assert not holds_token, "the link holds a token"
        parts = urlsplit(link)
        assert link.startswith(f"{world.gateway.issuer}/connect/"), link
        assert not parts.query and not parts.fragment, link
        assert TICKET.match(parts.path.removeprefix("/connect/")), link
        assert "hank" not in link.lower() and "example.com" not in link, link
    link = links[0]

    # Ivy, signed in at the identity provider in her own browser, opens hank's link.
    world.driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    sign_in_pages(world.driver, link, login="ivy", stop_prefix=link)
    assert "made for someone else" in page_message(world)
    refused = requests.get(link, cookies={BROWSER_COOKIE: browser_cookie(world)}, allow_redirects=False, timeout=10)
    assert refused.status_code == 403, refused.status_code
    people = connected_people(world)
    assert "hank" not in people and "ivy" not in people
    assert "hank" not in world.backend.auth.grants() and "ivy" not in world.backend.auth.grants()

    # The link is still hank's: in his browser it connects him.
    world.driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    connect_in_browser(world, link, "hank")
    hank.wait_for_tools([TOOL], without=CONNECT_TOOL)
    assert hank.whoami()["sub"] == "hank"
    assert "ivy" not in connected_people(world)

    # Used once: opened again (anywhere, or in the browser that used it), it has expired.
    again = requests.get(link, allow_redirects=False, timeout=10)
    assert again.status_code == 404, again.status_code
    assert "expired or was already used" in again.text
    world.driver.get(link)
    assert "expired or was already used" in page_message(world)

    # A link the gateway never made: the same page.
    for ticket in ("garbage", secrets.token_urlsafe(24)):
        unknown = requests.get(f"{world.gateway.issuer}/connect/{ticket}", allow_redirects=False, timeout=10)
        assert unknown.status_code == 404, unknown.status_code
        assert "expired or was already used" in unknown.text


def test_a_clients_call_that_meets_a_refused_token_asks_by_url_elicitation_and_goes_on(world):
    """A client that declares URL elicitation (the Python SDK's, 2025-11-25): once the
    backend answers 401 to the person's token (revoked there, unknown to the gateway), the
    very call asks the person to connect again, waits for it, and answers."""
    import threading

    from tests.oauth_browser import sign_in
    from tests.oauth_clients import PythonSdkClient, ToolCall

    world.driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    client = PythonSdkClient(mode="legacy")
    asked: list[dict[str, Any]] = []
    heard: list[dict[str, Any]] = []

    def open_url(url: str) -> None:
        sign_in(world.driver, url, login="nina", stop_prefix=client.redirect_uri)

    def elicit(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        threading.Thread(target=sign_in_pages, args=(world.driver, params["url"]),
                         kwargs={"login": "nina", "stop_prefix": world.callback}, daemon=True).start()
        return {"action": "accept"}

    first = client.run(world.gateway.mcp_url, open_url, ToolCall(CONNECT_TOOL, {}), elicitation=elicit)
    assert first.call_text.startswith(f"Connected to {BACKEND}"), first.call_text
    connections = world.gateway.gateway.app.extensions[EXTENSION_KEY].connect.connections
    (key,) = [key for key in connections.records.keys("connection")
              if (connections.records.get("connection", key) or {}).get("person", [None, None])[1] == "nina"]

    def revoked_elsewhere() -> None:
        """Between the session's tools/list and its call, her token stops being good at the
        backend (revoked there): the gateway learns it from the call's 401."""
        connections.records.update("connection", key, lambda record: {**record, "access_token": "revoked-elsewhere"})
        connections._tokens.clear()

    second = client.run(world.gateway.mcp_url, open_url, ToolCall(TOOL, {}), elicitation=elicit, notifications=heard,
                        before_call=revoked_elsewhere)
    assert len(asked) == 2 and asked[1]["mode"] == "url" and "authorization" in asked[1]["message"], asked
    assert second.call_is_error is False and '"sub": "nina"' in second.call_text.replace("'", '"'), second.call_text
    completed = [n["params"]["elicitationId"] for n in heard if n["method"] == "notifications/elicitation/complete"]
    assert completed == [asked[1]["elicitationId"]]
    assert connections.records.get("connection", key)["access_token"] != "revoked-elsewhere"
