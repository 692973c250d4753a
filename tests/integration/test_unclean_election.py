"""A real unclean leader election truncates a partition below a stored boundary (KIP-320).

A topic with replication 2, ``min.insync.replicas=1`` and
``unclean.leader.election.enable=true``, managed by a real sidecar. On its partition 1
(leader L, follower F):

1. records are written while L and F are in sync (offsets below A), then F is stopped;
2. more records are written and acknowledged: with F out of the ISR, ``acks=all`` waits
   for L alone. F never has them (offsets A and up);
3. the topic expands 2 -> 3: generation 1's boundary of partition 1 is L's stable
   offset B > A, stored with L's leader epoch;
4. L is stopped and F started alone. As the controller unfences F it elects it leader,
   a replica outside the ISR, because the topic allows unclean elections: the log of
   partition 1 now ends at A, under a new epoch, and the epoch of B ends at A;
5. more records are written, past B: they reuse the offsets from A on;
6. L is started again; it truncates its log to A and follows F.

The three nodes are combined brokers and KRaft controllers: with L and F both stopped,
one controller of three is left and no controller is active until F is back.

Partition 1 is not split by 2 -> 3 (partition 0 is), so no gate waits for its records.

Checked: the next change is refused (409, 40950) naming partition 1, its boundary and
where its log ends; ``sidecar_truncated_boundaries`` counts the lost boundary;
``sidecar topics confirm-truncation --yes`` confirms it and the change then goes
through; a second confirmation finds nothing (409, 40951); the sidecar keeps serving the
topic throughout, within ``SERVE_BOUND_S``: produce after the election, produce and
consume after the change. The records acknowledged in step 2 are gone, and a group that
starts after the loss cannot know of them.

The second test keeps a consumer instance reading partition 1 through steps 1-5, with no
change: it has delivered the records of step 2 when F takes over, and its position lies
above where F's log ends. Checked: it validates its position against F
(OffsetForLeaderEpoch, KIP-320), reads again from where the logs diverge, delivers every
record written after the election (none is skipped at the reused offsets), counts the
loss (``sidecar_consumer_truncations_total``, and the offsets read then lost in
``sidecar_consumer_truncated_records_total``) and tells its app (``log_truncated``)
before anything read again. A second group reads as much, commits (with the leader
epoch of what it read, OffsetCommit v6) and closes its instance before the election;
its next instance starts from that commit and is moved back to the divergence too.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from ordered_dev.devcluster.provider import ClusterEndpoints, ClusterServers
from ordered_dev.harness.consumers import RestConsumer, create_consumer, decoded
from ordered_dev.harness.sidecars import (
    ADMIN_TOKEN,
    RunningSidecar,
    running_sidecars,
    unique,
)
from ordered_dev.harness.waiting import eventually
from sidecar.adapters.kafka import KafkaGateway
from sidecar.adapters.kafka.admin import PartitionInfo
from sidecar.config import KafkaSettings
from sidecar.core.errors import SidecarError
from sidecar.core.routing import partition_for_key
from tests.support.failure_load import local_servers

LOST = 1
"""The partition truncated below its boundary."""
INITIAL_COUNT = 2
TOPIC_CONFIGS = {"unclean.leader.election.enable": "true", "min.insync.replicas": "1"}
SERVE_BOUND_S = 60.0
"""How long the sidecar may take to serve the topic again after each fault: the first
acknowledged produce after the election, and the first delivery of a record written
after the confirmed change."""
ELECTION_WITHIN_S = 60.0
_SIDECAR = str(Path(sys.executable).with_name("sidecar"))


def keys_for(partition: int, counts: Sequence[int], how_many: int, prefix: str) -> list[str]:
    """``how_many`` keys that route to ``partition`` under each of ``counts``, as the
    sidecar routes a JSON key: by the bytes of its JSON text."""
    keys: list[str] = []
    index = 0
    while len(keys) < how_many:
        key = f"{prefix}-{index}"
        index += 1
        stored = json.dumps(key).encode()
        if all(partition_for_key(stored, INITIAL_COUNT, c) == partition for c in counts):
            keys.append(key)
    return keys


async def _write(
    sidecar: RunningSidecar, topic: str, keys: Sequence[str], tag: str, written: Counter[str]
) -> None:
    """One produce request, one record per key; every record must be acknowledged."""
    records = [{"key": key, "value": {"tag": tag, "key": key}} for key in keys]
    status, body = await sidecar.produce(topic, records)
    assert status == 200, body
    assert all(entry["error_code"] is None for entry in body["offsets"]), body
    written[tag] += len(keys)


async def _write_within(
    sidecar: RunningSidecar,
    topic: str,
    keys: Sequence[str],
    tag: str,
    written: Counter[str],
    within_s: float,
) -> tuple[float, list[str]]:
    """Retry one produce request until it is acknowledged; (seconds taken, refusals)."""
    began = time.monotonic()
    refusals: list[str] = []
    records = [{"key": key, "value": {"tag": tag, "key": key}} for key in keys]
    while True:
        status, body = await sidecar.produce(topic, records)
        failed = [e for e in body.get("offsets", []) if e["error_code"] is not None]
        if status == 200 and not failed:
            written[tag] += len(keys)
            return time.monotonic() - began, refusals
        reasons = {f"{e['error_code']} {e['error']}" for e in failed} or {str(body)}
        refusals.append(f"{status}: {'; '.join(sorted(reasons))}")
        assert time.monotonic() - began < within_s, (
            f"no produce acknowledged within {within_s:g} s: {refusals[-5:]}"
        )
        await asyncio.sleep(0.5)


async def _partition(gateway: KafkaGateway, topic: str, partition: int) -> PartitionInfo | None:
    """The partition as the cluster's metadata shows it now; None if it cannot be read."""
    try:
        return (await gateway.describe_partitions(topic))[partition]
    except SidecarError:
        return None


