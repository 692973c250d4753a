"""Partition assignment for a consumer group (KIP-253 §6). Pure.

Read-write and read-only partitions are balanced separately: first every member gets
its share of read-write partitions, then, continuing from where that left off, its
share of read-only ones. So a member never ends up with all the draining partitions
and none of the live traffic, and counts per kind differ by at most one between
members subscribed to the same topics. Removed partitions are not assigned at all:
nothing can be read from them.

Unmanaged topics have every partition read-write. The split by mode is applied at each
rebalance. Kafka's consumers rebalance when a topic's partition count changes; a change
of which partitions are assignable (a retirement, a removed partition brought back by an
expansion) does not change the count, so the sidecar asks every ordered group of the
topic to rebalance then (``TopicRegistry.on_assignable_change``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from sidecar.core.generations import PartitionMode

TopicPartitionPair = tuple[str, int]


def assign(
    subscriptions: Mapping[str, frozenset[str]],
    partition_counts: Mapping[str, int],
    modes_of: Callable[[str], Sequence[PartitionMode] | None],
) -> dict[str, list[TopicPartitionPair]]:
    """``{member: [(topic, partition), ...]}`` for every member, sorted.

    ``subscriptions``: each member's subscribed topics. ``partition_counts``: each
    topic's physical partition count (topics without metadata are left out).
    ``modes_of(topic)``: a managed topic's partition modes, None if unmanaged.
    Deterministic: the same input gives the same assignment on every group leader.
    """
    members = sorted(subscriptions)
    result: dict[str, list[TopicPartitionPair]] = {member: [] for member in members}
    by_kind: dict[PartitionMode, list[TopicPartitionPair]] = {
        PartitionMode.READ_WRITE: [],
        PartitionMode.READ_ONLY: [],
    }
    for topic in sorted({t for topics in subscriptions.values() for t in topics}):
        count = partition_counts.get(topic)
        if count is None:
            continue
        modes = modes_of(topic)
        for partition in range(count):
            mode = PartitionMode.READ_WRITE
            if modes is not None and partition < len(modes):
                # A partition newer than the modes this member knows is assigned like a
                # read-write one: partition additions trigger a rebalance, a commit does
                # not, so it must not be left out. Its records wait at the gate until
                # the owner's sidecar has read the generation that routes to it.
                mode = modes[partition]
            if mode is not PartitionMode.REMOVED:
                by_kind[mode].append((topic, partition))
    turn = 0
    for kind in (PartitionMode.READ_WRITE, PartitionMode.READ_ONLY):
        for pair in by_kind[kind]:
            # Round robin over the members subscribed to the pair's topic.
            for _ in range(len(members)):
                member = members[turn % len(members)]
                turn += 1
                if pair[0] in subscriptions[member]:
                    result[member].append(pair)
                    break
    return {member: sorted(pairs) for member, pairs in result.items()}
