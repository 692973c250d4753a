"""The live audit: ``sidecar audit stream``.

A Spark Structured Streaming query over the audit topic (Spark's Kafka source, with the
batch job's source settings and security options) whose micro-batches run the
incremental checks of ``ordered_audit.incremental`` (``foreachBatch``) and count what
they find in Prometheus metrics served by the driver itself
(``ordered_audit.stream_metrics``, ``/metrics`` on 127.0.0.1 by default).

Under ``--checkpoint``: ``spark/`` is the query's checkpoint (the source offsets of each
micro-batch) and ``state/<batch id>/`` the checks' state after that batch (Parquet) with
``meta.json`` (the newest event time through it, from which the next batch's watermark
follows, and the metrics' totals through it), written last and renamed into place: a
state directory without it is incomplete and never read. A batch reads the state of the
highest batch id below its own, so a batch Spark runs again after a restart (the one
that had not committed) starts from the same state and finds the same anomalies.

Counts after a restart: a process started on the checkpoint starts its counters from
the totals of the last complete state. Spark then runs again the batch that had not
committed, over the same offsets: when its state is complete, the killed process had
checked it and its counts are in those totals, so it is not checked again; when it is
not, the killed process never counted it, and it is checked and counted now. Either
way each anomaly is counted once. The checkpoint must be a local directory of the
driver.

Event time is the events' ``time``. The watermark of a batch is the newest event time
of the batches before it less ``--lateness``; state older than the watermark less
``--horizon`` is dropped (see ``ordered_audit.incremental`` for what is kept anyway and
what that bounds).

pyspark is imported only when the job runs, as in ``ordered_audit.job``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from ordered_audit.stream_metrics import StreamMetrics, Totals

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

DEFAULT_TRIGGER_S = 2.0
# Audit events reach the topic in the emitters' batches, a second or so after their
# time, from sidecars whose clocks agree to NTP's precision: a minute covers a slow
# emitter without holding state much longer.
DEFAULT_LATENESS_S = 60.0
# How long the checks remember which seqs and records they saw (beyond what they keep
# for good): long enough for a consumer restart's re-deliveries.
DEFAULT_HORIZON_S = 600.0
DEFAULT_METRICS_PORT = 9465
DEFAULT_MAX_TOPIC_LABELS = 50
# Anomalies of one batch written to the log, with their detail.
LOGGED_PER_BATCH = 20
# State directories kept: the last one (the next batch's) and the one before it (the
# state of a batch Spark may run again after a restart).
KEPT_STATES = 2


@dataclass(frozen=True, slots=True)
class StreamConfig:
    bootstrap: str
    topic: str
    checkpoint: Path
    kafka_options: dict[str, str] = field(default_factory=dict)
    starting_offsets: str = "earliest"
    """Where a query without a checkpoint starts: earliest or latest."""
    max_offsets_per_trigger: int | None = None
    trigger_s: float = DEFAULT_TRIGGER_S
    lateness_s: float = DEFAULT_LATENESS_S
    horizon_s: float = DEFAULT_HORIZON_S
    metrics_host: str = "127.0.0.1"
    metrics_port: int = DEFAULT_METRICS_PORT
    max_topic_labels: int = DEFAULT_MAX_TOPIC_LABELS

    def source_settings(self) -> dict[str, str]:
        settings = {"startingOffsets": self.starting_offsets}
        if self.max_offsets_per_trigger is not None:
            settings["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        return settings


@dataclass(frozen=True, slots=True)
class BatchState:
    tables: dict[str, DataFrame]
    """The checks' state, by the names of ``incremental.STATE_SCHEMAS``."""
    newest: float | None
    """The newest event time of every batch so far."""
    totals: Totals = field(default_factory=Totals)
    """The metrics' totals through this batch."""


