"""The live audit: ``sidecar audit stream``.

A Spark Structured Streaming query over the audit topic (Spark's Kafka source, with the
batch job's source settings and security options). Each micro-batch's record values
come to the driver in one transfer (``foreachBatch``), where the checks of
``ordered_audit.live_checks`` run over them and the state they keep in memory; what
they find is counted in Prometheus metrics served by the driver itself
(``ordered_audit.stream_metrics``, ``/metrics`` on 127.0.0.1 by default). Spark reads
the topic, keeps the source offsets of each micro-batch, and runs unchanged on a
standalone cluster; the checks' state lives in the driver's memory, bounded by the
horizon (see ``live_checks``).

Under ``--checkpoint``: ``spark/`` is the query's checkpoint, and ``state/`` a journal
of the batches checked: ``<batch id>.values.json`` (the batch's record values) and
``<batch id>.json`` (the cutoff its events were checked with, the newest event time
through it and the metrics' totals through it), each written whole and renamed into
place, the second last: a batch without it is incomplete. Once the journal holds
``SNAPSHOT_EVENTS`` events (or ``SNAPSHOT_BATCHES`` batches) since the last snapshot,
``<batch id>.state.pickle`` holds the checks' state after that batch and the journal
before it is dropped. A process started on the checkpoint rebuilds the state from the
newest snapshot and the journal after it, checking those batches again with their saved
cutoffs (the checks are deterministic), so a batch Spark runs again after a restart (the
one that had not committed) starts from the same state and finds the same anomalies.

Counts after a restart: a process started on the checkpoint starts its counters from
the totals of the last complete batch. Spark then runs again the batch that had not
committed, over the same offsets: when its journal entry is complete, the killed
process had checked it and its counts are in those totals, so it is not checked again;
when it is not, the killed process never counted it, and it is checked and counted now.
Either way each anomaly is counted once. The checkpoint must be a local directory of
the driver, written by nothing else (its snapshots are pickles).

Event time is the events' ``time``. The watermark of a batch is the newest event time
of the batches before it less ``--lateness``; state older than the watermark less
``--horizon`` is dropped (see ``ordered_audit.live_checks`` for what is kept anyway and
what that bounds).

pyspark is imported only when the job runs, as in ``ordered_audit.job``.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import json
import logging
import pickle
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import orjson

from ordered_audit.stream_metrics import StreamMetrics, Totals

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from ordered_audit.live_checks import LiveState

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
# A micro-batch of 250,000 events takes about 5 s on 2 cores: a stop waits for one that
# long and more, and still ends within a container's usual 30 s grace.
DEFAULT_STOP_GRACE_S = 20.0
DEFAULT_MAX_TOPIC_LABELS = 50
# Anomalies of one batch written to the log, with their detail.
LOGGED_PER_BATCH = 20
# Events (or batches) journaled between two snapshots of the checks' state: a restart
# checks at most this many again, and a snapshot (a pickle of the whole state) is
# written this seldom.
SNAPSHOT_EVENTS = 2_000_000
SNAPSHOT_BATCHES = 300
# A snapshot takes time in proportion to the state (several seconds a million rows):
# at least this many events journaled per row kept between two snapshots bounds their
# share of the stream's time.
SNAPSHOT_EVENTS_PER_ROW = 2.0
# Batches between two collections of everything, the frozen state included (see
# ``_collector_paused``): a cycle that was alive when a batch ended (Spark's objects for
# the batch among them) is frozen with the state, and is freed at the next of these.
# About 1.3 s for the state of 1,200,000 events, once every so many batches.
FULL_COLLECTION_BATCHES = 100
_META = ".json"
_VALUES = ".values.json"
_SNAPSHOT = ".state.pickle"


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
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    """How long a stop waits for the micro-batch in progress to end."""
    full_collection_batches: int = FULL_COLLECTION_BATCHES
    """Batches between two collections of everything, the frozen state too (at least 1)."""

    def source_settings(self) -> dict[str, str]:
        settings = {"startingOffsets": self.starting_offsets}
        if self.max_offsets_per_trigger is not None:
            settings["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        return settings


class StateStore:
    """The checks' state under ``root`` (see the module's docstring): a journal of the
    batches checked and, now and then, a snapshot of the state after one of them."""

    def __init__(
        self,
        root: Path,
        snapshot_events: int = SNAPSHOT_EVENTS,
        events_per_row: float = SNAPSHOT_EVENTS_PER_ROW,
    ) -> None:
        self.root = root
        self.snapshot_events = snapshot_events
        self.events_per_row = events_per_row
        self._since_snapshot: tuple[int, int] | None = None
        """Events and batches journaled since the last snapshot (None: not read yet)."""

    def _meta_path(self, batch_id: int) -> Path:
        return self.root / f"{batch_id}{_META}"

    def _values_path(self, batch_id: int) -> Path:
        return self.root / f"{batch_id}{_VALUES}"

    def _snapshot_path(self, batch_id: int) -> Path:
        return self.root / f"{batch_id}{_SNAPSHOT}"

    def _ids(self, suffix: str) -> list[int]:
        if not self.root.is_dir():
            return []
        ids = []
        for path in self.root.iterdir():
            stem = path.name.removesuffix(suffix)
            if stem != path.name and stem.isdigit():
                ids.append(int(stem))
        return sorted(ids)

    def is_complete(self, batch_id: int) -> bool:
        """Whether ``batch_id`` was checked and its journal entry saved whole."""
        return self._meta_path(batch_id).is_file()

    def has_state(self) -> bool:
        return bool(self._ids(_META))

    def has_earlier_layout(self) -> bool:
        """Whether ``root`` holds a state of the earlier layout (a directory of Parquet
        tables per batch id), which this version does not read."""
        return self.root.is_dir() and any(
            path.is_dir() and path.name.isdigit() for path in self.root.iterdir()
        )

    def _meta(self, batch_id: int) -> dict[str, Any]:
        meta: dict[str, Any] = json.loads(self._meta_path(batch_id).read_text())
        return meta

    def latest(self) -> tuple[float | None, Totals]:
        """The newest event time and the totals of the last complete batch (none: None
        and zeros), for a process started again on the checkpoint."""
        complete = self._ids(_META)
        if not complete:
            return None, Totals()
        meta = self._meta(complete[-1])
        return meta["newest"], Totals.from_json(meta["totals"])

    def restore(self, batch_id: int) -> tuple[LiveState, Totals, int | None]:
        """The state and totals after the highest complete batch below ``batch_id``, and
        that batch's id (none: an empty state, zeros and None): its snapshot, or the
        newest snapshot before it and the journal's batches after that, checked again.
        """
        from ordered_audit import live_checks

        complete = [i for i in self._ids(_META) if i < batch_id]
        if not complete:
            return live_checks.LiveState(), Totals(), None
        target = complete[-1]
        snapshots = [i for i in self._ids(_SNAPSHOT) if i <= target]
        if snapshots:
            with self._snapshot_path(snapshots[-1]).open("rb") as file:
                # The checkpoint is the job's own local directory, trusted as its code.
                state = pickle.load(file)
            start = snapshots[-1]
        else:
            state, start = live_checks.LiveState(), -1
        for replayed in (i for i in complete if i > start):
            meta = self._meta(replayed)
            values = orjson.loads(self._values_path(replayed).read_bytes())
            events = live_checks.parse_events(values).events
            live_checks.check_batch(state, events, meta["cutoff"])
        meta = self._meta(target)
        return state, Totals.from_json(meta["totals"]), target

    def save(
        self,
        batch_id: int,
        values: Sequence[str | None],
        events: int,
        cutoff: float | None,
        state: LiveState,
        totals: Totals,
        rows: int | None = None,
    ) -> None:
        """``batch_id``'s journal entry (its record values and the cutoff its ``events``
        were checked with, written first; then the state's newest time and the totals
        through it, which mark it complete), and a snapshot of ``state`` once the
        journal holds ``snapshot_events`` events (or ``events_per_row`` times the rows
        the state keeps, when more) or ``SNAPSHOT_BATCHES`` batches since the last
        one. ``rows``: that count, when the caller has it (counting passes over every
        key the state keeps)."""
        self.root.mkdir(parents=True, exist_ok=True)
        _write_atomically(self._values_path(batch_id), orjson.dumps(list(values)))
        meta = {
            "cutoff": cutoff,
            "newest": state.newest,
            "events": events,
            "totals": totals.to_json(),
        }
        _write_atomically(self._meta_path(batch_id), (json.dumps(meta) + "\n").encode())
        if self._since_snapshot is None:
            last = self._ids(_SNAPSHOT)
            since = [i for i in self._ids(_META) if not last or i > last[-1]]
            self._since_snapshot = (sum(self._meta(i)["events"] for i in since), len(since))
        else:
            journaled, batches = self._since_snapshot
            self._since_snapshot = (journaled + events, batches + 1)
        journaled, batches = self._since_snapshot
        if rows is None:
            rows = sum(state.rows().values())
        due = max(self.snapshot_events, self.events_per_row * rows)
        if journaled >= due or batches >= SNAPSHOT_BATCHES:
            _write_atomically(
                self._snapshot_path(batch_id), pickle.dumps(state, pickle.HIGHEST_PROTOCOL)
            )
            self._since_snapshot = (0, 0)
            self._prune(batch_id)

    def _prune(self, snapshot: int) -> None:
        """Keep the newest snapshot and the journal after it (and that batch's meta, so
        that Spark may run it again after a restart and find it complete)."""
        for old in self._ids(_SNAPSHOT):
            if old < snapshot:
                self._snapshot_path(old).unlink(missing_ok=True)
        for old in self._ids(_VALUES):
            if old <= snapshot:
                self._values_path(old).unlink(missing_ok=True)
        for old in self._ids(_META):
            if old < snapshot:
                self._meta_path(old).unlink(missing_ok=True)


def _write_atomically(path: Path, data: bytes) -> None:
    """``data`` at ``path``, renamed into place: a process killed while writing leaves
    only a ``.partial`` file, which nothing reads."""
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.replace(path)


class LiveAudit:
    """The ``foreachBatch`` function: checks a micro-batch, saves the state, counts.

    The batch is the audit topic's records (``value``); their JSON is read here, in
    the driver, where the checks and their state are."""

    def __init__(
        self, config: StreamConfig, metrics: StreamMetrics, store: StateStore | None = None
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.store = store or StateStore(config.checkpoint / "state")
        self._state: LiveState | None = None
        self._totals = Totals()
        self._state_batch: int | None = None
        self._checked = 0
        """Batches checked by this process."""

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        began = time.monotonic()
        if self.store.is_complete(batch_id):
            # Run again after a restart: checked and counted in full before (its counts
            # are in the totals the counters started from).
            log.info("audit stream: batch %d was checked before the restart", batch_id)
            return
        # Arrow: the values as one column, not a row object each.
        column = batch.select(F.col("value").cast("string")).toArrow().column(0)
        self.check_values(column.to_pylist(), batch_id, began)

    def check_values(self, values: Sequence[str | None], batch_id: int, began: float) -> None:
        """The checks of one batch's record values; what ``__call__`` does once it has
        them (a benchmark calls it with values already in memory)."""
        self._checked += 1
        everything = self._checked % self.config.full_collection_batches == 0
        with _collector_paused(everything):
            self._check_values(values, batch_id, began)

    def _check_values(self, values: Sequence[str | None], batch_id: int, began: float) -> None:
        from ordered_audit import live_checks

        parsed = live_checks.parse_events(values)
        if parsed.unreadable or parsed.other_schema:
            log.warning(
                "audit stream: batch %d: %d values are not audit events, %d events of "
                "another schema version; left out",
                batch_id,
                parsed.unreadable,
                parsed.other_schema,
            )
        events = parsed.events
        if not events:
            return
        if self._state is None or self._state_batch is None or self._state_batch >= batch_id:
            self._state, self._totals, self._state_batch = self.store.restore(batch_id)
        state = self._state
        # Until the batch is saved, the state in memory is ahead of the checkpoint.
        self._state = None
        watermark = None if state.newest is None else state.newest - self.config.lateness_s
        cutoff = None if watermark is None else watermark - self.config.horizon_s
        # parse_events sorts the events by delivery order, time first.
        late = (
            0
            if watermark is None
            else bisect.bisect_left(events, watermark, key=itemgetter("time"))
        )
        found = live_checks.check_batch(state, events, cutoff)
        counts: dict[tuple[str, str | None], int] = {}
        for anomaly in found:
            labels = (anomaly["kind"], anomaly["topic"])
            counts[labels] = counts.get(labels, 0) + 1
        totals = self._totals.plus(self.metrics.labelled(counts), len(events), late)
        for anomaly in sorted(found, key=lambda a: a["time"])[:LOGGED_PER_BATCH]:
            log.warning(
                "audit stream: %s in %s (group %s, key %s, partition %s offset %s): %s",
                anomaly["kind"],
                anomaly["topic"],
                anomaly["group"],
                anomaly["key"],
                anomaly["partition"],
                anomaly["offset"],
                anomaly["detail"],
            )
        state_rows = state.rows()  # once: a pass over every key the state keeps
        self.store.save(
            batch_id, values, len(events), cutoff, state, totals, sum(state_rows.values())
        )
        self._state, self._totals, self._state_batch = state, totals, batch_id
        self.metrics.record_batch(
            events=len(events),
            late=late,
            newest=events[-1]["time"],
            anomalies=counts,
            state_rows=state_rows,
        )
        log.info(
            "audit stream: batch %d, %d events, %d anomalies, %.1f s",
            batch_id,
            len(events),
            len(found),
            time.monotonic() - began,
        )


@contextmanager
def _collector_paused(everything: bool) -> Iterator[None]:
    """Python's cyclic garbage collector off while a batch is checked, then what the
    batch made collected once and the survivors frozen out of its reach.

    The checks' state is millions of small objects without cycles that live for the
    horizon; the collector would scan them again each time the state had grown by a
    quarter, and a batch's own objects again and again as they age, which took about a
    third of a batch's time (docs/audit.md). Reference counting still frees what a
    sweep drops. One collection after the batch, over what is not frozen yet (what the
    batch made, and what Spark's calls made since the last one), frees any cycle among
    them. A cycle still alive then (the batch's DataFrame: py4j's proxies refer to
    themselves) is frozen with the rest; ``everything``: the frozen objects are
    collected too, which frees those."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if everything:
            gc.unfreeze()
        gc.collect()
        gc.freeze()
        if enabled:
            gc.enable()


@dataclass
class RunningStream:
    query: StreamingQuery
    metrics: StreamMetrics
    port: int
    """Where ``/metrics`` is served."""
    stop_grace_s: float = DEFAULT_STOP_GRACE_S

    def stop(self) -> None:
        """Stop the query between micro-batches: the one in progress ends first (for up
        to ``stop_grace_s``). Stopping interrupts the stream's thread, and interrupted
        inside the batch function's call into the JVM, Spark's own handling of it has
        failed the query (a StackOverflowError in the stream thread, seen twice); the
        batch's work was lost either way, to be done again after a restart."""
        try:
            deadline = time.monotonic() + self.stop_grace_s
            while (
                self.query.isActive
                and self.query.status["isTriggerActive"]
                and time.monotonic() < deadline
            ):
                time.sleep(0.05)
            self.query.stop()
        finally:
            self.metrics.close()


def start_stream(spark: SparkSession, config: StreamConfig) -> RunningStream:
    """Start the live audit on ``spark`` (a session with the Kafka connector) and its
    metrics server; the caller stops it."""
    from ordered_audit import live_checks, sources

    metrics = StreamMetrics(live_checks.STREAM_KINDS, config.max_topic_labels)
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
        records = sources.read_kafka_stream(
            spark,
            config.bootstrap,
            config.topic,
            config.source_settings(),
            config.kafka_options,
        )
        query = (
            records.writeStream.foreachBatch(LiveAudit(config, metrics))
            .option("checkpointLocation", str(config.checkpoint / "spark"))
            .trigger(processingTime=f"{config.trigger_s} seconds")
            .queryName("ordered-sidecar-audit-stream")
            .start()
        )
    except BaseException:
        metrics.close()
        raise
    return RunningStream(query, metrics, port, config.stop_grace_s)


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
