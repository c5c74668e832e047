"""A real OAuth-protected MCP backend for the connect tests (issue 37): "whoami".

* Its authorization server, :class:`BackendAuthServer`: panva's ``oidc-provider``
  (``tests/node/backend_as.mjs``) as a child process on a loopback port: open dynamic
  client registration (public clients too), PKCE S256, resource indicators (RFC 8707)
  with JWT access tokens (RFC 9068) for the backend's URL only, a refresh token with every
  code, rotated on use, revocation (RFC 7009), ``iss`` in authorization responses
  (RFC 9207), a short access token life when asked. Sign-in and consent are its
  development pages (``tests.oauth_browser.sign_in`` drives them); the login is the
  tokens' ``sub``. :meth:`BackendAuthServer.grants` counts live grants per person;
  :meth:`BackendAuthServer.revoke_person` is its operator ending a person's grants.
* The MCP server, :class:`WhoamiBackend`: the official ``mcp`` SDK's ``MCPServer`` over
  streamable HTTP with the SDK's own resource-server support (``AuthSettings`` and a
  ``TokenVerifier`` that checks the JWT with PyJWT against the AS's JWKS, issuer and
  audience = the backend's URL): a request without a valid token gets 401 with
  ``WWW-Authenticate: Bearer ... resource_metadata="<origin>/.well-known/oauth-protected-resource/mcp"``,
  which names the AS. One tool, ``whoami``: ``{"sub": <the token's sub>, "tokens": <distinct
  tokens seen so far>}``.

The backend remembers a digest of every bearer token it was sent (valid or not), so a
test can ask :meth:`WhoamiBackend.received` whether a given token ever arrived, without
this module keeping or logging a token.

Everything listens on 127.0.0.1 ports of :func:`tests.ports.free_port`; ``stop()`` (or
leaving a ``with`` block) stops both servers.

This module does not use ``from __future__ import annotations``: the SDK inspects the
tool's signature at registration time.
"""

import hashlib
import json
import re
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests

from tests import node_mcp
from tests.ports import free_port
from vmcp_actors.demo._serve import ServedApp, serve_asgi_in_thread

