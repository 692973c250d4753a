"""``sidecar.adapters.kafka.errors``: aiokafka's errors as the sidecar's (what a client
is told, and whether it may retry), the per-partition error codes of the leader-epoch
requests, the principal a refusal names, and ``refused_identity``."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    InvalidReplicationFactorError,
    KafkaError,
    KafkaTimeoutError,
    NotEnoughReplicasError,
    PolicyViolationError,
    RecordTooLargeError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)

from sidecar.adapters.kafka import errors as kafka_errors
from sidecar.adapters.kafka import refused_identity
from sidecar.adapters.kafka.errors import (
    SendFailed,
    _principal_refused,
    _raise_for_partition,
    _translated,
)
from sidecar.config import ConfigError, KafkaSecuritySettings, KafkaSettings, Secret
from sidecar.core.errors import (
    KafkaAuthenticationFailed,
    KafkaBadRequest,
    KafkaFailure,
    KafkaNotAuthorized,
    KafkaUnavailable,
    SidecarError,
    UnknownTopic,
)

# Translation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (TopicAuthorizationFailedError(), KafkaNotAuthorized),
        (GroupAuthorizationFailedError(), KafkaNotAuthorized),
        (ClusterAuthorizationFailedError(), KafkaNotAuthorized),
        (SaslAuthenticationFailed(), KafkaAuthenticationFailed),
        (UnknownTopicOrPartitionError(), UnknownTopic),
        (InvalidReplicationFactorError(), KafkaBadRequest),
        (PolicyViolationError(), KafkaBadRequest),
        (NotEnoughReplicasError(), KafkaUnavailable),
        (KafkaTimeoutError(), KafkaUnavailable),
        (RecordTooLargeError(), KafkaFailure),
        (UnsupportedVersionError(), KafkaFailure),
    ],
)
def test_each_kafka_error_is_told_as_the_sidecars(
    error: KafkaError, expected: type[SidecarError]
) -> None:
    assert type(_translated(error, "creating orders")) is expected


def test_a_translated_error_says_what_was_being_done() -> None:
    translated = _translated(NotEnoughReplicasError("orders-0"), "writing to orders")
    assert translated.message.startswith("writing to orders: ")
    assert "orders-0" in translated.message
    assert translated.retriable


def test_an_acl_refusal_names_the_error_and_is_not_retriable() -> None:
    refused = _translated(TopicAuthorizationFailedError(), "reading orders")
    assert refused.message == (
        "reading orders: TopicAuthorizationFailedError: not allowed by Kafka's ACLs"
    )
    assert not refused.retriable


def test_an_unknown_topic_keeps_kafkas_words() -> None:
    unknown = _translated(UnknownTopicOrPartitionError("no such topic"), "describing nosuch")
    assert unknown.message == f"describing nosuch: {UnknownTopicOrPartitionError('no such topic')}"


# Per-partition error codes ----------------------------------------------------------------


def test_no_error_code_raises_nothing() -> None:
    _raise_for_partition(0, "orders-0")


@pytest.mark.parametrize("code", [5, 6, 9, 56, 74, 75, 78])
def test_a_leader_changing_is_retriable_and_names_the_code(code: int) -> None:
    with pytest.raises(KafkaError) as caught:
        _raise_for_partition(code, "orders-0")
    assert caught.value.retriable
    assert f"orders-0: error {code} from the partition's leader" in str(caught.value)
    assert isinstance(_translated(caught.value, "asking"), KafkaUnavailable)


def test_other_codes_raise_kafkas_own_error() -> None:
    with pytest.raises(UnknownTopicOrPartitionError):
        _raise_for_partition(3, "orders-0")
    with pytest.raises(UnsupportedVersionError):
        _raise_for_partition(35, "orders-0")


# The principal a refusal names ------------------------------------------------------------


def test_a_sasl_refusal_names_the_user() -> None:
    security = KafkaSecuritySettings(
        protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="orders-sidecar",
        sasl_password=Secret("p"),
    )
    refused = _principal_refused(KafkaSettings(security=security), TopicAuthorizationFailedError())
    assert isinstance(refused, KafkaNotAuthorized)
    assert refused.message == (
        "kafka.security: User:orders-sidecar (kafka.security.sasl_username) is not "
        "authorized by Kafka's ACLs (TopicAuthorizationFailedError); it needs the ACLs "
        "listed in the README"
    )


def test_a_mutual_tls_refusal_names_the_certificate() -> None:
    security = KafkaSecuritySettings(protocol="SSL", ssl_certfile="c.pem", ssl_keyfile="k.pem")
    refused = _principal_refused(KafkaSettings(security=security), TopicAuthorizationFailedError())
    assert "the subject of kafka.security.ssl_certfile is not authorized" in refused.message


def test_an_oauth_or_anonymous_refusal_names_the_sidecars_principal() -> None:
    oauth = KafkaSecuritySettings(protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER")
    for security in (oauth, KafkaSecuritySettings()):
        refused = _principal_refused(
            KafkaSettings(security=security), GroupAuthorizationFailedError()
        )
        assert refused.message.startswith(
            "kafka.security: this sidecar's principal is not authorized"
        )


# SendFailed -------------------------------------------------------------------------------


def test_a_send_that_may_have_been_appended_is_retried_by_default() -> None:
    assert SendFailed("timed out", maybe_appended=True).retriable
    assert not SendFailed("refused", maybe_appended=False).retriable
    too_large = SendFailed("too large", maybe_appended=True, retriable=False)
    assert (too_large.maybe_appended, too_large.retriable) == (True, False)
    assert str(too_large) == too_large.message == "too large"


# refused_identity -------------------------------------------------------------------------


async def test_a_password_file_gone_meanwhile_is_a_refused_identity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def diagnose(settings: KafkaSettings) -> KafkaAuthenticationFailed | None:
        raise ConfigError("cannot read /run/secrets/password: No such file or directory")

    monkeypatch.setattr(kafka_errors, "diagnose", diagnose)
    secured = KafkaSettings(security=KafkaSecuritySettings(protocol="SASL_SSL"))
    refused = await refused_identity(secured)
    assert isinstance(refused, KafkaAuthenticationFailed)
    assert refused.message == "cannot read /run/secrets/password: No such file or directory"


async def test_a_diagnosis_that_takes_too_long_tells_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def diagnose(settings: KafkaSettings) -> KafkaAuthenticationFailed | None:
        await asyncio.sleep(10)
        return KafkaAuthenticationFailed("too late")

    monkeypatch.setattr(kafka_errors, "diagnose", diagnose)
    began = time.monotonic()
    secured = KafkaSecuritySettings(protocol="SASL_SSL")
    assert await refused_identity(KafkaSettings(request_timeout_ms=200, security=secured)) is None
    assert time.monotonic() - began < 1.0


async def test_a_plaintext_connection_has_no_identity_to_diagnose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[KafkaSettings] = []

    async def diagnose(settings: KafkaSettings) -> KafkaAuthenticationFailed | None:
        asked.append(settings)
        return KafkaAuthenticationFailed("never for PLAINTEXT")

    monkeypatch.setattr(kafka_errors, "diagnose", diagnose)
    assert await refused_identity(KafkaSettings()) is None
    assert asked == []
    secured = KafkaSettings(security=KafkaSecuritySettings(protocol="SSL"))
    assert await refused_identity(secured) is not None
