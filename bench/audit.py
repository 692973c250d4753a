"""Audit throughput: events per second through the whole ordering-audit job.

Run from the repository root::

    .venv/bin/python -m bench.audit [--events 1000000 2000000] [--master local[2]]

Synthetic events are generated in Spark (``spark.range``, no Python loop) and written
to Parquet: a topic of 8 partitions grown to 9 halfway (so keys move and the operation
has a barrier, boundaries and a gate), 4 producers writing 4,608 keys, one consumer
group receiving every record in order and committing each partition at the end. The
history is clean, so the job must find no anomaly: the run checks that too.

Each size is timed from reading the Parquet files to the last output written
(``run_audit``: every check, the tables, summary, report and charts), in one Spark
session that a smaller warm-up run has started, so the figure is the job's steady
throughput, not the JVM's start. Prometheus is not asked.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.report import command_line, machine_lines, markdown_table, write_result
from ordered_audit.job import AuditConfig, SparkOptions, build_session, run_audit
from ordered_audit.sources import conform

TOPIC = "bench-orders"
GROUP = "bench-group"
OLD_COUNT = 8
NEW_COUNT = 9
PRODUCERS = 4
KEYS = OLD_COUNT * NEW_COUNT * 64  # a multiple of both counts: key % count routes
START = 1_800_000_000.0
SPACING_S = 0.0005  # one record acknowledged every 0.5 ms: 2,000 records/s
DELIVERY_LAG_S = 0.05
OVERHEAD_EVENTS = NEW_COUNT + 7  # commits, phases, the admin event and a gate opening


def _stamp(frame: DataFrame, sidecar: str, seq: Column, time: Column) -> DataFrame:
    return frame.withColumn("schema", F.lit(1)).select(
        "*",
        F.lit(sidecar).alias("sidecar"),
        seq.cast("long").alias("seq"),
        time.alias("time"),
    )


def synthetic_events(spark: SparkSession, records: int) -> DataFrame:
    """``records`` produce_acked + ``records`` delivered events and a few dozen others."""
    half = records // 2
    index = F.col("id")
    late = index >= half
    partition = F.when(late, index % NEW_COUNT).otherwise(index % OLD_COUNT)
    # Offsets: generation 0 fills the 8 old partitions round-robin; generation 1 appends
    # after each old partition's generation-0 records (its boundary), from 0 in the new.
    before = F.floor((F.lit(half - 1) - partition) / OLD_COUNT) + 1
    boundary = F.when(partition < OLD_COUNT, before).otherwise(F.lit(0))
    offset = F.when(late, boundary + F.floor((index - half) / NEW_COUNT)).otherwise(
        F.floor(index / OLD_COUNT)
    )
    key = F.base64(F.concat(F.lit("key-"), (index % KEYS).cast("string")).cast("binary"))
    base = spark.range(records).select(
        index.alias("i"),
        F.lit(TOPIC).alias("topic"),
        partition.cast("long").alias("partition"),
        offset.cast("long").alias("offset"),
        key.alias("key"),
        F.when(late, 1).otherwise(0).cast("long").alias("generation"),
        F.when(late, NEW_COUNT).otherwise(OLD_COUNT).cast("long").alias("count"),
        F.concat(F.lit("producer-"), (index % PRODUCERS).cast("string")).alias("producer"),
        F.floor(index / PRODUCERS).cast("long").alias("producer_seq"),
        (F.lit(START) + index * SPACING_S).alias("acked_at"),
    )
    # The change sits between the two halves: 20 ms of phases, no record acknowledged.
    shift = F.when(F.col("i") >= half, F.lit(0.02)).otherwise(F.lit(0.0))
    acked = _stamp(
        base.withColumn("type", F.lit("produce_acked")),
        "producer-sc",
        F.col("i"),
        F.col("acked_at") + shift,
    )
    delivered = _stamp(
        base.withColumn("type", F.lit("delivered"))
        .withColumn("group", F.lit(GROUP))
        .withColumn("instance", F.lit("c1"))
        .drop("count"),
        "consumer-sc",
        F.col("i"),
        F.col("acked_at") + shift + F.lit(DELIVERY_LAG_S),
    )
    change_at = START + half * SPACING_S
    end = START + records * SPACING_S + 1.0
    phases = [
        {
            "type": "barrier_phase",
            "topic": TOPIC,
            "kind": "expand",
            "from_generation": 0,
            "from_count": OLD_COUNT,
            "target_count": NEW_COUNT,
            "phase": phase,
            "coordinator": "producer-sc",
            "time": change_at + 0.004 * n,
        }
        for n, phase in enumerate(
            ["creating_partitions", "barrier", "reading_boundaries", "committing", "done"]
        )
    ]
    admin = {
        "type": "admin",
        "topic": TOPIC,
        "kind": "expand",
        "result": "done",
        "from_count": OLD_COUNT,
        "target_count": NEW_COUNT,
        "time": change_at + 0.019,
    }
    # The gate of the new partition relied on its blocker's commit at the boundary.
    gate = {
        "type": "gate_opened",
        "group": GROUP,
        "instance": "c1",
        "topic": TOPIC,
        "partition": OLD_COUNT,
        "offset": 0,
        "generation": 1,
        "time": change_at + 0.02 + DELIVERY_LAG_S,
        "evidence": [
            {
                "source": 0,
                "boundary": (half - 1) // OLD_COUNT + 1,
                "committed": (half - 1) // OLD_COUNT + 1,
                "log_start": 0,
                "mode": "read_write",
            }
        ],
    }
    commits = [
        {
            "type": "committed",
            "group": GROUP,
            "instance": "c1",
            "topic": TOPIC,
            "partition": p,
            "offset": 10**12,
            "time": end + 0.001 * p,
        }
        for p in range(NEW_COUNT)
    ]
    others = [*phases, admin, gate, *commits]
    rows = [
        {"schema": 1, "sidecar": "control-sc", "seq": n, "evidence": None} | event
        for n, event in enumerate(others)
    ]
    from ordered_audit.sources import events_from_dicts

    small = events_from_dicts(spark, rows)
    return conform(acked).unionByName(conform(delivered)).unionByName(small)


def measure(spark: SparkSession, records: int, directory: Path) -> dict[str, float]:
    """Generate, write and audit ``records`` records' events; the figures."""
    source = directory / f"events-{records}.parquet"
    began = time.monotonic()
    synthetic_events(spark, records).write.mode("overwrite").parquet(str(source))
    generated_s = time.monotonic() - began
    out = directory / f"out-{records}"
    began = time.monotonic()
    result = run_audit(spark, AuditConfig(out=out, inputs=(str(source),), bucket_s=10.0))
    audit_s = time.monotonic() - began
    events = result.summary["events"]["total"]
    assert result.anomaly_count == 0, result.summary["anomalies"]
    (operation,) = result.summary["operations"]
    assert operation["keys_moved"] > 0
    return {
        "events": float(events),
        "generated_s": generated_s,
        "audit_s": audit_s,
        "rate": events / audit_s,
        "keys_moved": float(operation["keys_moved"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--events",
        type=int,
        nargs="+",
        default=[1_000_000, 2_000_000],
        help="event counts to audit (about half produce_acked, half delivered)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs of each size")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    parser.add_argument("--driver-memory", default="2g")
    args = parser.parse_args()
    began = time.monotonic()
    header = machine_lines("not used (synthetic events in Parquet)")
    spark = build_session(
        SparkOptions(
            master=args.master,
            shuffle_partitions=args.shuffle_partitions,
            conf={"spark.driver.memory": args.driver_memory},
        ),
        kafka=False,
    )
    directory = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    try:
        warmup = measure(spark, 20_000, directory)
        print(f"warm-up: {warmup['events']:,.0f} events in {warmup['audit_s']:.1f} s")
        rows = []
        for events in args.events:
            runs = []
            for _ in range(args.rounds):
                figures = measure(spark, (events - OVERHEAD_EVENTS) // 2, directory)
                print(
                    f"{figures['events']:,.0f} events: {figures['audit_s']:.1f} s, "
                    f"{figures['rate']:,.0f} events/s"
                )
                runs.append(figures)
            best = max(runs, key=lambda f: f["rate"])
            rows.append(
                [
                    f"{best['events']:,.0f}",
                    f"{best['generated_s']:.1f}",
                    ", ".join(f"{f['audit_s']:.1f}" for f in runs),
                    f"{best['rate']:,.0f}",
                    f"{best['keys_moved']:,.0f}",
                ]
            )
    finally:
        spark.stop()
        shutil.rmtree(directory, ignore_errors=True)
    total_s = time.monotonic() - began
    header += [
        f"- Spark: {spark.version}, master `{args.master}`, "
        f"{args.shuffle_partitions} shuffle partitions, driver memory {args.driver_memory}, "
        "adaptive execution off (the job's default)",
        f"- command: `{command_line('bench.audit')}` ({total_s:.0f} s)",
    ]
    body = [
        "## Ordering audit throughput (whole job, files in, every output written)",
        "",
        "Events: a clean synthetic history (produce_acked and delivered for every record, "
        f"{PRODUCERS} producers, {KEYS:,} keys, {OLD_COUNT} partitions expanded to "
        f"{NEW_COUNT} halfway, one consumer group). Job time: from reading the Parquet "
        "files to the last output (every check, the Parquet tables, summary, report and "
        "charts), in a Spark session warmed up by a run of 20,000 records (about 40,000 "
        "events); generation time is building and writing the events, not counted. Every "
        "size runs "
        f"{args.rounds} times in a row; the JVM's compiler is still warming up during the "
        "first large run, and other work on the machine (see the load average) shows as "
        "spread between rounds.",
        "",
        *markdown_table(
            ["events", "generation s", "job s (each round)", "events/s (best)", "keys moved"],
            rows,
        ),
    ]
    path = write_result("audit", "Audit benchmark", header, body)
    print(f"written to {path}")


if __name__ == "__main__":
    main()
