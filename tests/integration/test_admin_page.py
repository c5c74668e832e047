"""The admin page (issue 14, item 6): server-rendered HTML behind the admin token (a
bearer header or a login form's signed cookie), shown in a real headless browser
(Debian's chromium and chromium-driver, driven by selenium)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import requests

from tests import oauth_browser
from tests.backends import hanging_backend, restartable_backend
from tests.gateway import backend_entry, wait_until

ADMIN_ENV, ADMIN_TOKEN = "PAGE_ADMIN_TOKEN", "page-adm1n-token-Vx9"


@pytest.fixture
def served(start_gateway, monkeypatch):
    monkeypatch.setenv(ADMIN_ENV, ADMIN_TOKEN)
    good, down = restartable_backend("github"), hanging_backend(name="jira")
    gateway = start_gateway({
        "name": "engineering", "admin": {"tokenEnv": ADMIN_ENV},
        "backends": [backend_entry("github", good), backend_entry("jira", down)],
        "operational": {"timeouts": {"default": "1s"}, "failureHandling": {
            "healthCheckInterval": "300ms", "healthCheckTimeout": "300ms", "unhealthyThreshold": 1,
            "circuitBreaker": {"enabled": True}}}})
    sid = gateway.initialize()
    gateway.rpc(sid, "tools/call", {"name": "github_echo", "arguments": {"text": "x"}})
    assert wait_until(lambda: requests.get(gateway.base + "/admin/state", timeout=5, headers={
        "Authorization": f"Bearer {ADMIN_TOKEN}"}).json()["backendHealth"]["jira"]["state"] == "unhealthy", timeout=5)
    yield gateway, sid
    good.stop()
    down.stop()


def test_the_page_needs_the_token_and_shows_backends_users_sessions_and_problems(served):
    gateway, sid = served
    anonymous = requests.get(gateway.base + "/admin", allow_redirects=False, timeout=5)
    assert anonymous.status_code == 303 and anonymous.headers["Location"] == "/admin/login"
    forged = requests.get(gateway.base + "/admin", allow_redirects=False, timeout=5,
                          cookies={"vmcp_admin": "9999999999.deadbeef"})
    assert forged.status_code == 303
    page = requests.get(gateway.base + "/admin", timeout=5, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    html = page.text
    for expected in ("engineering", "github", "jira", "unhealthy", sid[:8], "anonymous"):
        assert expected in html, expected
    assert sid not in html  # only the short id
    assert "127.0.0.1:" not in html  # never a backend's URL
    assert ADMIN_TOKEN not in html

    refused = requests.post(gateway.base + "/admin/login", data={"token": "wrong"}, allow_redirects=False, timeout=5)
    assert refused.status_code == 401 and "not the admin token" in refused.text
    signed_in = requests.post(gateway.base + "/admin/login", data={"token": ADMIN_TOKEN}, allow_redirects=False,
                              timeout=5)
    assert signed_in.status_code == 303
    cookie = signed_in.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "Secure" in cookie and "SameSite=Strict" in cookie and "Path=/admin" in cookie
    assert ADMIN_TOKEN not in cookie
    # The JSON endpoints still take the bearer token only.
    assert requests.get(gateway.base + "/admin/state", timeout=5, cookies=signed_in.cookies).status_code == 401


def test_an_operator_signs_in_with_a_browser_and_sees_the_state(served, tmp_path):
    from selenium.webdriver.common.by import By

    gateway, sid = served
    with oauth_browser.browser() as browser:
        browser.implicitly_wait(10)  # a lookup right after a submit waits for the next page
        browser.get(gateway.base + "/admin")  # not signed in: the login form
        assert browser.current_url.endswith("/admin/login")
        browser.find_element(By.ID, "token").send_keys("wrong")
        browser.find_element(By.ID, "sign-in").click()
        assert browser.find_element(By.ID, "login-error").is_displayed()
        browser.find_element(By.ID, "token").send_keys(ADMIN_TOKEN)
        browser.find_element(By.ID, "sign-in").click()
        backends = browser.find_element(By.ID, "backends").text
        assert "github" in backends and "jira" in backends and "unhealthy" in backends
        assert sid[:8] in browser.find_element(By.ID, "sessions").text
        assert "anonymous" in browser.find_element(By.ID, "users").text
        assert "jira" in browser.find_element(By.ID, "problems").text  # the health change was logged
        browser.refresh()  # the cookie keeps the operator signed in
        assert browser.find_element(By.ID, "backends")
        shot = Path(os.environ.get("VMCP_ADMIN_SCREENSHOT", tmp_path / "admin.png"))
        assert browser.save_screenshot(str(shot)) and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
