"""Partition-count changes as the coordinator runs them (``sidecar.service.changes``).

Over fakes of ZooKeeper and Kafka that keep what they were told, with the real
coordinator state machine (``sidecar.core.procedures``) and truncation check. The fake
store behaves as ``MetadataStore`` does where the runner depends on it: the journal is
written compare-and-set against the version this store last read or wrote (another
coordinator's write makes the next save raise ChangeTakenOver), the lock refuses a
second holder, a barrier other than the pending one is refused, and a commit writes the
generation, the modes, the journal and ends the barrier at once.

What is checked: what a change writes (journal phases, barrier, generation, modes,
deadlines of read-only partitions) and asks of Kafka; which changes are refused before
anything is written; how a change ends when the barrier times out or Kafka fails; and
how abandoned changes and orphaned barriers are taken over.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from sidecar.adapters.kafka import KafkaGateway, OffsetAndEpoch
from sidecar.adapters.partition_warmer import PartitionWarmer
from sidecar.adapters.zookeeper import LockHolder, MetadataStore
from sidecar.audit.emitter import AuditEmitter
from sidecar.config import ChangeSettings
from sidecar.core.errors import (
    BoundaryTruncated,
    ChangeTakenOver,
    InvalidPartitionCount,
    KafkaFailure,
    KafkaUnavailable,
    MetadataUnavailable,
    OperationInProgress,
    SidecarError,
    UnknownTopic,
)
from sidecar.core.generations import (
    Boundary,
    Generation,
    GenerationLog,
    PartitionMode,
    modes_after_commit,
)
from sidecar.core.procedures import (
    Operation,
    OperationKind,
    Phase,
    SidecarId,
    TransactionalId,
    plan_change,
)
from sidecar.core.topics import PendingBarrier, TopicConfig, TopicState
from sidecar.core.truncation import ConfirmedLoss
from sidecar.faults import FaultHooks
from sidecar.metrics import SidecarMetrics
from sidecar.service.changes import ChangeRequest, ChangeRunner

TOPIC = "orders"
A, B = SidecarId("a"), SidecarId("b")
"""``a`` coordinates; ``b`` is another live sidecar."""
RW, RO = PartitionMode.READ_WRITE, PartitionMode.READ_ONLY
FAST = ChangeSettings(
    barrier_poll_s=0.001, action_retry_s=0.001, lock_timeout_s=0.0, warm_within_s=0.2
)


def _topic(*counts: int, delete_after: Sequence[float | None] | None = None) -> TopicState:
    """A topic created with ``counts[0]`` partitions and changed to each next count, every
    boundary at offset 4 (epoch 1) past generation 0."""
    log = GenerationLog.start(counts[0], [Boundary(0, 0)] * counts[0])
    modes: tuple[PartitionMode, ...] = (RW,) * counts[0]
    for count in counts[1:]:
        physical = max(count, log.current.physical_count)
        generation = log.next_generation(count, [Boundary(4, 1)] * physical)
        log = log.append(generation)
        modes = modes_after_commit(modes, generation)
    after = tuple(delete_after) if delete_after is not None else (None,) * len(modes)
    return TopicState(TopicConfig(TOPIC, counts[0], 3), log, modes, after)


class _Zk:
    """ZooKeeper's records of one sidecar's session (see the module docstring)."""

    def __init__(self, state: TopicState) -> None:
        self.topics = {state.config.name: state}
        self.journals: dict[str, Operation] = {}
        self.versions: dict[str, int] = {}
        """The journal node's version in ZooKeeper."""
        self.expected: dict[str, int] = {}
        """The version this session last read (taking over) or wrote."""
        self.holders: dict[str, LockHolder] = {}
        self.locks_taken: list[tuple[str, str, str]] = []
        self.saved: list[Operation] = []
        self.published: list[PendingBarrier] = []
        self.removed: list[int] = []
        self.commits: list[tuple[Generation, tuple[PartitionMode, ...]]] = []
        self.live: frozenset[SidecarId] = frozenset({A})
        self.acks: dict[int, dict[SidecarId, dict[int, int]]] = {}
        self.acks_on_publish: dict[SidecarId, dict[int, int]] = {A: {}}
        """The acks each published barrier gets at once (the live sidecars' registries)."""
        self.registered: frozenset[TransactionalId] = frozenset()
        self.live_producer_ids: frozenset[TransactionalId] = frozenset()
        self.forgotten: list[tuple[TransactionalId, ...]] = []
        self.confirmed: set[ConfirmedLoss] = set()
        self.failures: dict[str, list[SidecarError]] = {}
        """Per method, errors its next calls raise (ZooKeeper away)."""
        self.barrier_up = asyncio.Event()
        self.journal_watches: dict[
            str, list[tuple[Callable[[Operation | None], None], Callable[[], None]]]
        ] = {}
        """Per topic, the journal watches set: (seen, unreadable)."""
        self.journal_reads = 0
        self.trail: list[str] = []
        """What was written, in order (shared with the Kafka fake)."""

    def _fail(self, method: str) -> None:
        pending = self.failures.get(method)
        if pending:
            raise pending.pop(0)

    def journal(self, operation: Operation) -> None:
        """Write a journal as another sidecar would (a dead coordinator's, a successor's),
        whose lock is then released (or gone with its session): the watches report it."""
        self._write_journal(operation)
        self._report_journal(operation.topic)

    def _write_journal(self, operation: Operation) -> None:
        self.journals[operation.topic] = operation
        self.versions[operation.topic] = self.versions.get(operation.topic, -1) + 1

    def _report_journal(self, topic: str) -> None:
        """What a journal watch does when the topic's lock is released: it reads the
        journal, and reports it (on the loop, from ZooKeeper's thread)."""
        for seen, _ in self.journal_watches.get(topic, []):
            asyncio.get_running_loop().call_soon(seen, self.journals.get(topic))

    def _require_owner(self, topic: str) -> None:
        expected = self.expected.get(topic)
        if expected is not None and self.versions.get(topic) != expected:
            self.expected.pop(topic)
            raise ChangeTakenOver(f"the journal of {topic!r} was changed by another coordinator")

    async def read_topic(self, topic: str) -> TopicState:
        if topic not in self.topics:
            raise UnknownTopic(f"topic {topic!r} is not managed")
        return self.topics[topic]

    async def read_operation(self, topic: str) -> Operation | None:
        self.journal_reads += 1
        return self.journals.get(topic)

    def watch_journal(
        self,
        topic: str,
        seen: Callable[[Operation | None], None],
        unreadable: Callable[[], None],
    ) -> None:
        """As the watch does: reports the journal soon after it is set, then each time
        the topic's lock is released (on the loop, from ZooKeeper's thread)."""
        self.journal_watches.setdefault(topic, []).append((seen, unreadable))
        asyncio.get_running_loop().call_soon(seen, self.journals.get(topic))

    async def take_over_operation(self, topic: str) -> Operation | None:
        if topic not in self.journals:
            self.expected.pop(topic, None)
            return None
        self.expected[topic] = self.versions[topic]
        return self.journals[topic]

    async def save_operation(self, operation: Operation) -> None:
        self._fail(f"save_operation {operation.phase.value}")
        self._require_owner(operation.topic)
        self._write_journal(operation)
        self.expected[operation.topic] = self.versions[operation.topic]
        self.saved.append(operation)
        self.trail.append(f"journal {operation.phase.value}")

    async def lock_holder(self, topic: str) -> LockHolder | None:
        return self.holders.get(topic)

    @contextlib.asynccontextmanager
    async def lock(
        self, topic: str, owner: str, wait_s: float, purpose: str = "change"
    ) -> AsyncIterator[None]:
        if topic not in self.topics:
            raise AssertionError("a lock node made for an unmanaged topic")
        holder = self.holders.get(topic)
        if holder is not None:
            raise OperationInProgress(f"{holder.owner} holds the change lock of {topic!r}")
        mine = self.holders[topic] = LockHolder(owner, purpose, time.time())
        self.locks_taken.append((topic, owner, purpose))
        try:
            yield
        finally:
            # Gone already if the session expired meanwhile (an ephemeral node).
            if self.holders.get(topic) is mine:
                del self.holders[topic]
                self._report_journal(topic)

    async def publish_barrier(self, topic: str, pending: PendingBarrier) -> None:
        state = self.topics[topic]
        if state.pending is not None:
            if state.pending != pending:
                raise OperationInProgress(f"another barrier is pending on {topic!r}")
            return
        self._require_owner(topic)
        self.topics[topic] = replace(state, pending=pending)
        self.published.append(pending)
        self.trail.append(f"publish barrier {pending.generation}")
        self.acks[pending.generation] = dict(self.acks_on_publish)
        self.barrier_up.set()

    async def remove_barrier(self, topic: str, generation: int) -> None:
        self._require_owner(topic)
        state = self.topics[topic]
        if state.pending is not None and state.pending.generation == generation:
            self.topics[topic] = replace(state, pending=None)
        self.acks.pop(generation, None)
        self.removed.append(generation)
        self.trail.append(f"remove barrier {generation}")

    async def live_sidecars(self) -> frozenset[SidecarId]:
        self._fail("live_sidecars")
        return self.live

    async def barrier_acks(self, topic: str, generation: int) -> dict[SidecarId, dict[int, int]]:
        return dict(self.acks.get(generation, {}))

    async def barrier_ackers(self, topic: str, generation: int) -> frozenset[SidecarId]:
        return frozenset(self.acks.get(generation, {}))

    async def registered_producers(self) -> frozenset[TransactionalId]:
        return self.registered

    async def live_producers(self) -> frozenset[TransactionalId]:
        return self.live_producer_ids

    async def forget_producers(self, transactional_ids: tuple[TransactionalId, ...]) -> None:
        self.forgotten.append(transactional_ids)
        self.registered -= set(transactional_ids)

    async def commit_generation(
        self,
        topic: str,
        generation: Generation,
        modes: tuple[PartitionMode, ...],
        delete_after: tuple[float | None, ...],
        operation: Operation,
    ) -> None:
        self._fail("commit_generation")
        state = self.topics[topic]
        if generation.number != state.current.number + 1:
            raise ValueError(f"generation {generation.number} cannot follow {state.current}")
        self._require_owner(topic)
        self.topics[topic] = TopicState(
            state.config, state.log.append(generation), modes, delete_after, pending=None
        )
        self.acks.pop(generation.number, None)
        self._write_journal(operation)
        self.expected.pop(topic, None)
        self.commits.append((generation, modes))
        self.trail.append(f"commit generation {generation.number} ({operation.phase.value})")

    async def confirmed_truncations(self, topic: str) -> frozenset[ConfirmedLoss]:
        return frozenset(self.confirmed)

    async def confirm_truncations(self, topic: str, losses: Sequence[ConfirmedLoss]) -> None:
        self.confirmed.update(losses)