async def _until_partition(
    gateway: KafkaGateway,
    topic: str,
    holds: Callable[[PartitionInfo], bool],
    within_s: float,
    what: str,
) -> None:
    """Wait until partition ``LOST`` of ``topic``, as the metadata shows it, ``holds``."""

    async def now_holds() -> bool:
        info = await _partition(gateway, topic, LOST)
        return info is not None and holds(info)

    await eventually(now_holds, within_s, f"partition {LOST}: {what}")


async def _both_in_sync(gateway: KafkaGateway, bootstrap: str, topic: str) -> PartitionInfo:
    """Partition ``LOST`` once both its replicas are in sync and no transaction is open."""
    await _until_partition(gateway, topic, lambda now: len(now.in_sync) == 2, 30, "in sync")
    await eventually(
        lambda: _settled(gateway, bootstrap, topic, INITIAL_COUNT), 30, "no open transaction"
    )
    info = await _partition(gateway, topic, LOST)
    assert info is not None
    return info


async def _settled(gateway: KafkaGateway, bootstrap: str, topic: str, count: int) -> bool:
    """No transaction open in ``topic``: each partition's stable offset is its high
    watermark (every commit marker written, and replicated to the whole ISR).

    The gateway reads only stable offsets (read_committed), so the high watermarks come
    from a plain read_uncommitted consumer. Comparing the gateway with itself held at
    once, so a commit marker still on its way could leave an offset read next short."""
    try:
        stable = await gateway.stable_offsets(topic, count)
        ends = await asyncio.wait_for(_high_watermarks(bootstrap, topic, count), 10)
    except (SidecarError, KafkaError, TimeoutError):
        return False
    return [s.offset for s in stable] == ends


async def _high_watermarks(bootstrap: str, topic: str, count: int) -> list[int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_uncommitted")
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(count)]
        ends = await consumer.end_offsets(partitions)
        return [int(ends[tp]) for tp in partitions]
    finally:
        await consumer.stop()


async def _gauge(sidecar: RunningSidecar, topic: str) -> float:
    async with sidecar.http.get("/metrics") as response:
        text = await response.text()
    prefix = f'sidecar_truncated_boundaries{{topic="{topic}"}} '
    values = [float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)]
    assert values, f"no {prefix.strip()} sample"
    return values[0]


