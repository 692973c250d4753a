"""``kafka.security`` and ``kafka.client`` as aiokafka client arguments.

Every Kafka client the sidecar makes (producers, the admin client, the group
consumers) is built from ``client_settings`` in ``sidecar.adapters.kafka``, which takes
its connection arguments from here, so that no client connects with half of them.

* TLS: one ``ssl.SSLContext`` per settings object, with the system's CAs unless
  ``ssl_cafile`` names others, host names checked unless ``ssl_check_hostname`` is
  false, and the client certificate for mutual TLS. A key that does not decrypt, a
  certificate that expired or does not match its key is a ConfigError naming the
  setting, found before any connection.
* SASL PLAIN and SCRAM: aiokafka's ``sasl_plain_*`` arguments, the password read from
  its file (if one is named) each time a client is built.
* OAUTHBEARER: an aiokafka token provider. ``ClientCredentialsTokens`` asks the OIDC
  token endpoint (client-credentials grant) and keeps the token until 80 % of its
  lifetime has passed; ``FileTokens`` reads the file a platform agent rotates at every
  new connection. A token the brokers refuse fails the connection
  (``TokenRefusalAwareAuthenticator``) instead of passing for accepted.
* ``diagnose``: when a client cannot start, one connection to a bootstrap broker tells
  a refused credential or certificate (KafkaAuthenticationFailed, naming the setting)
  from a broker that is merely away.

Secrets never appear in a message: errors name settings and files, not values.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import inspect
import json
import ssl
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.abc import AbstractTokenProvider
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.conn import AIOKafkaConnection, OAuthAuthenticator, create_conn
from aiokafka.errors import KafkaError, SaslAuthenticationFailed, UnsupportedSaslMechanismError
from cryptography import x509

from sidecar.config import ConfigError, KafkaSecuritySettings, KafkaSettings
from sidecar.core.errors import KafkaAuthenticationFailed

_PREFIX = "kafka.security."

# OpenSSL verify codes (X509_V_ERR_*) with a cause of their own.
_CERT_EXPIRED = 10
_CERT_NOT_YET_VALID = 9
_HOSTNAME_MISMATCH = 62
_IP_MISMATCH = 64


def security_arguments(security: KafkaSecuritySettings) -> dict[str, Any]:
    """aiokafka's connection arguments for ``security``. Raises ConfigError (a file
    that cannot be used, a key that does not decrypt, an expired client certificate)."""
    arguments: dict[str, Any] = {"security_protocol": security.protocol}
    if security.tls:
        arguments["ssl_context"] = ssl_context(security)
    if security.sasl:
        arguments["sasl_mechanism"] = security.sasl_mechanism
        if security.sasl_mechanism == "OAUTHBEARER":
            install_token_refusal_check()
            arguments["sasl_oauth_token_provider"] = token_provider(security)
        else:
            arguments["sasl_plain_username"] = security.sasl_username
            arguments["sasl_plain_password"] = security.password()
    return arguments


_contexts: dict[KafkaSecuritySettings, ssl.SSLContext] = {}


def ssl_context(security: KafkaSecuritySettings) -> ssl.SSLContext:
    """The TLS context of ``security`` (one per settings object). Raises ConfigError."""
    context = _contexts.get(security)
    if context is None:
        context = _new_ssl_context(security)
        _contexts[security] = context
    return context


def _new_ssl_context(security: KafkaSecuritySettings) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if security.ssl_cafile:
        try:
            context.load_verify_locations(cafile=security.ssl_cafile)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"{_PREFIX}ssl_cafile: {security.ssl_cafile} holds no usable PEM "
                f"certificate ({_reason(exc)})"
            ) from exc
    context.check_hostname = security.ssl_check_hostname
    if security.ssl_certfile:
        check_certificate_dates(f"{_PREFIX}ssl_certfile", security.ssl_certfile)
        try:
            context.load_cert_chain(
                security.ssl_certfile, security.ssl_keyfile, security.key_password()
            )
        except ssl.SSLError as exc:
            raise ConfigError(
                f"{_PREFIX}ssl_keyfile: cannot use {security.ssl_keyfile} with "
                f"{security.ssl_certfile}: wrong or missing {_PREFIX}ssl_key_password, or a "
                f"key that is not the certificate's ({_reason(exc)})"
            ) from exc
        except OSError as exc:
            raise ConfigError(f"{_PREFIX}ssl_certfile: {_reason(exc)}") from exc
    return context


def check_certificate_dates(name: str, path: str, now: datetime.datetime | None = None) -> None:
    """Raise ConfigError naming ``name`` if the first certificate of PEM file ``path``
    has expired or is not valid yet (a peer would refuse it, saying less)."""
    now = now or datetime.datetime.now(datetime.UTC)
    try:
        certificate = x509.load_pem_x509_certificate(Path(path).read_bytes())
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise ConfigError(f"{name}: {path} holds no PEM certificate") from exc
    if certificate.not_valid_after_utc < now:
        raise ConfigError(
            f"{name}: the certificate in {path} expired on "
            f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
        )
    if certificate.not_valid_before_utc > now:
        raise ConfigError(
            f"{name}: the certificate in {path} is not valid before "
            f"{certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
        )


# OAUTHBEARER ----------------------------------------------------------------------------


class ClientCredentialsTokens(AbstractTokenProvider):  # type: ignore[misc]
    """Access tokens from an OIDC token endpoint (RFC 6749 §4.4, client credentials),
    each kept until ``oauth_refresh_fraction`` of its lifetime has passed; concurrent
    connections share one request."""

    def __init__(self, security: KafkaSecuritySettings, timeout_s: float = 10.0) -> None:
        self._security = security
        self._timeout_s = timeout_s
        self._token = ""
        self._refresh_at = 0.0
        self._lock: asyncio.Lock | None = None
        self.fetched = 0
        """Tokens fetched so far (tests and diagnostics)."""

    async def token(self) -> str:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self._token or time.monotonic() >= self._refresh_at:
                await self._fetch()
            return self._token

    async def _fetch(self) -> None:
        security = self._security
        form = {"grant_type": "client_credentials"}
        if security.oauth_scope:
            form["scope"] = security.oauth_scope
        # RFC 6749 §2.3.1: the id and secret are form-encoded, then sent as Basic auth.
        credentials = f"{quote(security.oauth_client_id)}:{quote(security.client_secret())}"
        headers = {"Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()}
        setting = f"{_PREFIX}oauth_token_endpoint"
        endpoint = security.oauth_token_endpoint
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(self._timeout_s)) as session,
                session.post(endpoint, data=form, headers=headers) as response,
            ):
                if response.status != 200:
                    raise KafkaAuthenticationFailed(
                        f"{setting}: {security.oauth_token_endpoint} refused the client "
                        f"credentials of {security.oauth_client_id!r} "
                        f"(HTTP {response.status}); check {_PREFIX}oauth_client_id and "
                        f"{_PREFIX}oauth_client_secret"
                    )
                body = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise KafkaAuthenticationFailed(
                f"{setting}: no token from {security.oauth_token_endpoint}: {type(exc).__name__}"
            ) from exc
        token = body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise KafkaAuthenticationFailed(
                f"{setting}: the answer of {security.oauth_token_endpoint} has no access_token"
            )
        lifetime = body.get("expires_in")
        if not isinstance(lifetime, int | float) or lifetime <= 0:
            lifetime = security.oauth_default_lifetime_s
        self._token = token
        self._refresh_at = time.monotonic() + lifetime * security.oauth_refresh_fraction
        self.fetched += 1


class FileTokens(AbstractTokenProvider):  # type: ignore[misc]
    """The token in a file another process keeps fresh, read at every new connection."""

    def __init__(self, path: str) -> None:
        self._path = Path(path)

    async def token(self) -> str:
        setting = f"{_PREFIX}oauth_token_file"
        try:
            token = (await asyncio.to_thread(self._path.read_text)).strip()
        except OSError as exc:
            raise KafkaAuthenticationFailed(
                f"{setting}: cannot read {self._path}: {exc.strerror}"
            ) from exc
        if not token:
            raise KafkaAuthenticationFailed(f"{setting}: {self._path} is empty")
        return token


_providers: dict[KafkaSecuritySettings, AbstractTokenProvider] = {}


def token_provider(security: KafkaSecuritySettings) -> AbstractTokenProvider:
    """The one token provider of ``security``, shared by every client built from it."""
    provider = _providers.get(security)
    if provider is None:
        if security.oauth_token_file:
            provider = FileTokens(security.oauth_token_file)
        else:
            provider = ClientCredentialsTokens(security)
        _providers[security] = provider
    return provider


class TokenRefusalAwareAuthenticator(OAuthAuthenticator):  # type: ignore[misc]
    """aiokafka's OAUTHBEARER exchange, ended as RFC 7628 §3.2.2 asks when the server
    refuses the token.

    A broker that refuses a token (Kafka's JWT validator: another audience, issuer or
    key, an expired token) does not answer SaslAuthenticate with an error: it answers
    success with an error challenge, ``{"status":"invalid_token"}``, and waits for the
    client's ``%x01`` before it fails the exchange. aiokafka 0.14 ends the exchange once
    its token is sent, whatever the answer, and takes the connection for authenticated;
    the broker then answers the next request with an empty error response (Metadata
    without brokers) and closes, so every client waited for metadata forever. Sending
    the ``%x01`` makes the broker fail the exchange, which aiokafka raises as
    ``SaslAuthenticationFailed``."""

    def __init__(self, *, sasl_oauth_token_provider: AbstractTokenProvider) -> None:
        super().__init__(sasl_oauth_token_provider=sasl_oauth_token_provider)
        self._refusal_acknowledged = False

    async def step(self, payload: bytes | None) -> tuple[bytes, bool] | None:
        if self._token_sent and payload and not self._refusal_acknowledged:
            self._refusal_acknowledged = True
            return OAUTHBEARER_REFUSAL_ACKNOWLEDGEMENT, True
        return await super().step(payload)  # type: ignore[no-any-return]


OAUTHBEARER_REFUSAL_ACKNOWLEDGEMENT = b"\x01"
"""RFC 7628 §3.2.3: the client's answer to an error challenge."""


