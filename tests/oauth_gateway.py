"""A gateway that is its clients' authorization server (``incomingAuth.type: oauth``) in
front of a real OpenID provider (``tests.oidc_idp.OidcIdP``, oidc-provider without
dynamic registration), on a port chosen first so its issuer URL is known to the IdP.

:class:`SignInGateway` starts both (and stops both); :class:`RawOAuthClient` is the
smallest OAuth client for protocol-level tests (Authlib's, with PKCE), whose sign-in goes
through the real pages in a headless browser (``tests.oauth_browser``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pykka
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from werkzeug.serving import make_server

from tests.gateway import GatewayServer
from tests.oauth_browser import CallbackCatcher, sign_in
from tests.oidc_idp import OidcIdP
from tests.ports import free_port
from vmcp_actors.web import create_app
from vmcp_actors.runtime import start_runtime

ADMIN_TOKEN = "adm1n-oauth-Tq7"
UPSTREAM_SECRET_ENV = "VMCP_TEST_UPSTREAM_SECRET"
SIGNING_KEY_ENV = "VMCP_TEST_OAUTH_KEY"
PREVIOUS_KEY_ENV = "VMCP_TEST_OAUTH_OLD_KEY"
ADMIN_TOKEN_ENV = "VMCP_TEST_OAUTH_ADMIN"
RECORDS_KEY_ENV = "VMCP_TEST_RECORDS_KEY"


def new_signing_key() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


class FixedPortGateway(GatewayServer):
    """A GatewayServer on a port chosen before it starts. ``served`` lists the requests it
    answered, as (method, path, status), in the order they were answered (which worker served
    which step, for tests that spread a flow over several)."""

    def __init__(self, config: dict, port: int):
        super().__init__(config)
        self.port = port
        self.served: list[tuple[str, str, int]] = []

    def _recorded(self, environ: dict[str, Any], start_response: Any) -> Any:
        def recording_start(status: str, headers: Any, *exc_info: Any) -> Any:
            self.served.append((environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), int(status.split()[0])))
            return start_response(status, headers, *exc_info)

        return self.app(environ, recording_start)

    def start(self) -> FixedPortGateway:
        self.app = create_app(start_runtime(self.config, self.host))
        self._server = make_server(self.host, self.port, self._recorded, threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="gateway-http", daemon=True)
        self._thread.start()
        return self


@contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def oauth_block(issuer: str, idp: OidcIdP, **fields: Any) -> dict[str, Any]:
    return {"issuer": issuer,
            "upstream": {"issuer": idp.issuer, "clientId": idp.client_id, "clientSecretEnv": UPSTREAM_SECRET_ENV,
                         "scopes": ["openid", "email", "profile", "groups"]},
            "signingKeyEnv": SIGNING_KEY_ENV, **fields}


class SignInGateway:
    """An OidcIdP and a gateway in front of it. ``workers`` gateways over the same config;
    the first listens on the issuer's port, unless ``proxied``: then every worker has a
    port of its own and the issuer's port is left to the proxy a test puts in front (a
    round robin, nginx). Tests that route steps to different workers put such a proxy in
    front, or call ``worker_urls`` directly."""

    def __init__(self, backends: list[dict[str, Any]], *, oauth: Mapping[str, Any] | None = None,
                 idp: Mapping[str, Any] | None = None, extra: Mapping[str, Any] | None = None,
                 workers: int = 1, signing_key: str | None = None, issuer_port: int | None = None,
                 authz: Mapping[str, Any] | None = None, proxied: bool = False):
        self.port = issuer_port or free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.signing_key = signing_key or new_signing_key()
        # /connect/login: the connect pages sign the browser's person in at the same IdP.
        self.idp = OidcIdP([f"{self.issuer}/oauth/callback", f"{self.issuer}/connect/login"], **dict(idp or {}))
        self._env = environment({UPSTREAM_SECRET_ENV: self.idp.client_secret, SIGNING_KEY_ENV: self.signing_key,
                                 ADMIN_TOKEN_ENV: ADMIN_TOKEN, RECORDS_KEY_ENV: "records-key-0123456789abcdef"})
        self._env.__enter__()
        self._restart_env: Any = None  # what restart() put in the environment, undone by stop()
        self.config = {"name": "signin-gw", "backends": backends,
                       "incomingAuth": {"type": "oauth", "oauth": oauth_block(self.issuer, self.idp, **dict(oauth or {})),
                                        **({"authz": dict(authz)} if authz else {})},
                       "admin": {"tokenEnv": ADMIN_TOKEN_ENV}, **dict(extra or {})}
        self.gateways: list[FixedPortGateway] = []
        self._ports = [free_port() if proxied or index else self.port for index in range(workers)]
        self._start_workers()

    def _start_workers(self) -> None:
        try:
            for port in self._ports:
                self.gateways.append(FixedPortGateway(self.config, port).start())
        except BaseException:
            self.stop()
            raise

    def restart(self, *, signing_key: str, previous_key: str | None = None) -> None:
        """Stop every worker and start them again on their ports (same IdP, same records)
        with ``signing_key`` in ``signingKeyEnv`` and, when given, ``previous_key`` in
        ``previousSigningKeyEnvs`` (PREVIOUS_KEY_ENV): an operator's key rotation."""
        for gateway in self.gateways:
            gateway.stop()
        self.gateways = []
        if self._restart_env is not None:
            self._restart_env.__exit__(None, None, None)
        self._restart_env = environment({SIGNING_KEY_ENV: signing_key,
                                         **({PREVIOUS_KEY_ENV: previous_key} if previous_key else {})})
        self._restart_env.__enter__()
        self.signing_key = signing_key
        incoming = self.config["incomingAuth"]
        oauth = {**incoming["oauth"], "previousSigningKeyEnvs": [PREVIOUS_KEY_ENV] if previous_key else []}
        self.config = {**self.config, "incomingAuth": {**incoming, "oauth": oauth}}
        self._start_workers()

    @property
    def gateway(self) -> FixedPortGateway:
        return self.gateways[0]

    @property
    def worker_urls(self) -> list[str]:
        """Each worker's own base URL (the issuer's, for the first one unless proxied)."""
        return [f"http://127.0.0.1:{port}" for port in self._ports]

    @property
    def mcp_url(self) -> str:
        return f"{self.issuer}/mcp"

    def stop(self) -> None:
        for gateway in self.gateways:
            gateway.stop()
        self.gateways = []
        self.idp.stop()
        if self._restart_env is not None:
            self._restart_env.__exit__(None, None, None)
            self._restart_env = None
        self._env.__exit__(None, None, None)

    def __enter__(self) -> SignInGateway:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class RawOAuthClient:
    """A dynamically registered public client driving the flow with Authlib's requests
    client (PKCE S256, state, resource), its redirect URI a loopback catcher."""

    def __init__(self, issuer: str, *, name: str = "raw test client", auth_method: str = "none",
                 base: str | None = None):
        self.issuer = issuer
        self.base = base or issuer
        self.catcher = CallbackCatcher()
        registration = requests.post(f"{self.base}/oauth/register", json={
            "client_name": name, "redirect_uris": [self.catcher.redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"], "token_endpoint_auth_method": auth_method},
            timeout=10)
        assert registration.status_code == 201, registration.text
        self.registration = registration.json()
        self.client_id = self.registration["client_id"]
        self.client_secret = self.registration.get("client_secret")

    def session(self) -> Any:
        from authlib.integrations.requests_client import OAuth2Session

        return OAuth2Session(self.client_id, self.client_secret, redirect_uri=self.catcher.redirect_uri,
                             code_challenge_method="S256",
                             token_endpoint_auth_method=self.registration["token_endpoint_auth_method"])

    def authorization_url(self, session: Any, verifier: str, **params: Any) -> tuple[str, str]:
        params.setdefault("resource", f"{self.issuer}/mcp")
        return session.create_authorization_url(f"{self.base}/oauth/authorize", code_verifier=verifier, **params)

    def sign_in(self, driver: Any, login: str, **pages: Any) -> dict[str, Any]:
        """The whole flow through the browser: the token answer (and the redirect's query as ``_redirect``)."""
        import secrets

        session = self.session()
        verifier = secrets.token_urlsafe(48)
        url, state = self.authorization_url(session, verifier)
        sign_in(driver, url, login=login, stop_prefix=self.catcher.redirect_uri, **pages)
        redirect = self.catcher.wait()
        assert redirect.get("state") == state, redirect
        token = session.fetch_token(f"{self.base}/oauth/token", code=redirect["code"], code_verifier=verifier,
                                    resource=f"{self.issuer}/mcp")
        return {**dict(token), "_redirect": redirect}

    def stop(self) -> None:
        self.catcher.stop()


def mcp_post(url: str, token: str | None, message: dict[str, Any], **headers: str) -> requests.Response:
    sent = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
            "MCP-Protocol-Version": "2025-11-25", **headers}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    return requests.post(url, json=message, headers=sent, timeout=15)


@contextmanager
def connect_setup(extra: Mapping[str, Any] | None = None, more: Any = None,
                  **options: Any) -> Iterator[tuple[SignInGateway, Any, Any]]:
    """The connect tests' world (issue 37): the TypeScript SDK's example OAuth server as the
    backend ``ts`` (outgoingAuth type oauth), a SignInGateway in front of it (``options``:
    workers, authz...) and one headless browser; ``(gateway, driver, backend)``. ``more``:
    given the example server, ``(backends, outgoingAuth backends)`` to add (one that uses its
    authorization server). Everything started is stopped (its actors too) on leaving."""
    from tests.oauth_browser import browser, need_browser
    from tests.oauth_clients import TsExampleOAuthServer

    need_browser()
    backend = TsExampleOAuthServer()
    gateway = None
    try:
        backends, auth = more(backend) if more is not None else ([], {})
        gateway = SignInGateway([{"name": "ts", "url": f"http://localhost:{backend.port}/mcp"}, *backends],
                                extra={"outgoingAuth": {"backends": {"ts": {"type": "oauth"}, **auth}},
                                       **dict(extra or {})}, **options)
        with browser() as driver:
            yield gateway, driver, backend
    finally:
        if gateway is not None:
            gateway.stop()
        backend.stop()
        pykka.ActorRegistry.stop_all(block=True, timeout=5)
