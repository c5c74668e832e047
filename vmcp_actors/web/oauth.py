"""The authorization server's HTTP face (``incomingAuth.type: oauth``): RFC 8414 metadata
(and its OpenID alias), the JWKS, ``authorize``, the identity provider's ``callback``, the
consent page, ``token``, ``revoke`` and ``register``.

Pages are for browsers: a sign-in is bound to the browser that started it by an
HttpOnly cookie (a flow finished in another browser is refused), the consent form
carries a CSRF token tied to the flow, and the page may not be framed. Endpoints are for
clients: RFC 6749 JSON errors, ``no-store``, CORS for browser-based clients (no cookies
are read there). Any failure of the gateway's side (records, identity provider) is a 503,
never an OAuth error that would make a client start over.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

from authlib.common.urls import add_params_to_uri
from authlib.oauth2.rfc6749 import OAuth2Error, OAuth2Request
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from flask import Blueprint, Response, abort, make_response, redirect, render_template, request

from vmcp_actors.oauth import OAuthService
from vmcp_actors.oauth._clients import LOOPBACK_HOSTS, ClientRefused
from vmcp_actors.oauth._server import (
    FLOW_TTL,
    Answer,
    InvalidTargetError,
    Person,
    SignIn,
    TemporarilyUnavailable,
    flow_params,
    new_flow_id,
    same_resource,
)
from vmcp_actors.oauth._upstream import ID_TOKEN_CLAIMS, UpstreamRefused, UpstreamUnavailable
from vmcp_actors.users._store import StoreUnavailable
from vmcp_actors.web._installed import current_runtime
from vmcp_actors.web._security import browser_digest, browser_secret, from_own_page, same_browser

logger = logging.getLogger(__name__)

bp = Blueprint("oauth", __name__)

BROWSER_COOKIE = "vmcp_oauth_browser"
NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}
CORS = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Headers": "Authorization, Content-Type, "
        "MCP-Protocol-Version", "Access-Control-Allow-Methods": "GET, POST, OPTIONS"}
PAGE_HEADERS = {**NO_STORE, "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin",
                "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'",
                "X-Content-Type-Options": "nosniff"}
METADATA_PATHS = ("/.well-known/oauth-authorization-server", "/.well-known/openid-configuration")
MAX_REGISTRATION_BYTES = 16 * 1024


def _service() -> OAuthService:
    service = current_runtime().oauth
    if service is None:
        abort(404)
    return service


@bp.before_request
def only_when_configured() -> Response | None:
    if current_runtime().oauth is None:
        return _json({"error": "not found"}, 404)
    if request.method == "OPTIONS":
        return Response(status=204, headers=CORS)
    return None


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body), status=status, mimetype="application/json",
                    headers={**NO_STORE, **CORS, **(headers or {})})


def _page(template: str, status: int = 200, **context: Any) -> Response:
    return Response(render_template(template, **context), status=status, mimetype="text/html",
                    headers=PAGE_HEADERS)


def _problem_page(message: str, status: int = 400) -> Response:
    return _page("oauth_problem.html", status, message=message)


def _authlib_response(answer: Answer, issuer: str | None = None) -> Response:
    """Authlib's answer as a response; ``issuer`` is added to an error redirect (RFC 9207
    names the issuer on every authorization response, errors included)."""
    if answer.location is not None:
        location = answer.location
        if issuer is not None and "iss" not in parse_qs(urlsplit(location).query):
            location = add_params_to_uri(location, [("iss", issuer)])
        return Response(status=302, headers={**NO_STORE, "Location": location})
    return _json(answer.body if isinstance(answer.body, dict) else {}, answer.status, dict(answer.headers))


class PublicRequest(OAuth2Request):
    """The Flask request as Authlib reads it, under the gateway's public URL (behind a
    TLS-terminating proxy Flask sees http, which Authlib would refuse)."""

    def __init__(self, issuer: str) -> None:
        super().__init__(request.method, issuer + request.full_path.rstrip("?"), headers=request.headers)
        values = {name: request.values.get(name) for name in request.values}
        self.payload = BasicOAuth2Payload(values)
        self.payload._datalist = {name: request.values.getlist(name) for name in request.values}

    @property
    def args(self) -> Any:
        return request.args

    @property
    def form(self) -> Any:
        return request.form


def _metadata(service: OAuthService) -> dict[str, Any]:
    config = service.server.config
    issuer = config.issuer
    auth_methods = ["none", "client_secret_basic", "client_secret_post"]
    return {
        "issuer": issuer,
        "authorization_endpoint": f"{issuer}/oauth/authorize",
        "token_endpoint": f"{issuer}/oauth/token",
        "registration_endpoint": f"{issuer}/oauth/register",
        "revocation_endpoint": f"{issuer}/oauth/revoke",
        "jwks_uri": f"{issuer}/oauth/jwks",
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": auth_methods,
        "revocation_endpoint_auth_methods_supported": auth_methods,
        "authorization_response_iss_parameter_supported": True,
        "client_id_metadata_document_supported": config.cimd.enabled,
        "scopes_supported": list(config.advertised_scopes),
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": [service.server.keys.current.algorithm],
    }


def metadata_view(issuer_path: str = "") -> Response:
    """RFC 8414 puts an issuer's path after the well-known name; OpenID discovery puts the
    well-known name after the issuer (``{issuer}/.well-known/openid-configuration``), which a
    proxy mounting the gateway under that path passes on as the bare name."""
    service = _service()
    expected = urlsplit(service.server.config.issuer).path.strip("/")
    appended = request.path.startswith(METADATA_PATHS[1]) and not issuer_path
    if issuer_path.strip("/") != expected and not appended:
        return _json({"error": "not found"}, 404)
    return _json(_metadata(service), headers={"Cache-Control": "public, max-age=300"})


for _index, _path in enumerate(METADATA_PATHS):
    bp.add_url_rule(_path, f"metadata_{_index}", metadata_view, methods=["GET", "OPTIONS"])
    bp.add_url_rule(f"{_path}/<path:issuer_path>", f"metadata_{_index}_path", metadata_view, methods=["GET", "OPTIONS"])


@bp.route("/oauth/jwks", methods=["GET", "OPTIONS"])
def jwks() -> Response:
    return _json(_service().server.keys.jwks(), headers={"Cache-Control": "public, max-age=300"})


# --- sign-in -------------------------------------------------------------------------


def _same_browser(flow: dict[str, Any]) -> bool:
    return same_browser(BROWSER_COOKIE, flow["browser"])


@bp.get("/oauth/authorize")
def authorize() -> Response:
    """A client's authorization request: checked, kept as a flow bound to this browser, then
    the consent page (before anything goes to the IdP: the IdP may remember the person and
    answer at once), unless this browser's person already allowed this client."""
    service = _service()
    server = service.server
    try:
        grant = server.get_consent_grant(PublicRequest(server.config.issuer))
        resources = request.args.getlist("resource")
        if len(resources) > 1 or any(not same_resource(resource, server.config.resource) for resource in resources):
            raise InvalidTargetError(f"this server issues tokens for {server.config.resource} only",
                                     redirect_uri=grant.redirect_uri, state=request.args.get("state"))
        flow_id = new_flow_id()
        browser, new_browser = browser_secret(BROWSER_COOKIE)
        flow = {"params": flow_params(request.args), "client_id": grant.client.client_id,
                "resource": server.config.resource, "browser": browser_digest(browser),
                "verifier": secrets.token_urlsafe(48), "nonce": secrets.token_urlsafe(24), "created": time.time(),
                "csrf": secrets.token_urlsafe(32)}
        known = server.records.get("browser", browser_digest(browser))
        if known is not None and _remembered(server, known["person"], grant.client, grant.redirect_uri):
            flow["consent"] = "remembered"  # checked again once the IdP says who signed in
        server.records.put("flow", flow_id, flow, FLOW_TTL)
        response = _to_upstream(server, flow_id, flow) if "consent" in flow else _to_consent(flow_id)
    except OAuth2Error as error:
        server.events("authorize", error.error or "refused", client=request.args.get("client_id", "")[:200])
        return _refusal_page(server, error)
    except UpstreamUnavailable:
        return _problem_page("The identity provider cannot be reached right now. Try again in a moment.", 503)
    except StoreUnavailable:
        return _problem_page("The sign-in service is unavailable right now. Try again in a moment.", 503)
    server.events("authorize", "ok", client=grant.client.client_id)
    if new_browser:
        response.set_cookie(BROWSER_COOKIE, browser, max_age=int(server.config.consent_ttl or FLOW_TTL),
                            httponly=True, samesite="Lax", secure=server.config.issuer.startswith("https://"),
                            path="/oauth/")
    return response


