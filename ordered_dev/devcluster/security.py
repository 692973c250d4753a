"""The dev cluster's security mode: what a secured cluster is made of.

``devcluster up --security sasl_ssl`` (``LocalCluster(security="sasl_ssl")``) starts the
brokers with, beside the KRaft controller listener:

* ``SASL_SSL`` (``kafka_ports``): SCRAM-SHA-256/512 users created when the storage is
  formatted (``--add-scram``), PLAIN users from the JAAS line, and OAUTHBEARER tokens
  checked by Kafka's own JWT validator against a JWKS file the cluster writes (its
  signing key is in the security directory, for tests that act as the token issuer);
* ``SSL`` (``mtls_ports``): mutual TLS, the principal is the client certificate's DN;
  the brokers also talk to each other there;
* ACLs on: ``StandardAuthorizer``; the brokers, ``admin`` and the sidecar's identities
  (``sidecar``, ``CN=sidecar``) are super users, ``stranger`` (SCRAM, OAuth subject and
  ``CN=stranger``) authenticates but has no ACL, ``limited`` has what a test grants it.

ZooKeeper keeps its plain client port (for probes, and for clients that have no
identity: they can read at most) and gets a TLS ``secureClientPort`` and SASL
DIGEST-MD5 for ``sidecar``.

Everything is generated at the first start into ``<work dir>/security`` with
``cryptography``: a CA, server certificates naming 127.0.0.1 and ``localhost``, client
certificates (one with an encrypted key, one expired), random passwords.
"""

from __future__ import annotations

import base64
import json
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from ordered_dev.devcluster.certificates import CertificateAuthority, CertificateFiles

SECURITY_MODES = ("sasl_ssl",)
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
SIDECAR_USER = "sidecar"
STRANGER_USER = "stranger"
LIMITED_USER = "limited"
"""A SCRAM user the tests grant some ACLs (``LocalCluster.grant_acls``), not all."""
ADMIN_USER = "admin"
OAUTH_AUDIENCE = "kafka"
OAUTH_KEY_ID = "devcluster-1"
_MATERIAL_FILE = "material.json"


