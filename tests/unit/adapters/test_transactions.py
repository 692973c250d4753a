"""The transactional writer when Kafka refuses this sidecar's credentials at run time;
its lanes learning of new partitions (``prepare``); how it tells each transaction's end.
No cluster: producers that never reach a broker, reduced to what the code under test
calls (a cluster view that shows more partitions only after a refresh it asks for, as
aiokafka's does)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError, TopicAuthorizationFailedError
from aiokafka.errors import ProducerFenced as KafkaProducerFenced
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.producer.transaction_manager import TransactionManager

from ordered_dev.harness.waiting import eventually
from sidecar.adapters import transactions
from sidecar.adapters.kafka import OutgoingKafkaRecord, SendFailed, SentRecord
from sidecar.adapters.transactions import TransactionalWriter, WriteResult
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

    _max_request_size = 1_048_576

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(16_384, 0, is_transactional=True)

    async def send_batch(self, batch: BatchBuilder, topic: str, *, partition: int) -> Any:
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


# Partitions added to the next lane's transaction ahead of its records --------------------


class _LaneProducer:
    """An aiokafka transactional producer reduced to its transaction state (aiokafka's
    own TransactionManager, so a partition added outside a transaction is refused as
    aiokafka refuses it) and sends whose deliveries the test completes. Everything asked
    of it goes to ``log``."""

    def __init__(self, name: str, log: list[tuple[Any, ...]], shown: int = 6) -> None:
        self.name = name
        self.log = log
        self.client = MetadataClient(shown=shown, after_refresh=shown)
        self._txn_manager = TransactionManager(name, 60_000)
        self._txn_manager.set_pid_and_epoch(1, 0)
        self.deliveries: list[asyncio.Future[Any]] = []

    def added(self) -> set[int]:
        """Partitions in its transaction, added or waiting to be."""
        manager = self._txn_manager
        return {tp.partition for tp in manager.partitions_to_add() | manager.txn_partitions}

    async def begin_transaction(self) -> None:
        self.log.append((self.name, "begin"))
        self._txn_manager.begin_transaction()

    _max_request_size = 1_048_576

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(16_384, 0, is_transactional=True)

    async def send_batch(
        self, batch: BatchBuilder, topic: str, *, partition: int
    ) -> asyncio.Future[Any]:
        """Queue a batch: a "send" in the log per record, one delivery for the batch."""
        for _ in range(batch.record_count()):
            self.log.append((self.name, "send", partition, sorted(self.added())))
        self._txn_manager.maybe_add_partition_to_txn(TopicPartition(topic, partition))
        delivery: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.deliveries.append(delivery)
        return delivery

    def deliver(self) -> None:
        for offset, delivery in enumerate(self.deliveries):
            if not delivery.done():
                delivery.set_result(SimpleNamespace(partition=0, offset=offset, timestamp=-1))

    async def commit_transaction(self) -> None:
        self._end("commit")

    async def abort_transaction(self) -> None:
        self._end("abort")

    def _end(self, how: str) -> None:
        """End the transaction as Kafka would once every partition asked for is added."""
        self.log.append((self.name, how, sorted(self.added())))
        manager = self._txn_manager
        for tp in list(manager.partitions_to_add()):
            manager.partition_added(tp)
        if how == "commit":
            manager.committing_transaction()
        else:
            manager.aborting_transaction()
        manager.complete_transaction()

    async def stop(self) -> None:
        pass


async def _writer_over(
    monkeypatch: pytest.MonkeyPatch,
    producers: list[_LaneProducer],
    request_timeout_ms: int = 5_000,
    *,
    lanes: int = 2,
    on_ended: Callable[[str], None] = lambda outcome: None,
    **settings: Any,
) -> TransactionalWriter:
    """A writer of ``lanes`` lanes whose producers (the lanes', then those that replace
    them) are ``producers`` in turn; ``settings`` are more ``KafkaSettings``."""
    started = iter(producers)

    async def start(settings: KafkaSettings, transactional_id: str) -> _LaneProducer:
        return next(started)

    monkeypatch.setattr(transactions, "start_transactional_producer", start)
    kafka = KafkaSettings(request_timeout_ms=request_timeout_ms, retry_backoff_s=0.01, **settings)
    writer = TransactionalWriter(kafka, [p.name for p in producers[:lanes]], on_ended=on_ended)
    await writer.start()
    return writer


def _records(*partitions: int) -> list[OutgoingKafkaRecord]:
    return [OutgoingKafkaRecord(p, b"k", b"v", []) for p in partitions]


async def _queued_behind_lane_a(
    writer: TransactionalWriter,
    first: _LaneProducer,
    second: _LaneProducer,
    partitions: tuple[int, ...],
    added: set[int],
) -> tuple[asyncio.Task[WriteResult], asyncio.Task[WriteResult]]:
    """A write appended on lane a (its record sent, not acknowledged), and one to
    ``partitions`` queued behind it, once lane b's transaction holds ``added``."""
    one = asyncio.create_task(writer.write("orders", _records(0)))
    await eventually(lambda: _true(bool(first.deliveries)), 5.0, "lane a sent its record")
    two = asyncio.create_task(writer.write("orders", _records(*partitions)))
    await eventually(lambda: _true(second.added() == added), 5.0, "added ahead")
    return one, two