def _token_refusal_aware(connection: AIOKafkaConnection) -> TokenRefusalAwareAuthenticator:
    return TokenRefusalAwareAuthenticator(
        sasl_oauth_token_provider=connection._sasl_oauth_token_provider
    )


def install_token_refusal_check() -> None:
    """Make every aiokafka connection of the process use
    ``TokenRefusalAwareAuthenticator`` for OAUTHBEARER. aiokafka builds the
    authenticator inside the connection and takes no factory, so the connection's
    method is replaced; ``tests/unit/adapters/test_kafka_security.py`` checks that
    aiokafka still calls it."""
    AIOKafkaConnection.authenticator_oauth = _token_refusal_aware


def token_claims(token: str) -> str:
    """What Kafka's validator checks of a JWT, for a message: its audience, subject and
    expiry (read, not verified; never the token or its signature). Empty for a token
    that is not a JWT."""
    try:
        encoded = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
    except (IndexError, ValueError):
        return ""
    if not isinstance(claims, dict):
        return ""
    parts = [f"{name} {claims[name]!r}" for name in ("aud", "sub", "iss") if name in claims]
    expiry = claims.get("exp")
    if isinstance(expiry, int | float):
        moment = datetime.datetime.fromtimestamp(expiry, datetime.UTC)
        parts.append(f"exp {moment:%Y-%m-%d %H:%M:%S} UTC")
    return ", ".join(parts)


