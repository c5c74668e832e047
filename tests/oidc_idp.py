"""A real upstream OpenID Connect identity provider for the sign-in tests: panva's certified
``oidc-provider`` (``tests/node/oidc_idp.mjs``) as a child process on a loopback port,
configured like a company IdP.

* One static confidential client (``.client_id``, ``.client_secret``, the redirect URIs
  given): ``client_secret_basic`` or ``client_secret_post``, the ``authorization_code`` and
  ``refresh_token`` grants, PKCE ``S256``. No dynamic client registration.
* A refresh token with every authorization code exchanged, rotated on use by default
  (reusing a rotated-away one revokes the grant, as oidc-provider does).
* Sign-in and consent are oidc-provider's development pages (``tests/oauth_browser.py``
  drives them): any login signs in, the password is not checked. The ID token and userinfo
  carry ``sub`` (the login), ``email``, ``email_verified``, ``name``, ``preferred_username``
  and ``groups``, from ``users`` (``{login: {"email", "name", "groups"}}``) or, for any
  other login, ``<login>@example.com``, the login and no groups.
* :meth:`OidcIdP.token_requests` counts the token endpoint's requests by grant type.

``scripts/install-node-mcp`` installs oidc-provider and Node 22 (tests/node_mcp.py).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import requests

from tests import node_mcp
from tests.ports import free_port

IDP_PROGRAM = Path(__file__).resolve().parent / "node" / "oidc_idp.mjs"
DAY = 24 * 3600


class OidcIdP(node_mcp.ReadyNodeProgram):
    """oidc-provider on ``.issuer`` (``http://127.0.0.1:<port>``), started by the constructor
    (which skips the test, or fails it under CI, when oidc-provider is not installed) and
    stopped by :meth:`stop` or on leaving a ``with`` block.

    TTLs are in seconds; a short ``access_token_ttl`` (2-5 s) makes "the IdP's access token
    is past its life" reachable in a test.
    """

    def __init__(self, redirect_uris: Sequence[str], *, client_id: str = "vmcp-gateway",
                 client_secret: str | None = None, access_token_ttl: int = 3600, id_token_ttl: int = 3600,
                 refresh_token_ttl: int = 14 * DAY, rotate_refresh_tokens: bool = True,
                 require_pkce: bool = False, users: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        node_mcp.need_node_mcp()
        self.client_id = client_id
        self.client_secret = client_secret if client_secret is not None else secrets.token_urlsafe(24)
        self.redirect_uris = list(redirect_uris)
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        config = {
            "port": self.port,
            "client": {"client_id": client_id, "client_secret": self.client_secret,
                       "redirect_uris": self.redirect_uris},
            "ttl": {"access_token": access_token_ttl, "id_token": id_token_ttl, "refresh_token": refresh_token_ttl},
            "rotate_refresh_tokens": rotate_refresh_tokens,
            "require_pkce": require_pkce,
            "users": {login: dict(claims) for login, claims in (users or {}).items()},
        }
        self._start(IDP_PROGRAM, "OIDC_IDP_CONFIG", config)

    # -- addresses -------------------------------------------------------------------

    @property
    def discovery_url(self) -> str:
        return self.issuer + "/.well-known/openid-configuration"

    @property
    def authorization_endpoint(self) -> str:
        return self.issuer + "/auth"

    @property
    def token_endpoint(self) -> str:
        return self.issuer + "/token"

    @property
    def userinfo_endpoint(self) -> str:
        return self.issuer + "/me"

    # -- what it saw -----------------------------------------------------------------

    def token_requests(self) -> dict[str, int]:
        """The token endpoint's requests so far by grant type (``authorization_code``,
        ``refresh_token``), failed ones included; a grant type not asked for is absent."""
        return self._counts()["requests"]

    def failed_token_requests(self) -> dict[str, int]:
        """Those of :meth:`token_requests` the IdP refused (an error answer)."""
        return self._counts()["failed"]

    def _counts(self) -> dict[str, dict[str, int]]:
        answer = requests.get(self.issuer + "/_test/counts", timeout=5)
        answer.raise_for_status()
        return answer.json()

    # -- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> OidcIdP:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<OidcIdP {self.issuer} client {self.client_id!r}>"
