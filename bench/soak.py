"""Soak: minutes of steady keyed load through three sidecars while partitions come and go.

Run from the repository root (it stops by itself)::

    .venv/bin/python -m bench.soak [--minutes 5] [--rate 300] [--seed 253]

Three ``sidecar serve`` processes share one ZooKeeper root. Through each, one producer
writes per-producer keyed sequences at a steady rate (one request of ``--keys`` records
at a time, paced) and one instance of a three-instance consumer group reads them back
through the gate (events mode, auto-commit). Every ~30 s (25-35 s, drawn from
``--seed``) a random sidecar expands or shrinks the topic to a random count in 3..9.

At the end the producers stop, everything acknowledged must be delivered, and the
guarantee is checked: the per-key order checker of the integration tests
(``ordered_dev.harness.ledger``: in order per (producer, key), nothing acknowledged lost,
no duplicate since nothing crashed) and ``check_no_record_crossed_a_barrier``. Sidecar
memory (VmRSS from ``/proc/<pid>/status``) is sampled at the start, every minute and
at the end. The result goes to ``results/soak.md``; the exit status is 1 if the
guarantee was violated.

The cluster is ``ordered_dev.devcluster.provider.provide_cluster()``: an external one when
``SIDECAR_TEST_KAFKA_BOOTSTRAP`` and ``SIDECAR_TEST_ZOOKEEPER_HOSTS`` are set, otherwise
a fresh local ZooKeeper + 3 KRaft brokers, stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.machine import remove_data
from bench.report import command_line, machine_lines, markdown_table, write_result
from ordered_dev.devcluster.install import KAFKA_VERSION
from ordered_dev.devcluster.provider import provide_cluster
from ordered_dev.harness.ledger import (
    Ledger,
    check_order,
    consume_into,
    describe_gates,
    wait_until_delivered,
)
from ordered_dev.harness.sidecars import (
    SidecarProcess,
    check_no_record_crossed_a_barrier,
    settings_for,
    start_process,
    stop_process,
)
from sidecar.config import Settings

SIDECARS = 3
INITIAL_COUNT = 3
LARGEST_COUNT = 9
CHANGE_EVERY_S = (25.0, 35.0)
DRAIN_S = 120.0


@dataclass(frozen=True, slots=True)
class Plan:
    minutes: float
    rate: float
    """Records per second, all producers together."""
    keys: int
    """Keys per producer; one request carries one record per key."""
    seed: int

    @property
    def requests_per_s(self) -> float:
        """Requests per second of each producer."""
        return self.rate / (SIDECARS * self.keys)


@dataclass
class ProduceStats:
    requests: int = 0
    latencies: list[float] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    behind: int = 0
    """Request slots given up because an earlier request (held by a barrier) ran late."""


@dataclass(frozen=True, slots=True)
class Change:
    at_s: float
    coordinator: int
    from_count: int
    target_count: int
    outcome: str
    seconds: float

    @property
    def kind(self) -> str:
        return "expand" if self.target_count > self.from_count else "shrink"


@dataclass(frozen=True, slots=True)
class MemorySample:
    label: str
    at_s: float
    rss_kib: tuple[int, ...]


@dataclass
class Outcome:
    plan: Plan
    kafka: str = ""
    elapsed_s: float = 0.0
    ledger: Ledger = field(default_factory=Ledger)
    produce: ProduceStats = field(default_factory=ProduceStats)
    changes: list[Change] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    final_count: int = INITIAL_COUNT
    physical_count: int = INITIAL_COUNT
    duplicates: int = 0
    barrier_checked: int = 0
    violations: list[str] = field(default_factory=list)
    drain_s: float = 0.0


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (VmRSS), 0 if the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def sample_memory(outcome: Outcome, label: str, began: float, pids: Sequence[int]) -> None:
    sample = MemorySample(label, time.monotonic() - began, tuple(rss_kib(pid) for pid in pids))
    outcome.memory.append(sample)
    mib = ", ".join(f"{kib / 1024:.1f}" for kib in sample.rss_kib)
    print(f"[{sample.at_s:6.1f} s] sidecar RSS (MiB): {mib}", flush=True)


async def paced_producer(
    sidecar: SidecarProcess,
    producer: int,
    topic: str,
    plan: Plan,
    ledger: Ledger,
    stats: ProduceStats,
    stop: asyncio.Event,
) -> None:
    """One request of ``plan.keys`` records every 1/requests_per_s seconds until ``stop``;
    a request that runs late (held at a barrier) is not made up for by a burst."""
    period = 1.0 / plan.requests_per_s
    keys = [f"p{producer}-k{i}" for i in range(plan.keys)]
    sequence = 0
    next_at = time.monotonic()
    while not stop.is_set():
        records = [
            {"key": key, "value": {"producer": producer, "key": key, "seq": sequence}}
            for key in keys
        ]
        began = time.monotonic()
        try:
            status, body = await sidecar.produce(topic, records)
        except aiohttp.ClientError as exc:
            stats.refused[f"connection error {type(exc).__name__}"] += 1
            await asyncio.sleep(1.0)
            continue
        finally:
            stats.requests += 1
        stats.latencies.append(time.monotonic() - began)
        if status != 200:
            stats.refused[f"{status} {body.get('error_code')}"] += 1
        else:
            for key, entry in zip(keys, body["offsets"], strict=True):
                if entry["error_code"] is not None:
                    stats.refused[f"record {entry['error_code']}"] += 1
                    continue
                ledger.acknowledged.add((producer, key, sequence))
                ledger.placed[(producer, key, sequence)] = (entry["partition"], entry["offset"])
        sequence += 1
        next_at += period
        now = time.monotonic()
        if next_at < now:
            skipped = int((now - next_at) / period) + 1
            stats.behind += skipped
            next_at += skipped * period
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.monotonic()))


async def change_loop(
    sidecars: Sequence[SidecarProcess],
    topic: str,
    outcome: Outcome,
    began: float,
    end: float,
) -> None:
    """Every 25-35 s a random sidecar changes the topic to a random other count."""
    rng = random.Random(outcome.plan.seed)
    count = INITIAL_COUNT
    next_at = began + rng.uniform(*CHANGE_EVERY_S)
    while next_at < end:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        target = rng.choice([c for c in range(INITIAL_COUNT, LARGEST_COUNT + 1) if c != count])
        index = rng.randrange(len(sidecars))
        started = time.monotonic()
        status, body = await sidecars[index].admin(
            "POST", f"/admin/topics/{topic}/partition-count", {"count": target}
        )
        seconds = time.monotonic() - started
        result = "done" if status == 200 else f"{status} {body.get('error_code')}"
        change = Change(started - began, index, count, target, result, seconds)
        outcome.changes.append(change)
        print(
            f"[{change.at_s:6.1f} s] {change.kind} {count} -> {target} via sidecar {index}: "
            f"{result} in {seconds:.2f} s",
            flush=True,
        )
        if status == 200:
            count = target
        next_at += rng.uniform(*CHANGE_EVERY_S)
    outcome.final_count = count


async def memory_loop(outcome: Outcome, began: float, end: float, pids: Sequence[int]) -> None:
    """A sample at every full minute of the load phase before its end (which has its own)."""
    minute = 1
    while began + 60 * minute < end - 1.0:
        await asyncio.sleep(max(0.0, began + 60 * minute - time.monotonic()))
        sample_memory(outcome, f"{minute} min", began, pids)
        minute += 1


async def run(plan: Plan) -> Outcome:
    outcome = Outcome(plan)
    suffix = uuid.uuid4().hex[:8]
    topic, group, root = f"soak-{suffix}", f"soak-group-{suffix}", f"/soak-{suffix}"
    with provide_cluster() as cluster:
        outcome.kafka = f"{KAFKA_VERSION}, {cluster.broker_count} brokers ({cluster.kind} cluster)"
        print(f"cluster: Kafka {outcome.kafka}, bootstrap {cluster.kafka_bootstrap}", flush=True)
        sidecars: list[SidecarProcess] = []
        stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        try:
            for index in range(SIDECARS):
                # The sidecar's default timing, not the tests' shorter one.
                defaults = Settings(sidecar_id="defaults")
                settings = settings_for(
                    cluster,
                    root,
                    f"soak{index}",
                    session_timeout_s=defaults.zookeeper.session_timeout_s,
                    request_timeout_ms=defaults.kafka.request_timeout_ms,
                )
                sidecars.append(await start_process(settings))
            pids = [s.process.pid for s in sidecars]
            await sidecars[0].create_topic(
                topic, INITIAL_COUNT, replication_factor=cluster.replication_factor
            )
            consumers = [
                asyncio.create_task(
                    consume_into(s, group, f"c{i}", topic, outcome.ledger, stop_consuming)
                )
                for i, s in enumerate(sidecars)
            ]
            began = time.monotonic()
            end = began + plan.minutes * 60
            sample_memory(outcome, "start", began, pids)
            producers = [
                asyncio.create_task(
                    paced_producer(
                        s, i, topic, plan, outcome.ledger, outcome.produce, stop_producing
                    )
                )
                for i, s in enumerate(sidecars)
            ]
            tasks = [*consumers, *producers]
            memory = asyncio.create_task(memory_loop(outcome, began, end, pids))
            tasks.append(memory)
            await change_loop(sidecars, topic, outcome, began, end)
            await asyncio.sleep(max(0.0, end - time.monotonic()))
            stop_producing.set()
            await asyncio.gather(*producers)
            memory.cancel()
            sample_memory(outcome, "end", began, pids)
            outcome.elapsed_s = time.monotonic() - began
            drain_began = time.monotonic()
            try:
                await wait_until_delivered(
                    outcome.ledger, DRAIN_S, diagnose=lambda: describe_gates(sidecars)
                )
            except AssertionError as exc:
                outcome.violations.append(f"delivery: {exc}")
            outcome.drain_s = time.monotonic() - drain_began
            stop_consuming.set()
            await asyncio.gather(*consumers)
            description = await sidecars[0].describe(topic)
            outcome.physical_count = int(description["physical_count"])
            try:
                outcome.duplicates = check_order(outcome.ledger)
            except AssertionError as exc:
                outcome.violations.append(f"order: {exc}")
            try:
                outcome.barrier_checked = await check_no_record_crossed_a_barrier(
                    cluster, description
                )
            except AssertionError as exc:
                outcome.violations.append(f"barrier: {exc}")
        finally:
            stop_producing.set()
            stop_consuming.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*(stop_process(s) for s in sidecars), return_exceptions=True)
            await remove_data(cluster, [topic], root)
    return outcome


# Rendering -------------------------------------------------------------------------------


def _percentile(samples: Sequence[float], fraction: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def render(outcome: Outcome) -> list[str]:
    plan, ledger, produce = outcome.plan, outcome.ledger, outcome.produce
    unique = len({(p, k, s) for _, p, k, s in ledger.delivered})
    verdict = "**held**" if not outcome.violations else "**VIOLATED**"
    lines = [
        f"## Setup: {plan.minutes:g} min, {plan.rate:g} records/s, a change every 25-35 s",
        "",
        f"{SIDECARS} `sidecar serve` processes; through each, one producer sends one request "
        f"of {plan.keys} keyed records (one per key) {plan.requests_per_s:g} times a second, "
        f"and one instance of a {SIDECARS}-instance consumer group (events mode, auto-commit) "
        f"reads through the gate. Topic: {INITIAL_COUNT} partitions at first, replication "
        f"factor 3; every 25-35 s a random sidecar changes it to a random count in "
        f"{INITIAL_COUNT}..{LARGEST_COUNT} (`--seed {plan.seed}`). After "
        f"{plan.minutes:g} min the producers stop and the group drains.",
        "",
        f"## Outcome: the guarantee {verdict}",
        "",
        *markdown_table(
            ["what", "value"],
            [
                ["load phase", f"{outcome.elapsed_s:.0f} s"],
                ["produce requests", f"{produce.requests:,}"],
                ["records acknowledged", f"{len(ledger.acknowledged):,}"],
                [
                    "acknowledged records/s",
                    f"{len(ledger.acknowledged) / max(outcome.elapsed_s, 1e-9):,.0f}",
                ],
                ["requests refused", _refused(produce.refused)],
                ["request slots given up (a request ran late)", f"{produce.behind:,}"],
                ["deliveries to the app", f"{len(ledger.delivered):,}"],
                ["distinct records delivered", f"{unique:,}"],
                ["duplicates", f"{outcome.duplicates:,}"],
                [
                    "acknowledged but never delivered",
                    f"{len(ledger.acknowledged - _seen(ledger)):,}",
                ],
                ["drain after the producers stopped", f"{outcome.drain_s:.1f} s"],
                [
                    "records still stored, checked for barrier crossings (retired "
                    "partitions were truncated)",
                    f"{outcome.barrier_checked:,}",
                ],
                ["consumer poll errors", f"{len(ledger.poll_errors):,}"],
                [
                    "partitions at the end (undeleted / physical)",
                    f"{outcome.final_count} / {outcome.physical_count}",
                ],
            ],
        ),
        "",
    ]
    if outcome.violations:
        lines += ["Violations:", "", *(f"- {v[:1000]}" for v in outcome.violations), ""]
    latencies = produce.latencies
    lines += [
        "## Produce request latency (each request: one record per key of one producer)",
        "",
        *markdown_table(
            ["p50", "p90", "p99", "p99.9", "max", "over 1 s"],
            [
                [
                    *(f"{_percentile(latencies, f) * 1e3:.1f} ms" for f in (0.5, 0.9, 0.99, 0.999)),
                    f"{max(latencies, default=0.0) * 1e3:.0f} ms",
                    f"{sum(1 for latency in latencies if latency > 1.0):,}",
                ]
            ],
        ),
        "",
        "## Partition-count changes (duration of the admin call, barrier to commit)",
        "",
    ]
    rows = [
        [
            str(number),
            f"{change.at_s:.0f} s",
            change.kind,
            f"{change.from_count} -> {change.target_count}",
            f"sidecar {change.coordinator}",
            change.outcome,
            f"{change.seconds:.2f} s",
        ]
        for number, change in enumerate(outcome.changes, 1)
    ]
    lines += markdown_table(
        ["#", "at", "kind", "count", "coordinator", "outcome", "duration"], rows
    )
    durations = [c.seconds for c in outcome.changes if c.outcome == "done"]
    if durations:
        lines += [
            "",
            f"Durations of the completed changes: median {statistics.median(durations):.2f} s, "
            f"max {max(durations):.2f} s.",
        ]
    lines += [
        "",
        "## Sidecar memory (VmRSS, MiB)",
        "",
        *markdown_table(
            ["when", *(f"sidecar {i}" for i in range(SIDECARS))],
            [
                [
                    f"{sample.label} ({sample.at_s:.0f} s)",
                    *(f"{kib / 1024:.1f}" for kib in sample.rss_kib),
                ]
                for sample in outcome.memory
            ],
        ),
    ]
    if len(outcome.memory) >= 2:
        first, last = outcome.memory[0], outcome.memory[-1]
        growth = ", ".join(
            f"{(b - a) / 1024:+.1f}" for a, b in zip(first.rss_kib, last.rss_kib, strict=True)
        )
        lines += ["", f"Growth from start to end (MiB): {growth}."]
    return lines


def _seen(ledger: Ledger) -> set[tuple[int, str, int]]:
    return {(p, k, s) for _, p, k, s in ledger.delivered}


def _refused(refused: Counter[str]) -> str:
    if not refused:
        return "0"
    return ", ".join(f"{count:,} x {what}" for what, count in refused.most_common())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=5.0, help="load phase length")
    parser.add_argument("--rate", type=float, default=300.0, help="records/s, all producers")
    parser.add_argument("--keys", type=int, default=10, help="keys per producer")
    parser.add_argument("--seed", type=int, default=253, help="seed of the change schedule")
    args = parser.parse_args(argv)
    plan = Plan(args.minutes, args.rate, args.keys, args.seed)
    header_machine = machine_lines("…")  # the load average before the cluster starts
    began = time.monotonic()
    outcome = asyncio.run(run(plan))
    header = [
        *(
            line if not line.startswith("- Kafka:") else f"- Kafka: {outcome.kafka}"
            for line in header_machine
        ),
        f"- command: `{command_line('bench.soak')}` ({time.monotonic() - began:.0f} s)",
    ]
    body = render(outcome)
    print("\n".join(body))
    path = write_result("soak", "Soak: steady load through partition-count changes", header, body)
    print(f"\nwritten to {path}")
    if outcome.violations:
        sys.exit(1)


if __name__ == "__main__":
    main()
