"""Expand/shrink procedure: the coordinator table and simulated peers.

The simulation links several participants and one coordinator through an in-memory
store and in-memory partitions. Hypothesis picks every interleaving: produces, sends
landing late or failing uncertainly, barrier notifications arriving late, sessions
suspending, expiring and reconnecting, coordinators timing out, and zombies: a session
may expire while its sidecar still has sends in flight (a paused process), which land
whenever the simulation likes unless the storage refuses them. The storage refuses a
send whose producer incarnation was fenced, as Kafka refuses a fenced transactional
producer. The invariant is the one DESIGN §5 promises: every record sits on the side of
every boundary that its generation header says (no write across a barrier), and no
produce fails because of a successful change.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.errors import InvalidPartitionCount
from sidecar.core.generations import GenerationLog
from sidecar.core.participant import Admission, Participant, SessionState
from sidecar.core.procedures import (
    TRANSITIONS,
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
    TransactionalId,
    UnexpectedObservation,
    incarnation_ids,
    plan_change,
    resume,
    step,
)

A, B = SidecarId("a"), SidecarId("b")


def expand(log: GenerationLog, target: int, now: float = 0.0) -> Operation:
    operation, _ = plan_change(
        kind=OperationKind.EXPAND,
        log=log,
        physical_count=log.current.physical_count,
        topic="t",
        target_count=target,
        coordinator=A,
        now=now,
        barrier_timeout=10.0,
    )
    return operation


def test_expansion_walks_the_table_to_done() -> None:
    log = GenerationLog.start(2)
    operation, actions = plan_change(
        kind=OperationKind.EXPAND,
        log=log,
        physical_count=2,
        topic="t",
        target_count=3,
        coordinator=A,
        now=0.0,
        barrier_timeout=10.0,
    )
    assert operation.phase is Phase.CREATING_PARTITIONS
    assert actions == [CreatePartitions("t", 3)]
    operation, actions = step(operation, PartitionsCreated(3))
    assert actions == [PublishBarrier("t", 1, 3)]
    # B has not acked: wait, no action.
    waiting = BarrierProgress(frozenset({A, B}), {A: {0: 4}}, now=1.0)
    assert step(operation, waiting) == (operation, [])
    operation, actions = step(
        operation, BarrierProgress(frozenset({A, B}), {A: {0: 4}, B: {0: 7, 1: 2}}, now=2.0)
    )
    assert operation.phase is Phase.READING_BOUNDARIES
    assert operation.acked_floor == (7, 2, 0)
    assert actions == [ReadStableOffsets("t", 3)]
    # The high watermark of partition 0 trails B's acknowledged offset 6: boundary 7.
    operation, actions = step(operation, StableOffsets([5, 9, 0], [3, 3, 0]))
    assert [b.offset for b in operation.boundaries] == [7, 9, 0]
    assert [b.leader_epoch for b in operation.boundaries] == [3, 3, 0]
    [commit] = actions
    assert isinstance(commit, CommitGeneration)
    assert commit.generation.number == 1
    assert commit.generation.undeleted_count == 3
    assert log.append(commit.generation).current.undeleted_count == 3
    operation, actions = step(operation, Committed())
    assert (operation.phase, actions) == (Phase.DONE, [])


def test_shrink_starts_at_the_barrier() -> None:
    log = GenerationLog.start(2)
    log = log.append(log.next_generation(4, list(GenerationLog.start(4).current.boundaries)))
    operation, actions = plan_change(
        kind=OperationKind.SHRINK,
        log=log,
        physical_count=4,
        topic="t",
        target_count=3,
        coordinator=A,
        now=0.0,
        barrier_timeout=5.0,
        delete_after_seconds=60.0,
    )
    assert operation.phase is Phase.BARRIER
    assert operation.pending_generation == 2
    assert actions == [PublishBarrier("t", 2, 3)]


def test_barrier_timeout_rolls_back() -> None:
    operation = expand(GenerationLog.start(1), 2)
    operation, _ = step(operation, PartitionsCreated(2))
    late = BarrierProgress(frozenset({A, B}), {A: {}}, now=10.0)
    operation, actions = step(operation, late)
    assert operation.phase is Phase.ROLLING_BACK
    assert "b" in operation.outcome
    assert actions == [RemoveBarrier("t", 1)]
    operation, actions = step(operation, RolledBack())
    assert (operation.phase, actions) == (Phase.ROLLED_BACK, [])


def test_an_expired_sidecar_is_not_waited_for() -> None:
    operation = expand(GenerationLog.start(1), 2)
    operation, _ = step(operation, PartitionsCreated(2))
    operation, _ = step(operation, BarrierProgress(frozenset({A}), {A: {}}, now=1.0))
    assert operation.phase is Phase.READING_BOUNDARIES


def test_producers_no_live_sidecar_owns_are_fenced_before_the_boundaries() -> None:
    operation = expand(GenerationLog.start(1), 2)
    operation, _ = step(operation, PartitionsCreated(2))
    registered = frozenset(TransactionalId(t) for t in ("a.0", "b.0", "b.1", "c.3"))
    # b lost its session and came back as b.1; c is gone (or paused past its session).
    progress = BarrierProgress(
        frozenset({A, B}),
        {A: {}, B: {0: 3}},
        now=1.0,
        registered=registered,
        live_producers=frozenset({TransactionalId("a.0"), TransactionalId("b.1")}),
    )
    operation, actions = step(operation, progress)
    assert operation.phase is Phase.FENCING
    assert operation.fenced == ("b.0", "c.3")
    assert operation.acked_floor == (3, 0)
    assert actions == [FenceProducers("t", (TransactionalId("b.0"), TransactionalId("c.3")))]
    # Resuming repeats the fence (idempotent: it only bumps epochs again).
    assert resume(operation) == actions
    operation, actions = step(operation, ProducersFenced())
    assert (operation.phase, actions) == (Phase.READING_BOUNDARIES, [ReadStableOffsets("t", 2)])


def test_nothing_to_fence_goes_straight_to_the_boundaries() -> None:
    operation = expand(GenerationLog.start(1), 2)
    operation, _ = step(operation, PartitionsCreated(2))
    owned = frozenset({TransactionalId("a.0")})
    progress = BarrierProgress(frozenset({A}), {A: {}}, 1.0, owned, owned)
    operation, actions = step(operation, progress)
    assert (operation.phase, operation.fenced) == (Phase.READING_BOUNDARIES, ())
    assert actions == [ReadStableOffsets("t", 2)]


def test_a_fence_that_cannot_be_made_rolls_back() -> None:
    operation = replace(expand(GenerationLog.start(1), 2), phase=Phase.FENCING)
    operation, actions = step(operation, Failed("FenceProducers failed: kafka away"))
    assert operation.phase is Phase.ROLLING_BACK
    assert actions == [RemoveBarrier("t", 1)]


def test_the_docstring_table_is_the_table_the_code_runs() -> None:
    """Every row of the module's transition table is in TRANSITIONS and vice versa."""
    import sidecar.core.procedures as procedures

    assert procedures.__doc__ is not None
    row = re.compile(r"^ {4}([A-Z_]+) {2,}([A-Z][A-Za-z]+)")
    rows = set()
    for line in procedures.__doc__.splitlines():
        match = row.match(line)
        if match and match[1] in Phase.__members__:
            rows.add((Phase[match[1]], match[2]))
    assert rows == {(phase, kind.__name__) for phase, kind in TRANSITIONS}


