"""The Kafka gateway's write side: ``KafkaWrites``, the sends of the idempotent producer
(unmanaged topics, the audit topic) and the fencing of a transactional id; and what the
transactional writer (``sidecar.adapters.transactions``) builds on: queueing a
transaction's records in batches and reading their outcomes, starting a transactional
producer, how often a busy transaction coordinator is asked again, and the wait for a
producer's metadata to show new partitions."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import BrokerResponseError, KafkaError
from aiokafka.producer import sender as aiokafka_sender
from aiokafka.producer.transaction_manager import TransactionState
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from sidecar.adapters.kafka.admin import KafkaAdmin
from sidecar.adapters.kafka.clients import ConnectionState, _Clients, _close_all, client_settings
from sidecar.adapters.kafka.errors import _NOT_AUTHORIZED, FENCED_ERRORS, SendFailed
from sidecar.adapters.kafka_security import diagnose
from sidecar.config import KafkaSettings
from sidecar.core.errors import (
    KafkaNotAuthorized,
    KafkaUnavailable,
    ProducerFenced,
    SidecarError,
    UnknownPartition,
)

# One logger for the whole gateway: every module of the package logs as
# ``sidecar.adapters.kafka``.
_log = logging.getLogger(__package__)

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class SentRecord:
    """Where a record landed. Its position names it; the timestamp is what Kafka stamped."""

    partition: int
    offset: int
    timestamp_ms: int | None = field(default=None, compare=False)
    """CreateTime or LogAppendTime, as the producer reports it (not part of equality)."""


@dataclass(frozen=True, slots=True)
class OutgoingKafkaRecord:
    partition: int
    key: bytes | None
    value: bytes | None
    """None is a tombstone."""
    headers: Sequence[Header]
    timestamp_ms: int | None = None
    """None: the producer stamps the record when it is queued."""


class KafkaWrites:
    """The gateway's sends, through its idempotent producer, and the fencing of a
    transactional id. A topic not in the producer's metadata yet is asked of ``admin``
    first, whose metadata requests never create it."""

    def __init__(
        self, settings: KafkaSettings, connection: ConnectionState, admin: KafkaAdmin
    ) -> None:
        self._settings = settings
        self._timeout_s = settings.request_timeout_ms / 1000
        self._connection = connection
        self._admin = admin
        self._batches: SharedBatches | None = None

    def _require(self) -> _Clients:
        return self._connection.require()

    async def send(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header],
    ) -> SentRecord:
        """Append one record to ``partition`` (``value`` None: a tombstone).

        Raises UnknownTopic, UnknownPartition (not in metadata within the request
        timeout), SendFailed.
        """
        await self._await_partition(topic, partition)
        record = OutgoingKafkaRecord(partition, key, value, headers)
        [outcome] = await self._send_shared(topic, [record])
        if isinstance(outcome, SendFailed):
            raise outcome
        return outcome

    async def send_batch(
        self, topic: str, records: Sequence[OutgoingKafkaRecord]
    ) -> list[SentRecord | SendFailed]:
        """Send ``records`` in order and wait for all of them; one outcome per record.

        Never raises for a record: a topic or partition missing from metadata fails
        every record with ``maybe_appended`` False.
        """
        if not records:
            return []
        try:
            await self._await_partition(topic, max(record.partition for record in records))
        except SidecarError as exc:
            refused = isinstance(exc, KafkaNotAuthorized)
            return [
                SendFailed(exc.message, maybe_appended=False, not_authorized=refused)
                for _ in records
            ]
        return await self._send_shared(topic, records)

    async def _send_shared(
        self, topic: str, records: Sequence[OutgoingKafkaRecord]
    ) -> list[SentRecord | SendFailed]:
        # Written into the partitions' shared batches in order, so the records' order
        # holds within each partition; one wait on the batches' deliveries, not a task
        # and a timer per record (see bench/README.md).
        queued = self._shared_batches().add(topic, records)
        pending = {q.batch for q in queued if isinstance(q, QueuedRecord)}
        if pending:
            await asyncio.wait(pending, timeout=self._timeout_s)
        return [self._queued_outcome(q) for q in queued]

    def _shared_batches(self) -> SharedBatches:
        """The shared batches of the current producer (a reconnect starts a new one)."""
        producer = self._require().producer
        if self._batches is None or self._batches.producer is not producer:
            self._batches = SharedBatches(producer)
        return self._batches

    def _queued_outcome(self, queued: QueuedRecord | SendFailed) -> SentRecord | SendFailed:
        """What became of a record in a shared batch, once the batch is done or the wait
        timed out."""
        if isinstance(queued, SendFailed):
            return queued
        batch = queued.batch
        if not batch.done():
            batch.add_done_callback(_discard_outcome)
            return SendFailed(
                f"no acknowledgement within {self._timeout_s:g} s", maybe_appended=True
            )
        exc = None if batch.cancelled() else batch.exception()
        if exc is None:
            return queued.outcome()
        if isinstance(exc, SendFailed):
            return exc  # the batch was never queued
        return delivery_failure(exc)

    async def routing_partition_count(self, topic: str) -> int:
        """The partition count a plain Kafka producer routes ``topic``'s keyed records by:
        the one in the producer's metadata, which its client refreshes every
        ``metadata_max_age_ms``, as the Java producer's partitioner does.

        A metadata request per produce request cost an unmanaged produce a broker round
        trip and ~5 % of the sidecar's CPU (``bench/README.md``). A topic the producer
        does not know yet is asked of ``admin`` (which never creates it) and added to
        the producer's metadata. Raises UnknownTopic, KafkaUnavailable, KafkaFailure.
        """
        client = self._require().producer.client
        known = client.cluster.partitions_for_topic(topic)
        if known:
            return len(known)
        count = await self._admin.partition_count(topic)
        client.add_topic(topic)
        return count

    # ``timeout`` bounds a polling loop over shared metadata; nothing to cancel.
    async def wait_for_partition_count(
        self,
        topic: str,
        count: int,
        timeout: float,  # noqa: ASYNC109
    ) -> None:
        """Wait until the producer's metadata shows at least ``count`` partitions.

        Raises KafkaUnavailable on timeout.
        """
        await await_partition_count(
            self._require().producer.client,
            topic,
            count,
            timeout,
            backoff_s=self._settings.retry_backoff_s,
        )

    async def _await_partition(self, topic: str, partition: int) -> None:
        client = self._require().producer.client
        if client.cluster.partitions_for_topic(topic) is None:
            # Asked here first: the producer's metadata request could auto-create it.
            await self._admin.partition_count(topic)
            client.add_topic(topic)
        try:
            await self.wait_for_partition_count(topic, partition + 1, self._timeout_s)
        except KafkaUnavailable as exc:
            raise UnknownPartition(f"partition {partition} of {topic} does not exist") from exc

    async def fence_producer(self, transactional_id: str) -> None:
        """Fence whoever writes with ``transactional_id``: initialise it (which bumps its
        epoch, and completes or aborts its open transaction before it answers), then
        close again. Raises KafkaUnavailable."""
        began = time.monotonic()
        try:
            producer = await start_transactional_producer(self._settings, transactional_id)
        except ProducerFenced:
            return  # initialised by someone after us: fenced all the same
        try:
            await asyncio.wait_for(producer.stop(), self._timeout_s)
        except (KafkaError, TimeoutError) as exc:
            _log.info("closing the fencing producer of %s: %s", transactional_id, exc)
        _log.info("fenced %s in %.0f ms", transactional_id, 1000 * (time.monotonic() - began))


def delivery_failure(exc: BaseException) -> SendFailed:
    """A failed delivery of the idempotent producer as a SendFailed: whether its records
    may have been appended, and whether the principal was refused."""
    # What reaches the future (aiokafka 0.14 producer/sender.py,
    # SendProduceReqHandler.handle_response and _can_retry): with idempotence a
    # batch is retried while its error is `retriable`, so a BrokerResponseError
    # with retriable=False (MessageSizeTooLarge, RecordListTooLarge,
    # TopicAuthorizationFailed, InvalidRequiredAcks, UnknownError for codes
    # aiokafka lacks, ...) is the broker refusing the batch. Anything else (a batch
    # expired without a leader in message_accumulator.drain_by_nodes, a connection
    # error) may follow an attempt that reached the broker.
    refused = isinstance(exc, BrokerResponseError) and not exc.retriable
    return SendFailed(
        str(exc), maybe_appended=not refused, not_authorized=isinstance(exc, _NOT_AUTHORIZED)
    )


@dataclass(slots=True)
class QueuedRecord:
    """A record queued in a batch (``enqueue_all``): the batch's delivery, which says where
    the batch landed, and the record's place and timestamp in it."""

    batch: asyncio.Future[Any]
    index: int
    """Its offset relative to the batch's first record."""
    timestamp_ms: int
    """The CreateTime it was written with (Kafka reports the batch's LogAppendTime, if the
    topic uses that, instead)."""

    def outcome(self) -> SentRecord | SendFailed:
        """Where it landed, once ``batch`` is done; else, or if the batch failed, a
        SendFailed that may have been appended."""
        batch = self.batch
        if not batch.done():
            return SendFailed("no acknowledgement of its batch", maybe_appended=True)
        if batch.cancelled():
            return SendFailed("its batch was cancelled", maybe_appended=True)
        exc = batch.exception()
        if exc is not None:
            return SendFailed(str(exc), maybe_appended=True)
        metadata = batch.result()
        stamped = metadata.timestamp
        return SentRecord(
            metadata.partition,
            metadata.offset + self.index,
            self.timestamp_ms if stamped is None or stamped < 0 else stamped,
        )


