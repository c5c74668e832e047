import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from vmcp_actors.config import OidcConfig
from vmcp_actors.edge import _auth
from vmcp_actors.edge._auth import (
    AuthError,
    IdentityProviderUnavailable,
    JwksKeys,
    OidcAuthenticator,
)

ISSUER = "https://idp.example.test"


class FakeResponse:
    def __init__(self, body, status=200):
        self._body, self.status_code = body, status

    def json(self):
        return self._body

    def raise_for_status(self):
        if self.status_code >= 400:
            import requests

            raise requests.HTTPError(str(self.status_code))


class FakeIdP:
    """Serves a JWKS and a discovery document to JwksKeys; counts fetches."""

    def __init__(self):
        self.keys = {}
        self.fetches = []
        self.down = False
        self.add_key("k1")

    def add_key(self, kid):
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def token(self, kid="k1", **claims):
        payload = {"iss": ISSUER, "aud": "vmcp", "sub": "alice", "exp": time.time() + 300, **claims}
        return jwt.encode(payload, self.keys[kid], algorithm="RS256", headers={"kid": kid})

    def get(self, url, **kwargs):
        self.fetches.append(url)
        if self.down:
            import requests

            raise requests.ConnectionError("down")
        if url.endswith("/.well-known/openid-configuration"):
            return FakeResponse({"issuer": ISSUER, "jwks_uri": ISSUER + "/jwks"})
        jwks = []
        for kid, key in self.keys.items():
            jwk = jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
            jwks.append({**jwk, "kid": kid, "use": "sig", "alg": "RS256"})
        return FakeResponse({"keys": jwks})


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def authenticator(idp, **oidc):
    auth = OidcAuthenticator(OidcConfig(issuer=ISSUER, audience="vmcp", **oidc), http=idp)
    return auth


def test_nothing_is_fetched_until_the_first_token_then_keys_are_cached():
    idp = FakeIdP()
    auth = authenticator(idp)
    assert idp.fetches == []
    for _ in range(5):
        assert auth.authenticate("Bearer " + idp.token()).subject == "alice"
    assert idp.fetches == [ISSUER + "/.well-known/openid-configuration", ISSUER + "/jwks"]


def test_a_configured_jwks_url_skips_discovery():
    idp = FakeIdP()
    auth = authenticator(idp, jwks_url=ISSUER + "/jwks")
    auth.authenticate("Bearer " + idp.token())
    assert idp.fetches == [ISSUER + "/jwks"]


def test_a_rotated_key_is_fetched_at_once_and_unknown_kids_are_rate_limited(monkeypatch):
    idp = FakeIdP()
    clock = FakeClock()
    keys = JwksKeys(ISSUER, ISSUER + "/jwks", idp, clock=clock)
    keys.key_for("k1")
    idp.add_key("k2")
    keys.key_for("k2")  # right after the first fetch: still refetched
    assert len(idp.fetches) == 2
    for _ in range(20):
        with pytest.raises(AuthError):
            keys.key_for("made-up")
    assert len(idp.fetches) == 2  # the k2 refetch was this window's one
    clock.now += _auth.MIN_JWKS_REFETCH
    for _ in range(20):
        with pytest.raises(AuthError):
            keys.key_for("made-up")
    assert len(idp.fetches) == 3  # one refetch per window, however many bad kids


def test_an_unreachable_idp_before_any_key_is_unavailable_not_unauthorized():
    idp = FakeIdP()
    idp.down = True
    with pytest.raises(IdentityProviderUnavailable):
        authenticator(idp).authenticate("Bearer " + idp.token())


@pytest.mark.parametrize(
    "header, reason",
    [
        (None, "missing bearer token"),
        ("Basic abc", "'Bearer <token>'"),
        ("Bearer not-a-jwt", "malformed token"),
    ],
)
def test_bad_headers_say_what_is_wrong(header, reason):
    with pytest.raises(AuthError) as caught:
        authenticator(FakeIdP()).authenticate(header)
    assert reason in caught.value.reason


@pytest.mark.parametrize(
    "claims, reason",
    [
        ({"exp": time.time() - 3600}, "expired"),
        ({"aud": "other"}, "audience"),
        ({"iss": "https://evil.example.test"}, "issuer"),
        ({"nbf": time.time() + 3600}, "not valid yet"),
    ],
)
def test_each_failed_check_is_named_and_the_token_is_not_echoed(claims, reason):
    idp = FakeIdP()
    token = idp.token(**claims)
    with pytest.raises(AuthError) as caught:
        authenticator(idp).authenticate("Bearer " + token)
    assert reason in caught.value.reason
    assert token not in str(caught.value)


def test_leeway_accepts_a_token_that_just_expired():
    idp = FakeIdP()
    token = idp.token(exp=time.time() - 5)
    assert authenticator(idp, clock_skew=30).authenticate("Bearer " + token).subject == "alice"


def test_none_and_hmac_algorithms_are_refused_before_any_key_is_used():
    idp = FakeIdP()
    unsigned = jwt.encode({"iss": ISSUER, "aud": "vmcp", "sub": "a", "exp": time.time() + 60}, None, algorithm="none")
    hmac = jwt.encode({"iss": ISSUER, "aud": "vmcp", "sub": "a", "exp": time.time() + 60}, "x" * 32, algorithm="HS256")
    auth = authenticator(idp)
    for token in (unsigned, hmac):
        with pytest.raises(AuthError) as caught:
            auth.authenticate("Bearer " + token)
        assert "not allowed" in caught.value.reason
    assert idp.fetches == []


def test_the_identity_carries_claims_and_token_but_never_shows_the_token():
    idp = FakeIdP()
    token = idp.token()
    identity = authenticator(idp).authenticate("Bearer " + token)
    assert identity.issuer == ISSUER and identity.token == token and identity.claims["aud"] == "vmcp"
    assert token not in repr(identity)


def test_a_failing_jwks_endpoint_is_asked_once_per_window_not_per_request():
    idp = FakeIdP()
    idp.down = True
    clock = FakeClock()
    keys = JwksKeys(ISSUER, ISSUER + "/jwks", idp, clock=clock)
    for _ in range(10):
        with pytest.raises(IdentityProviderUnavailable):
            keys.key_for("k1")
    assert len(idp.fetches) == 1
    idp.down = False
    clock.now += _auth.JWKS_RETRY_AFTER_FAILURE
    assert keys.key_for("k1") is not None
    assert len(idp.fetches) == 2