def test_failed_partition_creation_rolls_back() -> None:
    operation = expand(GenerationLog.start(1), 2)
    operation, actions = step(operation, Failed("policy violation"))
    assert operation.phase is Phase.ROLLING_BACK
    assert actions == [RemoveBarrier("t", 1)]


@pytest.mark.parametrize("phase", list(Phase))
def test_resume_repeats_the_phase_action(phase: Phase) -> None:
    operation = replace(expand(GenerationLog.start(1), 2), phase=phase)
    kinds = {
        Phase.CREATING_PARTITIONS: [CreatePartitions],
        Phase.BARRIER: [PublishBarrier],
        Phase.FENCING: [FenceProducers],
        Phase.READING_BOUNDARIES: [ReadStableOffsets],
        Phase.COMMITTING: [CommitGeneration],
        Phase.ROLLING_BACK: [RemoveBarrier],
        Phase.DONE: [],
        Phase.ROLLED_BACK: [],
    }
    assert [type(a) for a in resume(operation)] == kinds[phase]


def test_observations_outside_their_phase_are_refused() -> None:
    operation = expand(GenerationLog.start(1), 2)
    with pytest.raises(UnexpectedObservation):
        step(operation, Committed())
    with pytest.raises(UnexpectedObservation):
        step(operation, PartitionsCreated(1))
    done = replace(operation, phase=Phase.DONE)
    with pytest.raises(UnexpectedObservation):
        step(done, Failed("late"))


