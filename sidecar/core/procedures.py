"""Partition-count changes (DESIGN §5): the coordinator, an explicit state machine.

Coordinator (one per topic at a time, under a lock). The operation record is the
journal: the caller persists the record returned by ``step`` *before* it runs the
actions, so a coordinator that dies anywhere is resumed from the stored record by
the next one (``resume``), and every action is idempotent. ``TRANSITIONS`` below is
the table the code runs:

    phase                 observation              next phase           action(s)
    ------------------    ---------------------    ------------------   -----------------------
    CREATING_PARTITIONS   PartitionsCreated        BARRIER              PublishBarrier
    CREATING_PARTITIONS   Failed                   ROLLING_BACK         RemoveBarrier
    BARRIER               BarrierProgress(all)     FENCING              FenceProducers
                            (stale producers)
    BARRIER               BarrierProgress(all)     READING_BOUNDARIES   ReadStableOffsets
                            (none stale)
    BARRIER               BarrierProgress(late)    ROLLING_BACK         RemoveBarrier
    BARRIER               Failed                   ROLLING_BACK         RemoveBarrier
    FENCING               ProducersFenced          READING_BOUNDARIES   ReadStableOffsets
    FENCING               Failed                   ROLLING_BACK         RemoveBarrier
    READING_BOUNDARIES    StableOffsets            COMMITTING           CommitGeneration
    COMMITTING            Committed                DONE                 -
    ROLLING_BACK          RolledBack               ROLLED_BACK          -

A shrink starts in BARRIER (no partitions to create). Rules the table enforces:
an observation that does not fit the phase is refused (``UnexpectedObservation``);
DONE and ROLLED_BACK are final; the barrier is only passed when *every live*
sidecar has acked (a sidecar whose session expired is not live); a boundary is at
least one past the last offset any sidecar reported acknowledged, because the last
stable offset can trail a committed record.

Fencing (the zombie argument). A sidecar whose session expired is not waited for,
but it may still be running: paused (GC, a frozen VM, SIGSTOP), it notices nothing
and on resuming sends what it had admitted, across a barrier it never saw. So the
storage must refuse it: every sidecar writes managed topics through a Kafka
transactional producer whose transactional id it registers in ZooKeeper, and before
the boundaries are read the coordinator fences every registered id that no live,
acking sidecar owns (``FenceProducers``: initialising a producer with that id bumps
its epoch and aborts its open transaction). Whatever the zombie sends afterwards is
rejected; what it sent before is committed below the boundaries or aborted, and
boundaries are read as last stable offsets, after the fence.

The participant (every sidecar, per managed topic), the other state machine of a
change, is ``sidecar.core.participant``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import NewType

from sidecar.core.errors import InvalidPartitionCount
from sidecar.core.generations import Boundary, Generation, GenerationLog

SidecarId = NewType("SidecarId", str)
TransactionalId = NewType("TransactionalId", str)


def incarnation_ids(
    client_id: str, sidecar_id: str, incarnation: int, lanes: int
) -> tuple[TransactionalId, ...]:
    """The transactional ids one incarnation of a sidecar writes with, one per lane.

    The first is ``<client id>.<sidecar id>.<incarnation>``; the others add ``~<lane>``.
    A sidecar id never holds ``~`` (``core.names``), so no two sidecars or incarnations
    share an id, whatever dots their names hold."""
    base = f"{client_id}.{sidecar_id}.{incarnation}"
    return tuple(TransactionalId(base if lane == 0 else f"{base}~{lane}") for lane in range(lanes))


def warm_transactional_id(client_id: str, sidecar_id: str) -> TransactionalId:
    """The id a sidecar warms the partitions of its changes with (``PartitionWarmer``):
    ``<client id>.<sidecar id>~warm``, which no lane's id can be (theirs end in a number)."""
    return TransactionalId(f"{client_id}.{sidecar_id}~warm")


MAX_PARTITION_COUNT = 10_000
"""Refuse absurd targets early; Kafka itself allows more but no test or app here needs it."""


class OperationKind(StrEnum):
    EXPAND = "expand"
    SHRINK = "shrink"


