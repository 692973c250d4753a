"""The ordering-audit job: ``sidecar audit run``.

Reads audit events (the audit topic with Spark's Kafka source, or JSON-lines/Parquet
files), runs the checks of ``ordered_audit.checks``, joins Prometheus range data per
partition-count change and per time bucket, and writes to ``--out``:

- ``anomalies/``, ``operations/``, ``buckets/``: Parquet tables;
- ``summary.json``: anomaly counts by kind, the changes, the window;
- ``report.md`` with ``violations.png`` and ``gate_stalls.png``;
- ``anomalies.prom``: ``sidecar_audit_anomalies_total{kind}`` for a textfile collector.

Spark runs embedded (``local[*]``, no UI, driver on 127.0.0.1) unless ``--master``
names a cluster (``spark://host:7077``); nothing else changes. The Kafka connector
(``org.apache.spark:spark-sql-kafka-0-10_2.13`` of the installed pyspark's version)
is resolved by Ivy from Maven Central into ``$ORDERED_SIDECAR_CACHE/spark-ivy`` the
first time, only when the job reads from Kafka.

pyspark is an optional dependency (the ``audit`` extra): this module imports it only
when the job runs, so the rest of the CLI works without it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ordered_audit import prometheus
from ordered_audit.prometheus import PeriodStats, Series
from sidecar.audit.events import SCHEMA_VERSION

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ordered_audit.sources import TimeWindow
    from ordered_audit.stream import StreamConfig

DEFAULT_MASTER = "local[*]"
DEFAULT_BUCKET_S = 10.0
# Jars the Kafka connector depends on that pyspark already ships: not downloaded again.
_BUNDLED = (
    "org.apache.hadoop:hadoop-client-api",
    "org.apache.hadoop:hadoop-client-runtime",
    "org.slf4j:slf4j-api",
    "org.xerial.snappy:snappy-java",
    "at.yawk.lz4:lz4-java",
    "org.lz4:lz4-java",
    "com.google.code.findbugs:jsr305",
    "org.scala-lang.modules:scala-parallel-collections_2.13",
)


class AuditError(Exception):
    """The job cannot run as asked (bad arguments, Spark or Prometheus unavailable)."""


@dataclass(frozen=True, slots=True)
class SparkOptions:
    master: str = DEFAULT_MASTER
    driver_host: str = "127.0.0.1"
    shuffle_partitions: int = 4
    kafka_package: str | None = None
    """Maven coordinates of the Kafka connector; None: of the installed pyspark."""
    conf: dict[str, str] = field(default_factory=dict)
    """More Spark settings (``--conf``), applied last."""


@dataclass(frozen=True, slots=True)
class AuditConfig:
    out: Path
    bootstrap: str | None = None
    topic: str | None = None
    kafka_options: dict[str, str] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    input_format: str = "auto"
    start: float | None = None
    end: float | None = None
    prometheus: str | None = None
    step_s: float | None = None
    bucket_s: float = DEFAULT_BUCKET_S
    samples_per_kind: int = 20

    def window(self) -> TimeWindow:
        from ordered_audit.sources import TimeWindow

        return TimeWindow(self.start, self.end)


@dataclass(frozen=True, slots=True)
class AuditResult:
    summary: dict[str, Any]
    out: Path

    @property
    def anomaly_count(self) -> int:
        total: int = self.summary["anomalies"]["total"]
        return total


# The Spark session ------------------------------------------------------------------


def kafka_package() -> str:
    """The Kafka connector matching the installed pyspark (Scala 2.13, as pyspark 4)."""
    import pyspark

    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def ivy_directory() -> Path:
    """Where Ivy keeps the connector's jars: ``$ORDERED_SIDECAR_CACHE/spark-ivy``.

    The same cache as the dev cluster's (``ordered_dev.devcluster.install``), read here
    on its own: the audit job is installed and run without the dev tooling."""
    configured = os.environ.get("ORDERED_SIDECAR_CACHE")
    root = Path(configured) if configured else Path.home() / ".cache" / "ordered-sidecar"
    return root / "spark-ivy"


def session_settings(options: SparkOptions, *, kafka: bool) -> dict[str, str]:
    """The Spark settings of the job's session (pure: tests check them)."""
    settings = {
        "spark.master": options.master,
        "spark.app.name": "ordered-sidecar-audit",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(options.shuffle_partitions),
        # The checks are dozens of small shuffles over a table that fits one machine:
        # adaptive execution re-plans after each one and doubles the stages (and the
        # time: 10 s against 20 s for a small audit on 2 cores). --conf turns it back
        # on for a large window on a cluster.
        "spark.sql.adaptive.enabled": "false",
        # A run generates some 400 classes: Spark's cache of compiled ones (100 by
        # default) keeps none of them for the next run in the session, which compiles
        # them all again (and the JVM optimizes them again), nor for a repeat later in
        # the same run.
        "spark.sql.codegen.cache.maxEntries": "1000",
        # PySpark's query context: every column function would ask the JVM for the
        # session, the setting and the origin object, then set and clear the caller's
        # file and line there, five round trips over py4j each. A run made 12,377 calls
        # with it and 4,617 without, and a warm run of 40,000 events took 0.7-1.2 s
        # less. What it adds, the Python line in an analysis error's message, names a
        # line of this package, not the operator's input; --conf turns it back on.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.host": options.driver_host,
        "spark.driver.bindAddress": options.driver_host,
        # Executors (local or on a cluster's workers on this machine) run the same
        # Python as the driver: the one pyspark and this package are installed in.
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }
    if kafka:
        settings |= {
            "spark.jars.packages": options.kafka_package or kafka_package(),
            "spark.jars.ivy": str(ivy_directory()),
            "spark.jars.excludes": ",".join(_BUNDLED),
        }
    return settings | options.conf


