"""The audit job reads a secured audit topic: SASL_SSL with SCRAM, and mutual TLS.

A sidecar with auditing on writes its events through the secured cluster (the audit
emitter is one more client of ``kafka.security``) while records are produced through an
expansion and read by a gated consumer instance; the job then reads the audit topic
with Spark's Kafka source, its options made from the same ``kafka.security``
(``spark_kafka_options``). The cluster has no PLAINTEXT listener.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import aiohttp
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from pyspark.sql import SparkSession

from ordered_audit.job import AuditConfig, run_audit
from ordered_audit.sources import spark_kafka_options
from ordered_dev.devcluster.cluster import LocalCluster
from ordered_dev.devcluster.provider import SECURED_IDENTITIES, secured_endpoints
from ordered_dev.harness.ledger import Ledger, consume_into, produce_sequences, wait_until_delivered
from ordered_dev.harness.sidecars import RunningSidecar, settings_for, unique
from sidecar.compose import SidecarServer
from sidecar.config import AuditSettings

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("identity", SECURED_IDENTITIES)
async def test_the_audit_job_reads_a_secured_audit_topic(
    secured_cluster: LocalCluster,
    spark: SparkSession,
    tmp_path_factory: pytest.TempPathFactory,
    identity: str,
) -> None:
    endpoints = secured_endpoints(secured_cluster, identity)
    audit_topic, topic, group = unique("audit"), unique("audited"), unique("group")
    settings = settings_for(endpoints, f"/{unique('audit-root')}", f"audit-{identity}")
    settings = replace(settings, audit=AuditSettings(enabled=True, topic=audit_topic))
    # The secured cluster has one broker; the sidecar would create it with 3 replicas.
    admin = AIOKafkaAdminClient(
        bootstrap_servers=secured_cluster.kafka_bootstrap,
        **secured_cluster.admin_client_arguments(),
    )
    await admin.start()
    try:
        await admin.create_topics([NewTopic(audit_topic, 3, 1)])
    finally:
        await admin.close()
    ledger = Ledger()
    started = time.time()
    server = SidecarServer(settings)
    await server.start()
    try:
        await server.wait_ready()
        async with aiohttp.ClientSession(server.url) as http:
            sidecar = RunningSidecar(server.url, settings.sidecar_id, http, server)
            await sidecar.create_topic(topic, 2, replication_factor=1)
            stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
            consuming = asyncio.create_task(
                consume_into(sidecar, group, "c", topic, ledger, stop_consuming)
            )
            producing = asyncio.create_task(
                produce_sequences(sidecar, 0, topic, ledger, stop_producing)
            )
            await asyncio.sleep(1.0)
            operation = await sidecar.change_count(topic, 3)
            assert operation["phase"] == "done", operation
            await asyncio.sleep(1.0)
            stop_producing.set()
            await producing
            await wait_until_delivered(ledger, within_s=60)
            stop_consuming.set()
            await consuming
    finally:
        await server.stop()  # flushes its audit queue
    result = await asyncio.to_thread(
        run_audit,
        spark,
        AuditConfig(
            out=tmp_path_factory.mktemp(f"secured-audit-{identity}"),
            bootstrap=endpoints.kafka_bootstrap,
            topic=audit_topic,
            kafka_options=spark_kafka_options(settings.kafka.security),
            start=started,
        ),
    )
    summary = result.summary
    assert summary["anomalies"]["total"] == 0, summary["anomalies"]
    assert summary["events"]["by_type"]["produce_acked"] >= len(ledger.acknowledged)
    assert [(o["kind"], o["from_count"], o["target_count"]) for o in summary["operations"]] == [
        ("expand", 2, 3)
    ]
