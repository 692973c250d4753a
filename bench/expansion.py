"""Partition-count changes under produce load, with three sidecars.

Run from the repository root::

    .venv/bin/python -m bench.expansion [--quick] [--profile DIR]

Three ``sidecar serve`` processes (one ZooKeeper root, one deployment) each get a steady
stream of produce requests: ``--connections`` concurrent connections per sidecar (4),
each posting one request of 10 keyed records of 1 KiB (binary embedded format) at a
time, to one managed topic of 6 partitions, replication factor 3. Meanwhile the topic
goes 6 -> 7 -> 8 -> 12 -> 10 partitions through the admin API, one change every 5 s,
each through the next sidecar (the coordinators rotate). The full run does this series
three times, each on a fresh topic; the first series starts after a cluster warm-up.

Measured, with the baseline from the same load in the same run:

* produce **hold**, client side: the latency of requests that overlapped a change (the
  admin call's wall time) against the latency of the same load outside every change;
  and server side, the sidecars' ``sidecar_produce_hold_seconds`` histogram (held
  requests only), summed over the three;
* failed produces (any non-200 answer or a record with an error code);
* each change: the admin call's wall time, and its phases from the coordinator's
  ``sidecar_barrier_phase_seconds`` (scraped before and after the call);
* the time until every producer routes with the new count: per sidecar, the first
  answer carrying the new ``generation``, relative to the admin call's return (negative:
  before the call returned, i.e. requests held during the change and answered at its
  commit).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp

from bench.harness import (
    BINARY_V2,
    BucketCounts,
    admin_call,
    create_topic,
    histogram,
    mean,
    merge,
    milliseconds,
    profiled,
    scrape,
    sidecars,
    spread,
    total,
)
from bench.machine import CpuMeter, CpuShares, cluster_pids, kafka_line, remove_data
from bench.produce import Sidecar
from bench.report import markdown_table, measure_and_write
from ordered_dev.devcluster.provider import provide_cluster

SIDECARS = 3
INITIAL_PARTITIONS = 6
KEY_BYTES = 16
PHASES = ("creating_partitions", "barrier", "reading_boundaries", "committing")


@dataclass(frozen=True, slots=True)
class Plan:
    series: int
    changes: tuple[int, ...]
    gap_s: float
    baseline_s: float
    tail_s: float
    warmup_s: float
    connections: int
    batch: int
    value_bytes: int
    compacted: bool = False
    """The topic's ``cleanup.policy``: compact (``--compacted``) or delete."""


FULL = Plan(
    series=3,
    changes=(7, 8, 12, 10),
    gap_s=5.0,
    baseline_s=8.0,
    tail_s=4.0,
    warmup_s=20.0,
    connections=4,
    batch=10,
    value_bytes=1024,
)
QUICK = Plan(
    series=1,
    changes=(7, 8),
    gap_s=2.0,
    baseline_s=3.0,
    tail_s=2.0,
    warmup_s=3.0,
    connections=4,
    batch=10,
    value_bytes=1024,
)


# The load --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    """One produce request as the client saw it."""

    sidecar: int
    began: float
    ended: float
    status: int
    generation: int | None
    records: int
    failed: int
    error: str = ""

    @property
    def seconds(self) -> float:
        return self.ended - self.began


def make_bodies(plan: Plan, count: int = 96) -> list[bytes]:
    """Request bodies of ``plan.batch`` keyed records each, built before timing."""
    rng = random.Random(253)
    bodies = []
    for _ in range(count):
        records = [
            {
                "key": base64.b64encode(rng.randbytes(KEY_BYTES)).decode(),
                "value": base64.b64encode(rng.randbytes(plan.value_bytes)).decode(),
            }
            for _ in range(plan.batch)
        ]
        bodies.append(json.dumps({"records": records}).encode())
    return bodies


async def produce_loop(
    sidecar: Sidecar,
    index: int,
    topic: str,
    bodies: Sequence[bytes],
    start_at: int,
    stop: asyncio.Event,
    answers: list[Answer],
    batch: int,
) -> None:
    """One connection: post a request, wait for its answer, repeat until ``stop``."""
    position = start_at
    while not stop.is_set():
        body = bodies[position % len(bodies)]
        position += 1
        began = time.monotonic()
        try:
            async with sidecar.http.post(
                f"/topics/{topic}", data=body, headers={"Content-Type": BINARY_V2}
            ) as response:
                status = response.status
                raw = await response.read()
        except aiohttp.ClientError as exc:
            answers.append(Answer(index, began, time.monotonic(), 0, None, batch, batch, repr(exc)))
            continue
        ended = time.monotonic()
        try:
            document: dict[str, Any] = json.loads(raw)
        except ValueError:
            document = {}
        if status != 200:
            answers.append(
                Answer(index, began, ended, status, None, batch, batch, raw[:200].decode())
            )
            continue
        failed = sum(1 for entry in document["offsets"] if entry.get("error_code") is not None)
        answers.append(
            Answer(index, began, ended, status, document.get("generation"), batch, failed)
        )


