"""Where a group begins a managed topic's partition it has no commit for."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.reading_start import from_log_start

POLICIES = st.sampled_from(["earliest", "latest", "none"])
PARTITIONS = st.sets(st.integers(0, 15))


def test_a_partition_an_expansion_made_begins_at_its_log_start() -> None:
    # The group committed in partitions 0-1; 2 and 3 came with the change.
    assert from_log_start("latest", [0, 1, 2, 3], {0, 1}) == [2, 3]
    assert from_log_start("none", [3, 1], {0, 1}) == [3]


def test_a_group_new_to_the_topic_is_placed_by_the_setting() -> None:
    assert from_log_start("latest", [0, 1, 2], set()) == []


def test_earliest_begins_there_already() -> None:
    assert from_log_start("earliest", [0, 1, 2, 3], {0, 1}) == []


@given(POLICIES, PARTITIONS, PARTITIONS)
def test_only_assigned_partitions_without_a_commit_move(
    policy: str, assigned: set[int], committed: set[int]
) -> None:
    moved = from_log_start(policy, assigned, committed)
    assert moved == sorted(set(moved))
    assert set(moved) <= assigned - committed
    if policy != "earliest" and committed:
        # Every one of them: none is left to a "latest" that would skip its records.
        assert set(moved) == assigned - committed
    else:
        assert moved == []