@pytest.mark.parametrize(
    ("kind", "target", "message"),
    [
        (OperationKind.EXPAND, 4, "more than the current 4"),
        (OperationKind.EXPAND, 3, "more than the current 4"),
        (OperationKind.EXPAND, 10_001, "above"),
        (OperationKind.SHRINK, 4, r"\[2, 4\)"),
        (OperationKind.SHRINK, 1, r"\[2, 4\)"),
    ],
)
def test_invalid_counts_are_refused(kind: OperationKind, target: int, message: str) -> None:
    log = GenerationLog.start(2)
    log = log.append(log.next_generation(4, list(GenerationLog.start(4).current.boundaries)))
    with pytest.raises(InvalidPartitionCount, match=message):
        plan_change(
            kind=kind,
            log=log,
            physical_count=4,
            topic="t",
            target_count=target,
            coordinator=A,
            now=0.0,
            barrier_timeout=1.0,
        )


# Simulated peers -------------------------------------------------------------------------


@dataclass
class Send:
    sidecar: SidecarId
    send_id: int
    partition: int
    generation: int
    producer: TransactionalId
    """The incarnation's transactional id it was sent with."""


@dataclass
class World:
    """Sidecars, one coordinator, a store and the partitions, all in memory."""

    log: GenerationLog
    participants: dict[SidecarId, Participant]
    live: set[SidecarId]
    partitions: list[list[int]]
    """Each record's generation header, in offset order."""
    in_flight: list[Send] = field(default_factory=list)
    ghosts: list[Send] = field(default_factory=list)
    """Sends reported failed that the broker may still append."""
    ghost_offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    operation: Operation | None = None
    barrier: int | None = None
    acks: dict[SidecarId, dict[int, int]] = field(default_factory=dict)
    now: float = 0.0
    next_send_id: int = 0
    changes_done: int = 0
    acknowledged_end: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    incarnations: dict[SidecarId, int] = field(default_factory=lambda: defaultdict(int))
    registered: set[TransactionalId] = field(default_factory=set)
    fenced: set[TransactionalId] = field(default_factory=set)
    fencing: bool = True
    """False: the coordinator fences nothing (to show what the fence prevents)."""
    refused: int = 0
    trace: list[tuple[str, int | str | None]] = field(default_factory=list)

    def producer(self, sidecar: SidecarId) -> TransactionalId:
        return TransactionalId(f"{sidecar}.{self.incarnations[sidecar]}")

    def moves(self) -> list[tuple[str, int | str | None]]:
        moves: list[tuple[str, int | str | None]] = []
        for sidecar, participant in self.participants.items():
            connected = participant.session is SessionState.CONNECTED
            if participant.admission() is Admission.ROUTE:
                moves.append(("produce", sidecar))
            if connected and self.barrier is not None and participant.pending_generation is None:
                moves.append(("see_barrier", sidecar))
            if connected and participant.pending_generation is not None and self.barrier is None:
                moves.append(("see_release", sidecar))
            if participant.ready_to_ack() and sidecar in self.live:
                moves.append(("ack", sidecar))
            if participant.uncertain:
                moves.append(("resolve", sidecar))
            if connected:
                moves.append(("suspend", sidecar))
            elif sidecar in self.live:
                # Sends of this sidecar may still be in flight: a paused process does not
                # notice its session expiring (the zombie); only the fence stops them.
                moves.append(("expire", sidecar))
                moves.append(("reconnect", sidecar))
            else:
                moves.append(("reconnect", sidecar))
        moves += [("land", i) for i in range(len(self.in_flight))]
        moves += [("fail", i) for i in range(len(self.in_flight))]
        moves += [
            ("ghost_lands", i)
            for i, ghost in enumerate(self.ghosts)
            if ghost.producer not in self.fenced
        ]
        moves.append(("coordinate", None) if self.operation else ("start_change", None))
        moves.append(("tick", None))
        # Repeat the common moves so that sessions do not spend most runs suspended.
        common = {"produce", "land", "see_barrier", "see_release", "ack", "coordinate", "reconnect"}
        return moves + [move for move in moves if move[0] in common] * 3

    def append(self, partition: int, generation: int, *, acknowledged: bool) -> int:
        self.partitions[partition].append(generation)
        offset = len(self.partitions[partition]) - 1
        if acknowledged:
            self.acknowledged_end[partition] = offset + 1
        return offset


