"""A real browser for the sign-in tests: headless Chromium (Debian's chromium and
chromium-driver, ``scripts/install-browser``) driven by selenium.

* :func:`browser`: a headless Chrome, quit on leaving the ``with`` block.
* :func:`sign_in` (and :func:`sign_in_pages`, which also says which pages it passed):
  follows an authorization request through whatever pages come (oidc-provider's
  development login and consent pages, the gateway's consent page) until the browser is
  sent to the OAuth client's redirect URI.
* :class:`CallbackCatcher`: that redirect URI for a test acting as the OAuth client; it
  records the query of the first redirect to it.

What is on a page only gets into an assertion message as its visible text: never the page
source, whose hidden parts can hold codes and tokens.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from tests.ports import free_port
from vmcp_actors.demo._serve import serve_asgi_in_thread

INSTALL_SCRIPT = "scripts/install-browser"
MAX_PAGES = 12  # more pages than any sign-in shows: a page that keeps coming back
VISIBLE_TEXT_LIMIT = 1500

# The page kinds sign_in_pages reports, in the order a first sign-in meets them.
IDP_LOGIN = "idp-login"
IDP_CONSENT = "idp-consent"
GATEWAY_CONSENT = "gateway-consent"
_ARRIVED = "arrived"  # at the redirect URI
_UNKNOWN = "unknown"  # a loaded page none of the rules matches

# oidc-provider's development pages: a form posting a hidden "prompt" of login or consent.
IDP_LOGIN_FORM = 'form[method="post"]:has(input[name="prompt"][value="login"])'
IDP_CONSENT_FORM = 'form[method="post"]:has(input[name="prompt"][value="consent"])'
# The gateway's consent page: one form posting a "decision" by its #approve or #deny button.
GATEWAY_DECISION = 'form[method="post" i] button[type="submit"][name="decision"]'


# How often a wait looks at the page again (selenium's default, 0.5 s, is most of a sign-in's time).
POLL = 0.05


def _chromium() -> tuple[Path, Path]:
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    return Path(chromium), Path(driver)


def missing() -> str | None:
    """Why no browser can start (a message naming the install script), or None."""
    chromium, driver = _chromium()
    if not (chromium.exists() and driver.exists()):
        return f"chromium and chromium-driver are not installed: run {INSTALL_SCRIPT} (the README's test set-up does)"
    return None


def need_browser() -> None:
    """Skip the calling test without the browser; fail it under CI."""
    from tests.node_mcp import unless_installed

    unless_installed(missing())


@contextmanager
def browser() -> Iterator[Any]:
    """A headless Chrome (``selenium.webdriver.Chrome``), without implicit waits; quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    need_browser()
    chromium, driver = _chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(argument)
    chrome = webdriver.Chrome(service=Service(str(driver)), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


def sign_in(driver: Any, start_url: str | None, *, login: str, password: str = "secret", approve: bool = True,
            stop_prefix: str, timeout: float = 30.0, approve_at_idp: bool = True, remember: bool = False) -> str:
    """Open ``start_url`` and go through the sign-in pages until the browser is at a URL
    starting with ``stop_prefix`` (the OAuth client's redirect URI); that URL.

    ``approve`` picks the gateway consent page's button (``#approve`` or ``#deny``), after
    ticking its "remember" box when ``remember``; ``approve_at_idp=False`` cancels on the
    IdP's consent page instead of continuing. ``start_url`` None goes on from the page the
    browser is on.
    """
    final_url, _ = sign_in_pages(driver, start_url, login=login, password=password, approve=approve,
                                 stop_prefix=stop_prefix, timeout=timeout, approve_at_idp=approve_at_idp,
                                 remember=remember)
    return final_url


def sign_in_pages(driver: Any, start_url: str | None, *, login: str, password: str = "secret", approve: bool = True,
                  stop_prefix: str, timeout: float = 30.0, approve_at_idp: bool = True,
                  remember: bool = False) -> tuple[str, list[str]]:
    """:func:`sign_in`, also answering the pages it acted on in order (``IDP_LOGIN``,
    ``IDP_CONSENT``, ``GATEWAY_CONSENT``): a second sign-in in the same browser skips the
    IdP's pages, for instance."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    deadline = time.monotonic() + timeout

    def wait_for(condition: Any, waiting_for: str) -> Any:
        try:
            return WebDriverWait(driver, max(deadline - time.monotonic(), 0.1), poll_frequency=POLL).until(condition)
        except TimeoutException:
            raise AssertionError(f"{waiting_for}: nothing within {timeout} s; {_where(driver)}") from None

    # Implicit waits would make every absent-element check below wait them out.
    implicit_wait = driver.timeouts.implicit_wait
    driver.implicitly_wait(0)
    pages: list[str] = []
    try:
        if start_url is not None:
            driver.get(start_url)
        for _ in range(MAX_PAGES):
            page, form = wait_for(lambda d: _recognise(d, stop_prefix), "waiting for a sign-in page")
            if page == _ARRIVED:
                return driver.current_url, pages
            if page == _UNKNOWN:
                raise AssertionError(f"a page sign_in does not know (after {pages}); {_where(driver)}")
            try:
                document = driver.find_element(By.TAG_NAME, "html")
                _act(driver, page, form, login=login, password=password, approve=approve,
                     approve_at_idp=approve_at_idp, remember=remember)
            except Exception as error:  # noqa: BLE001 - only a page that changed under the action
                if not _page_changed(error):
                    raise
                continue  # the page was replaced while it was read: recognise the new one
            pages.append(page)
            wait_for(lambda _: _gone(document), f"waiting to leave the {page} page")
        raise AssertionError(f"still no redirect to {stop_prefix} after {MAX_PAGES} pages ({pages}); {_where(driver)}")
    finally:
        driver.implicitly_wait(implicit_wait)


def _recognise(driver: Any, stop_prefix: str) -> tuple[str, Any] | bool:
    """(which page the browser is on, its form), or False while it is still loading one.

    Rules, first match wins: the URL starts with ``stop_prefix``: arrived. A post form with
    a hidden ``prompt=login``: the IdP's login page; ``prompt=consent``: its consent page.
    A post form with ``button#approve`` and ``button#deny`` (``name=decision``): the
    gateway's consent page. Anything else, once loaded: unknown.
    """
    from selenium.webdriver.common.by import By

    try:
        if driver.current_url.startswith(stop_prefix):
            return _ARRIVED, None
        for page, selector in ((IDP_LOGIN, IDP_LOGIN_FORM), (IDP_CONSENT, IDP_CONSENT_FORM)):
            forms = driver.find_elements(By.CSS_SELECTOR, selector)
            if forms:
                return page, forms[0]
        buttons = {button.get_attribute("id"): button.get_attribute("value")
                   for button in driver.find_elements(By.CSS_SELECTOR, GATEWAY_DECISION)}
        if buttons.get("approve") == "approve" and buttons.get("deny") == "deny":
            return GATEWAY_CONSENT, driver.find_element(By.CSS_SELECTOR, "form:has(button#approve)")
        if driver.execute_script("return document.readyState") == "complete":
            return _UNKNOWN, None
    except Exception as error:  # noqa: BLE001 - only a page that changed under the checks
        if not _page_changed(error):
            raise
    return False


def _gone(element: Any) -> bool:
    """Whether ``element``'s page has been replaced (selenium's staleness_of, also taking
    the inspector's way of saying so)."""
    try:
        element.is_enabled()
    except Exception as error:  # noqa: BLE001 - only a page that changed
        if _page_changed(error):
            return True
        raise
    return False


def _page_changed(error: Exception) -> bool:
    """Whether ``error`` is the browser saying the element read belongs to a page that is
    gone (selenium reports it as stale, or as an inspector error, depending on timing)."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    if isinstance(error, StaleElementReferenceException):
        return True
    return isinstance(error, WebDriverException) and "does not belong to the document" in (error.msg or "")


def _act(driver: Any, page: str, form: Any, *, login: str, password: str, approve: bool, approve_at_idp: bool,
         remember: bool = False) -> None:
    from selenium.webdriver.common.by import By

    if page == IDP_LOGIN:
        for name, value in (("login", login), ("password", password)):
            field = form.find_element(By.NAME, name)
            field.clear()  # a login_hint fills the login in
            field.send_keys(value)
        form.find_element(By.CSS_SELECTOR, 'button[type="submit"]').click()
    elif page == IDP_CONSENT:
        if approve_at_idp:
            form.find_element(By.CSS_SELECTOR, 'button[type="submit"]').click()
        else:  # oidc-provider's "[ Cancel ]" link: access_denied back to the client
            driver.find_element(By.CSS_SELECTOR, 'a[href$="/abort"]').click()
    else:
        if remember and approve:
            box = form.find_element(By.ID, "remember")
            if not box.is_selected():
                box.click()
        form.find_element(By.ID, "approve" if approve else "deny").click()


def _where(driver: Any) -> str:
    """The current URL and the page's visible text, cut short (no page source: its hidden
    parts can hold codes and tokens)."""
    try:
        text = driver.execute_script("return document.body ? document.body.innerText : ''") or ""
    except Exception as exc:  # noqa: BLE001 - a page mid-navigation has no body to read
        text = f"(no text: {type(exc).__name__})"
    if len(text) > VISIBLE_TEXT_LIMIT:
        text = text[:VISIBLE_TEXT_LIMIT] + " ..."
    return f"at {driver.current_url}, showing: {text!r}"


class CallbackCatcher:
    """An OAuth client's redirect URI on loopback (``.redirect_uri``,
    ``http://127.0.0.1:<port>/callback``): the query of the first GET to it is kept for
    :meth:`wait`; every GET to it gets a small "done" page. Stopped on leaving the ``with``
    block (or by :meth:`stop`)."""

    def __init__(self) -> None:
        from starlette.applications import Starlette
        from starlette.responses import HTMLResponse
        from starlette.routing import Route

        self._arrived = threading.Event()
        self._lock = threading.Lock()  # guards _query: the first redirect wins
        self._query: dict[str, str] | None = None

        async def callback(request: Any) -> HTMLResponse:
            with self._lock:
                if self._query is None:
                    self._query = dict(parse_qsl(request.url.query, keep_blank_values=True))
                    self._arrived.set()
            return HTMLResponse('<!DOCTYPE html><html><head><title>done</title></head>'
                                '<body><p id="done">Signed in: you can close this window.</p></body></html>')

        self._served = serve_asgi_in_thread(Starlette(routes=[Route("/callback", callback)]),
                                            port=free_port(), name="oauth-callback")
        self.redirect_uri = f"{self._served.url}/callback"

    def wait(self, timeout: float = 30.0) -> dict[str, str]:
        """The first redirect's query parameters (``code``, ``state``, ``iss`` or ``error``)."""
        if not self._arrived.wait(timeout):
            raise AssertionError(f"no redirect to {self.redirect_uri} within {timeout} s")
        with self._lock:
            assert self._query is not None
            return dict(self._query)

    def stop(self) -> None:
        self._served.stop()

    def __enter__(self) -> CallbackCatcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
