"""The gateway as its clients' OAuth 2.1 authorization server (``incomingAuth.type: oauth``),
in front of one OpenID Connect provider. ``build_oauth`` assembles it from the config;
``vmcp_actors.web.oauth`` serves its endpoints and pages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from vmcp_actors.config import UpstreamIdpConfig, VmcpConfig
from vmcp_actors.exceptions import ConfigError
from vmcp_actors.oauth._connections import Connections
from vmcp_actors.oauth._keys import KeyProblem, TokenKeys, load_signing_key
from vmcp_actors.oauth._records import MemoryOAuthRecords, OAuthRecords, RedisOAuthRecords
from vmcp_actors.oauth._server import Events, GatewayAuthorizationServer
from vmcp_actors.oauth._tokens import GatewayTokenAuthenticator
from vmcp_actors.oauth._upstream import UpstreamIdp

__all__ = ["ConnectService", "OAuthSecrets", "OAuthService", "build_connections", "build_oauth", "oauth_secrets"]


@dataclass(frozen=True)
class OAuthService:
    server: GatewayAuthorizationServer
    authenticator: GatewayTokenAuthenticator

    @property
    def records(self) -> OAuthRecords:
        return self.server.records

    def overview(self) -> dict[str, Any]:
        """For operators: registered clients and live grants per person, never a token or secret."""
        grants = self.server.grants.of()
        clients = []
        for client_id in sorted(self.records.keys("client")):
            client = self.server.registered.find(client_id)
            if client is not None:
                clients.append(_client_row(client, grants))
        for client_id in sorted({grant["client_id"] for grant in grants if grant["client_id"].startswith("https://")}):
            clients.append({"clientId": client_id, "name": "", "kind": "cimd", "verifiedDomain":
                            urlsplit(client_id).hostname, "redirectUris": [], "authMethod": "none",
                            "grants": sum(1 for grant in grants if grant["client_id"] == client_id)})
        return {"clients": clients, "grants": grants,
                "upstreamRefreshes": self.server.upstream.refreshes}

    def end_grants(self, *, grant: str | None = None, user: str | None = None, client: str | None = None) -> int:
        """End one grant, every grant of a person (by subject), or every grant of a client."""
        ended = 0
        for found in self.server.grants.of():
            if (grant is not None and found["grant"] == grant) or (user is not None and found["user"] == user) \
                    or (client is not None and found["client_id"] == client):
                self.server.grants.end(found["grant"], "ended_by_operator")
                ended += 1
        return ended


@dataclass(frozen=True)
class OAuthSecrets:
    """What the authorization server holds from the environment, read before anything starts."""

    keys: TokenKeys
    upstream_client_secret: str = field(repr=False)


def oauth_secrets(config: VmcpConfig, secret: Callable[[str, str | None], str | None]) -> OAuthSecrets:
    """The signing keys and the IdP client's secret; a ConfigError naming the field when one
    is unset or not a key (``secret(field path, env var name)`` reads one)."""
    oauth = config.incoming_auth.oauth
    assert oauth is not None
    keys = TokenKeys(_key("incomingAuth.oauth.signingKeyEnv", oauth.signing_key_env, secret),
                     tuple(_key(f"incomingAuth.oauth.previousSigningKeyEnvs[{index}]", name, secret)
                           for index, name in enumerate(oauth.previous_signing_key_envs)))
    client_secret = secret("incomingAuth.oauth.upstream.clientSecretEnv", oauth.upstream.client_secret_env)
    assert client_secret is not None
    return OAuthSecrets(keys, client_secret)


def build_oauth(config: VmcpConfig, secrets: OAuthSecrets, redis_client: Any, signer: Any,
                count: Callable[[str, str], None] | None = None) -> OAuthService:
    """``redis_client`` is the records' Redis when they are shared, else None."""
    oauth = config.incoming_auth.oauth
    assert oauth is not None
    records = _records(config, redis_client, signer)
    upstream = UpstreamIdp(oauth.upstream, secrets.upstream_client_secret, f"{oauth.issuer}/oauth/callback",
                           records)
    server = GatewayAuthorizationServer(oauth, records, secrets.keys, upstream, Events(count))
    exchanges = any(auth.type == "token_exchange" for auth in (config.outgoing_auth.default,
                                                               *config.outgoing_auth.backends.values()))
    return OAuthService(server, GatewayTokenAuthenticator(server, carries_upstream_token=exchanges))


@dataclass(frozen=True)
class ConnectService:
    """People's connections to backends of type oauth, and the sign-in that tells the
    connect pages who the browser's person is (the same identity provider callers use)."""

    connections: Connections
    login: UpstreamIdp


def build_connections(config: VmcpConfig, backend_secrets: dict[str, str | None], login_secret: str,
                      redis_client: Any, signer: Any, count: Callable[[str, str], None] | None = None) -> ConnectService:
    """``login_secret``: the secret of the gateway's client at the identity provider
    (incomingAuth.oauth.upstream's, or incomingAuth.oidc's)."""
    records = _records(config, redis_client, signer)
    public_url = config.public_url
    assert public_url is not None
    incoming = config.incoming_auth
    if incoming.oauth is not None:
        idp = incoming.oauth.upstream
    else:
        assert incoming.oidc is not None and incoming.oidc.client_id is not None
        idp = UpstreamIdpConfig(incoming.oidc.issuer, incoming.oidc.client_id, incoming.oidc.client_secret_env or "",
                                ("openid",))
    login = UpstreamIdp(idp, login_secret, f"{public_url}/connect/login", records)
    return ConnectService(Connections(config, records, backend_secrets, Events(count, "connection")), login)


def _records(config: VmcpConfig, redis_client: Any, signer: Any) -> OAuthRecords:
    """The records in the Redis the session records use (shared by every worker), else in memory."""
    return RedisOAuthRecords(redis_client, signer, config.session_storage.key_prefix) \
        if redis_client is not None else MemoryOAuthRecords()


def _client_row(client: Any, grants: list[dict[str, Any]]) -> dict[str, Any]:
    return {"clientId": client.client_id, "name": client.client_name, "kind": client.kind,
            "verifiedDomain": client.verified_domain, "redirectUris": list(client.redirect_uris),
            "authMethod": client.token_endpoint_auth_method,
            "grants": sum(1 for grant in grants if grant["client_id"] == client.client_id)}


def _key(path: str, name: str, secret: Callable[[str, str | None], str | None]) -> Any:
    pem = secret(path, name)
    assert pem is not None
    try:
        return load_signing_key(pem)
    except KeyProblem as problem:
        raise ConfigError([f"{path}: environment variable {name} {problem}"]) from None
