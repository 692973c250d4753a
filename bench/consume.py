"""Consume throughput: REST consumers through the sidecar against a direct aiokafka consumer.

Run from the repository root::

    .venv/bin/python -m bench.consume [--quick] [--profile DIR]

The same records (keyed, 16-byte keys, values of 100 B and of 1 KiB) are written to two
topics of 6 partitions, replication factor 3: a plain topic by a direct producer and a
managed topic through the sidecar (so its records carry the sidecar's headers, as every
record of a managed topic does). Then each is read to its end, alternating, each run by
a fresh consumer group:

* **direct**: one ``AIOKafkaConsumer`` in a group (auto-commit on), in the benchmark's
  own process, reading the plain topic;
* **sidecar, 1 instance**: one REST consumer instance (binary format, auto-commit on)
  subscribed to the managed topic, read with ``GET records?max_bytes=...`` in a loop;
* **sidecar, 2 instances**: two instances of one group on the same sidecar, read in
  parallel (the group splits the partitions between them);
* **sidecar, unmanaged topic**: one REST instance reading the plain topic, which the
  sidecar passes through without gating: the sidecar's own pass-through cost, against
  which the ordered path is judged (managed / unmanaged).
* **sidecar, unmanaged topic of managed-like records**: the same, reading a third topic
  the sidecar does not manage, written directly in transactions of ``ALIKE_TRANSACTION``
  records that each carry the ``ordered.stamp`` header a managed record carries. Its
  records cost what a managed topic's cost to fetch, decode and encode, without the
  gate: managed / this row is what the ordered path itself costs, and this row /
  unmanaged what the records' headers and transactions cost.
* **sidecar, 1 instance, ``record_headers: all``**: the managed topic again, read by an
  instance that asks for the sidecar's ``ordered.stamp`` header in its responses too
  (the other rows take the default, the app's own headers only): what reading the
  routing stamp costs an app.

Each run starts once the group has its assignment (the join is not timed) and ends
when the last record has arrived; records/s is the record count over that time. The
REST client parses each response's JSON (it must, to count records and to find
hand-off events) but does not base64-decode the values.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.harness import (
    BINARY_V2,
    MIB,
    RestConsumer,
    create_topic,
    profiled,
    sidecars,
)
from bench.machine import CpuMeter, CpuShares, cluster_pids, cores, delete_root, kafka_line
from bench.produce import Sidecar
from bench.report import markdown_table, measure_and_write
from ordered_dev.devcluster.provider import provide_cluster
from sidecar.core.placement import sidecar_headers

PARTITIONS = 6
KEY_BYTES = 16
FILL_BATCH = 500
FILL_CONNECTIONS = 4
ALIKE_TRANSACTION = 1_000
"""Records per transaction in the managed-like topic: about what the sidecar commits at
once while it is being filled (4 connections x 500-record requests)."""
RUN_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class Plan:
    sizes: tuple[int, ...]
    records: dict[int, int]
    rounds: int
    max_bytes: int


FULL = Plan(sizes=(100, 1024), records={100: 200_000, 1024: 200_000}, rounds=4, max_bytes=4 * MIB)
QUICK = Plan(sizes=(100, 1024), records={100: 20_000, 1024: 10_000}, rounds=1, max_bytes=4 * MIB)

DIRECT, SIDECAR_ONE, SIDECAR_TWO = "direct", "sidecar-1", "sidecar-2"
UNMANAGED = "sidecar-unmanaged"
ALIKE = "sidecar-unmanaged-alike"
ALL_HEADERS = "sidecar-all-headers"
PATHS = (DIRECT, UNMANAGED, ALIKE, SIDECAR_ONE, ALL_HEADERS, SIDECAR_TWO)
LABELS = {
    DIRECT: "direct AIOKafkaConsumer, 1 member",
    UNMANAGED: "sidecar, 1 REST instance, unmanaged topic",
    ALIKE: "sidecar, 1 REST instance, unmanaged topic of managed-like records",
    SIDECAR_ONE: "sidecar, 1 REST instance",
    ALL_HEADERS: "sidecar, 1 REST instance, record_headers all",
    SIDECAR_TWO: "sidecar, 2 REST instances (one sidecar)",
}


@dataclass(frozen=True, slots=True)
class ReadRun:
    records: int
    seconds: float
    join_seconds: float
    responses: int
    cpu: CpuShares

    @property
    def per_second(self) -> float:
        return self.records / self.seconds


# Filling ---------------------------------------------------------------------------------


def make_records(size: int, count: int) -> list[tuple[bytes, bytes]]:
    """``count`` records: distinct 16-byte keys, values of ``size`` random bytes. The
    values repeat every 1 000 records: building 200 MiB of randomness is not the point."""
    rng = random.Random(size)
    values = [rng.randbytes(size) for _ in range(1_000)]
    return [(f"key-{i:012d}".encode(), values[i % len(values)]) for i in range(count)]


async def fill_direct(bootstrap: str, topic: str, records: Sequence[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        futures = []
        for key, value in records:
            futures.append(await producer.send(topic, value=value, key=key))
            if len(futures) >= 4_000:
                await asyncio.gather(*futures)
                futures.clear()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def fill_alike(bootstrap: str, topic: str, records: Sequence[tuple[bytes, bytes]]) -> None:
    """Write ``records`` as the sidecar would, without the sidecar: in transactions, each
    record with the ``ordered.stamp`` header."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"bench-alike-{uuid.uuid4().hex[:8]}"
    )
    await producer.start()
    try:
        for start in range(0, len(records), ALIKE_TRANSACTION):
            async with producer.transaction():
                for sequence, (key, value) in enumerate(
                    records[start : start + ALIKE_TRANSACTION], start
                ):
                    headers = sidecar_headers(1, PARTITIONS, "bench-alike", sequence)
                    await producer.send(topic, value=value, key=key, headers=headers)
    finally:
        await producer.stop()


