from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.errors import BadRequest
from sidecar.core.generations import Boundary, GenerationLog
from sidecar.core.handoff import (
    HandoffKind,
    HandoffLedger,
    Revocation,
    is_gated,
    revocation_points,
    revocations_crossed,
    revoked_through,
)


def _log() -> GenerationLog:
    # N=2: expand 2 -> 3 (partition 0's keys partly move to 2), then shrink 3 -> 2.
    log = GenerationLog.start(2)
    log = log.append(log.next_generation(3, [Boundary(10), Boundary(7), Boundary(0)]))
    return log.append(log.next_generation(2, [Boundary(12), Boundary(9), Boundary(4)]))


def test_a_commit_crosses_the_revocations_of_the_changes_that_moved_keys_away() -> None:
    log = _log()
    assert revocations_crossed(log, 0, 0, 9) == []
    assert revocations_crossed(log, 0, 0, 10) == [Revocation(0, 1, 10)]
    assert revocations_crossed(log, 0, 10, 12) == []  # 0 keeps its keys in the shrink
    assert revocations_crossed(log, 1, 0, 100) == []  # 1 never loses keys here
    assert revocations_crossed(log, 2, 0, 4) == [Revocation(2, 2, 4)]
    assert revocations_crossed(log, 2, 4, 100) == []


def test_records_that_wait_are_gated() -> None:
    log = _log()
    assert not is_gated(log, 0, 0)
    assert is_gated(log, 2, 1)  # the new partition waits on 0
    assert is_gated(log, 0, 2)  # the shrink moved 2's keys back into 0
    assert not is_gated(log, 1, 2)


# The ledger ------------------------------------------------------------------------------

REVOKED, ASSIGNED = HandoffKind.KEYS_REVOKED, HandoffKind.KEYS_ASSIGNED


def test_an_event_is_told_under_one_id_until_acknowledged() -> None:
    ledger, first = HandoffLedger().tell(REVOKED, "t", 0, 1)
    assert first is not None
    ledger, again = ledger.tell(REVOKED, "t", 0, 1)
    assert again == first
    ledger, acknowledged = ledger.acknowledge([first.event_id])
    assert acknowledged == [first]
    assert ledger.tell(REVOKED, "t", 0, 1) == (ledger, None)
    assert ledger.revocations("t") == {(0, 1)}
    with pytest.raises(BadRequest):
        ledger.acknowledge([first.event_id])


def test_an_unknown_id_takes_nothing_of_the_acknowledgement() -> None:
    ledger, event = HandoffLedger().tell(ASSIGNED, "t", 2, 1)
    assert event is not None
    with pytest.raises(BadRequest, match="99"):
        ledger.acknowledge([event.event_id, 99])
    assert list(ledger.pending) == [event.event_id]


def test_a_revocation_the_group_acknowledged_elsewhere_is_not_told_here() -> None:
    ledger, event = HandoffLedger().tell(REVOKED, "t", 0, 1)
    assert event is not None
    ledger = ledger.with_group_revocations("t", {(0, 1)})
    assert ledger.pending == {}
    assert ledger.tell(REVOKED, "t", 0, 1)[1] is None


def test_a_rebalance_retires_revocations_that_stay_acknowledgeable() -> None:
    ledger, lost = HandoffLedger().tell(REVOKED, "t", 0, 1)
    ledger, kept = ledger.tell(REVOKED, "t", 1, 1)
    assert lost is not None
    assert kept is not None
    ledger = ledger.partitions_lost({("t", 0)})
    assert list(ledger.pending) == [kept.event_id]
    ledger, acknowledged = ledger.acknowledge([lost.event_id])
    assert acknowledged == [lost]
    assert ledger.revocations("t") == {(0, 1)}


def test_retired_events_are_bounded() -> None:
    ledger = HandoffLedger()
    for partition in range(HandoffLedger.RETIRED_KEPT + 5):
        ledger, _ = ledger.tell(REVOKED, "t", partition, 1)
        ledger = ledger.partitions_lost({("t", partition)})
    assert len(ledger.retired) == HandoffLedger.RETIRED_KEPT
    assert min(ledger.retired) == 6  # the oldest went first


subjects = st.tuples(st.sampled_from([REVOKED, ASSIGNED]), st.integers(0, 3), st.integers(1, 3))


@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("tell"), subjects),
            st.tuples(st.just("ack"), st.integers(1, 12)),
            st.tuples(st.just("group"), st.tuples(st.integers(0, 3), st.integers(1, 3))),
            st.tuples(st.just("lost"), st.integers(0, 3)),
        ),
        max_size=40,
    )
)
def test_the_ledger_tells_each_hand_off_once(steps: list[tuple[str, Any]]) -> None:
    """Whatever the order: a hand-off acknowledged (here or for the group) is never told
    again, a pending one is told under one id, and nothing is pending and acknowledged."""
    ledger = HandoffLedger()
    for step, arg in steps:
        if step == "tell":
            kind, partition, generation = arg
            before = ledger
            ledger, event = ledger.tell(kind, "t", partition, generation)
            if before.acknowledged(kind, "t", partition, generation):
                assert event is None
            else:
                assert event is not None
                pending = {
                    (e.kind, e.partition, e.generation): i for i, e in before.pending.items()
                }
                # The pending event again, or a new one.
                expected = pending.get((kind, partition, generation), before.next_id)
                assert event.event_id == expected
        elif step == "ack":
            if arg in ledger.pending or arg in ledger.retired:
                ledger, events = ledger.acknowledge([arg])
                for event in events:
                    assert ledger.acknowledged(event.kind, "t", event.partition, event.generation)
            else:
                with pytest.raises(BadRequest):
                    ledger.acknowledge([arg])
        elif step == "group":
            ledger = ledger.with_group_revocations("t", {arg})
        else:
            ledger = ledger.partitions_lost({("t", arg)})
        for event in ledger.pending.values():
            assert not ledger.acknowledged(event.kind, "t", event.partition, event.generation)
        subjects_pending = [(e.kind, e.subject) for e in ledger.pending.values()]
        assert len(subjects_pending) == len(set(subjects_pending))
        assert not ledger.pending.keys() & ledger.retired.keys()


def test_a_compacted_log_has_the_revocations_of_the_changes_it_keeps() -> None:
    # N=1: 1 -> 2 (0 loses keys at 4), 2 -> 3 (0 loses keys at 8), then 3 -> 1 (1 and 2
    # lose keys at 6 and 2). Folded up to generation 2, only the shrink is left.
    full = GenerationLog.start(1)
    full = full.append(full.next_generation(2, [Boundary(4), Boundary(0)]))
    full = full.append(full.next_generation(3, [Boundary(8), Boundary(5), Boundary(0)]))
    folded = GenerationLog.after_fold(1, full[2], [])
    shrink = [Boundary(9), Boundary(6), Boundary(2)]
    full = full.append(full.next_generation(1, shrink))
    folded = folded.append(folded.next_generation(1, shrink))
    assert revocation_points(full, 0) == (Revocation(0, 1, 4), Revocation(0, 2, 8))
    assert revocation_points(folded, 0) == ()
    for partition in (1, 2):
        assert revocation_points(folded, partition) == revocation_points(full, partition)
    assert revocation_points(folded, 2) == (Revocation(2, 3, 2),)
    assert revoked_through(folded, set()) == {0: 3, 1: 2, 2: 2}
    assert revoked_through(full, set()) == {0: 0, 1: 2, 2: 2}
