"""The audit emitter (``sidecar.audit.emitter``): what reaches the audit topic, keyed and
in what order, and how every event that does not reach it is counted, through a fake of
the Kafka gateway that keeps what it was sent."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import pytest

from sidecar.adapters.kafka import (
    KafkaGateway,
    OutgoingKafkaRecord,
    SendFailed,
    SentRecord,
    TopicExists,
)
from sidecar.audit.emitter import AuditEmitter
from sidecar.audit.events import Event, admin, committed
from sidecar.config import AuditSettings
from sidecar.core.errors import KafkaUnavailable, SidecarError
from sidecar.core.routing import default_partition
from sidecar.metrics import SidecarMetrics

TOPIC = "audit-topic"


class Kafka:
    """The gateway's calls the emitter makes. ``existing``: the audit topic is already
    there with that many partitions; ``errors``: raised by the next sends, in turn;
    ``refused``: the audit ``seq`` numbers whose records fail one by one."""

    def __init__(
        self,
        *,
        existing: int | None = None,
        errors: Sequence[SidecarError] = (),
        refused: frozenset[int] = frozenset(),
    ) -> None:
        self.existing = existing
        self.errors = list(errors)
        self.refused = refused
        self.created: list[tuple[str, int, int, bool]] = []
        self.counted: list[str] = []
        self.batches: list[tuple[str, list[OutgoingKafkaRecord]]] = []

    async def create_topic(
        self,
        topic: str,
        partitions: int,
        replication_factor: int,
        *,
        compacted: bool,
        configs: Any = None,
    ) -> None:
        self.created.append((topic, partitions, replication_factor, compacted))
        if self.existing is not None:
            raise TopicExists(topic)

    async def existing_partition_count(self, topic: str) -> int:
        self.counted.append(topic)
        assert self.existing is not None
        return self.existing

    async def send_batch(
        self, topic: str, records: Sequence[OutgoingKafkaRecord]
    ) -> list[SentRecord | SendFailed]:
        self.batches.append((topic, list(records)))
        if self.errors:
            raise self.errors.pop(0)
        outcomes: list[SentRecord | SendFailed] = []
        for offset, record in enumerate(records):
            if value_of(record)["seq"] in self.refused:
                outcomes.append(SendFailed("record too large", maybe_appended=False))
            else:
                outcomes.append(SentRecord(record.partition, offset))
        return outcomes

    @property
    def records(self) -> list[OutgoingKafkaRecord]:
        return [record for _, batch in self.batches for record in batch]

    @property
    def seqs(self) -> list[int]:
        return [value_of(record)["seq"] for record in self.records]


def value_of(record: OutgoingKafkaRecord) -> dict[str, Any]:
    assert record.value is not None
    value = json.loads(record.value)
    assert isinstance(value, dict)
    return value


def settings(**overrides: Any) -> AuditSettings:
    chosen: dict[str, Any] = {"enabled": True, "topic": TOPIC} | overrides
    return AuditSettings(**chosen)


def emitter(kafka: Kafka, audit: AuditSettings, *, replication_factor: int = 3) -> AuditEmitter:
    return AuditEmitter(
        audit,
        "sidecar-a",
        cast(KafkaGateway, kafka),
        SidecarMetrics(),
        replication_factor=replication_factor,
    )


def sent_count(audit: AuditEmitter) -> float | None:
    return audit.metrics.registry.get_sample_value("sidecar_audit_events_total")


def dropped_count(audit: AuditEmitter) -> float | None:
    return audit.metrics.registry.get_sample_value("sidecar_audit_events_dropped_total")


def event(topic: str = "orders", partition: int = 0, offset: int = 0) -> Event:
    return committed(group="g", instance="i", topic=topic, partition=partition, offset=offset)


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


# Disabled -----------------------------------------------------------------------------------


async def test_a_disabled_emitter_creates_no_topic_and_sends_nothing() -> None:
    kafka = Kafka()
    audit = emitter(kafka, settings(enabled=False))
    assert audit.enabled is False
    await audit.start()
    audit.emit(event())
    await asyncio.sleep(0.05)
    await audit.stop()
    assert kafka.created == []
    assert kafka.batches == []
    assert (sent_count(audit), dropped_count(audit)) == (0.0, 0.0)


# The audit topic -------------------------------------------------------------------------------


@pytest.mark.parametrize(("asked", "used"), [(1, 1), (2, 2), (3, 3), (5, 3)])
async def test_start_creates_the_audit_topic_uncompacted_with_at_most_three_replicas(
    asked: int, used: int
) -> None:
    kafka = Kafka()
    audit = emitter(kafka, settings(partitions=4), replication_factor=asked)
    await audit.start()
    try:
        assert kafka.created == [(TOPIC, 4, used, False)]
        assert kafka.counted == []
    finally:
        await audit.stop()


async def test_an_existing_audit_topic_is_written_by_its_own_partition_count() -> None:
    kafka = Kafka(existing=2)
    audit = emitter(kafka, settings(partitions=6))
    events = [event("orders", partition) for partition in range(8)]
    keys = [f"orders/{partition}".encode() for partition in range(8)]
    # Otherwise the test could not tell 2 partitions from 6.
    assert any(default_partition(k, 2) != default_partition(k, 6) for k in keys)
    await audit.start()
    try:
        for item in events:
            audit.emit(item)
        await until(lambda: len(kafka.records) == len(events))
    finally:
        await audit.stop()
    assert kafka.counted == [TOPIC]
    assert [record.partition for record in kafka.records] == [default_partition(k, 2) for k in keys]


async def test_a_start_whose_topic_creation_fails_raises_and_sends_nothing() -> None:
    class Unreachable(Kafka):
        async def create_topic(self, *args: Any, **kwargs: Any) -> None:
            raise KafkaUnavailable("no broker answered")

    kafka = Unreachable()
    audit = emitter(kafka, settings())
    with pytest.raises(KafkaUnavailable, match="no broker answered"):
        await audit.start()
    audit.emit(event())
    await asyncio.sleep(0.05)
    await audit.stop()
    assert kafka.batches == []


# What is sent ----------------------------------------------------------------------------------


async def test_an_emitted_event_is_sent_stamped_as_compact_json() -> None:
    kafka = Kafka()
    audit = emitter(kafka, settings())
    await audit.start()
    before = time.time()
    try:
        audit.emit(event("orders", 3, 41))
        await until(lambda: len(kafka.records) == 1)
    finally:
        await audit.stop()
    [(topic, [record])] = kafka.batches
    assert topic == TOPIC
    assert record.value is not None
    assert b" " not in record.value  # compact: no space after , and :
    value = value_of(record)
    assert before <= value.pop("time") <= time.time()
    assert value == {
        "schema": 1,
        "sidecar": "sidecar-a",
        "seq": 0,
        "type": "committed",
        "group": "g",
        "instance": "i",
        "topic": "orders",
        "partition": 3,
        "offset": 41,
    }
    assert record.headers == []
    assert record.timestamp_ms is None
    assert (sent_count(audit), dropped_count(audit)) == (1.0, 0.0)


async def test_events_are_keyed_and_partitioned_by_what_they_are_about() -> None:
    kafka = Kafka()
    audit = emitter(kafka, settings(partitions=6))
    emitted = [
        event("orders", 0),
        event("orders", 5),
        event("payments", 0),
        # An admin event is about a topic, not a partition.
        admin(topic="orders", kind="expand", result="ok", from_count=2, target_count=4),
        {"type": "about_nothing"},
    ]
    await audit.start()
    try:
        for item in emitted:
            audit.emit(item)
        await until(lambda: len(kafka.records) == len(emitted))
    finally:
        await audit.stop()
    keys = [b"orders/0", b"orders/5", b"payments/0", b"orders/", b"/"]
    assert [record.key for record in kafka.records] == keys
    assert [record.partition for record in kafka.records] == [
        default_partition(key, 6) for key in keys
    ]


async def test_one_partitions_events_all_go_to_one_audit_partition() -> None:
    kafka = Kafka()
    audit = emitter(kafka, settings(partitions=6))
    await audit.start()
    try:
        for offset in range(20):
            audit.emit(event("orders", 1, offset))
        await until(lambda: len(kafka.records) == 20)
    finally:
        await audit.stop()
    assert {record.partition for record in kafka.records} == {default_partition(b"orders/1", 6)}
    assert [value_of(record)["offset"] for record in kafka.records] == list(range(20))


async def test_events_are_sent_in_emission_order_with_consecutive_seq() -> None:
    kafka = Kafka()
    audit = emitter(kafka, settings(batch_size=4))
    await audit.start()
    try:
        for offset in range(10):
            audit.emit(event(offset=offset))
        await until(lambda: len(kafka.records) == 10)
        # Emitted while the sender is idle: it picks the next ones up.
        await asyncio.sleep(0.02)
        for offset in range(10, 15):
            audit.emit(event(offset=offset))
            await asyncio.sleep(0)
        await until(lambda: len(kafka.records) == 15)
    finally:
        await audit.stop()
    assert kafka.seqs == list(range(15))
    assert [value_of(record)["offset"] for record in kafka.records] == list(range(15))
    assert all(len(batch) <= 4 for _, batch in kafka.batches)
    assert sent_count(audit) == 15.0


async def test_events_waiting_together_are_sent_in_batches_of_batch_size() -> None:
    kafka = Kafka()
    audit = emitter(kafka, settings(batch_size=2))
    await audit.start()
    try:
        # All five wait in the queue before the sender first runs.
        for offset in range(5):
            audit.emit(event(offset=offset))
        await until(lambda: len(kafka.records) == 5)
    finally:
        await audit.stop()
    assert [[value_of(r)["seq"] for r in batch] for _, batch in kafka.batches] == [
        [0, 1],
        [2, 3],
        [4],
    ]


# What is not sent, counted ---------------------------------------------------------------------


async def test_a_full_buffer_drops_the_event_counts_it_and_leaves_a_seq_gap() -> None:
    kafka = Kafka()
    audit = emitter(kafka, settings(buffer_size=3))
    await audit.start()
    try:
        for offset in range(5):
            audit.emit(event(offset=offset))  # returns at once, also when full
        assert dropped_count(audit) == 2.0
        await until(lambda: len(kafka.records) == 3)
        audit.emit(event(offset=5))
        await until(lambda: len(kafka.records) == 4)
    finally:
        await audit.stop()
    # seq 3 and 4 were the dropped events: the audit sees the gap.
    assert kafka.seqs == [0, 1, 2, 5]
    assert [value_of(record)["offset"] for record in kafka.records] == [0, 1, 2, 5]
    assert (sent_count(audit), dropped_count(audit)) == (4.0, 2.0)


async def test_a_batch_kafka_refuses_is_counted_dropped_and_sending_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kafka = Kafka(errors=[KafkaUnavailable("leader not available")])
    audit = emitter(kafka, settings(batch_size=10))
    await audit.start()
    try:
        with caplog.at_level(logging.WARNING, logger="sidecar.audit.emitter"):
            for offset in range(3):
                audit.emit(event(offset=offset))
            await until(lambda: len(kafka.batches) == 1)
            await until(lambda: dropped_count(audit) == 3.0)
        audit.emit(event(offset=3))
        await until(lambda: len(kafka.batches) == 2)
        await until(lambda: sent_count(audit) == 1.0)
    finally:
        await audit.stop()
    assert [value_of(r)["seq"] for r in kafka.batches[1][1]] == [3]
    assert (sent_count(audit), dropped_count(audit)) == (1.0, 3.0)
    # Only this logger: a Kafka client left closing by an earlier test of the same process
    # may log a dropped connection while this one runs.
    assert [
        record.getMessage() for record in caplog.records if record.name == "sidecar.audit.emitter"
    ] == ["audit batch of 3 events lost: leader not available"]


async def test_records_kafka_fails_one_by_one_are_counted_dropped() -> None:
    kafka = Kafka(refused=frozenset({1, 3}))
    audit = emitter(kafka, settings(batch_size=10))
    await audit.start()
    try:
        for offset in range(5):
            audit.emit(event(offset=offset))
        await until(lambda: (sent_count(audit) or 0) + (dropped_count(audit) or 0) == 5)
    finally:
        await audit.stop()
    assert (sent_count(audit), dropped_count(audit)) == (3.0, 2.0)


# Stopping ------------------------------------------------------------------------------------


async def test_stop_sends_what_is_still_queued_in_order() -> None:
    kafka = Kafka()
    audit = emitter(kafka, settings(batch_size=2))
    await audit.start()
    for offset in range(5):
        audit.emit(event(offset=offset))
    # No pause before stop: the background sender has not taken anything yet.
    await audit.stop()
    assert kafka.seqs == [0, 1, 2, 3, 4]
    assert all(len(batch) <= 2 for _, batch in kafka.batches)
    assert sent_count(audit) == 5.0


async def test_after_stop_nothing_more_is_sent() -> None:
    kafka = Kafka()
    audit = emitter(kafka, settings())
    await audit.start()
    audit.emit(event(offset=0))
    await until(lambda: len(kafka.records) == 1)
    await audit.stop()
    audit.emit(event(offset=1))
    await asyncio.sleep(0.05)
    assert kafka.seqs == [0]


async def test_stop_before_start_and_stop_twice_are_harmless() -> None:
    kafka = Kafka()
    audit = emitter(kafka, settings())
    await audit.stop()
    await audit.start()
    audit.emit(event())
    await audit.stop()
    await audit.stop()
    assert kafka.seqs == [0]


class SlowKafka(Kafka):
    """A gateway whose sends take ``delay_s``."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    async def send_batch(
        self, topic: str, records: Sequence[OutgoingKafkaRecord]
    ) -> list[SentRecord | SendFailed]:
        await asyncio.sleep(self.delay_s)
        return await super().send_batch(topic, records)