class StateStore:
    """The checks' state per batch id under ``root`` (see the module's docstring)."""

    _META = "meta.json"

    def __init__(self, root: Path) -> None:
        self.root = root

    def _complete(self) -> list[int]:
        if not self.root.is_dir():
            return []
        ids = (int(p.name) for p in self.root.iterdir() if p.name.isdigit())
        return sorted(i for i in ids if self.is_complete(i))

    def is_complete(self, batch_id: int) -> bool:
        """Whether ``batch_id``'s state was saved whole."""
        return (self.root / str(batch_id) / self._META).is_file()

    def _meta(self, batch_id: int) -> tuple[float | None, Totals]:
        meta = json.loads((self.root / str(batch_id) / self._META).read_text())
        # A state of a version without totals: counted from zero (as that version did).
        totals = Totals.from_json(meta["totals"]) if "totals" in meta else Totals()
        return meta["newest"], totals

    def has_state(self) -> bool:
        return bool(self._complete())

    def latest(self) -> tuple[float | None, Totals]:
        """The newest event time and the totals of the last complete state (none: None
        and zeros), for a process started again on the checkpoint. No Spark needed."""
        complete = self._complete()
        return self._meta(complete[-1]) if complete else (None, Totals())

    def load(self, spark: SparkSession, batch_id: int) -> BatchState:
        """The state after the highest complete batch below ``batch_id`` (empty: none)."""
        from ordered_audit import incremental

        schemas = incremental.STATE_SCHEMAS
        earlier = [i for i in self._complete() if i < batch_id]
        if not earlier:
            empty = {name: incremental.empty_state(spark, s) for name, s in schemas.items()}
            return BatchState(empty, None)
        directory = self.root / str(earlier[-1])
        newest, totals = self._meta(earlier[-1])
        tables = {
            name: spark.read.schema(schema).parquet(str(directory / name))
            for name, schema in schemas.items()
        }
        return BatchState(tables, newest, totals)

    def save(self, batch_id: int, state: BatchState) -> None:
        directory = self.root / str(batch_id)
        # A batch run again overwrites what its first run left.
        shutil.rmtree(directory, ignore_errors=True)
        for name, table in state.tables.items():
            # Small tables: one file each rather than one per shuffle partition.
            table.coalesce(1).write.parquet(str(directory / name))
        meta = {"newest": state.newest, "totals": state.totals.to_json()}
        # Renamed into place: a process killed while writing leaves no partial meta.json.
        partial = directory / f"{self._META}.partial"
        partial.write_text(json.dumps(meta) + "\n")
        partial.replace(directory / self._META)

    def prune(self) -> None:
        complete = self._complete()
        for old in complete[:-KEPT_STATES]:
            shutil.rmtree(self.root / str(old), ignore_errors=True)


class LiveAudit:
    """The ``foreachBatch`` function: checks a micro-batch, saves the state, counts."""

    def __init__(self, spark: SparkSession, config: StreamConfig, metrics: StreamMetrics) -> None:
        self.spark = spark
        self.config = config
        self.metrics = metrics
        self.store = StateStore(config.checkpoint / "state")

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from ordered_audit import checks, incremental

        began = time.monotonic()
        if self.store.is_complete(batch_id):
            # Run again after a restart: checked and counted in full before (its counts
            # are in the totals the counters started from).
            log.info("audit stream: batch %d was checked before the restart", batch_id)
            return
        previous = self.store.load(self.spark, batch_id)
        watermark = None if previous.newest is None else previous.newest - self.config.lateness_s
        cutoff = None if watermark is None else watermark - self.config.horizon_s
        # The batch is read by every check and the counts: from memory, not the topic.
        events = checks.distinct_events(batch).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            late = F.col("time") < F.lit(watermark) if watermark is not None else F.lit(False)
            stats = events.agg(
                F.count(F.lit(1)).alias("events"),
                F.max("time").alias("newest"),
                F.count(F.when(late, 1)).alias("late"),
            ).first()
            if stats is None or not stats["events"]:
                return
            count, late_count = int(stats["events"]), int(stats["late"])
            newest_here: float = stats["newest"]
            checked = incremental.check_batch(previous.tables, events, cutoff)
            for frame in checked.shared:
                frame.persist(StorageLevel.MEMORY_AND_DISK)
            found = checked.anomalies.persist(StorageLevel.MEMORY_AND_DISK)
            try:
                counts = {
                    (row["kind"], row["topic"]): int(row["count"])
                    for row in found.groupBy("kind", "topic").count().collect()
                }
                totals = previous.totals.plus(self.metrics.labelled(counts), count, late_count)
                for row in found.orderBy("time").limit(LOGGED_PER_BATCH).collect():
                    log.warning(
                        "audit stream: %s in %s (group %s, key %s, partition %s offset %s): %s",
                        row["kind"],
                        row["topic"],
                        row["group"],
                        row["key"],
                        row["partition"],
                        row["offset"],
                        row["detail"],
                    )
                newest = (
                    newest_here if previous.newest is None else max(previous.newest, newest_here)
                )
                self.store.save(batch_id, BatchState(checked.states, newest, totals))
            finally:
                found.unpersist()
                for frame in checked.shared:
                    frame.unpersist()
            self.store.prune()
            self.metrics.record_batch(
                events=count, late=late_count, newest=newest_here, anomalies=counts
            )
            log.info(
                "audit stream: batch %d, %d events, %d anomalies, %.1f s",
                batch_id,
                count,
                sum(counts.values()),
                time.monotonic() - began,
            )
        finally:
            events.unpersist()