async def _confirm_from_the_command_line(url: str, topic: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        _SIDECAR,
        "topics",
        "--url",
        url,
        "--token",
        ADMIN_TOKEN,
        "confirm-truncation",
        topic,
        "--yes",
        env=dict(os.environ),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, output.decode()


@pytest.fixture
async def gateway(cluster: ClusterEndpoints) -> AsyncIterator[KafkaGateway]:
    gateway = KafkaGateway(
        KafkaSettings(bootstrap_servers=cluster.kafka_bootstrap, request_timeout_ms=5_000)
    )
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()


async def _restart_stopped(servers: ClusterServers, stopped: list[int]) -> None:
    """Start again whatever the test left stopped (later tests need every broker)."""
    for node in list(stopped):
        await asyncio.to_thread(servers.start_broker, node)
        stopped.remove(node)


async def test_a_boundary_lost_to_an_unclean_election_refuses_changes_until_confirmed(
    cluster: ClusterEndpoints, gateway: KafkaGateway
) -> None:
    servers = local_servers(cluster)
    if len(servers.node_ids()) < 3:
        pytest.skip("needs three brokers: one to keep while a leader and a follower stop")
    topic = unique("unclean")
    kept = keys_for(LOST, (2, 3), 4, "kept")
    lost = keys_for(LOST, (2, 3), 4, "lost")
    reused = keys_for(LOST, (2, 3), 4, "reused")
    stopped: list[int] = []
    written: Counter[str] = Counter()
    timings: dict[str, float] = {}
    began = time.monotonic()
    try:
        async with running_sidecars(cluster, 1) as (sidecar,):
            await sidecar.create_topic(
                topic, INITIAL_COUNT, replication_factor=2, configs=TOPIC_CONFIGS
            )
            await _write(sidecar, topic, kept, "kept", written)
            await _write(sidecar, topic, keys_for(0, (2,), 4, "other"), "other", written)

            info = await _both_in_sync(gateway, cluster.kafka_bootstrap, topic)
            leader = info.leader
            [follower] = [r for r in info.replicas if r != leader]
            reaches = (await gateway.end_offsets(topic, INITIAL_COUNT))[LOST]

            # 1-2: F stops; records are acknowledged by L alone.
            stopped.append(follower)
            await asyncio.to_thread(servers.stop_broker, follower)
            await _until_partition(
                gateway, topic, lambda now: now.in_sync == (leader,), 60, f"{follower} out of ISR"
            )
            for _ in range(3):
                await _write(sidecar, topic, lost, "lost", written)

            # 3: the boundary of generation 1 is placed above what F has.
            operation = await sidecar.change_count(topic, 3)
            assert operation["phase"] == "done", operation
            description = await sidecar.describe(topic)
            boundary, epoch = description["generations"][1]["boundaries"][LOST]
            assert isinstance(epoch, int), description["generations"]
            assert boundary > reaches, (boundary, reaches)
            await eventually(
                lambda: _settled(gateway, cluster.kafka_bootstrap, topic, 3),
                30,
                "no open transaction",
            )

            # 4: L stops, F comes back alone and is elected uncleanly.
            stopped.append(leader)
            await asyncio.to_thread(servers.stop_broker, leader)
            restarted = time.monotonic()
            await asyncio.to_thread(servers.start_broker, follower)
            stopped.remove(follower)

            await _until_partition(
                gateway, topic, lambda now: now.leader == follower, ELECTION_WITHIN_S, "election"
            )
            timings["election"] = time.monotonic() - restarted
            # The epoch of the boundary now ends where F's log ended: below the boundary.
            epoch_end = (await gateway.epoch_end_offsets(topic, {LOST: epoch}))[LOST]
            assert epoch_end is not None
            assert epoch_end.offset == reaches, (epoch_end, reaches)

            # 5: the sidecar writes again, and the log grows past the lost boundary. A
            # transactional producer that wrote the lost records is refused by F (its
            # sequence numbers run ahead of what F has): that request fails, nothing is
            # appended, and the sidecar replaces the producer.
            timings["first produce"], refusals = await _write_within(
                sidecar, topic, reused, "reused", written, SERVE_BOUND_S
            )
            timings["slowest produce"] = timings["first produce"]
            while (await gateway.end_offsets(topic, 3))[LOST] <= boundary:
                took, refused = await _write_within(
                    sidecar, topic, reused, "reused", written, SERVE_BOUND_S
                )
                timings["slowest produce"] = max(timings["slowest produce"], took)
                refusals += refused

            # 6: L comes back, truncates its log to where F's began and catches up: the
            # records acknowledged in step 2 are then on no replica.
            await asyncio.to_thread(servers.start_broker, leader)
            stopped.remove(leader)

            await _until_partition(
                gateway, topic, lambda now: leader in now.in_sync, 60, f"{leader} back in ISR"
            )

            status, body = await sidecar.admin(
                "POST", f"/admin/topics/{topic}/partition-count", {"count": 4}
            )
            assert (status, body["error_code"]) == (409, 40950), body
            assert (
                f"partition {LOST} (generation 1, boundary {boundary}, log reaches {reaches})"
                in body["message"]
            ), body
            assert await _gauge(sidecar, topic) == 1
            assert (await sidecar.describe(topic))["undeleted_count"] == 3

            code, out = await _confirm_from_the_command_line(sidecar.url, topic)
            assert code == 0, out
            assert (
                f"{topic}: confirmed the loss below boundary {boundary} of partition {LOST} "
                f"(generation 1, leader epoch {epoch}; the log now reaches {reaches})"
            ) in out, out
            assert await _gauge(sidecar, topic) == 0
            status, body = await sidecar.admin(
                "POST", f"/admin/topics/{topic}/confirm-truncation", {}
            )
            assert (status, body["error_code"]) == (409, 40951), body

            operation = await sidecar.change_count(topic, 4)
            assert operation["phase"] == "done", operation
            assert await _gauge(sidecar, topic) == 0

            # The topic is served: a record through every partition reaches a consumer.
            final = [keys_for(p, (4,), 1, f"final{p}")[0] for p in range(4)]
            await _write(sidecar, topic, final, "final", written)
            timings["delivery"], delivered = await _consume_until(sidecar, topic, written)
            # Acknowledged, then truncated: nothing delivers them (no consumer-side check).
            assert delivered["lost"] == 0, (delivered, written)
            async with sidecar.http.get("/readyz") as response:
                assert response.status == 200
    finally:
        await _restart_stopped(servers, stopped)
    print(
        f"leader {leader}, follower {follower}: boundary {boundary} (epoch {epoch}) lost, "
        f"log reached {reaches}; election {timings['election']:.1f} s after F started; "
        f"after it, first produce {timings['first produce']:.1f} s, slowest "
        f"{timings['slowest produce']:.1f} s ({len(refusals)} refused: {refusals[:2]}); "
        f"delivery {timings['delivery']:.1f} s; {time.monotonic() - began:.0f} s in all"
    )


async def _consume_until(
    sidecar: RunningSidecar, topic: str, written: Counter[str]
) -> tuple[float, Counter[str]]:
    """Read ``topic`` from the start through a consumer group of ``sidecar`` until
    every record written (per tag) except the lost ones arrived, within
    ``SERVE_BOUND_S``; (seconds taken, records delivered per tag)."""
    began = time.monotonic()
    wanted = {tag: count for tag, count in written.items() if tag != "lost"}
    # Committing: the gate lets a new partition's records through once the group has
    # committed its parent's up to the boundary.
    consumer = await create_consumer(
        sidecar,
        unique("group"),
        "reader",
        **{"auto.commit.enable": "true", "consumer.request.timeout.ms": 500},
    )
    counts: Counter[str] = Counter()
    try:
        await consumer.subscribe(topic)
        while any(counts[tag] < count for tag, count in wanted.items()):
            assert time.monotonic() - began < SERVE_BOUND_S, f"delivered {counts} of {written}"
            records, events = await consumer.poll(timeout_ms=500)
            for record in records:
                _, value = decoded(record)
                assert value is not None
                counts[json.loads(value)["tag"]] += 1
            acknowledged = [event["event_id"] for event in events if "event_id" in event]
            if acknowledged:
                await consumer.ack(*acknowledged)
    finally:
        await consumer.delete()
    return time.monotonic() - began, counts


async def _counter(sidecar: RunningSidecar, name: str, topic: str) -> float:
    """The sum of ``name``'s samples of ``topic`` (any group label)."""
    async with sidecar.http.get("/metrics") as response:
        text = await response.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and f'topic="{topic}"' in line
    )


