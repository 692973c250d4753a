"""The transactional writer's lanes learning of new partitions (``prepare``).

Each lane's producer is reduced to the metadata a lane reads: a cluster view that shows
more partitions only after a refresh the lane asks for, as aiokafka's does.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sidecar.adapters.transactions import TransactionalWriter
from sidecar.config import KafkaSettings


class _Cluster:
    def __init__(self, shown: int) -> None:
        self.shown = shown

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(self.shown))


class _Client:
    def __init__(self, shown: int, after_refresh: int) -> None:
        self.cluster = _Cluster(shown)
        self.after_refresh = after_refresh
        self.refreshes = 0

    def add_topic(self, topic: str) -> None:
        pass

    def force_metadata_update(self) -> asyncio.Future[bool]:
        self.refreshes += 1
        self.cluster.shown = self.after_refresh
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        done.set_result(True)
        return done


class _Producer:
    def __init__(self, client: _Client) -> None:
        self.client = client


def _writer(clients: list[_Client], request_timeout_ms: int = 10_000) -> TransactionalWriter:
    settings = KafkaSettings(request_timeout_ms=request_timeout_ms, retry_backoff_s=0.01)
    writer = TransactionalWriter(settings, [f"id-{i}" for i in range(len(clients))])
    for lane, client in zip(writer._lanes, clients, strict=True):
        lane.producer = _Producer(client)
    return writer


async def test_prepare_refreshes_every_lane_that_does_not_show_the_partitions() -> None:
    behind, current = _Client(shown=4, after_refresh=6), _Client(shown=6, after_refresh=6)
    writer = _writer([behind, _Client(shown=4, after_refresh=6), current])
    await writer.prepare("orders", 6)
    assert [lane.producer.client.cluster.shown for lane in writer._lanes] == [6, 6, 6]
    assert (behind.refreshes, current.refreshes) == (1, 0)


async def test_prepare_gives_up_quietly_when_the_metadata_never_shows_them() -> None:
    # The request path waits again (and fails the request) if they still do not show.
    stale: Any = _Client(shown=4, after_refresh=4)
    writer = _writer([stale], request_timeout_ms=100)
    await asyncio.wait_for(writer.prepare("orders", 6), 5)
    assert stale.refreshes >= 2
