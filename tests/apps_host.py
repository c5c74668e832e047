"""MCP Apps (the ``io.modelcontextprotocol/ui`` extension) in a real browser: the official
example app servers and our own host page, which renders their apps in headless Chromium.

* :class:`AppServer`: an example server (``server-basic-vanillajs``, ``server-basic-react``,
  ``server-system-monitor``) over streamable HTTP on a loopback port; :func:`stdio_command`
  runs one over stdio instead.
* :class:`AppsHost`: serves the host page (``tests/node/apps_host.mjs`` and
  ``apps_host.html``, bundled by the install script) on a loopback port and, driving a
  selenium browser, renders one app card per tool (:class:`Card`): what the app shows, the
  ``tools/call`` requests it made through the host, a screenshot.

``scripts/install-mcp-apps`` installs the servers, ext-apps and the bundled page into
:func:`mcp_apps_home` (``$VMCP_MCP_APPS_HOME``, else
``${XDG_CACHE_HOME:-$HOME/.cache}/vmcp-actors/mcp-apps``); the servers run on the Node 22 of
``tests/node_mcp.py``. The page's query and its ``window.appsHost`` record are described at
the top of ``tests/node/apps_host.mjs``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from tests import node_mcp
from tests.ports import free_port

INSTALL_SCRIPT = "scripts/install-mcp-apps"
VANILLA = "server-basic-vanillajs"
REACT = "server-basic-react"
SYSTEM_MONITOR = "server-system-monitor"
EXAMPLE_SERVERS = (VANILLA, REACT, SYSTEM_MONITOR)
APP_MIME_TYPE = "text/html;profile=mcp-app"
HOST_SOURCES = tuple(Path(__file__).resolve().parent / "node" / name for name in ("apps_host.mjs", "apps_host.html"))

# Waits are bounded and end on a condition; their sizes leave room for a loaded CI machine.
RENDER_TIMEOUT = 30.0  # connect, call, read, load the app's HTML (React's is 400 kB) and deliver
CALL_TIMEOUT = 15.0  # a click or a poll until the tools/call it made has come back
POLL = 0.05  # how often a wait looks again
VISIBLE_TEXT_LIMIT = 1500
VISIBLE_TEXT = "return document.body ? document.body.innerText : ''"  # as rendered: CSS text-transform applies


def mcp_apps_home() -> Path:
    return node_mcp.install_home("VMCP_MCP_APPS_HOME", "mcp-apps")


def host_dir() -> Path:
    """The bundled host page: ``index.html`` and ``host.js``."""
    return mcp_apps_home() / "host"


def _server_dir(package: str) -> Path:
    return mcp_apps_home() / "node_modules" / "@modelcontextprotocol" / package / "dist"


def app_html_sha256(package: str) -> str:
    """The SHA-256 of the app HTML ``package`` serves as its UI resource (read from disk)."""
    return hashlib.sha256((_server_dir(package) / "mcp-app.html").read_bytes()).hexdigest()


def host_source_hash() -> str:
    """The hash the install script records in ``host/.built``: the host page's sources, in order."""
    digest = hashlib.sha256()
    for source in HOST_SOURCES:
        digest.update(source.read_bytes())
    return digest.hexdigest()


def missing() -> str | None:
    """Why MCP Apps cannot run (a message naming the install script), or None."""
    home = mcp_apps_home()
    node = node_mcp.node_mcp_home() / node_mcp.NODE
    if not node.exists():
        return f"no Node 22 in {node_mcp.node_mcp_home()}: run {node_mcp.INSTALL_SCRIPT}, then {INSTALL_SCRIPT}"
    if not (home / ".installed").is_file() or not all((_server_dir(package) / "index.js").is_file()
                                                      for package in EXAMPLE_SERVERS):
        return (f"the MCP Apps packages are not installed in {home}: run {INSTALL_SCRIPT} (it installs the "
                f"example app servers, @modelcontextprotocol/ext-apps and bundles the test host page)")
    built = host_dir() / ".built"
    if not (host_dir() / "host.js").is_file() or not built.is_file() \
            or built.read_text().strip() != host_source_hash():
        return f"the host page in {host_dir()} is missing or older than tests/node/apps_host.*: run {INSTALL_SCRIPT}"
    return None


def need_mcp_apps() -> None:
    """Skip the calling test without the MCP Apps install; fail it under CI."""
    node_mcp.unless_installed(missing())


def stdio_command(package: str) -> list[str]:
    """The argv that runs example server ``package`` over stdio (Node 22, absolute paths)."""
    node = node_mcp.node_mcp_home() / node_mcp.NODE
    return [str(node), str(_server_dir(package) / "index.js"), "--stdio"]