@dataclass(slots=True)
class _Batch:
    """A batch being filled by ``enqueue_all``, and where each of its records sits in the
    answer: (write, record) indexes, its offset in the batch, its timestamp."""

    builder: Any
    members: list[tuple[int, int, int, int]] = field(default_factory=list)


async def enqueue_all(
    producer: Any, writes: Sequence[tuple[str, Sequence[OutgoingKafkaRecord]]]
) -> list[list[QueuedRecord | SendFailed]]:
    """Queue every record of ``writes`` (topic, records) on a producer whose accumulator
    holds nothing for their partitions, in one batch per partition as far as the batch
    size allows; an outcome per record, SendFailed for one refused before it was queued
    (it can never be appended then). Raises the fenced errors (FENCED_ERRORS).

    ``send`` per record cost the writer a future, a metadata wait, a partition check and
    an accumulator call per record (bench/README.md, "The transactional writer's
    batches"); a transaction's records are all known before any is sent, so they are
    written into aiokafka's batches directly. A partition's batches are queued in order,
    each once the sender has taken the one before (``send_batch`` waits for that, as
    ``send`` does for a full batch), so the first batch of every partition is queued
    before any second one: the sender takes one batch per partition a request."""
    # The limit send() checks each record against; a record past it is refused alone.
    max_size = producer._max_request_size
    answer: list[list[QueuedRecord | SendFailed]] = []
    chains: dict[tuple[str, int], list[_Batch]] = {}
    # One clock reading for the call: its loop does not suspend, so every record without
    # a timestamp of its own is queued within the same instant.
    now_ms = int(time.time() * 1000)
    for write, (topic, records) in enumerate(writes):
        row: list[QueuedRecord | SendFailed] = []
        answer.append(row)
        for number, record in enumerate(records):
            key, value, headers = record.key, record.value, list(record.headers)
            refusal = _refusal(key, value, headers, max_size)
            row.append(refusal or _UNSENT)
            if refusal is not None:
                continue
            chain = chains.setdefault((topic, record.partition), [])
            if not chain:
                chain.append(_Batch(producer.create_batch()))
            timestamp = now_ms if record.timestamp_ms is None else record.timestamp_ms
            builder = chain[-1].builder
            if builder.append(timestamp=timestamp, key=key, value=value, headers=headers) is None:
                # Full: the record opens the partition's next batch (an empty batch takes
                # any record; max_request_size was checked above).
                chain.append(_Batch(producer.create_batch()))
                builder = chain[-1].builder
                builder.append(timestamp=timestamp, key=key, value=value, headers=headers)
            batch = chain[-1]
            batch.members.append((write, number, batch.builder.record_count() - 1, timestamp))
    for turn in range(max((len(chain) for chain in chains.values()), default=0)):
        for (topic, partition), chain in chains.items():
            if turn >= len(chain):
                continue
            batch = chain[turn]
            try:
                delivery = await producer.send_batch(batch.builder, topic, partition=partition)
            except FENCED_ERRORS:
                raise
            except KafkaError as exc:
                failure = SendFailed(
                    str(exc), maybe_appended=False, not_authorized=isinstance(exc, _NOT_AUTHORIZED)
                )
                for write, number, _, _ in batch.members:
                    answer[write][number] = failure
                continue
            for write, number, index, timestamp in batch.members:
                answer[write][number] = QueuedRecord(delivery, index, timestamp)
    return answer


