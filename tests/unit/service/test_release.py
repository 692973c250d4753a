"""Releasing records through the gate (``sidecar.service.release``), with fakes of the
adapters and of the sidecar around the instance: no cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from sidecar.core.consume import ConsumedRecord, TopicPartition
from sidecar.core.errors import MetadataUnavailable
from sidecar.core.handoff import Revocation
from sidecar.core.positions import Fetch
from sidecar.service.consume_state import ConsumeState
from sidecar.service.handoff import HandoffTeller
from sidecar.service.release import PollResult, Release
from sidecar.service.waits import GateWaits
from tests.unit.service import fakes


def _release(teller: HandoffTeller, context: Any) -> Release:
    metrics: Any = fakes.Metrics()
    instance_id = teller.state.instance_id
    waits = GateWaits("g", "s-" + instance_id, teller.store, metrics)
    return Release(teller.state, context, teller, waits)


class _Check:
    """The release loop's view of one partition: its revocation points, and the group's
    progress, whose reading refreshes the teller's record of the group's
    acknowledgements (as ``GroupProgressReads`` does)."""

    def __init__(
        self, teller: HandoffTeller, revocation: Revocation, group_acknowledged: bool
    ) -> None:
        self.tp = TopicPartition("t", revocation.partition)
        self.revocations = [revocation]
        self.first_revocation = revocation.boundary
        self.reads = 0
        self._teller = teller
        self._acknowledged = group_acknowledged
        self.zookeeper_away = False

    async def progress(self) -> None:
        self.reads += 1
        if self.zookeeper_away:
            raise MetadataUnavailable()
        if self._acknowledged:
            teller = self._teller
            teller.state.ledger = teller.state.ledger.with_group_revocations(
                "t", {(self.revocations[0].partition, self.revocations[0].generation)}
            )


def _events_release() -> Release:
    """A release of an instance in events mode (no callback URL)."""
    store: Any = fakes.Store()
    teller = HandoffTeller(ConsumeState("g", "new-owner"), store, None)
    unused: Any = SimpleNamespace()
    return _release(teller, unused)


async def test_a_new_owner_does_not_tell_what_the_group_acknowledged() -> None:
    # The partition's previous owner got keys_revoked acknowledged; the new owner
    # delivers past the boundary with a ledger that has not read the group since.
    release = _events_release()
    revocation = Revocation(partition=1, generation=4, boundary=20)
    check: Any = _Check(release.teller, revocation, group_acknowledged=True)
    events: list[Any] = []
    assert await release._revoked_before(check, 25, events)
    assert events == []
    assert check.reads == 1


async def test_nothing_is_told_while_the_group_cannot_be_read() -> None:
    release = _events_release()
    revocation = Revocation(partition=1, generation=4, boundary=20)
    check: Any = _Check(release.teller, revocation, group_acknowledged=False)
    check.zookeeper_away = True
    events: list[Any] = []
    with pytest.raises(MetadataUnavailable):
        await release._revoked_before(check, 25, events)
    assert events == []
    # Once it answers (and nobody acknowledged it), the new owner tells it.
    check.zookeeper_away = False
    assert not await release._revoked_before(check, 25, events)
    assert [e.kind.value for e in events] == ["keys_revoked"]


class _RevokedDuringRead(_Check):
    """The group's progress is read while a rebalance begins to take the partition."""

    def __init__(self, release: Release, revocation: Revocation) -> None:
        super().__init__(release.teller, revocation, group_acknowledged=False)
        self._release = release

    async def progress(self) -> None:
        await super().progress()
        self._release.state.revoking.add(self.tp)


async def test_a_partition_a_rebalance_takes_during_the_read_is_not_told_before_delivery() -> None:
    # The rebalance waits only for what was told before it began; an event told now
    # would reach the app as the partition's next owner tells its own.
    release = _events_release()
    revocation = Revocation(partition=1, generation=4, boundary=20)
    check: Any = _RevokedDuringRead(release, revocation)
    events: list[Any] = []
    assert not await release._revoked_before(check, 25, events)
    assert events == []
    assert release.teller.told_revocations() == []


async def test_a_partition_a_rebalance_takes_during_the_read_is_not_told_when_due() -> None:
    # The caught-up case: everything before the boundary delivered, nothing after.
    release = _events_release()
    revocation = Revocation(partition=0, generation=1, boundary=5)
    check: Any = _RevokedDuringRead(release, revocation)
    check.runtime = SimpleNamespace(state=SimpleNamespace(log=fakes.expanded_log(5)))
    check.tp = TopicPartition("t", 0)
    state: Any = SimpleNamespace(delivered=5)
    events: list[Any] = []
    await release._tell_due_revocations(check, state, events)
    assert check.reads == 1
    assert events == []
    assert release.teller.told_revocations() == []
    # Without the rebalance, the same read tells it.
    release.state.revoking.discard(check.tp)
    told: Any = _Check(release.teller, revocation, group_acknowledged=False)
    told.runtime, told.tp = check.runtime, check.tp
    await release._tell_due_revocations(told, state, events)
    assert [(e.kind.value, e.partition, e.generation) for e in events] == [("keys_revoked", 0, 1)]


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


def _told(result: PollResult) -> list[tuple[str, int, int]]:
    return [(e.kind.value, e.partition, e.generation) for e in result.events]


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