async def test_partitions_queued_meanwhile_are_added_to_the_next_lane_before_its_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[tuple[Any, ...]] = []
    first, second = _LaneProducer("a", log), _LaneProducer("b", log)
    writer = await _writer_over(monkeypatch, [first, second])
    try:
        # Lane a's record is not appended yet: the next request waits for its turn, and
        # its partitions are added to lane b's transaction meanwhile.
        one, two = await _queued_behind_lane_a(writer, first, second, (1, 2, 1), {1, 2})
        assert not second.deliveries, "a record was sent before the one queued before it"
        assert writer.partitions_added_ahead == 2

        first.deliver()
        # One batch per partition: 1 (two records) and 2.
        await eventually(lambda: _true(len(second.deliveries) == 2), 5.0, "lane b sent")
        second.deliver()
        outcomes = [result.outcomes for result in await asyncio.gather(one, two)]
        assert all(isinstance(o, SentRecord) for result in outcomes for o in result), outcomes
    finally:
        await writer.stop()
    # Lane b's transaction was begun once, ahead, and held its partitions before its sends.
    assert [entry for entry in log if entry[0] == "b"] == [
        ("b", "begin"),
        ("b", "send", 1, [1, 2]),
        ("b", "send", 1, [1, 2]),
        ("b", "send", 2, [1, 2]),
        ("b", "commit", [1, 2]),
    ]
    assert log.index(("a", "commit", [0])) < log.index(("b", "commit", [1, 2]))


async def test_a_partition_the_lane_does_not_show_is_left_to_its_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[tuple[Any, ...]] = []
    first, second = _LaneProducer("a", log), _LaneProducer("b", log, shown=2)
    writer = await _writer_over(monkeypatch, [first, second], request_timeout_ms=1_000)
    try:
        one, two = await _queued_behind_lane_a(writer, first, second, (1, 4), {1})
        assert writer.partitions_added_ahead == 1
        first.deliver()
        assert isinstance((await one).outcomes[0], SentRecord)
        # Partition 4 is not in lane b's metadata: the request waits for it to show and
        # fails, not appended, as it did before anything was added ahead.
        failed = (await two).outcomes
        assert all(isinstance(o, SendFailed) and not o.maybe_appended for o in failed), failed
    finally:
        await writer.stop()
    assert not second.deliveries
    # The partition added for the failed request is ended with the lane's transaction.
    assert ("b", "abort", [1]) in log


async def test_a_single_lane_adds_nothing_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[tuple[Any, ...]] = []
    only = _LaneProducer("a", log)
    writer = await _writer_over(monkeypatch, [only], lanes=1)
    try:
        one = asyncio.create_task(writer.write("orders", _records(0)))
        await eventually(lambda: _true(bool(only.deliveries)), 5.0, "lane a sent its record")
        two = asyncio.create_task(writer.write("orders", _records(3)))
        await asyncio.sleep(0.05)
        assert only.added() == {0}, "added to a transaction its records are not part of"
        only.deliver()
        await eventually(lambda: _true(len(only.deliveries) == 2), 5.0, "second sent")
        only.deliver()
        await asyncio.gather(one, two)
    finally:
        await writer.stop()
    assert writer.partitions_added_ahead == 0


