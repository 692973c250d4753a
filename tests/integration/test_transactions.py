"""The transactional writer and the fence against the real cluster.

What the zombie argument (DESIGN §5) takes from Kafka, checked here rather than
assumed: a fenced producer's open transaction is aborted and its later writes refused;
a read-committed reader never sees an aborted record; the last stable offset stops at
an open transaction and passes it once it has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError
from aiokafka.errors import ProducerFenced as KafkaProducerFenced

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import read_all
from ordered_dev.harness.waiting import eventually
from sidecar.adapters import partition_warmer
from sidecar.adapters.kafka import (
    KafkaGateway,
    OutgoingKafkaRecord,
    SendFailed,
    SentRecord,
    start_transactional_producer,
)
from sidecar.adapters.partition_warmer import PartitionWarmer
from sidecar.adapters.transactions import TransactionalWriter
from sidecar.config import KafkaSettings

MANY = 200
"""Writes of the lanes test's concurrent phase."""


def _settings(cluster: ClusterEndpoints) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=cluster.kafka_bootstrap, request_timeout_ms=10_000)


@pytest.fixture
async def gateway(cluster: ClusterEndpoints) -> AsyncIterator[KafkaGateway]:
    gateway = KafkaGateway(_settings(cluster))
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()


async def _topic(gateway: KafkaGateway, cluster: ClusterEndpoints, partitions: int = 2) -> str:
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    await gateway.create_topic(topic, partitions, cluster.replication_factor, compacted=False)
    return topic


async def _read_committed(cluster: ClusterEndpoints, topic: str, partition: int) -> list[bytes]:
    records = (await read_all(cluster, topic, partition + 1))[partition]
    return [record.value for record in records if record.value is not None]


def _record(partition: int, value: bytes) -> OutgoingKafkaRecord:
    return OutgoingKafkaRecord(partition, b"k", value, [])


async def test_concurrent_writes_share_transactions_and_keep_their_order(
    cluster: ClusterEndpoints, gateway: KafkaGateway
) -> None:
    topic = await _topic(gateway, cluster)
    writer = TransactionalWriter(_settings(cluster), [f"test-{uuid.uuid4().hex[:8]}"])
    await writer.start()
    try:
        results = await asyncio.gather(
            *(
                writer.write(topic, [_record(0, b"%d-%d" % (i, j)) for j in range(3)])
                for i in range(40)
            )
        )
    finally:
        await writer.stop()
    outcomes = [outcome for result in results for outcome in result.outcomes]
    assert all(isinstance(outcome, SentRecord) for outcome in outcomes), outcomes
    assert all(result.final.done() for result in results)
    # Requests that arrived while a transaction committed went into the next one.
    assert 1 <= writer.transactions < 40
    values = await _read_committed(cluster, topic, 0)
    assert sorted(values) == sorted(b"%d-%d" % (i, j) for i in range(40) for j in range(3))
    for i in range(40):
        mine = [v for v in values if v.startswith(b"%d-" % i)]
        assert mine == [b"%d-%d" % (i, j) for j in range(3)]
    # Each transaction ends with a marker: the stable offset is past the last record.
    [end, _] = await gateway.end_offsets(topic, 2)
    last = max(o.offset for o in outcomes if isinstance(o, SentRecord))
    assert end == last + 2, "the reads above waited for the stable offset to reach the end"