class _Kafka:
    """The topic's partitions, their stable offsets, and what the coordinator asked."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.created: list[int] = []
        self.stable: list[OffsetAndEpoch] = []
        """Each partition's last stable offset and leader epoch (0, epoch 0 past the list)."""
        self.ends: list[list[int]] = []
        """What the next ``end_offsets`` calls answer, in turn; the last one repeats."""
        self.epoch_ends: dict[tuple[int, int], int | None] = {}
        """Where (partition, epoch) ends on the leader; unlisted ones reach far enough."""
        self.fenced: list[str] = []
        self.deleted: list[dict[int, int]] = []
        self.failures: dict[str, list[SidecarError]] = {}
        self.trail: list[str] = []

    def _fail(self, method: str) -> None:
        pending = self.failures.get(method)
        if pending:
            raise pending.pop(0)

    async def partition_count(self, topic: str) -> int:
        return self.partitions

    async def create_partitions(self, topic: str, total_count: int) -> int:
        self._fail("create_partitions")
        self.created.append(total_count)
        self.trail.append(f"create partitions {total_count}")
        self.partitions = max(self.partitions, total_count)
        return self.partitions

    async def stable_offsets(self, topic: str, count: int) -> list[OffsetAndEpoch]:
        self._fail("stable_offsets")
        self.trail.append("read stable offsets")
        padding = [OffsetAndEpoch(0, 0)] * max(0, count - len(self.stable))
        return (self.stable + padding)[:count]

    async def end_offsets(self, topic: str, count: int) -> list[int]:
        answer = self.ends.pop(0) if len(self.ends) > 1 else self.ends[0]
        return answer[:count]

    async def delete_records(self, topic: str, before: Mapping[int, int]) -> dict[int, int]:
        self.deleted.append(dict(before))
        return dict(before)

    async def fence_producer(self, transactional_id: str) -> None:
        self._fail("fence_producer")
        self.fenced.append(transactional_id)
        self.trail.append(f"fence {transactional_id}")

    async def epoch_end_offsets(
        self, topic: str, epochs: Mapping[int, int]
    ) -> dict[int, OffsetAndEpoch | None]:
        answers: dict[int, OffsetAndEpoch | None] = {}
        for partition, epoch in epochs.items():
            end = self.epoch_ends.get((partition, epoch), 1_000_000)
            answers[partition] = None if end is None else OffsetAndEpoch(end, epoch)
        return answers