async def fill_sidecar(
    sidecar: Sidecar, topic: str, records: Sequence[tuple[bytes, bytes]]
) -> None:
    chunks = [records[i : i + FILL_BATCH] for i in range(0, len(records), FILL_BATCH)]
    queue: asyncio.Queue[Sequence[tuple[bytes, bytes]]] = asyncio.Queue()
    for chunk in chunks:
        queue.put_nowait(chunk)

    async def worker() -> None:
        while not queue.empty():
            chunk = queue.get_nowait()
            encoded = [
                {"key": base64.b64encode(k).decode(), "value": base64.b64encode(v).decode()}
                for k, v in chunk
            ]
            async with sidecar.http.post(
                f"/topics/{topic}",
                data=json.dumps({"records": encoded}),
                headers={"Content-Type": BINARY_V2},
            ) as response:
                answer = await response.json(content_type=None)
            failed = [o for o in answer.get("offsets", []) if o.get("error_code") is not None]
            if response.status != 200 or failed:
                raise RuntimeError(f"filling {topic} failed: {response.status} {answer}")

    await asyncio.gather(*(worker() for _ in range(FILL_CONNECTIONS)))


# Reading ---------------------------------------------------------------------------------


async def read_direct(
    bootstrap: str, topic: str, expected: int, meter_pids: tuple[list[int], list[int]]
) -> ReadRun:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"bench-direct-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        enable_auto_commit=True,
    )
    joined_from = time.monotonic()
    await consumer.start()
    try:
        while len(consumer.assignment()) < PARTITIONS:
            await asyncio.sleep(0.01)
            if time.monotonic() - joined_from > RUN_TIMEOUT_S:
                raise RuntimeError("the direct consumer never got its assignment")
        join_seconds = time.monotonic() - joined_from
        meter = CpuMeter(*meter_pids)
        began = time.monotonic()
        seen = 0
        batches = 0
        while seen < expected:
            got = await consumer.getmany(timeout_ms=1000)
            batches += 1
            seen += sum(len(records) for records in got.values())
            if time.monotonic() - began > RUN_TIMEOUT_S:
                raise RuntimeError(f"direct read stalled at {seen} of {expected}")
        seconds = time.monotonic() - began
        return ReadRun(seen, seconds, join_seconds, batches, meter.read())
    finally:
        await consumer.stop()