async def test_transactions_taking_turns_over_lanes_keep_the_order_of_admission(
    cluster: ClusterEndpoints, gateway: KafkaGateway
) -> None:
    """With several transactional ids, a transaction is appended while the one before it
    commits; within a partition the offsets still follow the order the writes came in."""
    topic = await _topic(gateway, cluster)
    base = f"lanes-{uuid.uuid4().hex[:8]}"
    writer = TransactionalWriter(_settings(cluster), [f"{base}~{lane}" for lane in range(3)])
    await writer.start()
    try:
        # One at a time: each transaction on the next lane, twice round.
        alone = [await writer.write(topic, [_record(0, b"alone-%d" % i)]) for i in range(6)]

        # Many in flight, each queued as soon as the one before was taken into a
        # transaction: a transaction each, appended while the one before commits.
        writes = []
        for i in range(MANY):
            writes.append(
                asyncio.create_task(writer.write(topic, [_record(i % 2, b"many-%d" % i)]))
            )
            await asyncio.sleep(0)  # the write queues itself
            # Taken into a transaction: the next write goes into the next one, at once.
            while writer._queue:  # noqa: ASYNC110 (the writer tells nobody)
                await asyncio.sleep(0)
        many = await asyncio.gather(*writes)
    finally:
        await writer.stop()
    outcomes = [result.outcomes[0] for result in (*alone, *many)]
    assert all(isinstance(outcome, SentRecord) for outcome in outcomes), outcomes
    assert writer.transactions == 6 + MANY
    # The writes queued while the one before was appended had their partitions added to
    # their transaction ahead of their records: the order below holds with that too.
    assert writer.partitions_added_ahead > 0
    for partition in (0, 1):
        offsets = [
            o.offset for o in outcomes if isinstance(o, SentRecord) and o.partition == partition
        ]
        assert offsets == sorted(offsets), f"partition {partition}: offsets out of admission order"
    assert await _read_committed(cluster, topic, 0) == [b"alone-%d" % i for i in range(6)] + [
        b"many-%d" % i for i in range(0, MANY, 2)
    ]
    assert await _read_committed(cluster, topic, 1) == [b"many-%d" % i for i in range(1, MANY, 2)]


async def test_a_failed_commit_aborts_the_transaction_appended_after_it(
    cluster: ClusterEndpoints, gateway: KafkaGateway
) -> None:
    """The next transaction, appended on another lane while one commits, must not commit if
    that one fails: a record acknowledged after one that was not could be overtaken by
    the retry of the earlier one. It is aborted, and the writer retires."""
    topic = await _topic(gateway, cluster)
    retired: list[str] = []
    base = f"abort-{uuid.uuid4().hex[:8]}"
    settings = KafkaSettings(bootstrap_servers=cluster.kafka_bootstrap, request_timeout_ms=5_000)
    writer = TransactionalWriter(
        settings, [base, f"{base}~1"], on_fenced=lambda: retired.append("retired")
    )
    await writer.start()
    try:
        assert (await writer.write(topic, [_record(1, b"before")])).outcomes == [SentRecord(1, 0)]
        # The next transaction goes to the second lane: its commit is cut off.
        producer = writer._lanes[1].producer
        commit_begun = asyncio.Event()

        async def commit_cut_off() -> None:
            commit_begun.set()
            await asyncio.sleep(1.0)
            raise KafkaConnectionError("cut off")

        producer.commit_transaction = commit_cut_off
        first = asyncio.create_task(writer.write(topic, [_record(1, b"first")]))
        await asyncio.wait_for(commit_begun.wait(), 10)
        # Appended on the first lane while the second commits, then aborted.
        second = await writer.write(topic, [_record(1, b"second")])
        first_result = await first
        [failed_first] = first_result.outcomes
        [failed_second] = second.outcomes
        assert isinstance(failed_first, SendFailed), failed_first
        assert failed_first.maybe_appended  # the commit may have gone out
        assert isinstance(failed_second, SendFailed), failed_second
        assert (failed_second.maybe_appended, failed_second.retriable) == (False, True)
        for result in (first_result, second):
            await asyncio.wait_for(result.final, 20)
        assert (writer.fenced, retired) == (True, ["retired"])
        [later] = (await writer.write(topic, [_record(1, b"later")])).outcomes
        assert isinstance(later, SendFailed)
        assert not later.maybe_appended
    finally:
        await writer.stop()
    # Neither became visible: the first was aborted when its id was re-initialised, the
    # second by the writer.
    assert await _read_committed(cluster, topic, 1) == [b"before"]


