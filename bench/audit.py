"""Audit throughput: events per second through the whole ordering-audit job, through
the live audit's micro-batches, and through the live audit's query on Kafka.

Run from the repository root::

    .venv/bin/python -m bench.audit [--part batch|stream|kafka|both] [--events 1000000 2000000]
        [--batch-events 4000 20000 100000 250000] [--per-trigger 100000 250000]
        [--kafka-records 600000] [--master local[2]]

Synthetic events are generated in Spark (``spark.range``, no Python loop) and written
to Parquet: a topic of 8 partitions grown to 9 halfway (so keys move and the operation
has a barrier, boundaries and a gate), 4 producers writing 4,608 keys, one consumer
group receiving every record in order and committing each partition at the end. The
history is clean, so the job must find no anomaly: the run checks that too.

Each size is timed from reading the Parquet files to the last output written
(``run_audit``: every check, the tables, summary, report and charts), in one Spark
session that a smaller warm-up run has started, so the figure is the job's steady
throughput, not the JVM's start. Prometheus is not asked.

The live audit (``--part stream``) runs its ``foreachBatch`` function
(``ordered_audit.stream.LiveAudit``: the batch's record values brought to the driver,
their JSON read, the checks over the state in memory, the batch journaled to a local
checkpoint, the counts) over the same synthetic history as the audit topic's records
(one event's JSON each), cut by event time into micro-batches of a given size, one after
the other with the state carried, as the stream job runs them; each batch is in Spark's
memory first, so reading Kafka is not in the figure. A batch size the checks get through
in ``s`` seconds is kept up with at ``size / s`` events per second; at that rate the
batches run back to back, and the job's lag peaks at ``2 s`` (``trigger + s`` when ``s``
is shorter than the trigger) right before a batch ends, when the newest event checked is
still the previous batch's.

The live audit on Kafka (``--part kafka``, not in ``both``: it starts the dev cluster,
or uses the one ``SIDECAR_TEST_*`` names) runs ``sidecar audit stream``'s query itself
over a fresh audit topic filled with that history, embedded and on the project's Spark
standalone master and worker, ``--per-trigger`` records a micro-batch, and takes Spark's
own time of each micro-batch.

Each part replaces its own section of ``results/audit.md`` (with its own machine and
load lines) and keeps the other's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.report import RESULTS_DIR, command_line, machine_lines, markdown_table
from ordered_audit import live_checks
from ordered_audit.job import AuditConfig, SparkOptions, build_session, run_audit
from ordered_audit.sources import EVENT_COLUMNS, conform
from ordered_audit.stream import DEFAULT_TRIGGER_S, LiveAudit, StreamConfig, start_stream
from ordered_audit.stream_metrics import StreamMetrics
from ordered_dev.devcluster.install import KAFKA_VERSION
from ordered_dev.devcluster.provider import provide_cluster
from ordered_dev.devcluster.spark import SparkStandalone

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
# Micro-batches of each size: the first ones warm the JVM's compiler up, the rest count.
STREAM_WARMUP_BATCHES = 2
STREAM_MEASURED_BATCHES = 4
BATCH_SECTION = "## Ordering audit throughput"
STREAM_SECTION = "## Live audit throughput"
KAFKA_SECTION = "## Live audit on the real cluster"
SECTIONS = (BATCH_SECTION, STREAM_SECTION, KAFKA_SECTION)
# The live audit over a topic filled beforehand: the first micro-batch starts the
# executors and the JVM's compiler, the rest count; given up after this long.
KAFKA_CATCH_UP_TIMEOUT_S = 600.0


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


@dataclass(frozen=True)
class StreamFigures:
    per_batch: float
    seconds: list[float]
    """Each batch's, in order (the warm-up ones first)."""
    median_s: float
    max_s: float

    @property
    def rate(self) -> float:
        return self.per_batch / self.median_s


