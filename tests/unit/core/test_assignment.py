from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.assignment import assign
from sidecar.core.generations import PartitionMode

RW, RO, REMOVED = PartitionMode.READ_WRITE, PartitionMode.READ_ONLY, PartitionMode.REMOVED

modes_strategy = st.lists(st.sampled_from([RW, RO, REMOVED]), min_size=1, max_size=24)


@given(st.integers(1, 6), modes_strategy)
def test_each_kind_is_balanced_and_removed_partitions_are_left_out(
    member_count: int, modes: list[PartitionMode]
) -> None:
    members = {f"m{i}": frozenset({"t"}) for i in range(member_count)}
    result = assign(members, {"t": len(modes)}, lambda topic: modes)
    assigned = [p for pairs in result.values() for _, p in pairs]
    assert sorted(assigned) == [p for p, mode in enumerate(modes) if mode is not REMOVED]
    for kind in (RW, RO):
        per_member = [sum(1 for _, p in pairs if modes[p] is kind) for pairs in result.values()]
        assert max(per_member) - min(per_member) <= 1


def test_draining_partitions_do_not_all_go_to_one_member() -> None:
    modes: Sequence[PartitionMode] = [RW, RW, RO, RO]
    result = assign({"a": frozenset({"t"}), "b": frozenset({"t"})}, {"t": 4}, lambda topic: modes)
    assert result == {"a": [("t", 0), ("t", 2)], "b": [("t", 1), ("t", 3)]}


def test_unmanaged_topics_and_unsubscribed_members() -> None:
    result = assign(
        {"a": frozenset({"x"}), "b": frozenset({"x", "y"})},
        {"x": 2, "y": 2, "z": 5},
        lambda topic: None,
    )
    assert {pair for pairs in result.values() for pair in pairs} == {
        ("x", 0),
        ("x", 1),
        ("y", 0),
        ("y", 1),
    }
    assert all(topic == "x" for topic, _ in result["a"])


def test_partitions_newer_than_the_modes_are_assigned_as_read_write() -> None:
    result = assign({"a": frozenset({"t"})}, {"t": 3}, lambda topic: [RW, REMOVED])
    assert result == {"a": [("t", 0), ("t", 2)]}