# Changes ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Change:
    series: int
    from_count: int
    to_count: int
    coordinator: int
    began: float
    ended: float
    status: int
    new_generation: int | None
    phases: dict[str, float]
    error: str = ""

    @property
    def seconds(self) -> float:
        return self.ended - self.began


async def change_count(
    series: int, coordinator_index: int, coordinator: Sidecar, topic: str, from_count: int, to: int
) -> Change:
    """One admin call, with the coordinator's phase durations read from its metrics."""
    before = await scrape(coordinator)
    began = time.monotonic()
    status, answer = await admin_call(
        coordinator, "POST", f"/admin/topics/{topic}/partition-count", {"count": to}
    )
    ended = time.monotonic()
    after = await scrape(coordinator)
    phases = {}
    for phase in PHASES:
        name = "sidecar_barrier_phase_seconds_sum"
        spent = total(after, name, topic=topic, phase=phase) - total(
            before, name, topic=topic, phase=phase
        )
        counted = total(after, "sidecar_barrier_phase_seconds_count", topic=topic, phase=phase)
        counted -= total(before, "sidecar_barrier_phase_seconds_count", topic=topic, phase=phase)
        if counted:
            phases[phase] = spent
    new_generation = int(answer["from_generation"]) + 1 if status == 200 else None
    error = "" if status == 200 else f"{status} {answer}"
    return Change(
        series,
        from_count,
        to,
        coordinator_index,
        began,
        ended,
        status,
        new_generation,
        phases,
        error,
    )


# One series ------------------------------------------------------------------------------


@dataclass
class Series:
    index: int
    topic: str
    measured_from: float = 0.0
    measured_to: float = 0.0
    answers: list[Answer] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    hold: BucketCounts | None = None
    held_requests_metric: float = 0.0
    cpu: CpuShares | None = None

    def measured(self) -> list[Answer]:
        return [a for a in self.answers if a.began >= self.measured_from]

    def overlaps(self, answer: Answer, change: Change) -> bool:
        return answer.began < change.ended and answer.ended > change.began


async def run_series(
    plan: Plan,
    index: int,
    fleet: Sequence[Sidecar],
    topic: str,
    replication_factor: int,
    bodies: Sequence[bytes],
    pids: tuple[Sequence[int], Sequence[int]],
    warm_up: bool,
) -> Series:
    series = Series(index, topic)
    await create_topic(
        fleet[0], topic, INITIAL_PARTITIONS, replication_factor, compacted=plan.compacted
    )
    stop = asyncio.Event()
    loops = [
        asyncio.create_task(
            produce_loop(
                sidecar,
                sidecar_index,
                topic,
                bodies,
                (sidecar_index * plan.connections + connection) * 7,
                stop,
                series.answers,
                plan.batch,
            )
        )
        for sidecar_index, sidecar in enumerate(fleet)
        for connection in range(plan.connections)
    ]
    try:
        if warm_up:
            print(f"  warming up for {plan.warmup_s:g} s", flush=True)
            await asyncio.sleep(plan.warmup_s)
        series.measured_from = time.monotonic()
        meter = CpuMeter(*pids)
        await asyncio.sleep(plan.baseline_s)
        count = INITIAL_PARTITIONS
        for step, target in enumerate(plan.changes):
            coordinator = (index * len(plan.changes) + step) % len(fleet)
            change = await change_count(
                index, coordinator, fleet[coordinator], topic, count, target
            )
            series.changes.append(change)
            print(
                f"  {count} -> {target} via sidecar {coordinator}: {change.seconds * 1e3:,.0f} ms"
                + (f" FAILED {change.error}" if change.error else ""),
                flush=True,
            )
            if change.status == 200:
                count = target
            await asyncio.sleep(plan.gap_s if step < len(plan.changes) - 1 else plan.tail_s)
        series.cpu = meter.read()
    finally:
        stop.set()
        await asyncio.gather(*loops)
    series.measured_to = time.monotonic()
    scrapes = [await scrape(sidecar) for sidecar in fleet]
    series.hold = histogram(scrapes, "sidecar_produce_hold_seconds", topic=topic)
    return series