class Phase(StrEnum):
    CREATING_PARTITIONS = "creating_partitions"
    BARRIER = "barrier"
    FENCING = "fencing"
    READING_BOUNDARIES = "reading_boundaries"
    COMMITTING = "committing"
    ROLLING_BACK = "rolling_back"
    DONE = "done"
    ROLLED_BACK = "rolled_back"


FINAL_PHASES = frozenset({Phase.DONE, Phase.ROLLED_BACK})
BEFORE_COMMIT = frozenset({Phase.CREATING_PARTITIONS, Phase.BARRIER, Phase.FENCING})
"""Phases a change may still be rolled back from: nothing of the new generation exists."""


@dataclass(frozen=True, slots=True)
class Operation:
    """The journal of one partition-count change; stored as is in ZooKeeper."""

    topic: str
    kind: OperationKind
    from_generation: int
    from_count: int
    target_count: int
    phase: Phase
    coordinator: SidecarId
    started_at: float
    barrier_deadline: float
    physical_count: int
    """Physical partitions once the operation's partitions exist."""
    previous_boundaries: tuple[int, ...] = ()
    """Boundaries of the generation being replaced: a new boundary never moves back."""
    acked_floor: tuple[int, ...] = ()
    """Per partition: one past the highest offset any sidecar reported acknowledged."""
    fenced: tuple[TransactionalId, ...] = ()
    """Transactional ids fenced before the boundaries were read (no live sidecar owned them)."""
    boundaries: tuple[Boundary, ...] = ()
    delete_after_seconds: float | None = None
    outcome: str = ""

    @property
    def pending_generation(self) -> int:
        return self.from_generation + 1


class UnexpectedObservation(Exception):
    """An observation that the operation's phase does not accept (a caller bug)."""


# Observations fed to the coordinator ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionsCreated:
    physical_count: int


@dataclass(frozen=True, slots=True)
class Failed:
    reason: str


@dataclass(frozen=True, slots=True)
class BarrierProgress:
    live: frozenset[SidecarId]
    acks: Mapping[SidecarId, Mapping[int, int]]
    """Each acking sidecar's highest acknowledged offset + 1 per partition."""
    now: float
    registered: frozenset[TransactionalId] = frozenset()
    """Every transactional id registered by a sidecar (read before ``live``)."""
    live_producers: frozenset[TransactionalId] = frozenset()
    """The transactional ids the live sidecars' registrations name."""


@dataclass(frozen=True, slots=True)
class ProducersFenced:
    pass


@dataclass(frozen=True, slots=True)
class StableOffsets:
    """Last stable offsets (the high watermark once no transaction is open), per partition."""

    offsets: Sequence[int]
    leader_epochs: Sequence[int | None]


@dataclass(frozen=True, slots=True)
class Committed:
    pass


@dataclass(frozen=True, slots=True)
class RolledBack:
    pass


Observation = (
    PartitionsCreated
    | Failed
    | BarrierProgress
    | ProducersFenced
    | StableOffsets
    | Committed
    | RolledBack
)


# Actions the coordinator asks the caller to run ----------------------------------------


@dataclass(frozen=True, slots=True)
class CreatePartitions:
    topic: str
    total_count: int


@dataclass(frozen=True, slots=True)
class PublishBarrier:
    topic: str
    pending_generation: int
    target_count: int


@dataclass(frozen=True, slots=True)
class FenceProducers:
    """Initialise a producer with each id (bumping its epoch), then forget the ids."""

    topic: str
    transactional_ids: tuple[TransactionalId, ...]


@dataclass(frozen=True, slots=True)
class ReadStableOffsets:
    topic: str
    physical_count: int


@dataclass(frozen=True, slots=True)
class CommitGeneration:
    topic: str
    generation: Generation


@dataclass(frozen=True, slots=True)
class RemoveBarrier:
    topic: str
    pending_generation: int


Action = (
    CreatePartitions
    | PublishBarrier
    | FenceProducers
    | ReadStableOffsets
    | CommitGeneration
    | RemoveBarrier
)


