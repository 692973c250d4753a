"""The release step (``sidecar.core.release``) driven directly, against a reference that
judges every record on its own.

A simulated release path does what each step says, as ``sidecar.service.release``
does: it reads the group's progress when asked (and with it the group's keys_revoked
acknowledgements), tells the app by callback (confirmed at once) or as events (left
for the app's next response), and gives the step inputs read after each action, a
rebalance possibly beginning between two steps. Hypothesis draws the generation log,
the partition's head, the group's progress and the ledger.

The properties: the step ends; it releases nothing beyond the head, nothing once a
rebalance takes the partition, nothing whose gate is closed or whose hand-off is not
acknowledged, nothing past the response's room; it tells keys_revoked only once the
group's acknowledgements were read, only for a boundary the partition reached, and
each once; and what it releases and tells is what deciding record by record (the
release loop before runs were decided at once) releases and tells.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.compaction import compact
from sidecar.core.gate import GroupProgress, unmet, waits_into
from sidecar.core.generations import Boundary, GenerationLog, PartitionMode
from sidecar.core.handoff import (
    HandoffKind,
    HandoffLedger,
    Revocation,
    Subject,
    revocation_points,
    revocations_due,
    revoked_through,
)
from sidecar.core.placement import RELOCATION_HEADER, STAMP_HEADER, routed_generation
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
    Step,
    TellAssigned,
    TellRevoked,
    is_relocation_tombstone,
    record_size,
)
from tests.unit.service.fakes import Record

TOPIC = "t"


@dataclass(frozen=True)
class World:
    """One partition's release: what the step is given, and what the group holds."""

    log: GenerationLog | None
    partition: int
    head: tuple[Record, ...]
    delivered: int | None
    progress: GroupProgress
    group_acknowledged: frozenset[tuple[int, int]]
    """The (partition, generation) revocations the group acknowledged, in ZooKeeper."""
    ledger: HandoffLedger
    room: Room
    callbacks: bool
    """The app is told by callback (confirmed at once), else by events it acknowledges later."""
    revoke_at: int | None
    """A rebalance begins to take the partition before this step (None: none)."""


@dataclass
class Drive:
    """What the simulated release path did."""

    steps: list[tuple[Step, ReleaseInputs[Record]]] = field(default_factory=list)
    released: list[Record] = field(default_factory=list)
    told_assigned: list[Subject] = field(default_factory=list)
    told_revoked: list[tuple[Revocation, bool]] = field(default_factory=list)
    progress_reads: int = 0


def drive(world: World) -> Drive:
    """Do what the step says until it is done (as ``Release._release_partition``)."""
    decision = PartitionRelease[Record](TOPIC, world.partition, managed=True)
    head = deque(world.head)
    ledger, progress = world.ledger, None
    room = world.room
    done = Drive()
    while True:
        assert len(done.steps) <= 4 * len(world.head) + 16, "the step does not end"
        inputs = ReleaseInputs(
            head=tuple(head),  # as it was at this step, for the properties to look at
            delivered=world.delivered,
            log=world.log,
            progress=progress,
            ledger=ledger,
            room=room,
            revoking=world.revoke_at is not None and len(done.steps) >= world.revoke_at,
        )
        step = decision.next_step(inputs)
        done.steps.append((step, inputs))
        match step:
            case Deliver(count=count, size=size):
                run = [head.popleft() for _ in range(count)]
                done.released += run
                room = Room(room.max_bytes, room.used + size, room.records + count)
            case Skip():
                head.popleft()
            case NeedProgress():
                done.progress_reads += 1
                progress = world.progress
                ledger = ledger.with_group_revocations(TOPIC, world.group_acknowledged)
            case TellAssigned(subject=subject):
                done.told_assigned.append(subject)
                if world.callbacks:
                    ledger = ledger.confirmed(HandoffKind.KEYS_ASSIGNED, *subject)
                else:
                    ledger, _ = ledger.tell(HandoffKind.KEYS_ASSIGNED, *subject)
            case TellRevoked(revocation=revocation, patient=patient):
                done.told_revoked.append((revocation, patient))
                subject = Subject(TOPIC, revocation.partition, revocation.generation)
                if world.callbacks:
                    ledger = ledger.confirmed(HandoffKind.KEYS_REVOKED, *subject)
                else:
                    ledger, _ = ledger.tell(HandoffKind.KEYS_REVOKED, *subject)
            case ReadLog() | Blocked() | GateOpened() | ResponseFull():
                pass
            case Done():
                return done


