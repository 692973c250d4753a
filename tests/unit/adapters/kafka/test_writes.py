"""``sidecar.adapters.kafka.writes``: the hold on the aiokafka internal the transaction
poll depends on, queueing records in batches (a transaction's, and the shared batches of
concurrent sends, over aiokafka's own accumulator) and reading what became of them, and
the wait for metadata to show new partitions, over fake aiokafka producers and clients. Sends to a
real cluster are tested in ``tests/integration/test_kafka_gateway.py`` and
``tests/integration/test_produce.py``."""

from __future__ import annotations

import asyncio
import gc
import inspect
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    TopicAuthorizationFailedError,
)
from aiokafka.errors import (
    ProducerFenced as ProducerFencedError,
)
from aiokafka.producer import sender as aiokafka_sender
from aiokafka.producer.message_accumulator import BatchBuilder, MessageAccumulator, MessageBatch
from aiokafka.producer.transaction_manager import TransactionManager
from aiokafka.record.default_records import DefaultRecordBatch

from sidecar.adapters.kafka import (
    SendFailed,
    add_partitions_ahead,
    ready_to_begin,
    set_transaction_poll,
)
from sidecar.adapters.kafka.admin import KafkaAdmin
from sidecar.adapters.kafka.clients import ConnectionState, _Clients
from sidecar.adapters.kafka.writes import (
    KafkaWrites,
    OutgoingKafkaRecord,
    QueuedRecord,
    SentRecord,
    SharedBatches,
    await_partition_count,
    enqueue_all,
)
from sidecar.config import KafkaSettings
from sidecar.core.errors import KafkaUnavailable, UnknownTopic


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


# Queueing a record and what became of it -------------------------------------------------


def _failure(outcome: object) -> tuple[str, bool, bool]:
    """A SendFailed's message, whether the record may have been appended, and whether
    the principal was refused (SendFailed is an exception: equal only to itself)."""
    assert isinstance(outcome, SendFailed), outcome
    return outcome.message, outcome.maybe_appended, outcome.not_authorized


def test_records_are_equal_by_position_whatever_their_timestamps() -> None:
    assert SentRecord(2, 41, 5) == SentRecord(2, 41, None)
    assert SentRecord(2, 41) != SentRecord(2, 42)


# Queueing a transaction's records in batches ---------------------------------------------


class _BatchProducer:
    """An aiokafka producer reduced to ``create_batch`` (aiokafka's own builders, of
    ``batch_size`` bytes) and ``send_batch``, which records each batch queued and
    raises ``errors[partition]`` for that partition."""

    def __init__(
        self,
        batch_size: int = 16_384,
        max_request_size: int = 1_048_576,
        errors: dict[int, Exception] | None = None,
    ) -> None:
        self._max_request_size = max_request_size
        self.batch_size = batch_size
        self.errors = errors or {}
        self.queued: list[tuple[str, int, list[tuple[bytes | None, bytes | None]]]] = []
        self.deliveries: list[asyncio.Future[Any]] = []

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(self.batch_size, 0, is_transactional=True)

    async def send_batch(
        self, batch: BatchBuilder, topic: str, *, partition: int
    ) -> asyncio.Future[Any]:
        if partition in self.errors:
            raise self.errors[partition]
        records = [(r.key, r.value) for r in _records_of(batch)]
        self.queued.append((topic, partition, records))
        delivery: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.deliveries.append(delivery)
        return delivery


def _records_of(batch: BatchBuilder) -> list[Any]:
    """The records a batch holds, read back as Kafka would read them."""
    return list(DefaultRecordBatch(bytes(batch._build())))


