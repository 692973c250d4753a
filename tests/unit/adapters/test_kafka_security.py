"""``kafka.security`` and ``kafka.client`` as aiokafka arguments, without a broker."""

from __future__ import annotations

import base64
import dataclasses
import inspect
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiokafka import AIOKafkaConsumer
from aiokafka.abc import AbstractTokenProvider
from aiokafka.conn import AIOKafkaConnection
from aiokafka.errors import SaslAuthenticationFailed
from aiokafka.protocol.admin import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse_v0,
    SaslHandShakeRequest,
    SaslHandShakeResponse_v1,
)

from ordered_dev.devcluster.certificates import CertificateAuthority
from sidecar.adapters.kafka import client_settings, consumer_settings
from sidecar.adapters.kafka.clients import PRODUCER_BATCH_BYTES
from sidecar.adapters.kafka_security import (
    ClientCredentialsTokens,
    FileTokens,
    _sasl_message,
    _verification_message,
    install_token_refusal_check,
    token_claims,
    token_provider,
)
from sidecar.config import ConfigError, KafkaSecuritySettings, KafkaSettings, Secret
from sidecar.core.errors import KafkaAuthenticationFailed


@pytest.fixture(scope="module")
def authority() -> CertificateAuthority:
    return CertificateAuthority()


def _settings(security: KafkaSecuritySettings, **client: str) -> KafkaSettings:
    return KafkaSettings(security=security, client=client)


def test_plaintext_adds_nothing_but_the_protocol() -> None:
    common, producer = client_settings(KafkaSettings())
    assert common["security_protocol"] == "PLAINTEXT"
    assert "ssl_context" not in common
    assert producer == {"max_batch_size": PRODUCER_BATCH_BYTES}


def test_environment_strings_reach_aiokafka_as_its_types() -> None:
    common, producer = client_settings(
        _settings(
            KafkaSecuritySettings(),
            linger_ms="5",
            max_batch_size="32768",
            metadata_max_age_ms="4000",
        )
    )
    assert producer == {"linger_ms": 5, "max_batch_size": 32768}
    assert common["metadata_max_age_ms"] == 4000


def test_a_pass_through_value_of_the_wrong_type_names_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.client\.linger_ms must be a int"):
        client_settings(_settings(KafkaSecuritySettings(), linger_ms="soon"))