class AppServer(node_mcp.NodeHttpServer):
    """Example app server ``package`` over streamable HTTP on a loopback port. It is
    stateless: a fresh MCP server per request."""

    def __init__(self, package: str, name: str | None = None) -> None:
        self.package = package
        super().__init__(name or package, [str(node_mcp.node_mcp_home() / node_mcp.NODE),
                                           str(_server_dir(package) / "index.js")], mcp_apps_home(), package)


def start_app_servers(packages: Sequence[str] = EXAMPLE_SERVERS) -> dict[str, AppServer]:
    """An :class:`AppServer` for each of ``packages``, started side by side (each Node takes
    a while to load its bundle); all stopped again if one fails to start."""
    with ThreadPoolExecutor(len(packages)) as pool:  # leaving it waits for every start
        starting = {package: pool.submit(AppServer, package) for package in packages}
    started = {package: future.result() for package, future in starting.items() if future.exception() is None}
    failed = [future.exception() for future in starting.values() if future.exception() is not None]
    if failed:
        for server in started.values():
            server.stop()
        raise failed[0]
    return started


@dataclass
class Card:
    """One app card of the host page, as rendered: the app has initialised and been sent its
    tool's input and result. Its methods look at the live page, so they hold until the host
    renders another page."""

    host: AppsHost = field(repr=False)
    index: int
    server: str  # the MCP URL the card's client used
    tool: str
    uri: str  # the UI resource read (the tool's _meta.ui.resourceUri)
    html_sha256: str
    tool_result: dict[str, Any] = field(repr=False)
    app_info: dict[str, Any] | None  # what the app said it is in ui/initialize

    @property
    def element_id(self) -> str:
        return f"card-{self.index}"

    def text(self) -> str:
        """The app's visible text now."""
        with self.host.inside(self):
            return self.host.driver.execute_script(VISIBLE_TEXT) or ""

    def wait_for_text(self, *needles: str, timeout: float = CALL_TIMEOUT) -> str:
        """The app's visible text once it holds every one of ``needles``."""
        with self.host.inside(self):
            return self.host.wait(
                lambda driver: _holding(driver.execute_script(VISIBLE_TEXT), needles),
                timeout, lambda: f"card {self.index} ({self.tool}) never showed {needles!r}; it shows "
                                 f"{_cut(self.host.driver.execute_script(VISIBLE_TEXT))!r}")

    def wait_for_match(self, pattern: str, timeout: float = CALL_TIMEOUT) -> re.Match[str]:
        """The first match of regular expression ``pattern`` in the app's visible text, once
        there is one."""
        with self.host.inside(self):
            return self.host.wait(
                lambda driver: re.search(pattern, driver.execute_script(VISIBLE_TEXT) or "") or False,
                timeout, lambda: f"card {self.index} ({self.tool}) never showed /{pattern}/; it shows "
                                 f"{_cut(self.host.driver.execute_script(VISIBLE_TEXT))!r}")

    def count(self, css_selector: str) -> int:
        """How many elements of the app's document match ``css_selector``."""
        with self.host.inside(self):
            return self.host.driver.execute_script("return document.querySelectorAll(arguments[0]).length",
                                                   css_selector)

    def calls(self) -> list[dict[str, Any]]:
        """The ``tools/call`` requests the app has made through the host, in order:
        ``{name, arguments, done, result}`` or, for a failed one, ``error`` (its message)."""
        return self.host.card_state(self.index)["calls"]

    def wait_for_calls(self, name: str, count: int = 1, timeout: float = CALL_TIMEOUT) -> list[dict[str, Any]]:
        """The finished calls to tool ``name`` once there are at least ``count``."""
        def finished(_driver: Any) -> list[dict[str, Any]] | bool:
            done = [call for call in self.calls() if call["name"] == name and call["done"]]
            return done if len(done) >= count else False

        return self.host.wait(finished, timeout,
                              lambda: f"card {self.index} ({self.tool}) made fewer than {count} finished {name} "
                                      f"calls; its calls: {_cut(json.dumps(self.calls()))}")

    def press(self, button_text: str, timeout: float = CALL_TIMEOUT) -> dict[str, Any]:
        """Click the app's button labelled ``button_text``; the ``tools/call`` the click made,
        once it has come back (the first call recorded after the click)."""
        from selenium.webdriver.common.by import By

        before = len(self.calls())
        with self.host.inside(self):
            self.host.driver.find_element(By.XPATH, f"//button[normalize-space()={_xpath_literal(button_text)}]").click()

        def answered(_driver: Any) -> dict[str, Any] | bool:
            calls = self.calls()
            return calls[before] if len(calls) > before and calls[before]["done"] else False

        return self.host.wait(answered, timeout,
                              lambda: f"pressing {button_text!r} on card {self.index} ({self.tool}) made no "
                                      f"finished tools/call; its calls: {_cut(json.dumps(self.calls()))}")

    def screenshot(self, path: Path) -> Path:
        """A PNG of the card (its title and its app) at ``path``."""
        from selenium.webdriver.common.by import By

        path.parent.mkdir(parents=True, exist_ok=True)
        self.host.driver.find_element(By.ID, self.element_id).screenshot(str(path))
        return path


