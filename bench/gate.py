"""Gate release latency: from the blocker's commit to the first gated record.

Run from the repository root::

    .venv/bin/python -m bench.gate [--quick]

Two ``sidecar serve`` processes, A and B (one deployment, as two pods of an app). Each
repetition:

1. creates a managed topic of 1 partition, writes K records (several keys, one of which
   moves to partition 1 under 2 partitions), expands it to 2 partitions, and writes more
   records for the moved key (they land in partition 1, behind the gate);
2. for each variant below, with a fresh consumer group: an instance on A assigned
   partition 0 (the blocker) and an instance on B assigned partition 1, which
   long-polls from the start; the partition-0 instance reads its K records, then
   releases partition 1 as the variant says; measured: from that moment to the first
   record of partition 1 arriving at the partition-1 instance.

Variants (their order rotates between repetitions):

* **commit**: both instances with a ``callback_url`` (a local aiohttp app answering 204
  at once); the partition-0 instance commits (``POST offsets`` with no body); the
  clock starts when the commit returns;
* **auto-commit**: the same, but the partition-0 instance has ``auto.commit.enable``
  and never commits itself: it keeps polling, and commits because the partition-1
  instance announced its wait. The clock starts when the records response that
  delivered partition 0's last record returned;
* **events**: no callback; hand-off events in the records responses, acknowledged.
  The partition-0 instance's commit is refused until it acknowledges ``keys_revoked``
  (409, the event comes in its next records response); the clock starts when the
  commit after that acknowledgement returns; the partition-1 instance acknowledges
  ``keys_assigned`` before its first record comes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from aiohttp import web
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from bench.harness import (
    Poll,
    RestConsumer,
    admin_call,
    create_topic,
    histogram,
    milliseconds,
    scrape,
    sidecars,
    spread,
)
from bench.machine import kafka_line, remove_data
from bench.produce import Sidecar
from bench.report import markdown_table, measure_and_write
from ordered_dev.devcluster.provider import provide_cluster
from sidecar.core.routing import partition_for_key

JSON_V2 = "application/vnd.kafka.json.v2+json"
STEP_TIMEOUT_S = 30.0
COMMIT, AUTO_COMMIT, EVENTS = "commit", "auto-commit", "events"
LABELS = {
    COMMIT: "callback, explicit commit (clock from the commit's return)",
    AUTO_COMMIT: "callback, auto-commit, no commit call (clock from the last p0 delivery)",
    EVENTS: "events acked, explicit commit (clock from the commit's return)",
}


@dataclass(frozen=True, slots=True)
class Plan:
    repetitions: int
    variants: tuple[str, ...]
    records_before: int
    records_after: int


FULL = Plan(
    repetitions=30, variants=(COMMIT, AUTO_COMMIT, EVENTS), records_before=100, records_after=20
)
QUICK = Plan(
    repetitions=3, variants=(COMMIT, AUTO_COMMIT, EVENTS), records_before=20, records_after=5
)


def moving_key() -> str:
    """A key in partition 0 under 1 partition that moves to partition 1 under 2."""
    for index in range(100_000):
        key = f"key-{index}"
        if partition_for_key(json.dumps(key).encode(), 1, 2) == 1:
            return key
    raise AssertionError("no key moves from 0 to 1")


# The app's hand-off callback -------------------------------------------------------------


@dataclass
class CallbackApp:
    """The local app receiving hand-off callbacks: answers 204 at once, counts them."""

    received: dict[str, int] = field(default_factory=dict)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        kind = str(body.get("type"))
        self.received[kind] = self.received.get(kind, 0) + 1
        return web.Response(status=204)


@contextlib.asynccontextmanager
async def callback_app() -> AsyncIterator[CallbackApp]:
    app = CallbackApp()
    web_app = web.Application()
    web_app.router.add_post("/handoff", app.handle)
    runner = web.AppRunner(web_app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        app.url = f"http://127.0.0.1:{runner.addresses[0][1]}/handoff"
        yield app
    finally:
        await runner.cleanup()


# One measurement -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Release:
    variant: str
    seconds: float
    commit_seconds: float
    """How long the blocker's own release call took (commit; for auto-commit, the poll
    in which it committed is not separable: 0)."""


async def produce(sidecar: Sidecar, topic: str, records: Sequence[dict[str, object]]) -> set[int]:
    """Records in the JSON format; the partitions they landed in."""
    async with sidecar.http.post(
        f"/topics/{topic}",
        data=json.dumps({"records": list(records)}),
        headers={"Content-Type": JSON_V2},
    ) as response:
        answer = await response.json(content_type=None)
    if response.status != 200 or any(o["error_code"] is not None for o in answer["offsets"]):
        raise RuntimeError(f"producing to {topic}: {response.status} {answer}")
    return {int(o["partition"]) for o in answer["offsets"]}


async def measure(
    variant: str,
    owner_side: Sidecar,
    waiter_side: Sidecar,
    topic: str,
    before: int,
    callback_url: str,
) -> Release:
    group = f"bench-gate-{uuid.uuid4().hex[:8]}"
    config: dict[str, object] = {"consumer.request.timeout.ms": 1000}
    if variant != EVENTS:
        config["callback_url"] = callback_url
    owner_config = config | ({"auto.commit.enable": "true"} if variant == AUTO_COMMIT else {})
    owner = await RestConsumer.create(owner_side, group, "p0", **owner_config)
    waiter = await RestConsumer.create(waiter_side, group, "p1", **config)
    try:
        await owner.assign(topic, 0)
        await waiter.assign(topic, 1)
        first_gated = asyncio.create_task(_first_record(waiter))
        try:
            return await asyncio.wait_for(
                _release(variant, owner, before, first_gated), STEP_TIMEOUT_S
            )
        finally:
            first_gated.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await first_gated
    finally:
        await owner.delete()
        await waiter.delete()


async def _first_record(waiter: RestConsumer) -> Poll:
    """Long-poll until the first record arrives (acknowledging hand-off events)."""
    while True:
        poll = await waiter.poll()
        if poll.events:
            await waiter.ack(poll.events)
        if poll.records:
            return poll


async def _release(
    variant: str, owner: RestConsumer, before: int, first_gated: asyncio.Task[Poll]
) -> Release:
    delivered = 0
    last_delivery = 0.0
    events: list[dict[str, Any]] = []
    while delivered < before:
        poll = await owner.poll()
        events += poll.events
        delivered += len(poll.records)
        last_delivery = poll.arrived
        if first_gated.done():
            raise RuntimeError("the gated record came before its blocker was consumed")
    commit_seconds = 0.0
    if variant == AUTO_COMMIT:
        started = last_delivery
        while not first_gated.done():
            # The owner commits at its next poll, as someone waits for its boundary.
            poll_task = asyncio.create_task(owner.poll())
            await asyncio.wait({poll_task, first_gated}, return_when=asyncio.FIRST_COMPLETED)
            if not poll_task.done():
                poll_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poll_task
    else:
        began = time.monotonic()
        status, answer = await owner.commit()
        if variant == EVENTS:
            if status != 409:
                raise RuntimeError(f"commit before keys_revoked was acked: {status} {answer}")
            while not events:
                events += (await owner.poll()).events
            await owner.ack(events)
            began = time.monotonic()
            status, answer = await owner.commit()
        started = time.monotonic()
        commit_seconds = started - began
        if status != 204:
            raise RuntimeError(f"commit: {status} {answer}")
    arrived = (await first_gated).arrived
    return Release(variant, arrived - started, commit_seconds)


# The run ---------------------------------------------------------------------------------


@dataclass
class Results:
    releases: list[Release] = field(default_factory=list)
    expansion_seconds: list[float] = field(default_factory=list)
    callbacks: dict[str, int] = field(default_factory=dict)
    recheck_reads: list[float] = field(default_factory=list)
    """The Kafka reads of one gate re-check, as the sidecar makes them, timed from here."""
    callback_mean_s: dict[str, float] = field(default_factory=dict)


class RecheckProbe:
    """Times the Kafka reads a waiting instance makes at every gate re-check: the
    group's committed offsets (aiokafka's admin client, which looks up the group
    coordinator first) and the partitions' log-start offsets (ListOffsets)."""

    def __init__(self, bootstrap: str) -> None:
        self.admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)

    async def __aenter__(self) -> RecheckProbe:
        await self.admin.start()
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()
        await self.admin.close()

    async def time(self, group: str, topic: str) -> float:
        partitions = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        began = time.monotonic()
        await self.admin.list_consumer_group_offsets(group, partitions=partitions)
        await self.consumer.beginning_offsets(partitions)
        return time.monotonic() - began


