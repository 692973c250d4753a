"""Compacting a topic's generation log on the real cluster (docs/compaction.md).

Under load: two sidecars produce keyed sequences and a group of two instances reads
them while the partition count changes; once the group has consumed past the
boundaries of an old generation, DeleteRecords moves every log start there, the log is
compacted, and a later change still commits. Every key is delivered in order and
nothing acknowledged is lost; a group created after the compaction, reading from the
earliest offset, gets every record still in Kafka, in order.

A fault: the compacting sidecar stops itself (SIGSTOP) with the fold decided and
nothing written, holding the topic's lock. Its session expires, which releases the
lock; another sidecar's pass then compacts. Resumed, the stale compactor writes
nothing, and every sidecar reads the compacted log. In the second variant the stopped
compactor is killed (SIGKILL) instead: its lock goes with its session all the same, and
a sidecar started again in its place reads the compacted log and changes the topic.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.ledger import (
    Ledger,
    check_order,
    consume_into,
    produce_sequences,
    wait_until_delivered,
)
from ordered_dev.harness.sidecars import (
    RunningSidecar,
    SidecarClient,
    SidecarProcess,
    process_stopped,
    running_sidecars,
    settings_for,
    start_process,
    stop_process,
    unique,
)
from ordered_dev.harness.waiting import eventually
from sidecar.adapters.kafka import KafkaGateway
from sidecar.config import KafkaSettings

SESSION_S = 4.0
RECOVERY_BOUND_S = SESSION_S + 10.0 + 10.0
"""The next pass completes within this of the compactor's stop: its session expires
(``SESSION_S``), which deletes the lock node, and a pass asked for meanwhile waits up to
``changes.lock_timeout_s`` (10 s) for the lock; another 10 s of slack for a loaded
machine. In production the next housekeeping pass comes at most
1.2 times ``changes.compaction_interval_s`` after the session expired."""


async def _compact(sidecar: SidecarClient, topic: str) -> dict[str, Any]:
    status, body = await sidecar.admin("POST", f"/admin/topics/{topic}/compaction", {})
    assert status == 200, body
    return body


def _boundaries(description: dict[str, Any], number: int) -> list[int]:
    (generation,) = [g for g in description["generations"] if g["number"] == number]
    return [offset for offset, _ in generation["boundaries"]]


async def _consumed_through(
    sidecar: RunningSidecar, group: str, topic: str, boundaries: list[int]
) -> None:
    """Wait until ``group`` committed at least each boundary (above 0) of ``topic``."""
    kafka = sidecar.server.kafka

    async def committed() -> bool:
        offsets = await kafka.committed_offsets(group, topic, len(boundaries))
        return all(b == 0 or offsets.get(p, -1) >= b for p, b in enumerate(boundaries))

    await eventually(committed, 60, f"{group} consumed {topic} up to {boundaries}")


async def test_a_log_compacted_under_load_keeps_every_key_in_order(
    cluster: ClusterEndpoints,
) -> None:
    topic, group, late_group = unique("compact"), unique("group"), unique("late")
    ledger, late = Ledger(), Ledger()
    late_consumer: asyncio.Task[None] | None = None
    async with running_sidecars(cluster, 2) as sidecars:
        first, second = sidecars
        await first.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
        consumers = [
            asyncio.create_task(consume_into(s, group, f"c{i}", topic, ledger, stop_consuming))
            for i, s in enumerate(sidecars)
        ]
        producers = [
            asyncio.create_task(produce_sequences(s, i, topic, ledger, stop_producing))
            for i, s in enumerate(sidecars)
        ]
        try:
            counts = [3, 4, 2, 3]  # generations 1-4; the shrink leaves 2 and 3 read-only
            for index, count in enumerate(counts):
                await asyncio.sleep(0.7)
                operation = await sidecars[index % 2].change_count(topic, count)
                assert operation["phase"] == "done", operation
            await asyncio.sleep(0.7)
            before = await first.describe(topic)
            assert before["first_generation"] == 0
            assert [g["number"] for g in before["generations"]] == [0, 1, 2, 3, 4]

            # Nothing is gone yet: nothing is folded.
            assert (await _compact(second, topic))["folded"] == 0

            # The group read past generation 3's boundaries; retention (here
            # DeleteRecords) removes everything before them.
            gone_before = _boundaries(before, 3)
            await _consumed_through(first, group, topic, gone_before)
            kafka = first.server.kafka
            await kafka.delete_records(topic, dict(enumerate(gone_before)))
            starts = await kafka.log_start_offsets(topic, len(gone_before))
            assert all(s >= b for s, b in zip(starts, gone_before, strict=True)), starts

            # The group's last keys_revoked acknowledgements (told at the end of a poll
            # that delivered up to a shrink's boundary) may land just after its commit:
            # until they do, the fold stops short of the change they belong to.
            folded = 0
            deadline = time.monotonic() + 30
            while True:
                done = await _compact(second, topic)
                folded += done["folded"]
                if done["first_generation"] == 3 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            assert (folded, done["first_generation"], done["generation"]) == (3, 3, 4)

            async def both_read_it() -> bool:
                described = [await s.describe(topic) for s in sidecars]
                return all(d["first_generation"] == 3 for d in described)

            await eventually(both_read_it, 15, "both sidecars read the compacted log")
            after = await first.describe(topic)
            assert [g["number"] for g in after["generations"]] == [3, 4]
            assert after["folded_waits"], "the folded changes still gate partitions 2 and 3"

            # Changes go on after the compaction, under the same load.
            operation = await second.change_count(topic, 4)
            assert operation["phase"] == "done", operation
            await asyncio.sleep(1.0)
            stop_producing.set()
            await asyncio.gather(*producers)
            await wait_until_delivered(ledger, within_s=90)

            # A group made now reads from the earliest offset: whatever Kafka still
            # holds, in order, gated only by what the compacted log keeps.
            starts = await kafka.log_start_offsets(topic, 4)
            late.acknowledged = {
                record
                for record in ledger.acknowledged
                if ledger.placed[record][1] >= starts[ledger.placed[record][0]]
            }
            late.placed = {record: ledger.placed[record] for record in late.acknowledged}
            late_consumer = asyncio.create_task(
                consume_into(first, late_group, "late", topic, late, stop_consuming)
            )
            await wait_until_delivered(late, within_s=60)
            folded_metric = second.server.metrics.registry.get_sample_value(
                "sidecar_generations_folded_total", {"topic": topic}
            )
        finally:
            stop_producing.set()
            stop_consuming.set()
            await asyncio.gather(*producers, return_exceptions=True)
            await asyncio.gather(*consumers, return_exceptions=True)
            if late_consumer is not None:
                await asyncio.gather(late_consumer, return_exceptions=True)

    assert ledger.poll_errors == []
    assert late.poll_errors == []
    assert folded_metric == 3
    duplicates = check_order(ledger)
    late_duplicates = check_order(late)
    assert (duplicates, late_duplicates) == (0, 0)
    print(
        f"{len(ledger.delivered)} deliveries of {len(ledger.acknowledged)} records; "
        f"the late group got {len(late.delivered)} still in Kafka; log starts {starts}"
    )


@pytest.mark.parametrize("fate", ["resumed", "killed"])
async def test_a_compactor_stopped_mid_pass_leaves_a_log_the_next_pass_completes(
    cluster: ClusterEndpoints, fate: str
) -> None:
    topic, root = unique("compact-fault"), f"/{unique('compact-fault')}"
    started: list[SidecarProcess] = []
    kafka = KafkaGateway(
        KafkaSettings(bootstrap_servers=cluster.kafka_bootstrap, security=cluster.kafka_security)
    )
    await kafka.start()
    try:
        stopping = settings_for(
            cluster,
            root,
            "stopping",
            session_timeout_s=SESSION_S,
            stop_before_compaction_write=True,
        )
        started.append(await start_process(stopping))
        started.append(await start_process(settings_for(cluster, root, "other")))
        compactor, other = started
        await other.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        for index, count in enumerate([3, 4, 2]):
            records = [{"key": f"k{index}-{i}", "value": i} for i in range(20)]
            status, body = await other.produce(topic, records)
            assert status == 200, body
            assert (await other.change_count(topic, count))["phase"] == "done"
        before = await other.describe(topic)
        # No group reads the topic: only the log starts hold the fold back.
        await kafka.delete_records(topic, dict(enumerate(_boundaries(before, 2))))

        # The compactor decides to fold generations 0 and 1 and stops before writing.
        asked = asyncio.create_task(
            compactor.admin("POST", f"/admin/topics/{topic}/compaction", {})
        )

        async def compactor_stopped() -> bool:
            return process_stopped(compactor.process.pid)

        await eventually(compactor_stopped, 30, "the compactor stops itself mid-pass")
        stopped_at = time.monotonic()
        assert (await other.describe(topic))["first_generation"] == 0  # nothing written
        assert (await other.describe(topic))["lock"]["holder"].startswith("stopping-")
        if fate == "killed":
            compactor.process.kill()
            await compactor.process.wait()

        # Its session expires and takes the lock with it; the other sidecar's pass folds.
        while True:
            status, body = await other.admin("POST", f"/admin/topics/{topic}/compaction", {})
            if status == 200:
                break
            assert (status, body["error_code"]) == (409, 40920), body
            assert time.monotonic() - stopped_at < RECOVERY_BOUND_S, body
        assert (body["folded"], body["first_generation"]) == (2, 2)
        recovered_s = time.monotonic() - stopped_at
        assert recovered_s < RECOVERY_BOUND_S

        if fate == "resumed":
            # Resumed, the stale compactor's write is refused (its session is gone, or
            # the log moved): it changes nothing, and it reads the compacted log like
            # the rest.
            os.kill(compactor.process.pid, signal.SIGCONT)
            status, body = await asyncio.wait_for(asked, 60)
            assert status != 200 or body["folded"] == 0, body
            assert status in (200, 409, 503), body
        else:
            # Its request died with it; a sidecar started in its place reads the
            # compacted log.
            assert isinstance((await asyncio.gather(asked, return_exceptions=True))[0], Exception)
            started.append(await start_process(settings_for(cluster, root, "restarted")))
            compactor = started[-1]

        async def compacted_everywhere() -> bool:
            # A resumed sidecar answers 503 until it has a new session and has read the
            # topics again.
            live = [s for s in started if s.process.returncode is None]
            answers = [await s.admin("GET", f"/admin/topics/{topic}") for s in live]
            return all(status == 200 and d["first_generation"] == 2 for status, d in answers)

        await eventually(compacted_everywhere, 60, "every sidecar reads the compacted log")
        after = await other.describe(topic)
        assert [g["number"] for g in after["generations"]] == [2, 3]
        assert after["generations"] == [g for g in before["generations"] if g["number"] >= 2]
        # And the resumed (or restarted) sidecar still changes the topic.
        assert (await compactor.change_count(topic, 3))["phase"] == "done"
        print(f"the next pass completed {recovered_s:.1f} s after the compactor stopped ({fate})")
    finally:
        for sidecar in started:
            if sidecar.process.returncode is None:
                os.kill(sidecar.process.pid, signal.SIGCONT)
        await asyncio.gather(*(stop_process(s) for s in started), return_exceptions=True)
        await kafka.stop()
