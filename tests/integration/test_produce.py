"""The produce path through a real sidecar: routing, headers, fencing, errors."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from base64 import b64decode
from typing import Any

import aiohttp
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.consumers import create_consumer
from ordered_dev.harness.sidecars import (
    BINARY_V2,
    JSON_V2,
    RunningSidecar,
    b64,
    check_no_record_crossed_a_barrier,
    read_all,
    running_sidecars,
    unique,
)
from sidecar.core.placement import is_stamped, record_stamp
from sidecar.core.routing import default_partition, partition_for_key


async def test_unmanaged_topics_route_like_the_java_producer(cluster: ClusterEndpoints) -> None:
    topic = unique("plain")
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 5, cluster.replication_factor)])
    finally:
        await admin.close()
    async with running_sidecars(cluster, 1) as (sidecar,):
        keys = [f"k{i}" for i in range(30)]
        status, body = await sidecar.produce(
            topic,
            [{"key": b64(k.encode()), "value": b64(b"v")} for k in keys],
            content_type=BINARY_V2,
        )
    assert status == 200, body
    assert "generation" not in body
    assert [entry["partition"] for entry in body["offsets"]] == [
        default_partition(k.encode(), 5) for k in keys
    ]
    stored = await read_all(cluster, topic, 5)
    assert not any(is_stamped(r.headers) for rs in stored.values() for r in rs)


async def test_managed_topics_route_by_linear_hashing_with_headers(
    cluster: ClusterEndpoints,
) -> None:
    topic = unique("managed")
    async with running_sidecars(cluster, 1) as (sidecar,):
        created = await sidecar.create_topic(
            topic, 3, replication_factor=cluster.replication_factor
        )
        assert created["generation"] == 0
        assert created["undeleted_count"] == 3
        records: list[dict[str, Any]] = [{"key": f"user-{i}", "value": {"n": i}} for i in range(20)]
        records.append({"key": "deleted-user", "value": None})
        status, body = await sidecar.produce(topic, records)
        assert status == 200, body
        assert body["generation"] == 0
        assert body["partition_count"] == 3
        for record, entry in zip(records, body["offsets"], strict=True):
            key = json.dumps(record["key"]).encode()
            assert entry["partition"] == partition_for_key(key, 3, 3)
        sidecar_id = sidecar.id
    stored = await read_all(cluster, topic, 3)
    everything = [r for rs in stored.values() for r in rs]
    assert len(everything) == 21
    sequences = set()
    for record in everything:
        # One header, the stamp (produce.header_format's default).
        assert [name for name, _ in record.headers] == ["ordered.stamp"]
        stamp = record_stamp(record.headers)
        assert stamp is not None
        assert (stamp.generation, stamp.count, stamp.sidecar) == (0, 3, sidecar_id)
        sequences.add(stamp.sequence)
    assert len(sequences) == 21
    tombstone = next(r for r in everything if r.key == b'"deleted-user"')
    assert tombstone.value is None


async def test_a_deployment_mid_upgrade_writes_either_format_and_reads_both(
    cluster: ClusterEndpoints,
) -> None:
    """One sidecar still writes the four headers of older versions (``separate``), the
    other the stamp, across a partition-count change. Both formats land as configured, the
    barrier check reads the routing generation of either, and a group reading through the
    older-format sidecar gets every record in per-key order."""
    topic = unique("upgrade")
    keys = [f"user-{i}" for i in range(12)]
    async with running_sidecars(cluster, 2, header_formats=("separate", "stamp")) as sidecars:
        old_format, new_format = sidecars
        await new_format.create_topic(topic, 3, replication_factor=cluster.replication_factor)
        for round_, writer in enumerate((old_format, new_format)):
            status, body = await writer.produce(topic, [{"key": k, "value": round_} for k in keys])
            assert status == 200, body
        await new_format.change_count(topic, 5)
        for round_, writer in enumerate((new_format, old_format), start=2):
            status, body = await writer.produce(topic, [{"key": k, "value": round_} for k in keys])
            assert status == 200, body
        description = await new_format.describe(topic)
        consumer = await create_consumer(
            old_format, unique("group"), "c", **{"auto.offset.reset": "earliest"}
        )
        await consumer.subscribe(topic)
        rounds: dict[str, list[int]] = {k: [] for k in keys}
        deadline = asyncio.get_running_loop().time() + 30
        # Until every key has all four rounds: a rebalance of the group (its first join
        # can take two) starts again from the committed offset, and what was delivered
        # and not committed comes again (at-least-once), so counting records is not enough.
        while any(set(got) != {0, 1, 2, 3} for got in rounds.values()):
            assert asyncio.get_running_loop().time() < deadline, rounds
            for record in await consumer.poll_and_commit(300):
                rounds[json.loads(b64decode(record["key"]))].append(
                    json.loads(b64decode(record["value"]))
                )
        # In order per key: each record is the next round or a round delivered before
        # (a replay from the committed offset), never one that skips ahead.
        for key, got in rounds.items():
            highest = -1
            for round_ in got:
                assert round_ <= highest + 1, f"{key}: {got}"
                highest = max(highest, round_)
        await consumer.delete()
        writers = {old_format.id: "separate", new_format.id: "stamp"}
    stored = [r for rs in (await read_all(cluster, topic, 5)).values() for r in rs]
    assert len(stored) == 4 * len(keys)
    for record in stored:
        stamp = record_stamp(record.headers)
        assert stamp is not None
        names = [name for name, _ in record.headers]
        if writers[stamp.sidecar] == "stamp":
            assert names == ["ordered.stamp"]
        else:
            assert sorted(names) == sorted(
                ["ordered.generation", "ordered.count", "ordered.sidecar", "ordered.sequence"]
            )
    assert await check_no_record_crossed_a_barrier(cluster, description) == len(stored)


async def test_expected_generation_and_count_are_fenced(cluster: ClusterEndpoints) -> None:
    topic = unique("fenced")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        await sidecar.change_count(topic, 3)
        record = [{"key": "k", "value": 1}]

        status, body = await sidecar.produce(topic, record, extra={"expected_generation": 0})
        assert status == 409
        assert body["error_code"] == 40910
        assert body["retriable"] is True
        assert (body["current_generation"], body["current_count"]) == (1, 3)
        # A generation that exists but this sidecar has not read yet: retriable, and the
        # sidecar re-reads at once (as if it had not heard of the commit). A re-read the
        # change itself set off may still land between the two lines and put generation
        # 1 back: then the produce goes through, and the stale generation is set again.
        runtime = sidecar.server.sidecar.topics[topic]
        for _ in range(5):
            runtime.participant = dataclasses.replace(runtime.participant, generation=0)
            status, body = await sidecar.produce(topic, record, extra={"expected_generation": 1})
            if status != 200:
                break
            assert runtime.participant.generation == 1, body
        assert (status, body["error_code"], body["retriable"]) == (503, 50310, True)
        for _ in range(100):
            if runtime.participant.generation == 1:
                break
            await asyncio.sleep(0.05)
        assert runtime.participant.generation == 1

        status, body = await sidecar.produce(topic, record, headers={"Ordered-Expected-Count": "2"})
        assert (status, body["error_code"]) == (409, 40910)

        # Newer than any generation there is: the app's mistake, not a race (that would
        # be 503 50310 while this sidecar has not read a generation another committed).
        status, body = await sidecar.produce(topic, record, extra={"expected_generation": 9})
        assert (status, body["error_code"]) == (409, 40911)
        assert "retriable" not in body
        assert (body["current_generation"], body["current_count"]) == (1, 3)

        status, body = await sidecar.produce(
            topic, record, extra={"expected_generation": 1, "expected_partition_count": 3}
        )
        assert status == 200, body
        assert body["generation"] == 1

        metrics = sidecar.server.metrics
        assert metrics.fenced.labels(topic)._value.get() == 2
        assert metrics.unknown_generation.labels(topic)._value.get() == 2


async def test_bad_requests_get_a_status_a_code_and_a_message(cluster: ClusterEndpoints) -> None:
    topic = unique("bad")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        http = sidecar.http
        cases: list[tuple[str, str, bytes, int, int]] = [
            (f"/topics/{topic}", JSON_V2, b"{not json", 400, 40001),
            (f"/topics/{topic}", "text/plain", b"{}", 415, 41501),
            (f"/topics/{topic}", JSON_V2, b'{"records": [], "x": 1}', 400, 40001),
            (f"/topics/{topic}", BINARY_V2, b'{"records": [{"value": "***"}]}', 422, 42201),
            (f"/topics/{unique('missing')}", JSON_V2, b'{"records": [{"value": 1}]}', 404, 40401),
            (f"/topics/{topic}/partitions/x", JSON_V2, b'{"records": [{"value": 1}]}', 404, 40402),
            ("/no/such/route", JSON_V2, b"{}", 404, 40400),
        ]
        for path, content_type, body, status, code in cases:
            async with http.post(path, data=body, headers={"Content-Type": content_type}) as r:
                answer = await r.json(content_type=None)
            assert (r.status, answer["error_code"]) == (status, code), (path, body, answer)
            assert answer["message"]

        # A record to a partition that does not exist fails alone; the others are written.
        status, answer = await sidecar.produce(
            topic, [{"value": 1}, {"value": 2, "partition": 7}, {"value": 3}]
        )
        assert status == 200
        codes = [entry["error_code"] for entry in answer["offsets"]]
        assert codes == [None, 40402, None]
        stored = await read_all(cluster, topic, 2)
        assert sorted(json.loads(r.value) for rs in stored.values() for r in rs) == [1, 3]


async def test_admin_api_is_token_protected(cluster: ClusterEndpoints) -> None:
    async with running_sidecars(cluster, 1) as (sidecar,):
        status, body = await sidecar.admin("GET", "/admin/topics/x", token="wrong")
        assert (status, body["error_code"]) == (401, 40101)
        status, body = await sidecar.admin(
            "POST", "/admin/topics", {"name": "a/b", "partitions": 1}
        )
        assert (status, body["error_code"]) == (400, 40003)
        status, body = await sidecar.admin("POST", "/admin/topics", {"name": "ok", "partitions": 0})
        assert (status, body["error_code"]) == (422, 42210)
        status, body = await sidecar.admin("GET", f"/admin/topics/{unique('none')}")
        assert (status, body["error_code"]) == (404, 40401)


async def test_what_kafka_refuses_in_a_create_is_the_callers_mistake(
    cluster: ClusterEndpoints,
) -> None:
    async with running_sidecars(cluster, 1) as (sidecar,):
        cases: list[tuple[dict[str, Any], int, str]] = [
            ({"replication_factor": 9}, 40002, "replication factor"),
            ({"configs": {"no.such.config": "1"}}, 40002, "no.such.config"),
            ({"configs": {"retention.ms": "soon"}}, 40002, "retention.ms"),
            ({"replication_factor": 40_000}, 40001, "between 1 and 32767"),
            ({"configs": {"segment.ms": "\ud800"}}, 40001, "surrogate"),
        ]
        for options, code, words in cases:
            name = unique("refused")
            status, body = await sidecar.admin(
                "POST", "/admin/topics", {"name": name, "partitions": 1} | options
            )
            assert (status, body["error_code"]) == (400, code), (options, body)
            assert words in body["message"], body
            assert (await sidecar.admin("GET", f"/admin/topics/{name}"))[0] == 404


async def test_idempotency_key_writes_a_retry_once(cluster: ClusterEndpoints) -> None:
    topic = unique("idem")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 1, replication_factor=cluster.replication_factor)
        first = await sidecar.produce(topic, [{"value": 1}], headers={"Idempotency-Key": "abc"})
        again = await sidecar.produce(topic, [{"value": 1}], headers={"Idempotency-Key": "abc"})
        other = await sidecar.produce(topic, [{"value": 2}], headers={"Idempotency-Key": "abc"})
    assert first == again
    assert other[0] == 422
    assert other[1]["error_code"] == 42202
    stored = await read_all(cluster, topic, 1)
    assert len(stored[0]) == 1


async def test_health_readiness_metrics_and_openapi(cluster: ClusterEndpoints) -> None:
    async with running_sidecars(cluster, 1) as (sidecar,):
        for path, status in (("/healthz", 200), ("/readyz", 200), ("/openapi.json", 200)):
            async with sidecar.http.get(path) as response:
                assert response.status == status
        async with sidecar.http.get("/openapi.json") as response:
            document = await response.json()
        assert "/topics/{topic}" in document["paths"]
        await sidecar.produce(unique("missing"), [{"value": 1}])
        async with sidecar.http.get("/metrics") as response:
            text = await response.text()
        assert "sidecar_produce_requests_total" in text
        assert 'outcome="40401"' in text


async def _series(sidecar: RunningSidecar) -> set[str]:
    async with sidecar.http.get("/metrics") as response:
        text = await response.text()
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")}


async def test_requests_for_unknown_topics_do_not_grow_the_metrics(
    cluster: ClusterEndpoints,
) -> None:
    topic = unique("known")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 1, replication_factor=cluster.replication_factor)
        assert (await sidecar.produce(topic, [{"value": 1}]))[0] == 200
        invented = [unique("missing") for _ in range(200)] + ["bad%2Fname", "%E2%82%AC"]
        await sidecar.produce(invented[0], [{"value": 1}])
        await sidecar.produce(invented[0], [{"value": 1}], content_type="text/plain")
        before = await _series(sidecar)
        for name in invented:
            await sidecar.produce(name, [{"value": 1}])
            await sidecar.produce(name, [{"value": 1}], content_type="text/plain")
        after = await _series(sidecar)
    assert sorted(after - before) == []
    assert any(f'topic="{topic}"' in line for line in after)
    assert any('outcome="40401",topic="_unknown"' in line for line in after)


async def test_graceful_stop_answers_requests_in_progress(cluster: ClusterEndpoints) -> None:
    topic = unique("stop")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        session = aiohttp.ClientSession(sidecar.server.url)
        try:
            records = [{"key": f"k{i}", "value": i} for i in range(200)]
            pending = [
                asyncio.create_task(
                    session.post(
                        f"/topics/{topic}",
                        data=json.dumps({"records": records}),
                        headers={"Content-Type": JSON_V2},
                    )
                )
                for _ in range(5)
            ]
            await asyncio.sleep(0.01)
            await sidecar.server.stop()
            answered = 0
            for task in pending:
                try:
                    response = await task
                except aiohttp.ClientError:
                    continue  # refused before it was accepted: nothing was written
                body = await response.json(content_type=None)
                if response.status == 200:
                    assert all(e["error_code"] is None for e in body["offsets"])
                    answered += 1
                else:
                    assert body["error_code"] == 50301
        finally:
            await session.close()
    stored = await read_all(cluster, topic, 2)
    # Every request answered 200 is fully in Kafka; no request is half-written.
    assert sum(len(rs) for rs in stored.values()) == 200 * answered