# Drawing worlds ------------------------------------------------------------------------------


@st.composite
def logs(draw: st.DrawFn) -> GenerationLog:
    initial = draw(st.integers(1, 3))
    log = GenerationLog.start(initial)
    for _ in range(draw(st.integers(0, 4))):
        current = log.current
        count = draw(st.integers(initial, 6).filter(current.undeleted_count.__ne__))
        boundaries = [
            Boundary((current.boundary(p) or 0) + draw(st.integers(0, 6)))
            for p in range(max(count, current.physical_count))
        ]
        log = log.append(log.next_generation(count, boundaries))
    return log


@st.composite
def heads(draw: st.DrawFn, log: GenerationLog, partition: int) -> tuple[Record, ...]:
    """Records in offset order, some relocation tombstones, stamped with the generation of
    their offset, another one the log knows, a newer one (at the log's end) or none."""
    current = log.current
    top = (current.boundary(partition) or 0) + 8
    offset = draw(st.integers(0, top))
    records = []
    # Often short or empty: a caught-up partition ends by telling what is due.
    for _ in range(draw(st.integers(0, 12) | st.integers(0, 12) | st.integers(0, 1))):
        offset += draw(st.integers(1, 3))
        try:
            own: int | None = log.generation_of(partition, offset)
        except ValueError:
            own = None
        # Mostly its own generation; sometimes none, an older one, or one not read yet.
        choices: list[int | None] = [None, draw(st.integers(0, current.number))]
        if own is not None:
            choices += [own] * 5
            if own == current.number:
                choices.append(current.number + 1)
        generation = draw(st.sampled_from(choices))
        stamp: tuple[tuple[str, bytes | None], ...] = ()
        if generation is not None:
            stamp = ((STAMP_HEADER, f"{generation} 1 s 0".encode()),)
        if draw(st.integers(0, 7)) == 0:
            tombstone = (*stamp, (RELOCATION_HEADER, b"1"))
            records.append(Record(TOPIC, partition, offset, b"k", None, tombstone))
        else:
            key = draw(st.sampled_from([None, b"k", b"key"]))
            value = draw(st.sampled_from([None, b"v", b"value"]))
            records.append(Record(TOPIC, partition, offset, key, value, stamp))
    return tuple(records)


def _subjects(log: GenerationLog) -> list[tuple[int, int]]:
    """Every revocation of the log, as (partition, generation)."""
    return [
        (r.partition, r.generation)
        for p in range(log.current.physical_count)
        for r in revocation_points(log, p)
    ]


@st.composite
def worlds(draw: st.DrawFn, *, gated: bool = True) -> World:
    log = draw(logs())
    partition = draw(st.integers(0, log.current.physical_count - 1))
    head = draw(heads(log, partition))
    first = head[0].offset if head else (log.current.boundary(partition) or 0) + 9
    delivered = draw(st.none() | st.just(first) | st.integers(0, first))
    count = log.current.physical_count
    top = max(b.offset for g in log.generations for b in g.boundaries) + 4
    committed = {p: draw(st.integers(0, top)) for p in range(count) if draw(st.booleans())}
    log_start = {p: draw(st.integers(0, 3)) for p in range(count)}
    modes = draw(
        st.lists(
            st.sampled_from(list(PartitionMode)).filter(lambda m: m is not PartitionMode.REMOVED)
            | st.just(PartitionMode.REMOVED),
            min_size=count,
            max_size=count,
        )
    )
    revocations = _subjects(log)
    group = frozenset(draw(st.sets(st.sampled_from(revocations))) if revocations else ())
    progress = GroupProgress(committed, log_start, modes, revoked_through(log, group))
    known = frozenset(draw(st.sets(st.sampled_from(revocations))) if revocations else ())
    assigned = draw(st.sets(st.integers(0, log.current.number)))
    ledger = HandoffLedger().with_group_revocations(TOPIC, known)
    for generation in sorted(assigned):
        ledger = ledger.confirmed(HandoffKind.KEYS_ASSIGNED, TOPIC, partition, generation)
    max_bytes = draw(st.none() | st.integers(0, 12))
    records_before = draw(st.integers(0, 2))
    used = draw(st.integers(0, 6)) if records_before else 0
    return World(
        log=log if gated else None,
        partition=partition,
        head=head,
        delivered=delivered,
        progress=progress,
        group_acknowledged=group,
        ledger=ledger,
        room=Room(max_bytes, used, records_before),
        callbacks=draw(st.booleans()),
        revoke_at=draw(st.integers(0, 8)) if draw(st.integers(0, 3)) == 0 else None,
    )