def apply(world: World, move: str, arg: int | str | None, data: st.DataObject) -> None:
    if isinstance(arg, str):
        sidecar = SidecarId(arg)
        participant = world.participants[sidecar]
        if move == "produce":
            partition = data.draw(st.integers(0, participant.undeleted_count - 1))
            world.participants[sidecar] = participant.send_started()
            world.in_flight.append(
                Send(
                    sidecar,
                    world.next_send_id,
                    partition,
                    participant.generation,
                    world.producer(sidecar),
                )
            )
            world.next_send_id += 1
        elif move == "see_barrier":
            assert world.barrier is not None
            world.participants[sidecar] = participant.barrier_published(world.barrier)
        elif move == "see_release":
            world.participants[sidecar] = participant.metadata_reloaded(world.log.current, None)
        elif move == "ack":
            world.participants[sidecar], world.acks[sidecar] = participant.barrier_ack()
        elif move == "resolve":
            # Look for the uncertain sends in the log. One not found is abandoned: the
            # service makes sure it can no longer land before it reports it absent.
            for send_id in sorted(participant.uncertain):
                participant = participant.uncertain_resolved(
                    send_id, world.ghost_offsets.get(send_id)
                )
                world.ghosts = [g for g in world.ghosts if g.send_id != send_id]
            world.participants[sidecar] = participant
        elif move == "suspend":
            world.participants[sidecar] = participant.session_changed(SessionState.SUSPENDED)
        elif move == "expire":
            # A session times out long after a request does (and after the replica lag
            # limit): every record already appended is committed or truncated by now.
            for partition, records in enumerate(world.partitions):
                world.acknowledged_end[partition] = len(records)
            world.live.discard(sidecar)
            world.acks.pop(sidecar, None)
            world.participants[sidecar] = participant.session_changed(SessionState.LOST)
        elif move == "reconnect":
            if sidecar not in world.live:
                # A new session registers a new incarnation before it reads anything.
                world.incarnations[sidecar] += 1
                world.registered.add(world.producer(sidecar))
            world.live.add(sidecar)
            world.participants[sidecar] = participant.session_changed(
                SessionState.CONNECTED
            ).metadata_reloaded(world.log.current, world.barrier)
        return
    if move in ("land", "fail", "ghost_lands"):
        assert isinstance(arg, int)
        if move == "ghost_lands":
            ghost = world.ghosts.pop(arg)
            world.ghost_offsets[ghost.send_id] = (
                ghost.partition,
                world.append(ghost.partition, ghost.generation, acknowledged=False),
            )
            return
        send = world.in_flight.pop(arg)
        participant = world.participants[send.sidecar]
        if send.producer in world.fenced:
            # Kafka refuses a fenced producer's writes (and aborted its open transaction).
            world.refused += 1
            world.participants[send.sidecar] = participant.send_failed(
                send.send_id, maybe_appended=False
            )
            return
        if move == "land":
            offset = world.append(send.partition, send.generation, acknowledged=True)
            world.participants[send.sidecar] = participant.send_acknowledged(send.partition, offset)
        else:
            world.participants[send.sidecar] = participant.send_failed(
                send.send_id, maybe_appended=True
            )
            world.ghosts.append(send)
    elif move == "tick":
        world.now += 1.0
    elif move == "start_change":
        current = world.log.current.undeleted_count
        target = data.draw(st.integers(world.log.initial_count, 9).filter(lambda c: c != current))
        world.operation, actions = plan_change(
            kind=OperationKind.EXPAND if target > current else OperationKind.SHRINK,
            log=world.log,
            physical_count=len(world.partitions),
            topic="t",
            target_count=target,
            coordinator=A,
            now=world.now,
            barrier_timeout=data.draw(st.sampled_from([3.0, 30.0])),
        )
        run(world, actions, data)
    elif move == "coordinate":
        coordinate(world, data)


