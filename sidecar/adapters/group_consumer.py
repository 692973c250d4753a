"""The consume path's one Kafka group consumer (aiokafka), behind core types.

Builds the ``AIOKafkaConsumer`` a consumer instance reads with (read-committed, the
ordered assignor, short metadata age), relays its rebalance listener to a
``RebalanceHandler``, commits with leader epochs (``adapters.offset_commit``), and
translates aiokafka's errors into ``KafkaUnavailable``. The service sees only
``sidecar.core.consume`` types; partitions go in and out as the core's
``TopicPartition`` and records as aiokafka returns them (they have the
``ConsumedRecord`` shape).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from sidecar.adapters import record_epochs
from sidecar.adapters.kafka import OffsetAndEpoch, consumer_settings
from sidecar.adapters.kafka_protocol import NO_EPOCH, EpochOffsetFetchRequest
from sidecar.adapters.offset_commit import CommitEpochsInFlight, carry_epochs
from sidecar.adapters.offset_fetch import check_group_consumer, raise_group_error
from sidecar.config import KafkaSettings
from sidecar.core.assignment import assign
from sidecar.core.consume import ConsumedRecord, LastBatch, TopicPartition
from sidecar.core.errors import KafkaFailure, KafkaUnavailable
from sidecar.core.generations import PartitionMode

Batches = dict[TopicPartition, list[ConsumedRecord]]

_incarnations = itertools.count(1)
"""Numbers for aiokafka's assignments, increasing across every consumer of the process."""

COMMITTED_EPOCH_ATTEMPTS = 5
"""Tries of the OffsetFetch that reads a reading's committed leader epoch, the retry
backoff of the consumer apart (aiokafka's ``retry_backoff_ms``, 100 ms by default). A
bound of the adapter's own, not a tunable: past it the reading is validated at the next
fetch (``service/truncation_check.py``), so more tries change nothing but the log."""


class Fetched(NamedTuple):
    """What one fetch returned, observed in the step it returned in (nothing else of the
    consumer can run in between): the assignment it was read from, the records, every
    assigned partition's position right after it (where known), and, for those a fetch
    moved there, the leader epoch of the last batch read (markers included)."""

    incarnation: int
    batches: Batches
    positions: dict[TopicPartition, int]
    last_batches: dict[TopicPartition, LastBatch]


class RebalanceHandler(Protocol):
    """What a consumer instance does when its group rebalances (awaited by aiokafka)."""

    async def partitions_revoked(self, partitions: set[TopicPartition]) -> None: ...

    async def partitions_assigned(self, partitions: set[TopicPartition]) -> None: ...


@dataclass(frozen=True)
class GroupConsumerOptions:
    """What one consumer instance asks of its Kafka consumer."""

    group: str
    client_suffix: str
    """Appended to the sidecar's client id (the instance's name)."""
    auto_offset_reset: str
    fetch_min_bytes: int
    metadata_max_age_ms: int


def ordered_assignor(
    modes_of: Callable[[str], Sequence[PartitionMode] | None],
) -> type[AbstractPartitionAssignor]:
    """An aiokafka assignor class that balances read-write and read-only partitions
    separately (``sidecar.core.assignment``), with ``modes_of`` as the sidecar's view
    of the managed topics' modes."""

    class OrderedAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
        name = "ordered-sidecar"
        version = 0

        @classmethod
        def assign(
            cls, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
        ) -> dict[str, ConsumerProtocolMemberAssignment]:
            subscriptions = {m: frozenset(meta.subscription) for m, meta in members.items()}
            counts = {}
            for topic in {t for topics in subscriptions.values() for t in topics}:
                partitions = cluster.partitions_for_topic(topic)
                if partitions is not None:
                    counts[topic] = len(partitions)
            result = assign(subscriptions, counts, modes_of)
            assignment = {}
            for member, pairs in result.items():
                by_topic: dict[str, list[int]] = {}
                for topic, partition in pairs:
                    by_topic.setdefault(topic, []).append(partition)
                assignment[member] = ConsumerProtocolMemberAssignment(
                    cls.version, sorted(by_topic.items()), b""
                )
            return assignment

        @classmethod
        def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
            return ConsumerProtocolMemberMetadata(cls.version, list(topics), b"")

        @classmethod
        def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
            pass

    return OrderedAssignor


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, handler: RebalanceHandler) -> None:
        self.handler = handler

    async def on_partitions_revoked(self, revoked: Iterable[KafkaTopicPartition]) -> None:
        await self.handler.partitions_revoked(_core_set(revoked))

    async def on_partitions_assigned(self, assigned: Iterable[KafkaTopicPartition]) -> None:
        await self.handler.partitions_assigned(_core_set(assigned))