async def test_a_transactions_records_go_in_one_batch_per_partition_in_order() -> None:
    producer = _BatchProducer()
    first = [
        OutgoingKafkaRecord(1, b"a", b"1", [("h", b"x")], timestamp_ms=17),
        OutgoingKafkaRecord(0, b"b", b"2", []),
        OutgoingKafkaRecord(1, b"c", None, []),  # a tombstone with its key
    ]
    second = [OutgoingKafkaRecord(1, b"d", b"4", [])]
    queued = await enqueue_all(producer, [("orders", first), ("orders", second)])
    assert producer.queued == [
        ("orders", 1, [(b"a", b"1"), (b"c", None), (b"d", b"4")]),
        ("orders", 0, [(b"b", b"2")]),
    ]
    on_one, on_zero = producer.deliveries
    on_one.set_result(SimpleNamespace(partition=1, offset=100, timestamp=-1))
    on_zero.set_result(SimpleNamespace(partition=0, offset=7, timestamp=-1))
    outcomes = [[q.outcome() for q in row if isinstance(q, QueuedRecord)] for row in queued]
    assert outcomes == [
        [SentRecord(1, 100), SentRecord(0, 7), SentRecord(1, 101)],
        [SentRecord(1, 102)],
    ]
    # CreateTime: each record's own timestamp, the one given or the one it was queued at.
    stamped = [o.timestamp_ms for o in outcomes[0] if isinstance(o, SentRecord)]
    assert stamped[0] == 17
    assert stamped[1] is not None
    assert abs(stamped[1] - time.time() * 1000) < 60_000


async def test_a_topic_stamped_by_the_broker_reports_its_log_append_time() -> None:
    producer = _BatchProducer()
    [[queued]] = await enqueue_all(producer, [("t", [OutgoingKafkaRecord(0, b"k", b"v", [], 17)])])
    producer.deliveries[0].set_result(SimpleNamespace(partition=0, offset=3, timestamp=99))
    assert isinstance(queued, QueuedRecord)
    landed = queued.outcome()
    assert isinstance(landed, SentRecord)
    assert landed.timestamp_ms == 99


