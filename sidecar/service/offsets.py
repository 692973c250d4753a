"""One consumer instance's commits: what it may commit, and when it commits by itself.

A commit never passes a boundary where keys moved away before the app has been told
(``keys_revoked``) and acknowledged it: the gate of the keys' new partition opens on
that commit. A commit carries the leader epoch of the last batch read below each
offset (``sidecar.core.commit_epochs``; unknown: -1), so that a reading that starts
from it can be validated (``sidecar.service.truncation_check``). An auto-committing
instance commits every ``auto_commit_interval_s``, at once when someone of its group
waits past its delivered position, and before a rebalance takes its partitions
(``tell_before_revoke`` then the final commit).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence

from sidecar.audit import events as audit_events
from sidecar.core.consume import ConsumedRecord, TopicPartition
from sidecar.core.errors import BadRequest, ConsumerStateConflict, SidecarError
from sidecar.core.handoff import revocations_crossed
from sidecar.core.positions import PartitionPosition, Positions
from sidecar.service.consume_context import ConsumeContext
from sidecar.service.consume_state import ConsumeState
from sidecar.service.handoff import HandoffTeller

_log = logging.getLogger(__name__)


class Offsets:
    def __init__(
        self,
        state: ConsumeState,
        context: ConsumeContext,
        teller: HandoffTeller,
        *,
        callbacks: bool,
    ) -> None:
        self.state = state
        """The instance's shared state: positions, its consumer, the hand-off ledger."""
        self.context = context
        self.teller = teller
        """Asks the app for the keys_revoked a commit needs."""
        self._callbacks = callbacks
        """Hand-off is told by callback (else as events the app acknowledges)."""
        self._last_auto_commit = time.monotonic()
        self._group_commits: dict[
            TopicPartition, tuple[PartitionPosition[ConsumedRecord], int]
        ] = {}
        """The group's committed offset where this instance has not committed yet, per
        partition and reading (the state it was read for)."""

    @property
    def positions(self) -> Positions[ConsumedRecord]:
        return self.state.positions

    async def commit(self, offsets: Mapping[TopicPartition, int] | None) -> None:
        """Commit ``offsets`` (next offsets to read), or everything delivered if None.

        Raises BadRequest for an offset beyond what was delivered or a partition not
        assigned, ConsumerStateConflict if a keys-revoked event must be acknowledged
        first, CallbackFailed.
        """
        consumer = self.state.require_consumer()
        if offsets is None:
            offsets = {
                tp: state.delivered
                for tp, state in self.positions.items()
                if state.delivered is not None
            }
        widened = {}
        states = {}
        for tp, offset in offsets.items():
            state = self.positions.get(tp)
            if state is None:
                raise BadRequest(f"{tp.topic}[{tp.partition}] is not assigned to this instance")
            states[tp] = state
            if state.delivered is None or offset > state.delivered:
                raise BadRequest(
                    f"offset {offset} of {tp.topic}[{tp.partition}] is beyond the delivered "
                    f"position {state.delivered if state.delivered is not None else 'none'}"
                )
            # The app names the last record it processed; what lies between it and the
            # delivered position was never for the app (markers, aborted records,
            # relocation tombstones), so the commit covers it too.
            widened[tp] = state.delivered if offset == state.sent_to else offset
        to_commit: dict[TopicPartition, int] = {}
        for tp, offset in widened.items():
            await self._revoke_before(tp, offset)
            to_commit[tp] = offset
        if not to_commit:
            return
        # Each with the leader epoch of what was read below it, so that a reading that
        # starts from this commit can validate it (KIP-320).
        epochs = {
            tp: self.state.epochs.epoch_for(tp, states[tp].incarnation, offset)
            for tp, offset in to_commit.items()
        }
        await consumer.commit(to_commit, epochs)
        for tp, offset in to_commit.items():
            # The state the offset was checked against, unless a rebalance replaced it.
            if self.positions.get(tp) is states[tp]:
                self.positions.committed(tp, offset)
            self.context.audit.emit(
                audit_events.committed(
                    group=self.state.group,
                    instance=self.state.instance_id,
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=offset,
                )
            )
        self.context.metrics.committed(self.state.group, list(to_commit))

    async def committed(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        consumer = self.state.require_consumer()
        result = {}
        for tp in partitions:
            offset = await consumer.committed(tp)
            if offset is not None:
                result[tp] = offset
        return result

    async def _revoke_before(self, tp: TopicPartition, offset: int) -> None:
        runtime = await self.context.registry.runtime(tp.topic)
        if runtime is None or not self.context.gated(runtime):
            return
        state = self.positions.get(tp)
        if state is None:
            # A rebalance took the partition while an earlier one of this commit waited
            # for its app: its new owner commits it now.
            raise ConsumerStateConflict(
                f"{tp.topic}[{tp.partition}] was reassigned by a rebalance during the commit"
            )
        before = await self._committed_before(tp, state, len(runtime.state.modes))
        for revocation in revocations_crossed(runtime.state.log, tp.partition, before, offset):
            await self.teller.require_revoked(tp.topic, revocation)

    async def _committed_before(
        self, tp: TopicPartition, state: PartitionPosition[ConsumedRecord], count: int
    ) -> int:
        """Where the group's commit of ``tp`` stands: this instance's last commit, else
        the group's committed offset (a partition just assigned starts there; read once
        per reading), else 0. Raises SidecarError while Kafka cannot say."""
        if state.committed is not None:
            return state.committed
        known = self._group_commits.get(tp)
        if known is not None and known[0] is state:
            return known[1]
        group = self.state.group
        committed = await self.context.offsets.committed_offsets(group, tp.topic, count)
        offset = committed.get(tp.partition, 0)
        self._group_commits[tp] = (state, offset)
        return offset

    async def tell_before_revoke(self, partitions: Sequence[TopicPartition]) -> None:
        """Before a rebalance takes ``partitions`` away, tell the app the keys-revoked
        events that committing everything delivered needs (then the rebalance waits for
        its acknowledgements: ``HandoffTeller.record_before_revoke``).

        Otherwise the final commit would stop below a boundary and the partitions' next
        owner would deliver the records above it again.
        """
        for tp in partitions:
            state = self.positions.get(tp)
            runtime = self.context.registry.topics.get(tp.topic)
            if (
                state is None
                or state.delivered is None
                or runtime is None
                or not self.context.gated(runtime)
            ):
                continue
            try:
                before = await self._committed_before(tp, state, len(runtime.state.modes))
            except SidecarError:
                before = 0  # Kafka cannot say: tell what a commit from 0 would need
            for revocation in revocations_crossed(
                runtime.state.log, tp.partition, before, state.delivered
            ):
                await self.teller.revocation_pending(tp.topic, revocation)

    async def commit_quietly(self, *, force: bool) -> None:
        """Auto-commit; a failure (a rebalance in progress, a coordinator moving) is
        retried at the next poll instead of failing the app's read."""
        try:
            await self.auto_commit(force=force)
        except SidecarError as exc:
            _log.info("auto-commit of %s deferred: %s", self.state.instance_id, exc.message)

    async def auto_commit(self, *, force: bool) -> None:
        interval_s = self.context.settings.auto_commit_interval_s
        if not force and time.monotonic() - self._last_auto_commit < interval_s:
            return
        self._last_auto_commit = time.monotonic()
        offsets = {}
        for tp, state in self.positions.items():
            if state.delivered is None or state.delivered == state.committed:
                continue
            target = state.delivered
            runtime = await self.context.registry.runtime(tp.topic)
            # A partition just assigned starts from the group's commit, which may lie at
            # a boundary it reached before the change (the common case): measured from 0,
            # the stop below that boundary would move the group's offset back.
            count = len(runtime.state.modes) if runtime is not None else tp.partition + 1
            before = await self._committed_before(tp, state, count)
            if runtime is not None and self.context.gated(runtime) and not self._callbacks:
                # Without a callback, stop below a revocation the app has not acknowledged.
                for revocation in revocations_crossed(
                    runtime.state.log, tp.partition, before, target
                ):
                    key = (revocation.partition, revocation.generation)
                    if key not in self.state.ledger.revocations(tp.topic):
                        with contextlib.suppress(ConsumerStateConflict):
                            await self.teller.require_revoked(tp.topic, revocation)
                        target = min(target, revocation.boundary - 1)
            if target > before:
                offsets[tp] = target
        if offsets:
            await self.commit(offsets)

    async def help_waiters(self) -> None:
        """Commit at once what waiters need (the caller auto-commits)."""
        for topic in self.positions.topics():
            try:
                waits = await self.context.store.waits(self.state.group, topic)
            except SidecarError:
                continue
            for tp, state in self.positions.items():
                if tp.topic != topic or state.delivered is None:
                    continue
                boundary = waits.get(tp.partition)
                if boundary is not None and (state.committed or 0) < min(boundary, state.delivered):
                    await self.commit_quietly(force=True)
                    return