async def test_a_transaction_begun_ahead_whose_records_never_come_is_aborted_at_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[tuple[Any, ...]] = []
    first, second = _LaneProducer("a", log), _LaneProducer("b", log)
    replacement = _LaneProducer("a", log)  # lane a's id initialised again after its failure
    writer = await _writer_over(monkeypatch, [first, second, replacement])
    monkeypatch.setattr(transactions, "refused_identity", _Kafka(None).refused_identity)
    one, two = await _queued_behind_lane_a(writer, first, second, (5,), {5})
    # Lane a's transaction fails: the writer begins nothing more, the queued request is
    # answered, and lane b's transaction must not stay open until Kafka times it out
    # (its markers would land whenever that is).
    first.deliveries[0].set_exception(KafkaTimeoutError())
    failed = [(await one).outcomes[0], (await two).outcomes[0]]
    assert all(isinstance(o, SendFailed) and not o.maybe_appended for o in failed), failed
    await writer.stop()
    assert ("b", "abort", [5]) in log
    assert not second.deliveries


async def test_a_transaction_begun_ahead_that_met_an_error_is_begun_again_for_its_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[tuple[Any, ...]] = []
    first, second = _LaneProducer("a", log), _LaneProducer("b", log)
    writer = await _writer_over(monkeypatch, [first, second])
    try:
        one, two = await _queued_behind_lane_a(writer, first, second, (2,), {2})
        # The coordinator refuses the partition (as aiokafka records a refused ACL): the
        # transaction begun ahead can take no record.
        second._txn_manager.error_transaction(TopicAuthorizationFailedError({"orders"}))
        first.deliver()
        await eventually(lambda: _true(bool(second.deliveries)), 5.0, "lane b sent")
        second.deliver()
        await asyncio.gather(one, two)
    finally:
        await writer.stop()
    assert [entry for entry in log if entry[0] == "b"][:4] == [
        ("b", "begin"),
        ("b", "abort", []),
        ("b", "begin"),
        ("b", "send", 2, []),
    ]


class _CommitFails(_LaneProducer):
    """A lane whose commit fails with ``error`` once ``release`` is set."""

    def __init__(self, name: str, log: list[tuple[Any, ...]], error: Exception) -> None:
        super().__init__(name, log)
        self.error = error
        self.release = asyncio.Event()

    async def commit_transaction(self) -> None:
        await self.release.wait()
        raise self.error


async def test_each_transaction_is_told_as_committed_or_fenced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[tuple[Any, ...]] = []
    first = _LaneProducer("a", log)
    ended: list[str] = []
    writer = await _writer_over(monkeypatch, [first], lanes=1, on_ended=ended.append)
    try:
        written = asyncio.create_task(writer.write("orders", _records(0, 1)))
        await eventually(lambda: _true(len(first.deliveries) == 2), 5.0, "a sent its records")
        first.deliver()
        await written
        assert ended == [transactions.TX_COMMITTED]

        async def fenced_commit() -> None:
            raise KafkaProducerFenced()

        first.commit_transaction = fenced_commit  # type: ignore[method-assign]
        written = asyncio.create_task(writer.write("orders", _records(2)))
        await eventually(lambda: _true(len(first.deliveries) == 3), 5.0, "a sent its record")
        first.deliver()
        await written
    finally:
        await writer.stop()
    assert ended == [transactions.TX_COMMITTED, transactions.TX_FENCED]


async def test_a_failed_commit_is_told_and_so_is_each_one_aborted_behind_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[tuple[Any, ...]] = []
    first = _CommitFails("a", log, KafkaTimeoutError())
    second, replacement = _LaneProducer("b", log), _LaneProducer("a", log)
    ended: list[str] = []
    writer = await _writer_over(
        monkeypatch, [first, second, replacement], on_ended=ended.append, reset_backoff_s=0.01
    )
    try:
        one = asyncio.create_task(writer.write("orders", _records(0)))
        await eventually(lambda: _true(bool(first.deliveries)), 5.0, "lane a sent")
        two = asyncio.create_task(writer.write("orders", _records(1)))
        first.deliver()
        await eventually(lambda: _true(bool(second.deliveries)), 5.0, "lane b sent")
        second.deliver()
        first.release.set()  # a's commit fails once b's transaction waits behind it
        await asyncio.gather(one, two)
        await eventually(lambda: _true(len(ended) == 2), 5.0, "both told")
    finally:
        await writer.stop()
    assert sorted(ended) == sorted([transactions.TX_FAILED, transactions.TX_ABORTED])


