"""The chaos run's schedule, expectations and checks (``ordered_dev.harness.chaos``), on
hand-made histories: each check must find the failure it exists for, and pass a clean
history, or the chaos run could not fail."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordered_dev.harness.chaos.checks import (
    CheckResult,
    RunTimes,
    StoredRecord,
    TopicSnapshot,
    check_barrier,
    check_changes,
    check_compaction,
    check_generation_log,
    check_handoff,
    check_liveness,
    check_order,
    check_stale,
)
from ordered_dev.harness.chaos.expectations import LogWaits
from ordered_dev.harness.chaos.history import (
    Acked,
    ChangeRecord,
    FaultRecord,
    History,
    Incarnation,
    KeptLog,
    LockSighting,
)
from ordered_dev.harness.chaos.plan import ALL_FAULTS, ChaosConfig, Plan
from sidecar.core.compaction import compact
from sidecar.core.gate import waits_into
from sidecar.core.generations import Boundary, Generation, GenerationLog, PartitionMode
from sidecar.core.handoff import revocation_points
from sidecar.core.placement import RELOCATION_HEADER, HeaderFormat, sidecar_headers
from sidecar.core.routing import partition_for_key

TOPIC = "t"
GROUP = "g"


# The plan --------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_schedule() -> None:
    config = ChaosConfig(seed=7, load_s=60.0)
    first, again, other = Plan(config), Plan(config), Plan(ChaosConfig(seed=8, load_s=60.0))
    take = 40
    assert list(itertools.islice(first.changes(), take)) == list(
        itertools.islice(again.changes(), take)
    )
    assert list(itertools.islice(first.faults(), take)) == list(
        itertools.islice(again.faults(), take)
    )
    assert list(itertools.islice(first.changes(), take)) != list(
        itertools.islice(other.changes(), take)
    )


def test_rounds_have_every_fault_kind_once_and_targets_in_range() -> None:
    config = ChaosConfig(seed=3, fault_rounds=2)
    faults = list(Plan(config).faults())
    assert len(faults) == 2 * len(ALL_FAULTS)
    assert sorted(f.kind for f in faults[: len(ALL_FAULTS)]) == sorted(ALL_FAULTS)
    for change in itertools.islice(Plan(config).changes(), 200):
        assert config.initial_count <= change.target <= config.largest_count
    pause = next(f for f in faults if f.kind == "sidecar_pause")
    assert pause.duration_s > config.session_timeout_s


# Expectations ----------------------------------------------------------------------------


@st.composite
def logs(draw: st.DrawFn) -> GenerationLog:
    initial = draw(st.integers(1, 3))
    log = GenerationLog.start(initial)
    counts = draw(st.lists(st.integers(initial, 3 * initial + 4), min_size=1, max_size=8))
    offsets: list[int] = [0] * initial
    for count in counts:
        if count == log.current.undeleted_count:
            continue
        physical = max(count, log.current.physical_count)
        offsets += [0] * (physical - len(offsets))
        offsets = [o + draw(st.integers(0, 3)) for o in offsets]
        log = log.append(log.next_generation(count, [Boundary(o) for o in offsets]))
    return log


@given(logs())
def test_change_sources_name_the_sources_of_waits_into(log: GenerationLog) -> None:
    waits = LogWaits(log)
    for generation in log.generations:
        for partition in range(generation.physical_count):
            assert waits.agrees_with_waits_into(partition, generation.number)
            assert waits.is_gated(partition, generation.number) == bool(
                waits_into(log, partition, generation.number)
            )


@given(logs())
def test_every_revocation_point_is_due_with_its_destinations(log: GenerationLog) -> None:
    due = {(d.partition, d.change): d for d in LogWaits(log).revocations_due()}
    for partition in range(log.current.physical_count):
        for point in revocation_points(log, partition):
            if point.boundary > 0:
                assert due[(partition, point.generation)].destinations


# Hand-made histories -----------------------------------------------------------------------


def expanded_log() -> GenerationLog:
    """N=1; generation 1 splits partition 0 at offset 10 into 0 and 1."""
    log = GenerationLog.start(1)
    return log.append(log.next_generation(2, [Boundary(10), Boundary(0)]))


def snapshot(
    log: GenerationLog,
    records: list[StoredRecord] | None = None,
    *,
    starts: list[int] | None = None,
    stored_log: GenerationLog | None = None,
) -> TopicSnapshot:
    """The topic at the end: ``log`` the full log, ``stored_log`` the sidecars' (folded)
    one, ``starts`` the log start offsets (0 everywhere by default)."""
    partitions = log.current.physical_count
    return TopicSnapshot(
        TOPIC,
        False,
        log,
        (PartitionMode.READ_WRITE,) * partitions,
        dict(enumerate(starts or [0] * partitions)),
        {},
        records or [],
        stored_log=stored_log,
    )


class Script:
    """Builds a history: instance ``a`` owns partition 0, ``b`` partition 1."""

    def __init__(self) -> None:
        self.history = History(groups=(GROUP,))
        self.a = self.instance("a")
        self.b = self.instance("b")
        self.sequence = itertools.count()

    def instance(self, name: str) -> Incarnation:
        incarnation = self.history.new_incarnation(GROUP, name, f"sidecar-{name}")
        return incarnation

    def ack(self, key: str, sequence: int, partition: int, offset: int, generation: int) -> None:
        self.history.ack(Acked((0, key, sequence), TOPIC, partition, offset, generation, "s", 0.0))

    def deliver(
        self, who: Incarnation, key: str, sequence: int, partition: int, offset: int
    ) -> None:
        self.history.deliver(who, TOPIC, partition, offset, (0, key, sequence), None)

    def told(
        self, who: Incarnation, kind: str, partition: int, generation: int, at: float | None = None
    ) -> None:
        received = None if at is None else (self.history.next_order(), at)
        self.history.handoff(who, kind, TOPIC, partition, generation, "callback", received)

    def fault(self, kind: str, target: str, started: float, ended: float, detail: str) -> None:
        self.history.faults.append(FaultRecord(kind, target, started, ended, detail))

    def before_and_after_the_split(self) -> None:
        """Key k: seq 0 at 0@9 (generation 0), seq 1 at 1@0 (generation 1)."""
        self.ack("k", 0, 0, 9, 0)
        self.ack("k", 1, 1, 0, 1)


def handoff(script: Script, log: GenerationLog | None = None) -> CheckResult:
    return check_handoff(script.history, [snapshot(log or expanded_log())])


def test_handoff_passes_a_correct_hand_off() -> None:
    script = Script()
    script.before_and_after_the_split()
    script.deliver(script.a, "k", 0, 0, 9)
    script.told(script.a, "keys_revoked", 0, 1)
    script.told(script.b, "keys_assigned", 1, 1)
    script.deliver(script.b, "k", 1, 1, 0)
    result = handoff(script)
    assert result.passed, result.violations


def test_handoff_finds_a_missing_keys_revoked() -> None:
    """The caught-up group: q was consumed to its boundary, keys_revoked never came."""
    script = Script()
    script.before_and_after_the_split()
    script.deliver(script.a, "k", 0, 0, 9)
    script.told(script.b, "keys_assigned", 1, 1)
    script.deliver(script.b, "k", 1, 1, 0)
    (violation,) = handoff(script).violations
    assert "no keys_revoked(t[0], change 1)" in violation


def test_handoff_finds_keys_revoked_after_the_gated_record() -> None:
    script = Script()
    script.before_and_after_the_split()
    script.deliver(script.a, "k", 0, 0, 9)
    script.history.committed(GROUP, TOPIC, 0, 10)
    script.told(script.b, "keys_assigned", 1, 1)
    script.deliver(script.b, "k", 1, 1, 0)
    script.told(script.a, "keys_revoked", 0, 1)
    (violation,) = handoff(script).violations
    assert "came late" in violation
    assert "the group's commit of 0 was seen at 10" in violation


def test_handoff_finds_a_repeat_after_the_group_committed_past_the_boundary() -> None:
    script = Script()
    script.before_and_after_the_split()
    script.deliver(script.a, "k", 0, 0, 9)
    script.told(script.a, "keys_revoked", 0, 1)
    script.history.committed(GROUP, TOPIC, 0, 10)
    script.told(script.b, "keys_assigned", 1, 1)
    script.deliver(script.b, "k", 1, 1, 0)
    script.told(script.b, "keys_revoked", 0, 1)
    (violation,) = handoff(script).violations
    assert "told again to b" in violation


def test_handoff_allows_a_repeat_to_a_new_owner_before_the_commit() -> None:
    """The owner was told, then lost the partition before its commit crossed the
    boundary: the new owner is told again."""
    script = Script()
    script.before_and_after_the_split()
    script.deliver(script.a, "k", 0, 0, 9)
    script.told(script.a, "keys_revoked", 0, 1)
    script.history.committed(GROUP, TOPIC, 0, 9)
    script.told(script.b, "keys_revoked", 0, 1)
    script.history.committed(GROUP, TOPIC, 0, 10)
    script.told(script.b, "keys_assigned", 1, 1)
    script.deliver(script.b, "k", 1, 1, 0)
    result = handoff(script)
    assert result.passed, result.violations
    assert any("told again" in note for note in result.notes)


def _repeat_after_the_commit(script: Script, fault: tuple[str, str, float, float, str]) -> None:
    """a is told at 10 s and the group commits past the boundary; ``fault`` happens;
    b is told again at 20 s."""
    script.before_and_after_the_split()
    script.deliver(script.a, "k", 0, 0, 9)
    script.told(script.a, "keys_revoked", 0, 1, at=10.0)
    script.history.committed(GROUP, TOPIC, 0, 10)
    script.fault(*fault)
    script.told(script.b, "keys_revoked", 0, 1, at=20.0)
    script.told(script.b, "keys_assigned", 1, 1, at=20.5)
    script.deliver(script.b, "k", 1, 1, 0)


@pytest.mark.parametrize(
    "fault",
    [
        # the first teller's sidecar died before it recorded its app's answer
        ("sidecar_kill", "sidecar 0", 10.0, 12.0, "sidecar-a killed, sidecar-a2 started"),
        # ZooKeeper was away when it tried, past the rebalance's wait
        ("zookeeper_pause", "zookeeper", 9.5, 19.5, "paused 10.0 s"),
        # the repeat was computed before its own sidecar was paused, and arrived after
        ("sidecar_pause", "sidecar 1", 5.0, 19.8, "sidecar-b paused 14.8 s"),
    ],
)
def test_handoff_excuses_a_repeat_whose_first_answer_a_fault_kept_from_zookeeper(
    fault: tuple[str, str, float, float, str],
) -> None:
    script = Script()
    _repeat_after_the_commit(script, fault)
    result = handoff(script)
    assert result.passed, result.violations
    assert any(f"lost to {fault[0]}" in note for note in result.notes)


@pytest.mark.parametrize(
    "fault",
    [
        ("sidecar_kill", "sidecar 2", 10.0, 12.0, "sidecar-c killed, sidecar-c2 started"),
        ("zookeeper_pause", "zookeeper", 2.0, 8.0, "paused 6.0 s"),  # over before a was told
        ("consumer_recreate", f"{GROUP}/a", 11.0, 11.5, "a.1 deleted, a.3 created"),
    ],
)
def test_handoff_finds_a_repeat_no_fault_explains(
    fault: tuple[str, str, float, float, str],
) -> None:
    script = Script()
    _repeat_after_the_commit(script, fault)
    (violation,) = handoff(script).violations
    assert "told again to b" in violation


def test_handoff_finds_keys_revoked_told_twice_to_one_instance() -> None:
    script = Script()
    script.before_and_after_the_split()
    script.deliver(script.a, "k", 0, 0, 9)
    script.told(script.a, "keys_revoked", 0, 1)
    script.told(script.a, "keys_revoked", 0, 1)
    script.told(script.b, "keys_assigned", 1, 1)
    script.deliver(script.b, "k", 1, 1, 0)
    (violation,) = handoff(script).violations
    assert "told twice to a" in violation


def test_handoff_finds_a_missing_keys_assigned() -> None:
    script = Script()
    script.before_and_after_the_split()
    script.deliver(script.a, "k", 0, 0, 9)
    script.told(script.a, "keys_revoked", 0, 1)
    script.told(script.a, "keys_assigned", 1, 1)  # to another instance than b
    script.deliver(script.b, "k", 1, 1, 0)
    (violation,) = handoff(script).violations
    assert "without keys_assigned(1, 1)" in violation


def test_handoff_exempts_a_partition_removed_unconsumed() -> None:
    script = Script()
    log = expanded_log()
    gone = snapshot(log)
    gone.log_start[0] = 10  # truncated below the boundary, never delivered
    script.told(script.b, "keys_assigned", 1, 1)
    script.deliver(script.b, "k", 1, 1, 0)
    result = check_handoff(script.history, [gone])
    assert result.passed, result.violations


def test_order_finds_a_key_delivered_out_of_order_and_counts_duplicates() -> None:
    script = Script()
    script.before_and_after_the_split()
    script.deliver(script.b, "k", 1, 1, 0)
    script.deliver(script.a, "k", 0, 0, 9)
    (violation,) = check_order(script.history).violations
    assert "seq 1" in violation
    assert "before acknowledged seq 0" in violation

    clean = Script()
    clean.before_and_after_the_split()
    for _ in range(2):
        clean.deliver(clean.a, "k", 0, 0, 9)
        clean.deliver(clean.b, "k", 1, 1, 0)
    result = check_order(clean.history)
    assert result.passed
    assert ("g: deliveries / duplicates", "4 / 2") in result.facts


def test_liveness_finds_undelivered_and_late_records() -> None:
    script = Script()
    script.before_and_after_the_split()
    script.deliver(script.a, "k", 0, 0, 9)
    result = check_liveness(script.history, RunTimes(0.0, 0.0, {GROUP: "b assigned nothing"}), 30.0)
    (violation,) = result.violations
    assert "1 acknowledged records never delivered" in violation
    assert "t[1]@0" in violation

    late = Script()
    late.before_and_after_the_split()
    late.deliver(late.a, "k", 0, 0, 9)
    late.deliver(late.b, "k", 1, 1, 0)
    assert check_liveness(late.history, RunTimes(-100.0, -100.0), 30.0).violations
    assert check_liveness(late.history, RunTimes(0.0, 0.0), 30.0).passed


def stored(
    partition: int,
    offset: int,
    generation: int,
    key: str = "k",
    value: object | None = None,
    relocation: bool = False,
    header_format: HeaderFormat = HeaderFormat.STAMP,
) -> StoredRecord:
    # generation + 1 partitions: the counts of expanded_log's generations.
    headers: dict[str, bytes | None] = dict(
        sidecar_headers(generation, generation + 1, "sc-test", offset, header_format)
    )
    if relocation:
        headers[RELOCATION_HEADER] = b"1"
    return StoredRecord(
        partition,
        offset,
        key.encode(),
        None if value is None else json.dumps(value).encode(),
        headers,
        0,
    )


@pytest.mark.parametrize("header_format", list(HeaderFormat))
def test_barrier_finds_a_zombie_write_and_a_lost_record(header_format: HeaderFormat) -> None:
    log = expanded_log()
    script = Script()
    script.ack("x", 0, 0, 12, 1)  # never stored: lost
    zombie = stored(
        0, 11, 0, value={"producer": 0, "key": "z", "seq": 0}, header_format=header_format
    )
    result = check_barrier(script.history, [snapshot(log, [zombie])])
    assert len(result.violations) == 2
    assert "written across a barrier" in result.violations[0]
    assert "from sc-test sequence 11" in result.violations[0]
    assert "is not readable" in result.violations[1]


def test_barrier_finds_a_record_without_the_stamp() -> None:
    record = stored(0, 3, 0, value={"producer": 0, "key": "k", "seq": 0})
    unstamped = StoredRecord(record.partition, record.offset, record.key, record.value, {}, 0)
    result = check_barrier(Script().history, [snapshot(expanded_log(), [unstamped])])
    assert result.violations == [f"{TOPIC}[0]@3: no stamp of the sidecar"]


def test_barrier_finds_an_acknowledgement_across_a_barrier() -> None:
    log = expanded_log()
    script = Script()
    key = next(f"k{i}" for i in itertools.count() if partition_for_key(f"k{i}".encode(), 1, 2) == 0)
    script.ack(key, 0, 0, 10, 0)  # acknowledged as generation 0 at an offset of generation 1
    record = stored(0, 10, 1, key=key, value={"producer": 0, "key": key, "seq": 0})
    (violation,) = check_barrier(script.history, [snapshot(log, [record])]).violations
    assert "as generation 0, but the offset lies in generation 1" in violation


def compacted(records: list[StoredRecord], cleaned: int = 0) -> TopicSnapshot:
    result = snapshot(expanded_log(), records)
    result.compacted = True
    result.cleaned_up_to = {0: cleaned, 1: cleaned}
    return result


def test_compaction_passes_a_superseded_value_with_its_tombstone_awaiting_compaction() -> None:
    old = stored(0, 5, 0, value={"producer": 0, "key": "k", "seq": 0})
    new = stored(1, 0, 1, value={"producer": 0, "key": "k", "seq": 1})
    tombstone = stored(0, 10, 1, relocation=True)
    result = check_compaction(compacted([old, tombstone, new]))
    assert result.passed, result.violations


def test_compaction_finds_a_superseded_value_without_a_tombstone() -> None:
    old = stored(0, 5, 0, value={"producer": 0, "key": "k", "seq": 0})
    new = stored(1, 0, 1, value={"producer": 0, "key": "k", "seq": 1})
    (violation,) = check_compaction(compacted([old, new])).violations
    assert "no relocation tombstone follows it" in violation


def test_compaction_finds_a_value_the_cleaner_should_have_dropped() -> None:
    old = stored(0, 5, 0, value={"producer": 0, "key": "k", "seq": 0})
    new = stored(1, 0, 1, value={"producer": 0, "key": "k", "seq": 1})
    tombstone = stored(0, 10, 1, relocation=True)
    (violation,) = check_compaction(compacted([old, tombstone, new], cleaned=11)).violations
    assert "still readable although the cleaner compacted" in violation


def test_compaction_finds_a_superseded_value_the_gate_does_not_order_first() -> None:
    """Written to partition 0 at offset 12, past the boundary (10) the newer record in
    partition 1 waits for: a fresh consumer may deliver it after the newer value."""
    old = stored(0, 12, 1, value={"producer": 0, "key": "k", "seq": 0})
    new = stored(1, 0, 1, value={"producer": 0, "key": "k", "seq": 1})
    tombstone = stored(0, 13, 1, relocation=True)
    (violation,) = check_compaction(compacted([old, tombstone, new])).violations
    assert "which does not wait for it" in violation


def test_stale_finds_an_accepted_stale_produce_and_a_run_without_probes() -> None:
    history = History(groups=(GROUP,))
    assert check_stale(history, []).violations == [
        "no stale produce was fenced (none sent, or none refused)"
    ]
    history.stale_probes["fenced"] += 3
    assert check_stale(history, []).passed
    written = stored(0, 1, 0, key="stale-1", value={"stale": 1})
    history.stale_accepted.append("t: expected_generation 0")
    assert len(check_stale(history, [snapshot(expanded_log(), [written])]).violations) == 2


def test_changes_finds_a_leaked_lock_and_a_blocked_final_change() -> None:
    history = History(groups=(GROUP,))
    history.changes.append(ChangeRecord(0.0, TOPIC, "s", "http", 2, 3, "done", 1.0, final=True))
    history.locks["/r/locks/t/x"] = LockSighting(TOPIC, "x", "s", 10.0, 30.0, "done")
    assert check_changes(history, 60.0).passed
    history.locks["/r/locks/t/y"] = LockSighting(TOPIC, "y", "s", 10.0, 200.0, "done")
    history.changes.append(
        ChangeRecord(0.0, TOPIC, "s", "http", 3, 4, "409 40920", 60.0, final=True)
    )
    violations = check_changes(history, 60.0).violations
    assert len(violations) == 2
    assert "409 40920" in violations[0]
    assert "held for 190 s" in violations[1]


def test_changes_finds_a_change_answered_rolled_back_that_was_done() -> None:
    history = History(groups=(GROUP,))
    history.changes.append(
        ChangeRecord(0.0, TOPIC, "s", "http", 2, 5, "rolled_back", 20.0, count_after=2)
    )
    history.changes.append(ChangeRecord(0.0, TOPIC, "s", "http", 2, 3, "done", 1.0, final=True))
    assert check_changes(history, 60.0).passed
    history.changes.append(
        ChangeRecord(0.0, TOPIC, "s", "http", 2, 5, "rolled_back", 20.0, count_after=5)
    )
    (violation,) = check_changes(history, 60.0).violations
    assert "answered 409 40930" in violation


# The generation log under compaction ------------------------------------------------------


def three_changes() -> GenerationLog:
    """N=1: 1 -> 2 -> 3 -> 2 partitions, boundaries growing."""
    log = GenerationLog.start(1)
    log = log.append(log.next_generation(2, [Boundary(10), Boundary(0)]))
    log = log.append(log.next_generation(3, [Boundary(20), Boundary(5), Boundary(0)]))
    return log.append(log.next_generation(2, [Boundary(30), Boundary(9), Boundary(4)]))


def kept_history(*seen: GenerationLog) -> History:
    history = History(groups=(GROUP,))
    kept = history.kept_logs[TOPIC] = KeptLog(seen[0].initial_count)
    for at, log in enumerate(seen):
        kept.add(log, float(at))
    return history


def test_kept_log_rebuilds_the_full_log_from_logs_folded_over_time() -> None:
    full = three_changes()
    early = GenerationLog(full.initial_count, full.generations[:2])
    history = kept_history(early, compact(full, 2), compact(full, 3))
    kept = history.kept_logs[TOPIC]
    assert kept.full() == full
    assert (kept.first_kept, kept.longest, kept.disagreements) == (3, 2, [])


def test_kept_log_names_a_generation_folded_before_it_was_seen() -> None:
    full = three_changes()
    history = kept_history(
        GenerationLog(full.initial_count, full.generations[:2]), compact(full, 3)
    )
    assert history.kept_logs[TOPIC].missing() == [2]
    with pytest.raises(ValueError, match=r"\[2\]"):
        history.kept_logs[TOPIC].full()
    result = check_generation_log(
        history, snapshot(full, starts=[30, 9, 4], stored_log=compact(full, 3))
    )
    (violation,) = result.violations
    assert "never saw generations [2]" in violation


def test_generation_log_check_passes_a_fold_of_what_is_gone() -> None:
    full = three_changes()
    history = kept_history(full, compact(full, 2))
    result = check_generation_log(
        history, snapshot(full, starts=[20, 5, 0], stored_log=compact(full, 2))
    )
    assert result.passed, result.violations


def test_generation_log_check_finds_a_fold_while_records_remain() -> None:
    full = three_changes()
    history = kept_history(full, compact(full, 2))
    result = check_generation_log(
        history, snapshot(full, starts=[20, 4, 0], stored_log=compact(full, 2))
    )
    (violation,) = result.violations
    assert "generation 2 became the first while records routed before it remain" in violation
    assert "1: boundary 5 > log start 4" in violation


def test_generation_log_check_finds_a_changed_generation_or_lost_waits() -> None:
    full = three_changes()
    other = GenerationLog(full.initial_count, (*full.generations[:3],)).append(
        Generation(3, 2, (Boundary(31), Boundary(9), Boundary(4)))
    )
    history = kept_history(full, other)
    assert "generation 3 read as" in history.kept_logs[TOPIC].disagreements[0]
    no_waits = GenerationLog(full.initial_count, compact(full, 2).generations)
    result = check_generation_log(
        kept_history(full), snapshot(full, starts=[30, 9, 4], stored_log=no_waits)
    )
    (violation,) = result.violations
    assert "is not the full log folded there" in violation