def build_session(options: SparkOptions, *, kafka: bool) -> SparkSession:
    """A Spark session for the job; raises AuditError when Spark cannot start (no
    ``java``, the connector not resolvable, the master unreachable)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise AuditError("pyspark is not installed: pip install 'ordered-sidecar[audit]'") from exc
    # The JVM picks its own address otherwise (with a warning when the hostname
    # resolves to loopback); the driver must listen where it says it does.
    os.environ.setdefault("SPARK_LOCAL_IP", options.driver_host)
    builder = SparkSession.builder
    for name, value in session_settings(options, kafka=kafka).items():
        builder = builder.config(name, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # pyspark raises bare Exceptions for a JVM that exited
        hint = (
            f" (is {options.kafka_package or kafka_package()} on Maven Central? "
            "--kafka-package names another)"
            if kafka
            else ""
        )
        raise AuditError(f"Spark did not start{hint}: {exc}") from exc
    spark.sparkContext.setLogLevel("WARN")
    return spark


# The job -----------------------------------------------------------------------------


def load_events(spark: SparkSession, config: AuditConfig) -> DataFrame:
    from ordered_audit import sources

    if config.inputs:
        return sources.read_files(spark, config.inputs, config.window(), config.input_format)
    if not (config.bootstrap and config.topic):
        raise AuditError("give --bootstrap and --topic, or --input files")
    return sources.read_kafka(
        spark, config.bootstrap, config.topic, config.window(), config.kafka_options
    )


def run_audit(spark: SparkSession, config: AuditConfig) -> AuditResult:
    """Run the audit on ``spark`` and write its outputs to ``config.out``.

    Raises AuditError (bad input, Prometheus unreachable).
    """
    from pyspark.sql import functions as F

    from ordered_audit import checks, report, sources

    began = time.monotonic()
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    loaded = load_events(spark, config)
    # Read once, into Spark's cache, where each action would read it again at a cost:
    # the Kafka source reads the topic again, JSON lines are parsed again. Parquet is
    # not: each action reads only the columns it needs, which costs less than caching
    # every column (measured: 3.4-3.7 s of a run of 1,000,000 events went to building
    # the cache; the whole run took 16-17 s without it, 18-20 s with it).
    if not (config.inputs and sources.all_parquet(config.inputs, config.input_format)):
        loaded = loaded.cache()
    # Dropping repeats keeps one whole row of each event and sorts every row to find
    # them (the slowest step of the job when there is none to drop): only when there
    # may be some.
    if not checks.may_repeat_events(loaded).isEmpty():
        distinct = checks.distinct_events(loaded).cache()
        distinct.count()
        loaded.unpersist()
        loaded = distinct
    events, _ = sources.split_schema_versions(loaded)
    by_type: dict[str, int] = {}
    other_schema = 0
    times: list[float] = []
    # The counts and the window's bounds in one action: each one plans and scans the
    # events again.
    per_type = loaded.groupBy("schema", "type").agg(
        F.count(F.lit(1)).alias("count"), F.min("time").alias("first"), F.max("time").alias("last")
    )
    for row in per_type.collect():
        if row["schema"] == SCHEMA_VERSION:
            by_type[row["type"]] = row["count"]
            times += [bound for bound in (row["first"], row["last"]) if bound is not None]
        else:
            other_schema += row["count"]
    first_time = min(times, key=_spark_order, default=None)
    last_time = max(times, key=_spark_order, default=None)
    start = config.start if config.start is not None else first_time
    end = config.end if config.end is not None else (None if last_time is None else last_time + 1)
    if start is None or end is None:
        now = time.time()
        start, end = (start or now), (end or now)

    # Prometheus before the long part: an unreachable one fails the job at once.
    series: list[Series] = []
    prometheus_summary: dict[str, Any] | None = None
    if config.prometheus:
        step = config.step_s or prometheus.default_step(start, end)
        try:
            series = prometheus.fetch(config.prometheus, start, end, step)
        except prometheus.PrometheusError as exc:
            raise AuditError(str(exc)) from exc
        prometheus_summary = {"url": config.prometheus, "step": step, "series": len(series)}

    # Both the lost records and the unseen ones are acknowledged records a group did
    # not get: one anti-join of every acknowledgement against every delivery, kept.
    undelivered = checks.undelivered(events).cache()
    found = checks.anomalies(events, undelivered).cache()
    found.write.mode("overwrite").parquet(str(out / "anomalies"))
    counted = found.groupBy("kind", "detail").count().collect()
    by_kind = {kind: 0 for kind in checks.KINDS}
    causes: dict[str, int] = {}
    for row in counted:
        by_kind[row["kind"]] += row["count"]
        if row["kind"] == checks.DUPLICATE:
            causes[row["detail"]] = causes.get(row["detail"], 0) + row["count"]

    # Cached: violations_per_operation reads the operations twice, and each reading
    # would run their whole plan (phases, keys moved, produce gaps) again.
    changes = checks.operations(events).cache()
    operations = [
        row.asDict()
        for row in checks.violations_per_operation(changes, found).orderBy("start").collect()
    ]
    changes.unpersist()
    event_buckets = {
        float(row["bucket"]): row.asDict()
        for row in checks.per_bucket(events, found, config.bucket_s).collect()
    }
    unseen = [
        row.asDict()
        for row in checks.unseen(events, undelivered).orderBy("group", "topic").collect()
    ]
    undelivered.unpersist()
    samples = _samples(found, config.samples_per_kind)

    for op in operations:
        period_end = op["period_end"] if op["period_end"] is not None else end
        stats = prometheus.period_stats(series, op["start"], period_end, op["topic"])
        op.update(_stats_columns(stats, bool(config.prometheus)))
    buckets = _buckets(event_buckets, series, start, end, config)

    _write_table(spark, out / "operations", operations, _OPERATION_COLUMNS)
    _write_table(spark, out / "buckets", buckets, _bucket_columns())

    summary: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "window": {
            "start": start,
            "end": end,
            "start_iso": report.iso(start),
            "end_iso": report.iso(end),
        },
        "source": _source(config),
        "events": {
            "total": sum(by_type.values()),
            "by_type": by_type,
            "other_schema": other_schema,
        },
        "anomalies": {
            "total": sum(by_kind.values()),
            "by_kind": by_kind,
            "duplicates_by_cause": causes,
        },
        "unseen": unseen,
        "operations": operations,
        "prometheus": prometheus_summary,
        "elapsed_s": round(time.monotonic() - began, 3),
    }
    charts = report.draw_charts(out, buckets, operations, config.bucket_s)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out / "report.md").write_text(
        report.render_markdown(summary, operations, buckets, samples, charts)
    )
    (out / "anomalies.prom").write_text(report.prometheus_textfile(by_kind))
    found.unpersist()
    loaded.unpersist()
    return AuditResult(summary, out)


_OPERATION_COLUMNS = (
    ("topic", "string"),
    ("kind", "string"),
    ("from_generation", "bigint"),
    ("from_count", "bigint"),
    ("target_count", "bigint"),
    ("result", "string"),
    ("coordinator", "string"),
    ("start", "double"),
    ("end", "double"),
    ("duration_s", "double"),
    ("barrier_s", "double"),
    ("ack_gap_s", "double"),
    ("period_end", "double"),
    ("phase_events", "bigint"),
    ("keys_moved", "bigint"),
    ("keys_seen_in_both", "bigint"),
    ("violations", "bigint"),
    ("held_max", "double"),
    ("hold_p99_s", "double"),
    ("hold_max_s", "double"),
    ("holds", "double"),
    ("fenced", "double"),
    ("gated_max", "double"),
    ("gate_wait_p99_s", "double"),
    ("gate_wait_max_s", "double"),
    ("gate_waits", "double"),
)
_STATS = (
    "held_max",
    "hold_p99_s",
    "hold_max_s",
    "holds",
    "fenced",
    "gated_max",
    "gate_wait_p99_s",
    "gate_wait_max_s",
    "gate_waits",
)


def _bucket_columns() -> tuple[tuple[str, str], ...]:
    from ordered_audit.checks import KINDS

    counts = tuple(
        (name, "bigint") for name in ("produce_acked", "delivered", "violations", *KINDS)
    )
    return (("bucket", "double"), *counts, *((name, "double") for name in _STATS))


def _stats_columns(stats: PeriodStats, asked: bool) -> dict[str, float | None]:
    values: dict[str, float | None] = asdict(stats)
    if asked:
        # Prometheus answered: a counter or histogram without series grew by nothing.
        for name in ("holds", "fenced", "gate_waits"):
            values[name] = values[name] or 0.0
    return values


def _buckets(
    event_buckets: dict[float, dict[str, Any]],
    series: Sequence[Series],
    start: float,
    end: float,
    config: AuditConfig,
) -> list[dict[str, Any]]:
    """One row per bucket of the window: event and anomaly counts, Prometheus figures."""
    from ordered_audit.checks import KINDS

    size = config.bucket_s
    zero = {name: 0 for name in ("produce_acked", "delivered", "violations", *KINDS)}
    first = math.floor(start / size) * size
    count = max(1, math.ceil((end - first) / size))
    stats = prometheus.bucket_stats(series, first, size, count)
    rows = []
    for index, bucket_stats in enumerate(stats):
        bucket = first + index * size
        row: dict[str, Any] = {"bucket": bucket} | zero | event_buckets.get(bucket, {})
        row.update(_stats_columns(bucket_stats, bool(config.prometheus)))
        rows.append(row)
    return rows


def _spark_order(value: float) -> tuple[bool, float]:
    """Orders numbers as Spark's min and max do: NaN above every other."""
    return (math.isnan(value), value)


