"""Secrets and the security sections: ``Secret`` (a password, client secret or token
that ``repr`` and ``str`` never show), ``kafka.security`` and ``zookeeper.security``, and
reading a secret from its ``*_file`` setting."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sidecar.config.errors import ConfigError


class Secret:
    """A password, client secret or token: never shown by ``repr`` or ``str``."""

    __slots__ = ("_value",)

    def __init__(self, value: str = "") -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret('')"

    __str__ = __repr__


KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
KAFKA_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
ZOOKEEPER_SASL_MECHANISMS = ("", "DIGEST-MD5")


@dataclass(frozen=True, slots=True)
class KafkaSecuritySettings:
    """How every Kafka client of the sidecar authenticates and encrypts (``kafka.security``)."""

    protocol: str = "PLAINTEXT"
    """PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."""
    ssl_cafile: str = ""
    """PEM file of the CAs the brokers' certificates chain to; empty: the system's CAs."""
    ssl_certfile: str = ""
    """The client certificate (PEM, chain allowed) for mutual TLS."""
    ssl_keyfile: str = ""
    """The client certificate's private key (PEM), possibly encrypted."""
    ssl_key_password: Secret = field(default_factory=Secret)
    ssl_key_password_file: str = ""
    ssl_check_hostname: bool = True
    """The broker's certificate must name the host the client connects to."""
    sasl_mechanism: str = ""
    """PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (with a SASL_ protocol)."""
    sasl_username: str = ""
    sasl_password: Secret = field(default_factory=Secret)
    sasl_password_file: str = ""
    oauth_token_endpoint: str = ""
    """OAUTHBEARER: the OIDC token endpoint of the client-credentials flow."""
    oauth_client_id: str = ""
    oauth_client_secret: Secret = field(default_factory=Secret)
    oauth_client_secret_file: str = ""
    oauth_scope: str = ""
    oauth_refresh_fraction: float = 0.8
    """OAUTHBEARER with the token endpoint: a token is fetched again once this fraction
    of its lifetime (``expires_in``) has passed, so that connections made near its end
    do not present an expired one."""
    oauth_default_lifetime_s: float = 300.0
    """OAUTHBEARER with the token endpoint: the lifetime assumed for a token whose
    answer gives no ``expires_in``."""
    oauth_token_file: str = ""
    """OAUTHBEARER: a file holding the token, kept fresh by a platform agent (instead of
    the token endpoint); read again at every new connection."""

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def key_password(self) -> str | None:
        """The private key's password (read from its file if one is named), or None."""
        return _secret(self.ssl_key_password, self.ssl_key_password_file) or None

    def password(self) -> str:
        """The SASL PLAIN/SCRAM password (read from its file if one is named)."""
        return _secret(self.sasl_password, self.sasl_password_file)

    def client_secret(self) -> str:
        """The OIDC client secret (read from its file if one is named)."""
        return _secret(self.oauth_client_secret, self.oauth_client_secret_file)


@dataclass(frozen=True, slots=True)
class ZooKeeperSecuritySettings:
    """How the sidecar connects to ZooKeeper and protects its znodes (``zookeeper.security``)."""

    tls: bool = False
    """Connect to ZooKeeper's secure client port (``secureClientPort``) over TLS."""
    ssl_cafile: str = ""
    """PEM file of the CAs ZooKeeper's certificate chains to; empty: the system's CAs."""
    ssl_certfile: str = ""
    """A client certificate (PEM), where ZooKeeper asks for one."""
    ssl_keyfile: str = ""
    ssl_check_hostname: bool = True
    """ZooKeeper's certificate must name the host connected to."""
    sasl_mechanism: str = ""
    """``DIGEST-MD5``: authenticate by SASL as ``digest_username``; empty with a
    ``digest_username``: ZooKeeper's digest scheme (``addauth digest``)."""
    digest_username: str = ""
    digest_password: Secret = field(default_factory=Secret)
    digest_password_file: str = ""
    world_readable: bool = True
    """With an identity set, every znode the sidecars create gets ALL for that identity
    and, if true, READ for anyone (dashboards, ``zkCli``); false: no access for others."""

    @property
    def authenticated(self) -> bool:
        return bool(self.digest_username)

    def password(self) -> str:
        """The SASL or digest password (read from its file if one is named)."""
        return _secret(self.digest_password, self.digest_password_file)


def _secret(value: Secret, path: str) -> str:
    if not path:
        return value.reveal()
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