async def test_stop_lets_a_batch_being_sent_finish_and_counts_it() -> None:
    # The batch is on its way when stop() comes: it is neither cut off nor left uncounted.
    kafka = SlowKafka(0.05)
    audit = emitter(kafka, settings(batch_size=2))
    await audit.start()
    for offset in range(5):
        audit.emit(committed(group="g", instance="i", topic="t", partition=0, offset=offset))
    await asyncio.sleep(0.01)
    await audit.stop()
    assert kafka.seqs == [0, 1, 2, 3, 4]
    assert sent_count(audit) == 5
    assert dropped_count(audit) == 0


class BrokenKafka(Kafka):
    """A gateway whose first send fails with an error outside its contract."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 1

    async def send_batch(
        self, topic: str, records: Sequence[OutgoingKafkaRecord]
    ) -> list[SentRecord | SendFailed]:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("unexpected")
        return await super().send_batch(topic, records)


async def test_an_unexpected_send_failure_is_counted_and_sending_goes_on() -> None:
    kafka = BrokenKafka()
    audit = emitter(kafka, settings(batch_size=1))
    await audit.start()
    audit.emit(committed(group="g", instance="i", topic="t", partition=0, offset=0))
    audit.emit(committed(group="g", instance="i", topic="t", partition=0, offset=1))
    await audit.stop()
    assert kafka.seqs == [1]
    assert sent_count(audit) == 1
    assert dropped_count(audit) == 1
