"""The sign-in driver (tests/oauth_browser.py) keeps the gateway consent page's contract: a
post form with ``button#approve`` / ``button#deny`` (``name=decision``), clicked as asked;
and a page it does not know fails with the URL and the visible text, not the page source."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse
from starlette.routing import Route

from tests.oauth_browser import GATEWAY_CONSENT, CallbackCatcher, browser, sign_in, sign_in_pages
from tests.ports import free_port
from vmcp_actors.demo._serve import serve_asgi_in_thread

HIDDEN = "hidden-code-Qx7"
CONSENT_PAGE = """<!DOCTYPE html><html><head><title>Allow access?</title></head><body>
<p>Let the client use your tools?</p>
<form method="post" action="/consent">
  <button type="submit" id="approve" name="decision" value="approve">Allow</button>
  <button type="submit" id="deny" name="decision" value="deny">Deny</button>
</form></body></html>"""


@pytest.fixture
def consent_site():
    """A stand-in for the gateway's consent page, sending the decision to the catcher."""
    with CallbackCatcher() as catcher:
        async def consent(request: Request):
            if request.method == "GET":
                return HTMLResponse(CONSENT_PAGE)
            decision = (await request.form())["decision"]
            answer = "code=granted-code" if decision == "approve" else "error=access_denied"
            return RedirectResponse(f"{catcher.redirect_uri}?{answer}&state=s1", status_code=303)

        async def elsewhere(request: Request):
            return HTMLResponse(f'<html><body><p>Nothing to sign in here</p><input type="hidden" value="{HIDDEN}">'
                                "</body></html>")

        app = Starlette(routes=[Route("/consent", consent, methods=["GET", "POST"]), Route("/elsewhere", elsewhere)])
        with serve_asgi_in_thread(app, port=free_port(), name="consent-site") as site:
            yield site.url, catcher


@pytest.mark.parametrize(("approve", "expected"), [(True, {"code": "granted-code", "state": "s1"}),
                                                   (False, {"error": "access_denied", "state": "s1"})])
def test_the_gateway_consent_page_is_answered_as_asked(consent_site, approve, expected):
    site, catcher = consent_site
    with browser() as driver:
        final_url, pages = sign_in_pages(driver, site + "/consent", login="alice", approve=approve,
                                         stop_prefix=catcher.redirect_uri)
    assert pages == [GATEWAY_CONSENT]
    assert final_url.startswith(catcher.redirect_uri + "?")
    assert catcher.wait(5) == expected


def test_an_unknown_page_fails_with_its_url_and_visible_text_only(consent_site):
    site, catcher = consent_site
    with browser() as driver, pytest.raises(AssertionError) as failed:
        sign_in(driver, site + "/elsewhere", login="alice", stop_prefix=catcher.redirect_uri)
    message = str(failed.value)
    assert site + "/elsewhere" in message and "Nothing to sign in here" in message
    assert HIDDEN not in message
