"""What compacting the generation log saves where a long log costs: reading the topic
at start, and the gate's first decisions on a newly read log.

Run from the repository root::

    .venv/bin/python -m bench.compaction [--lengths 10 1000 10000] [--kept 10]
                                         [--repeats 5]

The dev cluster's ZooKeeper (``provide_cluster()``; Kafka is not used). For each log
length (changes of a topic of 2 initial partitions to a random count in [2, 12], as
``bench.log_length`` makes them), the log is written under a fresh ZooKeeper root as
the sidecars store it (topic node, one node per generation, partitions node), then,
compaction off, then on:

* **read at start**: ``MetadataStore.read_topic`` by a store that has read nothing yet
  (a sidecar starting: every generation node is read once), best of ``--repeats``,
  each with a new store (connecting is not counted);
* **first gate decisions**: on that log, as read, the gate's waits of every partition's
  newest generation (``waits_into``) and every partition's revocation points: what
  the consume path computes once per newly read log before its first decision;
* **one decision**: ``waits_into`` of one partition's newest generation asked again on
  the same log (what every later decision costs; it is cached per log).

"On" is the log after retention removed the records of every generation but the
last ``kept`` (each partition's log start at the boundary of the oldest one kept):
folded by one pass of the sidecar's ``Compactor`` given those log starts and no
consumer group (multi-ops of 1,000 generations, ``changes.compaction_batch``), timed
too ("compacting": reading the topic, deciding, folding and writing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from kazoo.client import KazooClient

from bench.log_length import make_log
from bench.report import command_line, machine_lines, markdown_table, write_result
from ordered_dev.devcluster.provider import provide_cluster
from sidecar.adapters.zookeeper import MetadataStore
from sidecar.core.compaction import compact, foldable_count
from sidecar.core.gate import waits_into
from sidecar.core.generations import GenerationLog, PartitionMode
from sidecar.core.handoff import revocation_points
from sidecar.core.serialization import config_to_json, generation_to_json
from sidecar.core.topics import TopicConfig
from sidecar.metrics import SidecarMetrics
from sidecar.service.compaction import Compactor

LENGTHS = (10, 1_000, 10_000)
KEPT = 10
BATCH = 1_000
WRITE_BATCH = 500
TOPIC = "bench"


@dataclass(frozen=True, slots=True)
class Row:
    changes: int
    compacted: bool
    generations_kept: int
    read_ms: float
    first_decisions_ms: float
    decision_us: float
    compaction_ms: float | None


def write_log(hosts: str, root: str, log: GenerationLog) -> None:
    """``log`` stored under ``root`` as ``Topics.create_topic`` and the commits leave it."""
    client = KazooClient(hosts=hosts)
    client.start()
    try:
        topic = f"{root}/topics/{TOPIC}"
        config = TopicConfig(TOPIC, log.initial_count, 1)
        head = {"config": config_to_json(config), "current_generation": log.current.number}
        client.ensure_path(f"{root}/ops")
        client.ensure_path(f"{root}/locks")
        client.ensure_path(f"{topic}/generations")
        client.set(topic, json.dumps(head).encode())
        modes = [PartitionMode.READ_WRITE.value] * log.current.physical_count
        partitions = {"modes": modes, "delete_after": [None] * len(modes)}
        client.create(f"{topic}/partitions", json.dumps(partitions).encode())
        generations = list(log.generations)
        for start in range(0, len(generations), WRITE_BATCH):
            transaction = client.transaction()
            for generation in generations[start : start + WRITE_BATCH]:
                data = json.dumps(generation_to_json(generation)).encode()
                transaction.create(f"{topic}/generations/{generation.number:010d}", data)
            results = transaction.commit()
            assert not any(isinstance(r, Exception) for r in results), results[:3]
    finally:
        client.stop()
        client.close()


async def best_ms(work: Callable[[], Awaitable[object]], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        await work()
        times.append(time.perf_counter() - began)
    return min(times) * 1000


def fresh(log: GenerationLog) -> GenerationLog:
    """The same log in a new object, its derived caches empty (a newly read log)."""
    return GenerationLog(log.initial_count, log.generations, log.folded_waits)


def gate_costs(log: GenerationLog, repeats: int) -> tuple[float, float]:
    """(first decisions on a fresh log in ms, one decision on a log that made them in µs)."""
    partitions = range(log.current.physical_count)
    current = log.current.number
    firsts = []
    for _ in range(repeats):
        began = time.perf_counter()
        now = fresh(log)
        for partition in partitions:
            waits_into(now, partition, current)
            revocation_points(now, partition)
        firsts.append(time.perf_counter() - began)
    warm = fresh(log)
    for partition in partitions:
        waits_into(warm, partition, current)
    asks = 10_000
    rounds = []
    for _ in range(repeats):
        began = time.perf_counter()
        for index in range(asks):
            waits_into(warm, index % len(partitions), current)
        rounds.append(time.perf_counter() - began)
    return min(firsts) * 1000, min(rounds) / asks * 1e6


async def read_ms(hosts: str, root: str, expected: GenerationLog, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        store = MetadataStore(hosts, root=root)
        await store.start()
        try:
            began = time.perf_counter()
            state = await store.read_topic(TOPIC)
            times.append(time.perf_counter() - began)
        finally:
            await store.stop()
        assert state.log == expected
    return min(times) * 1000


class _LogStarts:
    """Kafka as the pass asks it: the log starts retention left; no group has committed."""

    def __init__(self, starts: list[int]) -> None:
        self.starts = starts

    async def log_start_offsets(self, topic: str, count: int) -> list[int]:
        return self.starts[:count]

    async def committed_offsets(self, group: str, topic: str, count: int) -> dict[int, int]:
        return {}


async def compact_stored(hosts: str, root: str, starts: list[int]) -> tuple[float, int]:
    """One compaction pass (``Compactor``) over the stored log: its time in ms, and the
    first generation it left."""
    store = MetadataStore(hosts, root=root)
    await store.start()
    try:
        compactor = Compactor("bench", store, _LogStarts(starts), SidecarMetrics(), batch=BATCH)
        began = time.perf_counter()
        done = await compactor.compact(TOPIC, lock_timeout_s=10.0)
        return (time.perf_counter() - began) * 1000, done.first_generation
    finally:
        await store.stop()


async def measure(hosts: str, changes: int, kept: int, repeats: int) -> list[Row]:
    root = f"/bench-compaction-{uuid.uuid4().hex[:8]}"
    log = make_log(changes)
    await asyncio.to_thread(write_log, hosts, root, log)
    rows = []
    first_ms, decision_us = gate_costs(log, repeats)
    rows.append(
        Row(
            changes,
            False,
            len(log.generations),
            await read_ms(hosts, root, log, repeats),
            first_ms,
            decision_us,
            None,
        )
    )
    gone_before = log[max(0, log.current.number - kept + 1)]
    starts = [b.offset for b in gone_before.boundaries]
    starts += [0] * (log.current.physical_count - len(starts))
    compaction, first = await compact_stored(hosts, root, starts)
    assert first == foldable_count(log, dict(enumerate(starts)), groups=[])
    compacted = compact(log, first)
    first_ms, decision_us = gate_costs(compacted, repeats)
    rows.append(
        Row(
            changes,
            True,
            len(compacted.generations),
            await read_ms(hosts, root, compacted, repeats),
            first_ms,
            decision_us,
            compaction,
        )
    )
    return rows


def render(rows: Sequence[Row], kept: int, repeats: int) -> list[str]:
    table = [
        [
            f"{row.changes:,}",
            "on" if row.compacted else "off",
            f"{row.generations_kept:,}",
            f"{row.read_ms:,.1f}",
            f"{row.first_decisions_ms:,.2f}",
            f"{row.decision_us:.2f}",
            "-" if row.compaction_ms is None else f"{row.compaction_ms:,.0f}",
        ]
        for row in rows
    ]
    base = {row.compacted: row for row in rows if row.changes == min(r.changes for r in rows)}
    ratios = [
        f"- {row.changes:,} changes, compaction {'on' if row.compacted else 'off'}: read at "
        f"start {row.read_ms / base[False].read_ms:.1f} times, first gate decisions "
        f"{row.first_decisions_ms / base[False].first_decisions_ms:.1f} times, one decision "
        f"{row.decision_us / base[False].decision_us:.1f} times the "
        f"{base[False].changes}-change log's"
        for row in rows
        if row.changes != base[False].changes
    ]
    return [
        f"Retention keeps the records of the last {kept} generations; best of {repeats}.",
        "",
        *markdown_table(
            [
                "changes",
                "compaction",
                "generations in the log",
                "read at start (ms)",
                "first gate decisions (ms)",
                "one decision (µs)",
                "compacting (ms)",
            ],
            table,
        ),
        "",
        *ratios,
    ]


async def run(lengths: Sequence[int], kept: int, repeats: int) -> list[Row]:
    with provide_cluster() as cluster:
        rows = []
        for changes in lengths:
            rows += await measure(cluster.zookeeper_hosts, changes, kept, repeats)
            print(rows[-2], rows[-1], sep="\n", flush=True)
        return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--kept", type=int, default=KEPT)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    header_machine = machine_lines("not used (ZooKeeper of the dev cluster)")
    rows = asyncio.run(run(args.lengths, args.kept, args.repeats))
    body = render(rows, args.kept, args.repeats)
    header = [*header_machine, f"- command: `{command_line('bench.compaction')}`"]
    print("\n".join(body))
    path = write_result("compaction", "Generation-log compaction benchmark", header, body)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