class _Warmer:
    def __init__(self, warmed: bool) -> None:
        self.warmed = warmed
        self.calls: list[list[int]] = []

    async def warm(self, topic: str, partitions: Sequence[int]) -> bool:
        self.calls.append(list(partitions))
        return self.warmed


class _Audit:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)


class _Fakes:
    """A ``ChangeRunner`` of sidecar ``a`` over fakes, and the fakes."""

    def __init__(
        self,
        state: TopicState,
        *,
        barrier_timeout_s: float = 5.0,
        warmer: _Warmer | None = None,
        kafka_partitions: int | None = None,
        settings: ChangeSettings = FAST,
        faults: FaultHooks | None = None,
    ) -> None:
        self.zk = _Zk(state)
        physical = state.current.physical_count
        self.kafka = _Kafka(physical if kafka_partitions is None else kafka_partitions)
        self.trail = self.zk.trail = self.kafka.trail = []
        self.audit = _Audit()
        self.metrics = SidecarMetrics(CollectorRegistry())
        self.runner = ChangeRunner(
            A,
            cast(MetadataStore, self.zk),
            cast(KafkaGateway, self.kafka),
            self.metrics,
            barrier_timeout_s=barrier_timeout_s,
            audit=cast(AuditEmitter, self.audit),
            settings=settings,
            warmer=cast(PartitionWarmer | None, warmer),
            faults=faults,
        )

    @property
    def state(self) -> TopicState:
        return self.zk.topics[TOPIC]

    def operations(self, kind: str, result: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "sidecar_admin_operations_total", {"kind": kind, "result": result}
        )
        return 0.0 if value is None else value

    def phases_saved(self) -> list[Phase]:
        return [operation.phase for operation in self.zk.saved]

    def phases_audited(self) -> list[str]:
        return [e["phase"] for e in self.audit.events if e["type"] == "barrier_phase"]


def _journal(state: TopicState, kind: OperationKind, target: int, phase: Phase) -> Operation:
    """A journal of ``kind`` to ``target`` left in ``phase`` by a coordinator that died."""
    operation, _ = plan_change(
        kind=kind,
        log=state.log,
        physical_count=len(state.modes),
        topic=TOPIC,
        target_count=target,
        coordinator=SidecarId("dead"),
        now=time.time(),
        barrier_timeout=30.0,
    )
    return replace(operation, phase=phase)


# A change that succeeds ---------------------------------------------------------------------