async def run(plan: Plan, log: IO[bytes]) -> tuple[Results, str]:
    suffix = uuid.uuid4().hex[:8]
    root = f"/bench-gate-{suffix}"
    topics = [f"bench-gate-{suffix}-{index}" for index in range(plan.repetitions)]
    key = moving_key()
    results = Results()
    with provide_cluster() as cluster:
        kafka = kafka_line(cluster)
        print(f"cluster: Kafka {kafka}, bootstrap {cluster.kafka_bootstrap}", flush=True)
        try:
            async with (
                callback_app() as app,
                sidecars(cluster, root, 2, log, 8) as (a, b),
                RecheckProbe(cluster.kafka_bootstrap) as probe,
            ):
                for index, topic in enumerate(topics):
                    await create_topic(a, topic, 1, cluster.replication_factor)
                    others = [
                        {"key": f"other-{i % 7}", "value": i}
                        for i in range(plan.records_before - 1)
                    ]
                    await produce(a, topic, [{"key": key, "value": -1}, *others])
                    began = time.monotonic()
                    status, answer = await admin_call(
                        a, "POST", f"/admin/topics/{topic}/partition-count", {"count": 2}
                    )
                    if status != 200:
                        raise RuntimeError(f"expanding {topic}: {status} {answer}")
                    results.expansion_seconds.append(time.monotonic() - began)
                    after = [{"key": key, "value": i} for i in range(plan.records_after)]
                    landed = await produce(a, topic, after)
                    if landed != {1}:
                        raise RuntimeError(f"the moved key landed in {landed}, not partition 1")
                    shift = index % len(plan.variants)
                    order = plan.variants[shift:] + plan.variants[:shift]
                    measured = []
                    for variant in order:
                        release = await measure(variant, a, b, topic, plan.records_before, app.url)
                        results.releases.append(release)
                        measured.append(f"{variant} {release.seconds * 1e3:.0f} ms")
                    print(f"  {index + 1}/{plan.repetitions}: " + ", ".join(measured), flush=True)
                    await probe.time(f"probe-{suffix}", topic)  # the probe's first metadata read
                    for _ in range(3):
                        results.recheck_reads.append(await probe.time(f"probe-{suffix}", topic))
                scrapes = [await scrape(a), await scrape(b)]
                for kind in ("keys_assigned", "keys_revoked"):
                    callbacks = histogram(scrapes, "sidecar_handoff_callback_seconds", kind=kind)
                    results.callback_mean_s[kind] = callbacks.mean
            results.callbacks = dict(app.received)
        finally:
            await remove_data(cluster, topics, root)
    return results, kafka