# Pass-through settings --------------------------------------------------------------------


def _defaults() -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    for cls in (AIOKafkaAdminClient, AIOKafkaConsumer, AIOKafkaProducer):
        for name, parameter in inspect.signature(cls.__init__).parameters.items():
            if parameter.default is not inspect.Parameter.empty:
                defaults.setdefault(name, parameter.default)
    return defaults


_CLIENT_DEFAULTS = _defaults()


def coerced_client_options(client: Mapping[str, Any]) -> dict[str, Any]:
    """``kafka.client`` with each value of the type aiokafka's default for it has (an
    environment variable is a string). Raises ConfigError for a value that is not one."""
    options: dict[str, Any] = {}
    for name, value in client.items():
        default = _CLIENT_DEFAULTS.get(name)
        options[name] = _coerce(f"kafka.client.{name}", value, default)
    return options


def _coerce(name: str, value: Any, default: Any) -> Any:
    if not isinstance(value, str) or default is None or isinstance(default, str):
        return value
    text = value.strip()
    try:
        if isinstance(default, bool):
            lowered = text.lower()
            if lowered not in {"true", "false", "1", "0", "yes", "no"}:
                raise ValueError(text)
            return lowered in {"true", "1", "yes"}
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError as exc:
        raise ConfigError(f"{name} must be a {type(default).__name__}, got {value!r}") from exc
    return value


# Diagnosis ---------------------------------------------------------------------------------