async def test_an_expansion_creates_partitions_passes_the_barrier_and_commits_generation_1() -> (
    None
):
    fakes = _Fakes(_topic(2))
    fakes.zk.live = frozenset({A, B})
    # One past the highest offset each sidecar saw acknowledged: in partition 0 that is
    # past the stable offset Kafka answers (its transaction marker not yet visible).
    fakes.zk.acks_on_publish = {A: {0: 7}, B: {1: 3}}
    fakes.kafka.stable = [OffsetAndEpoch(5, 3), OffsetAndEpoch(2, 3), OffsetAndEpoch(0, 1)]
    seen: list[Operation] = []

    result = await fakes.runner.change(ChangeRequest(TOPIC, 4), seen.append)

    assert (result.phase, result.outcome) == (Phase.DONE, "committed")
    assert (result.kind, result.from_generation, result.from_count) == (OperationKind.EXPAND, 0, 2)
    assert result.coordinator == A
    assert fakes.kafka.created == [4]
    assert fakes.zk.published == [PendingBarrier(1, 4)]
    # Each boundary is the larger of the stable offset and the acknowledged floor, with
    # the leader epoch Kafka answered (partition 3: no answer listed, so offset 0 epoch 0).
    expected = Generation(1, 4, (Boundary(7, 3), Boundary(3, 3), Boundary(0, 1), Boundary(0, 0)))
    assert fakes.zk.commits == [(expected, (RW, RW, RW, RW))]
    assert fakes.state.log.current == expected
    assert fakes.state.pending is None
    assert fakes.state.delete_after == (None, None, None, None)
    # Every phase is journaled before its actions run; DONE is written by the commit.
    assert fakes.phases_saved() == [
        Phase.CREATING_PARTITIONS,
        Phase.BARRIER,
        Phase.READING_BOUNDARIES,
        Phase.COMMITTING,
    ]
    assert fakes.zk.journals[TOPIC].phase is Phase.DONE
    assert [operation.phase for operation in seen] == [*fakes.phases_saved(), Phase.DONE]
    assert fakes.zk.locks_taken == [(TOPIC, A, "change")]
    assert fakes.zk.holders == {}
    assert fakes.operations("expand", "done") == 1
    assert fakes.phases_audited() == [
        "creating_partitions",
        "barrier",
        "reading_boundaries",
        "committing",
        "done",
    ]
    assert fakes.audit.events[-1] == {
        "type": "admin",
        "topic": TOPIC,
        "kind": "expand",
        "result": "done",
        "from_count": 2,
        "target_count": 4,
    }
    barrier_phase = fakes.metrics.registry.get_sample_value(
        "sidecar_barrier_phase_seconds_count", {"topic": TOPIC, "phase": "barrier"}
    )
    assert barrier_phase == 1


async def test_a_shrink_creates_nothing_and_makes_the_partitions_past_the_target_read_only() -> (
    None
):
    fakes = _Fakes(_topic(2, 4))
    before = time.time()
    result = await fakes.runner.change(ChangeRequest(TOPIC, 2, delete_after_seconds=60.0))
    after = time.time()

    assert (result.phase, result.kind, result.from_count) == (Phase.DONE, OperationKind.SHRINK, 4)
    assert fakes.kafka.created == []
    assert fakes.phases_saved()[0] is Phase.BARRIER
    assert fakes.zk.published == [PendingBarrier(2, 2)]
    assert fakes.state.log.current.number == 2
    assert fakes.state.log.current.undeleted_count == 2
    assert fakes.state.modes == (RW, RW, RO, RO)
    # Partitions made read-only now may be removed 60 s from now, drained or not.
    deadlines = fakes.state.delete_after
    assert deadlines[:2] == (None, None)
    for deadline in deadlines[2:]:
        assert deadline is not None
        assert before + 60.0 <= deadline <= after + 60.0
    assert fakes.operations("shrink", "done") == 1


async def test_a_partition_read_only_already_keeps_its_deadline_when_another_shrink_commits() -> (
    None
):
    fakes = _Fakes(_topic(2, 4, 3, delete_after=(None, None, None, 1234.0)))
    assert fakes.state.modes == (RW, RW, RW, RO)
    await fakes.runner.change(ChangeRequest(TOPIC, 2, delete_after_seconds=60.0))
    assert fakes.state.modes == (RW, RW, RO, RO)
    deadlines = fakes.state.delete_after
    assert deadlines[0] is None
    assert deadlines[1] is None
    assert deadlines[2] is not None
    assert deadlines[2] > time.time() + 50
    assert deadlines[3] == 1234.0


async def test_a_shrink_without_a_delay_leaves_read_only_partitions_until_drained() -> None:
    fakes = _Fakes(_topic(2, 4))
    await fakes.runner.change(ChangeRequest(TOPIC, 3))
    assert fakes.state.modes == (RW, RW, RW, RO)
    assert fakes.state.delete_after == (None, None, None, None)


async def test_an_expansion_brings_read_only_partitions_back_without_their_deadline() -> None:
    warmer = _Warmer(True)
    fakes = _Fakes(_topic(2, 4, 3, delete_after=(None, None, None, 1234.0)), warmer=warmer)
    result = await fakes.runner.change(ChangeRequest(TOPIC, 4))
    assert result.phase is Phase.DONE
    # Kafka has the 4 partitions already: asked for them (idempotent), none is new, so
    # none is warmed.
    assert fakes.kafka.created == [4]
    assert warmer.calls == []
    assert fakes.state.modes == (RW, RW, RW, RW)
    assert fakes.state.delete_after == (None, None, None, None)


async def test_registered_producers_no_live_sidecar_owns_are_fenced_before_boundaries() -> None:
    fakes = _Fakes(_topic(2))
    mine, zombie = TransactionalId("p.a.1"), TransactionalId("p.z.3")
    fakes.zk.registered = frozenset({mine, zombie})
    fakes.zk.live_producer_ids = frozenset({mine})
    # Fencing fails once (a broker away): retried, the deadline being far.
    fakes.kafka.failures["fence_producer"] = [KafkaUnavailable()]

    result = await fakes.runner.change(ChangeRequest(TOPIC, 3))

    assert result.phase is Phase.DONE
    assert result.fenced == (zombie,)
    assert fakes.kafka.fenced == [zombie]
    assert fakes.zk.forgotten == [(zombie,)]
    assert fakes.phases_saved() == [
        Phase.CREATING_PARTITIONS,
        Phase.BARRIER,
        Phase.FENCING,
        Phase.READING_BOUNDARIES,
        Phase.COMMITTING,
    ]
    fenced = fakes.metrics.registry.get_sample_value("sidecar_producers_fenced_total")
    assert fenced == 1