async def test_a_fenced_writer_fails_closed_and_writes_nothing_more(
    cluster: ClusterEndpoints, gateway: KafkaGateway
) -> None:
    topic = await _topic(gateway, cluster)
    fenced: list[str] = []
    transactional_id = f"test-{uuid.uuid4().hex[:8]}"
    writer = TransactionalWriter(
        _settings(cluster), [transactional_id], on_fenced=lambda: fenced.append("fenced")
    )
    await writer.start()
    try:
        first = await writer.write(topic, [_record(1, b"before")])
        assert first.outcomes == [SentRecord(1, 0)]
        await gateway.fence_producer(transactional_id)
        after = await writer.write(topic, [_record(1, b"after")])
        [failed] = after.outcomes
        assert isinstance(failed, SendFailed)
        assert (failed.maybe_appended, failed.retriable) == (False, True)
        assert "fenced" in failed.message
        assert (writer.fenced, fenced) == (True, ["fenced"])
        # Fail closed: a later write is refused at once, without reaching Kafka.
        [again] = (await writer.write(topic, [_record(1, b"later")])).outcomes
        assert isinstance(again, SendFailed)
        assert not again.maybe_appended
    finally:
        await writer.stop()
    assert await _read_committed(cluster, topic, 1) == [b"before"]


async def test_a_writer_that_settled_a_doubt_writes_nothing_more(
    cluster: ClusterEndpoints, gateway: KafkaGateway
) -> None:
    """A sidecar resuming from a pause finds its commit timed out (the clock ran on while
    it was stopped) and settles the doubt by re-initialising its id, which also takes
    the id back from the coordinator that fenced it meanwhile. Writing on under the id
    would put records across a barrier it never saw; the writer retires instead."""
    topic = await _topic(gateway, cluster)
    retired: list[str] = []
    transactional_id = f"paused-{uuid.uuid4().hex[:8]}"
    settings = KafkaSettings(bootstrap_servers=cluster.kafka_bootstrap, request_timeout_ms=3_000)
    writer = TransactionalWriter(
        settings, [transactional_id], on_fenced=lambda: retired.append("retired")
    )
    await writer.start()
    try:
        first = await writer.write(topic, [_record(1, b"before")])
        assert first.outcomes == [SentRecord(1, 0)]
        producer = writer._lanes[0].producer
        commit = producer.commit_transaction

        async def commit_after_the_pause() -> None:
            # The records are appended and the commit begun when the process stops; the
            # coordinator fences the id meanwhile ...
            await gateway.fence_producer(transactional_id)
            # ... and the commit answers only after its timeout, as a commit begun just
            # before a pause does once the process runs again.
            await asyncio.sleep(4.0)
            await commit()

        producer.commit_transaction = commit_after_the_pause
        [in_doubt] = (await writer.write(topic, [_record(1, b"in doubt")])).outcomes
        assert isinstance(in_doubt, SendFailed), in_doubt
        # Queued while the doubt is being settled: the id is re-initialised meanwhile.
        [after] = (await writer.write(topic, [_record(1, b"after")])).outcomes
        assert isinstance(after, SendFailed), after
        assert (after.maybe_appended, after.retriable) == (False, True)
        assert (writer.fenced, retired) == (True, ["retired"])
        [later] = (await writer.write(topic, [_record(1, b"later")])).outcomes
        assert isinstance(later, SendFailed)
    finally:
        await writer.stop()
    assert await _read_committed(cluster, topic, 1) == [b"before"]