def test_ssl_without_a_cafile_trusts_the_system_bundle_and_checks_host_names() -> None:
    common, _ = client_settings(_settings(KafkaSecuritySettings(protocol="SASL_SSL")))
    context = common["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.cert_store_stats()["x509_ca"] > 0 or context.get_ca_certs() is not None


async def test_every_group_consumer_gets_the_security_settings(
    authority: CertificateAuthority, tmp_path: Path
) -> None:
    cafile = authority.write_ca(tmp_path / "ca.pem")
    client = authority.issue(tmp_path, "client", server=False, key_password="k3y")
    security = KafkaSecuritySettings(
        protocol="SSL",
        ssl_cafile=str(cafile),
        ssl_certfile=str(client.certfile),
        ssl_keyfile=str(client.keyfile),
        ssl_key_password=Secret("k3y"),
    )
    arguments = consumer_settings(_settings(security), "instance-1", group_id="g")
    assert arguments["security_protocol"] == "SSL"
    assert isinstance(arguments["ssl_context"], ssl.SSLContext)
    assert arguments["client_id"] == "ordered-sidecar-instance-1"
    # What crashed every consumer once: aiokafka takes every argument given.
    await AIOKafkaConsumer(**arguments).stop()


def test_sasl_password_is_read_from_its_file(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("from-file\n")
    security = KafkaSecuritySettings(
        protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="app",
        sasl_password_file=str(secret),
    )
    common, _ = client_settings(_settings(security))
    assert common["sasl_mechanism"] == "SCRAM-SHA-512"
    assert common["sasl_plain_username"] == "app"
    assert common["sasl_plain_password"] == "from-file"
    assert "from-file" not in repr(security)


def test_a_wrong_key_password_names_the_setting(
    authority: CertificateAuthority, tmp_path: Path
) -> None:
    client = authority.issue(tmp_path, "client", server=False, key_password="right")
    security = KafkaSecuritySettings(
        protocol="SSL",
        ssl_certfile=str(client.certfile),
        ssl_keyfile=str(client.keyfile),
        ssl_key_password=Secret("not-the-password"),
    )
    with pytest.raises(ConfigError, match=r"kafka\.security\.ssl_key") as caught:
        client_settings(_settings(security))
    assert "not-the-password" not in str(caught.value)


def test_an_expired_client_certificate_names_the_setting(
    authority: CertificateAuthority, tmp_path: Path
) -> None:
    client = authority.issue(tmp_path, "old", server=False, expired=True)
    security = KafkaSecuritySettings(
        protocol="SSL", ssl_certfile=str(client.certfile), ssl_keyfile=str(client.keyfile)
    )
    with pytest.raises(ConfigError, match=r"kafka\.security\.ssl_certfile: .* expired on"):
        client_settings(_settings(security))


def test_a_cafile_without_certificates_names_the_setting(tmp_path: Path) -> None:
    cafile = tmp_path / "ca.pem"
    cafile.write_text("not a certificate\n")
    security = KafkaSecuritySettings(protocol="SSL", ssl_cafile=str(cafile))
    with pytest.raises(ConfigError, match=r"kafka\.security\.ssl_cafile"):
        client_settings(_settings(security))


@pytest.mark.parametrize(
    ("code", "message", "setting"),
    [
        (62, "Hostname mismatch", "ssl_check_hostname"),
        (10, "certificate has expired", "ssl_cafile"),
        (20, "unable to get local issuer certificate", "ssl_cafile"),
    ],
)
def test_a_refused_broker_certificate_names_the_setting(
    code: int, message: str, setting: str
) -> None:
    error = ssl.SSLCertVerificationError(1, message)
    error.verify_code = code
    error.verify_message = message
    text = _verification_message(KafkaSecuritySettings(protocol="SSL"), "broker-1", error)
    assert text.startswith(f"kafka.security.{setting}:")


class _TokenEndpoint:
    """A local OIDC token endpoint: client credentials ``app`` / ``s3cret``."""

    def __init__(self, lifetime_s: float) -> None:
        self.lifetime_s = lifetime_s
        self.issued = 0
        self.forms: list[dict[str, str]] = []

    async def token(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        import base64

        if auth != "Basic " + base64.b64encode(b"app:s3cret").decode():
            return web.json_response({"error": "invalid_client"}, status=401)
        self.forms.append(dict(await request.post()))  # type: ignore[arg-type]
        self.issued += 1
        return web.json_response(
            {
                "access_token": f"token-{self.issued}",
                "token_type": "Bearer",
                "expires_in": self.lifetime_s,
            }
        )


@pytest.fixture
async def token_server() -> AsyncIterator[tuple[_TokenEndpoint, str]]:
    endpoint = _TokenEndpoint(lifetime_s=3600)
    app = web.Application()
    app.router.add_post("/token", endpoint.token)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield endpoint, f"http://127.0.0.1:{port}/token"
    finally:
        await runner.cleanup()


def _oauth(url: str, secret: str = "s3cret") -> KafkaSecuritySettings:
    return KafkaSecuritySettings(
        protocol="SASL_SSL",
        sasl_mechanism="OAUTHBEARER",
        oauth_token_endpoint=url,
        oauth_client_id="app",
        oauth_client_secret=Secret(secret),
        oauth_scope="kafka",
    )


async def test_client_credentials_token_is_reused_until_it_nears_expiry(
    token_server: tuple[_TokenEndpoint, str],
) -> None:
    endpoint, url = token_server
    provider = ClientCredentialsTokens(_oauth(url))
    assert await provider.token() == "token-1"
    assert await provider.token() == "token-1"
    assert endpoint.forms == [{"grant_type": "client_credentials", "scope": "kafka"}]
    # A token whose lifetime is already spent is fetched again at the next connection.
    endpoint.lifetime_s = 1e-9
    provider = ClientCredentialsTokens(_oauth(url))
    assert await provider.token() == "token-2"
    assert await provider.token() == "token-3"


async def test_the_refresh_fraction_and_the_assumed_lifetime_are_settings(
    token_server: tuple[_TokenEndpoint, str],
) -> None:
    endpoint, url = token_server
    endpoint.lifetime_s = 3600
    # Refreshed once no time at all has passed: every connection fetches a token.
    eager = dataclasses.replace(_oauth(url), oauth_refresh_fraction=1e-12)
    provider = ClientCredentialsTokens(eager)
    assert await provider.token() == "token-1"
    assert await provider.token() == "token-2"
    # No expires_in: the assumed lifetime counts, here one so short it is spent at once.
    endpoint.lifetime_s = None  # type: ignore[assignment]
    short = dataclasses.replace(_oauth(url), oauth_default_lifetime_s=1e-9)
    provider = ClientCredentialsTokens(short)
    assert await provider.token() == "token-3"
    assert await provider.token() == "token-4"
    # With the default lifetime (300 s) the same answer is kept.
    provider = ClientCredentialsTokens(_oauth(url))
    assert await provider.token() == "token-5"
    assert await provider.token() == "token-5"


async def test_a_refused_client_secret_names_the_setting_never_the_secret(
    token_server: tuple[_TokenEndpoint, str],
) -> None:
    _, url = token_server
    provider = ClientCredentialsTokens(_oauth(url, secret="wrong-secret"))
    with pytest.raises(KafkaAuthenticationFailed) as caught:
        await provider.token()
    assert "kafka.security.oauth_token_endpoint" in caught.value.message
    assert "HTTP 401" in caught.value.message
    assert "wrong-secret" not in caught.value.message


async def test_token_file_is_read_again_at_every_connection(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    provider = FileTokens(str(path))
    assert await provider.token() == "first"
    path.write_text("rotated\n")
    assert await provider.token() == "rotated"
    path.write_text("")
    with pytest.raises(KafkaAuthenticationFailed, match="oauth_token_file"):
        await provider.token()


def test_clients_of_one_settings_object_share_one_token_provider(tmp_path: Path) -> None:
    security = KafkaSecuritySettings(
        protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER", oauth_token_file=str(tmp_path / "t")
    )
    assert token_provider(security) is token_provider(security)


# OAUTHBEARER refusals ----------------------------------------------------------------------

_INVALID_TOKEN = b'{"status":"invalid_token"}'


class _FixedToken(AbstractTokenProvider):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self._token = token

    async def token(self) -> str:
        return self._token


class _OAuthBroker:
    """Answers a connection's SASL requests as a Kafka broker does for OAUTHBEARER: an
    accepted token gets an empty challenge; a refused one an RFC 7628 error challenge
    with error code 0, and the failure only once the client acknowledged it."""

    def __init__(self, *, accepts: bool) -> None:
        self.accepts = accepts
        self.received: list[bytes] = []

    async def send(self, request: Any) -> Any:
        if isinstance(request, SaslHandShakeRequest):
            return SaslHandShakeResponse_v1(0, ["OAUTHBEARER"])
        assert isinstance(request, SaslAuthenticateRequest)
        payload = request._payload
        self.received.append(payload)
        if payload.startswith(b"n,,"):
            return SaslAuthenticateResponse_v0(0, None, b"" if self.accepts else _INVALID_TOKEN)
        if payload == b"\x01":
            return SaslAuthenticateResponse_v0(58, _INVALID_TOKEN.decode(), b"")
        raise AssertionError(f"unexpected SASL payload {payload!r}")


async def _authenticate(broker: _OAuthBroker) -> None:
    install_token_refusal_check()
    connection = AIOKafkaConnection(
        "127.0.0.1",
        9,
        security_protocol="SASL_SSL",
        sasl_mechanism="OAUTHBEARER",
        sasl_oauth_token_provider=_FixedToken("header.claims.signature"),
    )
    connection.send = broker.send
    await connection._do_sasl_handshake()


async def test_a_refused_oauth_token_fails_the_connection() -> None:
    # aiokafka alone took the error challenge for success; the broker then answered
    # metadata requests with no broker and closed, and the clients waited forever.
    broker = _OAuthBroker(accepts=False)
    with pytest.raises(SaslAuthenticationFailed, match="invalid_token"):
        await _authenticate(broker)
    assert broker.received[-1] == b"\x01", "the error challenge was not acknowledged"


async def test_an_accepted_oauth_token_authenticates_in_one_exchange() -> None:
    broker = _OAuthBroker(accepts=True)
    await _authenticate(broker)
    assert len(broker.received) == 1


def test_aiokafka_still_builds_its_oauth_authenticator_through_the_replaced_method() -> None:
    # If aiokafka builds the authenticator some other way, the replacement would do
    # nothing and a refused token would hang the clients again: fail here instead.
    handshake = inspect.getsource(AIOKafkaConnection._do_sasl_handshake)
    assert "self.authenticator_oauth()" in handshake


def _jwt(claims: dict[str, object]) -> str:
    def encoded(part: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(part).encode()).rstrip(b"=").decode()

    return f"{encoded({'alg': 'RS256'})}.{encoded(claims)}.c2lnbmF0dXJl"


def test_a_refused_token_is_described_by_its_claims_never_by_itself() -> None:
    token = _jwt({"aud": "billing", "sub": "orders-sidecar", "exp": 1_800_000_000})
    security = KafkaSecuritySettings(
        protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER", oauth_token_file="/run/token"
    )
    refused = SaslAuthenticationFailed(_INVALID_TOKEN.decode())
    message = _sasl_message(security, refused, token_claims(token))
    assert message.startswith("kafka.security.oauth_token_file: Kafka refused the OAUTHBEARER")
    assert "aud 'billing'" in message
    assert "exp 2027-01-15 08:00:00 UTC" in message
    assert "invalid_token" in message
    assert token not in message
    assert "c2lnbmF0dXJl" not in message


def test_a_token_that_is_not_a_jwt_has_no_claims_to_show() -> None:
    assert token_claims("opaque-token") == ""
    assert token_claims("a.!!!.c") == ""