AS_PROGRAM = Path(__file__).resolve().parent / "node" / "backend_as.mjs"
DAY = 24 * 3600
SCOPE = "whoami"
# Clock skew a resource server allows past a token's exp: also keeps a token the gateway
# took just before renewing it good on a loaded machine.
LEEWAY = 10
MAX_HOPS = 12  # redirects and pages of one authorization at the AS, and more


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class BackendAuthServer(node_mcp.ReadyNodeProgram):
    """oidc-provider as the authorization server of the one resource ``resource`` on
    ``.issuer`` (``http://127.0.0.1:<port>``), started by the constructor (which skips the
    test, or fails it under CI, without oidc-provider) and stopped by :meth:`stop`."""

    def __init__(self, resource: str, *, port: int | None = None, access_token_ttl: int = 3600,
                 refresh_token_ttl: int = 14 * DAY) -> None:
        node_mcp.need_node_mcp()
        self.resource = resource
        self.port = port or free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        config = {"port": self.port, "resource": resource, "resource_scope": SCOPE,
                  "ttl": {"access_token": access_token_ttl, "refresh_token": refresh_token_ttl}}
        self._start(AS_PROGRAM, "BACKEND_AS_CONFIG", config)

    @property
    def jwks_uri(self) -> str:
        return self.issuer + "/jwks"

    def grants(self) -> dict[str, int]:
        """Live grants by person (login); a person without one is absent."""
        return self._test("GET", "grants")["grants"]

    def revoked_at_endpoint(self) -> int:
        """How many grants its revocation endpoint ended (a client revoking a refresh token)."""
        return self._test("GET", "grants")["revoked"]

    def revoke_person(self, login: str) -> int:
        """The AS's operator ends every grant of ``login`` (its refresh tokens stop working;
        access tokens already issued are JWTs and live out their short life). How many."""
        return self._test("POST", "revoke", {"sub": login})["ended"]

    def authorize(self, authorization_url: str, login: str, *, stop_prefix: str) -> str:
        """A person at this server without a browser: open ``authorization_url``, sign in as
        ``login`` and consent on its development pages, and answer the URL it then sends the
        person to (the client's redirect URI, with ``code``, ``state`` and ``iss``) without
        going there. For a test that must hold a real authorization response back."""
        prompt = re.compile(r'<input[^>]*name="prompt"[^>]*value="(login|consent)"')
        with requests.Session() as agent:
            agent.trust_env = False
            response = agent.get(authorization_url, allow_redirects=False, timeout=10)
            for _ in range(MAX_HOPS):
                location = response.headers.get("Location")
                if location is not None:
                    target = urljoin(response.url, location)
                    if target.startswith(stop_prefix):
                        return target
                    response = agent.get(target, allow_redirects=False, timeout=10)
                    continue
                asked = prompt.search(response.text) if response.status_code == 200 else None
                if asked is None:
                    raise AssertionError(f"{self.issuer} answered {response.status_code} without a sign-in page "
                                         f"or a redirect at {urlsplit(response.url).path}")
                form = {"prompt": asked.group(1)}
                if asked.group(1) == "login":
                    form.update(login=login, password="secret")
                response = agent.post(response.url, data=form, allow_redirects=False, timeout=10)
        raise AssertionError(f"{self.issuer} did not send the person to {stop_prefix} within {MAX_HOPS} steps")

    def _test(self, method: str, name: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        answer = requests.request(method, f"{self.issuer}/_test/{name}", json=body, timeout=5)
        answer.raise_for_status()
        return answer.json()


class JwtVerifier:
    """The SDK's ``TokenVerifier``: an RFC 9068 access token of ``issuer`` for ``resource``
    (signature by the AS's JWKS, ``typ`` at+jwt, ``iss``, ``aud``, ``exp`` give or take
    ``LEEWAY``), else None."""

    def __init__(self, issuer: str, resource: str, jwks_uri: str, seen: "TokensSeen") -> None:
        import jwt

        self.issuer = issuer
        self.resource = resource
        self._keys = jwt.PyJWKClient(jwks_uri, cache_keys=True, timeout=5)
        self._seen = seen

    async def verify_token(self, token: str) -> Any:
        import anyio

        return await anyio.to_thread.run_sync(self._verify, token)

    def _verify(self, token: str) -> Any:
        import jwt
        from mcp.server.auth.provider import AccessToken

        try:
            if str(jwt.get_unverified_header(token).get("typ")).lower() not in ("at+jwt", "application/at+jwt"):
                return None
            key = self._keys.get_signing_key_from_jwt(token)
            claims = jwt.decode(token, key.key, algorithms=["RS256"], audience=self.resource, issuer=self.issuer,
                                leeway=LEEWAY, options={"require": ["exp", "iat", "sub", "aud", "iss"]})
        except (jwt.PyJWTError, OSError):
            return None
        self._seen.valid(token)
        return AccessToken(token=token, client_id=str(claims.get("client_id", "")),
                           scopes=str(claims.get("scope", "")).split(),
                           expires_at=int(claims["exp"]) + LEEWAY,  # the SDK's own check allows no skew
                           resource=self.resource, subject=str(claims["sub"]), claims={"iss": claims["iss"]})


class TokensSeen:
    """Digests of the bearer tokens the backend was sent and of those it took; guarded by a
    lock (requests arrive on uvicorn's loop, tokens are verified on worker threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent: set[str] = set()  # every Authorization header's bearer value (or whole value), digested
        self._accepted: set[str] = set()
        self.without_token = 0  # requests without an Authorization header

    def arrived(self, authorization: str | None) -> None:
        with self._lock:
            if authorization is None:
                self.without_token += 1
            else:
                scheme, _, value = authorization.partition(" ")
                self._sent.add(digest(value.strip() if scheme.lower() == "bearer" else authorization))

    def valid(self, token: str) -> None:
        with self._lock:
            self._accepted.add(digest(token))

    def was_sent(self, token: str) -> bool:
        with self._lock:
            return digest(token) in self._sent

    def was_accepted(self, token: str) -> bool:
        with self._lock:
            return digest(token) in self._accepted

    def distinct_accepted(self) -> int:
        with self._lock:
            return len(self._accepted)


class _RecordAuthorization:
    """ASGI middleware: every HTTP request's Authorization header goes to ``seen``."""

    def __init__(self, app: Any, seen: TokensSeen) -> None:
        self.app = app
        self._seen = seen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not scope["path"].startswith("/.well-known/"):
            values = [value.decode("latin-1") for name, value in scope["headers"] if name == b"authorization"]
            self._seen.arrived(values[0] if values else None)
        await self.app(scope, receive, send)


class WhoamiBackend:
    """The whoami MCP backend (``.mcp_url``, ``http://127.0.0.1:<port>/mcp``, the RFC 8707
    resource) and its authorization server (``.auth``), both started by the constructor.
    ``access_token_ttl`` is the AS's access token life in seconds (a few seconds makes a
    gateway refresh, or find a revoked grant, within a test)."""

    def __init__(self, *, access_token_ttl: int = 3600) -> None:
        self.port = free_port()
        self.mcp_url = f"http://127.0.0.1:{self.port}/mcp"
        self.seen = TokensSeen()
        self.auth = BackendAuthServer(self.mcp_url, access_token_ttl=access_token_ttl)
        self._served: ServedApp | None = None
        try:
            self._served = serve_asgi_in_thread(_RecordAuthorization(self._app(), self.seen), port=self.port,
                                                name="whoami")
        except BaseException:
            self.auth.stop()
            raise

    def _app(self) -> Any:
        from mcp.server.auth.middleware.auth_context import get_access_token
        from mcp.server.auth.settings import AuthSettings
        from mcp.server.mcpserver import MCPServer

        seen = self.seen
        verifier = JwtVerifier(self.auth.issuer, self.mcp_url, self.auth.jwks_uri, seen)
        server = MCPServer("whoami", instructions="who the token's person is", version="0.0.1", log_level="WARNING",
                           token_verifier=verifier,
                           auth=AuthSettings(issuer_url=self.auth.issuer, resource_server_url=self.mcp_url,
                                             required_scopes=[SCOPE], validate_token_resource=True))

        def whoami() -> dict[str, Any]:
            """The subject of the access token this call came with, and how many distinct
            access tokens this backend has accepted so far."""
            token = get_access_token()
            return {"sub": token.subject if token is not None else None, "tokens": seen.distinct_accepted()}

        server.add_tool(whoami)
        return server.streamable_http_app()

    def received(self, token: str) -> bool:
        """Whether ``token`` ever came as a request's bearer token (accepted or not)."""
        return self.seen.was_sent(token)

    def accepted(self, token: str) -> bool:
        """Whether ``token`` was taken as a valid access token."""
        return self.seen.was_accepted(token)

    def stop(self) -> None:
        if self._served is not None:
            self._served.stop()
        self.auth.stop()

    def __enter__(self) -> "WhoamiBackend":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