def _refusal(
    key: bytes | None, value: bytes | None, headers: list[Header], max_request_size: int
) -> SendFailed | None:
    """Why aiokafka's ``send`` would refuse a record before queueing it, if it would."""
    if key is None and value is None:
        return SendFailed("a tombstone needs a key", maybe_appended=False)
    size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)
    if size > max_request_size:
        return SendFailed(
            f"The message is {size} bytes when serialized which is larger than the maximum "
            "request size you have configured with the max_request_size configuration",
            maybe_appended=False,
        )
    return None


_UNSENT: Final = SendFailed("not queued", maybe_appended=False)
"""A place in ``enqueue_all``'s answer until its record's batch is queued."""


@dataclass(slots=True, eq=False)
class _SharedBatch:
    """A batch the sends to one partition fill, and the delivery their records wait on."""

    builder: Any
    delivery: asyncio.Future[Any]
    """Ours, settled as aiokafka's delivery of the batch is, or with a SendFailed if the
    batch could not be queued."""
    queued: Any = None
    """aiokafka's MessageBatch, once the batch is queued."""

    def open(self) -> bool:
        """Whether a record may still join: the sender has not taken the batch. Its record
        count is read when the sender takes it (for the idempotent sequence numbers), not
        when the batch is built, so a record that joined later would break the sequence;
        a batch taken once stays closed, retries included."""
        queued = self.queued
        return queued is None or (queued.retry_count == 0 and not queued.future.done())


