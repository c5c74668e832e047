"""People's connections to backends of type oauth: the pages a browser opens.

* ``GET /connect/<ticket>``: the link a client was given. The browser's person must be the
  caller the link was made for (the anti-phishing rule of URL elicitation): the identity
  provider says who they are (``/connect/login``), remembered for this browser for
  ``PERSON_TTL``. Then on to the backend's authorization server.
* ``GET /connect/callback``: one route for every backend and worker; the flow is taken once,
  from the browser it started in, from the server it went to (``iss``).
* ``GET /connections`` (contract): the person's connections, with a form to disconnect each
  (which revokes at the backend's server where it offers revocation) or connect it.
* ``GET /connect/client.json``: the gateway's client metadata document (CIMD).

Pages never show a token, and links carry nothing but a random ticket.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import time
from typing import Any
from urllib.parse import urlsplit

from flask import Blueprint, Response, redirect, render_template, request

from vmcp_actors.identity import Identity
from vmcp_actors.oauth import ConnectService
from vmcp_actors.oauth._backend_servers import ConnectRefused, ConnectUnavailable
from vmcp_actors.oauth._connections import same_person, secret_key
from vmcp_actors.oauth._upstream import UpstreamRefused, UpstreamUnavailable
from vmcp_actors.users._store import StoreUnavailable
from vmcp_actors.web._installed import current_runtime
from vmcp_actors.web._security import browser_digest, browser_secret, from_own_page, same_browser

logger = logging.getLogger(__name__)

bp = Blueprint("connections", __name__)

BROWSER_COOKIE = "vmcp_connect_browser"
PERSON_TTL = 3600.0  # how long a browser's person is known after they signed in here
LOGIN_TTL = 600.0
# same-origin: the page's own forms carry their Origin (no-referrer makes it "null"). No
# form-action: the Connect form's answer goes on to the backend's authorization server, and
# browsers hold a form's whole redirect chain to it (the csrf value and SameSite guard it).
PAGE_HEADERS = {"Cache-Control": "no-store", "Pragma": "no-cache", "X-Frame-Options": "DENY",
                "Referrer-Policy": "same-origin",
                "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'",
                "X-Content-Type-Options": "nosniff"}


def _service() -> ConnectService:
    service = current_runtime().connect
    assert service is not None, "only_when_configured answers first"
    return service


@bp.before_request
def only_when_configured() -> Response | None:
    if current_runtime().connect is None:
        return _page("The gateway has no backends to connect.", 404)
    return None


def _page(message: str, status: int = 200, title: str = "Connect") -> Response:
    return Response(render_template("connect_page.html", title=title, message=message), status=status,
                    mimetype="text/html", headers=PAGE_HEADERS)


def _redirect(location: str) -> Response:
    response = redirect(location, 303)
    response.headers.update(PAGE_HEADERS)
    return response


def _with_cookie(response: Response, browser: str, new: bool) -> Response:
    if new:
        public = current_runtime().config.public_url or ""
        response.set_cookie(BROWSER_COOKIE, browser, max_age=int(PERSON_TTL), httponly=True, samesite="Lax",
                            secure=public.startswith("https://"), path="/")
    return response


def _known_person(service: ConnectService, browser: str) -> dict[str, Any] | None:
    """Who signed in from this browser lately: ``{person, csrf}``."""
    return service.connections.records.get("connect-browser", browser_digest(browser))


def _sign_in(service: ConnectService, browser: str, new: bool, then: str) -> Response:
    """To the identity provider, to learn who this browser's person is; back to ``then``."""
    state, nonce, verifier = secrets.token_urlsafe(24), secrets.token_urlsafe(24), secrets.token_urlsafe(48)
    service.connections.records.put("connect-login", secret_key(state), {
        "browser": browser_digest(browser), "nonce": nonce, "verifier": verifier, "then": then}, LOGIN_TTL)
    return _with_cookie(_redirect(service.login.authorization_url(state, nonce, verifier)), browser, new)


@bp.get("/connect/<ticket>")
def connect(ticket: str) -> Response:
    service = _service()
    browser, new = browser_secret(BROWSER_COOKIE)
    try:
        found = service.connections.ticket(ticket)
        if found is None:
            return _page("This connect link has expired or was already used. Ask your app for a new one.", 404)
        known = _known_person(service, browser)
        if known is None:
            return _sign_in(service, browser, new, f"/connect/{ticket}")
        if not same_person(known["person"], found["person"]):
            service.connections.events("connect", "other_person", backend=found["backend"])
            return _page("This connect link was made for someone else. Open the link your own app gave you "
                         "(or sign out of the identity provider and open it again).", 403)
        location = service.connections.authorization_url(found, ticket, browser_digest(browser))
    except ConnectUnavailable as problem:
        return _page(f"Connecting is not possible right now: {problem}. Try again in a moment.", 503)
    except (UpstreamUnavailable, StoreUnavailable):
        return _page("The sign-in service cannot be reached right now. Try again in a moment.", 503)
    return _with_cookie(_redirect(location), browser, new)


