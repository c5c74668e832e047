"""The gateway's own access tokens on /mcp (``GatewayTokenAuthenticator``): verified once,
remembered until they expire, their grant checked every time it may have ended."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from vmcp_actors.config import OAuthServerConfig, UpstreamIdpConfig
from vmcp_actors.edge._auth import AuthError
from vmcp_actors.oauth._keys import TokenKeys, load_signing_key
from vmcp_actors.oauth._records import MemoryOAuthRecords
from vmcp_actors.oauth._server import Events, GatewayAuthorizationServer, Person
from vmcp_actors.oauth._tokens import GatewayTokenAuthenticator
from vmcp_actors.oauth._upstream import UpstreamIdp

ISSUER = "https://gw.example"


def pem() -> str:
    return ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()


@pytest.fixture
def server() -> GatewayAuthorizationServer:
    config = OAuthServerConfig(ISSUER, UpstreamIdpConfig("https://idp.example", "gw", "SECRET"), "KEY")
    records = MemoryOAuthRecords()
    upstream = UpstreamIdp(config.upstream, "secret", f"{ISSUER}/oauth/callback", records)
    return GatewayAuthorizationServer(config, records, TokenKeys(load_signing_key(pem())), upstream, Events())


def token_for(server: GatewayAuthorizationServer, subject: str = "alice", ttl: float = 600) -> tuple[str, str]:
    grant = server.grants.start(Person("https://idp.example", subject), "dcr_client", server.config.resource, "",
                                {"access_token": "idp", "refresh_token": None, "expires_at": 0})
    claims = {"iss": ISSUER, "sub": subject, "aud": server.config.resource, "grant": grant.grant_id,
              "idp": "https://idp.example", "client_id": "dcr_client"}
    return server.keys.sign(claims, ttl), grant.grant_id


def counting_verify(server: GatewayAuthorizationServer, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    verified: list[str] = []
    real = server.keys.verify

    def verify(token: str, **kwargs):
        verified.append(token)
        return real(token, **kwargs)
    monkeypatch.setattr(server.keys, "verify", verify)
    return verified


def test_a_token_is_verified_once_and_its_identity_is_the_idps_person(server, monkeypatch):
    verified = counting_verify(server, monkeypatch)
    authenticator = GatewayTokenAuthenticator(server, carries_upstream_token=False)
    token, _ = token_for(server)
    for _ in range(3):
        identity = authenticator.authenticate(f"Bearer {token}")
        assert (identity.issuer, identity.subject) == ("https://idp.example", "alice")
    assert verified == [token]


def test_a_remembered_token_whose_grant_ended_is_refused(server):
    authenticator = GatewayTokenAuthenticator(server, carries_upstream_token=False)
    token, grant = token_for(server)
    authenticator.authenticate(f"Bearer {token}")
    server.grants.end(grant, "revoked")
    with pytest.raises(AuthError, match="revoked"):
        authenticator.authenticate(f"Bearer {token}")


def test_a_remembered_token_is_verified_again_once_it_expired(server, monkeypatch):
    verified = counting_verify(server, monkeypatch)
    authenticator = GatewayTokenAuthenticator(server, carries_upstream_token=False)
    token, _ = token_for(server, ttl=-1)  # past its exp, inside the workers' clock skew
    authenticator.authenticate(f"Bearer {token}")
    authenticator.authenticate(f"Bearer {token}")
    assert verified == [token, token]  # not taken from memory after its exp


def test_a_forged_token_is_never_remembered(server):
    authenticator = GatewayTokenAuthenticator(server, carries_upstream_token=False)
    token, _ = token_for(server)
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    for _ in range(2):
        with pytest.raises(AuthError):
            authenticator.authenticate(f"Bearer {forged}")
