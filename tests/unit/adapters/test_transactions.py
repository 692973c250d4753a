"""The transactional writer when Kafka refuses this sidecar's credentials at run time;
its lanes learning of new partitions (``prepare``). No cluster: producers that never
reach a broker, reduced to what the code under test calls (a cluster view that shows
more partitions only after a refresh it asks for, as aiokafka's does)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ordered_dev.harness.waiting import eventually
from sidecar.adapters import transactions
from sidecar.adapters.kafka import OutgoingKafkaRecord, SendFailed
from sidecar.adapters.transactions import TransactionalWriter
from sidecar.config import KafkaSettings
from sidecar.core.errors import KafkaAuthenticationFailed
from tests.support.kafka_metadata import MetadataClient

REFUSED = KafkaAuthenticationFailed(
    "kafka.security.sasl_username / kafka.security.sasl_password: Kafka refused the "
    "SCRAM-SHA-512 credentials of 'orders-sidecar'"
)
SETTINGS = KafkaSettings(request_timeout_ms=300, reset_backoff_s=0.01)
RECORD = OutgoingKafkaRecord(0, b"k", b"v", [])


class _Cluster:
    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0}


class _Client:
    cluster = _Cluster()

    def add_topic(self, topic: str) -> None:
        pass


class _ProducerThatCannotConnect:
    """An aiokafka transactional producer whose connections are refused: aiokafka logs
    the refusal and keeps the batch waiting for a node, so a send never completes."""

    def __init__(self) -> None:
        self.client = _Client()

    async def begin_transaction(self) -> None:
        pass

    async def send(self, topic: str, **record: Any) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    async def abort_transaction(self) -> None:
        pass

    async def stop(self) -> None:
        pass


class _Kafka:
    """What the writer's module asks of Kafka: producers, and the diagnosis."""

    def __init__(self, diagnosis: KafkaAuthenticationFailed | None) -> None:
        self.diagnosis = diagnosis
        self.refused_starts = 0
        """Producer starts to refuse before the credentials work again."""
        self.starts = 0

    async def start_transactional_producer(
        self, settings: KafkaSettings, transactional_id: str
    ) -> _ProducerThatCannotConnect:
        self.starts += 1
        if self.refused_starts:
            self.refused_starts -= 1
            raise REFUSED
        return _ProducerThatCannotConnect()

    async def refused_identity(self, settings: KafkaSettings) -> KafkaAuthenticationFailed | None:
        return self.diagnosis


@pytest.fixture
def fenced() -> list[bool]:
    return []


async def _writer(
    monkeypatch: pytest.MonkeyPatch, kafka: _Kafka, fenced: list[bool]
) -> TransactionalWriter:
    monkeypatch.setattr(
        transactions, "start_transactional_producer", kafka.start_transactional_producer
    )
    monkeypatch.setattr(transactions, "refused_identity", kafka.refused_identity)
    writer = TransactionalWriter(SETTINGS, ["t-0"], on_fenced=lambda: fenced.append(True))
    await writer.start()
    return writer


def _refused(outcome: object) -> bool:
    return isinstance(outcome, SendFailed) and outcome.identity_refused


async def test_refused_credentials_fail_the_write_and_every_later_one_as_refused(
    monkeypatch: pytest.MonkeyPatch, fenced: list[bool]
) -> None:
    kafka = _Kafka(REFUSED)
    writer = await _writer(monkeypatch, kafka, fenced)
    kafka.refused_starts = 3  # re-initialising the id is refused too, three times
    try:
        first = await writer.write("orders", [RECORD, RECORD])
        assert all(_refused(outcome) for outcome in first.outcomes), first.outcomes
        failure = first.outcomes[0]
        assert isinstance(failure, SendFailed)
        assert not failure.maybe_appended
        assert failure.message == REFUSED.message
        assert first.final.done(), "no commit was asked for: nothing can become visible"

        # The next request is not queued behind a transaction that cannot begin.
        later = await asyncio.wait_for(writer.write("orders", [RECORD]), 0.1)
        assert _refused(later.outcomes[0]), later.outcomes

        # Once the credentials work again the writer retires, to be replaced.
        await eventually(lambda: _true(bool(fenced)), 5.0, "the writer retired")
        assert kafka.starts == 1 + 3 + 1
        after = await writer.write("orders", [RECORD])
        assert not _refused(after.outcomes[0]), "refused after the credentials worked"
    finally:
        await writer.stop()


async def test_a_transaction_that_times_out_with_the_cluster_away_is_unavailable(
    monkeypatch: pytest.MonkeyPatch, fenced: list[bool]
) -> None:
    writer = await _writer(monkeypatch, _Kafka(None), fenced)
    try:
        written = await writer.write("orders", [RECORD])
        failure = written.outcomes[0]
        assert isinstance(failure, SendFailed)
        assert not failure.identity_refused
        assert failure.retriable
    finally:
        await writer.stop()


async def _true(value: bool) -> bool:
    return value


# Lanes learning of new partitions -------------------------------------------------------


class _MetadataProducer:
    def __init__(self, client: MetadataClient) -> None:
        self.client = client


def _lanes_writer(
    clients: list[MetadataClient], request_timeout_ms: int = 10_000
) -> TransactionalWriter:
    settings = KafkaSettings(request_timeout_ms=request_timeout_ms, retry_backoff_s=0.01)
    writer = TransactionalWriter(settings, [f"id-{i}" for i in range(len(clients))])
    for lane, client in zip(writer._lanes, clients, strict=True):
        lane.producer = _MetadataProducer(client)
    return writer


async def test_prepare_refreshes_every_lane_that_does_not_show_the_partitions() -> None:
    behind, current = (
        MetadataClient(shown=4, after_refresh=6),
        MetadataClient(shown=6, after_refresh=6),
    )
    writer = _lanes_writer([behind, MetadataClient(shown=4, after_refresh=6), current])
    await writer.prepare("orders", 6)
    assert [lane.producer.client.cluster.shown for lane in writer._lanes] == [6, 6, 6]
    assert (behind.refreshes, current.refreshes) == (1, 0)


async def test_prepare_gives_up_quietly_when_the_metadata_never_shows_them() -> None:
    # The request path waits again (and fails the request) if they still do not show.
    stale: Any = MetadataClient(shown=4, after_refresh=4)
    writer = _lanes_writer([stale], request_timeout_ms=100)
    await asyncio.wait_for(writer.prepare("orders", 6), 5)
    assert stale.refreshes >= 2