@dataclass(frozen=True)
class SecurityMaterial:
    """Paths and credentials of a secured dev cluster (``<work dir>/security``)."""

    directory: str
    ca: str
    broker: CertificateFiles
    zookeeper: CertificateFiles
    sidecar: CertificateFiles
    """Client certificate CN=sidecar (a super user), its key encrypted."""
    stranger: CertificateFiles
    """Client certificate CN=stranger: trusted, but no ACL."""
    expired: CertificateFiles
    """Client certificate CN=sidecar that expired yesterday."""
    passwords: dict[str, str]
    """Kafka user -> password (SCRAM and PLAIN)."""
    zookeeper_password: str
    """ZooKeeper SASL DIGEST-MD5 password of ``sidecar``."""
    jwks: str
    oauth_signing_key: str
    """PEM of the RSA key whose public half is in ``jwks`` (tests sign tokens with it)."""

    @classmethod
    def create(cls, directory: Path) -> SecurityMaterial:
        directory.mkdir(parents=True, exist_ok=True)
        authority = CertificateAuthority()
        ca = authority.write_ca(directory / "ca.pem")
        certs = directory / "certs"
        sidecar_password = secrets.token_urlsafe(12)
        signing_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        key_path = directory / "oauth-signing-key.pem"
        key_path.write_bytes(
            signing_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        numbers = signing_key.public_key().public_numbers()
        jwks_path = directory / "jwks.json"
        jwks_path.write_text(
            json.dumps(
                {
                    "keys": [
                        {
                            "kty": "RSA",
                            "use": "sig",
                            "alg": "RS256",
                            "kid": OAUTH_KEY_ID,
                            "n": _b64_int(numbers.n),
                            "e": _b64_int(numbers.e),
                        }
                    ]
                }
            )
        )
        material = cls(
            directory=str(directory),
            ca=str(ca),
            # 127.0.0.1 only: "localhost" is the loopback name a certificate does not hold.
            broker=authority.issue(certs, "broker", hosts=("127.0.0.1",)),
            zookeeper=authority.issue(certs, "zookeeper"),
            sidecar=authority.issue(
                certs, SIDECAR_USER, server=False, key_password=secrets.token_urlsafe(8)
            ),
            stranger=authority.issue(certs, STRANGER_USER, server=False),
            expired=authority.issue(certs, "sidecar-expired", server=False, expired=True),
            passwords={
                user: secrets.token_urlsafe(12)
                for user in (ADMIN_USER, SIDECAR_USER, STRANGER_USER, LIMITED_USER)
            },
            zookeeper_password=sidecar_password,
            jwks=str(jwks_path),
            oauth_signing_key=str(key_path),
        )
        (directory / _MATERIAL_FILE).write_text(json.dumps(asdict(material), default=str))
        return material

    @classmethod
    def load_or_create(cls, directory: Path) -> SecurityMaterial:
        path = directory / _MATERIAL_FILE
        if not path.exists():
            return cls.create(directory)
        raw = json.loads(path.read_text())
        for name in ("broker", "zookeeper", "sidecar", "stranger", "expired"):
            files = raw[name]
            raw[name] = CertificateFiles(
                Path(files["certfile"]), Path(files["keyfile"]), files["key_password"]
            )
        return cls(**raw)

    def scram_arguments(self) -> list[str]:
        """``kafka-storage format`` arguments that create every SCRAM user."""
        arguments = []
        for mechanism in SCRAM_MECHANISMS:
            for user, password in self.passwords.items():
                arguments += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
        return arguments

    def kafka_jaas_plain(self) -> str:
        users = " ".join(f'user_{user}="{password}"' for user, password in self.passwords.items())
        return f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"

    def zookeeper_jaas(self) -> str:
        return (
            "Server {\n"
            "  org.apache.zookeeper.server.auth.DigestLoginModule required\n"
            f'  user_{SIDECAR_USER}="{self.zookeeper_password}";\n'
            "};\n"
        )


def kafka_security_properties(
    material: SecurityMaterial,
    node_id: int,
    sasl_port: int,
    mtls_port: int,
    controller_port: int,
    plaintext_port: int | None = None,
) -> dict[str, object]:
    """The server.properties lines of a secured node (listeners, TLS, SASL, ACLs), with
    a PLAINTEXT listener too if ``plaintext_port`` is given (its clients are
    ``User:ANONYMOUS``, a super user here: only for comparing the cost of security)."""
    jwks_url = Path(material.jwks).as_uri()
    supers = [
        "User:CN=broker",
        f"User:CN={SIDECAR_USER}",
        f"User:{ADMIN_USER}",
        f"User:{SIDECAR_USER}",
        # The controller listener stays PLAINTEXT on loopback; its peers are anonymous.
        "User:ANONYMOUS",
    ]
    scram_login = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    advertised = f"SASL_SSL://127.0.0.1:{sasl_port},SSL://127.0.0.1:{mtls_port}"
    protocols = "SASL_SSL:SASL_SSL,SSL:SSL,CONTROLLER:PLAINTEXT"
    if plaintext_port is not None:
        advertised += f",PLAINTEXT://127.0.0.1:{plaintext_port}"
        protocols += ",PLAINTEXT:PLAINTEXT"
    return {
        "listeners": f"{advertised},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": advertised,
        "inter.broker.listener.name": "SSL",
        "listener.security.protocol.map": protocols,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": material.broker.combined,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": material.ca,
        "listener.name.ssl.ssl.client.auth": "required",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN,OAUTHBEARER",
        "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": scram_login,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram_login,
        "listener.name.sasl_ssl.plain.sasl.jaas.config": material.kafka_jaas_plain(),
        "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config": (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
        ),
        "listener.name.sasl_ssl.oauthbearer.sasl.server.callback.handler.class": (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
        ),
        "sasl.oauthbearer.jwks.endpoint.url": jwks_url,
        "sasl.oauthbearer.expected.audience": OAUTH_AUDIENCE,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": ";".join(supers),
        "allow.everyone.if.no.acl.found": "false",
    }


def kafka_jvm_flags(material: SecurityMaterial) -> list[str]:
    # Kafka reads a JWKS only from URLs this property allows.
    return [f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={Path(material.jwks).as_uri()}"]


def zookeeper_security_config(material: SecurityMaterial, secure_port: int) -> list[str]:
    return [
        f"secureClientPort={secure_port}",
        "secureClientPortAddress=127.0.0.1",
        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
        f"ssl.keyStore.location={material.zookeeper.combined}",
        "ssl.keyStore.type=PEM",
        f"ssl.trustStore.location={material.ca}",
        "ssl.trustStore.type=PEM",
        "ssl.clientAuth=none",
        "authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider",
        # Clients without an identity may connect (and read what the ACLs let them).
        "sessionRequireClientSASLAuth=false",
    ]


def zookeeper_jvm_flags(jaas: Path) -> list[str]:
    return [f"-Djava.security.auth.login.config={jaas}"]


def _b64_int(value: int) -> str:
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
