"""The keys that sign the gateway's access tokens, and the checks its tokens pass.

One current key signs (EC P-256 -> ES256, RSA -> RS256); earlier keys still verify what
they signed, so a rotation logs nobody out: the operator moves the old PEM to
``previousSigningKeyEnvs`` and puts the new one in ``signingKeyEnv``. A key's ``kid`` is
its RFC 7638 thumbprint, so every worker names the same key the same way. The JWKS
publishes the public halves of all of them.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from joserfc.jwk import import_key
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

ACCESS_TOKEN_TYPE = "at+jwt"  # RFC 9068
# Only the gateway's own workers sign and check these: their clocks differ by little, and a short
# accessTokenTtl must end when it says.
CLOCK_SKEW = 5.0


class KeyProblem(ValueError):
    """A configured key that cannot sign: the message names what is wrong, never the key."""


@dataclass(frozen=True)
class SigningKey:
    kid: str
    algorithm: str
    private_key: Any
    public_jwk: dict[str, Any]


def load_signing_key(pem: str) -> SigningKey:
    try:
        private_key = serialization.load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError):
        raise KeyProblem("is not an unencrypted PEM private key") from None
    except UnsupportedAlgorithm:  # e.g. an SM2 key: a PEM private key, of a kind this build cannot load
        raise KeyProblem("must be an EC P-256 or an RSA key") from None
    if isinstance(private_key, ec.EllipticCurvePrivateKey):
        if not isinstance(private_key.curve, ec.SECP256R1):
            raise KeyProblem("must be an EC P-256 or an RSA key (this EC key is on another curve)")
        algorithm, public = "ES256", ECAlgorithm.to_jwk(private_key.public_key(), as_dict=True)
    elif isinstance(private_key, rsa.RSAPrivateKey):
        if private_key.key_size < 2048:
            raise KeyProblem("must be an RSA key of at least 2048 bits")
        algorithm, public = "RS256", RSAAlgorithm.to_jwk(private_key.public_key(), as_dict=True)
    else:
        raise KeyProblem("must be an EC P-256 or an RSA key")
    kid = import_key(public).thumbprint()  # RFC 7638
    return SigningKey(kid, algorithm, private_key, {**public, "kid": kid, "alg": algorithm, "use": "sig"})


class TokenKeys:
    """Signs with the current key; verifies with any configured one."""

    def __init__(self, current: SigningKey, previous: tuple[SigningKey, ...] = ()):
        self.current = current
        self._by_kid = {key.kid: key for key in (current, *previous)}

    def jwks(self) -> dict[str, Any]:
        return {"keys": [key.public_jwk for key in self._by_kid.values()]}

    def sign(self, claims: dict[str, Any], ttl: float) -> str:
        now = int(time.time())
        body = {**claims, "iat": now, "exp": now + int(ttl), "jti": uuid.uuid4().hex}
        return jwt.encode(body, self.current.private_key, algorithm=self.current.algorithm,
                          headers={"kid": self.current.kid, "typ": ACCESS_TOKEN_TYPE})

    def verify(self, token: str, *, issuer: str, audience: str) -> dict[str, Any]:
        """The claims of a token these keys signed for ``audience``; jwt.PyJWTError otherwise."""
        header = jwt.get_unverified_header(token)
        if str(header.get("typ", "")).lower() not in (ACCESS_TOKEN_TYPE, f"application/{ACCESS_TOKEN_TYPE}"):
            raise jwt.InvalidTokenError("not an access token (RFC 9068 typ)")  # an ID token, say
        key = self._by_kid.get(header.get("kid"))
        if key is None:
            raise jwt.InvalidSignatureError("token signed with an unknown key")
        if header.get("alg") != key.algorithm:
            raise jwt.InvalidAlgorithmError("token algorithm does not match its key")
        return jwt.decode(token, key.private_key.public_key(), algorithms=[key.algorithm], audience=audience,
                          issuer=issuer, leeway=CLOCK_SKEW, options={"require": ["exp", "iat", "iss", "aud", "sub"]})