async def test_the_skip_fence_fault_forgets_the_ids_without_fencing_them() -> None:
    # For the audit's tests only: a zombie left unfenced writes across the barrier.
    fakes = _Fakes(_topic(2), faults=FaultHooks(skip_fence=True))
    mine, zombie = TransactionalId("p.a.1"), TransactionalId("p.z.3")
    fakes.zk.registered = frozenset({mine, zombie})
    fakes.zk.live_producer_ids = frozenset({mine})

    result = await fakes.runner.change(ChangeRequest(TOPIC, 3))

    assert result.phase is Phase.DONE
    assert result.fenced == (zombie,)
    assert fakes.kafka.fenced == []
    assert fakes.zk.forgotten == [(zombie,)]
    assert fakes.metrics.registry.get_sample_value("sidecar_producers_fenced_total") == 0


async def test_every_phase_is_journaled_before_its_actions_run() -> None:
    # A coordinator dying after any write leaves a journal its successor resumes from.
    fakes = _Fakes(_topic(2))
    fakes.zk.registered = frozenset({TransactionalId("p.z.3")})
    await fakes.runner.change(ChangeRequest(TOPIC, 3))
    assert fakes.trail == [
        "journal creating_partitions",
        "create partitions 3",
        "journal barrier",
        "publish barrier 1",
        "journal fencing",
        "fence p.z.3",
        "journal reading_boundaries",
        "read stable offsets",
        "journal committing",
        # The done journal is written with the generation, in one transaction.
        "commit generation 1 (done)",
    ]


# Warming the partitions an expansion makes ---------------------------------------------------


async def test_partitions_an_expansion_makes_are_warmed_and_emptied_again() -> None:
    warmer = _Warmer(True)
    fakes = _Fakes(_topic(2), warmer=warmer)
    # The warm-up's abort marker shows as a stable offset past 0; partition 3's is not
    # written at the first look.
    fakes.kafka.ends = [[9, 9, 1, 0], [9, 9, 1, 1]]
    await fakes.runner.change(ChangeRequest(TOPIC, 4))
    assert warmer.calls == [[2, 3]]
    assert fakes.kafka.deleted == [{2: 1, 3: 1}]


async def test_only_partitions_kafka_did_not_have_yet_are_warmed() -> None:
    # A rolled-back expansion made partition 2 already: it is not new to this one.
    warmer = _Warmer(True)
    fakes = _Fakes(_topic(2), warmer=warmer, kafka_partitions=3)
    fakes.kafka.ends = [[9, 9, 9, 1]]
    await fakes.runner.change(ChangeRequest(TOPIC, 4))
    assert warmer.calls == [[3]]
    assert fakes.kafka.deleted == [{3: 1}]


async def test_a_warm_up_that_did_not_happen_leaves_nothing_to_delete() -> None:
    warmer = _Warmer(False)
    fakes = _Fakes(_topic(2), warmer=warmer)
    result = await fakes.runner.change(ChangeRequest(TOPIC, 3))
    assert result.phase is Phase.DONE
    assert warmer.calls == [[2]]
    assert fakes.kafka.deleted == []


async def test_a_warm_up_whose_marker_does_not_show_in_time_is_left_and_the_change_goes_on() -> (
    None
):
    warmer = _Warmer(True)
    fakes = _Fakes(_topic(2), warmer=warmer, settings=replace(FAST, warm_within_s=0.05))
    fakes.kafka.ends = [[9, 9, 0]]
    result = await fakes.runner.change(ChangeRequest(TOPIC, 3))
    assert result.phase is Phase.DONE
    assert fakes.kafka.deleted == []


# Changes refused before anything is written --------------------------------------------------


def _nothing_written(fakes: _Fakes, state: TopicState) -> None:
    assert fakes.zk.saved == []
    assert fakes.zk.published == []
    assert fakes.zk.commits == []
    assert fakes.kafka.created == []
    assert fakes.state == state
    assert fakes.zk.holders == {}


async def test_a_validate_only_change_is_planned_without_taking_the_lock() -> None:
    state = _topic(2)
    fakes = _Fakes(state)
    planned = await fakes.runner.change(ChangeRequest(TOPIC, 5, validate_only=True))
    assert planned.phase is Phase.CREATING_PARTITIONS
    assert (planned.from_count, planned.target_count, planned.physical_count) == (2, 5, 5)
    assert planned.coordinator == A
    _nothing_written(fakes, state)
    assert fakes.zk.locks_taken == []
    assert fakes.zk.journals == {}
    assert fakes.operations("expand", "done") == 0
    assert fakes.audit.events == []


@pytest.mark.parametrize(
    ("counts", "request_", "message"),
    [
        ((3,), ChangeRequest(TOPIC, 3), "shrink needs a count in \\[3, 3\\), got 3"),
        ((2, 4), ChangeRequest(TOPIC, 1), "shrink needs a count in \\[2, 4\\), got 1"),
        ((2,), ChangeRequest(TOPIC, 10_001), "10001 partitions is above 10000"),
        # The request says which kind it is: not turned into an expansion.
        (
            (3, 5),
            ChangeRequest(TOPIC, 9, kind=OperationKind.SHRINK),
            "shrink needs a count in \\[3, 5\\), got 9",
        ),
        (
            (3, 5),
            ChangeRequest(TOPIC, 4, kind=OperationKind.EXPAND),
            "expansion needs more than the current 5 partitions, got 4",
        ),
    ],
)
async def test_a_target_the_change_cannot_reach_is_refused_and_nothing_written(
    counts: tuple[int, ...], request_: ChangeRequest, message: str
) -> None:
    state = _topic(*counts)
    fakes = _Fakes(state)
    with pytest.raises(InvalidPartitionCount, match=message):
        await fakes.runner.change(request_)
    _nothing_written(fakes, state)
    with pytest.raises(InvalidPartitionCount):
        await fakes.runner.change(replace(request_, validate_only=True))