@dataclass(slots=True, eq=False)
class _PartitionBatches:
    """A partition's batches: the last one queued, and those waiting their turn."""

    latest: _SharedBatch | None = None
    """The partition's last batch queued."""
    waiting: collections.deque[_SharedBatch] = field(default_factory=collections.deque)
    """Its batches not queued yet, oldest first: each is queued once the sender has taken
    the one before."""


class SharedBatches:
    """The idempotent producer's sends, written by concurrent requests into shared batches:
    one future per batch, not per record.

    ``send`` per record cost an unmanaged produce a future, a metadata wait and an
    accumulator call per record (bench/README.md, "The unmanaged path's shared batches").
    A partition's records join its newest batch until the sender takes it, as ``send``
    fills aiokafka's pending batch; a batch is queued once the sender has taken the one
    before (``send_batch`` waits for that), by one task per partition, so a partition's
    batches keep the order their records were added in."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self._partitions: dict[tuple[str, int], _PartitionBatches] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def add(
        self, topic: str, records: Sequence[OutgoingKafkaRecord]
    ) -> list[QueuedRecord | SendFailed]:
        """Append ``records`` to their partitions' batches, in order, without waiting; an
        outcome per record, SendFailed for one refused before it was queued."""
        producer = self.producer
        max_size = producer._max_request_size
        # One clock reading: nothing here suspends, so the records are added in an instant.
        now_ms = int(time.time() * 1000)
        answer: list[QueuedRecord | SendFailed] = []
        for record in records:
            key, value, headers = record.key, record.value, list(record.headers)
            refusal = _refusal(key, value, headers, max_size)
            if refusal is not None:
                answer.append(refusal)
                continue
            timestamp = now_ms if record.timestamp_ms is None else record.timestamp_ms
            batch = self._batch_for(topic, record.partition)
            if (
                batch.builder.append(timestamp=timestamp, key=key, value=value, headers=headers)
                is None
            ):
                # Full: the record opens the partition's next batch (an empty batch takes
                # any record; max_request_size was checked above).
                batch = self._open_batch(topic, record.partition)
                batch.builder.append(timestamp=timestamp, key=key, value=value, headers=headers)
            answer.append(QueuedRecord(batch.delivery, batch.builder.record_count() - 1, timestamp))
        return answer

    def _batch_for(self, topic: str, partition: int) -> _SharedBatch:
        batches = self._partitions.get((topic, partition))
        if batches is not None:
            if batches.waiting:
                return batches.waiting[-1]
            if batches.latest is not None and batches.latest.open():
                return batches.latest
        return self._open_batch(topic, partition)

    def _open_batch(self, topic: str, partition: int) -> _SharedBatch:
        batches = self._partitions.setdefault((topic, partition), _PartitionBatches())
        batch = _SharedBatch(
            self.producer.create_batch(), asyncio.get_running_loop().create_future()
        )
        batches.waiting.append(batch)
        if len(batches.waiting) == 1:
            task = asyncio.create_task(self._queue_in_order(topic, partition, batches))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return batch

    async def _queue_in_order(self, topic: str, partition: int, batches: _PartitionBatches) -> None:
        """Queue the partition's waiting batches one after the other, until none waits."""
        waiting = batches.waiting
        try:
            while waiting:
                batch = waiting[0]
                try:
                    delivery = await self.producer.send_batch(
                        batch.builder, topic, partition=partition
                    )
                except KafkaError as exc:
                    waiting.popleft()
                    batch.builder.close()
                    batch.delivery.set_exception(
                        SendFailed(
                            str(exc),
                            maybe_appended=False,
                            not_authorized=isinstance(exc, _NOT_AUTHORIZED),
                        )
                    )
                    continue
                waiting.popleft()
                # Nothing suspended since the batch was queued: it is the partition's last
                # in aiokafka's accumulator, where the sender takes it from.
                pending = self.producer._message_accumulator._batches.get(
                    TopicPartition(topic, partition)
                )
                batch.queued = pending[-1] if pending else None
                if batch.queued is None or batch.queued._builder is not batch.builder:
                    batch.builder.close()  # not found: nothing more joins it
                batches.latest = batch
                delivery.add_done_callback(functools.partial(_settle, batch.delivery))
                delivery.add_done_callback(functools.partial(self._forget, topic, partition, batch))
        finally:
            # Cancelled, or send_batch raised what no KafkaError covers: what still waits
            # was never queued.
            for batch in waiting:
                if not batch.delivery.done():
                    batch.delivery.set_exception(
                        SendFailed("the producer closed", maybe_appended=False)
                    )
            waiting.clear()
            if batches.latest is None:
                self._forget(topic, partition, None)

    def _forget(self, topic: str, partition: int, batch: _SharedBatch | None, *_: Any) -> None:
        """Drop a partition's entry once ``batch``, its latest, is done and none waits: a
        partition written once does not hold its last batch for good."""
        batches = self._partitions.get((topic, partition))
        if batches is not None and batches.latest is batch and not batches.waiting:
            del self._partitions[(topic, partition)]