def coordinate(world: World, data: st.DataObject) -> None:
    operation = world.operation
    assert operation is not None
    if operation.phase is Phase.BARRIER:
        progress = BarrierProgress(
            frozenset(world.live),
            dict(world.acks),
            world.now,
            registered=frozenset(world.registered) if world.fencing else frozenset(),
            live_producers=frozenset(world.producer(s) for s in world.live),
        )
        world.operation, actions = step(operation, progress)
        run(world, actions, data)


def run(world: World, actions: list[Action], data: st.DataObject) -> None:
    """Execute coordinator actions against the in-memory store, feeding results back."""
    for action in actions:
        operation = world.operation
        assert operation is not None
        observation: Observation
        if isinstance(action, CreatePartitions):
            while len(world.partitions) < action.total_count:
                world.partitions.append([])
            observation = PartitionsCreated(len(world.partitions))
        elif isinstance(action, PublishBarrier):
            world.barrier = action.pending_generation
            world.acks = {}
            continue
        elif isinstance(action, FenceProducers):
            world.fenced |= set(action.transactional_ids)
            world.registered -= set(action.transactional_ids)
            # Initialising a fenced id ends its open transaction first (committed or
            # aborted, markers written): the stable offset passes all it ever wrote.
            for partition, records in enumerate(world.partitions):
                world.acknowledged_end[partition] = len(records)
            observation = ProducersFenced()
        elif isinstance(action, ReadStableOffsets):
            # The high watermark may trail the log end, but never an acknowledged record
            # (acks=all; a new leader answers OFFSET_NOT_AVAILABLE until it caught up).
            ends = [
                data.draw(st.integers(world.acknowledged_end[p], len(records)))
                for p, records in enumerate(world.partitions)
            ]

            observation = StableOffsets(ends, [None] * len(ends))
        elif isinstance(action, CommitGeneration):
            world.log = world.log.append(action.generation)
            world.barrier = None
            observation = Committed()
        elif isinstance(action, RemoveBarrier):
            world.barrier = None
            observation = RolledBack()
        else:
            raise AssertionError(action)
        world.operation, more = step(operation, observation)
        if world.operation.phase in (Phase.DONE, Phase.ROLLED_BACK):
            world.changes_done += world.operation.phase is Phase.DONE
            world.operation = None
        run(world, more, data)
        return


