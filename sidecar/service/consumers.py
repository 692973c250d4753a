"""The consume path: REST consumer instances whose deliveries pass the gate.

Each instance is one aiokafka consumer in its Kafka group. Records are fetched into
per-partition buffers and released to the app only at delivery time, one partition
head at a time, when the core's gate is open for it (DESIGN §6). The gate is judged
from the group's *committed* offsets in Kafka, log-start offsets and partition modes,
so it is the same for every instance of the group and survives restarts and
rebalances; nothing relies on pausing (aiokafka forgets pauses on a rebalance).

Waiting instances announce their waits in ZooKeeper; an owner of a blocking partition
that auto-commits commits at once when someone waits past its delivered position,
instead of at its next commit interval.

Key hand-off (``sidecar.core.handoff``): once the instance consuming ``q`` has
delivered it up to a boundary where ``q``'s keys moved away (also when that happened
before the change: a caught-up group), and before it delivers past it or commits past
it, the app is told "keys revoked"; the group records the acknowledgement in ZooKeeper,
and the gate of the keys' new partition ``p`` waits for it. Before the first gated
record of ``p`` is delivered, "keys assigned". Either by calling the app's callback URL
(and waiting for a 2xx), or as events in the poll response that the app acknowledges.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata

from sidecar.audit import events as audit_events
from sidecar.audit.events import key_sampled
from sidecar.core.assignment import assign
from sidecar.core.errors import (
    BadRequest,
    CallbackFailed,
    ConsumerStateConflict,
    KafkaUnavailable,
    SidecarError,
    UnknownConsumerInstance,
)
from sidecar.core.gate import GroupProgress, Wait, unmet, waits_into
from sidecar.core.generations import ChangeKind, GenerationLog, PartitionMode
from sidecar.core.handoff import (
    AssignmentChange,
    HandoffEvent,
    HandoffKind,
    HandoffLedger,
    Revocation,
    revocation_points,
    revocations_crossed,
    revocations_due,
    revoked_through,
)
from sidecar.core.placement import GENERATION_HEADER, RELOCATION_HEADER, SIDECAR_HEADER
from sidecar.service.sidecar import Sidecar, TopicRuntime

_log = logging.getLogger(__name__)

GATE_RECHECK_S = 0.05
"""How often a waiting poll re-reads the group's committed offsets."""
BUFFER_LIMIT = 2000
"""Records buffered per partition before fetching from it pauses."""
AUTO_COMMIT_INTERVAL_S = 5.0
METADATA_MAX_AGE_MS = 3000
REVOKE_ACK_WAIT_S = 10.0
Fetched = dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]
FETCH_GRACE_S = 0.05
"""How much longer than its own timeout a poll waits for aiokafka's getmany."""
CALLBACK_RETRY_S = 0.2


@dataclass(frozen=True)
class InstanceConfig:
    group: str
    name: str
    format: str
    """"binary" or "json": how the HTTP layer encodes keys and values."""
    auto_offset_reset: str = "latest"
    auto_commit: bool = False
    callback_url: str | None = None
    callback_timeout_s: float = 5.0
    poll_timeout_ms: int = 1000
    """Default (and longest) wait of a records request, as REST Proxy's
    ``consumer.request.timeout.ms``."""
    fetch_min_bytes: int = 1
    """REST Proxy's ``fetch.min.bytes``: the fetch waits for this much (up to its wait)."""
    assignment_events: bool = False
    """Tell the app of rebalances (AssignmentNotice), by callback or in records
    responses. Off by default: a REST Proxy client expects only records there."""


@dataclass(frozen=True)
class AssignmentNotice:
    """Partitions a rebalance gave to the instance or took from it."""

    kind: AssignmentChange
    partitions: tuple[TopicPartition, ...]


@dataclass(slots=True)
class Delivered:
    """A record released to the app."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]
    """The consumed record's own list, shared, not copied."""
    source: ConsumerRecord[bytes, bytes]


@dataclass
class PollResult:
    records: list[Delivered]
    events: list[HandoffEvent]
    notices: list[AssignmentNotice] = field(default_factory=list)
    """Rebalances since the last response, in order; they precede ``events`` and
    ``records`` (only with ``InstanceConfig.assignment_events`` in events mode)."""


@dataclass
class _PartitionState:
    buffer: deque[ConsumerRecord[bytes, bytes]] = field(default_factory=deque)
    delivered: int | None = None
    """Next offset after the last record released or skipped here (relocation tombstones,
    and what a read-committed consumer never returns: transaction markers and aborted
    records); None: nothing yet."""
    released_to: int | None = None
    """Next offset after the last record released to the app."""
    fetched_to: int | None = None
    """The consumer's position when the last fetch was taken into ``buffer``."""
    committed: int | None = None
    """What this instance last committed (or read as the group's committed offset)."""

    def skip_invisible(self) -> None:
        """Count the offsets the consumer skipped as delivered.

        Managed topics are written in transactions: each one ends with a marker that
        takes an offset, and a read-committed consumer never returns markers or aborted
        records. A change's boundary lies past its last marker, so a group that commits
        only "last record + 1" would never reach it. Everything below the buffer's head,
        or with an empty buffer below the fetch position, was released or skipped.
        """
        head = self.buffer[0].offset if self.buffer else self.fetched_to
        if head is not None and (self.delivered is None or head > self.delivered):
            self.delivered = head


class _PartitionCheck:
    """What the gate needs of one partition during one release, each part computed once."""

    def __init__(
        self,
        instance: ConsumerInstance,
        runtime: TopicRuntime | None,
        tp: TopicPartition,
        progress_by_topic: dict[str, GroupProgress],
    ) -> None:
        assert runtime is not None
        self.instance = instance
        self.runtime = runtime
        self.tp = tp
        self.revocations = revocation_points(runtime.state.log, tp.partition)
        self.first_revocation = min((r.boundary for r in self.revocations), default=None)
        """Below this offset no record needs a keys-revoked check (None: none ever)."""
        self.open_generations: set[int] = set()
        """Generations whose gate this release found open (and announced): the offsets it
        judged by are read once per release, so later records of them pass alike."""
        self._waits: dict[int, tuple[Wait, ...]] = {}
        self._progress_by_topic = progress_by_topic

    def waits(self, generation: int) -> tuple[Wait, ...]:
        if generation not in self._waits:
            self._waits[generation] = waits_into(
                self.runtime.state.log, self.tp.partition, generation
            )
        return self._waits[generation]

    async def progress(self) -> GroupProgress:
        """The group's offsets for the topic, read at most once per release."""
        topic = self.tp.topic
        if topic not in self._progress_by_topic:
            self._progress_by_topic[topic] = await self.instance._progress(self.runtime, topic)
        return self._progress_by_topic[topic]