def _settle(ours: asyncio.Future[Any], delivery: asyncio.Future[Any]) -> None:
    """Settle a shared batch's delivery as aiokafka settled the batch's."""
    if ours.done():
        return
    if delivery.cancelled():
        ours.cancel()
    elif (exc := delivery.exception()) is not None:
        ours.set_exception(exc)
    else:
        ours.set_result(delivery.result())


async def start_transactional_producer(settings: KafkaSettings, transactional_id: str) -> Any:
    """A started producer for ``transactional_id``; starting it fences every earlier
    producer of the id. Raises ProducerFenced (someone initialised it meanwhile, or it
    is not authorised), KafkaUnavailable."""
    set_transaction_poll(settings.transaction_poll_ms)
    common, producer_extra = client_settings(settings)
    producer = AIOKafkaProducer(
        **common,
        **producer_extra,
        transactional_id=transactional_id,
        transaction_timeout_ms=settings.transaction_timeout_ms,
    )
    timeout_s = settings.request_timeout_ms / 1000
    try:
        async with asyncio.timeout(timeout_s):
            await producer.start()
    except FENCED_ERRORS as exc:
        await _close_all(producer)
        raise ProducerFenced(f"transactional id {transactional_id}: {exc}") from exc
    except (KafkaError, OSError, TimeoutError) as exc:
        await _close_all(producer)
        refused = await diagnose(settings)
        if refused is not None:
            raise refused from exc
        reason = str(exc) or f"no answer within {timeout_s:g} s"
        message = f"initialising transactional id {transactional_id}: {reason}"
        raise KafkaUnavailable(message) from exc
    return producer