async def test_a_change_of_an_unmanaged_topic_is_refused_without_making_a_lock() -> None:
    fakes = _Fakes(_topic(2))
    with pytest.raises(UnknownTopic):
        await fakes.runner.change(ChangeRequest("payments", 3))
    assert fakes.zk.locks_taken == []


async def test_a_change_is_refused_while_another_sidecar_drives_one() -> None:
    state = _topic(2)
    fakes = _Fakes(state)
    fakes.zk.journal(_journal(state, OperationKind.EXPAND, 3, Phase.BARRIER))
    fakes.zk.holders[TOPIC] = LockHolder("b", "change", time.time())
    for validate_only in (False, True):
        with pytest.raises(OperationInProgress) as refused:
            await fakes.runner.change(ChangeRequest(TOPIC, 4, validate_only=validate_only))
        assert refused.value.message == (
            "dead is changing orders to 3 partitions (barrier); the lock is held by b"
        )
    assert fakes.zk.saved == []
    assert fakes.zk.locks_taken == []
    assert fakes.zk.holders[TOPIC].owner == "b"


async def test_a_change_is_refused_while_housekeeping_holds_the_lock() -> None:
    # No unfinished journal, but the lock is held (a retirement round): the lock refuses.
    state = _topic(2)
    fakes = _Fakes(state)
    fakes.zk.holders[TOPIC] = LockHolder("b", "retirement", time.time())
    with pytest.raises(OperationInProgress):
        await fakes.runner.change(ChangeRequest(TOPIC, 3))
    assert fakes.zk.saved == []
    assert fakes.kafka.created == []


def _truncatable() -> TopicState:
    """Generation 1 moved keys at offset 10 of partition 0, in leader epoch 2."""
    log = GenerationLog.start(2, [Boundary(0, 0), Boundary(0, 0)])
    log = log.append(log.next_generation(3, [Boundary(10, 2), Boundary(4, 1), Boundary(0, 0)]))
    return TopicState(TopicConfig(TOPIC, 2, 3), log, (RW, RW, RW), (None,) * 3)


async def test_a_lost_boundary_refuses_the_change_until_an_operator_confirms_the_loss() -> None:
    state = _truncatable()
    fakes = _Fakes(state)
    fakes.kafka.epoch_ends[(0, 2)] = 7  # an unclean election cut records 7..9
    for validate_only in (True, False):
        with pytest.raises(BoundaryTruncated, match="partition 0 \\(generation 1, boundary 10"):
            await fakes.runner.change(ChangeRequest(TOPIC, 4, validate_only=validate_only))
    _nothing_written(fakes, state)

    confirmed = await fakes.runner.confirm_truncation(TOPIC)
    assert [(lost.partition, lost.generation, lost.offset) for lost in confirmed] == [(0, 1, 10)]
    assert fakes.zk.confirmed == {(1, 0, 10, 2)}
    result = await fakes.runner.change(ChangeRequest(TOPIC, 4))
    assert result.phase is Phase.DONE
    assert fakes.state.log.current.number == 2


# Changes that end rolled back ------------------------------------------------------------


async def test_a_barrier_a_live_sidecar_does_not_ack_in_time_is_rolled_back() -> None:
    state = _topic(2)
    fakes = _Fakes(state, barrier_timeout_s=0.0)
    fakes.zk.live = frozenset({A, B})
    fakes.zk.acks_on_publish = {A: {}}

    result = await fakes.runner.change(ChangeRequest(TOPIC, 3))

    assert (result.phase, result.outcome) == (
        Phase.ROLLED_BACK,
        "barrier timed out waiting for b",
    )
    assert fakes.zk.published == [PendingBarrier(1, 3)]
    assert fakes.zk.removed == [1]
    assert fakes.zk.commits == []
    # The partitions Kafka made stay (Kafka cannot delete partitions); nothing routes to
    # them: the topic is as it was.
    assert fakes.kafka.partitions == 3
    assert fakes.state == state
    assert fakes.zk.journals[TOPIC].phase is Phase.ROLLED_BACK
    assert fakes.phases_saved()[-2:] == [Phase.ROLLING_BACK, Phase.ROLLED_BACK]
    assert fakes.operations("expand", "rolled_back") == 1
    assert fakes.operations("expand", "done") == 0
    assert fakes.audit.events[-1]["result"] == "rolled_back"


async def test_partitions_kafka_would_not_create_roll_the_change_back_before_any_barrier() -> None:
    state = _topic(2)
    fakes = _Fakes(state)
    fakes.kafka.failures["create_partitions"] = [KafkaFailure("policy violation")]
    result = await fakes.runner.change(ChangeRequest(TOPIC, 3))
    assert (result.phase, result.outcome) == (
        Phase.ROLLED_BACK,
        "creating partitions failed: policy violation",
    )
    assert fakes.zk.published == []
    # Withdrawing the barrier is idempotent: asked though none was published.
    assert fakes.zk.removed == [1]
    assert fakes.state == state


