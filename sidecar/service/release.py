"""Releasing buffered records to the app through the gate (DESIGN §6).

Records are released only at delivery time, one partition head at a time, when the
core's gate is open for it. The gate is judged from the group's *committed* offsets in
Kafka, log-start offsets and partition modes, so it is the same for every instance of
the group and survives restarts and rebalances; nothing relies on pausing (aiokafka
forgets pauses on a rebalance).

Key hand-off: once the instance consuming ``q`` has delivered it up to a boundary where
``q``'s keys moved away (also when that happened before the change: a caught-up
group), and before it delivers past it, the app is told "keys revoked"
(``_tell_due_revocations``, ``_revoked_before``); before the first gated record of
``p`` is delivered, "keys assigned" (``_gate_allows``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sidecar.audit import events as audit_events
from sidecar.audit.events import key_sampled
from sidecar.core.consume import ConsumedRecord, TopicPartition
from sidecar.core.errors import CallbackFailed
from sidecar.core.gate import GroupProgress, Wait, WaitKey, unmet, waits_into
from sidecar.core.generations import GenerationLog
from sidecar.core.handoff import (
    AssignmentNotice,
    HandoffEvent,
    HandoffKind,
    Subject,
    revocation_points,
    revocations_due,
    revoked_through,
)
from sidecar.core.placement import RELOCATION_HEADER, header_value, routed_generation
from sidecar.core.positions import PartitionPosition
from sidecar.service.consume_context import ConsumeContext, GroupOffsets
from sidecar.service.consume_state import ConsumeState
from sidecar.service.handoff import HandoffTeller
from sidecar.service.registry import TopicRuntime
from sidecar.service.waits import GateWaits

_log = logging.getLogger(__name__)


@dataclass
class PollResult:
    records: list[ConsumedRecord]
    """Released records as the consumer returned them: no copy between aiokafka and the
    response encoder."""
    events: list[HandoffEvent]
    notices: list[AssignmentNotice] = field(default_factory=list)
    """Rebalances since the last response, in order; they precede ``events`` and
    ``records`` (only with ``InstanceConfig.assignment_events`` in events mode)."""


class PartitionCheck:
    """What the gate needs of one partition during one release, each part computed once."""

    def __init__(
        self, runtime: TopicRuntime | None, tp: TopicPartition, progress: GroupProgressReads
    ) -> None:
        assert runtime is not None
        self.runtime = runtime
        self.tp = tp
        self.revocations = revocation_points(runtime.state.log, tp.partition)
        self.first_revocation = min((r.boundary for r in self.revocations), default=None)
        """Below this offset no record needs a keys-revoked check (None: none ever)."""
        self.open_generations: set[int] = set()
        """Generations whose gate this release found open (and announced): the offsets it
        judged by are read once per release, so later records of them pass alike."""
        self.decided_until = -1
        """Records below this offset need no gate or keys_revoked check in this release:
        the last check found the gate open for their generation and the app told of
        every revocation below it (see ``Release._decide_run``)."""
        self.decided_generation: int | None = None
        """The generation of the records up to ``decided_until``, when that run ends
        only where the log does (the current generation, which may be 0); None
        otherwise."""
        self._waits: dict[int, tuple[Wait, ...]] = {}
        self._progress = progress

    def waits(self, generation: int) -> tuple[Wait, ...]:
        if generation not in self._waits:
            self._waits[generation] = waits_into(
                self.runtime.state.log, self.tp.partition, generation
            )
        return self._waits[generation]

    def decided(self, record: ConsumedRecord) -> bool:
        """True if ``record`` lies in the run the last check decided for: released
        without asking again (one decision per run of records, not per record)."""
        if record.offset >= self.decided_until:
            return False
        if self.decided_generation is not None:
            # A run of the current generation ends only where the log does; a record
            # written under a generation this sidecar has not read yet must be judged.
            written = routed_generation(record.headers)
            return written is None or written <= self.decided_generation
        return True

    def decide_run(self, offset: int) -> None:
        """The gate and keys_revoked checks passed for the record at ``offset``: every
        later record of its generation passes them too, up to the next boundary where
        keys moved away from this partition (``_revoked_before`` asks again there)."""
        log = self.runtime.state.log
        try:
            _, end = log.generation_span(self.tp.partition, offset)
        except ValueError:
            return
        next_revocation = min(
            (r.boundary for r in self.revocations if r.boundary > offset), default=None
        )
        ends = [bound for bound in (end, next_revocation) if bound is not None]
        if ends:
            self.decided_until = min(ends)
            self.decided_generation = None if end is not None else log.current.number
        else:
            self.decided_until = 1 << 63
            self.decided_generation = log.current.number

    async def progress(self) -> GroupProgress:
        """The group's offsets for the topic, read at most once per release."""
        return await self._progress.of(self.runtime, self.tp.topic)