def set_transaction_poll(poll_ms: float) -> None:
    """Ask again every ``poll_ms`` to add a partition to a new transaction while the
    coordinator still writes the previous one's markers (CONCURRENT_TRANSACTIONS).

    aiokafka waits a fixed 20 ms there (``BACKOFF_OVERRIDE``, a module constant with no
    setting; Java's client does the same, KAFKA-5477), and the markers take a few ms on a
    healthy cluster: a one-record transaction took 47 ms at 20 ms, 16 ms at 5 ms and 9 ms
    at 2 ms on the local cluster. Process-wide: every transactional producer of the
    process polls at the last value set. ``tests/unit/adapters/kafka/test_writes.py``
    checks that aiokafka still reads the constant there."""
    aiokafka_sender.BACKOFF_OVERRIDE = poll_ms / 1000


def ready_to_begin(producer: Any) -> bool:
    """Whether a transactional producer can begin a transaction without waiting: it has
    its producer id, and no transaction is open or ending."""
    manager = producer._txn_manager
    return (
        manager is not None and bool(manager.has_pid()) and manager.state is TransactionState.READY
    )


def in_transaction(producer: Any) -> bool:
    """Whether a transactional producer's transaction is open and has met no error."""
    manager = producer._txn_manager
    return manager is not None and bool(manager.is_in_transaction())


def add_partitions_ahead(producer: Any, topic: str, partitions: Iterable[int]) -> int:
    """Ask a transactional producer to add ``topic``'s ``partitions`` to its open
    transaction now, before any record is queued for them; how many it was asked to add.

    aiokafka adds a partition (AddPartitionsToTxn, a round trip to the transaction
    coordinator, repeated every transaction poll while the coordinator still writes the
    markers of the producer's previous transaction) only when its first batch is queued,
    and sends the batch after that. Asked ahead, the round trip is made while the records
    still wait for their turn. Only partitions the producer's metadata shows are asked
    for (another could not be added); nothing is asked outside a transaction (after an
    error the producer is in another state). ``tests/unit/adapters/kafka/test_writes.py``
    checks that aiokafka still has the internals this reaches.
    """
    if not in_transaction(producer):
        return 0
    manager = producer._txn_manager
    shown = producer.client.cluster.partitions_for_topic(topic) or ()
    asked = 0
    for partition in partitions:
        if partition in shown:
            manager.maybe_add_partition_to_txn(TopicPartition(topic, partition))
            asked += 1
    return asked


# ``timeout`` bounds a polling loop over shared metadata; nothing to cancel.
async def await_partition_count(
    client: Any,
    topic: str,
    count: int,
    timeout: float,  # noqa: ASYNC109
    *,
    backoff_s: float,
) -> None:
    """Wait until an aiokafka client's metadata shows at least ``count`` partitions of
    ``topic`` (a client knows of a new partition only at its next metadata refresh).

    Raises KafkaUnavailable on timeout.
    """
    client.add_topic(topic)
    deadline = time.monotonic() + timeout

    def shown() -> bool:
        return len(client.cluster.partitions_for_topic(topic) or ()) >= count

    while not shown():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise KafkaUnavailable(f"the metadata does not show {count} partitions of {topic}")
        await _refresh(client, remaining)
        if not shown():
            # Kafka's metadata lags the controller for a moment after a change.
            await asyncio.sleep(min(backoff_s, max(0.0, deadline - time.monotonic())))


async def _refresh(client: Any, within: float) -> None:
    # force_metadata_update returns a shielded future: giving up does not cancel the
    # update, which other waiters may share.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(client.force_metadata_update(), within)


def _discard_outcome(delivery: asyncio.Future[Any]) -> None:
    # Nobody awaits a delivery we gave up on; retrieve its exception so asyncio does
    # not log "exception was never retrieved".
    if not delivery.cancelled():
        delivery.exception()