async def test_a_failure_before_the_commit_past_the_deadline_rolls_the_change_back() -> None:
    state = _topic(2)
    fakes = _Fakes(state, barrier_timeout_s=0.0)
    fakes.zk.registered = frozenset({TransactionalId("p.z.3")})
    fakes.kafka.failures["fence_producer"] = [KafkaUnavailable("no coordinator")]
    result = await fakes.runner.change(ChangeRequest(TOPIC, 3))
    assert (result.phase, result.outcome) == (
        Phase.ROLLED_BACK,
        "FenceProducers failed: no coordinator",
    )
    # Not forgotten: the id was not fenced, the next change must fence it.
    assert fakes.zk.forgotten == []
    assert fakes.zk.removed == [1]
    assert fakes.state == state


async def test_zookeeper_away_at_the_barrier_past_the_deadline_rolls_the_change_back() -> None:
    state = _topic(2)
    fakes = _Fakes(state, barrier_timeout_s=0.0)
    fakes.zk.failures["live_sidecars"] = [MetadataUnavailable("session suspended")]
    result = await fakes.runner.change(ChangeRequest(TOPIC, 3))
    assert (result.phase, result.outcome) == (Phase.ROLLED_BACK, "barrier: session suspended")
    assert fakes.state == state


async def test_failures_after_the_barrier_passed_are_retried_never_rolled_back() -> None:
    # Past the barrier deadline at once, yet the barrier passed (every live sidecar had
    # acked): from there the change can only go forward.
    fakes = _Fakes(_topic(2), barrier_timeout_s=0.0)
    fakes.zk.failures["save_operation reading_boundaries"] = [MetadataUnavailable()]
    fakes.kafka.failures["stable_offsets"] = [KafkaUnavailable(), KafkaUnavailable()]
    fakes.zk.failures["commit_generation"] = [MetadataUnavailable()]
    result = await fakes.runner.change(ChangeRequest(TOPIC, 3))
    assert result.phase is Phase.DONE
    assert fakes.state.log.current.number == 1
    assert fakes.zk.removed == []
    assert fakes.trail == [
        "journal creating_partitions",
        "create partitions 3",
        "journal barrier",
        "publish barrier 1",
        "journal reading_boundaries",
        "read stable offsets",
        "journal committing",
        "commit generation 1 (done)",
    ]


# Changes taken over --------------------------------------------------------------------------


async def test_an_abandoned_change_is_finished_before_the_requested_one_starts() -> None:
    state = _topic(2, 4)
    fakes = _Fakes(state)
    fakes.zk.journal(_journal(state, OperationKind.SHRINK, 3, Phase.BARRIER))

    result = await fakes.runner.change(ChangeRequest(TOPIC, 5))

    # The shrink to 3 committed generation 2; the requested expansion starts from it.
    assert [(g.number, g.undeleted_count) for g, _ in fakes.zk.commits] == [(2, 3), (3, 5)]
    assert (result.from_generation, result.from_count, result.target_count) == (2, 3, 5)
    assert result.phase is Phase.DONE
    assert fakes.zk.published == [PendingBarrier(2, 3), PendingBarrier(3, 5)]
    assert fakes.zk.locks_taken == [(TOPIC, A, "change")]
    # Counted once: the operation requested.
    assert fakes.operations("shrink", "done") == 0
    assert fakes.operations("expand", "done") == 1


async def test_housekeeping_finishes_a_change_whose_coordinator_died() -> None:
    state = _topic(2)
    fakes = _Fakes(state)
    fakes.zk.journal(_journal(state, OperationKind.EXPAND, 3, Phase.CREATING_PARTITIONS))

    resumed = await fakes.runner.resume_abandoned(TOPIC)

    assert resumed is not None
    assert (resumed.phase, resumed.target_count) == (Phase.DONE, 3)
    assert fakes.kafka.created == [3]
    assert fakes.state.log.current.undeleted_count == 3
    assert fakes.zk.locks_taken == [(TOPIC, A, "resuming a change")]
    assert fakes.zk.holders == {}
    # The admin counters count requests; a resumed change was not one.
    assert fakes.operations("expand", "done") == 0


async def test_housekeeping_with_nothing_to_resume_takes_no_lock() -> None:
    fakes = _Fakes(_topic(2))
    assert await fakes.runner.resume_abandoned(TOPIC) is None
    await fakes.runner.change(ChangeRequest(TOPIC, 3))
    locks = list(fakes.zk.locks_taken)
    assert await fakes.runner.resume_abandoned(TOPIC) is None
    assert fakes.zk.locks_taken == locks


async def test_housekeeping_reads_a_journal_only_until_its_watch_reports_it() -> None:
    fakes = _Fakes(_topic(2))
    await fakes.runner.change(ChangeRequest(TOPIC, 3))
    assert await fakes.runner.resume_abandoned(TOPIC) is None
    reads = fakes.zk.journal_reads
    for _ in range(5):  # idle rounds: the watch says the journal is final
        await asyncio.sleep(0)
        assert await fakes.runner.resume_abandoned(TOPIC) is None
    assert fakes.zk.journal_reads == reads
    assert fakes.zk.locks_taken == [(TOPIC, A, "change")]


async def test_a_change_abandoned_after_the_watch_was_set_is_resumed_from_its_report() -> None:
    state = _topic(2)
    fakes = _Fakes(state)
    assert await fakes.runner.resume_abandoned(TOPIC) is None
    await asyncio.sleep(0)  # the watch reported: no journal
    # Another sidecar starts a change and dies; only the watch tells this one.
    fakes.zk.journal(_journal(state, OperationKind.EXPAND, 3, Phase.CREATING_PARTITIONS))
    await asyncio.sleep(0)
    reads = fakes.zk.journal_reads
    resumed = await fakes.runner.resume_abandoned(TOPIC)
    assert resumed is not None
    assert resumed.phase is Phase.DONE
    assert fakes.zk.journal_reads == reads  # taken over under the lock, not read first
    assert fakes.state.log.current.undeleted_count == 3