# The run ---------------------------------------------------------------------------------


async def run(plan: Plan, profile: Path | None, log: IO[bytes]) -> tuple[list[Series], str]:
    suffix = uuid.uuid4().hex[:8]
    root = f"/bench-expansion-{suffix}"
    topics = [f"bench-expansion-{suffix}-{index}" for index in range(plan.series)]
    results: list[Series] = []
    bodies = make_bodies(plan)
    with provide_cluster() as cluster:
        kafka = kafka_line(cluster)
        print(f"cluster: Kafka {kafka}, bootstrap {cluster.kafka_bootstrap}", flush=True)
        try:
            # The admin calls and /metrics scrapes need connections beside the producers'.
            async with (
                sidecars(cluster, root, SIDECARS, log, plan.connections + 2) as fleet,
                profiled({f"sidecar-{i}": s.pid for i, s in enumerate(fleet)}, profile),
            ):
                pids = ([s.pid for s in fleet], cluster_pids(cluster))
                for index, topic in enumerate(topics):
                    print(f"series {index + 1}/{plan.series} on {topic}", flush=True)
                    results.append(
                        await run_series(
                            plan,
                            index,
                            fleet,
                            topic,
                            cluster.replication_factor,
                            bodies,
                            pids,
                            warm_up=index == 0,
                        )
                    )
        finally:
            await remove_data(cluster, topics, root)
    return results, kafka


# Rendering -------------------------------------------------------------------------------


def route_delays(series: Series, change: Change) -> list[float]:
    """Per sidecar: its first answer with the new generation, relative to the admin
    call's return (NaN if none came before the load stopped)."""
    delays = []
    for sidecar in range(SIDECARS):
        firsts = [
            a.ended
            for a in series.answers
            if a.sidecar == sidecar
            and a.generation is not None
            and change.new_generation is not None
            and a.generation >= change.new_generation
        ]
        delays.append(min(firsts) - change.ended if firsts else float("nan"))
    return delays


def stale_after(series: Series, change: Change) -> int:
    """Requests begun after the change returned but answered under an older generation."""
    if change.new_generation is None:
        return 0
    return sum(
        1
        for a in series.answers
        if a.began > change.ended
        and a.generation is not None
        and a.generation < change.new_generation
    )


def _signed_ms(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds * 1e3:+,.0f}"


