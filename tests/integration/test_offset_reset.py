"""Where a group reads a partition it has no committed offset for.

``auto.offset.reset`` (``latest``, REST Proxy's default) places a group that is new to
a topic. A partition an expansion makes later is another matter: every record in it
was routed there under the new generation, after the group was reading the topic, and
a group that began it at its end would skip the ones written before its rebalance
(acknowledged, never delivered). Such a partition is read from its beginning.
"""

from __future__ import annotations

import asyncio
import json
from base64 import b64decode

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.consumers import RestConsumer, create_consumer
from ordered_dev.harness.sidecars import running_sidecars, unique


async def _read_until(
    consumer: RestConsumer, want: dict[str, set[int]], within_s: float
) -> dict[str, list[int]]:
    """Poll (acknowledging hand-off events, committing) until every key got its rounds;
    what each key got, in delivery order."""
    got: dict[str, list[int]] = {key: [] for key in want}
    deadline = asyncio.get_running_loop().time() + within_s
    while any(not want[key] <= set(got[key]) for key in want):
        assert asyncio.get_running_loop().time() < deadline, {
            key: sorted(want[key] - set(got[key])) for key in want if want[key] - set(got[key])
        }
        for record in await consumer.poll_and_commit(300):
            key = json.loads(b64decode(record["key"]))
            got[key].append(json.loads(b64decode(record["value"])))
    return got


async def test_a_latest_group_reads_a_partition_an_expansion_made_from_its_beginning(
    cluster: ClusterEndpoints,
) -> None:
    topic, group = unique("reset"), unique("latest")
    keys = [f"user-{i}" for i in range(24)]
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        consumer = await create_consumer(sidecar, group, "c", **{"auto.offset.reset": "latest"})
        await consumer.subscribe(topic)
        # Joined and placed at the end of both partitions: the first round is read.
        first = {key: {0} for key in keys}
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            status, body = await sidecar.produce(topic, [{"key": k, "value": 0} for k in keys])
            assert status == 200, body
            try:
                await _read_until(consumer, first, 3)
                break
            except AssertionError:
                assert asyncio.get_running_loop().time() < deadline, "the group never joined"
        # An expansion, and records at once: some land in the new partitions before the
        # group's rebalance assigns them.
        await sidecar.change_count(topic, 4)
        for round_ in (1, 2, 3):
            status, body = await sidecar.produce(topic, [{"key": k, "value": round_} for k in keys])
            assert status == 200, body
        moved = {
            entry["partition"]
            for entry in body["offsets"]
            if entry["partition"] is not None and entry["partition"] >= 2
        }
        assert moved, "no key moved to a new partition"
        got = await _read_until(consumer, {key: {1, 2, 3} for key in keys}, 60)
        for key, rounds in got.items():
            highest = 0
            for round_ in rounds:
                assert round_ <= highest + 1, f"{key}: {rounds}"
                highest = max(highest, round_)
        await consumer.delete()
