from __future__ import annotations

from sidecar.core.generations import Boundary, GenerationLog
from sidecar.core.handoff import Revocation, is_gated, revocations_crossed


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
