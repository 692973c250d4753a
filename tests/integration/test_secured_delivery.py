"""The guarantee on a secured cluster: SASL_SSL with SCRAM, and mutual TLS.

Every Kafka client of the sidecar (the transactional and idempotent producers, the
admin client, the group consumers of a consumer instance, the fence's producers)
connects with ``kafka.security``, and the sidecars reach ZooKeeper over TLS as a SASL
identity whose ACLs guard every znode. The cluster (``secured_cluster``) has its
PLAINTEXT listeners off: a client that skipped the security settings could not connect.
"""

from __future__ import annotations

import asyncio

import pytest

from ordered_dev.devcluster.cluster import LocalCluster
from ordered_dev.devcluster.provider import SECURED_IDENTITIES, secured_endpoints
from ordered_dev.harness.ledger import Ledger, check_order, consume_into, produce_sequences
from ordered_dev.harness.ledger import wait_until_delivered as delivered_within
from ordered_dev.harness.sidecars import (
    check_no_record_crossed_a_barrier,
    running_sidecars,
    unique,
)
from tests.integration.test_zombie_sidecar import (
    test_a_zombie_sidecar_is_fenced_and_recovers as zombie_scenario,
)


@pytest.mark.parametrize("identity", SECURED_IDENTITIES)
async def test_gated_delivery_through_an_expansion_and_a_shrink(
    secured_cluster: LocalCluster, identity: str
) -> None:
    endpoints = secured_endpoints(secured_cluster, identity)
    topic, group = unique(f"secured-{identity}"), unique("group")
    ledger = Ledger()
    async with running_sidecars(endpoints, 2) as (writer, reader):
        created = await writer.create_topic(topic, 2, replication_factor=1)
        assert created["undeleted_count"] == 2, created
        stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
        consuming = asyncio.create_task(
            consume_into(reader, group, "a", topic, ledger, stop_consuming)
        )
        producing = asyncio.create_task(produce_sequences(writer, 0, topic, ledger, stop_producing))
        for target in (3, 2):
            await asyncio.sleep(0.5)
            operation = await writer.change_count(topic, target)
            assert operation["phase"] == "done", operation
        await asyncio.sleep(0.5)
        stop_producing.set()
        await producing
        await delivered_within(ledger, within_s=60)
        stop_consuming.set()
        await consuming
        description = await writer.describe(topic)
    assert ledger.poll_errors == []
    assert ledger.acknowledged
    assert [g["undeleted_count"] for g in description["generations"]] == [2, 3, 2]
    await check_no_record_crossed_a_barrier(endpoints, description)
    assert check_order(ledger) == 0


@pytest.mark.parametrize("identity", SECURED_IDENTITIES)
async def test_a_zombie_is_fenced_on_a_secured_cluster(
    secured_cluster: LocalCluster, identity: str
) -> None:
    # The fence initialises the zombie's transactional ids with producers of its own:
    # they too connect with the security settings.
    await zombie_scenario(secured_endpoints(secured_cluster, identity))