async def diagnose(settings: KafkaSettings) -> KafkaAuthenticationFailed | None:
    """Connect once to each bootstrap broker until one answers: what it refused of this
    sidecar's security settings (or what of the broker's this sidecar refused), or None
    if it accepted them or none could be reached (not a matter of credentials)."""
    arguments = security_arguments(settings.security)
    for host, port in _bootstrap_addresses(settings.bootstrap_servers):
        try:
            connection = await create_conn(
                host,
                port,
                client_id=settings.client_id,
                request_timeout_ms=settings.request_timeout_ms,
                **arguments,
            )
        except KafkaAuthenticationFailed as exc:
            return exc
        except (SaslAuthenticationFailed, UnsupportedSaslMechanismError) as exc:
            claims = await _presented_claims(settings.security)
            return KafkaAuthenticationFailed(_sasl_message(settings.security, exc, claims))
        except ssl.SSLCertVerificationError as exc:
            return KafkaAuthenticationFailed(_verification_message(settings.security, host, exc))
        except ssl.SSLError as exc:
            return KafkaAuthenticationFailed(_handshake_message(settings.security, host, exc))
        except (KafkaError, OSError, TimeoutError) as exc:
            refused = _tls_refusal(settings.security, host, exc)
            if refused is not None:
                return refused
            continue
        connection.close()
        return None
    return None


def _bootstrap_addresses(bootstrap: str) -> list[tuple[str, int]]:
    addresses = []
    for entry in bootstrap.split(","):
        host, _, port = entry.strip().rpartition(":")
        with contextlib.suppress(ValueError):
            addresses.append((host.strip("[]"), int(port)))
    return addresses


async def _presented_claims(security: KafkaSecuritySettings) -> str:
    """The claims of the OAUTHBEARER token the sidecar presents (empty otherwise)."""
    if security.sasl_mechanism != "OAUTHBEARER":
        return ""
    try:
        return token_claims(await token_provider(security).token())
    except KafkaAuthenticationFailed:
        return ""


def _sasl_message(security: KafkaSecuritySettings, exc: Exception, claims: str = "") -> str:
    if security.sasl_mechanism == "OAUTHBEARER":
        source = (
            f"{_PREFIX}oauth_token_file"
            if security.oauth_token_file
            else f"{_PREFIX}oauth_token_endpoint"
        )
        # Kafka says only "invalid_token"; its validator logs which check failed. The
        # token's own claims usually show it (another audience, an expired token).
        presented = f" (the token has {claims})" if claims else ""
        return (
            f"{source}: Kafka refused the OAUTHBEARER token{presented}: {_kafka_reason(exc)}; "
            f"the brokers check its signature, issuer, audience and expiry"
        )
    return (
        f"{_PREFIX}sasl_username / {_PREFIX}sasl_password: Kafka refused the "
        f"{security.sasl_mechanism} credentials of {security.sasl_username!r}: "
        f"{_kafka_reason(exc)}"
    )


def _verification_message(
    security: KafkaSecuritySettings, host: str, exc: ssl.SSLCertVerificationError
) -> str:
    if exc.verify_code in (_HOSTNAME_MISMATCH, _IP_MISMATCH):
        return (
            f"{_PREFIX}ssl_check_hostname: the broker's certificate does not name {host} "
            f"(connect by a name the certificate holds, see kafka.bootstrap_servers)"
        )
    if exc.verify_code in (_CERT_EXPIRED, _CERT_NOT_YET_VALID):
        return f"{_PREFIX}ssl_cafile: the certificate of broker {host} {exc.verify_message}"
    trusted = security.ssl_cafile or "the system's CA bundle"
    return (
        f"{_PREFIX}ssl_cafile: the certificate of broker {host} is not trusted by {trusted} "
        f"({exc.verify_message})"
    )


def _handshake_message(security: KafkaSecuritySettings, host: str, exc: ssl.SSLError) -> str:
    reason = _reason(exc)
    if "ALERT" in reason.upper() or security.ssl_certfile:
        setting = "ssl_certfile" if security.ssl_certfile else "ssl_certfile (none given)"
        return f"{_PREFIX}{setting}: broker {host} refused the client certificate ({reason})"
    return f"{_PREFIX}protocol: the TLS handshake with broker {host} failed ({reason})"


def _tls_refusal(
    security: KafkaSecuritySettings, host: str, exc: BaseException
) -> KafkaAuthenticationFailed | None:
    # With TLS 1.3 the client's handshake ends before the broker checks the client
    # certificate: a refused one shows as an SSL error or a closed connection at the
    # first request.
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return KafkaAuthenticationFailed(_handshake_message(security, host, cause))
        cause = cause.__cause__ or cause.__context__
    if security.protocol == "SSL" and not isinstance(exc, ConnectionRefusedError | TimeoutError):
        if security.ssl_certfile:
            return KafkaAuthenticationFailed(
                f"{_PREFIX}ssl_certfile: broker {host} closed the connection after the TLS "
                f"handshake: it refused the client certificate"
            )
        return KafkaAuthenticationFailed(
            f"{_PREFIX}ssl_certfile: broker {host} closed the connection after the TLS "
            f"handshake: it may require a client certificate (mutual TLS)"
        )
    return None


def _kafka_reason(exc: Exception) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