class AppsHost:
    """The host page served from a loopback port (``.url``), shown in ``driver`` (a selenium
    browser, e.g. ``tests.oauth_browser.browser()``). Stopped on leaving the ``with`` block
    (or by :meth:`stop`); the browser is the caller's."""

    def __init__(self, driver: Any) -> None:
        from starlette.applications import Starlette
        from starlette.routing import Mount
        from starlette.staticfiles import StaticFiles

        from vmcp_actors.demo._serve import serve_asgi_in_thread

        self.driver = driver
        app = Starlette(routes=[Mount("/", StaticFiles(directory=host_dir(), html=True))])
        self._served = serve_asgi_in_thread(app, port=free_port(), name="apps-host")
        self.url = self._served.url

    def page_url(self, servers: Sequence[tuple[str, Sequence[str]]]) -> str:
        """The page showing, for each (MCP URL, tool names), one card per tool."""
        query = [pair for mcp_url, tools in servers for pair in (("mcp", mcp_url), ("tools", ",".join(tools)))]
        return f"{self.url}/index.html?{urlencode(query)}"

    def render(self, mcp_url: str, tools: Sequence[str], timeout: float = RENDER_TIMEOUT) -> list[Card]:
        """Load the page for ``tools`` of the server at ``mcp_url``; its cards once every app
        has been rendered (an AssertionError says which failed, and why)."""
        return self.render_servers([(mcp_url, tools)], timeout)

    def render_servers(self, servers: Sequence[tuple[str, Sequence[str]]],
                       timeout: float = RENDER_TIMEOUT) -> list[Card]:
        """:meth:`render` for several servers on one page, one MCP client each; the cards in
        order (the first server's tools first)."""
        self.driver.get(self.page_url(servers))
        state = self.wait(_ready_state, timeout,
                          lambda: f"the host page did not render within {timeout} s: {self._summary()}")
        if state["error"] is not None:
            raise AssertionError(f"the host page failed: {state['error']}")
        failed = [f"card {card['index']} ({card['tool']} at {card['server']}): {card['error']}"
                  for card in state["cards"] if card["error"] is not None]
        if failed:
            raise AssertionError("apps that failed to render: " + "; ".join(failed))
        return [Card(host=self, index=card["index"], server=card["server"], tool=card["tool"], uri=card["uri"],
                     html_sha256=card["htmlSha256"], tool_result=card["toolResult"], app_info=card["appInfo"])
                for card in state["cards"]]

    def state(self) -> dict[str, Any]:
        """The page's ``window.appsHost`` record now."""
        return self.driver.execute_script("return window.appsHost || null")

    def card_state(self, index: int) -> dict[str, Any]:
        return self.driver.execute_script("return window.appsHost.cards[arguments[0]]", index)

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page at ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(path))
        return path

    @contextmanager
    def inside(self, card: Card) -> Iterator[None]:
        """Selenium looks into ``card``'s app document within the block."""
        from selenium.webdriver.common.by import By

        self.driver.switch_to.frame(self.driver.find_element(By.CSS_SELECTOR, f"#{card.element_id} iframe"))
        try:
            yield
        finally:
            self.driver.switch_to.default_content()

    def wait(self, condition: Callable[[Any], Any], timeout: float, explain: Callable[[], str]) -> Any:
        """``condition``'s first truthy value, checked every POLL s for up to ``timeout`` s;
        else an AssertionError with ``explain()``."""
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=POLL).until(condition)
        except TimeoutException:
            raise AssertionError(explain()) from None

    def _summary(self) -> str:
        """What the page got to: per card, how far it came (never whole results or HTML)."""
        try:
            state = self.state()
        except Exception as error:  # noqa: BLE001 - a page that is gone or mid-load
            return f"(no state: {type(error).__name__})"
        if state is None:
            return "the page's script did not run (window.appsHost is unset)"
        cards = [{key: card[key] for key in ("index", "tool", "uri", "initialized", "resultDelivered", "error")}
                 for card in state["cards"]]
        return json.dumps({"error": state["error"], "servers": state["servers"], "cards": cards})

    def stop(self) -> None:
        self._served.stop()

    def __enter__(self) -> AppsHost:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def artifacts_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """Where a test module keeps its screenshots: ``$VMCP_TEST_ARTIFACTS/<name>``, else a
    pytest temporary directory (neither is in the repository). Printed."""
    explicit = os.environ.get("VMCP_TEST_ARTIFACTS")
    directory = Path(explicit) / name if explicit else tmp_path_factory.mktemp(name)
    directory.mkdir(parents=True, exist_ok=True)
    print(f"{name}: screenshots in {directory}")
    return directory