async def read_sidecar(
    sidecar: Sidecar,
    topic: str,
    expected: int,
    instances: int,
    max_bytes: int,
    meter_pids: tuple[list[int], list[int]],
    record_headers: str | None = None,
) -> ReadRun:
    group = f"bench-rest-{uuid.uuid4().hex[:8]}"
    joined_from = time.monotonic()
    consumers = [
        await RestConsumer.create(
            sidecar,
            group,
            f"c{index}",
            **{
                "auto.commit.enable": "true",
                "consumer.request.timeout.ms": 1000,
                # None: the sidecar's default.
                **({} if record_headers is None else {"record_headers": record_headers}),
            },
        )
        for index in range(instances)
    ]
    try:
        for consumer in consumers:
            await consumer.subscribe(topic)
        await _until_assigned(consumers, topic)
        join_seconds = time.monotonic() - joined_from
        seen: set[tuple[int, int]] = set()
        responses = 0
        done = asyncio.Event()
        meter = CpuMeter(*meter_pids)
        began = time.monotonic()

        async def read(consumer: RestConsumer) -> None:
            nonlocal responses
            while not done.is_set():
                poll = await consumer.poll(max_bytes)
                responses += 1
                if poll.events:  # none expected: no change happens while reading
                    await consumer.ack(poll.events)
                seen.update((record["partition"], record["offset"]) for record in poll.records)
                if len(seen) >= expected:
                    done.set()
                if time.monotonic() - began > RUN_TIMEOUT_S:
                    raise RuntimeError(f"sidecar read stalled at {len(seen)} of {expected}")

        await asyncio.gather(*(read(consumer) for consumer in consumers))
        seconds = time.monotonic() - began
        return ReadRun(len(seen), seconds, join_seconds, responses, meter.read())
    finally:
        for consumer in consumers:
            await consumer.delete()


async def _until_assigned(consumers: Sequence[RestConsumer], topic: str) -> None:
    """Wait until the group's instances together hold every partition, each once."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        each = [await consumer.assignment() for consumer in consumers]
        held = sorted(pair for pairs in each for pair in pairs)
        if all(each) and held == [(topic, p) for p in range(PARTITIONS)]:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the group never settled: {held}")
        await asyncio.sleep(0.05)


# The run ---------------------------------------------------------------------------------


@dataclass
class SizeResult:
    size: int
    records: int
    runs: dict[str, list[ReadRun]] = field(default_factory=lambda: {p: [] for p in PATHS})


async def run(plan: Plan, profile: Path | None, log: IO[bytes]) -> tuple[list[SizeResult], str]:
    suffix = uuid.uuid4().hex[:8]
    root = f"/bench-consume-{suffix}"
    created: list[str] = []
    results: list[SizeResult] = []
    with provide_cluster() as cluster:
        kafka = kafka_line(cluster)
        print(f"cluster: Kafka {kafka}, bootstrap {cluster.kafka_bootstrap}", flush=True)
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
        await admin.start()
        try:
            async with sidecars(cluster, root, 1, log, FILL_CONNECTIONS + 2) as (sidecar,):
                pids = ([sidecar.pid], cluster_pids(cluster))
                for size in plan.sizes:
                    count = plan.records[size]
                    plain = f"bench-consume-direct-{size}-{suffix}"
                    alike = f"bench-consume-alike-{size}-{suffix}"
                    managed = f"bench-consume-sidecar-{size}-{suffix}"
                    await admin.create_topics(
                        [
                            NewTopic(plain, PARTITIONS, cluster.replication_factor),
                            NewTopic(alike, PARTITIONS, cluster.replication_factor),
                        ]
                    )
                    created += [plain, alike]
                    await create_topic(sidecar, managed, PARTITIONS, cluster.replication_factor)
                    created.append(managed)
                    records = make_records(size, count)
                    print(f"{size} B: filling the topics with {count:,} records", flush=True)
                    began = time.monotonic()
                    await fill_direct(cluster.kafka_bootstrap, plain, records)
                    await fill_alike(cluster.kafka_bootstrap, alike, records)
                    await fill_sidecar(sidecar, managed, records)
                    print(f"  filled in {time.monotonic() - began:.0f} s", flush=True)
                    result = SizeResult(size, count)
                    results.append(result)
                    for round_index in range(plan.rounds):
                        order = list(PATHS)
                        if round_index % 2:
                            order.reverse()
                        for path in order:
                            if path == DIRECT:
                                read = await read_direct(
                                    cluster.kafka_bootstrap, plain, count, pids
                                )
                            else:
                                instances = 2 if path == SIDECAR_TWO else 1
                                topic = {UNMANAGED: plain, ALIKE: alike}.get(path, managed)
                                name = f"{path}-{size}B-{round_index}"
                                async with profiled({name: sidecar.pid}, profile):
                                    read = await read_sidecar(
                                        sidecar,
                                        topic,
                                        count,
                                        instances,
                                        plan.max_bytes,
                                        pids,
                                        "all" if path == ALL_HEADERS else None,
                                    )
                            result.runs[path].append(read)
                            print(
                                f"  {LABELS[path]}: {read.per_second:,.0f} records/s "
                                f"({read.seconds:.1f} s, {read.responses} responses)",
                                flush=True,
                            )
        finally:
            if created:
                try:
                    await admin.delete_topics(created)
                except Exception as exc:  # cleanup only
                    print(f"could not delete topics: {exc!r}")
            await admin.close()
            delete_root(cluster.zookeeper_hosts, root)
    return results, kafka


# Rendering -------------------------------------------------------------------------------


def _ratio(top: Sequence[ReadRun], bottom: Sequence[ReadRun]) -> str:
    """Median (min-max) of the per-round ratios (a round's runs ran back to back)."""
    ratios = [t.per_second / b.per_second for t, b in zip(top, bottom, strict=True)]
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}"
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def _mean_cpu(runs: Sequence[ReadRun], which: str) -> str:
    values: list[Any] = [getattr(run.cpu, which) for run in runs]
    if any(value is None for value in values):
        return "-"
    return f"{statistics.fmean(values):.0f} %"