async def test_the_fence_aborts_an_open_transaction_and_the_stable_offset_passes_it(
    cluster: ClusterEndpoints, gateway: KafkaGateway
) -> None:
    """A zombie with a transaction open (records sent, never committed): the stable offset
    stops before its records; the fence aborts them and lets the stable offset pass; what
    the zombie sends or commits afterwards is refused; a read-committed reader sees none
    of it."""
    topic = await _topic(gateway, cluster)
    transactional_id = f"zombie-{uuid.uuid4().hex[:8]}"
    settings = _settings(cluster)
    committed = TransactionalWriter(settings, [f"live-{uuid.uuid4().hex[:8]}"])
    await committed.start()
    zombie = AIOKafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap, transactional_id=transactional_id
    )
    await zombie.start()
    try:
        assert (await committed.write(topic, [_record(0, b"live-1")])).outcomes == [
            SentRecord(0, 0)
        ]

        # Kafka writes the commit marker after it answers the commit: wait for it, so
        # that the zombie's record lands after it.
        async def stable_at_two() -> bool:
            return (await gateway.end_offsets(topic, 2))[0] == 2

        await eventually(stable_at_two, 10, "live-1's commit marker is written")
        await zombie.begin_transaction()
        sent = await (await zombie.send(topic, b"zombie-1", key=b"k", partition=0))
        assert sent.offset == 2  # after live-1 and its commit marker
        assert (await committed.write(topic, [_record(0, b"live-2")])).outcomes == [
            SentRecord(0, 3)
        ]
        # The open transaction holds the stable offset at its first record.
        assert (await gateway.end_offsets(topic, 2))[0] == 2

        await gateway.fence_producer(transactional_id)

        # Aborted (marker at 5): the stable offset reaches the log end again (once live-2's
        # commit marker, at 4, is written too).
        async def stable_at_six() -> bool:
            return (await gateway.end_offsets(topic, 2))[0] == 6

        await eventually(stable_at_six, 10, "the stable offset passes the aborted transaction")
        later = await zombie.send(topic, b"zombie-2", key=b"k", partition=0)
        with pytest.raises(KafkaProducerFenced):
            await later
        with pytest.raises(KafkaProducerFenced):
            await zombie.commit_transaction()
    finally:
        await committed.stop()
        with contextlib.suppress(KafkaProducerFenced):
            await zombie.stop()
    assert await _read_committed(cluster, topic, 0) == [b"live-1", b"live-2"]


async def test_a_warm_up_that_fails_after_its_write_ends_its_transaction_at_once(
    cluster: ClusterEndpoints, gateway: KafkaGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm-up wrote to both partitions, then its abort was lost. Its transaction
    held the stable offsets at the warm-up's records until the transaction timeout (a
    minute here): read-committed consumers stopped there, and retirement took such a
    partition for empty while records past it were still to be read. Initialising the
    id anew at once aborts it."""
    topic = await _topic(gateway, cluster, partitions=3)
    settings = dataclasses.replace(_settings(cluster), transaction_timeout_ms=60_000)
    started: list[Any] = []

    async def start_losing_the_first_abort(settings: KafkaSettings, transactional_id: str) -> Any:
        producer = await start_transactional_producer(settings, transactional_id)
        if not started:

            async def abort_lost() -> None:
                raise KafkaTimeoutError()

            producer.abort_transaction = abort_lost
        started.append(producer)
        return producer

    monkeypatch.setattr(
        partition_warmer, "start_transactional_producer", start_losing_the_first_abort
    )
    warmer = PartitionWarmer(settings, f"test-{uuid.uuid4().hex[:8]}~warm", within_s=10)
    try:
        assert not await warmer.warm(topic, [1, 2])

        async def no_transaction_open() -> bool:
            stable = await gateway.end_offsets(topic, 3)
            return stable == await gateway.high_watermarks(topic, 3)

        # Bound: a quarter of the transaction timeout, which would have ended it too.
        await eventually(no_transaction_open, 15, "the warm-up's transaction is aborted")
        assert len(started) == 2
        # The aborted record and its marker in each warmed partition; nothing readable.
        assert await gateway.end_offsets(topic, 3) == [0, 2, 2]
        assert await _read_committed(cluster, topic, 2) == []
        # The fresh producer warms the next change as usual.
        assert await warmer.warm(topic, [1])
    finally:
        await warmer.stop()
