"""When the gateway renews the identity provider's tokens of a grant (``UpstreamIdp``)."""

from __future__ import annotations

import pytest

from vmcp_actors.config import UpstreamIdpConfig
from vmcp_actors.oauth._records import MemoryOAuthRecords
from vmcp_actors.oauth._upstream import UpstreamIdp


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def idp() -> tuple[UpstreamIdp, Clock]:
    clock = Clock()
    config = UpstreamIdpConfig("https://idp.example", "gateway", "SECRET_ENV")
    return UpstreamIdp(config, "secret", "https://gw.example/oauth/callback", MemoryOAuthRecords(), clock), clock


@pytest.mark.parametrize(("lifetime", "due_after"), [(3600, 3570), (60, 30), (20, 10), (2, 1)])
def test_a_token_is_due_30_s_before_its_end_or_halfway_through_a_shorter_life(idp, lifetime, due_after):
    upstream, clock = idp
    kept = upstream.kept_tokens({"access_token": "at", "refresh_token": "rt", "expires_in": lifetime})
    clock.now += due_after - 0.5
    assert not upstream._due(kept)  # a fresh short-lived token is not renewed the moment it arrives
    clock.now += 1
    assert upstream._due(kept)


def test_a_kept_token_past_its_end_is_due_whatever_else_it_says(idp):
    upstream, clock = idp
    kept = upstream.kept_tokens({"access_token": "at", "expires_in": 3600})
    assert upstream._due({**kept, "expires_at": clock.now - 1})


@pytest.mark.parametrize(("supported", "chosen"), [
    (None, "client_secret_basic"),  # absent: OpenID discovery's default
    (["client_secret_basic", "client_secret_post"], "client_secret_basic"),
    (["client_secret_post", "private_key_jwt"], "client_secret_post"),
])
def test_the_gateway_authenticates_to_the_idp_as_its_metadata_allows(idp, supported, chosen):
    upstream, _ = idp
    metadata = {"issuer": "https://idp.example", "authorization_endpoint": "https://idp.example/auth",
                "token_endpoint": "https://idp.example/token", "jwks_uri": "https://idp.example/jwks"}
    if supported is not None:
        metadata["token_endpoint_auth_methods_supported"] = supported
    upstream._metadata = metadata  # as read from its discovery document
    with upstream._session() as session:
        assert session.token_endpoint_auth_method == chosen