def _refusal_page(server: Any, error: OAuth2Error) -> Response:
    """A refused authorization request, shown to the person, never redirected: nobody has
    signed in or seen where the app sends them, and a registered redirect URI may be any
    site (OAuth 2.1 section 7.12.2). When the redirect URI was checked, a link takes the
    error back to the app, if the person chooses to follow it."""
    message = f"This sign-in request cannot be served: {error.description or error.error}."
    if not error.redirect_uri:
        return _problem_page(message)
    answer = [("error", error.error), ("error_description", error.description or error.error)]
    if request.args.get("state"):
        answer.append(("state", request.args["state"]))
    answer.append(("iss", server.config.issuer))
    back = add_params_to_uri(error.redirect_uri, answer)
    return _page("oauth_problem.html", 400, message=message, back=back, back_host=_shown_host(error.redirect_uri))


def _shown_host(uri: str) -> str:
    parts = urlsplit(uri)
    return parts.netloc or parts.scheme


def _remembered(server: Any, person_key: str, client: Any, redirect_uri: str | None) -> bool:
    """Whether this person allowed this client before (and may skip the page). Never for a
    metadata-document client sending codes to a loopback address: any program on the
    person's computer can name that client and listen there."""
    if server.config.consent_ttl <= 0:
        return False
    if client.kind == "cimd" and urlsplit(redirect_uri or client.redirect_uris[0]).hostname in LOOPBACK_HOSTS:
        return False
    return server.records.get("consent", f"{person_key}|{client.client_id}") is not None