def render(results: Sequence[SizeResult], plan: Plan) -> list[str]:
    headline = []
    rows = []
    for result in results:
        runs = result.runs
        headline.append(
            [
                f"{result.size} B",
                _ratio(runs[SIDECAR_ONE], runs[UNMANAGED]),
                _ratio(runs[ALL_HEADERS], runs[UNMANAGED]),
                _ratio(runs[SIDECAR_ONE], runs[ALIKE]),
                _ratio(runs[ALIKE], runs[UNMANAGED]),
                _ratio(runs[UNMANAGED], runs[DIRECT]),
                _ratio(runs[SIDECAR_ONE], runs[DIRECT]),
                _ratio(runs[SIDECAR_TWO], runs[DIRECT]),
            ]
        )
        for path in PATHS:
            rate = statistics.median(run.per_second for run in runs[path])
            rows.append(
                [
                    f"{result.size} B",
                    LABELS[path],
                    f"{rate:,.0f}",
                    f"{rate * result.size / MIB:.2f}",
                    ", ".join(f"{run.per_second:,.0f}" for run in runs[path]),
                    f"{statistics.median(run.records / run.responses for run in runs[path]):,.0f}",
                    f"{statistics.median(run.join_seconds for run in runs[path]):.1f}",
                    _mean_cpu(runs[path], "load_generator"),
                    _mean_cpu(runs[path], "sidecars"),
                    _mean_cpu(runs[path], "cluster"),
                    _mean_cpu(runs[path], "rest"),
                ]
            )
    counts = ", ".join(f"{r.records:,} records of {r.size} B" for r in results)
    return [
        "## Headline: records/s through the sidecar against its own pass-through and direct "
        "aiokafka, same run",
        "",
        *markdown_table(
            [
                "record size",
                "managed / unmanaged (sidecar, 1 instance)",
                "managed, record_headers all / unmanaged",
                "managed / unmanaged of managed-like records (the gate)",
                "unmanaged of managed-like records / unmanaged (headers, transactions)",
                "unmanaged (sidecar) / direct",
                "sidecar 1 instance / direct",
                "sidecar 2 instances / direct",
            ],
            headline,
        ),
        "",
        "Median (min-max) over the rounds of the ratio within a round.",
        "",
        f"## Reading a topic to its end ({PARTITIONS} partitions, RF 3; {counts}; "
        f"{plan.rounds} round(s), order alternating, a fresh group each run)",
        "",
        f"REST reads are `GET records?max_bytes={plan.max_bytes}` (binary format, auto-commit "
        "on). 'records per response' is per `GET records` (sidecar) or per `getmany()` "
        "(direct). Join: from creating the consumer(s) to the group's assignment covering "
        "every partition (not in the rate). CPU is the mean over the runs in % of one core "
        f"(the machine has {cores()} cores, {cores() * 100} %).",
        "",
        *markdown_table(
            [
                "record size",
                "path",
                "records/s (median)",
                "payload MiB/s",
                "each round",
                "records per response",
                "join s",
                "load gen CPU",
                "sidecar CPU",
                "cluster CPU",
                "rest of machine",
            ],
            rows,
        ),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small topics, one round")
    parser.add_argument(
        "--profile", type=Path, help="record the sidecar's reads with py-spy (raw stacks) into DIR"
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    measure_and_write(
        "consume",
        "Consume benchmark",
        lambda log: run(plan, args.profile, log),
        lambda results: render(results, plan),
    )


if __name__ == "__main__":
    main()
