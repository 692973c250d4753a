"""Retiring read-only partitions (DESIGN §5 "Retirement", seed 003).

A shrink leaves the partitions above the new count read-only: still read, never
written. Each round, for each such partition, the core's ``retirement_action``
decides from its log start and end, the consumer groups' committed offsets and its
delete-after time:

* empty (log start = log end) and no group that read it owes a keys_revoked of it:
  removed (a partition truncated, brought back by an expansion and retired again before
  anything was written to it is empty, yet a group may still have to be told);
* consumed to its end by every consumer group registered with the sidecars, each of
  which has also acknowledged every ``keys_revoked`` of it: truncated with
  DeleteRecords, then removed;
* past its delete-after time: removed (its data stays in Kafka, unread).

While a transaction is open in a partition (its last stable offset below its high
watermark) only the delete-after time retires it: the records past the stable offset
may still be committed, so it is neither empty nor consumed to its end yet.

Why the acknowledgements: a removed partition is assigned to nobody, so a keys_revoked
of it still unacknowledged would be told by nobody, and the gate counts a removed source
as met: the destination's records would be released before the app flushed the keys'
state (or the revocation told late, after a later expansion brings the partition back).

Choice where the design is silent: with *no* registered consumer group nothing is
truncated (only emptiness or the delete-after delay retire a partition), because
"every known group has consumed it" would then hold vacuously and delete data that
consumers outside the sidecars may still need.
"""

from __future__ import annotations

import logging
import time

from sidecar.audit.emitter import AuditEmitter
from sidecar.core.generations import (
    PartitionMode,
    RetirementAction,
    RetirementView,
    partitions_in_mode,
    retirement_action,
)
from sidecar.core.handoff import revocations_due
from sidecar.metrics import SidecarMetrics
from sidecar.service.boundaries import BoundaryCheck
from sidecar.service.change_ports import RetirementKafka, RetirementStore

_log = logging.getLogger(__name__)


class Retirer:
    def __init__(
        self,
        sidecar_id: str,
        store: RetirementStore,
        kafka: RetirementKafka,
        metrics: SidecarMetrics,
        *,
        lock_timeout_s: float = 0.5,
        audit: AuditEmitter | None = None,
    ) -> None:
        self.lock_timeout_s = lock_timeout_s
        self.boundaries = BoundaryCheck(kafka, store, metrics, audit)
        self.sidecar_id = sidecar_id
        self.store = store
        self.kafka = kafka
        self.metrics = metrics

    async def retire(self, topic: str) -> dict[int, RetirementAction]:
        """One round for ``topic``; returns what was done per read-only partition.

        Raises SidecarError subclasses (OperationInProgress while a change holds the
        topic's lock, BoundaryTruncated, MetadataUnavailable, KafkaUnavailable): the
        caller retries later.
        """
        state = await self.store.read_topic(topic)
        read_only = partitions_in_mode(state.modes, PartitionMode.READ_ONLY)
        if not read_only:
            return {}
        # Retiring truncates with DeleteRecords up to ends the gate trusts only while every
        # boundary is intact (KIP-320): a lost one refuses the round (BoundaryTruncated).
        await self.boundaries.require_intact(topic, state.log, "retirement")
        count = len(state.modes)
        starts = await self.kafka.log_start_offsets(topic, count)
        ends = await self.kafka.end_offsets(topic, count)
        # Read after the stable offsets: equal to them, no transaction was open when
        # those were read. A read-only partition takes no new transaction, but one left
        # open (a warm-up's, a writer's outside the sidecars) holds the stable offset at
        # its first record until it ends.
        highs = await self.kafka.high_watermarks(topic, count)
        groups = await self.store.known_groups()
        committed = [await self.kafka.committed_offsets(g, topic, count) for g in groups]
        acknowledged = [await self.store.acknowledged_revocations(g, topic) for g in groups]
        now = time.time()
        decisions: dict[int, RetirementAction] = {}
        for partition in read_only:
            delete_after = (
                state.delete_after[partition] if partition < len(state.delete_after) else None
            )
            consumed = bool(groups) and all(
                offsets.get(partition, -1) >= ends[partition]
                and not revocations_due(state.log, partition, ends[partition], acked)
                for offsets, acked in zip(committed, acknowledged, strict=True)
            )
            # A group that never committed an offset here never read the partition: it
            # has no state to flush (the gate spares it the wait too).
            pending = any(
                partition in offsets
                and bool(revocations_due(state.log, partition, ends[partition], acked))
                for offsets, acked in zip(committed, acknowledged, strict=True)
            )
            view = RetirementView(
                starts[partition],
                ends[partition],
                consumed,
                delete_after,
                pending,
                transaction_open=ends[partition] < highs[partition],
                compacted=state.config.compacted,
            )
            decisions[partition] = retirement_action(view, now)
        if all(action is RetirementAction.KEEP for action in decisions.values()):
            return decisions
        decided_at = state.log.current.number
        async with self.store.lock(topic, self.sidecar_id, self.lock_timeout_s):
            # Read again under the lock. A change committed since the decisions were
            # taken (the lock is the changes' lock: this round may have waited for
            # several) can have made a partition read-write, written to it and made it
            # read-only again: the same mode, but records past the ends read, that no
            # group has consumed. Decide again next round.
            state = await self.store.read_topic(topic)
            if state.log.current.number != decided_at:
                _log.info(
                    "%s: generation %d committed since the retirement decisions (on %d); "
                    "deciding again",
                    topic,
                    state.log.current.number,
                    decided_at,
                )
                return dict.fromkeys(decisions, RetirementAction.KEEP)
            modes = list(state.modes)
            truncate = {
                p: ends[p]
                for p, action in decisions.items()
                if action is RetirementAction.TRUNCATE and modes[p] is PartitionMode.READ_ONLY
            }
            if truncate:
                await self.kafka.delete_records(topic, truncate)
            for partition, action in decisions.items():
                if (
                    action is not RetirementAction.KEEP
                    and modes[partition] is PartitionMode.READ_ONLY
                ):
                    modes[partition] = PartitionMode.REMOVED
                    _log.info("%s[%d] retired (%s)", topic, partition, action.value)
            await self.store.set_partitions(topic, tuple(modes), state.delete_after)
        return decisions
