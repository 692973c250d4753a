"""The transactional writer when Kafka refuses this sidecar's credentials at run time;
its lanes learning of new partitions (``prepare``); the warmer of the partitions a
change adds. No cluster: producers that never reach a broker, reduced to what the code
under test calls (a cluster view that shows more partitions only after a refresh it
asks for, as aiokafka's does; the transaction calls, recorded)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError

from ordered_dev.harness.waiting import eventually
from sidecar.adapters import transactions
from sidecar.adapters.kafka import OutgoingKafkaRecord, SendFailed
from sidecar.adapters.transactions import PartitionWarmer, TransactionalWriter
from sidecar.config import KafkaSettings
from sidecar.core.errors import KafkaAuthenticationFailed

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


# Lanes learning of new partitions, and the warmer ---------------------------------------


class _MetadataCluster:
    def __init__(self, shown: int) -> None:
        self.shown = shown

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(self.shown))


class _MetadataClient:
    def __init__(self, shown: int, after_refresh: int) -> None:
        self.cluster = _MetadataCluster(shown)
        self.after_refresh = after_refresh
        self.refreshes = 0

    def add_topic(self, topic: str) -> None:
        pass

    def force_metadata_update(self) -> asyncio.Future[bool]:
        self.refreshes += 1
        self.cluster.shown = self.after_refresh
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        done.set_result(True)
        return done


class _MetadataProducer:
    def __init__(self, client: _MetadataClient) -> None:
        self.client = client


def _lanes_writer(
    clients: list[_MetadataClient], request_timeout_ms: int = 10_000
) -> TransactionalWriter:
    settings = KafkaSettings(request_timeout_ms=request_timeout_ms, retry_backoff_s=0.01)
    writer = TransactionalWriter(settings, [f"id-{i}" for i in range(len(clients))])
    for lane, client in zip(writer._lanes, clients, strict=True):
        lane.producer = _MetadataProducer(client)
    return writer


async def test_prepare_refreshes_every_lane_that_does_not_show_the_partitions() -> None:
    behind, current = (
        _MetadataClient(shown=4, after_refresh=6),
        _MetadataClient(shown=6, after_refresh=6),
    )
    writer = _lanes_writer([behind, _MetadataClient(shown=4, after_refresh=6), current])
    await writer.prepare("orders", 6)
    assert [lane.producer.client.cluster.shown for lane in writer._lanes] == [6, 6, 6]
    assert (behind.refreshes, current.refreshes) == (1, 0)


async def test_prepare_gives_up_quietly_when_the_metadata_never_shows_them() -> None:
    # The request path waits again (and fails the request) if they still do not show.
    stale: Any = _MetadataClient(shown=4, after_refresh=4)
    writer = _lanes_writer([stale], request_timeout_ms=100)
    await asyncio.wait_for(writer.prepare("orders", 6), 5)
    assert stale.refreshes >= 2


class _WarmProducer:
    """A transactional producer as the warmer uses it, recording what it is asked."""

    def __init__(self, fail_partition: int | None = None, hang: bool = False) -> None:
        self.client = _MetadataClient(shown=8, after_refresh=8)
        self.calls: list[object] = []
        self.fail_partition = fail_partition
        self.hang = hang
        self.stopped = False

    async def begin_transaction(self) -> None:
        self.calls.append("begin")

    async def send(
        self, topic: str, *, value: bytes, partition: int, headers: list[tuple[str, bytes]]
    ) -> asyncio.Future[None]:
        self.calls.append(("send", topic, partition, headers))
        delivery: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.fail_partition == partition:
            delivery.set_exception(KafkaTimeoutError())
        elif not self.hang:
            delivery.set_result(None)
        return delivery

    async def abort_transaction(self) -> None:
        self.calls.append("abort")

    async def stop(self) -> None:
        self.stopped = True


def _warmer(
    monkeypatch: pytest.MonkeyPatch, producers: list[_WarmProducer], within_s: float = 5.0
) -> PartitionWarmer:
    started: list[str] = []

    async def start(settings: KafkaSettings, transactional_id: str) -> _WarmProducer:
        started.append(transactional_id)
        return producers[len(started) - 1]

    monkeypatch.setattr(transactions, "start_transactional_producer", start)
    return PartitionWarmer(KafkaSettings(retry_backoff_s=0.01), "sidecar.a~warm", within_s)


async def test_warming_writes_once_to_each_partition_and_aborts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = _WarmProducer()
    warmer = _warmer(monkeypatch, [producer])
    assert await warmer.warm("orders", range(4, 6))
    mark = [("ordered.warm", b"1")]
    assert producer.calls == [
        "begin",
        ("send", "orders", 4, mark),
        ("send", "orders", 5, mark),
        "abort",
    ]
    # The producer is kept for the next change.
    assert await warmer.warm("orders", [6])
    assert not producer.stopped


async def test_a_failed_warm_up_drops_its_producer_and_the_next_starts_anew(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failing, fresh = _WarmProducer(fail_partition=5), _WarmProducer()
    warmer = _warmer(monkeypatch, [failing, fresh])
    assert not await warmer.warm("orders", [4, 5])
    # Never committed, and not aborted by a producer in doubt: dropped, so that the
    # next one's initialisation of the id aborts whatever it left open.
    assert "abort" not in failing.calls
    assert failing.stopped
    assert await warmer.warm("orders", [6])
    assert fresh.calls[-1] == "abort"


async def test_a_warm_up_that_outlasts_its_bound_gives_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stuck = _WarmProducer(hang=True)
    warmer = _warmer(monkeypatch, [stuck], within_s=0.2)
    assert not await asyncio.wait_for(warmer.warm("orders", [4]), 5)
    assert stuck.stopped


async def test_warming_nothing_or_switched_off_starts_no_producer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not await _warmer(monkeypatch, []).warm("orders", [])
    assert not await _warmer(monkeypatch, [], within_s=0).warm("orders", [4])
