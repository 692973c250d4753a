"""Expansion and shrink through real sidecars, under load, against the real cluster.

The central check: no record is written across a barrier. Every record carries the
generation it was routed with (its stamp, ``ordered.stamp``); the generation log says which
generation its offset belongs to (``generation_of``). They must be equal for every
record in every partition.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from kazoo.client import KazooClient

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import (
    RunningSidecar,
    check_no_record_crossed_a_barrier,
    header,
    log_of_description,
    read_all,
    running_sidecars,
    unique,
)
from sidecar.core.generations import GenerationLog
from sidecar.core.placement import WARM_HEADER
from sidecar.core.procedures import Operation, OperationKind, Phase, SidecarId
from sidecar.core.routing import partition_for_key
from sidecar.core.topics import PendingBarrier


async def _describe(sidecar: RunningSidecar, topic: str) -> dict[str, object]:
    status, body = await sidecar.admin("GET", f"/admin/topics/{topic}")
    assert status == 200, body
    return body


def _log_of(description: dict[str, Any]) -> GenerationLog:
    return log_of_description(description)


async def _produce_until(
    sidecar: RunningSidecar, topic: str, keys: list[str], stop: asyncio.Event, log: list[str]
) -> tuple[int, int]:
    """Produce keyed batches until ``stop``; returns (records written, requests failed)."""
    written = failed = 0
    sequence = 0
    while not stop.is_set():
        records = [{"key": key, "value": {"seq": sequence, "by": sidecar.id}} for key in keys]
        sequence += 1
        status, body = await sidecar.produce(topic, records)
        if status != 200:
            failed += 1
            log.append(f"{sidecar.id}: {status} {body}")
            continue
        written += sum(1 for entry in body["offsets"] if entry["error_code"] is None)
    return written, failed


async def test_expansion_and_shrink_under_load_never_write_across_a_barrier(
    cluster: ClusterEndpoints,
) -> None:
    topic = unique("grow")
    keys = [f"key-{i}" for i in range(24)]
    async with running_sidecars(cluster, 3) as sidecars:
        await sidecars[0].create_topic(topic, 2, replication_factor=cluster.replication_factor)
        stop = asyncio.Event()
        errors: list[str] = []
        producers = [
            asyncio.create_task(_produce_until(s, topic, keys[i::3], stop, errors))
            for i, s in enumerate(sidecars)
        ]
        try:
            await asyncio.sleep(0.5)
            # Expansions and a shrink, coordinated by different sidecars, while all produce.
            for coordinator, count in ((0, 3), (1, 5), (2, 8), (0, 4)):
                began = time.monotonic()
                operation = await sidecars[coordinator].change_count(topic, count)
                assert operation["phase"] == "done", operation
                assert time.monotonic() - began < 20
                await asyncio.sleep(0.3)
        finally:
            stop.set()
            outcomes = await asyncio.gather(*producers)
        assert errors == []
        assert all(failed == 0 for _, failed in outcomes)
        written = sum(w for w, _ in outcomes)
        description = await _describe(sidecars[0], topic)

    log = _log_of(description)
    assert [g.undeleted_count for g in log.generations] == [2, 3, 5, 8, 4]
    # Every boundary, generation 0's included, is stored with its partition's leader
    # epoch (KIP-320), so a boundary lost to an unclean leader election can be detected.
    epochs = [b.leader_epoch for g in log.generations for b in g.boundaries]
    assert all(isinstance(epoch, int) and epoch >= 0 for epoch in epochs), epochs
    partitions = description["partitions"]
    assert isinstance(partitions, list)
    modes = [p["mode"] for p in partitions]
    assert modes[:4] == ["read_write"] * 4
    assert set(modes[4:]) <= {"read_only", "removed"}

    assert await check_no_record_crossed_a_barrier(cluster, description) == written


async def test_validate_only_and_invalid_counts_change_nothing(cluster: ClusterEndpoints) -> None:
    topic = unique("validate")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 4, replication_factor=cluster.replication_factor)
        planned = await sidecar.change_count(topic, 6, validate_only=True)
        assert (planned["validate_only"], planned["target_count"]) == (True, 6)
        for count in (4, 3, 10_001):
            status, body = await sidecar.admin(
                "POST", f"/admin/topics/{topic}/partition-count", {"count": count}
            )
            assert (status, body["error_code"]) == (422, 42210), body
        description = await _describe(sidecar, topic)
        assert description["generation"] == 0
        assert description["physical_count"] == 4
        assert description["operation"] is None


def _znodes(hosts: str, root: str) -> set[str]:
    """Every node under ``root`` but the sidecars' ephemeral registrations."""
    client = KazooClient(hosts=hosts)
    client.start()
    try:
        found, pending = set(), [root]
        while pending:
            path = pending.pop()
            found.add(path)
            if path != f"{root}/sidecars":
                pending += [f"{path}/{child}" for child in client.get_children(path)]
        return found
    finally:
        client.stop()
        client.close()


