"""A producer's client as ``sidecar.adapters.kafka.await_partition_count`` uses it,
with no broker: a cluster view that shows more partitions only after a refresh it asks
for, as aiokafka's does (the writer's lanes and the partition warmer)."""

from __future__ import annotations

import asyncio


class MetadataCluster:
    def __init__(self, shown: int) -> None:
        self.shown = shown

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(self.shown))


class MetadataClient:
    def __init__(self, shown: int, after_refresh: int) -> None:
        self.cluster = MetadataCluster(shown)
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
