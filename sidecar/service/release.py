"""Releasing buffered records to the app through the gate (DESIGN §6).

Records are released only at delivery time, one partition head at a time, when the
core's gate is open for it. The gate is judged from the group's *committed* offsets in
Kafka, log-start offsets and partition modes, so it is the same for every instance of
the group and survives restarts and rebalances; nothing relies on pausing (aiokafka
forgets pauses on a rebalance).

What to release, and what must happen first, is the core's decision
(``sidecar.core.release``: the gate, "keys assigned" before the first gated record of
``p``, "keys revoked" once the instance consuming ``q`` has delivered it up to a
boundary where ``q``'s keys moved away, and before it delivers past it); this module
gathers what the decision needs (the group's progress, the instance's state), does what
it returns, and asks again with the inputs read after its last await.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sidecar.audit import events as audit_events
from sidecar.audit.events import key_sampled
from sidecar.core.consume import ConsumedRecord, TopicPartition
from sidecar.core.errors import CallbackFailed
from sidecar.core.gate import GroupProgress, WaitKey, waits_into
from sidecar.core.generations import GenerationLog
from sidecar.core.handoff import (
    HandoffEvent,
    HandoffKind,
    Notice,
    Subject,
    revoked_through,
)
from sidecar.core.positions import PartitionPosition
from sidecar.core.release import (
    Blocked,
    Deliver,
    Done,
    GateOpened,
    NeedProgress,
    PartitionRelease,
    ReadLog,
    ReleaseInputs,
    ResponseFull,
    Room,
    Skip,
    TellAssigned,
    TellRevoked,
)
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
    notices: list[Notice] = field(default_factory=list)
    """Rebalances (only with ``InstanceConfig.assignment_events``) and truncations since
    the last response, in order, for an app without a callback URL; they precede
    ``events`` and ``records``."""


class GroupProgressReads:
    """The group's progress in each topic, read at most once per release."""

    def __init__(self, state: ConsumeState, offsets: GroupOffsets, teller: HandoffTeller) -> None:
        self._state = state
        self._offsets = offsets
        self._teller = teller
        self._read: dict[str, GroupProgress] = {}

    def known(self, topic: str) -> GroupProgress | None:
        """The group's progress in ``topic`` if read in this release."""
        return self._read.get(topic)

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
        notices: list[Notice],
        max_bytes: int | None,
    ) -> PollResult:
        response = _Response(released, events, max_bytes)
        released_from: set[TopicPartition] = set()
        progress = GroupProgressReads(self.state, self.context.offsets, self.teller)
        positions = self.state.positions
        for tp in sorted(positions):
            state = positions.get(tp)
            if state is None:
                continue  # revoked by a rebalance while this loop awaited
            if self.state.notices.must_tell_assigned(tp, manual=bool(self.state.manual)):
                continue
            runtime = await self.context.registry.runtime(tp.topic)
            released_before = len(released)
            full = await self._release_partition(tp, state, runtime, response, progress)
            # Counted once per partition and release: per record, the labelled metric
            # lookups cost as much as the rest of the release.
            if len(released) > released_before:
                released_from.add(tp)
            self.context.metrics.delivered(tp, released[released_before:], runtime is not None)
            if full:
                break
            self._record_lag(tp, state)
        return self._still_assigned(PollResult(released, events, notices), released_from)

    async def _release_partition(
        self,
        tp: TopicPartition,
        state: PartitionPosition[ConsumedRecord],
        runtime: TopicRuntime | None,
        response: _Response,
        progress: GroupProgressReads,
    ) -> bool:
        """Do what the core's step says for ``tp`` until it is done; True if the
        response is full (nothing more is released from any partition)."""
        gated = self.context.gated(runtime)
        decision = PartitionRelease[ConsumedRecord](
            tp.topic, tp.partition, managed=runtime is not None
        )
        positions = self.state.positions
        full = False
        while True:
            # Every input is read here, after the last await: a rebalance that began,
            # a log read anew or the group's acknowledgements read meanwhile count
            # before anything more is released or told.
            step = decision.next_step(
                ReleaseInputs(
                    head=state.buffer,
                    delivered=state.delivered,
                    log=runtime.state.log if runtime is not None and gated else None,
                    progress=progress.known(tp.topic),
                    ledger=self.state.ledger,
                    room=Room(response.max_bytes, response.size, len(response.records)),
                    revoking=tp in self.state.revoking,
                    reading_ended=positions.get(tp) is not state,
                )
            )
            match step:
                case Deliver(count=count, size=size):
                    records = response.records
                    for _ in range(count):
                        records.append(positions.release(tp))
                    response.size += size
                case Skip():
                    positions.skip(tp)
                case NeedProgress():
                    assert runtime is not None
                    await progress.of(runtime, tp.topic)
                case ReadLog():
                    # Written under a generation this sidecar has not read yet: read, then
                    # decide (at the next poll).
                    assert runtime is not None
                    await self.context.registry.refresh(runtime)
                case Blocked(waits=waits):
                    for wait in waits:
                        key = WaitKey(tp.topic, wait.source, wait.boundary)
                        await self.waits.announce(key, wait.kind)
                case GateOpened(subject=subject, offset=offset):
                    await self.waits.clear(tp.topic)
                    if subject not in self._gate_reported:
                        self._gate_reported.add(subject)
                        self._audit_gate_opened(runtime, progress, subject, offset)
                case TellAssigned(subject=subject):
                    await self.teller.announce(HandoffKind.KEYS_ASSIGNED, subject, response.events)
                case TellRevoked(revocation=revocation, patient=True):
                    pending = await self.teller.revocation_pending(tp.topic, revocation)
                    response.tell(pending)
                case TellRevoked(revocation=revocation):
                    try:
                        # Nothing of this instance waits for it: one try per poll, not a
                        # stall.
                        pending = await self.teller.revocation_pending(
                            tp.topic, revocation, patient=False
                        )
                    except CallbackFailed as exc:
                        _log.info(
                            "keys_revoked callback deferred to the next poll: %s", exc.message
                        )
                        return full
                    response.tell(pending)
                case ResponseFull():
                    full = True
                case Done():
                    return full

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

    # Audit --------------------------------------------------------------------------------

    def _audit_gate_opened(
        self,
        runtime: TopicRuntime | None,
        progress: GroupProgressReads,
        subject: Subject,
        offset: int,
    ) -> None:
        assert runtime is not None
        read = progress.known(subject.topic)
        assert read is not None  # a gate with waits is judged by the group's progress
        log: GenerationLog = runtime.state.log
        evidence = [
            {
                "source": wait.source,
                "boundary": wait.boundary,
                "committed": read.committed.get(wait.source),
                "log_start": read.log_start.get(wait.source),
                "mode": read.modes[wait.source].value if wait.source < len(read.modes) else None,
            }
            for wait in waits_into(log, subject.partition, subject.generation)
        ]
        self.context.audit.emit(
            audit_events.gate_opened(
                group=self.state.group,
                instance=self.state.instance_id,
                topic=subject.topic,
                partition=subject.partition,
                offset=offset,
                generation=subject.generation,
                evidence=evidence,
            )
        )

    def audit_delivered(self, result: PollResult) -> None:
        """Record what reached the app (called once the response is encoded)."""
        audit = self.context.audit
        if not audit.enabled:
            return
        rate = self.context.audit_sample_rate
        topics = self.context.registry.topics
        # Records are released only in the assignment they were fetched in (a rebalance
        # ends every reading of the one before).
        consumer = self.state.consumer
        assignment = None if consumer is None else consumer.incarnation()
        for record in result.records:
            if not key_sampled(record.key, rate):
                continue
            # The topic's promise, not this consumer's gate: an ungated delivery of an
            # ordered topic is what the audit is there to catch.
            runtime = topics.get(record.topic)
            ordered = runtime is not None and runtime.state.config.ordered_delivery
            audit.emit(
                audit_events.delivered(
                    group=self.state.group,
                    instance=self.state.instance_id,
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                    key=record.key,
                    headers=record.headers,
                    ordered=ordered,
                    assignment=assignment,
                )
            )


@dataclass
class _Response:
    """The response one release builds."""

    records: list[ConsumedRecord]
    events: list[HandoffEvent]
    max_bytes: int | None
    size: int = 0
    """Bytes of keys and values of ``records``."""

    def tell(self, event: HandoffEvent | None) -> None:
        """``event`` goes in the response, once (None: nothing to tell)."""
        if event is not None and event not in self.events:
            self.events.append(event)
