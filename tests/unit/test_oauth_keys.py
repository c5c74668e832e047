"""The keys that sign the gateway's access tokens (vmcp_actors.oauth._keys): which keys load,
their kid, what a token must be to verify, and rotation."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from joserfc.jwk import ECKey, RSAKey

from vmcp_actors.oauth._keys import KeyProblem, TokenKeys, load_signing_key

ISSUER = "https://gateway.example"
AUDIENCE = "https://gateway.example/mcp"
CLAIMS = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice"}
PRIVATE_MEMBERS = {"d", "p", "q", "dp", "dq", "qi", "oth", "k"}

# An SM2 key (openssl genpkey -algorithm SM2): a PEM private key this build of cryptography cannot load.
SM2_PEM = """-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqBHM9VAYItBG0wawIBAQQgh8te/r52c6Lt+9f8
8kaeQDWDA6riqMbbHvuxzyh9QzahRANCAAR16wjQj6lC7iTuwtWeDQifP835Moj7
E8p4Mt1WGBevsp6WqYOJElqH5T0Y1PWPh5Cnb6sifwfc1Yog/NmbH3EV
-----END PRIVATE KEY-----
"""


def pem_of(private_key, password: bytes | None = None) -> str:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     encryption).decode()


def ec_pem() -> str:
    return pem_of(ec.generate_private_key(ec.SECP256R1()))


@pytest.fixture(scope="module")
def rsa_pem() -> str:
    return pem_of(rsa.generate_private_key(public_exponent=65537, key_size=2048))


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_made_token(header: dict, claims: dict, sign) -> str:
    """A JWT put together by hand, for headers PyJWT would not write."""
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    return f"{signing_input}.{b64url(sign(signing_input.encode()))}"


def fresh_claims(**extra) -> dict:
    now = int(time.time())
    return {**CLAIMS, "iat": now, "exp": now + 600, **extra}


# --- which keys load -----------------------------------------------------------------------


def test_an_ec_p256_key_signs_es256_and_an_rsa_key_rs256(rsa_pem):
    ec_key, rsa_key = load_signing_key(ec_pem()), load_signing_key(rsa_pem)
    assert ec_key.algorithm == "ES256" and ec_key.public_jwk["crv"] == "P-256"
    assert rsa_key.algorithm == "RS256" and rsa_key.public_jwk["kty"] == "RSA"
    for key in (ec_key, rsa_key):
        assert key.public_jwk["alg"] == key.algorithm and key.public_jwk["use"] == "sig"
        assert key.public_jwk["kid"] == key.kid


@pytest.mark.parametrize(("make", "expected"), [
    (lambda: pem_of(ec.generate_private_key(ec.SECP384R1())), "this EC key is on another curve"),
    (lambda: pem_of(rsa.generate_private_key(public_exponent=65537, key_size=1024)), "at least 2048 bits"),
    (lambda: pem_of(ed25519.Ed25519PrivateKey.generate()), "must be an EC P-256 or an RSA key"),
    (lambda: SM2_PEM, "must be an EC P-256 or an RSA key"),  # UnsupportedAlgorithm, not a traceback
], ids=["p384", "rsa1024", "ed25519", "sm2"])
def test_keys_that_cannot_sign_es256_or_rs256_safely_are_refused(make, expected):
    with pytest.raises(KeyProblem, match=expected):
        load_signing_key(make())


@pytest.mark.parametrize("make", [
    lambda: "not a key at all",
    lambda: ec_pem().replace("\n", "", 3)[:120] + "\n-----END PRIVATE KEY-----\n",  # damaged
    lambda: ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode(),  # public half only
    lambda: pem_of(ec.generate_private_key(ec.SECP256R1()), password=b"secret"),  # encrypted
], ids=["garbage", "damaged", "public", "encrypted"])
def test_what_is_not_an_unencrypted_private_key_is_refused_without_repeating_it(make):
    pem = make()
    with pytest.raises(KeyProblem) as refused:
        load_signing_key(pem)
    assert str(refused.value) == "is not an unencrypted PEM private key"
    # The message goes into a ConfigError at startup: no line of the key may appear in it.
    assert not any(line and line in str(refused.value) for line in pem.splitlines() if "-----" not in line)


def test_the_kid_is_the_rfc7638_thumbprint_of_the_public_key(rsa_pem):
    pem = ec_pem()
    key = load_signing_key(pem)
    jwk = key.public_jwk
    # RFC 7638 section 3: SHA-256 of the required members, sorted, without whitespace.
    canonical = json.dumps({name: jwk[name] for name in ("crv", "kty", "x", "y")}, separators=(",", ":"),
                           sort_keys=True)
    assert key.kid == b64url(hashlib.sha256(canonical.encode()).digest())
    assert key.kid == ECKey.import_key(pem).thumbprint()
    assert load_signing_key(rsa_pem).kid == RSAKey.import_key(rsa_pem).thumbprint()
    # Every worker loading the same PEM names it the same way.
    assert load_signing_key(pem).kid == key.kid


# --- signing and verifying -------------------------------------------------------------------


def test_a_signed_token_verifies_with_its_claims_kid_and_type(rsa_pem):
    for keys in (TokenKeys(load_signing_key(ec_pem())), TokenKeys(load_signing_key(rsa_pem))):
        token = keys.sign({**CLAIMS, "grant": "g1"}, ttl=600)
        header = jwt.get_unverified_header(token)
        assert header["kid"] == keys.current.kid and header["alg"] == keys.current.algorithm
        assert header["typ"] == "at+jwt"  # RFC 9068
        claims = keys.verify(token, issuer=ISSUER, audience=AUDIENCE)
        assert claims["sub"] == "alice" and claims["grant"] == "g1"
        assert claims["exp"] - claims["iat"] == 600 and len(claims["jti"]) == 32


def test_each_token_has_its_own_jti():
    keys = TokenKeys(load_signing_key(ec_pem()))
    first, second = (keys.verify(keys.sign(CLAIMS, 60), issuer=ISSUER, audience=AUDIENCE) for _ in range(2))
    assert first["jti"] != second["jti"]


def test_another_audience_or_issuer_is_refused():
    keys = TokenKeys(load_signing_key(ec_pem()))
    token = keys.sign(CLAIMS, 600)
    with pytest.raises(jwt.InvalidAudienceError):
        keys.verify(token, issuer=ISSUER, audience="https://other.example/mcp")
    with pytest.raises(jwt.InvalidIssuerError):
        keys.verify(token, issuer="https://other.example", audience=AUDIENCE)


def test_an_expired_token_is_refused_beyond_the_clock_skew_and_accepted_within_it():
    keys = TokenKeys(load_signing_key(ec_pem()))
    with pytest.raises(jwt.ExpiredSignatureError):
        keys.verify(keys.sign(CLAIMS, ttl=-120), issuer=ISSUER, audience=AUDIENCE)
    # 10 s past its life is past it: an operator's short accessTokenTtl holds (the skew is
    # only what the gateway's own workers' clocks differ by)
    with pytest.raises(jwt.ExpiredSignatureError):
        keys.verify(keys.sign(CLAIMS, ttl=-10), issuer=ISSUER, audience=AUDIENCE)
    assert keys.verify(keys.sign(CLAIMS, ttl=-2), issuer=ISSUER, audience=AUDIENCE)["sub"] == "alice"


def test_a_token_without_a_subject_is_refused():
    keys = TokenKeys(load_signing_key(ec_pem()))
    with pytest.raises(jwt.MissingRequiredClaimError):
        keys.verify(keys.sign({"iss": ISSUER, "aud": AUDIENCE}, 600), issuer=ISSUER, audience=AUDIENCE)


def test_a_token_signed_by_a_key_not_in_the_set_is_refused():
    ours, theirs = TokenKeys(load_signing_key(ec_pem())), TokenKeys(load_signing_key(ec_pem()))
    with pytest.raises(jwt.InvalidSignatureError):
        ours.verify(theirs.sign(CLAIMS, 600), issuer=ISSUER, audience=AUDIENCE)
    # Nor does naming our kid help a stranger: the signature is checked with our key.
    stranger = ec.generate_private_key(ec.SECP256R1())
    forged = jwt.encode(fresh_claims(), stranger, algorithm="ES256",
                        headers={"kid": ours.current.kid, "typ": "at+jwt"})
    with pytest.raises(jwt.InvalidSignatureError):
        ours.verify(forged, issuer=ISSUER, audience=AUDIENCE)


def test_a_token_whose_algorithm_is_not_its_keys_is_refused(rsa_pem):
    keys = TokenKeys(load_signing_key(ec_pem()))
    other_algorithm = jwt.encode(fresh_claims(), load_signing_key(rsa_pem).private_key, algorithm="RS256",
                                 headers={"kid": keys.current.kid, "typ": "at+jwt"})
    with pytest.raises(jwt.InvalidAlgorithmError):
        keys.verify(other_algorithm, issuer=ISSUER, audience=AUDIENCE)


def test_hs256_with_the_public_key_as_its_secret_is_refused(rsa_pem):
    # The classic confusion: the public key (which the JWKS publishes) used as an HMAC secret.
    for key in (load_signing_key(ec_pem()), load_signing_key(rsa_pem)):
        keys = TokenKeys(key)
        public_pem = key.private_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        forged = hand_made_token({"alg": "HS256", "kid": key.kid, "typ": "at+jwt"}, fresh_claims(),
                                 lambda data, secret=public_pem: hmac.new(secret, data, hashlib.sha256).digest())
        with pytest.raises(jwt.InvalidAlgorithmError):
            keys.verify(forged, issuer=ISSUER, audience=AUDIENCE)


def test_an_unsigned_or_altered_token_is_refused():
    keys = TokenKeys(load_signing_key(ec_pem()))
    unsigned = hand_made_token({"alg": "none", "kid": keys.current.kid, "typ": "at+jwt"}, fresh_claims(),
                               lambda data: b"")
    with pytest.raises(jwt.InvalidAlgorithmError):
        keys.verify(unsigned, issuer=ISSUER, audience=AUDIENCE)
    header, _, signature = keys.sign(CLAIMS, 600).split(".")
    altered = f"{header}.{b64url(json.dumps(fresh_claims(sub='mallory')).encode())}.{signature}"
    with pytest.raises(jwt.InvalidSignatureError):
        keys.verify(altered, issuer=ISSUER, audience=AUDIENCE)


def test_a_token_that_is_not_an_access_token_is_refused():
    """An ID token or any other JWT signed with the same key is not an access token (RFC 9068 typ)."""
    keys = TokenKeys(load_signing_key(ec_pem()))
    key = keys.current
    for typ in ("JWT", None):
        headers = {"kid": key.kid, **({"typ": typ} if typ else {})}
        other = jwt.encode(fresh_claims(), key.private_key, algorithm=key.algorithm, headers=headers)
        if typ is None:  # PyJWT adds typ JWT by default; take it out
            other = hand_made_token({"alg": key.algorithm, "kid": key.kid}, fresh_claims(),
                                    lambda data: b"x")
        with pytest.raises(jwt.InvalidTokenError, match="not an access token"):
            keys.verify(other, issuer=ISSUER, audience=AUDIENCE)
    assert keys.verify(keys.sign(CLAIMS, 600), issuer=ISSUER, audience=AUDIENCE)["sub"] == "alice"


def test_a_kid_that_is_not_text_is_a_jwt_error_not_a_crash():
    keys = TokenKeys(load_signing_key(ec_pem()))
    odd = hand_made_token({"alg": "ES256", "kid": [keys.current.kid], "typ": "at+jwt"}, fresh_claims(),
                          lambda data: b"x")
    with pytest.raises(jwt.PyJWTError):
        keys.verify(odd, issuer=ISSUER, audience=AUDIENCE)


# --- rotation ----------------------------------------------------------------------------------


def test_after_a_rotation_old_tokens_verify_and_new_ones_carry_the_new_kid(rsa_pem):
    old_key, new_key = load_signing_key(ec_pem()), load_signing_key(rsa_pem)
    old_token = TokenKeys(old_key).sign(CLAIMS, 600)
    rotated = TokenKeys(new_key, (old_key,))
    assert rotated.verify(old_token, issuer=ISSUER, audience=AUDIENCE)["sub"] == "alice"
    new_token = rotated.sign(CLAIMS, 600)
    assert jwt.get_unverified_header(new_token)["kid"] == new_key.kid != old_key.kid
    assert rotated.verify(new_token, issuer=ISSUER, audience=AUDIENCE)["sub"] == "alice"
    # Once the old key is dropped from previous, its tokens stop verifying.
    with pytest.raises(jwt.InvalidSignatureError):
        TokenKeys(new_key).verify(old_token, issuer=ISSUER, audience=AUDIENCE)


def test_the_jwks_publishes_every_public_key_and_nothing_private(rsa_pem):
    old_key, new_key = load_signing_key(ec_pem()), load_signing_key(rsa_pem)
    rotated = TokenKeys(new_key, (old_key,))
    published = rotated.jwks()["keys"]
    assert sorted(jwk["kid"] for jwk in published) == sorted([new_key.kid, old_key.kid])
    assert all(not PRIVATE_MEMBERS & set(jwk) for jwk in published)
    # What a resource server reads from the JWKS verifies what each key signed.
    tokens = {new_key.kid: rotated.sign(CLAIMS, 600), old_key.kid: TokenKeys(old_key).sign(CLAIMS, 600)}
    for jwk in published:
        public = jwt.PyJWK(jwk).key
        assert jwt.decode(tokens[jwk["kid"]], public, algorithms=[jwk["alg"]], audience=AUDIENCE)["sub"] == "alice"