# The reference: every record judged on its own -----------------------------------------------


def may_release(world: World, record: Record) -> bool:
    """Rule 3 for one record, once the step's tells are done: by callback, every hand-off
    the app is told is confirmed; by events, only what the ledger or the group had."""
    log = world.log
    if log is None:
        return True
    written = routed_generation(record.headers)
    if written is not None and written > log.current.number:
        return False
    try:
        generation = log.generation_of(world.partition, record.offset)
    except ValueError:
        return False
    waits = waits_into(log, world.partition, generation)
    if waits:
        if unmet(waits, world.progress):
            return False
        subject = (TOPIC, world.partition, generation)
        if not world.callbacks and not world.ledger.acknowledged(
            HandoffKind.KEYS_ASSIGNED, *subject
        ):
            return False
    acknowledged = world.ledger.revocations(TOPIC) | world.group_acknowledged
    return world.callbacks or all(
        (r.partition, r.generation) in acknowledged
        for r in revocation_points(log, world.partition)
        if 0 < r.boundary <= record.offset
    )


def reference_release(world: World) -> list[Record]:
    """The records released, judged one by one as the release loop judged them."""
    released: list[Record] = []
    used, records = world.room.used, world.room.records
    for record in world.head:
        if is_relocation_tombstone(record):
            continue
        if not may_release(world, record):
            break
        size = record_size(record)
        limit = world.room.max_bytes
        if limit is not None and records and used + size > limit:
            break
        released.append(record)
        used, records = used + size, records + 1
    return released


# Properties ----------------------------------------------------------------------------------


@given(worlds())
def test_the_step_ends_and_releases_only_what_it_was_given(world: World) -> None:
    done = drive(world)
    assert isinstance(done.steps[-1][0], Done)
    assert [r.offset for r in done.released] == sorted({r.offset for r in done.released})
    assert set(done.released) <= set(world.head)
    assert done.progress_reads <= 1
    for step, inputs in done.steps:
        if isinstance(step, Deliver):
            assert 1 <= step.count <= len(inputs.head)
            run = list(inputs.head)[: step.count]
            assert step.size == sum(record_size(r) for r in run)
            assert not any(is_relocation_tombstone(r) for r in run)
        if isinstance(step, Skip):
            assert is_relocation_tombstone(inputs.head[0])


@given(worlds())
def test_nothing_is_released_or_told_once_a_rebalance_takes_the_partition(world: World) -> None:
    done = drive(world)
    for step, inputs in done.steps:
        if inputs.revoking:
            assert isinstance(step, Done), step


@given(worlds())
def test_a_record_is_released_only_through_an_open_gate_and_an_acknowledged_hand_off(
    world: World,
) -> None:
    log = world.log
    assert log is not None
    for step, inputs in drive(world).steps:
        if not isinstance(step, Deliver):
            continue
        for record in list(inputs.head)[: step.count]:
            written = routed_generation(record.headers)
            assert written is None or written <= log.current.number
            generation = log.generation_of(world.partition, record.offset)
            waits = waits_into(log, world.partition, generation)
            if waits:
                assert inputs.progress is not None
                assert unmet(waits, inputs.progress) == ()
                subject = (TOPIC, world.partition, generation)
                assert inputs.ledger.acknowledged(HandoffKind.KEYS_ASSIGNED, *subject)
            for revocation in revocation_points(log, world.partition):
                if 0 < revocation.boundary <= record.offset:
                    assert inputs.ledger.acknowledged(
                        HandoffKind.KEYS_REVOKED, TOPIC, world.partition, revocation.generation
                    )