# Rendering -------------------------------------------------------------------------------


def render(results: Results, plan: Plan) -> list[str]:
    rows = []
    for variant in plan.variants:
        samples = [r.seconds for r in results.releases if r.variant == variant]
        p50, p95, _, maximum = spread(samples)
        commits = [r.commit_seconds for r in results.releases if r.variant == variant]
        rows.append(
            [
                LABELS[variant],
                f"{len(samples)}",
                milliseconds(p50),
                milliseconds(p95),
                milliseconds(maximum),
                milliseconds(min(samples)) if samples else "-",
                "-" if variant == AUTO_COMMIT else milliseconds(spread(commits)[0]),
            ]
        )
    expansions = spread(results.expansion_seconds)
    callbacks = ", ".join(f"{kind} {count}" for kind, count in sorted(results.callbacks.items()))
    return [
        "## Gate release: from the blocker's release to the first gated record",
        "",
        f"{plan.repetitions} repetitions, each on a fresh topic: 1 partition, "
        f"{plan.records_before} records (one key moves), expanded to 2, "
        f"{plan.records_after} more records for the moved key (partition 1). Per variant a "
        "fresh group: the partition-0 instance on sidecar A, the partition-1 instance on "
        "sidecar B, long-polling (`consumer.request.timeout.ms` 1000).",
        "",
        *markdown_table(
            ["variant", "samples", "p50 ms", "p95 ms", "max ms", "min ms", "commit call p50 ms"],
            rows,
        ),
        "",
        f"The expansions (1 → 2, two sidecars): p50 {milliseconds(expansions[0])} ms, "
        f"max {milliseconds(expansions[3])} ms. Hand-off callbacks received: "
        f"{callbacks or 'none'} (mean latency as the sidecars measured it: "
        + ", ".join(f"{k} {milliseconds(v)} ms" for k, v in sorted(results.callback_mean_s.items()))
        + ").",
        "",
        "What one gate re-check of the waiting instance costs besides its two 50 ms waits "
        "(the fetch wait and the sleep between re-checks): the Kafka reads it makes, timed "
        f"from the benchmark process {len(results.recheck_reads)} times: "
        f"p50 {milliseconds(spread(results.recheck_reads)[0])} ms, "
        f"p95 {milliseconds(spread(results.recheck_reads)[1])} ms, "
        f"max {milliseconds(spread(results.recheck_reads)[3])} ms.",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="3 repetitions, fewer records")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    measure_and_write(
        "gate",
        "Gate release benchmark",
        lambda log: run(plan, log),
        lambda results: render(results, plan),
    )


if __name__ == "__main__":
    main()
