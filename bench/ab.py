"""A setting A/B: sidecars on one cluster, alike but for one setting, measured in turns.

Run from the repository root::

    .venv/bin/python -m bench.ab --setting process.event_loop --values asyncio uvloop
    .venv/bin/python -m bench.ab --setting kafka.transaction_lanes --values 3 5

One ``sidecar serve`` process per value (the setting passed as its environment
variable), each with a managed topic and a plain (unmanaged) topic of 6 partitions,
replication factor 3. Every round measures each sidecar in turn, the order reversed
every other round so that a drift in the machine's load hits all alike: managed
throughput with 4 connections (``--connections``) of 100-record requests for 5 s, the
same against the plain topic (the HTTP edge and the pass-through, no transaction), then
single-record latency with keys spread over the partitions and with one key, 300
requests each, one at a time. A ``kafka.client.<option>`` setting reaches aiokafka's
producers (``--setting kafka.client.max_batch_size``). The baseline is the first value,
measured in the same run; each ratio is taken within a round, and the table gives their
median and range.
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

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

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
from sidecar.config import ENV_PREFIX

CONNECTIONS = 4
BATCH = 100
PARTITIONS = 6
THROUGHPUT_S = 5.0
LATENCY_S = 8.0
LATENCY_SAMPLES = 300
WARMUP_S = 10.0
VALUE_BYTES = 100


@dataclass
class Arm:
    """One value of the setting and what its sidecar measured, a figure per round."""

    value: str
    managed: list[float] = field(default_factory=list)
    unmanaged: list[float] = field(default_factory=list)
    spread: list[float] = field(default_factory=list)
    one_key: list[float] = field(default_factory=list)


def environment_variable(setting: str) -> str:
    """``kafka.transaction_lanes`` -> ``ORDERED_SIDECAR__KAFKA__TRANSACTION_LANES``."""
    return ENV_PREFIX + setting.upper().replace(".", "__")


async def run(
    setting: str, values: Sequence[str], rounds: int, connections: int, log: IO[bytes]
) -> tuple[list[Arm], str]:
    workload = make_workload(VALUE_BYTES, BATCH)
    arms = [Arm(value) for value in values]
    variable = environment_variable(setting)
    with provide_cluster() as cluster:
        kafka = kafka_line(cluster)
        rf = cluster.replication_factor
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
        await admin.start()
        plain_topics: list[str] = []
        try:
            async with contextlib.AsyncExitStack() as stack:
                sidecars: list[tuple[Sidecar, str, str]] = []
                for value in values:
                    # sidecar_process passes this process's environment on to the sidecar.
                    os.environ[variable] = value
                    root = f"/bench-ab-{uuid.uuid4().hex[:8]}"
                    sidecar = await stack.enter_async_context(
                        sidecar_process(cluster, root, log, connections)
                    )
                    suffix = uuid.uuid4().hex[:8]
                    managed, plain = f"bench-ab-{suffix}", f"bench-ab-plain-{suffix}"
                    await create_managed_topic(sidecar, managed, rf)
                    await admin.create_topics([NewTopic(plain, PARTITIONS, rf)])
                    plain_topics.append(plain)
                    sidecars.append((sidecar, managed, plain))
                os.environ.pop(variable)
                for sidecar, managed, plain in sidecars:
                    await sidecar_throughput(sidecar, managed, workload, WARMUP_S, connections)
                    await sidecar_throughput(sidecar, plain, workload, WARMUP_S / 2, connections)
                one_key = workload.one_key()
                for round_index in range(rounds):
                    order = list(zip(arms, sidecars, strict=True))
                    if round_index % 2:
                        order.reverse()
                    for arm, (sidecar, managed, plain) in order:
                        rate = await sidecar_throughput(
                            sidecar, managed, workload, THROUGHPUT_S, connections
                        )
                        arm.managed.append(rate.per_second)
                        passed = await sidecar_throughput(
                            sidecar, plain, workload, THROUGHPUT_S, connections
                        )
                        arm.unmanaged.append(passed.per_second)
                        arm.spread += await sidecar_latency(
                            sidecar, managed, workload, LATENCY_S, LATENCY_SAMPLES
                        )
                        arm.one_key += await sidecar_latency(
                            sidecar, managed, one_key, LATENCY_S, LATENCY_SAMPLES
                        )
                        print(
                            f"round {round_index}, {setting} = {arm.value}: managed "
                            f"{rate.per_second:,.0f}, unmanaged {passed.per_second:,.0f} records/s",
                            flush=True,
                        )
        finally:
            with contextlib.suppress(Exception):
                await admin.delete_topics(plain_topics)
            await admin.close()
    return arms, kafka


def _ratio(figures: Sequence[float], base: Sequence[float]) -> str:
    ratios = [f / b for f, b in zip(figures, base, strict=True)]
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def render(setting: str, arms: Sequence[Arm], connections: int) -> list[str]:
    base = arms[0]
    rows = [
        [
            f"`{arm.value}`",
            f"{statistics.median(arm.managed):,.0f}",
            _ratio(arm.managed, base.managed),
            f"{statistics.median(arm.unmanaged):,.0f}",
            _ratio(arm.unmanaged, base.unmanaged),
            f"{percentile(arm.spread, 0.5) * 1e3:.1f} / {percentile(arm.spread, 0.9) * 1e3:.1f}",
            f"{percentile(arm.one_key, 0.5) * 1e3:.1f} / {percentile(arm.one_key, 0.9) * 1e3:.1f}",
        ]
        for arm in arms
    ]
    return [
        f"## Produce by `{setting}` ({VALUE_BYTES} B records, {len(base.managed)} rounds, "
        "alternating)",
        "",
        *markdown_table(
            [
                setting,
                f"managed records/s, {connections} x {BATCH} in flight (median)",
                f"managed / `{base.value}` (median of the rounds, min-max)",
                "unmanaged records/s (median)",
                f"unmanaged / `{base.value}`",
                "managed single record p50 / p90 ms, keys spread",
                "managed single record p50 / p90 ms, one key",
            ],
            rows,
        ),
    ]


def measure(
    name: str,
    title: str,
    setting: str,
    values: Sequence[str],
    rounds: int,
    module: str,
    connections: int = CONNECTIONS,
) -> None:
    """Run the A/B, print it and write ``results/<name>.md``; ``module`` is what ran."""
    measure_and_write(
        name,
        title,
        lambda log: run(setting, values, rounds, connections, log),
        lambda arms: render(setting, arms, connections),
        module=module,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--setting", required=True, help="a dotted setting, e.g. process.event_loop"
    )
    parser.add_argument("--values", nargs="+", required=True, help="the first is the baseline")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--connections", type=int, default=CONNECTIONS, help="requests of 100 records in flight"
    )
    parser.add_argument("--name", default="", help="results/<name>.md (default ab-<setting>)")
    args = parser.parse_args(argv)
    name = args.name or "ab-" + args.setting.replace(".", "-").replace("_", "-")
    measure(
        name,
        f"A/B of `{args.setting}`",
        args.setting,
        args.values,
        args.rounds,
        "bench.ab",
        args.connections,
    )


if __name__ == "__main__":
    main()
