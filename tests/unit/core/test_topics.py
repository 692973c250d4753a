"""Which pending barrier a change owns (``orphaned_barrier``)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.procedures import FINAL_PHASES, Operation, OperationKind, Phase, SidecarId
from sidecar.core.topics import PendingBarrier, orphaned_barrier

_JOURNAL = Operation(
    topic="orders",
    kind=OperationKind.EXPAND,
    from_generation=4,
    from_count=3,
    target_count=5,
    phase=Phase.BARRIER,
    coordinator=SidecarId("a"),
    started_at=0.0,
    barrier_deadline=20.0,
    physical_count=5,
)
_PENDING = st.builds(PendingBarrier, st.integers(1, 8), st.integers(1, 8))


@given(phase=st.sampled_from(Phase), generation=st.integers(0, 7), target=st.integers(1, 8))
def test_an_unfinished_change_owns_exactly_its_own_barrier(
    phase: Phase, generation: int, target: int
) -> None:
    journal = replace(_JOURNAL, phase=phase, from_generation=generation, target_count=target)
    own = PendingBarrier(generation + 1, target)
    if phase in FINAL_PHASES:
        assert orphaned_barrier(own, journal) == own.generation
    else:
        assert orphaned_barrier(own, journal) is None


@given(pending=_PENDING, phase=st.sampled_from(Phase))
def test_any_other_barrier_is_orphaned(pending: PendingBarrier, phase: Phase) -> None:
    journal = replace(_JOURNAL, phase=phase)
    own = PendingBarrier(journal.pending_generation, journal.target_count)
    expected = None if pending == own and phase not in FINAL_PHASES else pending.generation
    assert orphaned_barrier(pending, journal) == expected
    # Without a journal nobody can own it; without a barrier there is nothing to withdraw.
    assert orphaned_barrier(pending, None) == pending.generation
    assert orphaned_barrier(None, journal) is None