class GroupProgressReads:
    """The group's progress in each topic, read at most once per release."""

    def __init__(self, state: ConsumeState, offsets: GroupOffsets, teller: HandoffTeller) -> None:
        self._state = state
        self._offsets = offsets
        self._teller = teller
        self._read: dict[str, GroupProgress] = {}

    async def of(self, runtime: TopicRuntime, topic: str) -> GroupProgress:
        """The group's offsets of ``topic`` and the hand-off it acknowledged (read into
        the instance's ledger). Raises SidecarError while Kafka or ZooKeeper cannot say."""
        if topic not in self._read:
            count = len(runtime.state.modes)
            committed = await self._offsets.committed_offsets(self._state.group, topic, count)
            log_start = await self._offsets.log_start_offsets(topic, count)
            acknowledged = await self._teller.read_group(topic)
            self._read[topic] = GroupProgress(
                committed,
                dict(enumerate(log_start)),
                runtime.state.modes,
                revoked_through=revoked_through(runtime.state.log, acknowledged),
            )
        return self._read[topic]


class Release:
    """One instance's release loop: buffers → gate → hand-off → the app."""

    def __init__(
        self,
        state: ConsumeState,
        context: ConsumeContext,
        teller: HandoffTeller,
        waits: GateWaits,
    ) -> None:
        self.state = state
        """The instance's shared state: positions, notices, the ledger, what is being
        revoked, its consumer."""
        self.context = context
        self.teller = teller
        """Tells the app of key hand-off."""
        self.waits = waits
        """Announces the gate's waits in ZooKeeper."""
        self._gate_reported: set[Subject] = set()

    # Releasing ----------------------------------------------------------------------------

    async def release(self, max_bytes: int | None) -> PollResult:
        """Release what the gate lets through, up to ``max_bytes``. Called under the
        instance's delivery lock: a rebalance listener commits what was delivered only
        once no release runs, so a record can never be released after the commit that
        hands its partition over."""
        # A response is confirmed or put back before the next poll; one neither (a
        # failure between the two) is put back: delivered twice, never skipped.
        self.state.positions.unsent()
        if self.state.fenced:
            # After a stall nothing is released until the group has rebalanced: the
            # partitions may be another instance's by now (ConsumeState.fence).
            return PollResult([], [], [])
        released: list[ConsumedRecord] = []
        events = await self.teller.pending_events()
        # Under the delivery lock, which the rebalance listener takes to queue them.
        notices = self.state.notices.take()
        try:
            return await self._release_partitions(released, events, notices, max_bytes)
        except BaseException:
            # A callback that failed, ZooKeeper or Kafka away: what was taken from the
            # buffers goes back, so it is delivered, never lost, on the next poll.
            self.undeliver(PollResult(released, [], notices))
            raise

    def undeliver(self, result: PollResult) -> None:
        """Put back what was released but could not be sent to the app."""
        self.state.notices.put_back(result.notices)
        self.state.positions.unsent()

    def sent(self) -> None:
        """The last response reached the app: what it released counts as delivered."""
        self.state.positions.sent()

    async def _release_partitions(
        self,
        released: list[ConsumedRecord],
        events: list[HandoffEvent],
        notices: list[AssignmentNotice],
        max_bytes: int | None,
    ) -> PollResult:
        size = 0
        released_from: set[TopicPartition] = set()
        progress = GroupProgressReads(self.state, self.context.offsets, self.teller)
        registry = self.context.registry
        positions = self.state.positions
        for tp in sorted(positions):
            state = positions.get(tp)
            if state is None:
                continue  # revoked by a rebalance while this loop awaited
            if self.state.notices.must_tell_assigned(tp, manual=bool(self.state.manual)):
                continue
            runtime = await registry.runtime(tp.topic)
            gated = runtime is not None and runtime.state.config.ordered_delivery
            # Per partition and release, computed once: the waits of each generation and
            # the boundaries where keys moved away; the group's offsets only if needed.
            check = PartitionCheck(runtime, tp, progress) if gated else None
            released_before = len(released)
            full = False
            # A rebalance's listener replaces the states only under the delivery lock,
            # held here; the identity check keeps that an invariant, not a hope.
            while state.buffer and tp not in self.state.revoking and positions.get(tp) is state:
                record = state.buffer[0]
                # Relocation tombstones are tombstones: only null values are looked at.
                if (
                    record.value is None
                    and runtime is not None
                    and header_value(record.headers, RELOCATION_HEADER) == b"1"
                ):
                    positions.skip(tp)
                    continue
                if check is not None and not check.decided(record):
                    if not await self._gate_allows(check, record, events):
                        break
                    if not await self._revoked_before(check, record.offset, events):
                        break
                    if tp in self.state.revoking or positions.get(tp) is not state:
                        break  # a rebalance started while the gate was consulted
                    check.decide_run(record.offset)
                record_size = len(record.key or b"") + len(record.value or b"")
                if max_bytes is not None and released and size + record_size > max_bytes:
                    full = True
                    break
                positions.release(tp)
                size += record_size
                released.append(record)
            # Events go before records in a response: a revocation told alongside the
            # partition's last records would reach the app before them. Next poll, then.
            nothing_released = len(released) == released_before
            if check is not None and tp not in self.state.revoking and nothing_released:
                await self._tell_due_revocations(check, state, events)
            # Counted once per partition and release: per record, the labelled metric
            # lookups cost as much as the rest of the release.
            if len(released) > released_before:
                released_from.add(tp)
            self.context.metrics.delivered(tp, released[released_before:], runtime is not None)
            if full:
                break
            self._record_lag(tp, state)
        return self._still_assigned(PollResult(released, events, notices), released_from)

    def _still_assigned(self, result: PollResult, released_from: set[TopicPartition]) -> PollResult:
        """Drop what was released from partitions that are no longer assigned (lost in a
        rebalance without a revocation): their new owner delivers them."""
        consumer = self.state.consumer
        if consumer is None:
            return result
        assigned = consumer.assignment()
        if released_from <= assigned:
            return result  # the common case, decided per partition, not per record
        lost = {tp for tp in released_from if tp not in assigned}
        for tp in sorted(lost):
            _log.info(
                "%s[%d]: released records put back, the partition was lost to a rebalance",
                tp.topic,
                tp.partition,
            )
        # Never committed as delivered: the partition's next owner delivers them.
        self.state.positions.unsent(lost)
        kept = [r for r in result.records if TopicPartition(r.topic, r.partition) not in lost]
        return PollResult(kept, result.events, result.notices)

    def _record_lag(self, tp: TopicPartition, state: PartitionPosition[ConsumedRecord]) -> None:
        consumer = self.state.consumer
        released_to = state.released_to
        if consumer is None or released_to is None:
            return
        highwater = consumer.highwater(tp)
        if highwater is not None:
            self.context.metrics.lag(self.state.group, tp, max(0, highwater - released_to))

    # The gate -----------------------------------------------------------------------------

    async def _gate_allows(
        self, check: PartitionCheck, record: ConsumedRecord, events: list[HandoffEvent]
    ) -> bool:
        runtime, tp = check.runtime, check.tp
        log = runtime.state.log
        header_generation = routed_generation(record.headers)
        if header_generation is not None and header_generation > log.current.number:
            # Written under a generation this sidecar has not read yet: read, then decide.
            await self.context.registry.refresh(runtime)
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
        if tp in self.state.revoking:
            return False  # a rebalance began during the read: the next owner judges it
        missing = unmet(waits, progress)
        if missing:
            for wait in missing:
                await self.waits.announce(WaitKey(tp.topic, wait.source, wait.boundary), wait.kind)
            return False
        await self.waits.clear(tp.topic)
        subject = Subject(tp.topic, tp.partition, generation)
        if subject not in self._gate_reported:
            self._gate_reported.add(subject)
            self._audit_gate_opened(log, progress, tp, record.offset, generation)
        if tp in self.state.revoking:
            # A rebalance began while the waits were withdrawn: keys_assigned told now
            # would stay pending for a partition this instance no longer reads.
            return False
        if not self.state.ledger.acknowledged(HandoffKind.KEYS_ASSIGNED, *subject):
            announced = await self.teller.announce(HandoffKind.KEYS_ASSIGNED, subject, events)
            if not announced:
                return False
        check.open_generations.add(generation)
        return True

    async def _revoked_before(
        self, check: PartitionCheck, offset: int, events: list[HandoffEvent]
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
            subject = Subject(check.tp.topic, revocation.partition, revocation.generation)
            if not self.state.ledger.acknowledged(HandoffKind.KEYS_REVOKED, *subject):
                # Another instance may have got it acknowledged (this partition's owner
                # before a rebalance): read the group's acknowledgements first, once per
                # release, and never tell it while ZooKeeper cannot say (this raises).
                await check.progress()
            if check.tp in self.state.revoking:
                return False  # a rebalance takes the partition: its next owner tells it
            pending = await self.teller.revocation_pending(check.tp.topic, revocation)
            if pending is not None:
                if pending not in events:
                    events.append(pending)
                return False
        return True

    async def _tell_due_revocations(
        self,
        check: PartitionCheck,
        state: PartitionPosition[ConsumedRecord],
        events: list[HandoffEvent],
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
        ledger = self.state.ledger
        if not revocations_due(log, tp.partition, state.delivered, ledger.revocations(tp.topic)):
            return
        await check.progress()  # reads the group's acknowledgements once per release
        acknowledged = self.state.ledger.revocations(tp.topic)
        for revocation in revocations_due(log, tp.partition, state.delivered, acknowledged):
            if tp in self.state.revoking:
                # A rebalance began while the group's acknowledgements were read: it
                # waits only for what was told before it (``record_before_revoke``), so
                # an event told now would go out as the partition's next owner tells
                # its own app.
                return
            try:
                # Nothing of this instance waits for it: one try per poll, not a stall.
                pending = await self.teller.revocation_pending(tp.topic, revocation, patient=False)
            except CallbackFailed as exc:
                _log.info("keys_revoked callback deferred to the next poll: %s", exc.message)
                return
            if pending is not None and pending not in events:
                events.append(pending)

    # Audit --------------------------------------------------------------------------------

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
        self.context.audit.emit(
            audit_events.gate_opened(
                group=self.state.group,
                instance=self.state.instance_id,
                topic=tp.topic,
                partition=tp.partition,
                offset=offset,
                generation=generation,
                evidence=evidence,
            )
        )

    def audit_delivered(self, result: PollResult) -> None:
        """Record what reached the app (called once the response is encoded)."""
        audit = self.context.audit
        if not audit.enabled:
            return
        rate = self.context.audit_sample_rate
        for record in result.records:
            if not key_sampled(record.key, rate):
                continue
            audit.emit(
                audit_events.delivered(
                    group=self.state.group,
                    instance=self.state.instance_id,
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                    key=record.key,
                    headers=record.headers,
                )
            )