def _to_upstream(server: Any, flow_id: str, flow: dict[str, Any]) -> Response:
    response = redirect(server.upstream.authorization_url(flow_id, flow["nonce"], flow["verifier"]), 302)
    response.headers.update(NO_STORE)
    return response


@bp.get("/oauth/callback")
def callback() -> Response:
    service = _service()
    server = service.server
    flow_id = request.args.get("state", "")
    try:
        flow = server.records.get("flow", flow_id) if flow_id else None
        if flow is None:
            return _problem_page("This sign-in has expired or was already finished. Start again from your app.")
        if not _same_browser(flow):
            server.events("callback", "other_browser", client=flow["client_id"])
            return _problem_page("This sign-in was started in another browser. Start again from your app.")
        if "consent" not in flow:
            return _problem_page("This sign-in skipped its consent step. Start again from your app.")
        if "person" in flow:
            return _to_consent(flow_id)  # a reload after the exchange
        if not server.upstream.check_issuer(request.args.get("iss")):
            server.records.delete("flow", flow_id)
            server.events("callback", "issuer_mismatch", client=flow["client_id"])
            return _deny(server, flow, "server_error", "the identity provider's answer names another issuer")
        if request.args.get("error") or not request.args.get("code"):
            server.records.delete("flow", flow_id)
            server.events("login", "denied", client=flow["client_id"])
            return _deny(server, flow, "access_denied", "the sign-in at the identity provider did not complete")
        try:
            tokens, claims = server.upstream.exchange(request.args["code"], flow["verifier"], flow["nonce"])
        except UpstreamRefused:
            server.records.delete("flow", flow_id)
            server.events("login", "refused", client=flow["client_id"])
            return _deny(server, flow, "access_denied", "the identity provider refused the sign-in")
        person = Person(server.upstream.issuer, str(claims["sub"]),
                        {name: claims[name] for name in ID_TOKEN_CLAIMS if name in claims})
        flow.update(person=person.record(), upstream=server.upstream.kept_tokens(tokens))
        server.events("login", "ok", client=flow["client_id"], user=person.subject)
        if server.config.consent_ttl > 0:  # who signs in from this browser: whose consent to look up next time
            server.records.put("browser", flow["browser"], {"person": person.key}, server.config.consent_ttl)
        if flow["consent"] == "approved":
            if flow.get("remember") and server.config.consent_ttl > 0:
                server.records.put("consent", f"{person.key}|{flow['client_id']}", {"at": time.time()},
                                   server.config.consent_ttl)
            server.records.put("flow", flow_id, flow, FLOW_TTL)
            return _issue(server, flow_id, flow)
        client = server.query_client(flow["client_id"])
        if client is not None and _remembered(server, person.key, client, flow["params"].get("redirect_uri")):
            server.events("consent", "remembered", client=flow["client_id"], user=person.subject)
            server.records.put("flow", flow_id, flow, FLOW_TTL)
            return _issue(server, flow_id, flow)
        flow["consent"] = "pending"  # another person than this browser's last one: they decide now
        server.records.put("flow", flow_id, flow, FLOW_TTL)
        return _to_consent(flow_id)
    except OAuth2Error:
        return _problem_page("The app asking for access can no longer be verified. Start again from your app.")
    except UpstreamUnavailable:
        return _problem_page("The identity provider cannot be reached right now. Try again in a moment.", 503)
    except StoreUnavailable:
        return _problem_page("The sign-in service is unavailable right now. Try again in a moment.", 503)