class ConsumerInstance:
    def __init__(self, config: InstanceConfig, sidecar: Sidecar, consumers: Consumers) -> None:
        self.config = config
        self.sidecar = sidecar
        self.consumers = consumers
        self.last_used = time.monotonic()
        self.lock = asyncio.Lock()
        self.subscription: list[str] = []
        self.pattern: str | None = None
        self.manual: list[TopicPartition] = []
        self._partitions: dict[TopicPartition, _PartitionState] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._ledger = HandoffLedger()
        """What the app was told of key hand-off and acknowledged (and the group's
        acknowledged revocations, as last read from ZooKeeper)."""
        self._unrecorded: set[tuple[str, int, int]] = set()
        """keys_revoked acknowledged here but not written to ZooKeeper yet (it was away)."""
        self._waits: dict[tuple[str, int, int], tuple[float, ChangeKind]] = {}
        self._gate_reported: set[tuple[str, int, int]] = set()
        self._delivery_lock = asyncio.Lock()
        self._revoking: set[TopicPartition] = set()
        self._last_auto_commit = time.monotonic()
        self._http: aiohttp.ClientSession | None = None
        self._revoke_calls: dict[tuple[str, int, int], tuple[asyncio.Task[None], bool]] = {}
        """keys_revoked callbacks under way (and whether each is patient): the release
        loop, a commit and a rebalance listener can all need the same one at once, and
        the app must be called once, not once per need."""
        self._fetching: (
            asyncio.Future[dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]] | None
        ) = None
        """A getmany still waiting for a rebalance to end, taken up by the next poll."""
        self._notices: list[AssignmentNotice] = []
        self._told_assigned: set[TopicPartition] = set()
        """With ``assignment_events``: subscribed partitions whose partitions_assigned
        notice the app has been given (queued or called back). Only these release
        records, so the notice always comes first, even when aiokafka fetches before
        its rebalance listener runs."""

    @property
    def instance_id(self) -> str:
        return self.config.name

    # Subscription and assignment ----------------------------------------------------------

    async def subscribe(self, topics: Sequence[str] | None, pattern: str | None) -> None:
        if self.manual:
            raise ConsumerStateConflict("the instance has manual assignments; delete them first")
        if (self.subscription or self.pattern) and (pattern is None) != (self.pattern is None):
            # REST Proxy replaces a subscription; aiokafka refuses to turn topics into a
            # pattern or back (mutually exclusive), so the old one is left first.
            await self.unsubscribe()
        consumer = await self._ensure_consumer()
        self.subscription = list(topics or [])
        self.pattern = pattern
        if pattern is None:
            consumer.subscribe(topics=self.subscription, listener=_Rebalance(self))
        else:
            consumer.subscribe(pattern=pattern, listener=_Rebalance(self))
        for topic in self.subscription:
            await self.sidecar.runtime(topic)  # load and watch managed topics now

    async def unsubscribe(self) -> None:
        """Leave the subscription and any manual assignment, as Kafka's unsubscribe.

        The aiokafka consumer is closed (leaving the group), not only unsubscribed: its
        coordinator may still be rejoining for the old subscription, and a manual
        assignment made meanwhile fails inside aiokafka ("Should not be called"). The
        next subscribe or assign starts a fresh one.
        """
        await self._stop_consumer()
        self.subscription, self.pattern, self.manual = [], None, []
        self._partitions.clear()
        self._told_assigned.clear()

    async def assign_manually(self, partitions: Sequence[TopicPartition]) -> None:
        if self.subscription or self.pattern:
            raise ConsumerStateConflict("the instance is subscribed; unsubscribe first")
        if not partitions:
            # Kafka's assign of nothing is its unsubscribe; aiokafka would keep the consumer
            # in manual mode with nothing assigned, refusing a later subscription.
            await self.unsubscribe()
            return
        consumer = await self._ensure_consumer()
        consumer.assign(list(partitions))
        self.manual = list(partitions)
        self._partitions = {tp: _PartitionState() for tp in partitions}

    def subscribed_topics(self) -> list[str]:
        """The topics named, or those a pattern matches now (as Kafka's consumer says)."""
        if self.pattern is None or self._consumer is None:
            return list(self.subscription)
        return sorted(self._consumer.subscription())

    def assignment(self) -> list[TopicPartition]:
        if self._consumer is None:
            return []
        return sorted(self._consumer.assignment())

    def rebalance_if_subscribed(self, topic: str) -> bool:
        """Ask the group to rebalance if this instance subscribes to ``topic``; True if so.

        aiokafka rebalances on its own when a topic's partition count changes, not when
        the sidecar's assignor would assign differently; ``request_rejoin`` is what
        aiokafka's coordinator itself calls when its metadata changes.
        """
        consumer = self._consumer
        if consumer is None or self.manual or topic not in self.subscribed_topics():
            return False
        consumer._coordinator.request_rejoin()
        return True

    # Polling ------------------------------------------------------------------------------

    async def poll(self, timeout_s: float, max_bytes: int | None) -> PollResult:
        """Records the gate lets through (and pending hand-off events), waiting up to
        ``timeout_s`` for at least one. Raises ConsumerStateConflict if not subscribed."""
        consumer = self._require_subscribed()
        deadline = time.monotonic() + timeout_s
        if self.config.auto_commit:
            await self._commit_quietly(force=False)
            await self._help_waiters()
        while True:
            await self._fetch(consumer, max(0.0, min(GATE_RECHECK_S, deadline - time.monotonic())))
            result = await self._release(max_bytes)
            if result.records or result.events or result.notices:
                return result
            if time.monotonic() >= deadline:
                return result
            await self._help_waiters()
            await asyncio.sleep(GATE_RECHECK_S)

    def undeliver(self, result: PollResult) -> None:
        """Put back what was released but could not be sent to the app."""
        self._notices[:0] = result.notices
        for record in reversed(result.records):
            tp = TopicPartition(record.topic, record.partition)
            state = self._partitions.get(tp)
            if state is None:
                continue
            state.buffer.appendleft(record.source)
            state.delivered = state.released_to = record.offset

    async def _fetch(self, consumer: AIOKafkaConsumer, wait_s: float) -> None:
        assigned = consumer.assignment()
        for tp in list(self._partitions):
            if tp not in assigned:
                self._partitions.pop(tp)
                self._told_assigned.discard(tp)
        paused = []
        for tp in assigned:
            state = self._partitions.setdefault(tp, _PartitionState())
            if len(state.buffer) >= BUFFER_LIMIT:
                paused.append(tp)
        # Re-applied every time: a rebalance forgets pauses.
        consumer.resume(*[tp for tp in assigned if tp not in paused])
        if paused:
            consumer.pause(*paused)
        if len(paused) == len(assigned):
            return
        # aiokafka's getmany waits, whatever its timeout, until a rebalance has ended, and
        # a rebalance's listener may wait for the app to acknowledge keys_revoked events,
        # which only this poll's response carries. So the poll waits for the fetch no
        # longer than asked and leaves it running (not cancelled: aiokafka would lose
        # count of its fetches); a later poll takes its records.
        if self._fetching is None:
            self._fetching = asyncio.ensure_future(consumer.getmany(timeout_ms=int(wait_s * 1000)))
            self._fetching.add_done_callback(_retrieve_outcome)
        done, _ = await asyncio.wait({self._fetching}, timeout=wait_s + FETCH_GRACE_S)
        if not done:
            return
        fetching, self._fetching = self._fetching, None
        try:
            batches = fetching.result()
        except KafkaError as exc:
            raise KafkaUnavailable(f"fetching failed: {exc}") from exc
        for tp, records in batches.items():
            state = self._partitions.setdefault(tp, _PartitionState())
            # Anything at or below this was buffered or delivered already (a refetch
            # after a seek or a rebalance); batches come in offset order.
            seen = max(
                state.buffer[-1].offset if state.buffer else -1,
                -1 if state.delivered is None else state.delivered - 1,
            )
            if records and records[0].offset > seen:
                state.buffer.extend(records)
                continue
            state.buffer.extend(record for record in records if record.offset > seen)
        # The positions moved with the records just taken (and past the markers and
        # aborted records among and after them); nothing else moves them until the next
        # fetch, so they are read here, once.
        for tp in assigned:
            taken = self._partitions.get(tp)
            if taken is None:
                continue  # revoked by a rebalance while the fetch ran
            # None while a reassigned partition's position is being reset: a position
            # from before the rebalance would count records never delivered as skipped.
            taken.fetched_to = fetch_position(consumer, tp)
            taken.skip_invisible()

    async def _release(self, max_bytes: int | None) -> PollResult:
        # A rebalance listener commits what was delivered only once no release runs, so
        # a record can never be released after the commit that hands its partition over.
        async with self._delivery_lock:
            return await self._release_locked(max_bytes)

    async def _release_locked(self, max_bytes: int | None) -> PollResult:
        released: list[Delivered] = []
        events = await self._pending_events()
        # Under the delivery lock, which the rebalance listener takes to queue them.
        notices, self._notices = self._notices, []
        try:
            return await self._release_partitions(released, events, notices, max_bytes)
        except BaseException:
            # A callback that failed, ZooKeeper or Kafka away: what was taken from the
            # buffers goes back, so it is delivered, never lost, on the next poll.
            self.undeliver(PollResult(released, [], notices))
            raise

    async def _release_partitions(
        self,
        released: list[Delivered],
        events: list[HandoffEvent],
        notices: list[AssignmentNotice],
        max_bytes: int | None,
    ) -> PollResult:
        size = 0
        progress_by_topic: dict[str, GroupProgress] = {}
        for tp in sorted(self._partitions):
            state = self._partitions.get(tp)
            if state is None:
                continue  # revoked by a rebalance while this loop awaited
            if self._must_tell_assigned(tp):
                continue
            runtime = await self.sidecar.runtime(tp.topic)
            gated = runtime is not None and runtime.state.config.ordered_delivery
            # Per partition and release, computed once: the waits of each generation and
            # the boundaries where keys moved away; the group's offsets only if needed.
            check = _PartitionCheck(self, runtime, tp, progress_by_topic) if gated else None
            released_before = len(released)
            full = False
            while state.buffer and tp not in self._revoking:
                record = state.buffer[0]
                # Relocation tombstones are tombstones: only null values are looked at.
                if (
                    record.value is None
                    and runtime is not None
                    and _header(record, RELOCATION_HEADER) == b"1"
                ):
                    state.buffer.popleft()
                    state.delivered = record.offset + 1
                    continue
                if check is not None:
                    if not await self._gate_allows(check, record, events):
                        break
                    if not await self._revoked_before(check, record.offset, events):
                        break
                    if tp in self._revoking:
                        break  # a rebalance started while the gate was consulted
                record_size = len(record.key or b"") + len(record.value or b"")
                if max_bytes is not None and released and size + record_size > max_bytes:
                    full = True
                    break
                state.buffer.popleft()
                state.delivered = state.released_to = record.offset + 1
                size += record_size
                released.append(_delivered(record))
            state.skip_invisible()
            # Events go before records in a response: a revocation told alongside the
            # partition's last records would reach the app before them. Next poll, then.
            if check is not None and tp not in self._revoking and len(released) == released_before:
                await self._tell_due_revocations(check, state, events)
            # Counted once per partition and release: per record, the labelled metric
            # lookups cost as much as the rest of the release.
            self.consumers.metrics_delivered(tp, released[released_before:], runtime)
            if full:
                break
            self._record_lag(tp, state)
        return self._still_assigned(PollResult(released, events, notices))

    def _still_assigned(self, result: PollResult) -> PollResult:
        """Drop what was released from partitions that are no longer assigned (lost in a
        rebalance without a revocation): their new owner delivers them. The position goes
        back, so nothing dropped here is ever committed as delivered."""
        if self._consumer is None:
            return result
        assigned = self._consumer.assignment()
        kept = []
        for record in result.records:
            tp = TopicPartition(record.topic, record.partition)
            if tp in assigned:
                kept.append(record)
                continue
            state = self._partitions.get(tp)
            if state is not None:
                state.buffer.clear()
                state.delivered = min(state.delivered or record.offset, record.offset)
                # The buffer no longer reaches the old fetch position: were the partition
                # assigned here again, skip_invisible would count the dropped records as
                # skipped, and the refetch would discard them as seen.
                state.fetched_to = None
        return PollResult(kept, result.events, result.notices)

    async def _revoked_before(
        self, check: _PartitionCheck, offset: int, events: list[HandoffEvent]
    ) -> bool:
        """True once the app has been told that keys of the partition moved away at every
        boundary at or below ``offset`` the group has not committed past yet.

        Asked before delivering a post-boundary record, not only before committing: a
        rebalance between delivering it and committing it would deliver it again.
        """
        if check.first_revocation is None or offset < check.first_revocation:
            return True
        for revocation in check.revocations:
            if not 0 < revocation.boundary <= offset:
                continue
            subject = (check.tp.topic, revocation.partition, revocation.generation)
            if not self._ledger.acknowledged(HandoffKind.KEYS_REVOKED, *subject):
                # Another instance may have got it acknowledged (this partition's owner
                # before a rebalance): read the group's acknowledgements first, once per
                # release, and never tell it while ZooKeeper cannot say (this raises).
                await check.progress()
            pending = await self._revocation_pending(check.tp.topic, revocation)
            if pending is not None:
                if pending not in events:
                    events.append(pending)
                return False
        return True

    async def _tell_due_revocations(
        self, check: _PartitionCheck, state: _PartitionState, events: list[HandoffEvent]
    ) -> None:
        """Tell the app of every change that moved keys away from this partition at a
        boundary it has delivered up to and the group has not acknowledged yet.

        Also when the group had reached the boundary before the change committed: that
        is the common case (produces are held during the barrier, so consumers catch
        up), and the app must flush its state for the keys all the same.
        """
        if check.first_revocation is None or state.delivered is None:
            return
        if state.delivered < check.first_revocation:
            return
        log, tp = check.runtime.state.log, check.tp
        if not revocations_due(log, tp.partition, state.delivered, self._acknowledged(tp.topic)):
            return
        await check.progress()  # reads the group's acknowledgements once per release
        for revocation in revocations_due(
            log, tp.partition, state.delivered, self._acknowledged(tp.topic)
        ):
            try:
                # Nothing of this instance waits for it: one try per poll, not a stall.
                pending = await self._revocation_pending(tp.topic, revocation, patient=False)
            except CallbackFailed as exc:
                _log.info("keys_revoked callback deferred to the next poll: %s", exc.message)
                return
            if pending is not None and pending not in events:
                events.append(pending)

    def _record_lag(self, tp: TopicPartition, state: _PartitionState) -> None:
        if self._consumer is None or state.delivered is None:
            return
        highwater = self._consumer.highwater(tp)
        if highwater is not None:
            self.consumers.lag(self.config.group, tp, max(0, highwater - state.delivered))

    async def _gate_allows(
        self,
        check: _PartitionCheck,
        record: ConsumerRecord[bytes, bytes],
        events: list[HandoffEvent],
    ) -> bool:
        runtime, tp = check.runtime, check.tp
        log = runtime.state.log
        header_generation = _header(record, GENERATION_HEADER)
        if header_generation is not None and int(header_generation) > log.current.number:
            # Written under a generation this sidecar has not read yet: read, then decide.
            await self.sidecar.refresh(runtime)
            return False
        try:
            generation = log.generation_of(tp.partition, record.offset)
        except ValueError:
            return False  # a partition the log does not know yet
        if generation in check.open_generations:
            return True
        waits = check.waits(generation)
        if not waits:
            return True
        progress = await check.progress()
        missing = unmet(waits, progress)
        if missing:
            for wait in missing:
                await self._announce_wait(tp.topic, wait.source, wait.boundary, wait.kind)
            return False
        await self._clear_waits(tp.topic)
        key = (tp.topic, tp.partition, generation)
        if key not in self._gate_reported:
            self._gate_reported.add(key)
            self._audit_gate_opened(log, progress, tp, record.offset, generation)
        if not self._ledger.acknowledged(HandoffKind.KEYS_ASSIGNED, *key):
            announced = await self._announce(
                HandoffKind.KEYS_ASSIGNED, tp.topic, tp.partition, generation, events
            )
            if not announced:
                return False
        check.open_generations.add(generation)
        return True

    def _audit_gate_opened(
        self,
        log: GenerationLog,
        progress: GroupProgress,
        tp: TopicPartition,
        offset: int,
        generation: int,
    ) -> None:
        evidence = [
            {
                "source": wait.source,
                "boundary": wait.boundary,
                "committed": progress.committed.get(wait.source),
                "log_start": progress.log_start.get(wait.source),
                "mode": progress.modes[wait.source].value
                if wait.source < len(progress.modes)
                else None,
            }
            for wait in waits_into(log, tp.partition, generation)
        ]
        self.sidecar.audit.emit(
            audit_events.gate_opened(
                group=self.config.group,
                instance=self.instance_id,
                topic=tp.topic,
                partition=tp.partition,
                offset=offset,
                generation=generation,
                evidence=evidence,
            )
        )

    def audit_delivered(self, result: PollResult) -> None:
        """Record what reached the app (called once the response is encoded)."""
        if not self.sidecar.audit.enabled:
            return
        rate = self.sidecar.settings.audit.sample_rate
        for record in result.records:
            if not key_sampled(record.key, rate):
                continue
            self.sidecar.audit.emit(
                audit_events.delivered(
                    group=self.config.group,
                    instance=self.instance_id,
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                    key=record.key,
                    headers={k: v for k, v in record.headers if v is not None},
                )
            )

    async def _progress(self, runtime: TopicRuntime, topic: str) -> GroupProgress:
        count = len(runtime.state.modes)
        kafka = self.sidecar.kafka
        committed = await kafka.committed_offsets(self.config.group, topic, count)
        log_start = await kafka.log_start_offsets(topic, count)
        await self._record_unrecorded()
        group_acknowledged = await self.sidecar.store.acknowledged_revocations(
            self.config.group, topic
        )
        self._ledger = self._ledger.with_group_revocations(topic, group_acknowledged)
        return GroupProgress(
            committed,
            dict(enumerate(log_start)),
            runtime.state.modes,
            revoked_through=revoked_through(runtime.state.log, self._acknowledged(topic)),
        )

    async def _pending_events(self) -> list[HandoffEvent]:
        """The events the app still has to acknowledge, less the keys_revoked the group
        acknowledged meanwhile through another instance (a previous owner of the
        partition, whose app got it first): those are told once, not again."""
        pending = self._ledger.pending.values()
        revoking = {e.topic for e in pending if e.kind is HandoffKind.KEYS_REVOKED}
        for topic in revoking:
            try:
                group = await self.sidecar.store.acknowledged_revocations(self.config.group, topic)
            except SidecarError:
                continue  # ZooKeeper away: tell what is pending, as before
            self._ledger = self._ledger.with_group_revocations(topic, group)
        return list(self._ledger.pending.values())

    def _acknowledged(self, topic: str) -> frozenset[tuple[int, int]]:
        return self._ledger.revocations(topic)

    async def _record_unrecorded(self) -> None:
        for topic, partition, generation in sorted(self._unrecorded):
            try:
                await self.sidecar.store.acknowledge_revocation(
                    self.config.group, topic, partition, generation
                )
            except SidecarError as exc:
                _log.info("keys_revoked acknowledgement kept for later: %s", exc.message)
                return
            self._unrecorded.discard((topic, partition, generation))

    async def _announce_wait(
        self, topic: str, source: int, boundary: int, kind: ChangeKind
    ) -> None:
        key = (topic, source, boundary)
        if key in self._waits:
            return
        self._waits[key] = (time.monotonic(), kind)
        self.consumers.gate_waiting(topic, self.config.group, +1)
        await self.sidecar.store.add_wait(
            self.config.group, topic, source, boundary, self.consumers.instance_key(self)
        )

    async def _clear_waits(self, topic: str) -> None:
        for key in [k for k in self._waits if k[0] == topic]:
            began, kind = self._waits.pop(key)
            self.consumers.gate_waiting(topic, self.config.group, -1)
            self.consumers.gate_waited(topic, self.config.group, kind, time.monotonic() - began)
            with contextlib.suppress(SidecarError):
                await self.sidecar.store.remove_wait(
                    self.config.group, *key, self.consumers.instance_key(self)
                )

    async def _help_waiters(self) -> None:
        """Commit at once what waiters need, if this instance auto-commits."""
        if not self.config.auto_commit:
            return
        for topic in {tp.topic for tp in self._partitions}:
            try:
                waits = await self.sidecar.store.waits(self.config.group, topic)
            except SidecarError:
                continue
            for tp, state in self._partitions.items():
                if tp.topic != topic or state.delivered is None:
                    continue
                boundary = waits.get(tp.partition)
                if boundary is not None and (state.committed or 0) < min(boundary, state.delivered):
                    await self._commit_quietly(force=True)
                    return

    # Hand-off announcements --------------------------------------------------------------------

    async def _announce(
        self,
        kind: HandoffKind,
        topic: str,
        partition: int,
        generation: int,
        events: list[HandoffEvent],
    ) -> bool:
        """Tell the app; True once it has confirmed (callback 2xx or event acknowledged)."""
        if self.config.callback_url is not None:
            await self._call_back(kind, topic, partition, generation)
            self._ledger = self._ledger.confirmed(kind, topic, partition, generation)
            return True
        self._ledger, event = self._ledger.tell(kind, topic, partition, generation)
        if event is None:
            return True
        if event not in events:
            events.append(event)
        return False

    async def acknowledge_events(self, event_ids: Iterable[int]) -> None:
        """The app handled these events. Raises BadRequest for an id that is not pending
        (and then acknowledges none of them)."""
        self._ledger, acknowledged = self._ledger.acknowledge(list(event_ids))
        for event in acknowledged:
            if event.kind is HandoffKind.KEYS_REVOKED:
                self._unrecorded.add(event.subject)
        await self._record_unrecorded()

    async def _call_back(
        self,
        kind: HandoffKind,
        topic: str,
        partition: int,
        generation: int,
        *,
        patient: bool = True,
        still_needed: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """POST the hand-off event and wait for a 2xx; retried for 30 s if ``patient``,
        else for one callback timeout. ``still_needed`` is asked before every attempt
        (False: done without calling). Raises CallbackFailed."""
        body = {
            "type": kind.value,
            "group": self.config.group,
            "instance_id": self.instance_id,
            "topic": topic,
            "partition": partition,
            "generation": generation,
        }
        within_s = self.config.callback_timeout_s
        if patient:
            within_s = max(30.0, within_s)
        failure = await self._post_callback(
            kind, body, within_s=within_s, still_needed=still_needed
        )
        if failure is not None:
            raise CallbackFailed(
                f"{kind.value} callback for {topic}[{partition}] failed: {failure}; "
                "nothing was delivered or committed past it, retry the request"
            )

    async def _post_callback(
        self,
        kind: HandoffKind | AssignmentChange,
        body: dict[str, Any],
        *,
        within_s: float,
        still_needed: Callable[[], Awaitable[bool]] | None = None,
    ) -> str | None:
        """POST ``body`` until a 2xx, retrying for ``within_s``; None, or the last failure."""
        assert self.config.callback_url is not None
        if self._http is None:
            self._http = aiohttp.ClientSession()
        deadline = time.monotonic() + within_s
        while True:
            try:
                if still_needed is not None and not await still_needed():
                    return None
            except SidecarError as exc:
                if time.monotonic() >= deadline:
                    return exc.message
                await asyncio.sleep(CALLBACK_RETRY_S)
                continue
            began = time.monotonic()
            try:
                async with self._http.post(
                    self.config.callback_url,
                    json=body,
                    timeout=aiohttp.ClientTimeout(total=self.config.callback_timeout_s),
                ) as response:
                    ok = 200 <= response.status < 300
                    reason = f"status {response.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                ok, reason = False, repr(exc)
            self.consumers.callback_done(kind, time.monotonic() - began, ok)
            if ok:
                return None
            if time.monotonic() >= deadline:
                return reason
            await asyncio.sleep(CALLBACK_RETRY_S)

    # Assignment notices -------------------------------------------------------------------

    def _must_tell_assigned(self, tp: TopicPartition) -> bool:
        """True while ``tp``'s records must wait for its partitions_assigned notice."""
        return self.config.assignment_events and not self.manual and tp not in self._told_assigned

    async def tell_revoked(self, partitions: Sequence[TopicPartition]) -> None:
        """Before the revocation's final commit (as Java's ``onPartitionsRevoked``): a
        callback the app can commit from, or a notice queued for the next response."""
        self._told_assigned -= set(partitions)
        if not self.config.assignment_events or not partitions:
            return
        notice = AssignmentNotice(AssignmentChange.PARTITIONS_REVOKED, tuple(partitions))
        if self.config.callback_url is not None:
            await self._call_back_notice(notice)
        else:
            async with self._delivery_lock:
                self._notices.append(notice)

    async def tell_assigned(self, partitions: Sequence[TopicPartition]) -> None:
        """Before the first record of ``partitions`` is released."""
        if not self.config.assignment_events:
            return
        notice = AssignmentNotice(AssignmentChange.PARTITIONS_ASSIGNED, tuple(partitions))
        if self.config.callback_url is not None:
            await self._call_back_notice(notice)
        async with self._delivery_lock:
            if self.config.callback_url is None:
                self._notices.append(notice)
            self._told_assigned |= set(partitions)

    async def _call_back_notice(self, notice: AssignmentNotice) -> None:
        # Bounded by the callback timeout and then given up (counted, logged): a
        # rebalance listener that never returns would get the member evicted.
        body = {
            "type": notice.kind.value,
            "group": self.config.group,
            "instance_id": self.instance_id,
            "partitions": [
                {"topic": tp.topic, "partition": tp.partition} for tp in notice.partitions
            ],
        }
        failure = await self._post_callback(
            notice.kind, body, within_s=self.config.callback_timeout_s
        )
        if failure is not None:
            _log.warning("%s callback gave up: %s", notice.kind.value, failure)

    # Offsets ------------------------------------------------------------------------------

    async def commit(self, offsets: Mapping[TopicPartition, int] | None) -> None:
        """Commit ``offsets`` (next offsets to read), or everything delivered if None.

        Raises BadRequest for an offset beyond what was delivered or a partition not
        assigned, ConsumerStateConflict if a keys-revoked event must be acknowledged
        first, CallbackFailed.
        """
        consumer = self._require_consumer()
        if offsets is None:
            offsets = {
                tp: state.delivered
                for tp, state in self._partitions.items()
                if state.delivered is not None
            }
        widened = {}
        for tp, offset in offsets.items():
            state = self._partitions.get(tp)
            if state is None:
                raise BadRequest(f"{tp.topic}[{tp.partition}] is not assigned to this instance")
            if state.delivered is None or offset > state.delivered:
                raise BadRequest(
                    f"offset {offset} of {tp.topic}[{tp.partition}] is beyond the delivered "
                    f"position {state.delivered if state.delivered is not None else 'none'}"
                )
            # The app names the last record it processed; what lies between it and the
            # delivered position was never for the app (markers, aborted records,
            # relocation tombstones), so the commit covers it too.
            widened[tp] = state.delivered if offset == state.released_to else offset
        offsets = widened
        to_commit: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, offset in offsets.items():
            await self._revoke_before(tp, offset)
            to_commit[tp] = OffsetAndMetadata(offset, "")
        if not to_commit:
            return
        try:
            await consumer.commit(to_commit)
        except KafkaError as exc:
            raise KafkaUnavailable(f"commit failed: {exc}") from exc
        for tp, meta in to_commit.items():
            if tp in self._partitions:
                self._partitions[tp].committed = meta.offset
            self.sidecar.audit.emit(
                audit_events.committed(
                    group=self.config.group,
                    instance=self.instance_id,
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=meta.offset,
                )
            )
        self.consumers.committed(self.config.group, to_commit)

    async def _revoke_before(self, tp: TopicPartition, offset: int) -> None:
        runtime = await self.sidecar.runtime(tp.topic)
        if runtime is None or not runtime.state.config.ordered_delivery:
            return
        state = self._partitions.get(tp)
        if state is None:
            # A rebalance took the partition while an earlier one of this commit waited
            # for its app: its new owner commits it now.
            raise ConsumerStateConflict(
                f"{tp.topic}[{tp.partition}] was reassigned by a rebalance during the commit"
            )
        before = state.committed
        if before is None:
            committed = await self.sidecar.kafka.committed_offsets(
                self.config.group, tp.topic, len(runtime.state.modes)
            )
            before = committed.get(tp.partition, 0)
        for revocation in revocations_crossed(runtime.state.log, tp.partition, before, offset):
            await self._require_revoked(tp.topic, revocation)

    async def _require_revoked(self, topic: str, revocation: Revocation) -> None:
        """Raises ConsumerStateConflict until the app has acknowledged ``revocation``."""
        pending = await self._revocation_pending(topic, revocation)
        if pending is not None:
            raise ConsumerStateConflict(
                f"acknowledge event {pending.event_id} (keys_revoked for {topic}"
                f"[{revocation.partition}]) before committing past offset "
                f"{revocation.boundary}; it is in the next records response"
            )

    async def _revocation_pending(
        self, topic: str, revocation: Revocation, *, patient: bool = True
    ) -> HandoffEvent | None:
        """None once the app knows of ``revocation`` (its callback answered, or its event
        was acknowledged, here or through another instance of the group); otherwise the
        event it still has to acknowledge, created on first need. In callback mode this
        calls the callback (see ``_call_back``; raises CallbackFailed)."""
        subject = (topic, revocation.partition, revocation.generation)
        if self._ledger.acknowledged(HandoffKind.KEYS_REVOKED, *subject):
            return None
        if self.config.callback_url is not None:
            await self._revoke_call(subject, patient=patient)
            await self._record_unrecorded()
            return None
        self._ledger, event = self._ledger.tell(HandoffKind.KEYS_REVOKED, *subject)
        return event

    async def _revoke_call(self, subject: tuple[str, int, int], *, patient: bool) -> None:
        """Call the keys_revoked callback for ``subject``, or join the call under way.

        A patient caller that joined an impatient call which failed calls again, with
        its own patience. Raises CallbackFailed.
        """
        while True:
            under_way = self._revoke_calls.get(subject)
            if under_way is None:
                call = asyncio.ensure_future(self._call_back_revoked(subject, patient=patient))
                under_way = (call, patient)
                self._revoke_calls[subject] = under_way
                call.add_done_callback(lambda done: self._revoke_call_ended(subject, done))
            call, call_patient = under_way
            try:
                # Shielded: a caller cancelled (a poll timing out) leaves the call to
                # the others, instead of cutting it off after the app may have acted.
                await asyncio.shield(call)
                return
            except CallbackFailed:
                if call_patient or not patient:
                    raise

    async def _call_back_revoked(self, subject: tuple[str, int, int], *, patient: bool) -> None:
        topic, partition, generation = subject

        async def not_acknowledged_yet() -> bool:
            # Asked again before every attempt: a call that waited (a retry, a rebalance,
            # a process paused past its sessions) may find that the partition's new owner
            # got it acknowledged meanwhile. While ZooKeeper cannot say, nothing is sent.
            group = await self.sidecar.store.acknowledged_revocations(self.config.group, topic)
            self._ledger = self._ledger.with_group_revocations(topic, group)
            return (partition, generation) not in group

        await self._call_back(
            HandoffKind.KEYS_REVOKED, *subject, patient=patient, still_needed=not_acknowledged_yet
        )
        # Noted before the call counts as ended, so that no caller in between finds it
        # neither acknowledged nor under way and calls the app again.
        self._ledger = self._ledger.with_group_revocations(subject[0], {subject[1:]})
        self._unrecorded.add(subject)

    def _revoke_call_ended(self, subject: tuple[str, int, int], call: asyncio.Task[None]) -> None:
        under_way = self._revoke_calls.get(subject)
        if under_way is not None and under_way[0] is call:
            del self._revoke_calls[subject]
        if not call.cancelled():
            call.exception()  # retrieved: every waiter got it, or none is left to

    async def settle_before_revoke(self, partitions: Sequence[TopicPartition]) -> None:
        """Before a rebalance takes ``partitions`` away, get the app's keys-revoked
        acknowledgements that committing everything delivered needs.

        Otherwise the commit would stop below a boundary and the partitions' next owner
        would deliver the records above it again. The rebalance waits (aiokafka awaits
        this listener) for at most ``REVOKE_ACK_WAIT_S``; the app keeps polling meanwhile
        and finds the events in its records responses.
        """
        pending: list[tuple[str, int, int]] = []
        for tp in partitions:
            state = self._partitions.get(tp)
            runtime = self.sidecar.topics.get(tp.topic)
            if state is None or state.delivered is None or runtime is None:
                continue
            before = state.committed or 0
            for revocation in revocations_crossed(
                runtime.state.log, tp.partition, before, state.delivered
            ):
                if await self._revocation_pending(tp.topic, revocation) is not None:
                    pending.append((tp.topic, revocation.partition, revocation.generation))
        deadline = time.monotonic() + REVOKE_ACK_WAIT_S
        while any((p, g) not in self._acknowledged(topic) for topic, p, g in pending):
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.02)

    async def record_before_revoke(self, partitions: Sequence[TopicPartition]) -> None:
        """Write the keys_revoked acknowledgements this instance still holds for
        ``partitions`` to ZooKeeper before a rebalance gives them away.

        Their next owner reads the group's acknowledgements before telling its app; one
        kept here (ZooKeeper was away when the app answered) would be told again. While
        ZooKeeper is away the rebalance waits, for at most ``REVOKE_ACK_WAIT_S``.
        """
        leaving = {(tp.topic, tp.partition) for tp in partitions}
        deadline = time.monotonic() + REVOKE_ACK_WAIT_S
        while True:
            held = [s for s in self._unrecorded if (s[0], s[1]) in leaving]
            if not held:
                return
            await self._record_unrecorded()
            if not any(s in self._unrecorded for s in held):
                return
            if time.monotonic() >= deadline:
                _log.warning(
                    "keys_revoked acknowledgements of %s not recorded before the rebalance; "
                    "the partitions' next owner may tell them again",
                    sorted(held),
                )
                return
            await asyncio.sleep(CALLBACK_RETRY_S)

    async def _commit_quietly(self, *, force: bool) -> None:
        """Auto-commit; a failure (a rebalance in progress, a coordinator moving) is
        retried at the next poll instead of failing the app's read."""
        try:
            await self._auto_commit(force=force)
        except SidecarError as exc:
            _log.info("auto-commit of %s deferred: %s", self.instance_id, exc.message)

    async def _auto_commit(self, *, force: bool) -> None:
        if not force and time.monotonic() - self._last_auto_commit < AUTO_COMMIT_INTERVAL_S:
            return
        self._last_auto_commit = time.monotonic()
        offsets = {}
        for tp, state in self._partitions.items():
            if state.delivered is None or state.delivered == state.committed:
                continue
            target = state.delivered
            runtime = await self.sidecar.runtime(tp.topic)
            if runtime is not None and self.config.callback_url is None:
                # Without a callback, stop below a revocation the app has not acknowledged.
                for revocation in revocations_crossed(
                    runtime.state.log, tp.partition, state.committed or 0, target
                ):
                    key = (revocation.partition, revocation.generation)
                    if key not in self._acknowledged(tp.topic):
                        with contextlib.suppress(ConsumerStateConflict):
                            await self._require_revoked(tp.topic, revocation)
                        target = min(target, revocation.boundary - 1)
            if target > (state.committed or 0):
                offsets[tp] = target
        if offsets:
            await self.commit(offsets)

    async def committed(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        consumer = self._require_consumer()
        result = {}
        for tp in partitions:
            try:
                offset = await consumer.committed(tp)
            except KafkaError as exc:
                raise KafkaUnavailable(f"reading committed offsets failed: {exc}") from exc
            if offset is not None:
                result[tp] = int(offset)
        return result

    def require_assigned(self, partitions: Iterable[TopicPartition]) -> None:
        """Raises ConsumerStateConflict (no consumer yet) or BadRequest (a partition not
        assigned to this instance)."""
        assigned = self._require_consumer().assignment()
        for tp in partitions:
            if tp not in assigned:
                raise BadRequest(f"{tp.topic}[{tp.partition}] is not assigned to this instance")

    async def seek(self, offsets: Mapping[TopicPartition, int]) -> None:
        consumer = self._require_consumer()
        self.require_assigned(offsets)
        for tp, offset in offsets.items():
            consumer.seek(tp, offset)
            self._partitions[tp] = _PartitionState(delivered=offset)

    async def seek_to_timestamps(self, timestamps: Mapping[TopicPartition, int]) -> None:
        consumer = self._require_consumer()
        # Before the lookup: for a partition not assigned (or of no topic) aiokafka waits
        # for metadata until the request timeout, holding the instance's lock.
        self.require_assigned(timestamps)
        try:
            found = await consumer.offsets_for_times(dict(timestamps))
        except KafkaError as exc:
            raise KafkaUnavailable(f"looking up offsets by time failed: {exc}") from exc
        offsets = {}
        for tp, hit in found.items():
            if hit is None:
                # No record at or after the time: the end, as Kafka's seek by time does.
                offsets[tp] = (await consumer.end_offsets([tp]))[tp]
            else:
                offsets[tp] = hit.offset
        await self.seek(offsets)

    async def seek_to(self, partitions: Sequence[TopicPartition], *, beginning: bool) -> None:
        consumer = self._require_consumer()
        self.require_assigned(partitions)
        if not partitions:
            return  # an empty list seeks none (aiokafka would read it as "all assigned")
        if beginning:
            await consumer.seek_to_beginning(*partitions)
        else:
            await consumer.seek_to_end(*partitions)
        for tp in partitions:
            self._partitions[tp] = _PartitionState(delivered=await consumer.position(tp))

    # Life cycle ---------------------------------------------------------------------------

    async def close(self) -> None:
        await self._stop_consumer()
        if self._http is not None:
            await self._http.close()

    async def _stop_consumer(self) -> None:
        for topic in {k[0] for k in self._waits}:
            await self._clear_waits(topic)
        if self._fetching is not None:
            self._fetching.cancel()  # it may wait for an assignment that never comes
            self._fetching = None
        for call, _ in list(self._revoke_calls.values()):
            call.cancel()
        if self._consumer is not None:
            if self.config.auto_commit:
                with contextlib.suppress(SidecarError, KafkaError):
                    await self._auto_commit(force=True)
            await self._consumer.stop()
            self._consumer = None

    def revoked(self, partitions: Iterable[TopicPartition]) -> None:
        gone = set(partitions)
        for tp in gone:
            self._partitions.pop(tp, None)
        # Their keys_revoked events are no longer this instance's to tell: the new owner
        # tells its app whatever the group has not acknowledged. An app that already
        # got one may still acknowledge it (and spare the new owner's app the telling).
        self._ledger = self._ledger.partitions_lost({(tp.topic, tp.partition) for tp in gone})

    async def _ensure_consumer(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            settings = self.sidecar.settings.kafka
            consumer = AIOKafkaConsumer(
                bootstrap_servers=settings.bootstrap_servers,
                client_id=f"{settings.client_id}-{self.instance_id}",
                group_id=self.config.group,
                enable_auto_commit=False,
                auto_offset_reset=self.config.auto_offset_reset,
                # Managed topics are written in transactions: what a fenced (zombie)
                # sidecar sent is aborted, and must never be read.
                isolation_level="read_committed",
                partition_assignment_strategy=(self.consumers.assignor,),
                # Added partitions are noticed (and the group rebalanced) within seconds.
                metadata_max_age_ms=METADATA_MAX_AGE_MS,
                request_timeout_ms=settings.request_timeout_ms,
                fetch_min_bytes=self.config.fetch_min_bytes,
                **dict(settings.client),
            )
            try:
                await consumer.start()
            except KafkaError as exc:
                raise KafkaUnavailable(f"cannot start a consumer: {exc}") from exc
            self._consumer = consumer
        return self._consumer

    def _require_consumer(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise ConsumerStateConflict("the instance is neither subscribed nor assigned")
        return self._consumer

    def _require_subscribed(self) -> AIOKafkaConsumer:
        consumer = self._require_consumer()
        if not (self.subscription or self.pattern or self.manual):
            raise ConsumerStateConflict("the instance is neither subscribed nor assigned")
        return consumer


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, instance: ConsumerInstance) -> None:
        self.instance = instance

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        instance = self.instance
        partitions = set(revoked)
        # From here on nothing more is released from these partitions.
        instance._revoking |= partitions
        try:
            await instance.tell_revoked(sorted(partitions))
            if instance.config.auto_commit:
                with contextlib.suppress(SidecarError, KafkaError):
                    # Outside the delivery lock: the app keeps polling, and finds and
                    # acknowledges the keys-revoked events this waits for.
                    await instance.settle_before_revoke(sorted(partitions))
            await instance.record_before_revoke(sorted(partitions))
            async with instance._delivery_lock:
                if instance.config.auto_commit:
                    with contextlib.suppress(SidecarError, KafkaError):
                        await instance._auto_commit(force=True)
                instance.revoked(partitions)
        finally:
            instance._revoking -= partitions

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        # Buffers start empty; positions come from the group's committed offsets.
        partitions = sorted(assigned)
        for tp in partitions:
            self.instance._partitions.setdefault(tp, _PartitionState())
        await self.instance.tell_assigned(partitions)


class Consumers:
    """Every consumer instance of this sidecar, by (group, name)."""

    def __init__(self, sidecar: Sidecar, *, instance_timeout_s: float = 300.0) -> None:
        self.sidecar = sidecar
        self.instance_timeout_s = instance_timeout_s
        self.instances: dict[tuple[str, str], ConsumerInstance] = {}
        self.assignor = _assignor_for(sidecar)
        self._reaper: asyncio.Task[None] | None = None
        sidecar.on_assignable_change(self._assignable_changed)

    def _assignable_changed(self, topic: str) -> None:
        rejoined = [
            i.instance_id for i in self.instances.values() if i.rebalance_if_subscribed(topic)
        ]
        if rejoined:
            _log.info("%s: assignable partitions changed; rebalancing %s", topic, rejoined)

    def instance_key(self, instance: ConsumerInstance) -> str:
        return f"{self.sidecar.sidecar_id}-{instance.instance_id}"

    async def create(self, config: InstanceConfig) -> ConsumerInstance:
        key = (config.group, config.name)
        if key in self.instances:
            raise ConsumerStateConflict(
                f"consumer instance {config.name} already exists in group {config.group}"
            )
        instance = ConsumerInstance(config, self.sidecar, self)
        self.instances[key] = instance
        await self.sidecar.store.register_group(config.group)
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._expire_idle())
        return instance

    def get(self, group: str, name: str) -> ConsumerInstance:
        instance = self.instances.get((group, name))
        if instance is None:
            raise UnknownConsumerInstance(f"consumer instance {name} not found in group {group}")
        instance.last_used = time.monotonic()
        return instance

    async def delete(self, group: str, name: str) -> None:
        instance = self.get(group, name)
        del self.instances[(group, name)]
        async with instance.lock:
            await instance.close()

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for key in list(self.instances):
            await self.instances.pop(key).close()

    async def _expire_idle(self) -> None:
        while True:
            await asyncio.sleep(min(10.0, self.instance_timeout_s / 2))
            now = time.monotonic()
            for key, instance in list(self.instances.items()):
                if (
                    now - instance.last_used > self.instance_timeout_s
                    and not instance.lock.locked()
                ):
                    _log.info("consumer instance %s of %s expired (idle)", key[1], key[0])
                    del self.instances[key]
                    await instance.close()

    # Metrics hooks ------------------------------------------------------------------------

    def metrics_delivered(
        self, tp: TopicPartition, records: Sequence[Delivered], runtime: TopicRuntime | None
    ) -> None:
        if not records:
            return
        metrics = self.sidecar.metrics
        metrics.delivered_records.labels(tp.topic, str(tp.partition)).inc(len(records))
        if runtime is not None:
            without = sum(_header(r.source, SIDECAR_HEADER) is None for r in records)
            if without:
                metrics.records_without_headers.labels(tp.topic).inc(without)

    def gate_waiting(self, topic: str, group: str, delta: int) -> None:
        self.sidecar.metrics.gated_partitions.labels(topic, group).inc(delta)

    def gate_waited(self, topic: str, group: str, kind: ChangeKind, seconds: float) -> None:
        self.sidecar.metrics.gate_wait_seconds.labels(topic, group, kind.value).observe(seconds)

    def callback_done(self, kind: HandoffKind | AssignmentChange, seconds: float, ok: bool) -> None:
        metrics = self.sidecar.metrics
        metrics.callback_seconds.labels(kind.value).observe(seconds)
        if not ok:
            metrics.callback_failures.labels(kind.value).inc()

    def lag(self, group: str, tp: TopicPartition, records: int) -> None:
        self.sidecar.metrics.consumer_lag.labels(group, tp.topic, str(tp.partition)).set(records)

    def committed(self, group: str, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        for tp in offsets:
            self.sidecar.metrics.commits.labels(group, tp.topic).inc()


def _assignor_for(sidecar: Sidecar) -> type[AbstractPartitionAssignor]:
    """An aiokafka assignor class that balances read-write and read-only partitions
    separately, with this sidecar's view of the managed topics' modes."""

    def modes_of(topic: str) -> Sequence[PartitionMode] | None:
        runtime = sidecar.topics.get(topic)
        return None if runtime is None else runtime.state.modes

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


def _header(record: ConsumerRecord[bytes, bytes], name: str) -> bytes | None:
    for key, value in record.headers:
        if key == name:
            return bytes(value) if value is not None else None
    return None


def _delivered(record: ConsumerRecord[bytes, bytes]) -> Delivered:
    return Delivered(
        record.topic,
        record.partition,
        record.offset,
        record.key,
        record.value,
        record.headers,
        record,
    )


def fetch_position(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
    """The consumer's position in ``tp`` (the offset after the last record, marker or
    aborted record its fetches returned), or None while it is unknown or ``tp`` is not
    assigned. ``AIOKafkaConsumer.position`` waits while a position is being reset; the
    release path must not, so this reads the same state without waiting."""
    subscription = consumer._subscription.subscription
    assignment = None if subscription is None else subscription.assignment
    if assignment is None or tp not in assignment.tps:
        return None
    state = assignment.state_value(tp)
    return int(state.position) if state.has_valid_position else None


def _retrieve_outcome(future: asyncio.Future[Any]) -> None:
    # A fetch left running when its instance closes ends with an error nobody awaits.
    if not future.cancelled():
        future.exception()


def new_instance_name() -> str:
    return f"instance-{uuid.uuid4().hex[:12]}"