async def test_a_consumer_past_an_unclean_election_reads_again_from_the_divergence(
    cluster: ClusterEndpoints, gateway: KafkaGateway
) -> None:
    servers = local_servers(cluster)
    if len(servers.node_ids()) < 3:
        pytest.skip("needs three brokers: one to keep while a leader and a follower stop")
    topic = unique("unclean-read")
    kept = keys_for(LOST, (2,), 4, "kept")
    lost = keys_for(LOST, (2,), 4, "lost")
    reused = keys_for(LOST, (2,), 4, "reused")
    stopped: list[int] = []
    written: Counter[str] = Counter()
    delivered: Counter[str] = Counter()
    told: list[dict[str, object]] = []
    """The typed items of the records responses, each with how many records written
    after the election had been delivered before it."""
    began = time.monotonic()
    try:
        async with running_sidecars(cluster, 1) as (sidecar,):
            await sidecar.create_topic(
                topic, INITIAL_COUNT, replication_factor=2, configs=TOPIC_CONFIGS
            )
            # Assigned, not subscribed: no group coordinator (which may live on a broker
            # the test stops) can rebalance the reading away while the leaders change.
            consumer = await create_consumer(
                sidecar, unique("group"), "reader", **{"consumer.request.timeout.ms": 500}
            )

            async def read_until(wanted: dict[str, int], within_s: float) -> None:
                await _read_until(consumer, delivered, told, wanted, within_s)

            try:
                await consumer.assign((topic, LOST))
                await _write(sidecar, topic, kept, "kept", written)

                info = await _both_in_sync(gateway, cluster.kafka_bootstrap, topic)
                leader = info.leader
                [follower] = [r for r in info.replicas if r != leader]
                reaches = (await gateway.end_offsets(topic, INITIAL_COUNT))[LOST]

                # F stops; records acknowledged by L alone are read by the instance.
                stopped.append(follower)
                await asyncio.to_thread(servers.stop_broker, follower)
                await _until_partition(
                    gateway,
                    topic,
                    lambda now: now.in_sync == (leader,),
                    60,
                    f"{follower} out of ISR",
                )
                for _ in range(3):
                    await _write(sidecar, topic, lost, "lost", written)
                await read_until(dict(written), SERVE_BOUND_S)
                await eventually(
                    lambda: _settled(gateway, cluster.kafka_bootstrap, topic, INITIAL_COUNT),
                    30,
                    "no open transaction",
                )
                # Where the instance stands: past the last commit marker of what it read.
                position = (await gateway.end_offsets(topic, INITIAL_COUNT))[LOST]
                assert await _counter(sidecar, "sidecar_consumer_truncations_total", topic) == 0
                # Another group reads as much, commits it and goes away: its next instance
                # starts from that commit, with the commit's leader epoch to validate.
                committing = unique("group")
                first = await create_consumer(
                    sidecar, committing, "first", **{"consumer.request.timeout.ms": 500}
                )
                await first.assign((topic, LOST))
                await _read_until(first, Counter(), [], dict(written), SERVE_BOUND_S)
                status, body = await first.commit()
                assert status in (200, 204), body
                await first.delete()

                # L stops, F comes back alone and is elected uncleanly; the log now ends
                # below the instance's position.
                stopped.append(leader)
                await asyncio.to_thread(servers.stop_broker, leader)
                await asyncio.to_thread(servers.start_broker, follower)
                stopped.remove(follower)

                await _until_partition(
                    gateway,
                    topic,
                    lambda now: now.leader == follower,
                    ELECTION_WITHIN_S,
                    "election",
                )
                # The new leader's high watermark starts from its own checkpoint and
                # reaches its log end a moment after the election.
                ends: list[int] = []

                async def log_ends_where_f_stopped() -> bool:
                    ends.append((await gateway.end_offsets(topic, INITIAL_COUNT))[LOST])
                    return ends[-1] == reaches

                try:
                    await eventually(log_ends_where_f_stopped, 30, f"{LOST} ending at {reaches}")
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; it ended at {sorted(set(ends))}") from None

                # F's log grows past where the instance stood, at the reused offsets.
                while (await gateway.end_offsets(topic, INITIAL_COUNT))[LOST] <= position:
                    await _write_within(sidecar, topic, reused, "reused", written, SERVE_BOUND_S)
                elected = time.monotonic()
                await read_until({"reused": written["reused"]}, SERVE_BOUND_S)
                took = time.monotonic() - elected
                assert delivered["reused"] == written["reused"], (delivered, written)
                truncations = await _counter(sidecar, "sidecar_consumer_truncations_total", topic)
                assert truncations == 1
                truncated = await _counter(
                    sidecar, "sidecar_consumer_truncated_records_total", topic
                )
                # Offsets read that the log no longer has: the records and the markers
                # among them (the marker after the last record read is not counted).
                assert written["lost"] <= truncated < position - reaches, (truncated, position)
                # The app of a managed topic is told, before anything read again.
                assert [e for e in told if e["type"] == "log_truncated"] == [
                    {
                        "type": "log_truncated",
                        "topic": topic,
                        "partition": LOST,
                        "offset": reaches,
                        "position": position - 1,
                        "leader_epoch": info.leader_epoch,
                        "lost": truncated,
                        "after_reused": 0,
                    }
                ], told

                # The committing group's next instance: from the commit, moved back to
                # the divergence before anything is delivered, nothing skipped. Where the
                # commit falls in the new log (a record, a marker, an aborted batch of a
                # refused producer, or past its end) varies from run to run; each is
                # validated before anything is fetched from it.
                restarted = await create_consumer(
                    sidecar, committing, "restarted", **{"consumer.request.timeout.ms": 500}
                )
                again: Counter[str] = Counter()
                try:
                    await restarted.assign((topic, LOST))
                    wanted = {"reused": written["reused"]}
                    await _read_until(restarted, again, [], wanted, SERVE_BOUND_S)
                finally:
                    await restarted.delete()
                assert again == Counter(wanted), again
                assert await _counter(sidecar, "sidecar_consumer_truncations_total", topic) == 2
            finally:
                await consumer.delete()
    finally:
        await _restart_stopped(servers, stopped)
    print(
        f"leader {leader}, follower {follower}: log reached {reaches}; {written['lost']} "
        f"read, then lost; every record after the election delivered {took:.1f} s after "
        f"the log passed the old position; {time.monotonic() - began:.0f} s in all"
    )


async def _read_until(
    consumer: RestConsumer,
    delivered: Counter[str],
    told: list[dict[str, object]],
    wanted: dict[str, int],
    within_s: float,
) -> None:
    """Poll ``consumer`` until ``delivered`` (records per tag) holds ``wanted``; each
    typed item of a response goes to ``told`` with how many records written after the
    election had been delivered before it (a response's notices come before its
    records)."""
    deadline = time.monotonic() + within_s
    while any(delivered[tag] < count for tag, count in wanted.items()):
        assert time.monotonic() < deadline, f"delivered {delivered} of {wanted}"
        records, events = await consumer.poll(timeout_ms=500)
        told.extend(event | {"after_reused": delivered["reused"]} for event in events)
        for record in records:
            _, value = decoded(record)
            assert value is not None
            delivered[json.loads(value)["tag"]] += 1