@dataclass
class RunningStream:
    query: StreamingQuery
    metrics: StreamMetrics
    port: int
    """Where ``/metrics`` is served."""

    def stop(self) -> None:
        try:
            self.query.stop()
        finally:
            self.metrics.close()


def start_stream(spark: SparkSession, config: StreamConfig) -> RunningStream:
    """Start the live audit on ``spark`` (a session with the Kafka connector) and its
    metrics server; the caller stops it."""
    from ordered_audit import incremental, sources

    metrics = StreamMetrics(incremental.STREAM_KINDS, config.max_topic_labels)
    newest, totals = StateStore(config.checkpoint / "state").latest()
    metrics.restore(newest, totals)
    if totals.events:
        log.info(
            "audit stream: counters go on from the checkpoint: %d events, %d anomalies",
            totals.events,
            sum(totals.anomalies.values()),
        )
    port = metrics.serve(config.metrics_host, config.metrics_port)
    log.info("audit stream: metrics on http://%s:%d/metrics", config.metrics_host, port)
    try:
        events = sources.read_kafka_stream(
            spark,
            config.bootstrap,
            config.topic,
            config.source_settings(),
            config.kafka_options,
        )
        query = (
            events.writeStream.foreachBatch(LiveAudit(spark, config, metrics))
            .option("checkpointLocation", str(config.checkpoint / "spark"))
            .trigger(processingTime=f"{config.trigger_s} seconds")
            .queryName("ordered-sidecar-audit-stream")
            .start()
        )
    except BaseException:
        metrics.close()
        raise
    return RunningStream(query, metrics, port)


@contextmanager
def _stop_on_signal() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT (Ctrl-C), the previous handlers restored after."""
    stopping = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stopping
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run_stream_command(args: argparse.Namespace) -> int:
    from ordered_audit.job import AuditError, build_session, stream_config_from_args

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        config, options = stream_config_from_args(args)
        spark = build_session(options, kafka=True)
    except AuditError as exc:
        print(f"sidecar audit: {exc}", file=sys.stderr)
        return 2
    from pyspark.errors import StreamingQueryException

    failed: StreamingQueryException | None = None
    try:
        running = start_stream(spark, config)
        try:
            with _stop_on_signal() as stopping:
                # Short waits, so that a signal is seen between them.
                while not stopping.is_set() and running.query.isActive:
                    running.query.awaitTermination(1)
        except StreamingQueryException as exc:
            failed = exc
        finally:
            running.stop()
    finally:
        spark.stop()
    if failed is not None:
        print(f"sidecar audit: the stream failed: {failed}", file=sys.stderr)
        return 1
    return 0
