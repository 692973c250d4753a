"""Transaction lanes A/B: two sidecars on one cluster, each with its own lane count.

Run from the repository root::

    .venv/bin/python -m bench.lanes [--lanes 3 5] [--rounds 4]

Each sidecar (``sidecar serve`` with ``kafka.transaction_lanes`` set) writes its own
managed topic of 6 partitions, replication factor 3. Every round measures, for each
sidecar in turn (the order reversed every other round, so a drift in the machine's
load hits both): throughput with 4 connections of 100-record requests for 5 s, then
single-record latency with keys spread over the partitions and with one key, 300
requests each, one at a time. The baseline is the first lane count, measured in the
same run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

from bench.machine import kafka_line
from bench.produce import (
    Sidecar,
    create_managed_topic,
    make_workload,
    percentile,
    sidecar_latency,
    sidecar_process,
    sidecar_throughput,
)
from bench.report import markdown_table, measure_and_write
from ordered_dev.devcluster.provider import provide_cluster

CONNECTIONS = 4
BATCH = 100
THROUGHPUT_S = 5.0
LATENCY_S = 8.0
LATENCY_SAMPLES = 300
WARMUP_S = 10.0
VALUE_BYTES = 100


@dataclass
class LaneResult:
    lanes: int
    rates: list[float] = field(default_factory=list)
    spread: list[float] = field(default_factory=list)
    one_key: list[float] = field(default_factory=list)


async def run(
    lane_counts: Sequence[int], rounds: int, log: IO[bytes]
) -> tuple[list[LaneResult], str]:
    workload = make_workload(VALUE_BYTES, BATCH)
    results = [LaneResult(lanes) for lanes in lane_counts]
    with provide_cluster() as cluster:
        kafka = kafka_line(cluster)
        async with contextlib.AsyncExitStack() as stack:
            sidecars: list[tuple[Sidecar, str]] = []
            for lanes in lane_counts:
                # sidecar_process passes this process's environment on to the sidecar.
                os.environ["ORDERED_SIDECAR__KAFKA__TRANSACTION_LANES"] = str(lanes)
                root = f"/bench-lanes-{uuid.uuid4().hex[:8]}"
                sidecar = await stack.enter_async_context(
                    sidecar_process(cluster, root, log, CONNECTIONS)
                )
                topic = f"bench-lanes-{lanes}-{uuid.uuid4().hex[:8]}"
                await create_managed_topic(sidecar, topic, cluster.replication_factor)
                sidecars.append((sidecar, topic))
            os.environ.pop("ORDERED_SIDECAR__KAFKA__TRANSACTION_LANES")
            for sidecar, topic in sidecars:
                await sidecar_throughput(sidecar, topic, workload, WARMUP_S, CONNECTIONS)
            one_key = workload.one_key()
            for round_index in range(rounds):
                order = list(zip(results, sidecars, strict=True))
                if round_index % 2:
                    order.reverse()
                for result, (sidecar, topic) in order:
                    rate = await sidecar_throughput(
                        sidecar, topic, workload, THROUGHPUT_S, CONNECTIONS
                    )
                    result.rates.append(rate.per_second)
                    result.spread += await sidecar_latency(
                        sidecar, topic, workload, LATENCY_S, LATENCY_SAMPLES
                    )
                    result.one_key += await sidecar_latency(
                        sidecar, topic, one_key, LATENCY_S, LATENCY_SAMPLES
                    )
                    print(
                        f"round {round_index}, {result.lanes} lanes: "
                        f"{rate.per_second:,.0f} records/s",
                        flush=True,
                    )
    return results, kafka


def render(results: Sequence[LaneResult]) -> list[str]:
    base = results[0]
    rows = []
    for result in results:
        ratios = [r / b for r, b in zip(result.rates, base.rates, strict=True)]
        rows.append(
            [
                str(result.lanes),
                f"{statistics.median(result.rates):,.0f}",
                f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
                f"{percentile(result.spread, 0.5) * 1e3:.1f} / "
                f"{percentile(result.spread, 0.9) * 1e3:.1f}",
                f"{percentile(result.one_key, 0.5) * 1e3:.1f} / "
                f"{percentile(result.one_key, 0.9) * 1e3:.1f}",
            ]
        )
    return [
        f"## Managed produce by `kafka.transaction_lanes` ({VALUE_BYTES} B records, "
        f"{len(base.rates)} rounds, alternating)",
        "",
        *markdown_table(
            [
                "lanes",
                f"records/s, {CONNECTIONS} x {BATCH} in flight (median)",
                f"throughput / {base.lanes} lanes (median of the rounds, min-max)",
                "single record p50 / p90 ms, keys spread",
                "single record p50 / p90 ms, one key",
            ],
            rows,
        ),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--lanes", type=int, nargs="+", default=[3, 5])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    measure_and_write(
        "lanes",
        "Transaction lanes benchmark",
        lambda log: run(args.lanes, args.rounds, log),
        render,
    )


if __name__ == "__main__":
    main()
