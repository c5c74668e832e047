"""RFC 9728 protected resource metadata: where clients get tokens for this server."""

from __future__ import annotations

from flask import Blueprint, Response, request

from vmcp_actors.edge._auth import protected_resource_metadata
from vmcp_actors.runtime import Runtime
from vmcp_actors.web._installed import current_runtime
from vmcp_actors.web._responses import json_response

bp = Blueprint("wellknown", __name__)

METADATA_PATH = "/.well-known/oauth-protected-resource"


def resource_url() -> str:
    oauth = current_runtime().config.incoming_auth.oauth
    if oauth is not None:
        return oauth.resource
    configured = current_runtime().config.incoming_auth.oidc
    if configured is not None and configured.resource_url:
        return configured.resource_url
    return request.host_url.rstrip("/") + "/mcp"


def advertised_scopes(runtime: Runtime) -> tuple[str, ...]:
    """The scopes a 401 names (RFC 6750 ``scope``), as the resource metadata lists them."""
    incoming = runtime.config.incoming_auth
    if incoming.oauth is not None:
        return incoming.oauth.advertised_scopes
    return incoming.oidc.scopes if incoming.oidc is not None else ()


def resource_metadata_url(runtime: Runtime, host_url: str) -> str:
    """Where a 401 sends the client (``host_url``: this request's, ``https://host/``)."""
    oauth = runtime.config.incoming_auth.oauth
    if oauth is not None:  # the public URL, whatever Host a proxy passed on
        return oauth.issuer + METADATA_PATH + "/mcp"
    return host_url.rstrip("/") + METADATA_PATH


@bp.get(METADATA_PATH)
@bp.get(METADATA_PATH + "/mcp")  # the path-suffixed form of RFC 9728 section 3.1
def metadata() -> Response:
    runtime = current_runtime()
    if runtime.authenticator.issuer is None:
        return json_response({"error": "not found"}, 404)  # anonymous: no authorization server
    oidc, oauth = runtime.config.incoming_auth.oidc, runtime.config.incoming_auth.oauth
    scopes = oidc.scopes if oidc is not None else oauth.advertised_scopes if oauth is not None else ()
    response = json_response(protected_resource_metadata(resource_url(), runtime.authenticator.issuer,
                                                         runtime.config.name, scopes))
    response.headers["Access-Control-Allow-Origin"] = "*"
    return response
