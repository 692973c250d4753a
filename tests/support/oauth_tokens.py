"""JWTs the secured dev cluster's brokers validate: the tests act as the token issuer,
signing RS256 tokens with the cluster's signing key (its public half is in the JWKS
file the brokers read)."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from ordered_dev.devcluster.cluster import LocalCluster
from ordered_dev.devcluster.security import OAUTH_AUDIENCE, OAUTH_KEY_ID, SIDECAR_USER


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed_token(
    cluster: LocalCluster, *, subject: str = SIDECAR_USER, audience: str = OAUTH_AUDIENCE
) -> str:
    """An RS256 JWT for ``subject``, for ``audience``: the brokers accept it with theirs
    (``OAUTH_AUDIENCE``) and refuse any other."""
    key = serialization.load_pem_private_key(
        Path(cluster.material.oauth_signing_key).read_bytes(), None
    )
    assert isinstance(key, rsa.RSAPrivateKey)
    now = int(time.time())
    header = {"alg": "RS256", "typ": "JWT", "kid": OAUTH_KEY_ID}
    claims = {"sub": subject, "aud": audience, "iat": now, "exp": now + 600, "scope": "kafka"}
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{_b64(signature)}"