def measure_stream(spark: SparkSession, events_per_batch: int, directory: Path) -> StreamFigures:
    """The live audit's micro-batches of about ``events_per_batch`` events over a clean
    history."""
    batches = STREAM_WARMUP_BATCHES + STREAM_MEASURED_BATCHES
    source = directory / f"stream-{events_per_batch}.parquet"
    synthetic_events(spark, events_per_batch * batches // 2).write.mode("overwrite").parquet(
        str(source)
    )
    events = conform(spark.read.parquet(str(source)))
    # The audit topic's records: one event's JSON each, absent fields left out.
    records = events.select("time", F.to_json(F.struct(*EVENT_COLUMNS)).alias("value"))
    bounds = events.agg(F.min("time").alias("first"), F.max("time").alias("last")).first()
    assert bounds is not None
    first, last = float(bounds["first"]), float(bounds["last"])
    width = (last - first) / batches
    metrics = StreamMetrics(live_checks.STREAM_KINDS, max_topics=50)
    config = StreamConfig(bootstrap="unused", topic="unused", checkpoint=directory / source.stem)
    audit = LiveAudit(config, metrics)
    seconds = []
    for batch_id in range(batches):
        lower = first + batch_id * width
        upper = last + 1 if batch_id == batches - 1 else lower + width
        batch = (
            records.where((F.col("time") >= lower) & (F.col("time") < upper))
            .select("value")
            .cache()
        )
        batch.count()  # in memory before the clock starts, as a source hands it over
        began = time.monotonic()
        audit(batch, batch_id)
        seconds.append(time.monotonic() - began)
        batch.unpersist()
    checked = metrics.registry.get_sample_value("sidecar_audit_stream_events_total")
    found = sum(
        sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == "sidecar_audit_stream_anomalies_total"
    )
    assert found == 0, "the clean history has no anomaly"
    assert checked is not None
    measured = sorted(seconds[STREAM_WARMUP_BATCHES:])
    return StreamFigures(checked / batches, seconds, statistics.median(measured), measured[-1])


@dataclass(frozen=True)
class KafkaFigures:
    events: int
    batches: list[tuple[int, float]]
    """(records, seconds) of each micro-batch, in order."""

    @property
    def measured(self) -> list[tuple[int, float]]:
        return self.batches[1:]

    @property
    def rate(self) -> float:
        return sum(n for n, _ in self.measured) / sum(t for _, t in self.measured)


def fill_audit_topic(spark: SparkSession, bootstrap: str, replication: int, records: int) -> str:
    """A fresh audit topic of 3 partitions holding the clean synthetic history of
    ``records`` records (one event's JSON a record, written by Spark's Kafka sink)."""
    topic = f"bench-audit-{uuid.uuid4().hex[:8]}"

    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, 3, replication)])
        finally:
            await admin.close()

    asyncio.run(create())
    events = synthetic_events(spark, records)
    events.select(F.to_json(F.struct(*EVENT_COLUMNS)).alias("value")).write.format("kafka").option(
        "kafka.bootstrap.servers", bootstrap
    ).option("topic", topic).save()
    return topic