@settings(max_examples=400, deadline=None)
@given(data=st.data(), sidecars=st.integers(1, 3), initial=st.integers(1, 3))
def test_no_record_is_written_across_a_barrier(
    data: st.DataObject, sidecars: int, initial: int
) -> None:
    names = [SidecarId(f"s{i}") for i in range(sidecars)]
    world = new_world(names, initial)
    for _ in range(data.draw(st.integers(0, 120))):
        move, arg = data.draw(st.sampled_from(world.moves()))
        apply(world, move, arg, data)
        world.trace.append((move, arg))
    for partition, headers in enumerate(world.partitions):
        for offset, generation in enumerate(headers):
            assert world.log.generation_of(partition, offset) == generation, (
                f"record {partition}@{offset} of generation {generation} is on the wrong "
                f"side of a boundary: {world.log} {world.partitions} after {world.trace}"
            )
            assert partition < world.log[generation].undeleted_count


def new_world(names: list[SidecarId], initial: int) -> World:
    world = World(
        log=GenerationLog.start(initial),
        participants={n: Participant(0, initial) for n in names},
        live=set(names),
        partitions=[[] for _ in range(initial)],
    )
    world.registered = {world.producer(n) for n in names}
    return world


@pytest.mark.parametrize("fencing", [True, False])
def test_a_zombie_is_refused_only_because_it_was_fenced(fencing: bool) -> None:
    """The scenario seen on a real cluster: a sidecar paused with a send in flight, its
    session expires, a change commits without it, then it resumes and the send lands.
    With the fence the storage refuses it; without, it lands across the barrier."""

    class Script:
        """The draws, in order: the zombie's partition, then the stable offset of each of
        the three partitions (nothing is committed anywhere yet)."""

        answers: ClassVar[list[int]] = [1, 0, 0, 0]

        def draw(self, strategy: object) -> int:
            return self.answers.pop(0)

    zombie, other = SidecarId("z"), SidecarId("o")
    world = new_world([zombie, other], 2)
    world.fencing = fencing
    data = Script()
    apply(world, "produce", zombie, data)  # type: ignore[arg-type]
    apply(world, "suspend", zombie, data)  # type: ignore[arg-type]
    apply(world, "expire", zombie, data)  # type: ignore[arg-type]
    world.operation, actions = plan_change(
        kind=OperationKind.EXPAND,
        log=world.log,
        physical_count=2,
        topic="t",
        target_count=3,
        coordinator=other,
        now=0.0,
        barrier_timeout=30.0,
    )
    run(world, actions, data)  # type: ignore[arg-type]
    apply(world, "see_barrier", other, data)  # type: ignore[arg-type]
    apply(world, "ack", other, data)  # type: ignore[arg-type]
    coordinate(world, data)  # type: ignore[arg-type]
    assert world.log.current.number == 1, "the change committed without the zombie"
    apply(world, "land", 0, data)  # type: ignore[arg-type]
    landed = [
        (p, o)
        for p, headers in enumerate(world.partitions)
        for o, generation in enumerate(headers)
        if world.log.generation_of(p, o) != generation
    ]
    if fencing:
        assert (world.refused, landed) == (1, [])
    else:
        assert (world.refused, landed) == (0, [(1, 0)])


_SIDECAR_IDS = st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True).filter(
    lambda name: name not in (".", "..")
)


@given(
    st.lists(
        st.tuples(_SIDECAR_IDS, st.integers(0, 200), st.integers(1, 8)), min_size=2, max_size=6
    )
)
def test_no_two_incarnations_or_lanes_share_a_transactional_id(
    incarnations: list[tuple[str, int, int]],
) -> None:
    """Ids are fenced by name: two sidecars (or two incarnations of one) sharing an id
    would fence each other, whatever dots their ids hold."""
    seen: dict[TransactionalId, tuple[str, int, int]] = {}
    for sidecar, incarnation, lanes in set(incarnations):
        ids = incarnation_ids("ordered-sidecar", sidecar, incarnation, lanes)
        assert len(ids) == lanes
        assert ids[0] == f"ordered-sidecar.{sidecar}.{incarnation}"  # as before lanes
        for lane, transactional_id in enumerate(ids):
            owner = seen.setdefault(transactional_id, (sidecar, incarnation, lane))
            assert owner == (sidecar, incarnation, lane), transactional_id
