"""GateWaits: each wait announced once, counted while it lasts, withdrawn when cleared."""

from __future__ import annotations

from typing import Any, cast

from sidecar.core.errors import MetadataUnavailable
from sidecar.core.gate import WaitKey
from sidecar.core.generations import ChangeKind
from sidecar.service.consume_context import ConsumerMetrics, GroupStore
from sidecar.service.waits import GateWaits
from tests.unit.service.fakes import Metrics, Store


class _AwayStore(Store):
    async def remove_wait(self, *_: Any) -> None:
        raise MetadataUnavailable("ZooKeeper session is suspended")


def _waits(store: Store, metrics: Metrics) -> GateWaits:
    return GateWaits("g", "sc-i", cast(GroupStore, store), cast(ConsumerMetrics, metrics))


async def test_a_wait_is_announced_once_and_withdrawn_when_cleared() -> None:
    store, metrics = Store(), Metrics()
    waits = _waits(store, metrics)
    key, other = WaitKey("t", 0, 40), WaitKey("u", 1, 7)
    await waits.announce(key, ChangeKind.EXPANSION)
    await waits.announce(key, ChangeKind.EXPANSION)  # every poll that still waits
    await waits.announce(other, ChangeKind.SHRINK)
    assert store.waiting == [("g", "t", 0, 40, "sc-i"), ("g", "u", 1, 7, "sc-i")]
    assert metrics.waiting == 2
    assert waits.topics() == {"t", "u"}

    await waits.clear("t")
    assert store.waiting == [("g", "u", 1, 7, "sc-i")]
    assert metrics.waiting == 1
    await waits.clear_all()
    assert store.waiting == []
    assert metrics.waiting == 0
    assert waits.topics() == set()


async def test_a_wait_cleared_while_zookeeper_is_away_is_forgotten_here() -> None:
    """The record in ZooKeeper is the instance's own and goes with its session; the
    instance stops counting the wait at once."""
    store, metrics = _AwayStore(), Metrics()
    waits = _waits(store, metrics)
    await waits.announce(WaitKey("t", 0, 40), ChangeKind.EXPANSION)
    await waits.clear("t")
    assert metrics.waiting == 0
    assert waits.topics() == set()