def measure_kafka(
    spark: SparkSession, bootstrap: str, topic: str, per_trigger: int, directory: Path
) -> KafkaFigures:
    """``sidecar audit stream``'s query (``start_stream``) over ``topic`` from its start,
    ``per_trigger`` records a micro-batch, until every event is counted."""
    config = StreamConfig(
        bootstrap=bootstrap,
        topic=topic,
        checkpoint=directory / f"kafka-{topic}-{per_trigger}",
        max_offsets_per_trigger=per_trigger,
        metrics_port=0,
    )
    total = (
        spark.read.format("kafka")
        .options(**{"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
        .load()
        .count()
    )
    running = start_stream(spark, config)
    try:
        deadline = time.monotonic() + KAFKA_CATCH_UP_TIMEOUT_S
        while time.monotonic() < deadline:
            checked = running.metrics.registry.get_sample_value("sidecar_audit_stream_events_total")
            if checked is not None and checked >= total:
                break
            if not running.query.isActive:
                raise RuntimeError(f"the stream stopped: {running.query.exception()}")
            time.sleep(0.5)
        else:
            raise RuntimeError(f"not every event was counted within {KAFKA_CATCH_UP_TIMEOUT_S} s")
        found = sum(
            sample.value
            for family in running.metrics.registry.collect()
            for sample in family.samples
            if sample.name == "sidecar_audit_stream_anomalies_total"
        )
        assert found == 0, "the clean history has no anomaly"
        batches = [
            (int(progress["numInputRows"]), progress["durationMs"]["triggerExecution"] / 1000)
            for progress in running.query.recentProgress
            if progress["numInputRows"]
        ]
    finally:
        running.stop()
    return KafkaFigures(total, batches)


def kafka_section(args: argparse.Namespace, directory: Path) -> tuple[list[list[str]], list[str]]:
    """The live audit over the dev cluster's Kafka, embedded and on the project's
    standalone master and worker; (the section's rows, the Spark lines)."""
    rows = []
    spark_lines = []
    with provide_cluster() as cluster:
        for where in ("embedded", "standalone"):
            standalone = None
            if where == "embedded":
                options = SparkOptions(
                    master=args.master,
                    shuffle_partitions=args.shuffle_partitions,
                    conf={"spark.driver.memory": args.driver_memory},
                )
            else:
                standalone = SparkStandalone(directory / "standalone", cores=args.standalone_cores)
                standalone.start()
                options = SparkOptions(
                    master=standalone.master_url,
                    shuffle_partitions=args.standalone_cores,
                    conf={
                        "spark.driver.memory": args.driver_memory,
                        "spark.executor.memory": "512m",
                        "spark.cores.max": str(args.standalone_cores),
                    },
                )
            spark = build_session(options, kafka=True)
            try:
                spark_lines.append(
                    f"- {where}: Spark {spark.version}, master `{options.master}`"
                    + (
                        f", 1 executor of {args.standalone_cores} core(s) and 512 MiB"
                        if standalone
                        else ""
                    )
                    + f", driver memory {args.driver_memory}"
                )
                topic = fill_audit_topic(
                    spark, cluster.kafka_bootstrap, cluster.replication_factor, args.kafka_records
                )
                for per_trigger in args.per_trigger:
                    figures = measure_kafka(
                        spark, cluster.kafka_bootstrap, topic, per_trigger, directory
                    )
                    times = [t for _, t in figures.measured]
                    median = statistics.median(times)
                    each = ", ".join(f"{t:.1f}" for _, t in figures.batches)
                    print(
                        f"{where}, {per_trigger:,} a batch: {each} s; {figures.rate:,.0f} events/s"
                    )
                    rows.append(
                        [
                            where,
                            f"{per_trigger:,}",
                            f"{figures.events:,}",
                            each,
                            f"{median:.1f}",
                            f"{figures.rate:,.0f}",
                            f"{max(DEFAULT_TRIGGER_S, median) + median:.1f}",
                        ]
                    )
            finally:
                spark.stop()
                if standalone is not None:
                    standalone.stop()
    return rows, spark_lines


def replace_section(text: str, title: str, section: list[str]) -> str:
    """``text`` (a results file) with its section under ``title`` (up to the next
    section of the other part) replaced by ``section``, or ``section`` appended."""
    lines = text.splitlines()
    titles = SECTIONS
    start = next((i for i, line in enumerate(lines) if line.startswith(title)), None)
    if start is None:
        return "\n".join([*lines, "", *section, ""])
    end = next(
        (
            i
            for i in range(start + 1, len(lines))
            if lines[i].startswith(titles) and not lines[i].startswith(title)
        ),
        len(lines),
    )
    return "\n".join(
        [*lines[:start], *section, *([""] if end < len(lines) else []), *lines[end:], ""]
    )


def batch_section(spark: SparkSession, args: argparse.Namespace, directory: Path) -> list[str]:
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
    return [
        f"{BATCH_SECTION} (whole job, files in, every output written)",
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


def stream_section(spark: SparkSession, args: argparse.Namespace, directory: Path) -> list[str]:
    rows = []
    for size in args.batch_events:
        figures = measure_stream(spark, size, directory)
        each = ", ".join(f"{s:.1f}" for s in figures.seconds)
        print(f"{figures.per_batch:,.0f} events a batch: {each} s; {figures.rate:,.0f} events/s")
        rows.append(
            [
                f"{figures.per_batch:,.0f}",
                each,
                f"{figures.median_s:.1f}",
                f"{figures.max_s:.1f}",
                f"{figures.rate:,.0f}",
                f"{max(DEFAULT_TRIGGER_S, figures.median_s) + figures.median_s:.1f}",
            ]
        )
    batches = STREAM_WARMUP_BATCHES + STREAM_MEASURED_BATCHES
    return [
        f"{STREAM_SECTION} (micro-batches, embedded)",
        "",
        "The live audit's micro-batch function (`LiveAudit`: the batch's record values "
        "brought to the driver in one transfer, their JSON read, the checks over the "
        "state in memory, the batch journaled to a local checkpoint, the counts) over the "
        "same clean synthetic history as the audit topic holds it (one event's JSON a "
        f"record), cut by event time into {batches} micro-batches of each size and run "
        "one after the other with the state carried, as `sidecar audit stream` runs them. "
        "Each batch is in Spark's memory before its clock starts: reading the topic is "
        "not in the figures (see the Kafka section). The history's event time advances "
        "4,000 events a second, so the state keeps everything within the horizon "
        "(600 s), as it does in a job's first ten minutes. The first "
        f"{STREAM_WARMUP_BATCHES} batches of each size warm up; the median and max are of "
        f"the {STREAM_MEASURED_BATCHES} after them. Kept up with: events a batch over the "
        "median batch time (a job getting more than that falls behind). At that rate the "
        "batches run back to back and `sidecar_audit_stream_lag_seconds` peaks right "
        "before a batch ends, when the newest event checked is the previous batch's: at "
        "twice the median batch time (the trigger, "
        f"{DEFAULT_TRIGGER_S:.0f} s, plus it when it is shorter than the trigger).",
        "",
        *markdown_table(
            [
                "events a batch",
                "batch s (each, in order)",
                "median s",
                "max s",
                "events/s kept up with",
                "peak lag at that rate s",
            ],
            rows,
        ),
    ]


def kafka_lines(args: argparse.Namespace, directory: Path) -> list[str]:
    rows, spark_lines = kafka_section(args, directory)
    return [
        f"{KAFKA_SECTION} (Kafka source, every micro-batch whole)",
        "",
        *spark_lines,
        "",
        "`sidecar audit stream`'s query itself (`start_stream`: Spark's Kafka source, the "
        "record values brought to the driver, the checks, the journal, the counts) over a "
        "fresh audit topic of the dev cluster (3 brokers on the same 2 cores) filled "
        "beforehand with the clean synthetic history above, read from its start with "
        "`--max-offsets-per-trigger` records a micro-batch until `/metrics` counts every "
        "event. A micro-batch's time is Spark's (`triggerExecution`: reading the topic, "
        "the `foreachBatch` function, the offsets and commit logs). The first batch "
        "starts the executors and warms the JVM up and is not counted; events/s is the "
        "records of the others over their time: what the stream keeps up with. At that "
        "rate the batches run back to back and the lag peaks at the trigger (or the "
        "batch time, when longer) plus the batch time.",
        "",
        *markdown_table(
            [
                "where",
                "records a batch",
                "events",
                "batch s (each, in order)",
                "median s (after the first)",
                "events/s kept up with",
                "peak lag at that rate s",
            ],
            rows,
        ),
    ]


def after_lines(part: str, began: float) -> list[str]:
    return [
        f"- command: `{command_line('bench.audit')}` ({time.monotonic() - began:.0f} s of {part})",
        # Other work that started during the run shows here, not before it.
        "- load average after the run (1/5/15 min): "
        + " / ".join(f"{load:.2f}" for load in os.getloadavg()),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--part",
        choices=("batch", "stream", "kafka", "both"),
        default="both",
        help="the batch job, the live audit's micro-batches, the live audit on the dev "
        "cluster's Kafka, or the first two",
    )
    parser.add_argument(
        "--events",
        type=int,
        nargs="+",
        default=[1_000_000, 2_000_000],
        help="event counts to audit (about half produce_acked, half delivered)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs of each size")
    parser.add_argument(
        "--batch-events",
        type=int,
        nargs="+",
        default=[4_000, 20_000, 100_000, 250_000],
        help="events in each of the live audit's micro-batches",
    )
    parser.add_argument(
        "--kafka-records",
        type=int,
        default=600_000,
        help="records of the history written to the audit topic (two events each)",
    )
    parser.add_argument(
        "--per-trigger",
        type=int,
        nargs="+",
        default=[100_000, 250_000],
        help="records a micro-batch of the live audit on Kafka",
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--standalone-cores",
        type=int,
        default=2,
        help="cores of the standalone worker and its executor (--part kafka)",
    )
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    parser.add_argument("--driver-memory", default="2g")
    args = parser.parse_args()
    began = time.monotonic()
    # Read before Spark starts: the load of other work, not of this run.
    machine = machine_lines("not used (synthetic events in Parquet)")
    directory = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    sections: list[tuple[str, list[str]]] = []
    shared = [
        (part, title, build)
        for part, title, build in (
            ("batch", BATCH_SECTION, batch_section),
            ("stream", STREAM_SECTION, stream_section),
        )
        if args.part in (part, "both")
    ]
    try:
        if shared:
            spark = build_session(
                SparkOptions(
                    master=args.master,
                    shuffle_partitions=args.shuffle_partitions,
                    conf={"spark.driver.memory": args.driver_memory},
                ),
                kafka=False,
            )
            try:
                for part, title, build in shared:
                    part_began = time.monotonic()
                    title_line, _, *body = build(spark, args, directory)
                    header = [
                        *machine,
                        f"- Spark: {spark.version}, master `{args.master}`, "
                        f"{args.shuffle_partitions} shuffle partitions, driver memory "
                        f"{args.driver_memory}, adaptive execution off (the job's default)",
                        *after_lines(part, part_began),
                    ]
                    sections.append((title, [title_line, "", *header, "", *body]))
            finally:
                spark.stop()
        if args.part == "kafka":
            part_began = time.monotonic()
            machine = machine_lines(f"{KAFKA_VERSION}, 3 brokers (local cluster) on loopback")
            title_line, _, *body = kafka_lines(args, directory)
            header = [*machine, *after_lines("kafka", part_began)]
            sections.append((KAFKA_SECTION, [title_line, "", *header, "", *body]))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    path = RESULTS_DIR / "audit.md"
    text = path.read_text() if path.exists() else "# Audit benchmark\n"
    for title, section in sections:
        text = replace_section(text, title, section)
    path.write_text(text)
    print(f"written to {path} ({time.monotonic() - began:.0f} s)")


if __name__ == "__main__":
    main()