async def test_validate_only_and_refused_changes_create_no_znode(
    cluster: ClusterEndpoints,
) -> None:
    topic = unique("validate-znodes")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        root = sidecar.server.settings.zookeeper.root
        before = await asyncio.to_thread(_znodes, cluster.zookeeper_hosts, root)
        requests = [
            (topic, {"count": 3, "validate_only": True}, 200),
            (topic, {"count": 1, "validate_only": True}, 422),
            (unique("unmanaged"), {"count": 3, "validate_only": True}, 404),
            (unique("unmanaged"), {"count": 3}, 404),
            ("..%2F..%2Fescaped", {"count": 3, "validate_only": True}, 400),
        ]
        for name, body, status in requests:
            answer = await sidecar.admin("POST", f"/admin/topics/{name}/partition-count", body)
            assert answer[0] == status, (name, answer)
        after = await asyncio.to_thread(_znodes, cluster.zookeeper_hosts, root)
    assert sorted(after - before) == []


@pytest.mark.parametrize("coordinator", ["dead", "live without the lock"])
async def test_a_change_nobody_drives_is_finished(
    cluster: ClusterEndpoints, coordinator: str
) -> None:
    """A journal that is not final while nobody holds the topic's lock: its coordinator
    died, or (alive) lost its session and with it the lock. Either way it is resumed."""
    topic = unique("orphan")
    async with running_sidecars(cluster, 2) as sidecars:
        await sidecars[0].create_topic(topic, 2, replication_factor=cluster.replication_factor)
        store = sidecars[0].server.store
        owner = "dead-sidecar" if coordinator == "dead" else sidecars[1].server.settings.sidecar_id
        # What a coordinator that stopped right after publishing the barrier leaves behind.
        orphan = Operation(
            topic=topic,
            kind=OperationKind.EXPAND,
            from_generation=0,
            from_count=2,
            target_count=3,
            phase=Phase.BARRIER,
            coordinator=SidecarId(owner),
            started_at=time.time(),
            barrier_deadline=time.time() + 20,
            physical_count=3,
            previous_boundaries=(0, 0),
        )
        await sidecars[0].server.kafka.create_partitions(topic, 3)
        await store.save_operation(orphan)
        await store.publish_barrier(topic, PendingBarrier(1, 3))
        # Once a sidecar has seen the barrier its produces hold, and complete with the
        # new generation when a live sidecar has finished the change.
        watcher = sidecars[1].server.sidecar
        deadline = time.monotonic() + 10
        while not (
            topic in watcher.topics and watcher.topics[topic].participant.pending_generation == 1
        ):
            assert time.monotonic() < deadline, "the barrier was never seen"
            await asyncio.sleep(0.01)
        status, body = await sidecars[1].produce(topic, [{"key": "k", "value": 1}])
        assert status == 200, body
        assert body["generation"] == 1
        description = await _describe(sidecars[0], topic)
        assert description["undeleted_count"] == 3
        operation = description["operation"]
        assert isinstance(operation, dict)
        assert operation["phase"] == "done"
        assert operation["coordinator"] == owner
        assert description["lock"] is None


LEFTOVER_WITHDRAWN_WITHIN_S = 10.0
"""Housekeeping runs every 2 s on each sidecar; a few rounds, with ZooKeeper round trips."""


@pytest.mark.parametrize("then", ["a change at once", "nothing: housekeeping"])
@pytest.mark.parametrize("left", ["the committed generation", "a rolled-back generation"])
async def test_a_barrier_no_change_owns_is_withdrawn(
    cluster: ClusterEndpoints, left: str, then: str
) -> None:
    """What a coordinator paused past its session could leave before its store refused
    it (a long chaos run found it): a pending barrier of a change that its successor had
    already finished. Every later change of the topic would wait for it and roll back;
    the sidecars withdraw it by themselves, and the next change is done."""
    topic = unique("leftover")
    async with running_sidecars(cluster, 2) as sidecars:
        await sidecars[0].create_topic(topic, 2, replication_factor=cluster.replication_factor)
        assert (await sidecars[0].change_count(topic, 3))["phase"] == "done"
        generation = 1 if left == "the committed generation" else 2
        # A store that never read the journal writes without the owner's check, as the
        # paused coordinator's write did when it landed.
        await sidecars[1].server.store.publish_barrier(topic, PendingBarrier(generation, 4))
        assert (await _describe(sidecars[0], topic))["pending"] is not None
        if then == "a change at once":
            operation = await sidecars[0].change_count(topic, 4)
            assert operation["phase"] == "done", operation
        else:
            deadline = time.monotonic() + LEFTOVER_WITHDRAWN_WITHIN_S
            while (await _describe(sidecars[0], topic))["pending"] is not None:
                assert time.monotonic() < deadline, "the leftover barrier was never withdrawn"
                await asyncio.sleep(0.2)
            operation = await sidecars[1].change_count(topic, 4)
            assert operation["phase"] == "done", operation
        description = await _describe(sidecars[0], topic)
        assert description["pending"] is None
        assert description["undeleted_count"] == 4