def plan_change(
    *,
    kind: OperationKind,
    log: GenerationLog,
    physical_count: int,
    topic: str,
    target_count: int,
    coordinator: SidecarId,
    now: float,
    barrier_timeout: float,
    delete_after_seconds: float | None = None,
) -> tuple[Operation, list[Action]]:
    """Validate a change to ``target_count`` and build its first journal record.

    Raises InvalidPartitionCount (KIP-195 INVALID_PARTITIONS) if an expansion's target
    is not above the current count or above MAX_PARTITION_COUNT, or a shrink's target
    is not in ``[N, U)``.
    """
    if kind is OperationKind.EXPAND:
        validate_expansion(log, target_count)
    else:
        validate_shrink(log, target_count)
    current = log.current.undeleted_count
    operation = Operation(
        topic=topic,
        kind=kind,
        from_generation=log.current.number,
        from_count=current,
        target_count=target_count,
        phase=Phase.CREATING_PARTITIONS if kind is OperationKind.EXPAND else Phase.BARRIER,
        coordinator=coordinator,
        started_at=now,
        barrier_deadline=now + barrier_timeout,
        physical_count=max(physical_count, target_count),
        previous_boundaries=tuple(b.offset for b in log.current.boundaries),
        delete_after_seconds=delete_after_seconds,
    )
    return operation, resume(operation)


def validate_expansion(log: GenerationLog, target_count: int) -> None:
    """KIP-195 ``increaseTo`` rules: the target is an absolute count above the current one."""
    if target_count <= log.current.undeleted_count:
        raise InvalidPartitionCount(
            f"expansion needs more than the current {log.current.undeleted_count} partitions, "
            f"got {target_count}"
        )
    if target_count > MAX_PARTITION_COUNT:
        raise InvalidPartitionCount(f"{target_count} partitions is above {MAX_PARTITION_COUNT}")


def validate_shrink(log: GenerationLog, target_count: int) -> None:
    """A shrink keeps ``N <= target < U`` (KIP-253: never below the initial count)."""
    current = log.current.undeleted_count
    if not log.initial_count <= target_count < current:
        raise InvalidPartitionCount(
            f"shrink needs a count in [{log.initial_count}, {current}), got {target_count}"
        )


_PHASE_ACTIONS: dict[Phase, Callable[[Operation], list[Action]]] = {
    Phase.CREATING_PARTITIONS: lambda op: [CreatePartitions(op.topic, op.physical_count)],
    Phase.BARRIER: lambda op: [PublishBarrier(op.topic, op.pending_generation, op.target_count)],
    Phase.FENCING: lambda op: [FenceProducers(op.topic, op.fenced)],
    Phase.READING_BOUNDARIES: lambda op: [ReadStableOffsets(op.topic, op.physical_count)],
    Phase.COMMITTING: lambda op: [CommitGeneration(op.topic, _generation_of(op))],
    Phase.ROLLING_BACK: lambda op: [RemoveBarrier(op.topic, op.pending_generation)],
    Phase.DONE: lambda op: [],
    Phase.ROLLED_BACK: lambda op: [],
}
"""What each phase does; ``resume`` repeats it (every action is idempotent)."""


def resume(operation: Operation) -> list[Action]:
    """The (idempotent) actions that carry a stored operation forward from its phase."""
    return _PHASE_ACTIONS[operation.phase](operation)


def step(operation: Operation, observation: Observation) -> tuple[Operation, list[Action]]:
    """Advance the coordinator by one observation.

    Returns the new record (persist it first) and the actions to run. Raises
    UnexpectedObservation if the phase does not accept ``observation``.
    """
    transition = TRANSITIONS.get((operation.phase, type(observation)))
    if transition is None:
        raise UnexpectedObservation(f"{type(observation).__name__} in phase {operation.phase}")
    moved = transition(operation, observation)
    if moved.phase is operation.phase:
        return moved, []
    return moved, resume(moved)


def missing_acks(operation: Operation, progress: BarrierProgress) -> frozenset[SidecarId]:
    """Live sidecars that have not acked the barrier yet."""
    return frozenset(progress.live - progress.acks.keys())