def _to_consent(flow_id: str) -> Response:
    response = redirect(f"{current_runtime().oauth.server.config.issuer}/oauth/consent?flow={flow_id}", 303)
    response.headers.update(NO_STORE)
    return response


def _deny(server: Any, flow: dict[str, Any], error: str, description: str) -> Response:
    """The client's redirect URI (checked at authorize, and shown on the consent page the
    person went through) with ``error``, its state and our ``iss``."""
    params = flow["params"]
    try:
        client = server.query_client(flow["client_id"])
    except OAuth2Error:
        client = None
    redirect_uri = params.get("redirect_uri") or (client.get_default_redirect_uri() if client else None)
    if not redirect_uri:
        return _problem_page("This sign-in cannot continue. Start again from your app.")
    answer = [("error", error), ("error_description", description)]
    if params.get("state"):
        answer.append(("state", params["state"]))
    answer.append(("iss", server.config.issuer))
    return Response(status=302, headers={**NO_STORE, "Location": add_params_to_uri(redirect_uri, answer)})


def _issue(server: Any, flow_id: str, flow: dict[str, Any]) -> Response:
    """The code, to the client's redirect URI; the flow is over."""
    if server.records.take("flow", flow_id) is None:
        return _problem_page("This sign-in has already finished. Start again from your app.")
    sign_in = SignIn(Person.from_record(flow["person"]), flow["upstream"], flow["resource"])
    try:
        answer = server.answer(flow["params"], sign_in)
    except OAuth2Error as error:
        return _problem_page(f"This sign-in cannot continue: {error.description or error.error}.")
    server.registered.renew(flow["client_id"])
    server.events("code", "ok", client=flow["client_id"], user=sign_in.person.subject)
    return _authlib_response(answer)


@bp.route("/oauth/consent", methods=["GET", "POST"])
def consent() -> Response:
    """The person allows the client, or not: before the IdP (who is not known yet), or after
    it when the person who signed in has not allowed this client before."""
    service = _service()
    server = service.server
    flow_id = request.values.get("flow", "")
    try:
        flow = server.records.get("flow", flow_id) if flow_id else None
        if flow is None or flow.get("consent") not in (None, "pending"):
            return _problem_page("This sign-in has expired or was already finished. Start again from your app.")
        if not _same_browser(flow):
            server.events("consent", "other_browser", client=flow["client_id"])
            return _problem_page("This sign-in was started in another browser. Start again from your app.")
        try:
            client = server.query_client(flow["client_id"])
        except OAuth2Error:
            client = None  # a metadata document that can no longer be fetched
        if client is None:
            return _problem_page("The app asking for access is no longer registered. Start again from your app.")
        person = Person.from_record(flow["person"]) if "person" in flow else None
        redirect_uri = flow["params"].get("redirect_uri") or client.redirect_uris[0]
        if request.method == "GET":
            return _page("oauth_consent.html", client=client, flow_id=flow_id, csrf=flow["csrf"],
                         redirect_host=_shown_host(redirect_uri),
                         local_redirect=urlsplit(redirect_uri).hostname in LOOPBACK_HOSTS,
                         person=(person.claims.get("email") or person.claims.get("preferred_username")
                                 or person.subject) if person else None,
                         idp_host=urlsplit(server.upstream.issuer).netloc, scope=flow["params"].get("scope") or "",
                         server_name=current_runtime().config.name, remember=server.config.consent_ttl > 0)
        if not from_own_page(server.config.issuer):
            return _problem_page("This form was sent from another site.", 403)
        if not hmac.compare_digest(request.form.get("csrf", ""), flow["csrf"]):
            return _problem_page("This form has expired. Start again from your app.", 403)
        subject = person.subject if person else None
        if request.form.get("decision") != "approve":
            server.records.delete("flow", flow_id)
            server.events("consent", "denied", client=flow["client_id"], user=subject)
            return _deny(server, flow, "access_denied", "the person did not allow access")
        server.events("consent", "approved", client=flow["client_id"], user=subject)
        remember = bool(request.form.get("remember")) and server.config.consent_ttl > 0
        if person is None:  # on to the IdP; the code comes once it says who signed in
            flow.update(consent="approved", remember=remember)
            server.records.put("flow", flow_id, flow, FLOW_TTL)
            return _to_upstream(server, flow_id, flow)
        if remember:
            server.records.put("consent", f"{person.key}|{flow['client_id']}", {"at": time.time()},
                               server.config.consent_ttl)
        return _issue(server, flow_id, flow)
    except UpstreamUnavailable:
        return _problem_page("The identity provider cannot be reached right now. Try again in a moment.", 503)
    except StoreUnavailable:
        return _problem_page("The sign-in service is unavailable right now. Try again in a moment.", 503)