class _PromptLane(_LaneProducer):
    """A lane whose records are acknowledged as soon as they are sent, and whose commit
    waits for ``commits`` to be set (set from the start unless the test clears it)."""

    def __init__(self, name: str, log: list[tuple[Any, ...]]) -> None:
        super().__init__(name, log)
        self.commits = asyncio.Event()
        self.commits.set()

    async def send_batch(
        self, batch: BatchBuilder, topic: str, *, partition: int
    ) -> asyncio.Future[Any]:
        delivery = await super().send_batch(batch, topic, partition=partition)
        self.deliver()
        return delivery

    async def commit_transaction(self) -> None:
        await self.commits.wait()
        await super().commit_transaction()


def _transactions(log: list[tuple[Any, ...]]) -> list[list[int]]:
    """The partitions written in each transaction, in the order they committed."""
    sent: dict[str, list[int]] = {}
    committed = []
    for name, what, *rest in log:
        if what == "send":
            sent.setdefault(name, []).append(rest[0])
        elif what == "commit":
            committed.append(sent.pop(name, []))
    return committed


async def test_a_lone_clients_request_never_waits_for_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[tuple[Any, ...]] = []
    writer = await _writer_over(
        monkeypatch, [_PromptLane("a", log)], 30_000, lanes=1, transaction_linger_ms=20_000
    )
    try:
        for partition in range(3):  # far less than one linger for all three
            written = await asyncio.wait_for(writer.write("orders", _records(partition)), 10)
            assert isinstance(written.outcomes[0], SentRecord)
    finally:
        await writer.stop()
    assert _transactions(log) == [[0], [1], [2]]


async def test_a_transaction_waits_for_as_many_requests_as_the_last_one_took(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[tuple[Any, ...]] = []
    writer = await _writer_over(
        monkeypatch, [_PromptLane("a", log)], 30_000, lanes=1, transaction_linger_ms=20_000
    )
    try:
        # Two clients answered by one commit: queued in the same turn, one transaction.
        await asyncio.gather(
            writer.write("orders", _records(0)), writer.write("orders", _records(1))
        )
        # Their next requests come back one by one: the first waits for the second ...
        first = asyncio.create_task(writer.write("orders", _records(2)))
        await asyncio.sleep(0.05)
        assert not first.done(), "the first request did not wait for the second"
        second = asyncio.create_task(writer.write("orders", _records(3)))
        # ... and no longer than that (far less than the linger).
        await asyncio.wait_for(asyncio.gather(first, second), 10)
    finally:
        await writer.stop()
    assert _transactions(log) == [[0, 1], [2, 3]]


async def test_requests_queued_while_a_transaction_commits_wait_the_linger_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[tuple[Any, ...]] = []
    first_lane, second_lane = _PromptLane("a", log), _PromptLane("b", log)
    writer = await _writer_over(
        monkeypatch, [first_lane, second_lane], 30_000, transaction_linger_ms=500
    )
    try:
        first_lane.commits.clear()  # the first transaction stays in progress
        one = asyncio.create_task(writer.write("orders", _records(0)))
        await eventually(lambda: _true(bool(first_lane.deliveries)), 5.0, "lane a sent")
        # The last transaction took one request, but one is in progress: a request queued
        # now waits the linger out, and one more arriving meanwhile joins it.
        two = asyncio.create_task(writer.write("orders", _records(1)))
        await asyncio.sleep(0.1)
        three = asyncio.create_task(writer.write("orders", _records(2)))
        first_lane.commits.set()
        await asyncio.wait_for(asyncio.gather(one, two, three), 10)
    finally:
        await writer.stop()
    assert _transactions(log) == [[0], [1, 2]]
