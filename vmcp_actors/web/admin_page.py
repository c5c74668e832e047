"""GET /admin: the operator's page, server-rendered (Jinja2, autoescaped, no scripts).

Signed in with the admin bearer token (a header, as for the JSON endpoints) or through
the login form, which sets a cookie: ``<expiry>.<HMAC-SHA256 of it under the admin
token>``, HttpOnly, Secure, SameSite=Strict, for ``ADMIN_COOKIE_TTL``. Changing the
admin token signs everyone out. Without an admin token configured, all of it is 404.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Any

from flask import Blueprint, Response, redirect, render_template, request

from vmcp_actors.runtime import recent_problems
from vmcp_actors.users._admin import collect_admin_state
from vmcp_actors.web._installed import current_runtime
from vmcp_actors.web._responses import json_response
from vmcp_actors.web._security import bearer_matches

bp = Blueprint("admin_page", __name__)

ADMIN_COOKIE = "vmcp_admin"
ADMIN_COOKIE_TTL = 8 * 3600
# No scripts, no external anything; the page only posts to itself.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _cookie_value(token: str, expires: int) -> str:
    tag = hmac.new(token.encode(), f"vmcp-admin|{expires}".encode(), hashlib.sha256).hexdigest()
    return f"{expires}.{tag}"


def _signed_in(token: str) -> bool:
    if bearer_matches(token):
        return True
    cookie = request.cookies.get(ADMIN_COOKIE, "")
    expires, _, _tag = cookie.partition(".")
    if not expires.isdigit() or int(expires) < time.time():
        return False
    return hmac.compare_digest(cookie.encode(), _cookie_value(token, int(expires)).encode())


def _page(template: str, status: int = 200, **context: Any) -> Response:
    return Response(render_template(template, **context), status=status, mimetype="text/html",
                    headers=SECURITY_HEADERS)


@bp.get("/admin")
def page() -> Response:
    runtime = current_runtime()
    if runtime.admin_token is None:
        return json_response({"error": "not found"}, 404)
    if not _signed_in(runtime.admin_token):
        return redirect("/admin/login", code=303)
    state = collect_admin_state(runtime.gateway, runtime.service.parked.count(), runtime.processes, runtime.tasks,
                                runtime.limits_state(), store=runtime.service.store,
                                scripts=runtime.scripts())
    return _page("admin.html", name=runtime.config.name, state=state, problems=recent_problems(),
                 now=time.time(), oauth=runtime.oauth.overview() if runtime.oauth is not None else None,
                 connections=runtime.connect.connections.overview() if runtime.connect is not None else None)


@bp.post("/admin/oauth-end")
def end_grants() -> Response:
    """The page's "End" buttons: a grant, a person's grants or a client's (the cookie is
    SameSite=Strict and the page may only post to itself, so no other site can press them)."""
    runtime = current_runtime()
    if runtime.admin_token is None or runtime.oauth is None:
        return json_response({"error": "not found"}, 404)
    if not _signed_in(runtime.admin_token):
        return redirect("/admin/login", code=303)
    chosen = {name: request.form[name] for name in ("grant", "user", "client") if request.form.get(name)}
    if len(chosen) == 1:
        runtime.oauth.end_grants(**chosen)
    return redirect("/admin", code=303)


@bp.get("/admin/login")
def login_form() -> Response:
    if current_runtime().admin_token is None:
        return json_response({"error": "not found"}, 404)
    return _page("login.html", failed=False)


@bp.post("/admin/login")
def login() -> Response:
    token = current_runtime().admin_token
    if token is None:
        return json_response({"error": "not found"}, 404)
    presented = request.form.get("token", "")
    if not hmac.compare_digest(presented.encode(), token.encode()):
        return _page("login.html", status=401, failed=True)
    expires = int(time.time()) + ADMIN_COOKIE_TTL
    response = redirect("/admin", code=303)
    response.set_cookie(ADMIN_COOKIE, _cookie_value(token, expires), max_age=ADMIN_COOKIE_TTL, path="/admin",
                        secure=True, httponly=True, samesite="Strict")
    return response


@bp.post("/admin/logout")
def logout() -> Response:
    response = redirect("/admin/login", code=303)
    response.delete_cookie(ADMIN_COOKIE, path="/admin", secure=True, httponly=True, samesite="Strict")
    return response