def _samples(found: DataFrame, per_kind: int) -> list[dict[str, Any]]:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ranked = found.withColumn(
        "_nth", F.row_number().over(Window.partitionBy("kind").orderBy("time", "offset"))
    )
    rows = ranked.where(F.col("_nth") <= per_kind).drop("_nth").orderBy("kind", "time").collect()
    return [row.asDict() for row in rows]


def _write_table(
    spark: SparkSession,
    path: Path,
    rows: Sequence[dict[str, Any]],
    columns: Sequence[tuple[str, str]],
) -> None:
    schema = ", ".join(f"`{name}` {kind}" for name, kind in columns)
    values = [tuple(_cell(row.get(name), kind) for name, kind in columns) for row in rows]
    frame = spark.createDataFrame(values, schema).coalesce(1)
    frame.write.mode("overwrite").parquet(str(path))


def _cell(value: Any, kind: str) -> Any:
    if value is None:
        return None
    if kind == "double":
        return float(value)
    if kind == "bigint":
        return int(value)
    return value


def _source(config: AuditConfig) -> str:
    if config.inputs:
        return "files " + ", ".join(config.inputs)
    return f"Kafka topic {config.topic} at {config.bootstrap}"


# The command line ----------------------------------------------------------------------

_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, now: float | None = None) -> float:
    """Epoch seconds from ``now``, ``-15m`` (s/m/h/d before now), epoch seconds, or ISO
    8601 (UTC when it names no zone). Raises ValueError."""
    now = time.time() if now is None else now
    text = text.strip()
    if text == "now":
        return now
    relative = _RELATIVE.match(text)
    if relative:
        return now - float(relative.group(1)) * _UNITS[relative.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def _pairs(items: Sequence[str], what: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise AuditError(f"{what} takes NAME=VALUE, got {item!r}")
        pairs[name] = value
    return pairs


def _add_kafka_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """The audit topic and how to reach it (both jobs)."""
    source = parser.add_argument_group("the audit topic")
    source.add_argument(
        "--bootstrap", required=required, help="Kafka bootstrap servers of the audit topic"
    )
    source.add_argument("--topic", default="ordered-sidecar-audit", help="the audit topic")
    source.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an option of Spark's Kafka source, e.g. kafka.security.protocol=SSL",
    )
    source.add_argument(
        "--sidecar-config",
        type=Path,
        help="the sidecars' TOML settings: their kafka.security (with the ORDERED_SIDECAR__ "
        "environment, as 'sidecar serve' reads it) becomes the Kafka source's options",
    )


def _add_spark_arguments(parser: argparse.ArgumentParser) -> None:
    spark = parser.add_argument_group("Spark")
    spark.add_argument("--master", default=DEFAULT_MASTER, help="local[*] or spark://host:port")
    spark.add_argument("--driver-host", default="127.0.0.1", help="address the driver binds")
    spark.add_argument("--shuffle-partitions", type=int, default=4)
    spark.add_argument(
        "--kafka-package",
        default=os.environ.get("ORDERED_SIDECAR_SPARK_KAFKA_PACKAGE"),
        help="Maven coordinates of the Kafka connector (default: of the installed pyspark)",
    )
    spark.add_argument(
        "--conf", action="append", default=[], metavar="NAME=VALUE", help="a Spark setting"
    )


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ordered_audit import stream

    audit = subparsers.add_parser("audit", help="the ordering audit (PySpark)")
    actions = audit.add_subparsers(dest="action", required=True)
    run = actions.add_parser(
        "run",
        help="check per-key order over audit events; write tables, summary and report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_kafka_arguments(run, required=False)
    files = run.add_argument_group("or files")
    files.add_argument(
        "--input", nargs="+", default=[], metavar="FILE", help="JSON-lines or Parquet files"
    )
    files.add_argument("--input-format", choices=("auto", "json", "parquet"), default="auto")
    run.add_argument(
        "--from",
        dest="start",
        help="window start: ISO 8601, epoch seconds, now, or --from=-15m (default: all)",
    )
    run.add_argument("--to", dest="end", help="window end (exclusive; default: the last event)")
    run.add_argument("--prometheus", help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    run.add_argument("--step", type=float, help="query_range step in seconds (default: auto)")
    run.add_argument("--bucket", type=float, default=DEFAULT_BUCKET_S, help="time bucket (s)")
    run.add_argument("--out", type=Path, required=True, help="output directory")
    run.add_argument(
        "--fail-on-anomalies", action="store_true", help="exit 1 when an anomaly was found"
    )
    _add_spark_arguments(run)
    run.set_defaults(handler=run_command)

    live = actions.add_parser(
        "stream",
        help="check the audit topic as it is written; anomaly counts on /metrics",
        description=stream.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_kafka_arguments(live, required=True)
    live.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        help="a local directory for the query's offsets and the checks' state",
    )
    live.add_argument(
        "--starting-offsets",
        choices=("earliest", "latest"),
        default="earliest",
        help="where a query without a checkpoint starts reading",
    )
    live.add_argument(
        "--max-offsets-per-trigger", type=int, help="cap on records read per micro-batch"
    )
    live.add_argument(
        "--trigger",
        type=float,
        default=stream.DEFAULT_TRIGGER_S,
        help="seconds between micro-batches",
    )
    live.add_argument(
        "--lateness",
        type=float,
        default=stream.DEFAULT_LATENESS_S,
        help="watermark delay: how far behind the newest event time an event may come (s)",
    )
    live.add_argument(
        "--horizon",
        type=float,
        default=stream.DEFAULT_HORIZON_S,
        help="how long before the watermark the checks remember seqs and records (s)",
    )
    live.add_argument("--metrics-host", default="127.0.0.1", help="address /metrics binds")
    live.add_argument(
        "--metrics-port",
        type=int,
        default=stream.DEFAULT_METRICS_PORT,
        help="port of /metrics (0: any free port; the bound one is logged)",
    )
    live.add_argument(
        "--max-topic-labels",
        type=int,
        default=stream.DEFAULT_MAX_TOPIC_LABELS,
        help="topics counted by name in the anomaly metric; the rest as 'other'",
    )
    live.add_argument(
        "--stop-grace",
        type=float,
        default=stream.DEFAULT_STOP_GRACE_S,
        help="on SIGTERM, how long to let the micro-batch in progress end (s)",
    )
    _add_spark_arguments(live)
    live.set_defaults(handler=stream.run_stream_command)


def _spark_options(args: argparse.Namespace) -> SparkOptions:
    return SparkOptions(
        master=args.master,
        driver_host=args.driver_host,
        shuffle_partitions=args.shuffle_partitions,
        kafka_package=args.kafka_package,
        conf=_pairs(args.conf, "--conf"),
    )


def _kafka_options(args: argparse.Namespace) -> dict[str, str]:
    return _security_options(args) | _pairs(args.kafka_option, "--kafka-option")


def config_from_args(args: argparse.Namespace) -> tuple[AuditConfig, SparkOptions]:
    """Raises AuditError for arguments that do not make a job."""
    if bool(args.input) == bool(args.bootstrap):
        raise AuditError("give either --bootstrap (the audit topic) or --input files")
    try:
        start = None if args.start is None else parse_time(args.start)
        end = None if args.end is None else parse_time(args.end)
    except ValueError as exc:
        raise AuditError(f"bad --from/--to: {exc}") from exc
    if start is not None and end is not None and end <= start:
        raise AuditError("--to must be after --from")
    if args.bucket <= 0:
        raise AuditError("--bucket must be positive")
    config = AuditConfig(
        out=args.out,
        bootstrap=args.bootstrap,
        topic=args.topic,
        kafka_options=_kafka_options(args),
        inputs=tuple(args.input),
        input_format=args.input_format,
        start=start,
        end=end,
        prometheus=args.prometheus,
        step_s=args.step,
        bucket_s=args.bucket,
    )
    return config, _spark_options(args)


def stream_config_from_args(args: argparse.Namespace) -> tuple[StreamConfig, SparkOptions]:
    """``sidecar audit stream``'s settings; raises AuditError for ones that make no job."""
    from ordered_audit.stream import StateStore, StreamConfig

    if args.trigger <= 0:
        raise AuditError("--trigger must be positive")
    if args.lateness < 0 or args.horizon < 0:
        raise AuditError("--lateness and --horizon must not be negative")
    if not 0 <= args.metrics_port <= 65535:
        raise AuditError("--metrics-port must be a port number (0: any free one)")
    if args.max_topic_labels < 1:
        raise AuditError("--max-topic-labels must be at least 1")
    if args.stop_grace < 0:
        raise AuditError("--stop-grace must not be negative")
    if args.max_offsets_per_trigger is not None and args.max_offsets_per_trigger < 1:
        raise AuditError("--max-offsets-per-trigger must be at least 1")
    if StateStore(args.checkpoint / "state").has_earlier_layout():
        raise AuditError(
            f"--checkpoint {args.checkpoint} holds the checks' state as an earlier version "
            "wrote it (Parquet, state/<batch id>/), which this version does not read: "
            "start on a new checkpoint"
        )
    offsets = args.checkpoint / "spark" / "offsets"
    spark_checkpoint = offsets.is_dir() and any(p.name.isdigit() for p in offsets.iterdir())
    if StateStore(args.checkpoint / "state").has_state() and not spark_checkpoint:
        # Spark would number its batches from 0 again, and they would meet the state
        # (and the totals) of another run's batches of the same ids.
        raise AuditError(
            f"--checkpoint {args.checkpoint} holds the checks' state but no Spark offsets "
            "(spark/offsets): keep or delete the checkpoint whole"
        )
    config = StreamConfig(
        bootstrap=args.bootstrap,
        topic=args.topic,
        checkpoint=args.checkpoint,
        kafka_options=_kafka_options(args),
        starting_offsets=args.starting_offsets,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        trigger_s=args.trigger,
        lateness_s=args.lateness,
        horizon_s=args.horizon,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        max_topic_labels=args.max_topic_labels,
        stop_grace_s=args.stop_grace,
    )
    return config, _spark_options(args)


def _security_options(args: argparse.Namespace) -> dict[str, str]:
    """The sidecars' ``kafka.security`` (from ``--sidecar-config`` and the environment)
    as Kafka source options; none when reading files."""
    if not args.bootstrap:
        return {}
    from ordered_audit.sources import spark_kafka_options
    from sidecar.config import ConfigError, load_settings

    try:
        settings = load_settings(args.sidecar_config)
        return spark_kafka_options(settings.kafka.security)
    except ConfigError as exc:
        raise AuditError(f"the sidecar settings: {exc}") from exc


def run_command(args: argparse.Namespace) -> int:
    began = time.monotonic()
    try:
        config, options = config_from_args(args)
        spark = build_session(options, kafka=not config.inputs)
        try:
            result = run_audit(spark, config)
        finally:
            spark.stop()
    except AuditError as exc:
        print(f"sidecar audit: {exc}", file=sys.stderr)
        return 2
    anomalies = result.summary["anomalies"]
    kinds = ", ".join(f"{k} {n}" for k, n in anomalies["by_kind"].items() if n) or "none"
    print(
        f"audit: {result.summary['events']['total']} events, "
        f"{len(result.summary['operations'])} partition-count changes, "
        f"{anomalies['total']} anomalies ({kinds}) in {time.monotonic() - began:.1f} s; "
        f"report: {result.out / 'report.md'}"
    )
    return 1 if args.fail_on_anomalies and result.anomaly_count else 0
