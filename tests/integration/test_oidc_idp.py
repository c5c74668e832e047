"""The sign-in tests' upstream IdP (tests/oidc_idp.py) is the real thing, driven the real way
(tests/oauth_browser.py): oidc-provider's own discovery, refusal of dynamic registration,
login and consent pages in a headless browser, and its token endpoint, used by Authlib's
OAuth 2.0 client with PKCE."""

from __future__ import annotations

import jwt
import pytest
import requests
from authlib.common.security import generate_token
from authlib.integrations.base_client.errors import OAuthError
from authlib.integrations.requests_client import OAuth2Session

from tests.oauth_browser import IDP_CONSENT, IDP_LOGIN, CallbackCatcher, browser, sign_in_pages
from tests.oidc_idp import OidcIdP

SCOPE = "openid email profile groups"
ACCESS_TOKEN_TTL, ID_TOKEN_TTL = 3, 4
USERS = {"alice": {"email": "alice@corp.example", "name": "Alice Liddell", "groups": ["engineering", "admins"]}}


@pytest.fixture(scope="module")
def signing_in():
    """The IdP with two redirect URIs, one catcher for each sign-in of the flow test."""
    with CallbackCatcher() as first, CallbackCatcher() as second, OidcIdP(
            [first.redirect_uri, second.redirect_uri], access_token_ttl=ACCESS_TOKEN_TTL,
            id_token_ttl=ID_TOKEN_TTL, users=USERS) as idp:
        yield idp, first, second


def test_discovery_is_a_company_idp_without_dynamic_registration(signing_in):
    idp, first, _ = signing_in
    metadata = requests.get(idp.discovery_url, timeout=5).json()
    assert metadata["issuer"] == idp.issuer
    assert "registration_endpoint" not in metadata
    assert metadata["token_endpoint"] == idp.token_endpoint
    assert metadata["authorization_endpoint"] == idp.authorization_endpoint
    assert set(metadata["token_endpoint_auth_methods_supported"]) == {"client_secret_basic", "client_secret_post"}
    assert metadata["code_challenge_methods_supported"] == ["S256"]
    assert {"authorization_code", "refresh_token"} <= set(metadata["grant_types_supported"])
    registered = requests.post(idp.issuer + "/reg", json={"redirect_uris": [first.redirect_uri]}, timeout=5)
    assert registered.status_code == 404


def _session(idp: OidcIdP, redirect_uri: str, auth_method: str = "client_secret_basic") -> OAuth2Session:
    return OAuth2Session(idp.client_id, idp.client_secret, scope=SCOPE, redirect_uri=redirect_uri,
                         code_challenge_method="S256", token_endpoint_auth_method=auth_method)


def test_a_browser_sign_in_with_pkce_gets_tokens_that_refresh_and_rotate(signing_in):
    idp, first, second = signing_in
    client = _session(idp, first.redirect_uri)
    verifier, nonce = generate_token(48), generate_token(16)
    url, state = client.create_authorization_url(idp.authorization_endpoint, code_verifier=verifier, nonce=nonce)
    assert "code_challenge_method=S256" in url

    with browser() as driver:
        final_url, pages = sign_in_pages(driver, url, login="alice", stop_prefix=first.redirect_uri)
        assert pages == [IDP_LOGIN, IDP_CONSENT]
        assert final_url.startswith(first.redirect_uri + "?")
        answer = first.wait(5)
        assert answer["state"] == state and answer["iss"] == idp.issuer and answer["code"]

        # The IdP's session and the grant are remembered: a second sign-in shows no page.
        second_client = _session(idp, second.redirect_uri)
        second_url, _ = second_client.create_authorization_url(
            idp.authorization_endpoint, code_verifier=generate_token(48))
        _, second_pages = sign_in_pages(driver, second_url, login="alice", stop_prefix=second.redirect_uri)
        assert second_pages == []
        second_code = second.wait(5)["code"]

    with pytest.raises(OAuthError) as refused:  # PKCE holds: the wrong verifier gets no token
        second_client.fetch_token(idp.token_endpoint, code=second_code, code_verifier=generate_token(48))
    assert refused.value.error == "invalid_grant"

    token = client.fetch_token(idp.token_endpoint, code=answer["code"], code_verifier=verifier)
    assert token["token_type"].lower() == "bearer" and token["expires_in"] == ACCESS_TOKEN_TTL
    assert token["access_token"] and token["refresh_token"]
    signing_key = jwt.PyJWKClient(idp.issuer + "/jwks").get_signing_key_from_jwt(token["id_token"])
    claims = jwt.decode(token["id_token"], signing_key.key, algorithms=["RS256"], audience=idp.client_id,
                        issuer=idp.issuer)
    assert claims["exp"] - claims["iat"] == ID_TOKEN_TTL and claims["nonce"] == nonce
    assert (claims["sub"], claims["email"], claims["name"], claims["groups"]) == (
        "alice", "alice@corp.example", "Alice Liddell", ["engineering", "admins"])
    userinfo = requests.get(idp.userinfo_endpoint, timeout=5,
                            headers={"Authorization": f"Bearer {token['access_token']}"}).json()
    assert userinfo["sub"] == "alice" and userinfo["groups"] == ["engineering", "admins"]

    # A refresh with client_secret_post this time; the used refresh token is rotated away.
    poster = _session(idp, first.redirect_uri, auth_method="client_secret_post")
    refreshed = poster.refresh_token(idp.token_endpoint, refresh_token=token["refresh_token"])
    assert refreshed["access_token"] != token["access_token"]
    assert refreshed["refresh_token"] != token["refresh_token"] and refreshed["id_token"]
    with pytest.raises(OAuthError) as reused:
        poster.refresh_token(idp.token_endpoint, refresh_token=token["refresh_token"])
    assert reused.value.error == "invalid_grant"

    assert idp.token_requests() == {"authorization_code": 2, "refresh_token": 2}
    assert idp.failed_token_requests() == {"authorization_code": 1, "refresh_token": 1}


def test_cancel_at_the_idp_reaches_the_client_and_an_unlisted_login_gets_default_claims():
    with CallbackCatcher() as cancelled, CallbackCatcher() as approved, \
            OidcIdP([cancelled.redirect_uri, approved.redirect_uri]) as idp, browser() as driver:
        client = _session(idp, cancelled.redirect_uri)
        url, state = client.create_authorization_url(idp.authorization_endpoint, code_verifier=generate_token(48))
        _, pages = sign_in_pages(driver, url, login="bob", approve_at_idp=False, stop_prefix=cancelled.redirect_uri)
        assert pages == [IDP_LOGIN, IDP_CONSENT]
        answer = cancelled.wait(5)
        assert answer["error"] == "access_denied" and answer["state"] == state and "code" not in answer

        # Signed in still, not yet consented: only the consent page comes.
        client = _session(idp, approved.redirect_uri)
        verifier = generate_token(48)
        url, _ = client.create_authorization_url(idp.authorization_endpoint, code_verifier=verifier)
        _, pages = sign_in_pages(driver, url, login="bob", stop_prefix=approved.redirect_uri)
        assert pages == [IDP_CONSENT]
        token = client.fetch_token(idp.token_endpoint, code=approved.wait(5)["code"], code_verifier=verifier)
        claims = jwt.decode(token["id_token"], options={"verify_signature": False})
        assert (claims["sub"], claims["email"], claims["name"], claims["groups"]) == ("bob", "bob@example.com", "bob", [])
        assert idp.token_requests() == {"authorization_code": 1}
