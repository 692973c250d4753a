"""End to end: the guarantee across random expansions and shrinks, with a consumer killed.

Three producer sidecars write keyed, per-producer sequences; a group of three consumer
instances on two more sidecars reads them through the gate while the partition count
changes eight times (an expansion while a shrink is still draining among them), and
the sidecar of one consumer instance is SIGKILLed and restarted midway.

For every (producer, key) the delivered sequence is in order, no acknowledged record is
lost, and duplicates appear only after the restart.
"""

from __future__ import annotations

import asyncio
import random

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.ledger import (
    Ledger,
    check_order,
    consume_into,
    describe_gates,
    produce_sequences,
    wait_until_delivered,
)
from ordered_dev.harness.sidecars import (
    SidecarProcess,
    check_no_record_crossed_a_barrier,
    settings_for,
    start_process,
    stop_process,
    unique,
)

PRODUCERS = 3


async def test_the_guarantee_holds_through_changes_and_a_consumer_crash(
    cluster: ClusterEndpoints,
) -> None:
    root = f"/{unique('e2e')}"
    topic = unique("orders")
    group = unique("group")
    rng = random.Random(2531)
    ledger = Ledger()
    sidecars: list[SidecarProcess] = []
    try:
        for index in range(PRODUCERS + 2):
            sidecars.append(await start_process(settings_for(cluster, root, f"s{index}")))
        producers, stable, doomed = sidecars[:PRODUCERS], sidecars[PRODUCERS], sidecars[-1]
        await producers[0].create_topic(topic, 2, replication_factor=cluster.replication_factor)

        stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
        consumer_tasks = [
            asyncio.create_task(consume_into(stable, group, "a", topic, ledger, stop_consuming)),
            asyncio.create_task(consume_into(stable, group, "b", topic, ledger, stop_consuming)),
            asyncio.create_task(consume_into(doomed, group, "c", topic, ledger, stop_consuming)),
        ]
        producer_tasks = [
            asyncio.create_task(produce_sequences(s, i, topic, ledger, stop_producing))
            for i, s in enumerate(producers)
        ]
        # Eight changes; the fourth expands right after a shrink, while it drains.
        counts = [2]
        plan = [4, 6, 3, 5, 7, 4, 8, 5]
        for step, target in enumerate(plan):
            await asyncio.sleep(rng.uniform(0.3, 1.0))
            operation = await rng.choice(producers).change_count(topic, target)
            assert operation["phase"] == "done", operation
            counts.append(target)
            if step == 3:
                # Kill the sidecar of consumer "c" and bring it back with a new process.
                ledger.disrupted()
                doomed.process.kill()
                await doomed.process.wait()
                await doomed.http.close()
                doomed = await start_process(settings_for(cluster, root, "s-restarted"))
                sidecars.append(doomed)
                consumer_tasks.append(
                    asyncio.create_task(
                        consume_into(doomed, group, "c", topic, ledger, stop_consuming)
                    )
                )
        await asyncio.sleep(1.0)
        stop_producing.set()
        await asyncio.gather(*producer_tasks)

        # Everything acknowledged is eventually delivered.
        await wait_until_delivered(ledger, within_s=90, diagnose=lambda: describe_gates(sidecars))
        stop_consuming.set()
        await asyncio.gather(*consumer_tasks, return_exceptions=True)
        description = await producers[0].describe(topic)
    finally:
        await asyncio.gather(*(stop_process(s) for s in sidecars), return_exceptions=True)

    assert ledger.poll_errors == []
    assert [g["undeleted_count"] for g in description["generations"]] == counts
    await check_no_record_crossed_a_barrier(cluster, description)

    assert ledger.disrupted_at is not None
    duplicates = check_order(ledger)
    print(
        f"{len(ledger.delivered)} deliveries of {len(ledger.acknowledged)} records, "
        f"{duplicates} duplicates after the restart, counts {counts}"
    )