async def test_batches_past_the_batch_size_are_queued_a_round_per_partition() -> None:
    # The second batch of a partition waits until the sender takes the first: every
    # partition's first batch is queued before any second one.
    producer = _BatchProducer(batch_size=300)
    records = [OutgoingKafkaRecord(i % 2, b"k%d" % i, bytes(60), []) for i in range(12)]
    queued = await enqueue_all(producer, [("t", records)])
    partitions = [partition for _, partition, _ in producer.queued]
    assert len(partitions) > 2, "the batch size should split each partition's records"
    assert partitions == [0, 1] * (len(partitions) // 2)
    for partition in (0, 1):
        held = [r for _, p, batch in producer.queued if p == partition for r in batch]
        assert held == [(r.key, r.value) for r in records if r.partition == partition]
    # Each record's offset is its batch's first offset plus its place in the batch.
    expected = []
    for number, ((_, partition, batch), delivery) in enumerate(
        zip(producer.queued, producer.deliveries, strict=True)
    ):
        delivery.set_result(SimpleNamespace(partition=partition, offset=100 * number, timestamp=-1))
        expected += [(partition, 100 * number + index) for index in range(len(batch))]
    outcomes = [q.outcome() for q in queued[0] if isinstance(q, QueuedRecord)]
    landed = sorted((o.partition, o.offset) for o in outcomes if isinstance(o, SentRecord))
    assert landed == sorted(expected)
    in_zero = [o.offset for o in outcomes if isinstance(o, SentRecord) and o.partition == 0]
    assert in_zero == sorted(in_zero), "a partition's records out of their order"


async def test_records_refused_before_queueing_fail_alone_unappended() -> None:
    producer = _BatchProducer(max_request_size=120)
    records = [
        OutgoingKafkaRecord(0, None, None, []),
        OutgoingKafkaRecord(0, b"k", bytes(500), []),
        OutgoingKafkaRecord(0, b"k", b"v", []),
    ]
    [[keyless, large, kept]] = await enqueue_all(producer, [("t", records)])
    assert _failure(keyless) == ("a tombstone needs a key", False, False)
    message, maybe_appended, _ = _failure(large)
    assert "larger than the maximum request size" in message
    assert not maybe_appended
    assert isinstance(kept, QueuedRecord)
    assert producer.queued == [("t", 0, [(b"k", b"v")])]


async def test_a_batch_refused_by_send_batch_fails_its_records_unappended() -> None:
    producer = _BatchProducer(errors={1: TopicAuthorizationFailedError()})
    records = [OutgoingKafkaRecord(0, b"a", b"1", []), OutgoingKafkaRecord(1, b"b", b"2", [])]
    [[kept, refused]] = await enqueue_all(producer, [("t", records)])
    assert isinstance(kept, QueuedRecord)
    assert _failure(refused)[1:] == (False, True)
    with pytest.raises(ProducerFencedError):
        await enqueue_all(_BatchProducer(errors={0: ProducerFencedError()}), [("t", records)])


async def test_a_failed_or_unanswered_batch_may_have_been_appended() -> None:
    producer = _BatchProducer()
    [[failed], [waiting]] = await enqueue_all(
        producer,
        [
            ("t", [OutgoingKafkaRecord(0, b"a", b"1", [])]),
            ("u", [OutgoingKafkaRecord(0, b"b", b"2", [])]),
        ],
    )
    producer.deliveries[0].set_exception(NotLeaderForPartitionError())
    assert isinstance(failed, QueuedRecord)
    assert isinstance(waiting, QueuedRecord)
    assert _failure(failed.outcome())[1] is True
    assert _failure(waiting.outcome()) == ("no acknowledgement of its batch", True, False)


# Concurrent sends sharing a partition's batches -------------------------------------------


class _AccumulatorProducer:
    """An idempotent aiokafka producer reduced to its real accumulator, behind
    ``create_batch`` and ``send_batch``; the test takes batches as the sender would
    (``take``), and ``errors`` makes ``send_batch`` refuse a partition's batches."""

    def __init__(self, batch_size: int = 16_384, errors: dict[int, Exception] | None = None):
        self._max_request_size = 1_048_576
        self.errors = errors or {}
        manager = TransactionManager(transactional_id=None, transaction_timeout_ms=60_000)
        manager.set_pid_and_epoch(7, 0)
        cluster = SimpleNamespace(leader_for_partition=lambda tp: 1)
        self._message_accumulator = MessageAccumulator(
            cluster, batch_size, 0, 30, txn_manager=manager
        )

    def create_batch(self) -> BatchBuilder:
        return cast(BatchBuilder, self._message_accumulator.create_builder())

    async def send_batch(self, batch: BatchBuilder, topic: str, *, partition: int) -> Any:
        if partition in self.errors:
            raise self.errors[partition]
        tp = TopicPartition(topic, partition)
        return await self._message_accumulator.add_batch(batch, tp, 5)

    def take(self) -> dict[int, MessageBatch]:
        """What the sender would take now: a batch per partition, by partition."""
        nodes, _ = self._message_accumulator.drain_by_nodes(ignore_nodes=set())
        return {tp.partition: batch for tp, batch in nodes.get(1, {}).items()}


def _read(batch: MessageBatch) -> tuple[int, list[bytes | None]]:
    """A taken batch as the broker reads it: its base sequence and its records' keys."""
    read = DefaultRecordBatch(bytes(batch.get_data_buffer()))
    return read.base_sequence, [record.key for record in read]


def _record(partition: int, key: bytes, size: int = 1) -> OutgoingKafkaRecord:
    return OutgoingKafkaRecord(partition, key, bytes(size), [])


async def _settled() -> None:
    """Let the queueing tasks run until they wait."""
    for _ in range(5):
        await asyncio.sleep(0)


async def _past_the_batch_size(
    count: int,
) -> tuple[_AccumulatorProducer, list[OutgoingKafkaRecord], list[QueuedRecord | SendFailed]]:
    """``count`` records of 60 B to partition 0 added at once, with batches of 300 bytes
    (a few records each), once the queueing task waits."""
    producer = _AccumulatorProducer(batch_size=300)
    records = [_record(0, b"%02d" % i, size=60) for i in range(count)]
    queued = SharedBatches(producer).add("t", records)
    await _settled()
    return producer, records, queued


async def test_concurrent_sends_to_a_partition_share_its_batch_in_order() -> None:
    producer = _AccumulatorProducer()
    shared = SharedBatches(producer)
    first = shared.add("t", [_record(0, b"a"), _record(1, b"b"), _record(0, b"c")])
    second = shared.add("t", [_record(0, b"d")])
    await _settled()
    taken = producer.take()
    assert {p: _read(batch) for p, batch in taken.items()} == {
        0: (0, [b"a", b"c", b"d"]),
        1: (0, [b"b"]),
    }
    taken[0].done(base_offset=40)
    taken[1].done(base_offset=9)
    await _settled()
    outcomes = [q.outcome() for q in first + second if isinstance(q, QueuedRecord)]
    assert outcomes == [SentRecord(0, 40), SentRecord(1, 9), SentRecord(0, 41), SentRecord(0, 42)]


async def test_a_record_added_once_the_sender_took_the_batch_goes_in_the_next() -> None:
    # The sender reads a batch's record count when it takes it (its sequence numbers)
    # and builds it later: a record joining in between would break the sequence.
    producer = _AccumulatorProducer()
    shared = SharedBatches(producer)
    shared.add("t", [_record(0, b"a")])
    await _settled()
    [taken] = producer.take().values()
    later = shared.add("t", [_record(0, b"b")])
    await _settled()
    assert _read(taken) == (0, [b"a"])
    [following] = producer.take().values()
    assert _read(following) == (1, [b"b"])
    taken.done(base_offset=0)
    following.done(base_offset=1)
    await _settled()
    assert [q.outcome() for q in later if isinstance(q, QueuedRecord)] == [SentRecord(0, 1)]


async def test_a_partitions_next_batch_is_queued_once_the_sender_took_the_one_before() -> None:
    producer, records, queued = await _past_the_batch_size(12)
    keys: list[bytes | None] = []
    sequence = 0
    for offset in range(0, 1000, 100):
        taken = producer.take()
        if not taken:
            break
        assert list(taken) == [0], "one batch of the partition at a time"
        base_sequence, held = _read(taken[0])
        assert base_sequence == sequence
        sequence += len(held)
        keys += held
        taken[0].done(base_offset=offset)
        await _settled()
    assert keys == [r.key for r in records]
    outcomes = [q.outcome() for q in queued if isinstance(q, QueuedRecord)]
    offsets = [o.offset for o in outcomes if isinstance(o, SentRecord)]
    assert len(offsets) == len(records)
    assert offsets == sorted(offsets)


async def test_a_shared_batch_send_batch_refuses_fails_its_records_unappended() -> None:
    producer = _AccumulatorProducer(errors={1: TopicAuthorizationFailedError()})
    shared = SharedBatches(producer)
    kept, refused, keyless = shared.add(
        "t", [_record(0, b"a"), _record(1, b"b"), OutgoingKafkaRecord(0, None, None, [])]
    )
    await _settled()
    assert _failure(keyless) == ("a tombstone needs a key", False, False)
    assert isinstance(refused, QueuedRecord)
    assert refused.batch.done()
    assert _failure(refused.batch.exception())[1:] == (False, True)
    assert isinstance(kept, QueuedRecord)
    assert not kept.batch.done()
    assert list(producer.take()) == [0]


async def test_a_partition_whose_batch_expired_queues_its_next_batches() -> None:
    # The sender fails a batch that found no leader within its time to live, and takes
    # it off the partition's queue: the records of the batch waiting behind it go out.
    producer, records, queued = await _past_the_batch_size(6)
    accumulator = producer._message_accumulator
    [expired] = accumulator._batches[TopicPartition("t", 0)]
    accumulator._pop_batch(TopicPartition("t", 0))
    expired.failure(KafkaTimeoutError("expired without a leader"))
    await _settled()
    [following] = producer.take().values()
    following.done(base_offset=0)
    await _settled()
    writes = _writes()
    outcomes = [writes._queued_outcome(q) for q in queued]
    failed = [o for o in outcomes if isinstance(o, SendFailed)]
    landed = [o for o in outcomes if isinstance(o, SentRecord)]
    assert failed, "the expired batch held records"
    assert landed, "the batch behind it held records"
    assert outcomes == failed + landed, "a partition's records out of their order"
    assert all(o.maybe_appended for o in failed), "an expired batch may have been appended"
    assert [o.offset for o in landed] == list(range(len(landed)))
    assert _read(following)[1] == [r.key for r in records[len(failed) :]]


async def test_a_partition_written_once_holds_nothing_once_delivered() -> None:
    producer = _AccumulatorProducer()
    shared = SharedBatches(producer)
    shared.add("t", [_record(0, b"a"), _record(1, b"b")])
    await _settled()
    for batch in producer.take().values():
        batch.done(base_offset=0)
    await _settled()
    assert shared._partitions == {}
    assert shared._tasks == set()


def _writes() -> KafkaWrites:
    settings = KafkaSettings(request_timeout_ms=250)
    connection = ConnectionState()
    return KafkaWrites(settings, connection, KafkaAdmin(settings, connection))


async def test_a_record_of_an_unanswered_batch_may_have_been_appended() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        batch: asyncio.Future[Any] = loop.create_future()
        outcome = _writes()._queued_outcome(QueuedRecord(batch, 0, 5))
        assert _failure(outcome) == ("no acknowledgement within 0.25 s", True, False)
        # Answered later, when nobody waits: its error is not reported as never retrieved.
        batch.set_exception(KafkaTimeoutError())
        await asyncio.sleep(0)
        del batch, outcome
        gc.collect()
    finally:
        loop.set_exception_handler(handler)
    assert reported == []


@pytest.mark.parametrize(
    ("error", "maybe_appended", "not_authorized"),
    [
        # The broker refused the batch: not retried, not appended.
        (MessageSizeTooLargeError(), False, False),
        (TopicAuthorizationFailedError(), False, True),
        # Retriable errors retried until the batch expired: an attempt may have landed.
        (NotLeaderForPartitionError(), True, False),
        (KafkaTimeoutError("expired"), True, False),
        # Never queued (send_batch refused it, or the producer closed first).
        (SendFailed("the producer closed", maybe_appended=False), False, False),
    ],
)
async def test_a_failed_batch_says_whether_its_records_may_have_been_appended(
    error: Exception, maybe_appended: bool, not_authorized: bool
) -> None:
    batch: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    batch.set_exception(error)
    outcome = _writes()._queued_outcome(QueuedRecord(batch, 0, 5))
    assert isinstance(outcome, SendFailed)
    assert outcome.message == str(error)
    assert (outcome.maybe_appended, outcome.not_authorized) == (maybe_appended, not_authorized)


@pytest.mark.parametrize(("stamped", "kept"), [(1_700_000_000_000, 1_700_000_000_000), (-1, 5)])
async def test_a_record_of_a_delivered_batch_is_where_it_landed(stamped: int, kept: int) -> None:
    # LogAppendTime as the broker stamped the batch; else the record's own CreateTime.
    batch: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    batch.set_result(SimpleNamespace(partition=1, offset=9, timestamp=stamped))
    landed = _writes()._queued_outcome(QueuedRecord(batch, 2, 5))
    assert isinstance(landed, SentRecord)
    assert (landed.partition, landed.offset, landed.timestamp_ms) == (1, 11, kept)


async def test_an_empty_batch_asks_nothing() -> None:
    # Not started: anything asked of Kafka would raise.
    assert await _writes().send_batch("orders", []) == []


async def test_a_batch_that_cannot_be_sent_fails_every_record_unappended() -> None:
    # Before start the connection is unavailable: every record fails, none is raised.
    records = [OutgoingKafkaRecord(p, b"k", b"v", []) for p in (0, 1)]
    outcomes = await _writes().send_batch("orders", records)
    assert [_failure(outcome) for outcome in outcomes] == [
        ("the Kafka connection is not started", False, False)
    ] * 2


# Waiting for metadata to show new partitions ----------------------------------------------


class _MetadataClient:
    """An aiokafka client whose metadata shows ``counts`` partitions, one refresh at a time."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = counts
        self.topics: list[str] = []
        self.refreshes = 0
        self.cluster = SimpleNamespace(partitions_for_topic=self._partitions)

    def _partitions(self, topic: str) -> set[int] | None:
        count = self.counts[min(self.refreshes, len(self.counts) - 1)]
        return None if count == 0 else set(range(count))

    def add_topic(self, topic: str) -> None:
        self.topics.append(topic)

    async def force_metadata_update(self) -> bool:
        self.refreshes += 1
        return True


async def test_the_wait_ends_once_the_metadata_shows_the_partitions() -> None:
    client = _MetadataClient([0, 4, 6])
    await await_partition_count(client, "orders", 6, 5.0, backoff_s=0.001)
    assert client.topics == ["orders"]  # the client is asked to follow the topic
    assert client.refreshes == 2


async def test_partitions_already_shown_need_no_refresh() -> None:
    client = _MetadataClient([8])
    await await_partition_count(client, "orders", 6, 5.0, backoff_s=0.001)
    assert client.refreshes == 0


async def test_partitions_never_shown_are_unavailable_after_the_timeout() -> None:
    client = _MetadataClient([4])
    with pytest.raises(KafkaUnavailable, match="the metadata does not show 6 partitions of orders"):
        await await_partition_count(client, "orders", 6, 0.05, backoff_s=0.01)
    assert client.refreshes >= 2


# The partition count an unmanaged topic is routed by ---------------------------------------


class _CountingAdmin:
    """KafkaAdmin's partition count, answered from ``counts``, each question recorded."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.asked: list[str] = []

    async def partition_count(self, topic: str) -> int:
        self.asked.append(topic)
        if topic not in self.counts:
            raise UnknownTopic(f"topic {topic} does not exist")
        return self.counts[topic]


def _writes_over(client: _MetadataClient, admin: _CountingAdmin) -> KafkaWrites:
    connection = ConnectionState()
    connection.clients = _Clients(
        producer=SimpleNamespace(client=client), admin=None, consumer=None
    )
    return KafkaWrites(KafkaSettings(), connection, cast(KafkaAdmin, admin))


async def test_a_topic_in_the_producers_metadata_is_routed_by_its_count_without_a_request() -> None:
    admin = _CountingAdmin({"plain": 9})
    writes = _writes_over(_MetadataClient([5]), admin)
    assert await writes.routing_partition_count("plain") == 5
    assert await writes.routing_partition_count("plain") == 5
    assert admin.asked == []


async def test_a_topic_the_producer_does_not_know_is_asked_of_kafka_and_followed() -> None:
    client = _MetadataClient([0])
    admin = _CountingAdmin({"plain": 4})
    writes = _writes_over(client, admin)
    assert await writes.routing_partition_count("plain") == 4
    assert admin.asked == ["plain"]
    assert client.topics == ["plain"]  # later requests read the producer's metadata


async def test_a_topic_kafka_does_not_have_is_unknown_and_not_followed() -> None:
    client = _MetadataClient([0])
    writes = _writes_over(client, _CountingAdmin({}))
    with pytest.raises(UnknownTopic, match="topic plain does not exist"):
        await writes.routing_partition_count("plain")
    assert client.topics == []


# Partitions added to a transaction ahead of their records -----------------------------------


def _transactional_producer(shown: int) -> SimpleNamespace:
    """What ``add_partitions_ahead`` reaches of an aiokafka producer: aiokafka's own
    TransactionManager (this fails if aiokafka renames what it calls) and the metadata."""
    manager = TransactionManager("ordered-host-1-0", 60_000)
    manager.set_pid_and_epoch(1, 0)
    client = _MetadataClient([shown])
    return SimpleNamespace(_txn_manager=manager, client=client)


async def test_partitions_are_added_ahead_only_within_a_transaction() -> None:
    producer = _transactional_producer(shown=6)
    assert add_partitions_ahead(producer, "orders", [1, 2]) == 0
    assert not producer._txn_manager.partitions_to_add()

    producer._txn_manager.begin_transaction()
    assert add_partitions_ahead(producer, "orders", [1, 2]) == 2
    assert producer._txn_manager.partitions_to_add() == {
        TopicPartition("orders", 1),
        TopicPartition("orders", 2),
    }


async def test_a_partition_the_metadata_does_not_show_is_not_added_ahead() -> None:
    producer = _transactional_producer(shown=3)
    producer._txn_manager.begin_transaction()
    assert add_partitions_ahead(producer, "orders", [2, 3, 7]) == 1
    assert producer._txn_manager.partitions_to_add() == {TopicPartition("orders", 2)}


async def test_a_transaction_is_begun_ahead_only_where_beginning_waits_for_nothing() -> None:
    producer = _transactional_producer(shown=3)
    assert ready_to_begin(producer)
    producer._txn_manager.begin_transaction()
    assert not ready_to_begin(producer), "a transaction is open"
    without_id = SimpleNamespace(_txn_manager=TransactionManager("t", 60_000))
    assert not ready_to_begin(without_id), "beginning would wait for the producer id"