async def test_a_journal_its_watch_cannot_decode_is_read_every_round() -> None:
    fakes = _Fakes(_topic(2))
    assert await fakes.runner.resume_abandoned(TOPIC) is None
    await asyncio.sleep(0)
    [(_, unreadable)] = fakes.zk.journal_watches[TOPIC]
    unreadable()
    reads = fakes.zk.journal_reads
    assert await fakes.runner.resume_abandoned(TOPIC) is None
    assert await fakes.runner.resume_abandoned(TOPIC) is None
    assert fakes.zk.journal_reads == reads + 2


async def test_housekeeping_does_not_resume_a_change_whose_lock_is_held() -> None:
    state = _topic(2)
    fakes = _Fakes(state)
    fakes.zk.journal(_journal(state, OperationKind.EXPAND, 3, Phase.BARRIER))
    fakes.zk.holders[TOPIC] = LockHolder("b", "change", time.time())
    with pytest.raises(OperationInProgress):
        await fakes.runner.resume_abandoned(TOPIC)
    assert fakes.zk.saved == []
    assert fakes.zk.published == []


async def test_a_barrier_no_change_owns_is_withdrawn_by_the_next_lock_holder() -> None:
    # A coordinator that lost its lock published its barrier after a successor finished
    # the change: the journal is final, the barrier would refuse every later change.
    state = _topic(2, 3)
    fakes = _Fakes(replace(state, pending=PendingBarrier(2, 4)))
    finished = _journal(_topic(2), OperationKind.EXPAND, 3, Phase.DONE)
    fakes.zk.journal(finished)

    assert await fakes.runner.resume_abandoned(TOPIC, PendingBarrier(2, 4)) is None
    assert fakes.zk.removed == [2]
    assert fakes.state.pending is None
    assert fakes.zk.locks_taken == [(TOPIC, A, "resuming a change")]


async def test_a_change_withdraws_an_orphaned_barrier_before_publishing_its_own() -> None:
    fakes = _Fakes(replace(_topic(2), pending=PendingBarrier(1, 5)))
    result = await fakes.runner.change(ChangeRequest(TOPIC, 3))
    assert result.phase is Phase.DONE
    assert fakes.zk.removed == [1]
    assert fakes.zk.published == [PendingBarrier(1, 3)]
    assert fakes.state.log.current.undeleted_count == 3


async def test_a_barrier_seen_but_withdrawn_meanwhile_is_left_alone() -> None:
    fakes = _Fakes(_topic(2))
    assert await fakes.runner.resume_abandoned(TOPIC, PendingBarrier(1, 3)) is None
    assert fakes.zk.removed == []


async def test_a_coordinator_whose_journal_another_took_over_stops_without_writing() -> None:
    state = _topic(2)
    fakes = _Fakes(state)
    fakes.zk.live = frozenset({A, B})
    fakes.zk.acks_on_publish = {A: {}}
    change = asyncio.create_task(fakes.runner.change(ChangeRequest(TOPIC, 3)))
    await asyncio.wait_for(fakes.zk.barrier_up.wait(), 2.0)

    # Paused past its session, ``a`` lost the lock; ``c`` took the change over and moved
    # its journal on. Then ``b`` acks.
    successor = replace(fakes.zk.journals[TOPIC], coordinator=SidecarId("c"))
    fakes.zk.journal(replace(successor, phase=Phase.ROLLING_BACK))
    fakes.zk.acks[1][B] = {}

    with pytest.raises(ChangeTakenOver):
        await asyncio.wait_for(change, 2.0)
    assert fakes.zk.journals[TOPIC].coordinator == "c"
    assert fakes.zk.journals[TOPIC].phase is Phase.ROLLING_BACK
    assert fakes.zk.commits == []
    assert fakes.state.log == state.log
    assert fakes.operations("expand", "done") == 0
    assert fakes.operations("expand", "rolled_back") == 0


async def test_a_coordinator_that_lost_its_lock_does_not_take_its_own_change_over() -> None:
    state = _topic(2)
    fakes = _Fakes(state)
    fakes.zk.live = frozenset({A, B})
    fakes.zk.acks_on_publish = {A: {}}
    change = asyncio.create_task(fakes.runner.change(ChangeRequest(TOPIC, 3)))
    await asyncio.wait_for(fakes.zk.barrier_up.wait(), 2.0)

    # The session expired: the lock node is gone, the journal unfinished. This sidecar's
    # own housekeeping or a new request must not drive the change a second time.
    del fakes.zk.holders[TOPIC]
    with pytest.raises(OperationInProgress, match="a is still driving a change of orders"):
        await fakes.runner.resume_abandoned(TOPIC)
    with pytest.raises(OperationInProgress, match="still driving"):
        await fakes.runner.change(ChangeRequest(TOPIC, 4))
    assert fakes.zk.locks_taken == [(TOPIC, A, "change")]

    fakes.zk.acks[1][B] = {}
    result = await asyncio.wait_for(change, 2.0)
    assert result.phase is Phase.DONE
    assert fakes.zk.published == [PendingBarrier(1, 3)]
    # Done driving: nothing left to resume, and the next change is its own.
    assert await fakes.runner.resume_abandoned(TOPIC) is None
    fakes.zk.acks_on_publish = {A: {}, B: {}}
    assert (await fakes.runner.change(ChangeRequest(TOPIC, 4))).phase is Phase.DONE
