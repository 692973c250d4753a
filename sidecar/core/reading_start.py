"""Where a consumer group begins a managed topic's partition it has no committed offset
for. Pure.

``auto.offset.reset`` places a group that is new to a topic: "latest" (REST Proxy's
default) begins every partition at its end, "earliest" at its log start, "none" fails.
A group that has committed offsets in the topic is already reading it, though. A
partition of it with no commit was made (or brought back) by a change after the group
began, or was never read long enough to commit anything: every record in it belongs to
what the group is reading. Begun at its end, the records written between the change's
commit and the rebalance that assigned it would be skipped (acknowledged, never
delivered; with Kafka alone the same happens to a group reading from "latest" when
partitions are added). So in a managed topic such a partition is read from its log
start, whatever the setting: at worst a partition the group never committed in is read
again from the start, at least once as every delivery is.

A group with no commit in the topic at all is new to it, and the setting places it.
That includes a group that has read the topic without committing yet (its first
auto-commit comes within ``auto.commit.interval``): a partition an expansion adds in that
window is placed by the setting too.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

EARLIEST = "earliest"


def from_log_start(
    auto_offset_reset: str, assigned: Iterable[int], committed: Collection[int]
) -> list[int]:
    """The partitions of ``assigned`` to begin at their log start instead of where
    ``auto_offset_reset`` would: those without a commit when the group has committed
    in the topic (``committed``: the partitions with a commit). None where the setting
    is "earliest" already, or the group has no commit in the topic."""
    if auto_offset_reset == EARLIEST or not committed:
        return []
    return sorted(p for p in set(assigned) if p not in committed)