# --- client endpoints ---------------------------------------------------------------------


def _unavailable() -> Response:
    return _json({"error": "temporarily_unavailable",
                  "error_description": "the authorization server cannot serve this right now"}, 503,
                 {"Retry-After": "5"})


@bp.route("/oauth/token", methods=["POST", "OPTIONS"])
def token() -> Response:
    service = _service()
    server = service.server
    try:
        answer = server.create_token_response(PublicRequest(server.config.issuer))
    except TemporarilyUnavailable:
        return _unavailable()
    except (StoreUnavailable, UpstreamUnavailable):
        return _unavailable()
    body = answer.body if isinstance(answer.body, dict) else {}
    if answer.status >= 400:
        if body.get("error") == "temporarily_unavailable":
            return _json(body, 503, {"Retry-After": "5"})
        server.events("token", body.get("error", "refused"), grant_type=request.form.get("grant_type", "")[:40])
    return _json(body, answer.status, dict(answer.headers))


@bp.route("/oauth/revoke", methods=["POST", "OPTIONS"])
def revoke() -> Response:
    service = _service()
    server = service.server
    try:
        answer = server.create_endpoint_response("revocation", PublicRequest(server.config.issuer))
    except StoreUnavailable:
        return _unavailable()
    return _json(answer.body if isinstance(answer.body, dict) else {}, answer.status, dict(answer.headers))


def _client_address() -> str:
    """Who registers: the peer, or, when the peer is a proxy on this machine (the deploy
    kit's nginx), the address it says it saw (the last X-Forwarded-For entry, its own)."""
    peer = request.remote_addr or "unknown"
    forwarded = request.headers.get("X-Forwarded-For", "")
    if peer in ("127.0.0.1", "::1") and forwarded:
        return forwarded.rsplit(",", 1)[-1].strip()[:64] or peer
    return peer


@bp.route("/oauth/register", methods=["POST", "OPTIONS"])
def register() -> Response:
    service = _service()
    server = service.server
    address = _client_address()
    try:
        per_minute = server.config.registrations_per_minute
        if server.records.hit(f"register:{address}", 60.0) > per_minute \
                or server.records.hit("register:all", 60.0) > per_minute * 20:
            server.events("register", "rate_limited")
            return _json({"error": "temporarily_unavailable", "error_description": "too many registrations; "
                          "try again in a minute"}, 429, {"Retry-After": "60"})
        if (request.content_length or 0) > MAX_REGISTRATION_BYTES:
            return _json({"error": "invalid_client_metadata", "error_description": "the metadata is too large"}, 400)
        metadata = request.get_json(silent=True)
        if not isinstance(metadata, dict):
            return _json({"error": "invalid_client_metadata",
                          "error_description": "the body must be a JSON object of client metadata"}, 400)
        try:
            client, secret = server.registered.register(metadata)
        except ClientRefused as refused:
            error = "invalid_redirect_uri" if "redirect" in str(refused) else "invalid_client_metadata"
            server.events("register", error)
            return _json({"error": error, "error_description": str(refused)}, 400)
    except StoreUnavailable:
        return _unavailable()
    server.events("register", "ok", client=client.client_id)
    answer: dict[str, Any] = {
        "client_id": client.client_id, "client_id_issued_at": int(time.time()),
        "redirect_uris": list(client.redirect_uris), "token_endpoint_auth_method": client.token_endpoint_auth_method,
        "grant_types": list(client.grant_types), "response_types": ["code"], "client_name": client.client_name}
    if secret is not None:
        answer.update(client_secret=secret, client_secret_expires_at=0)
    return _json(answer, 201)