class GroupConsumer:
    """One started aiokafka consumer. Every method that talks to Kafka raises
    KafkaUnavailable for what aiokafka raises."""

    def __init__(
        self, consumer: AIOKafkaConsumer, commit_epochs: CommitEpochsInFlight | None = None
    ) -> None:
        self._consumer = consumer
        self._commit_epochs = commit_epochs
        """Where ``commit`` hands the leader epochs to the coordinator's send (None: the
        consumer commits without epochs)."""
        self._assignment_seen: object = None
        self._incarnation = next(_incarnations)

    @classmethod
    async def start(
        cls,
        settings: KafkaSettings,
        options: GroupConsumerOptions,
        assignor: type[AbstractPartitionAssignor],
    ) -> GroupConsumer:
        # Its records carry their leader epochs (KIP-320: the position is validated
        # after a leader change, ``sidecar.service.truncation_check``).
        record_epochs.install()
        consumer = AIOKafkaConsumer(
            **consumer_settings(
                settings,
                options.client_suffix,
                group_id=options.group,
                enable_auto_commit=False,
                auto_offset_reset=options.auto_offset_reset,
                # Managed topics are written in transactions: what a fenced (zombie)
                # sidecar sent is aborted, and must never be read.
                isolation_level="read_committed",
                partition_assignment_strategy=(assignor,),
                # Added partitions are noticed (and the group rebalanced) within seconds.
                metadata_max_age_ms=options.metadata_max_age_ms,
                fetch_min_bytes=options.fetch_min_bytes,
            )
        )
        try:
            await consumer.start()
        except KafkaError as exc:
            raise KafkaUnavailable(f"cannot start a consumer: {exc}") from exc
        # Before the first subscribe: a coordinator that is loading the group's offsets
        # must not be read as "nothing committed" (that rewinds or skips the partition).
        check_group_consumer(consumer)
        # Commits carry the leader epoch of what was read below them (KIP-320).
        return cls(consumer, carry_epochs(consumer))

    # Subscription and assignment ----------------------------------------------------------

    def subscribe(
        self, topics: Sequence[str], pattern: str | None, handler: RebalanceHandler
    ) -> None:
        if pattern is None:
            self._consumer.subscribe(topics=list(topics), listener=_Listener(handler))
        else:
            self._consumer.subscribe(pattern=pattern, listener=_Listener(handler))

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._consumer.assign(_kafka_list(partitions))

    def subscription(self) -> set[str]:
        return set(self._consumer.subscription())

    def assignment(self) -> set[TopicPartition]:
        return _core_set(self._consumer.assignment())

    def incarnation(self) -> int:
        """The number of aiokafka's current assignment. aiokafka makes a new assignment
        object at every rebalance and manual assignment, whose positions start from the
        group's committed offsets; a number that changes with it tells which assignment
        a fetch or a position belongs to (``sidecar.core.positions``)."""
        subscription = self._consumer._subscription.subscription
        assignment = None if subscription is None else subscription.assignment
        if assignment is not self._assignment_seen:
            # Held, not only compared by id: a freed object's id can be reused.
            self._assignment_seen = assignment
            self._incarnation = next(_incarnations)
        return self._incarnation

    def request_rejoin(self) -> None:
        """Ask the group to rebalance: what aiokafka's coordinator itself calls when its
        metadata changes (it does not when only the assignor's answer would).

        Metadata is refreshed first: the group leader's assignment then sees partitions
        just added, and remembers the partition count it assigned with, so aiokafka's
        own check of the count finds no change afterwards (one rebalance, not two)."""
        refresh = self._consumer._client.force_metadata_update()
        refresh.add_done_callback(_retrieve)
        self._consumer._coordinator.request_rejoin()

    # Fetching -----------------------------------------------------------------------------

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        self._consumer.pause(*_kafka_list(partitions))

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self._consumer.resume(*_kafka_list(partitions))

    async def fetch(self, timeout_ms: int) -> Fetched:
        """Records fetched within ``timeout_ms``, with the assignment they were read from
        and the positions after them. Raises KafkaUnavailable."""
        try:
            batches = await self._consumer.getmany(timeout_ms=timeout_ms)
        except KafkaError as exc:
            raise KafkaUnavailable(f"fetching failed: {exc}") from exc
        # Same step as aiokafka's drain (its getmany returns without yielding after it):
        # the positions are those the records left, in the assignment they came from.
        positions = {}
        last_batches = {}
        for tp in self.assignment():
            state = self._assigned_state(tp)
            if state is None or not state.has_valid_position:
                continue
            position = positions[tp] = int(state.position)
            last = record_epochs.last_batch_of(state)
            # Unless a seek or a reset moved the position since a fetch did.
            if last is not None and last[0] == position and last[1] != NO_EPOCH:
                last_batches[tp] = LastBatch(position, last[1])
        return Fetched(
            self.incarnation(),
            {TopicPartition(tp.topic, tp.partition): records for tp, records in batches.items()},
            positions,
            last_batches,
        )

    def fetch_position(self, tp: TopicPartition) -> int | None:
        """The consumer's position in ``tp`` (the offset after the last record, marker or
        aborted record its fetches returned), or None while it is unknown or ``tp`` is
        not assigned. ``AIOKafkaConsumer.position`` waits while a position is being
        reset; the release path must not, so this reads the same state without waiting."""
        state = self._assigned_state(tp)
        return int(state.position) if state is not None and state.has_valid_position else None

    def _assigned_state(self, tp: TopicPartition) -> Any:
        """aiokafka's state of an assigned partition (positions, high watermark), read
        without its asserts and waits; None if ``tp`` is not assigned."""
        subscription = self._consumer._subscription.subscription
        assignment = None if subscription is None else subscription.assignment
        kafka_tp = KafkaTopicPartition(tp.topic, tp.partition)
        if assignment is None or kafka_tp not in assignment.tps:
            return None
        return assignment.state_value(kafka_tp)

    def highwater(self, tp: TopicPartition) -> int | None:
        """The partition's high watermark as last fetched, or None while it is unknown or
        ``tp`` is not assigned. ``AIOKafkaConsumer.highwater`` asserts the partition is
        assigned, and a rebalance may end while a release is looking."""
        state = self._assigned_state(tp)
        return None if state is None or state.highwater is None else int(state.highwater)

    # Offsets and positions ----------------------------------------------------------------

    async def commit(
        self, offsets: Mapping[TopicPartition, int], epochs: Mapping[TopicPartition, int | None]
    ) -> None:
        """Commit ``offsets`` for the group, each with the leader epoch of the last batch
        read below it (``epochs``; a partition missing or None: unknown, committed as
        -1). Raises KafkaUnavailable."""
        to_commit = {
            KafkaTopicPartition(tp.topic, tp.partition): OffsetAndMetadata(offset, "")
            for tp, offset in offsets.items()
        }
        carried = {}
        for tp, offset in offsets.items():
            epoch = epochs.get(tp)
            if epoch is not None and epoch >= 0:
                carried[(tp.topic, tp.partition, offset)] = epoch
        try:
            with (
                contextlib.nullcontext()
                if self._commit_epochs is None
                else self._commit_epochs.carrying(carried)
            ):
                await self._consumer.commit(to_commit)
        except KafkaError as exc:
            raise KafkaUnavailable(f"commit failed: {exc}") from exc

    async def committed(self, tp: TopicPartition) -> int | None:
        try:
            offset = await self._consumer.committed(KafkaTopicPartition(tp.topic, tp.partition))
        except KafkaError as exc:
            raise KafkaUnavailable(f"reading committed offsets failed: {exc}") from exc
        return None if offset is None else int(offset)

    async def committed_epochs(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndEpoch]:
        """The group's committed offset of each of ``partitions`` that has one, with the
        leader epoch it was committed with (None: committed without one), read once with
        OffsetFetch v5 from the group's coordinator. A partition answered with an error
        is left out. Raises KafkaUnavailable (no coordinator known, a group-level error:
        not asked again here), KafkaFailure (a broker before Kafka 2.1)."""
        # Through the consumer's own coordinator, not the gateway's admin client: the node
        # aiokafka read the reading's start position from a moment before, over the
        # connection it holds (the admin client would first look the coordinator up, one
        # FindCoordinator per reading), with the consumer's own credentials, which the
        # group's ACLs are granted to. One request, not aiokafka's retrying
        # ``fetch_committed_offsets``: its caller goes on without the epochs rather than
        # hold the records fetched.
        coordinator = self._consumer._coordinator
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        request = EpochOffsetFetchRequest(coordinator.group_id, sorted(by_topic.items()))
        for attempt in range(1, COMMITTED_EPOCH_ATTEMPTS + 1):
            try:
                # A reading that just began may find the coordinator's connection not
                # ready yet, or the coordinator moved: found again and asked again, a
                # few times (going on unvalidated would skip records after a loss).
                await coordinator.ensure_coordinator_known()
                response = await coordinator._send_req(request)
                raise_group_error(response, coordinator.coordinator_dead)
                break
            except KafkaError as exc:
                if not exc.retriable or attempt == COMMITTED_EPOCH_ATTEMPTS:
                    raise KafkaUnavailable(f"reading committed offsets failed: {exc!r}") from exc
                await asyncio.sleep(coordinator._retry_backoff_ms / 1000)
            except NotImplementedError as exc:  # Request.prepare: no version both sides know
                raise KafkaFailure(
                    "the group's coordinator does not answer committed leader epochs "
                    "(KIP-320): Kafka 2.1 or later is needed"
                ) from exc
        found = {}
        for topic, rows in response.topics:
            for partition, offset, epoch, _, error_code in rows:
                if error_code == 0 and offset >= 0:
                    found[TopicPartition(topic, partition)] = OffsetAndEpoch(
                        int(offset), None if epoch == NO_EPOCH else int(epoch)
                    )
        return found

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int | None]:
        """The first offset at or after each time, None where no record is."""
        try:
            found = await self._consumer.offsets_for_times(
                {KafkaTopicPartition(tp.topic, tp.partition): ts for tp, ts in timestamps.items()}
            )
        except KafkaError as exc:
            raise KafkaUnavailable(f"looking up offsets by time failed: {exc}") from exc
        return {
            TopicPartition(tp.topic, tp.partition): None if hit is None else int(hit.offset)
            for tp, hit in found.items()
        }

    async def end_offset(self, tp: TopicPartition) -> int:
        kafka_tp = KafkaTopicPartition(tp.topic, tp.partition)
        return int((await self._consumer.end_offsets([kafka_tp]))[kafka_tp])

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._consumer.seek(KafkaTopicPartition(tp.topic, tp.partition), offset)

    async def seek_to(self, partitions: Sequence[TopicPartition], *, beginning: bool) -> None:
        if beginning:
            await self._consumer.seek_to_beginning(*_kafka_list(partitions))
        else:
            await self._consumer.seek_to_end(*_kafka_list(partitions))

    async def position(self, tp: TopicPartition) -> int:
        return int(await self._consumer.position(KafkaTopicPartition(tp.topic, tp.partition)))

    async def stop(self) -> None:
        await self._consumer.stop()


def _retrieve(future: Any) -> None:
    # A refresh that fails is retried by aiokafka's own metadata loop; nobody awaits it.
    if not future.cancelled():
        future.exception()


def _core_set(partitions: Iterable[KafkaTopicPartition]) -> set[TopicPartition]:
    return {TopicPartition(tp.topic, tp.partition) for tp in partitions}


def _kafka_list(partitions: Iterable[TopicPartition]) -> list[KafkaTopicPartition]:
    return [KafkaTopicPartition(tp.topic, tp.partition) for tp in partitions]