async def test_compacted_topics_get_relocation_tombstones(cluster: ClusterEndpoints) -> None:
    topic = unique("compact")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(
            topic, 2, replication_factor=cluster.replication_factor, compacted=True
        )
        await sidecar.change_count(topic, 3)
        keys = [f"k{i}" for i in range(40)]
        moved = [
            k
            for k in keys
            if partition_for_key(json.dumps(k).encode(), 2, 2)
            != partition_for_key(json.dumps(k).encode(), 2, 3)
        ]
        assert moved
        for _ in range(2):  # the second round must not repeat the tombstones
            status, body = await sidecar.produce(topic, [{"key": k, "value": 1} for k in keys])
            assert status == 200, body
        tombstones = sidecar.server.metrics.relocation_tombstones.labels(topic)._value.get()
    assert tombstones == len(moved)
    stored = await read_all(cluster, topic, 3)
    relocations = [
        (partition, record.key)
        for partition, records in stored.items()
        for record in records
        if header(record, "ordered.relocation") == b"1"
    ]
    assert sorted(relocations) == sorted(
        (partition_for_key(json.dumps(k).encode(), 2, 2), json.dumps(k).encode()) for k in moved
    )
    for _partition, records in stored.items():
        for record in records:
            if header(record, "ordered.relocation") == b"1":
                assert record.value is None


async def test_compaction_drops_the_old_values_of_moved_keys(cluster: ClusterEndpoints) -> None:
    topic = unique("compaction")
    # Small segments and an eager cleaner, so compaction runs within seconds.
    configs = {
        "segment.ms": "200",
        "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0",
    }
    keys = [f"k{i}" for i in range(40)]
    encoded = {k: json.dumps(k).encode() for k in keys}
    moved = {
        k
        for k in keys
        if partition_for_key(encoded[k], 2, 3) != partition_for_key(encoded[k], 2, 2)
    }
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(
            topic, 2, replication_factor=cluster.replication_factor, compacted=True, configs=configs
        )
        status, body = await sidecar.produce(topic, [{"key": k, "value": "old"} for k in keys])
        assert status == 200, body
        await sidecar.change_count(topic, 3)
        status, body = await sidecar.produce(topic, [{"key": k, "value": "new"} for k in keys])
        assert status == 200, body
        deadline = time.monotonic() + 90
        while True:
            # New records roll the old partitions' segments, so the cleaner can take them.
            for partition in (0, 1):
                await sidecar.produce(
                    topic, [{"key": f"roll-{time.monotonic()}", "value": 0}], partition=partition
                )
            stored = await read_all(cluster, topic, 3)
            stale = {
                record.key
                for partition in (0, 1)
                for record in stored[partition]
                if record.key in {encoded[k] for k in moved} and record.value is not None
            }
            if not stale:
                break
            assert time.monotonic() < deadline, f"{len(stale)} moved keys kept their old value"
            await asyncio.sleep(1.0)
    # The moved keys' live values are all in their new partition.
    live_new = {r.key for r in stored[2] if r.value is not None}
    assert {encoded[k] for k in moved} <= live_new


@pytest.mark.parametrize("compacted", [False, True], ids=["delete", "compacted"])
async def test_an_expansion_warms_the_partitions_it_adds_and_clears_the_warm_up(
    cluster: ClusterEndpoints, compacted: bool
) -> None:
    """Each partition the expansion makes took one write before the barrier, aborted and
    then deleted: its log starts and ends past the write and its marker, where its first
    boundary lies, so it is as empty as a partition never written (retirement removes it
    at once) and no reader ever meets the write. A partition brought back by a later
    expansion existed already and is not warmed again. A compacted topic too (it refuses
    a record without a key, and every warm-up of one failed while the write had none)."""
    topic = unique("warm")
    async with running_sidecars(cluster, 2) as (coordinator, other):
        await coordinator.create_topic(
            topic, 2, replication_factor=cluster.replication_factor, compacted=compacted
        )
        await coordinator.change_count(topic, 4)
        kafka = other.server.kafka
        # The aborted record and its marker: offsets 0 and 1, deleted (a compacted topic
        # refuses DeleteRecords: there they stay, below the first boundary).
        starts = [0, 0] if compacted else [2, 2]
        assert (await kafka.log_start_offsets(topic, 4))[2:] == starts
        assert (await kafka.end_offsets(topic, 4))[2:] == [2, 2]
        boundaries = _log_of(await _describe(other, topic))[1].boundaries
        assert [b.offset for b in boundaries] == [0, 0, 2, 2], boundaries
        # Shrunk and grown again: partition 3 is brought back, not made, and not warmed.
        await coordinator.change_count(topic, 3)
        await other.change_count(topic, 4)
        assert (await kafka.end_offsets(topic, 4))[3] == 2
        keys = [f"user-{i}" for i in range(16)]
        status, body = await other.produce(topic, [{"key": k, "value": 1} for k in keys])
        assert status == 200, body
    stored = [r for rs in (await read_all(cluster, topic, 4)).values() for r in rs]
    # No warm-up write among them (a compacted topic also holds the relocation
    # tombstones of the keys the shrink moved: records without a value).
    assert sorted(r.key for r in stored if r.value is not None) == sorted(
        json.dumps(k).encode() for k in keys
    )
    assert not [r for r in stored if WARM_HEADER in dict(r.headers)]