def stale_producers(progress: BarrierProgress) -> tuple[TransactionalId, ...]:
    """Registered transactional ids no live sidecar owns: the possible zombies."""
    return tuple(sorted(progress.registered - progress.live_producers))


def _partitions_created(operation: Operation, observation: Observation) -> Operation:
    assert isinstance(observation, PartitionsCreated)
    if observation.physical_count < operation.target_count:
        raise UnexpectedObservation(
            f"{observation.physical_count} partitions exist, {operation.target_count} needed"
        )
    return replace(operation, physical_count=observation.physical_count, phase=Phase.BARRIER)


def _failed(operation: Operation, observation: Observation) -> Operation:
    assert isinstance(observation, Failed)
    return replace(operation, outcome=observation.reason, phase=Phase.ROLLING_BACK)


def _barrier_progress(operation: Operation, observation: Observation) -> Operation:
    assert isinstance(observation, BarrierProgress)
    if not missing_acks(operation, observation):
        floor = [0] * operation.physical_count
        for acked in observation.acks.values():
            for partition, next_offset in acked.items():
                if 0 <= partition < len(floor):
                    floor[partition] = max(floor[partition], next_offset)
        fenced = stale_producers(observation)
        return replace(
            operation,
            acked_floor=tuple(floor),
            fenced=fenced,
            phase=Phase.FENCING if fenced else Phase.READING_BOUNDARIES,
        )
    if observation.now >= operation.barrier_deadline:
        missing = ", ".join(sorted(missing_acks(operation, observation)))
        return replace(
            operation,
            outcome=f"barrier timed out waiting for {missing}",
            phase=Phase.ROLLING_BACK,
        )
    return operation


def _with_boundaries(operation: Operation, observation: Observation) -> Operation:
    assert isinstance(observation, StableOffsets)
    if len(observation.offsets) < operation.physical_count:
        raise UnexpectedObservation(
            f"{len(observation.offsets)} stable offsets for {operation.physical_count} partitions"
        )
    boundaries = []
    for partition in range(operation.physical_count):
        # The stable offset can trail a record some sidecar already saw committed (the
        # transaction marker is written after the commit returns), or, after a leader
        # change, even the previous boundary: take the largest.
        floors = (operation.acked_floor, operation.previous_boundaries)
        floor = max((f[partition] for f in floors if partition < len(f)), default=0)
        epochs = observation.leader_epochs
        epoch = epochs[partition] if partition < len(epochs) else None
        boundaries.append(Boundary(max(observation.offsets[partition], floor), epoch))
    return replace(operation, boundaries=tuple(boundaries), phase=Phase.COMMITTING)


def _to(phase: Phase, outcome: str | None = None) -> Callable[[Operation, Observation], Operation]:
    def transition(operation: Operation, observation: Observation) -> Operation:
        if outcome is None:
            return replace(operation, phase=phase)
        return replace(operation, phase=phase, outcome=outcome)

    return transition


TRANSITIONS: dict[
    tuple[Phase, type[Observation]], Callable[[Operation, Observation], Operation]
] = {
    (Phase.CREATING_PARTITIONS, PartitionsCreated): _partitions_created,
    (Phase.CREATING_PARTITIONS, Failed): _failed,
    (Phase.BARRIER, BarrierProgress): _barrier_progress,
    (Phase.BARRIER, Failed): _failed,
    (Phase.FENCING, ProducersFenced): _to(Phase.READING_BOUNDARIES),
    (Phase.FENCING, Failed): _failed,
    (Phase.READING_BOUNDARIES, StableOffsets): _with_boundaries,
    (Phase.COMMITTING, Committed): _to(Phase.DONE, "committed"),
    (Phase.ROLLING_BACK, RolledBack): _to(Phase.ROLLED_BACK),
}
"""(phase, observation type) -> the record after it; the module docstring's table."""


def _generation_of(operation: Operation) -> Generation:
    return Generation(operation.pending_generation, operation.target_count, operation.boundaries)
