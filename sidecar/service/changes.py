"""Runs partition-count changes: the IO around the core's coordinator state machine.

The loop is always the same: persist the operation record, run the actions the core
returned, turn their results into an observation, step. Because the record is
persisted before its actions run and every action is idempotent, a coordinator that
dies anywhere is finished by the next sidecar that takes the topic's lock and
``resume``\\ s the stored record (``resume_abandoned``).

The lock says who drives a change: a journal that is not final while nobody holds the
lock is abandoned (its coordinator died, or lost its session and with it the lock),
and any sidecar's housekeeping resumes it. The journal is written compare-and-set, so
a coordinator that was paused and finds its journal moved on stops instead of
overwriting its successor's progress; the barrier is published and withdrawn under the
same check. A barrier no unfinished journal owns is withdrawn by whoever takes the lock
next (``orphaned_barrier``), so one left behind cannot refuse the topic's changes.

Housekeeping learns of the journals from a watch on each (one read per write, pushed to
every sidecar): an idle sidecar asks ZooKeeper nothing per topic and round, and reads a
journal again only while its watch reports it unfinished, or has not reported it yet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.adapters.partition_warmer import PartitionWarmer
from sidecar.audit import events as audit_events
from sidecar.audit.emitter import AuditEmitter
from sidecar.config import ChangeSettings
from sidecar.core.errors import ChangeTakenOver, OperationInProgress, SidecarError
from sidecar.core.generations import PartitionMode, modes_after_commit
from sidecar.core.procedures import (
    BEFORE_COMMIT,
    FINAL_PHASES,
    Action,
    BarrierProgress,
    CommitGeneration,
    Committed,
    CreatePartitions,
    Failed,
    FenceProducers,
    Observation,
    Operation,
    OperationKind,
    PartitionsCreated,
    Phase,
    ProducersFenced,
    PublishBarrier,
    ReadStableOffsets,
    RemoveBarrier,
    RolledBack,
    SidecarId,
    StableOffsets,
    missing_acks,
    plan_change,
    resume,
    step,
)
from sidecar.core.topics import PendingBarrier, TopicState, orphaned_barrier
from sidecar.core.truncation import TruncatedBoundary
from sidecar.faults import FaultHooks
from sidecar.metrics import SidecarMetrics
from sidecar.service.boundaries import BoundaryCheck
from sidecar.service.change_ports import ChangeKafka, ChangeStore

_log = logging.getLogger(__name__)


ProgressCallback = Callable[[Operation], None]


@dataclass(frozen=True)
class ChangeRequest:
    topic: str
    target_count: int
    validate_only: bool = False
    delete_after_seconds: float | None = None
    kind: OperationKind | None = None
    """If given, the change must be of this kind: ``shrink --to 9`` of a 5-partition
    topic is refused, not turned into an expansion."""


class ChangeRunner:
    def __init__(
        self,
        sidecar_id: str,
        store: ChangeStore,
        kafka: ChangeKafka,
        metrics: SidecarMetrics,
        *,
        barrier_timeout_s: float,
        faults: FaultHooks | None = None,
        audit: AuditEmitter | None = None,
        settings: ChangeSettings | None = None,
        warmer: PartitionWarmer | None = None,
    ) -> None:
        self.settings = settings or ChangeSettings()
        self.warmer = warmer
        self.boundaries = BoundaryCheck(kafka, store, metrics, audit)
        self.sidecar_id = SidecarId(sidecar_id)
        self.store = store
        self.kafka = kafka
        self.metrics = metrics
        self.barrier_timeout_s = barrier_timeout_s
        self.faults = faults or FaultHooks()
        self.audit = audit
        self._journals: dict[str, Operation | None] = {}
        """Per topic, its change journal as the journal's watch last reported it (absent:
        not known, read when needed): housekeeping reads the journal only when a change
        may be unfinished, not every round for every topic."""
        self._watched: set[str] = set()
        self._driving: set[str] = set()
        """Topics whose change this sidecar drives now. One that lost its lock (paused
        past its session) drives on until the journal refuses it; this sidecar must not
        take the journal over meanwhile: its store would then accept that driver's
        writes as its own."""

    async def confirm_truncation(self, topic: str) -> list[TruncatedBoundary]:
        """An operator accepts the loss of ``topic``'s lost boundaries (KIP-320), which
        refused its changes. Raises UnknownTopic, NoTruncationToConfirm, KafkaUnavailable,
        MetadataUnavailable."""
        return await self.boundaries.confirm(topic)

    async def change(
        self, request: ChangeRequest, on_progress: ProgressCallback | None = None
    ) -> Operation:
        """Expand or shrink ``request.topic`` to the target count and return the
        finished operation (phase DONE or ROLLED_BACK with the reason in ``outcome``).

        Raises UnknownTopic, InvalidPartitionCount, OperationInProgress (another
        change holds the topic), BoundaryTruncated (a boundary was lost to an unclean
        leader election), MetadataUnavailable / KafkaUnavailable.
        """
        # Read before the lock: taking it creates the lock's node, which must not happen
        # for a topic that is not managed (UnknownTopic) nor for a validate-only request,
        # which writes nothing at all.
        state = await self.store.read_topic(request.topic)
        stored = await self.store.read_operation(request.topic)
        if stored is not None and stored.phase not in FINAL_PHASES:
            holder = await self.store.lock_holder(request.topic)
            if holder is not None:
                raise OperationInProgress(
                    f"{stored.coordinator} is changing {request.topic} to "
                    f"{stored.target_count} partitions ({stored.phase.value}); the lock is "
                    f"held by {holder.owner}"
                )
        if request.validate_only:
            await self.boundaries.require_intact(request.topic, state.log, "a change")
            operation, _, _ = self._plan(request, state)
            return operation
        self._refuse_if_driving(request.topic)
        async with self.store.lock(request.topic, self.sidecar_id, self.settings.lock_timeout_s):
            # A change left unfinished (its coordinator died or lost the lock) comes first.
            stored = await self.store.take_over_operation(request.topic)
            await self._withdraw_orphaned_barrier(request.topic, stored)
            if stored is not None and stored.phase not in FINAL_PHASES:
                await self._drive(stored, on_progress)
                stored = await self.store.take_over_operation(request.topic)
            state = await self.store.read_topic(request.topic)
            # KIP-320: a change moves keys on the strength of the boundaries; one the log
            # no longer reaches is refused (BoundaryTruncated), not built upon.
            await self.boundaries.require_intact(request.topic, state.log, "a change")
            operation, actions, kind = self._plan(request, state)
            result = await self._drive(operation, on_progress, actions)
        outcome = "done" if result.phase is Phase.DONE else "rolled_back"
        self.metrics.admin_operations.labels(kind.value, outcome).inc()
        if self.audit is not None:
            self.audit.emit(
                audit_events.admin(
                    topic=request.topic,
                    kind=kind.value,
                    result=outcome,
                    from_count=result.from_count,
                    target_count=result.target_count,
                )
            )
        return result

    def _plan(
        self, request: ChangeRequest, state: TopicState
    ) -> tuple[Operation, list[Action], OperationKind]:
        """The operation ``request`` starts from ``state``, its first actions and its kind.

        Raises InvalidPartitionCount for a target the change cannot reach."""
        grows = request.target_count > state.current.undeleted_count
        kind = request.kind or (OperationKind.EXPAND if grows else OperationKind.SHRINK)
        operation, actions = plan_change(
            kind=kind,
            log=state.log,
            physical_count=len(state.modes),
            topic=request.topic,
            target_count=request.target_count,
            coordinator=self.sidecar_id,
            now=time.time(),
            barrier_timeout=self.barrier_timeout_s,
            delete_after_seconds=request.delete_after_seconds,
        )
        return operation, actions, kind

    def _audit_phase(self, operation: Operation) -> None:
        if self.audit is None:
            return
        self.audit.emit(
            audit_events.barrier_phase(
                topic=operation.topic,
                kind=operation.kind.value,
                from_generation=operation.from_generation,
                from_count=operation.from_count,
                target_count=operation.target_count,
                phase=operation.phase.value,
                coordinator=operation.coordinator,
            )
        )

    async def resume_abandoned(
        self, topic: str, pending: PendingBarrier | None = None
    ) -> Operation | None:
        """Finish a change nobody drives (its journal is not final and its lock is free),
        and withdraw a barrier no change owns; None if no change was resumed. ``pending``
        is the barrier this sidecar last saw published (both are read again under the
        lock). Raises OperationInProgress if the lock is taken."""
        stored = await self._journal(topic)
        unfinished = stored is not None and stored.phase not in FINAL_PHASES
        if not unfinished and orphaned_barrier(pending, stored) is None:
            return None
        self._refuse_if_driving(topic)
        async with self.store.lock(topic, self.sidecar_id, 0.0, purpose="resuming a change"):
            stored = await self.store.take_over_operation(topic)
            await self._withdraw_orphaned_barrier(topic, stored)
            if stored is None or stored.phase in FINAL_PHASES:
                return None
            _log.warning("resuming %s of %s left by %s", stored.kind, topic, stored.coordinator)
            return await self._drive(stored, None)

    async def _journal(self, topic: str) -> Operation | None:
        """The topic's journal as its watch last reported it (read after the topic's
        lock was last released: no older than the last holder's writes); read from
        ZooKeeper (and the watch set, the first time) while the watch has not reported
        it yet, or could not read it."""
        if topic not in self._watched:
            self._watched.add(topic)

            def seen(operation: Operation | None) -> None:
                self._journals[topic] = operation

            def unreadable() -> None:
                self._journals.pop(topic, None)

            self.store.watch_journal(topic, seen, unreadable)
        if topic in self._journals:
            return self._journals[topic]
        return await self.store.read_operation(topic)

    def _refuse_if_driving(self, topic: str) -> None:
        if topic in self._driving:
            raise OperationInProgress(
                f"{self.sidecar_id} is still driving a change of {topic} it lost the lock of"
            )

    async def _withdraw_orphaned_barrier(self, topic: str, journal: Operation | None) -> None:
        """Withdraw ``topic``'s pending barrier if ``journal`` (read under the lock) does
        not own it: left as it is, every later change would be refused."""
        state = await self.store.read_topic(topic)
        generation = orphaned_barrier(state.pending, journal)
        if generation is None:
            return
        _log.warning(
            "withdrawing the barrier of generation %s of %s: no change owns it (journal: %s)",
            generation,
            topic,
            "none" if journal is None else f"{journal.phase.value} of {journal.pending_generation}",
        )
        await self.store.remove_barrier(topic, generation)

    async def _drive(
        self,
        operation: Operation,
        on_progress: ProgressCallback | None,
        actions: list[Action] | None = None,
    ) -> Operation:
        self._driving.add(operation.topic)
        try:
            return await self._drive_steps(operation, on_progress, actions)
        finally:
            self._driving.discard(operation.topic)

    async def _drive_steps(
        self,
        operation: Operation,
        on_progress: ProgressCallback | None,
        actions: list[Action] | None,
    ) -> Operation:
        if actions is None:
            actions = resume(operation)
        phase_began = time.monotonic()
        while True:
            # Persist before acting: the journal is what a successor resumes from.
            if operation.phase is not Phase.DONE:
                await self._save_until_done(operation)
            self._audit_phase(operation)
            self.faults.phase_journaled(operation.phase)
            if on_progress is not None:
                on_progress(operation)
            if operation.phase in FINAL_PHASES:
                return operation
            observation: Observation | None = None
            for action in actions:
                observation = await self._run_until_done(operation, action)
            if observation is None:
                raise AssertionError(f"phase {operation.phase} produced no observation")
            previous = operation.phase
            operation, actions = step(operation, observation)
            if operation.phase is not previous:
                self.metrics.barrier_seconds.labels(operation.topic, previous.value).observe(
                    time.monotonic() - phase_began
                )
                phase_began = time.monotonic()

    async def _save_until_done(self, operation: Operation) -> None:
        """Persist ``operation``; raises ChangeTakenOver if another coordinator took over."""
        while True:
            try:
                await self.store.save_operation(operation)
                return
            except ChangeTakenOver:
                raise
            except SidecarError as exc:
                _log.warning("journal of %s not saved, retrying: %s", operation.topic, exc.message)
                await asyncio.sleep(self.settings.action_retry_s)

    async def _run_until_done(self, operation: Operation, action: Action) -> Observation:
        """Run ``action`` until it has an outcome, whatever ZooKeeper or Kafka do meanwhile.

        Every action is idempotent, so an attempt that failed half-way is simply made
        again. Giving up instead would leave the journal unfinished under a coordinator
        that is still alive: no one else would finish the change, and every later change
        of the topic would be refused as "in progress". Before the barrier passes, a
        failure past the barrier deadline becomes a rollback (``Failed``).
        """
        while True:
            try:
                return await self._run(operation, action)
            except ChangeTakenOver:
                raise
            except (SidecarError, TimeoutError, OSError) as exc:
                reason = exc.message if isinstance(exc, SidecarError) else repr(exc)
                if operation.phase in BEFORE_COMMIT and time.time() >= operation.barrier_deadline:
                    return Failed(f"{type(action).__name__} failed: {reason}")
                _log.warning("%s of %s failed, retrying: %s", action, operation.topic, reason)
                await asyncio.sleep(self.settings.action_retry_s)

    async def _warm(self, topic: str, before: int, count: int) -> None:
        """Warm the partitions ``before..count-1`` this change made (``PartitionWarmer``),
        then delete what the warm-up left, once its abort marker is written: the
        partitions are then as empty as before (retirement removes an empty partition at
        once) and their first boundary lies past it. Best effort, for at most
        ``changes.warm_within_s`` for the write and as long again for the clean-up.

        Kafka refuses DeleteRecords in a topic with ``cleanup.policy=compact``: there
        the aborted write and its marker stay below the first boundary (no read-committed
        reader sees them, and the log cleaner drops an aborted transaction's records)."""
        if self.warmer is None or not await self.warmer.warm(topic, range(before, count)):
            return
        try:
            if (await self.store.read_topic(topic)).config.compacted:
                return
            async with asyncio.timeout(self.settings.warm_within_s):
                # The aborted transaction began at offset 0: a stable offset past it means
                # its marker is written.
                while True:
                    stable = (await self.kafka.end_offsets(topic, count))[before:]
                    if all(stable):
                        break
                    await asyncio.sleep(self.settings.barrier_poll_s)
                await self.kafka.delete_records(
                    topic, {before + index: offset for index, offset in enumerate(stable)}
                )
        except (SidecarError, TimeoutError) as exc:
            reason = exc.message if isinstance(exc, SidecarError) else "timed out"
            _log.info("clearing the warm-up of %s: %s", topic, reason)

    async def _run(self, operation: Operation, action: Action) -> Observation:
        match action:
            case CreatePartitions(topic, total_count):
                try:
                    before = await self.kafka.partition_count(topic)
                    count = await self.kafka.create_partitions(topic, total_count)
                except (SidecarError, TimeoutError) as exc:
                    reason = exc.message if isinstance(exc, SidecarError) else repr(exc)
                    return Failed(f"creating partitions failed: {reason}")
                if count > before:
                    # Partitions that existed already (brought back by this change) have
                    # their followers fetching: only those just made are warmed.
                    await self._warm(topic, before, count)
                return PartitionsCreated(count)
            case PublishBarrier(topic, generation, target_count):
                await self.store.publish_barrier(topic, PendingBarrier(generation, target_count))
                return await self._await_barrier(operation)
            case FenceProducers(_, transactional_ids):
                for transactional_id in transactional_ids:
                    if self.faults.skip_fence:
                        _log.warning("fault injection: not fencing %s", transactional_id)
                        continue
                    await self.kafka.fence_producer(transactional_id)
                    self.metrics.producers_fenced.inc()
                await self.store.forget_producers(transactional_ids)
                return ProducersFenced()
            case ReadStableOffsets(topic, physical_count):
                # Each offset with the epoch of the leader that answered it (KIP-320):
                # a boundary the log no longer reaches can then be told from one it does.
                ends = await self.kafka.stable_offsets(topic, physical_count)
                return StableOffsets(
                    [end.offset for end in ends], [end.leader_epoch for end in ends]
                )
            case CommitGeneration(topic, generation):
                state = await self.store.read_topic(topic)
                if state.current.number >= generation.number:
                    return Committed()  # a predecessor committed it before dying
                modes = modes_after_commit(state.modes, generation)
                delete_after = _delete_after(
                    state.modes, state.delete_after, modes, operation.delete_after_seconds
                )
                done, _ = step(operation, Committed())
                await self.store.commit_generation(topic, generation, modes, delete_after, done)
                return Committed()
            case RemoveBarrier(topic, generation):
                await self.store.remove_barrier(topic, generation)
                return RolledBack()
        raise AssertionError(f"unknown action {action!r}")

    async def _await_barrier(self, operation: Operation) -> Observation:
        while True:
            try:
                progress = await self._barrier_progress(operation)
            except SidecarError as exc:
                # ZooKeeper away: nothing can be known about the acks; past the deadline
                # the change is rolled back (which itself waits for ZooKeeper).
                if time.time() >= operation.barrier_deadline:
                    return Failed(f"barrier: {exc.message}")
                await asyncio.sleep(self.settings.action_retry_s)
                continue
            moved, _ = step(operation, progress)
            if moved.phase is not Phase.BARRIER:
                return progress
            await asyncio.sleep(self.settings.barrier_poll_s)

    async def _barrier_progress(self, operation: Operation) -> BarrierProgress:
        topic, generation = operation.topic, operation.pending_generation
        # While some live sidecar has not acked, only who acked matters: the acks'
        # offsets are read once all are in (two requests a poll instead of one per
        # sidecar; an ack may still be rewritten, so they are not kept from a poll).
        ackers = await self.store.barrier_ackers(topic, generation)
        progress = BarrierProgress(
            live=await self.store.live_sidecars(),
            acks={sidecar: {} for sidecar in ackers},
            now=time.time(),
        )
        if missing_acks(operation, progress):
            return progress
        # Everyone live has acked: which registered producers does no live sidecar own?
        # The registry is read first: a sidecar registers before it writes, so an id
        # registered after this read cannot have written under the old generation.
        registered = await self.store.registered_producers()
        return BarrierProgress(
            live=await self.store.live_sidecars(),
            acks=await self.store.barrier_acks(topic, generation),
            now=time.time(),
            registered=registered,
            live_producers=await self.store.live_producers(),
        )


def _delete_after(
    before: tuple[PartitionMode, ...],
    delete_after_before: tuple[float | None, ...],
    after: tuple[PartitionMode, ...],
    delete_after_seconds: float | None,
) -> tuple[float | None, ...]:
    """Per partition, when a newly read-only partition may be removed regardless."""
    now = time.time()
    result: list[float | None] = []
    for partition, mode in enumerate(after):
        previous = delete_after_before[partition] if partition < len(delete_after_before) else None
        was = before[partition] if partition < len(before) else PartitionMode.REMOVED
        if mode is PartitionMode.READ_ONLY and was is not PartitionMode.READ_ONLY:
            previous = None if delete_after_seconds is None else now + delete_after_seconds
        elif mode is PartitionMode.READ_WRITE:
            previous = None
        result.append(previous)
    return tuple(result)
