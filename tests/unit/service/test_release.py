"""Releasing records through the gate (``sidecar.service.release``), with fakes of the
adapters and of the sidecar around the instance: no cluster.

The release path does what the core's step (``sidecar.core.release``) decides, and asks
again with what it reads after each await; these tests drive it whole, with a
ZooKeeper that is away, or read just as a rebalance begins to take the partition.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sidecar.core.consume import ConsumedRecord, TopicPartition
from sidecar.core.errors import MetadataUnavailable
from sidecar.core.positions import Fetch
from sidecar.service.consume_state import ConsumeState
from sidecar.service.handoff import HandoffTeller
from sidecar.service.release import PollResult, Release
from sidecar.service.waits import GateWaits
from tests.unit.service import fakes

TP0 = TopicPartition("t", 0)


class _Store(fakes.Store):
    """The group's records in ZooKeeper: away, or read just as a rebalance begins."""

    def __init__(self) -> None:
        super().__init__()
        self.away = False
        self.during_read: Callable[[], object] | None = None

    async def acknowledged_revocations(self, group: str, topic: str) -> set[tuple[int, int]]:
        if self.during_read is not None:
            self.during_read()
        if self.away:
            raise MetadataUnavailable()
        return await super().acknowledged_revocations(group, topic)


def _release(boundary: int, *, first: int, last: int) -> tuple[Release, fakes.Context, _Store]:
    """A release of an instance in events mode (no callback URL) that reads partition 0
    of a topic whose keys moved from partition 0 to 1 at ``boundary`` (generation 1),
    with ``first``..``last`` buffered (none if ``last < first``) and everything below
    ``first`` delivered."""
    store = _Store()
    context = fakes.Context(store=store)
    context.registry = fakes.Registry(fakes.runtime("t", fakes.expanded_log(boundary)))
    state = ConsumeState("g", "new-owner")
    state.positions.follow([TP0], 1)
    batch: list[ConsumedRecord] = list(fakes.records("t", 0, first, last))
    state.positions.take(Fetch(1, state.positions.seek_epoch, {TP0: batch}, {TP0: last + 1}))
    metrics: Any = context.metrics
    group_store: Any = store
    teller = HandoffTeller(state, group_store, None)
    waits = GateWaits("g", "s-new-owner", group_store, metrics)
    return Release(state, context.build(), teller, waits), context, store


def _told(result: PollResult) -> list[tuple[str, int, int]]:
    return [(e.kind.value, e.partition, e.generation) for e in result.events]


async def test_a_new_owner_does_not_tell_what_the_group_acknowledged() -> None:
    # The partition's previous owner got keys_revoked acknowledged; the new owner
    # delivers past the boundary with a ledger that has not read the group since.
    release, context, store = _release(20, first=20, last=25)
    store.acknowledged.append(("g", "t", 0, 1))
    result = await release.release(None)
    assert [r.offset for r in result.records] == list(range(20, 26))
    assert result.events == []
    assert context.offsets.reads == 1  # the group's progress, read once


async def test_nothing_is_told_while_the_group_cannot_be_read() -> None:
    release, _, store = _release(20, first=20, last=25)
    store.away = True
    with pytest.raises(MetadataUnavailable):
        await release.release(None)
    assert release.teller.told_revocations() == []
    # Once it answers (and nobody acknowledged it), the new owner tells it.
    store.away = False
    result = await release.release(None)
    assert result.records == []
    assert [e.kind.value for e in result.events] == ["keys_revoked"]


async def test_a_partition_a_rebalance_takes_during_the_read_is_not_told_before_delivery() -> None:
    # The rebalance waits only for what was told before it began; an event told now
    # would reach the app as the partition's next owner tells its own.
    release, _, store = _release(20, first=20, last=25)
    store.during_read = lambda: release.state.revoking.add(TP0)
    result = await release.release(None)
    assert result.records == []
    assert result.events == []
    assert release.teller.told_revocations() == []


async def test_a_partition_a_rebalance_takes_during_the_read_is_not_told_when_due() -> None:
    # The caught-up case: everything before the boundary delivered, nothing after.
    release, context, store = _release(5, first=5, last=4)
    store.during_read = lambda: release.state.revoking.add(TP0)
    result = await release.release(None)
    assert context.offsets.reads == 1
    assert result.events == []
    assert release.teller.told_revocations() == []
    # Without the rebalance, the same read tells it.
    release.state.revoking.discard(TP0)
    store.during_read = None
    told = await release.release(None)
    assert _told(told) == [("keys_revoked", 0, 1)]


async def test_a_partition_a_rebalance_takes_during_the_gate_read_is_not_told_assigned() -> None:
    # Partition 1 took keys of partition 0 at 5 and the group consumed and acknowledged
    # them: its gate is open, but a rebalance begins while the release reads that. The
    # partition's next owner tells its app keys_assigned; this one tells nothing more.
    store = _Store()
    context = fakes.Context(store=store)
    context.registry = fakes.Registry(fakes.runtime("t", fakes.expanded_log(5)))
    context.offsets.committed[("g", "t")] = {0: 5}
    store.acknowledged.append(("g", "t", 0, 1))
    tp1 = TopicPartition("t", 1)
    state = ConsumeState("g", "i")
    state.positions.follow([tp1], 1)
    batch: list[ConsumedRecord] = list(fakes.records("t", 1, 0, 1))
    state.positions.take(Fetch(1, state.positions.seek_epoch, {tp1: batch}, {tp1: 2}))
    group_store: Any = store
    metrics: Any = context.metrics
    teller = HandoffTeller(state, group_store, None)
    release = Release(state, context.build(), teller, GateWaits("g", "s-i", group_store, metrics))
    store.during_read = lambda: state.revoking.add(tp1)
    result = await release.release(None)
    assert (result.records, result.events) == ([], [])
    assert state.ledger.pending == {}
    # Without the rebalance, the same gate tells it.
    state.revoking.discard(tp1)
    store.during_read = None
    told = await release.release(None)
    assert _told(told) == [("keys_assigned", 1, 1)]