def _ready_state(driver: Any) -> dict[str, Any] | bool:
    state = driver.execute_script("return window.appsHost || null")
    return state if state is not None and state["ready"] else False


def _holding(text: str | None, needles: Sequence[str]) -> str | bool:
    return text if text is not None and all(needle in text for needle in needles) else False


def _cut(text: str | None) -> str:
    text = text or ""
    return text if len(text) <= VISIBLE_TEXT_LIMIT else text[:VISIBLE_TEXT_LIMIT] + " ..."


def _xpath_literal(text: str) -> str:
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text:
        return f'"{text}"'
    return "concat(" + ", \"'\", ".join(f"'{part}'" for part in text.split("'")) + ")"



# What each example app shows and does, for any test that renders them (straight from the
# servers or through the gateway). The apps' HTML is compared by hash: the two get-time
# servers serve different apps under the same URI.
GET_TIME_URI = "ui://get-time/mcp-app.html"
SYSTEM_MONITOR_URI = "ui://system-monitor/mcp-app.html"
GET_TIME_BUTTON = "Get Server Time"
# What only each get-time app's document has: the vanilla page's own markup; React's root
# and CSS-module class (their visible text is the same).
GET_TIME_MARKUP = {VANILLA: "main.main code#server-time", REACT: "#root main code[class^='_serverTime_']"}
# The monitor's memory line once a poll has filled it in ("-- / --" before).
POLLED_MEMORY = r"\d+(\.\d+)? [KMGT]?B / \d+(\.\d+)? [KMGT]?B"


def time_text(result: dict[str, Any]) -> str:
    """The time a get-time result carries (both servers put it in a text block; the vanilla
    one in structuredContent too, which is what its app shows)."""
    return next(block["text"] for block in result["content"] if block["type"] == "text")


def expect_get_time_app(card: Card, package: str) -> None:
    """``card`` shows ``package``'s (VANILLA or REACT) own get-time app with its tool's time,
    and its button calls get-time through the host and shows the new time."""
    [other] = [markup for owner, markup in GET_TIME_MARKUP.items() if owner != package]
    assert card.html_sha256 == app_html_sha256(package), f"card {card.index} is not {package}'s app"
    assert card.app_info == {"name": "Get Time App", "version": "1.0.0"}
    card.wait_for_text("Server Time:", time_text(card.tool_result), GET_TIME_BUTTON)
    assert (card.count(GET_TIME_MARKUP[package]), card.count(other)) == (1, 0)

    call = card.press(GET_TIME_BUTTON)
    assert call["name"] == "get-time" and "error" not in call and not call["result"].get("isError"), call
    pressed = time_text(call["result"])
    assert pressed >= time_text(card.tool_result)  # ISO 8601 times order as text
    card.wait_for_text(pressed)
    assert [recorded["name"] for recorded in card.calls()] == ["get-time"]


def expect_system_monitor_app(card: Card, polls: int = 1) -> None:
    """``card`` shows the system monitor with its tool's system info, and the app's polling
    has made ``polls`` or more poll-system-stats calls (app-only) through the host, each
    answered and shown."""
    assert card.html_sha256 == app_html_sha256(SYSTEM_MONITOR), f"card {card.index} is not the system monitor"
    assert card.app_info == {"name": "System Monitor", "version": "1.0.0"}
    info = card.tool_result["structuredContent"]
    card.wait_for_text("System Monitor", "Hostname", info["hostname"], "Platform")

    for call in card.wait_for_calls("poll-system-stats", polls):
        assert "error" not in call and not call["result"].get("isError"), call
        stats = call["result"]["structuredContent"]
        assert len(stats["cpu"]["cores"]) == info["cpu"]["count"] and 0 <= stats["memory"]["usedPercent"] <= 100
    card.wait_for_match(POLLED_MEMORY)
    assert {call["name"] for call in card.calls()} == {"poll-system-stats"}  # the app's only calls
