"""The per-key order checker: what producers had acknowledged, what the app received.

Producers write keyed, per-producer sequences (the value names producer, key and
sequence number) through sidecars; consumer instances read them back through the gate
and append every record to one ledger in the order the app received it. The check:

* for every (producer, key) the delivered sequence numbers rise, with a gap only where
  a sequence number was never acknowledged (a request that was refused or died);
* every acknowledged record is delivered;
* a record is delivered again only after ``disrupted_at``, the first crash or restart
  the test caused (at-least-once: what was delivered but not committed comes again).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ordered_dev.harness.consumers import create_consumer
from ordered_dev.harness.sidecars import SidecarClient, SidecarProcess

KEYS_PER_PRODUCER = 8
PRODUCE_PAUSE_S = 0.02


@dataclass
class Ledger:
    acknowledged: set[tuple[int, str, int]] = field(default_factory=set)
    """(producer, key, sequence) Kafka acknowledged."""
    placed: dict[tuple[int, str, int], tuple[int, int]] = field(default_factory=dict)
    """Where each acknowledged record landed: (partition, offset)."""
    delivered: list[tuple[float, int, str, int]] = field(default_factory=list)
    """(time, producer, key, sequence) in the order the app received them."""
    disrupted_at: float | None = None
    """When the test first killed or restarted something: duplicates only after it."""
    refused: list[str] = field(default_factory=list)
    """Produce requests answered with an error the test tolerates (nothing written)."""
    poll_errors: list[str] = field(default_factory=list)

    def disrupted(self) -> None:
        """Mark the moment of a crash or restart the test causes (the first one counts)."""
        if self.disrupted_at is None:
            self.disrupted_at = time.monotonic()


def producer_keys(producer: int, count: int = KEYS_PER_PRODUCER) -> list[str]:
    return [f"p{producer}-k{i}" for i in range(count)]


async def produce_sequences(
    sidecar: SidecarClient,
    producer: int,
    topic: str,
    ledger: Ledger,
    stop: asyncio.Event,
    *,
    tolerated: Collection[tuple[int, int]] = (),
    tolerated_records: Collection[int] = (),
    until_connection_lost: bool = False,
    pause_s: float = PRODUCE_PAUSE_S,
) -> None:
    """Produce one record per key per request until ``stop``, recording acknowledgements.

    Every request must succeed with every record written, except answers whose
    (status, error_code) is in ``tolerated``, and records answered with an error_code in
    ``tolerated_records`` (both recorded in ``ledger.refused``, never acknowledged). With
    ``until_connection_lost`` a connection error (its sidecar was killed) ends the loop.
    """
    sequence = 0
    keys = producer_keys(producer)
    while not stop.is_set():
        records = [
            {"key": key, "value": {"producer": producer, "key": key, "seq": sequence}}
            for key in keys
        ]
        try:
            status, body = await sidecar.produce(topic, records)
        except aiohttp.ClientError:
            if until_connection_lost:
                return
            raise
        if status != 200:
            code = body.get("error_code")
            assert (status, code) in tolerated, f"{sidecar.id}: {status} {body}"
            ledger.refused.append(f"{sidecar.id}: {status} {code}")
        else:
            for key, entry in zip(keys, body["offsets"], strict=True):
                if entry["error_code"] is not None:
                    assert entry["error_code"] in tolerated_records, f"{sidecar.id}: {entry}"
                    ledger.refused.append(f"{sidecar.id}: record {entry['error_code']}")
                    continue
                ledger.acknowledged.add((producer, key, sequence))
                ledger.placed[(producer, key, sequence)] = (entry["partition"], entry["offset"])
        sequence += 1
        await asyncio.sleep(pause_s)


EventHook = Callable[[str, list[dict[str, Any]]], bool]
"""Called with (instance name, hand-off events) of each records response; returns
whether the app acknowledges them (False: it withholds the acknowledgement)."""


async def consume_into(
    sidecar: SidecarClient,
    group: str,
    name: str,
    topic: str,
    ledger: Ledger,
    stop: asyncio.Event,
    *,
    on_events: EventHook | None = None,
    config: dict[str, object] | None = None,
) -> None:
    """One auto-committing instance of ``group`` appending what it receives to the
    ledger until ``stop``; ends quietly when its sidecar dies."""
    consumer = await create_consumer(
        sidecar,
        group,
        name,
        **({"auto.commit.enable": "true", "consumer.request.timeout.ms": 500} | (config or {})),
    )
    await consumer.subscribe(topic)
    while not stop.is_set():
        try:
            status, body = await consumer.call("GET", "/records", timeout="300")
        except aiohttp.ClientError:
            return  # its sidecar was killed
        if status != 200:
            ledger.poll_errors.append(f"{name}: {status} {body}")
            await asyncio.sleep(0.1)
            continue
        events = [item for item in body if "type" in item]
        records = [item for item in body if "type" not in item]
        for record in records:
            value = json.loads(base64.b64decode(record["value"]))
            ledger.delivered.append(
                (time.monotonic(), value["producer"], value["key"], value["seq"])
            )
        if events and (on_events is None or on_events(name, events)):
            # Hand-off events are acknowledged; rebalance notices carry no id.
            acknowledged = [e["event_id"] for e in events if "event_id" in e]
            try:
                if acknowledged:
                    await consumer.ack(*acknowledged)
            except aiohttp.ClientError:
                return


async def describe_gates(sidecars: Sequence[SidecarProcess]) -> str:
    """What the sidecars still running report: gated partitions and lag, from /metrics."""
    lines = []
    for sidecar in sidecars:
        if sidecar.process.returncode is not None:
            continue
        try:
            async with sidecar.http.get("/metrics") as response:
                text = await response.text()
        except aiohttp.ClientError:
            continue
        lines += [f"{sidecar.id}: {line}" for line in gate_and_lag_lines(text)]
    return "; ".join(lines) or "nothing gated, no lag"


def gate_and_lag_lines(metrics: str) -> list[str]:
    """The non-zero gated-partition and consumer-lag samples of a ``/metrics`` text."""
    return [
        line
        for line in metrics.splitlines()
        if line.startswith(("sidecar_gated_partitions{", "sidecar_consumer_lag{"))
        and not line.endswith(" 0.0")
    ]


async def wait_until_delivered(
    ledger: Ledger, within_s: float, diagnose: Callable[[], Awaitable[str]] | None = None
) -> None:
    """Wait until every acknowledged record was delivered; raise with where it stalled."""
    deadline = time.monotonic() + within_s
    while True:
        seen = {(p, k, s) for _, p, k, s in ledger.delivered}
        missing = ledger.acknowledged - seen
        if not missing:
            return
        if time.monotonic() >= deadline:
            first_missing: dict[int, int] = {}
            for record in missing:
                partition, offset = ledger.placed[record]
                first_missing[partition] = min(first_missing.get(partition, offset), offset)
            state = await diagnose() if diagnose is not None else "-"
            raise AssertionError(
                f"{len(missing)} acknowledged records never delivered; first missing offset "
                f"per partition: {dict(sorted(first_missing.items()))}; state: {state}; "
                f"poll errors: {ledger.poll_errors[:5]}"
            )
        await asyncio.sleep(0.2)


def check_order(ledger: Ledger) -> int:
    """Assert the per-key guarantee over the ledger; returns the number of duplicates."""
    by_key: dict[tuple[int, str], list[tuple[float, int]]] = defaultdict(list)
    for at, producer, key, sequence in ledger.delivered:
        by_key[(producer, key)].append((at, sequence))
    duplicates = 0
    for (producer, key), deliveries in by_key.items():
        highest = -1
        for at, sequence in deliveries:
            if sequence > highest:
                # A gap is allowed only where a sequence number was never acknowledged.
                skipped = [
                    s
                    for s in range(highest + 1, sequence)
                    if (producer, key, s) in ledger.acknowledged
                ]
                assert not skipped, f"{producer}/{key}: {sequence} delivered before {skipped[0]}"
                highest = sequence
                continue
            duplicates += 1
            disrupted_at = ledger.disrupted_at if ledger.disrupted_at is not None else at
            assert at > disrupted_at, (
                f"{producer}/{key}: {sequence} delivered again after {highest} "
                "without a crash or restart before it"
            )
    delivered = {(p, k, s) for _, p, k, s in ledger.delivered}
    lost = ledger.acknowledged - delivered
    assert not lost, f"{len(lost)} acknowledged records never delivered, e.g. {min(lost)}"
    return duplicates