def render(results: Sequence[Series], plan: Plan) -> list[str]:
    measured = [a for s in results for a in s.measured()]
    overlapping: list[Answer] = []
    baseline: list[Answer] = []
    for series in results:
        for answer in series.measured():
            if any(series.overlaps(answer, change) for change in series.changes):
                overlapping.append(answer)
            else:
                baseline.append(answer)
    failed_records = sum(a.failed for a in measured)
    failed_requests = sum(1 for a in measured if a.failed or a.status != 200)
    first_error = next((a.error for a in measured if a.error), "")
    hold = merge([s.hold for s in results if s.hold is not None])
    changes = [c for s in results for c in s.changes]
    all_delays = [
        max(route_delays(series, change)) for series in results for change in series.changes
    ]
    over = spread([a.seconds for a in overlapping])
    base = spread([a.seconds for a in baseline])
    acked = sum(a.records - a.failed for a in measured)
    seconds = sum(s.measured_to - s.measured_from for s in results)

    headline = markdown_table(
        ["figure", "p50", "p99", "max", "samples"],
        [
            [
                "client: produce latency, requests overlapping a change (ms)",
                milliseconds(over[0]),
                milliseconds(over[2]),
                milliseconds(over[3]),
                f"{len(overlapping):,}",
            ],
            [
                "client: same load outside every change, baseline (ms)",
                milliseconds(base[0]),
                milliseconds(base[2]),
                milliseconds(base[3]),
                f"{len(baseline):,}",
            ],
            [
                "sidecars: `sidecar_produce_hold_seconds`, held requests (ms, bucket bound ≤)",
                milliseconds(hold.quantile(0.5)),
                milliseconds(hold.quantile(0.99)),
                milliseconds(hold.maximum),
                f"{hold.count:,.0f} (mean {milliseconds(hold.mean)} ms)",
            ],
            [
                "admin call wall time per change (ms)",
                milliseconds(spread([c.seconds for c in changes])[0]),
                milliseconds(spread([c.seconds for c in changes])[2]),
                milliseconds(spread([c.seconds for c in changes])[3]),
                f"{len(changes)}",
            ],
            [
                "every producer on the new count, after the admin call returned (ms)",
                _signed_ms(spread(all_delays)[0]),
                _signed_ms(spread(all_delays)[2]),
                _signed_ms(spread(all_delays)[3]),
                f"{len(all_delays)}",
            ],
        ],
    )
    change_rows = []
    for series in results:
        for change in series.changes:
            overlapped = [a.seconds for a in series.answers if series.overlaps(a, change)]
            delays = route_delays(series, change)
            change_rows.append(
                [
                    f"{series.index + 1}: {change.from_count} → {change.to_count}",
                    f"sidecar {change.coordinator}",
                    milliseconds(change.seconds) if change.status == 200 else change.error,
                    *(
                        milliseconds(change.phases[p]) if p in change.phases else "-"
                        for p in PHASES
                    ),
                    f"{len(overlapped)}",
                    milliseconds(max(overlapped)) if overlapped else "-",
                    " / ".join(_signed_ms(d) for d in delays),
                    str(stale_after(series, change)),
                ]
            )
    load_rows = []
    for series in results:
        answers = series.measured()
        series_seconds = series.measured_to - series.measured_from
        load_rows.append(
            [
                f"series {series.index + 1} ({series.topic})",
                f"{sum(a.records - a.failed for a in answers) / series_seconds:,.0f}",
                f"{len(answers):,}",
                str(sum(a.failed for a in answers)),
                series.cpu.render() if series.cpu else "-",
            ]
        )
    failures = (
        f"**Failed produces: {failed_records} records in {failed_requests} requests** "
        f"(of {len(measured):,} requests, {acked:,} records acknowledged"
        f"{', first error: ' + first_error if first_error else ''}); "
        f"admin calls failed: {sum(1 for c in changes if c.status != 200)} of {len(changes)}."
    )
    in_flight = SIDECARS * plan.connections
    return [
        f"## Headline: {SIDECARS} sidecars under load, {len(changes)} partition-count changes",
        "",
        f"Load: {SIDECARS} sidecars x {plan.connections} connections, each with one request "
        f"of {plan.batch} keyed records of {plan.value_bytes} B in flight ({in_flight} "
        f"requests in flight in all); {'compacted ' if plan.compacted else ''}topic of "
        f"{INITIAL_PARTITIONS} partitions, RF 3, "
        f"changes {INITIAL_PARTITIONS} → {' → '.join(str(c) for c in plan.changes)}, "
        f"{plan.gap_s:g} s apart, coordinators rotating; {plan.series} series on fresh topics.",
        "",
        *headline,
        "",
        failures,
        "",
        "Client latencies are per request (10 records). A request overlaps a change when it "
        "was in flight at any moment of the admin call. The sidecar histogram counts only "
        "requests that were held; its quantiles are bucket upper bounds "
        "(…, 100, 250, 500, 1000 ms). 'Every producer on the new count' is, per change, the "
        "latest of the three sidecars' first answers carrying the new generation "
        "(negative: before the admin call returned).",
        "",
        "## Each change",
        "",
        *markdown_table(
            [
                "series: change",
                "coordinator",
                "admin call ms",
                *(f"{p} ms" for p in PHASES),
                "requests overlapping",
                "their max ms",
                "first new-generation answer per sidecar, ms after the call returned",
                "old-generation answers to later requests",
            ],
            change_rows,
        ),
        "",
        "## The load",
        "",
        *markdown_table(
            ["series", "records/s acked", "requests", "failed records", "CPU (% of one core)"],
            load_rows,
        ),
        "",
        f"Overall {acked / seconds:,.0f} records/s acknowledged "
        f"({acked / seconds * plan.value_bytes / (1024 * 1024):.1f} MiB/s of values), "
        f"mean request latency {mean([a.seconds for a in measured]) * 1e3:.0f} ms.",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one short series of two changes")
    parser.add_argument(
        "--profile", type=Path, help="record every sidecar with py-spy (raw stacks) into DIR"
    )
    parser.add_argument(
        "--compacted",
        action="store_true",
        help="a compacted topic (cleanup.policy=compact); results/expansion-compacted.md",
    )
    args = parser.parse_args(argv)
    plan = dataclasses.replace(QUICK if args.quick else FULL, compacted=args.compacted)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    measure_and_write(
        "expansion-compacted" if plan.compacted else "expansion",
        "Expansion under load benchmark",
        lambda log: run(plan, args.profile, log),
        lambda results: render(results, plan),
        module="bench.expansion",
    )


if __name__ == "__main__":
    main()