@bp.get("/connect/login")
def login() -> Response:
    """The identity provider's answer: who the browser's person is."""
    service = _service()
    state = request.args.get("state", "")
    try:
        flow = service.connections.records.take("connect-login", secret_key(state)) \
            if 10 <= len(state) <= 100 else None
        if flow is None:
            return _page("This sign-in has expired or was already finished. Open the link again.", 400)
        if not same_browser(BROWSER_COOKIE, flow["browser"]):
            return _page("This sign-in was started in another browser. Open the link again.", 400)
        if not service.login.check_issuer(request.args.get("iss")):
            return _page("The sign-in answer came from another identity provider.", 400)
        if request.args.get("error") or not request.args.get("code"):
            return _page("The sign-in did not complete.", 400)
        _, claims = service.login.exchange(request.args["code"], flow["verifier"], flow["nonce"])
        person = [service.login.issuer, str(claims["sub"])]
        service.connections.records.put("connect-browser", flow["browser"],
                                        {"person": person, "csrf": secrets.token_urlsafe(24)}, PERSON_TTL)
    except UpstreamRefused:
        return _page("The identity provider refused the sign-in.", 400)
    except (UpstreamUnavailable, StoreUnavailable):
        return _page("The sign-in service cannot be reached right now. Try again in a moment.", 503)
    then = flow["then"]
    return _redirect(then if then.startswith("/") and not then.startswith("//") else "/connections")


@bp.get("/connect/callback")
def callback() -> Response:
    """The backend's authorization server sends the person back here."""
    service = _service()
    state = request.args.get("state", "")
    browser = request.cookies.get(BROWSER_COOKIE, "")
    try:
        if request.args.get("error") or not request.args.get("code"):
            flow = service.connections.take_flow(state)
            if flow is not None:
                service.connections.events("callback", "denied", backend=flow["backend"])
            return _page("Not connected: the authorization was not given.", 400)
        done = service.connections.finish(state, request.args["code"], request.args.get("iss"),
                                          browser_digest(browser) if browser else "")
    except ConnectRefused as refused:
        return _page(f"Not connected: {refused}. Open the link from your app again.", 400)
    except ConnectUnavailable as problem:
        return _page(f"Not connected: {problem}. Try again in a moment.", 503)
    except StoreUnavailable:
        return _page("The connection service cannot be reached right now. Try again in a moment.", 503)
    return _page(f"Connected to {done['backend']}. You can close this window and go back to your app.",
                 title="Connected")


@bp.get("/connect/client.json")
def client_document() -> Response:
    service = _service()
    first = next(iter(service.connections.backends.values()))
    response = Response(json.dumps(first.client_document()), mimetype="application/json")
    response.headers["Cache-Control"] = "public, max-age=3600"
    return response


@bp.route("/connections", methods=["GET"])
def connections() -> Response:
    service = _service()
    browser, new = browser_secret(BROWSER_COOKIE)
    try:
        known = _known_person(service, browser)
        if known is None:
            return _sign_in(service, browser, new, "/connections")
        rows = [{**row, "since": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(row["since"])) if row["since"] else ""}
                for row in service.connections.of(tuple(known["person"]))]
    except (UpstreamUnavailable, StoreUnavailable):
        return _page("The sign-in service cannot be reached right now. Try again in a moment.", 503)
    body = render_template("connections.html", rows=rows, csrf=known["csrf"], server_name=current_runtime().config.name)
    return _with_cookie(Response(body, mimetype="text/html", headers=PAGE_HEADERS), browser, new)


@bp.route("/connections/<action>", methods=["POST"])
def change(action: str) -> Response:
    """Disconnect a backend, or start connecting it (a form of the connections page)."""
    service = _service()
    browser = request.cookies.get(BROWSER_COOKIE, "")
    known = _known_person(service, browser) if browser else None
    if known is None:
        return _page("Your sign-in here has expired. Open the connections page again.", 403)
    if not from_own_page(current_runtime().config.public_url or ""):
        return _page("This form was sent from another site.", 403)
    if not hmac.compare_digest(request.form.get("csrf", ""), known["csrf"]):
        return _page("This form has expired. Open the connections page again.", 403)
    backend = request.form.get("backend", "")
    if backend not in service.connections.backends or action not in ("disconnect", "connect"):
        return _page("No such backend to connect.", 404)
    person = (known["person"][0], known["person"][1])
    if action == "disconnect":
        service.connections.disconnect(person, backend)
        return _redirect("/connections")
    url, _ = service.connections.link(Identity(person[0], person[1]), backend)
    return _redirect(urlsplit(url).path)
