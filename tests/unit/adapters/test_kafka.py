"""The Kafka adapter's hold on aiokafka internals it depends on, and its waits on metadata."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Iterator

import pytest
from aiokafka.errors import NodeNotReadyError
from aiokafka.producer import sender as aiokafka_sender

from sidecar.adapters import kafka as kafka_adapter
from sidecar.adapters.kafka import KafkaGateway, refused_identity, set_transaction_poll
from sidecar.config import KafkaSettings
from sidecar.core.errors import KafkaAuthenticationFailed, KafkaUnavailable


@pytest.fixture
def restore_backoff_override() -> Iterator[None]:
    before = aiokafka_sender.BACKOFF_OVERRIDE
    yield
    aiokafka_sender.BACKOFF_OVERRIDE = before


def test_aiokafka_still_polls_a_busy_coordinator_with_the_constant_set() -> None:
    # If aiokafka renames the constant or stops returning it for CONCURRENT_TRANSACTIONS,
    # the setting would silently do nothing: fail here instead.
    handler = inspect.getsource(aiokafka_sender.AddPartitionsToTxnHandler.handle_response)
    assert "ConcurrentTransactions" in handler
    assert "return BACKOFF_OVERRIDE" in handler


@pytest.mark.usefixtures("restore_backoff_override")
def test_the_transaction_poll_setting_reaches_aiokafka() -> None:
    set_transaction_poll(5.0)
    assert aiokafka_sender.BACKOFF_OVERRIDE == 0.005
    set_transaction_poll(2.0)
    assert aiokafka_sender.BACKOFF_OVERRIDE == 0.002


def _gateway_whose_metadata_answers(answers: list[int | None]) -> tuple[KafkaGateway, list[float]]:
    gateway = KafkaGateway(KafkaSettings(request_timeout_ms=300, retry_backoff_s=0.01))
    asked: list[float] = []

    async def partition_count_or_none(topic: str) -> int | None:
        asked.append(time.monotonic())
        return answers.pop(0) if len(answers) > 1 else answers[0]

    gateway._partition_count_or_none = partition_count_or_none  # type: ignore[method-assign]
    return gateway, asked


async def test_a_topic_reported_existing_is_asked_for_until_metadata_lists_it() -> None:
    # Three sidecars of the demo start together; the one whose create loses the race
    # asked a broker that had not heard of the topic yet, and stopped.
    gateway, asked = _gateway_whose_metadata_answers([None, None, 6])
    assert await gateway.existing_partition_count("audit") == 6
    assert len(asked) == 3


async def test_a_topic_metadata_never_lists_is_unavailable_after_the_request_timeout() -> None:
    gateway, asked = _gateway_whose_metadata_answers([None])
    with pytest.raises(KafkaUnavailable, match="audit exists but metadata does not show it"):
        await gateway.existing_partition_count("audit")
    # Asked again and again until the 300 ms request timeout had passed, not once.
    assert len(asked) > 2
    assert asked[-1] - asked[0] >= 0.3


# Credentials refused at run time ----------------------------------------------------------


def _gateway_that_cannot_reach_a_node(
    monkeypatch: pytest.MonkeyPatch, diagnosis: KafkaAuthenticationFailed | None
) -> KafkaGateway:
    async def diagnose(settings: KafkaSettings) -> KafkaAuthenticationFailed | None:
        return diagnosis

    monkeypatch.setattr(kafka_adapter, "diagnose", diagnose)
    return KafkaGateway(KafkaSettings(request_timeout_ms=200, retry_backoff_s=0.01))


async def _no_connection() -> None:
    # What aiokafka raises when it cannot connect to a node (it logs the reason).
    raise NodeNotReadyError("Attempt to send a request to node which is not ready")


async def test_a_read_that_cannot_connect_because_credentials_are_refused_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refused = KafkaAuthenticationFailed(
        "kafka.security.sasl_username / kafka.security.sasl_password: Kafka refused ..."
    )
    gateway = _gateway_that_cannot_reach_a_node(monkeypatch, refused)
    with pytest.raises(KafkaAuthenticationFailed) as caught:
        await gateway._retrying(_no_connection, "reading metadata of orders")
    assert caught.value.error_code == 50370
    assert caught.value.message.startswith("reading metadata of orders: kafka.security.sasl_")


async def test_a_read_that_cannot_connect_to_a_cluster_away_is_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gateway = _gateway_that_cannot_reach_a_node(monkeypatch, None)
    with pytest.raises(KafkaUnavailable):
        await gateway._retrying(_no_connection, "reading metadata of orders")


async def test_a_diagnosis_that_takes_too_long_tells_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def diagnose(settings: KafkaSettings) -> KafkaAuthenticationFailed | None:
        await asyncio.sleep(10)
        return KafkaAuthenticationFailed("too late")

    monkeypatch.setattr(kafka_adapter, "diagnose", diagnose)
    began = time.monotonic()
    assert await refused_identity(KafkaSettings(request_timeout_ms=200)) is None
    assert time.monotonic() - began < 1.0