@given(worlds())
def test_a_response_takes_no_more_than_its_room(world: World) -> None:
    limit = world.room.max_bytes
    for step, inputs in drive(world).steps:
        if isinstance(step, Deliver) and limit is not None:
            room = inputs.room
            first_of_response = room.records == 0 and step.count == 1
            assert room.used + step.size <= limit or first_of_response


@given(worlds())
def test_keys_revoked_is_told_once_the_group_was_read_and_the_boundary_reached(
    world: World,
) -> None:
    done = drive(world)
    told = [revocation for revocation, _ in done.told_revoked]
    assert len(told) == len(set(told)), "told twice in one poll"
    released_any = False
    for step, inputs in done.steps:
        released_any = released_any or isinstance(step, Deliver)
        if isinstance(step, TellAssigned):
            assert inputs.progress is not None
            assert not inputs.ledger.acknowledged(HandoffKind.KEYS_ASSIGNED, *step.subject)
        if not isinstance(step, TellRevoked):
            continue
        revocation = step.revocation
        assert inputs.progress is not None, "told before the group's acknowledgements were read"
        assert not inputs.revoking
        assert revocation.partition == world.partition
        assert not inputs.ledger.acknowledged(
            HandoffKind.KEYS_REVOKED, TOPIC, revocation.partition, revocation.generation
        )
        if step.patient:
            # Before a record past the boundary is released.
            assert inputs.head
            assert inputs.head[0].offset >= revocation.boundary > 0
        else:
            # At the end of a poll that released nothing of the partition.
            assert not released_any
            assert inputs.delivered is not None
            assert inputs.delivered >= revocation.boundary > 0


@settings(max_examples=200)
@given(worlds())
def test_runs_release_what_deciding_record_by_record_releases(world: World) -> None:
    quiet = World(**{**world.__dict__, "revoke_at": None})
    done = drive(quiet)
    assert done.released == reference_release(quiet)
    if quiet.callbacks:
        return
    # By events, the end of a poll tells exactly what is due once the group was read.
    log = quiet.log
    assert log is not None
    told_at_end = {r for r, patient in done.told_revoked if not patient}
    told_before = {r for r, patient in done.told_revoked if patient}
    due: set[Revocation] = set()
    if not done.released and quiet.delivered is not None:
        acknowledged = quiet.ledger.revocations(TOPIC) | quiet.group_acknowledged
        due = set(revocations_due(log, quiet.partition, quiet.delivered, acknowledged))
    # What was told before a record past its boundary is not told again at the end.
    assert told_at_end == due - told_before


@given(worlds(gated=False))
def test_an_unordered_topic_releases_its_head_but_tombstones_and_tells_nothing(
    world: World,
) -> None:
    quiet = World(**{**world.__dict__, "revoke_at": None})
    done = drive(quiet)
    assert done.released == reference_release(quiet)
    assert (done.told_assigned, done.told_revoked, done.progress_reads) == ([], [], 0)


# Examples ----------------------------------------------------------------------------------


def _expanded(boundary: int) -> GenerationLog:
    """Keys of partition 0 moved to a new partition 1 at ``boundary`` (generation 1)."""
    log = GenerationLog.start(1)
    return log.append(log.next_generation(2, [Boundary(boundary), Boundary(0)]))


def test_a_run_stops_at_the_boundary_until_keys_revoked_is_acknowledged() -> None:
    log = _expanded(5)
    head = tuple(Record(TOPIC, 0, offset, b"k", b"v") for offset in range(10))
    progress = GroupProgress({}, {}, [PartitionMode.READ_WRITE] * 2, revoked_through(log, set()))
    world = World(log, 0, head, 0, progress, frozenset(), HandoffLedger(), Room(None), False, None)
    done = drive(world)
    assert [r.offset for r in done.released] == [0, 1, 2, 3, 4]
    assert [type(step).__name__ for step, _ in done.steps] == [
        "Deliver",  # 0-4, one decision for the run
        "NeedProgress",  # 5 lies past a boundary the ledger has no acknowledgement of
        "TellRevoked",
        "Done",  # told, not acknowledged yet: nothing more in this poll
    ]
    # Acknowledged (here, through the group), the rest is one run.
    acknowledged = World(**{**world.__dict__, "head": head[5:], "delivered": 5})
    acknowledged = World(**{**acknowledged.__dict__, "group_acknowledged": frozenset({(0, 1)})})
    assert [r.offset for r in drive(acknowledged).released] == [5, 6, 7, 8, 9]


def test_a_gated_record_waits_for_the_group_then_tells_keys_assigned_once() -> None:
    log = _expanded(5)
    head = (Record(TOPIC, 1, 0, b"k", b"v"), Record(TOPIC, 1, 1, b"k", b"v"))
    modes = [PartitionMode.READ_WRITE] * 2
    behind = GroupProgress({0: 4}, {}, modes, revoked_through(log, {(0, 1)}))
    world = World(log, 1, head, 0, behind, frozenset(), HandoffLedger(), Room(None), False, None)
    steps = [step for step, _ in drive(world).steps]
    assert isinstance(steps[1], Blocked)
    assert [(w.source, w.boundary) for w in steps[1].waits] == [(0, 5)]
    caught_up = GroupProgress({0: 5}, {}, modes, revoked_through(log, {(0, 1)}))
    told = drive(World(**{**world.__dict__, "progress": caught_up}))
    assert told.released == []
    assert told.told_assigned == [Subject(TOPIC, 1, 1)]
    assert [type(step).__name__ for step, _ in told.steps] == [
        "NeedProgress",
        "GateOpened",
        "TellAssigned",
        "Done",
    ]
    by_callback = drive(World(**{**world.__dict__, "progress": caught_up, "callbacks": True}))
    assert [r.offset for r in by_callback.released] == [0, 1]


def test_a_record_written_under_a_generation_not_read_yet_asks_for_the_log() -> None:
    log = _expanded(0)
    stamped = ((STAMP_HEADER, b"2 3 s 0"),)
    head = (Record(TOPIC, 0, 0, b"k", b"v"), Record(TOPIC, 0, 1, b"k", b"v", stamped))
    progress = GroupProgress({}, {}, [PartitionMode.READ_WRITE] * 2)
    world = World(log, 0, head, 0, progress, frozenset(), HandoffLedger(), Room(None), False, None)
    done = drive(world)
    assert [r.offset for r in done.released] == [0]
    assert [step for step, _ in done.steps][1] == ReadLog(2)


def test_a_buffered_record_of_a_folded_generation_is_released_after_keys_assigned() -> None:
    """A consumer fetched partition 0 before retention removed offsets below 9, and the
    log was compacted to begin at generation 2 (boundary 9 there) before it released
    them: they are judged as generation 2's records, not left waiting for ever."""
    log = _expanded(5)
    log = log.append(log.next_generation(1, [Boundary(9), Boundary(4)]))
    compacted = compact(log, 2)
    head = tuple(Record(TOPIC, 0, offset, b"k", b"v") for offset in range(3, 11))
    modes = [PartitionMode.READ_WRITE, PartitionMode.READ_ONLY]
    gone = GroupProgress({}, {0: 9, 1: 4}, modes, revoked_through(compacted, set()))
    world = World(compacted, 0, head, 3, gone, frozenset(), HandoffLedger(), Room(None), True, None)
    done = drive(world)
    assert done.told_assigned == [Subject(TOPIC, 0, 2)]
    assert [r.offset for r in done.released] == list(range(3, 11))
    # The full log releases them too (generation 0's records of partition 0 wait for
    # nothing; generation 2's wait for partition 1 up to 4, gone).
    assert [r.offset for r in drive(World(**{**world.__dict__, "log": log})).released] == list(
        range(3, 11)
    )
