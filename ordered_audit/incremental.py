"""The live audit's checks: those of ``ordered_audit.checks``, one micro-batch at a time.

Pure DataFrame transformations, like ``checks`` (no IO, no actions): a test calls a step
on a state and a batch built in memory. A step takes the state the previous batches
left, the new batch of events and a ``cutoff`` (event time; None keeps everything), and
returns the anomalies the batch reveals and the state for the next batch.

A check over a state is the batch check run on the state's rows of the keys (or
partitions) the batch touches plus the batch's new rows, so the logic is the batch
job's own. A row of the state remembers whether it was already reported
(``_flagged``): an old row that a late-arriving event shows to be wrong is reported
once, when that event comes, and never again.

The state is bounded by the cutoff (the caller's event-time watermark less a horizon):
rows older than it are dropped, except the few that every later event is compared
with, which are kept for good:

- ``nonmonotonic``: the highest seq delivered per (group, topic, producer, key). A
  delivery is late when a higher seq was delivered before it, and that is the highest
  one. What the horizon bounds is the memory of *which* seqs were delivered: a
  re-delivery of a seq first delivered more than the horizon before, below the highest,
  is taken for a first delivery and reported (a false positive), and an event arriving
  that far out of time order is compared with the highest seq only.
- ``written_across_barrier``: the lowest and highest offset per (topic, partition,
  generation). A record is across a barrier when a newer generation's lowest offset is
  below it, so that stays exact; what the horizon bounds is an older record the batch
  shows to be above a newer generation: beyond the horizon only the highest of its
  generation is reported, not every one.
- ``gate_evidence``, ``unaudited_delivery`` and ``consumer_truncated`` need no state:
  each is about one event.
- ``lost`` judges an acknowledged record once the cutoff has passed its acknowledgement
  (see ``lost_step``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from ordered_audit import checks
from ordered_audit.sources import EVENT_SCHEMA

# Every kind the live audit reports (a fixed set: the metric's ``kind`` label).
STREAM_KINDS = (
    checks.LOST,
    checks.NONMONOTONIC,
    checks.WRITTEN_ACROSS_BARRIER,
    checks.GATE_EVIDENCE,
    checks.UNAUDITED_DELIVERY,
    checks.CONSUMER_TRUNCATED,
)

_NEW = "_new"
_FLAGGED = "_flagged"
_HIT = "_hit"


def _state_schema(names: Sequence[str]) -> StructType:
    fields = {field.name: field for field in EVENT_SCHEMA.fields}
    return StructType([fields[name] for name in names] + [StructField(_FLAGGED, BooleanType())])


DELIVERY_STATE_SCHEMA = _state_schema(
    (
        *checks.SEQ_IDENTITY,
        "partition",
        "offset",
        "generation",
        "time",
        "sidecar",
        "seq",
        "instance",
    )
)
"""First deliveries of each seq to each group, as ``checks.first_deliveries`` has them."""
RECORD_STATE_SCHEMA = _state_schema(
    (*checks.RECORD_IDENTITY, "key", "producer", "producer_seq", "time")
)
"""Records, as ``checks.records`` has them."""
ACK_STATE_SCHEMA = StructType(
    [
        *(
            field
            for field in EVENT_SCHEMA.fields
            if field.name
            in ("topic", "partition", "offset", "key", "generation", "producer", "producer_seq")
        ),
        StructField("sidecar", StringType()),
        StructField("acked_at", DoubleType()),
    ]
)
"""Acknowledged records not judged yet, as ``checks.acked`` has them."""
PROGRESS_STATE_SCHEMA = StructType(
    [
        StructField("group", StringType()),
        StructField("topic", StringType()),
        StructField("partition", LongType()),
        StructField("first_delivered", LongType()),
        StructField("delivered_end", LongType()),
        StructField("first_time", DoubleType()),
        StructField("committed_end", LongType()),
    ]
)
"""Each group's progress per partition, as ``checks.partition_progress`` has it."""
SEEN_STATE_SCHEMA = StructType(
    [
        StructField("group", StringType()),
        StructField("topic", StringType()),
        StructField("partition", LongType()),
        StructField("offset", LongType()),
        StructField("time", DoubleType()),
    ]
)
"""Deliveries an acknowledged record not judged yet may need, as
``checks.delivered_offsets`` has them."""

STATE_SCHEMAS = {
    "deliveries": DELIVERY_STATE_SCHEMA,
    "records": RECORD_STATE_SCHEMA,
    "acks": ACK_STATE_SCHEMA,
    "progress": PROGRESS_STATE_SCHEMA,
    "seen": SEEN_STATE_SCHEMA,
}
"""Every table of the live audit's state, by name."""


@dataclass(frozen=True, slots=True)
class Step:
    anomalies: DataFrame
    """The anomalies the batch reveals, with ``checks.ANOMALY_SCHEMA``'s columns."""
    state: DataFrame
    """The state for the next batch."""
    checked: DataFrame
    """What both are derived from: persisted, both come from one pass over the state."""


@dataclass(frozen=True, slots=True)
class Checked:
    """Every stream check of one batch."""

    anomalies: DataFrame
    states: dict[str, DataFrame]
    """The next state, by the names of ``STATE_SCHEMAS``."""
    shared: tuple[DataFrame, ...]
    """Frames the others are derived from: persist them for one pass."""


def empty_state(spark: SparkSession, schema: StructType) -> DataFrame:
    return spark.createDataFrame([], schema)


def _recheck(
    state: DataFrame,
    new: DataFrame,
    *,
    identity: Sequence[str],
    scope: Sequence[str],
    annotate: checks.Check,
    hit: Column,
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """Run a batch check on the new rows and the state's rows of the same ``scope``.

    ``new`` rows already in the state (the same ``identity``: an event sent twice, a
    record named again by another event) are not new. ``annotate`` adds the check's
    columns, ``hit`` says whether a row breaks the rule. Returns (the rows checked, the
    rows to report: hits not reported before, annotated; the whole state with
    ``_flagged`` updated).
    """
    columns = list(state.columns)
    fresh = (
        new.select(*[name for name in columns if name != _FLAGGED])
        .join(state.select(*identity), list(identity), "left_anti")
        .withColumn(_FLAGGED, F.lit(False))
    )
    touched = fresh.select(*scope).distinct()
    untouched = state.join(touched, list(scope), "left_anti")
    rechecked = (
        state.join(touched, list(scope), "left_semi")
        .withColumn(_NEW, F.lit(False))
        .unionByName(fresh.withColumn(_NEW, F.lit(True)))
    )
    checked = annotate(rechecked).withColumn(_HIT, hit)
    report = checked.where(F.col(_HIT) & (F.col(_NEW) | ~F.col(_FLAGGED)))
    updated = checked.withColumn(_FLAGGED, F.col(_FLAGGED) | F.col(_HIT)).select(*columns)
    return checked, report, untouched.unionByName(updated)


def _retain(state: DataFrame, cutoff: float | None, kept: Sequence[Column]) -> DataFrame:
    """``state`` without rows older than ``cutoff``, except those ``kept`` marks (window
    expressions: computed as columns first, since a filter cannot hold one)."""
    if cutoff is None:
        return state
    marks = [f"_kept{index}" for index in range(len(kept))]
    marked = state.select("*", *[mark.alias(name) for mark, name in zip(kept, marks, strict=True)])
    keep = F.col("time") >= F.lit(cutoff)
    for name in marks:
        keep = keep | F.col(name)
    return marked.where(keep).drop(*marks)


def _first_by(partition: Sequence[str], order: Column) -> Column:
    return F.row_number().over(Window.partitionBy(*partition).orderBy(order)) == 1


def nonmonotonic_step(state: DataFrame, batch: DataFrame, cutoff: float | None) -> Step:
    """``checks.nonmonotonic`` over ``state`` (``DELIVERY_STATE_SCHEMA``) and ``batch``."""
    checked, report, updated = _recheck(
        state,
        checks.first_deliveries(batch),
        identity=checks.SEQ_IDENTITY,
        scope=checks.KEY_IDENTITY,
        annotate=checks.with_newest_before,
        hit=checks.delivered_late(),
    )
    highest = _first_by(checks.KEY_IDENTITY, F.col("producer_seq").desc())
    return Step(checks.nonmonotonic_anomalies(report), _retain(updated, cutoff, [highest]), checked)


def written_across_barrier_step(state: DataFrame, batch: DataFrame, cutoff: float | None) -> Step:
    """``checks.written_across_barrier`` over ``state`` (``RECORD_STATE_SCHEMA``) and
    ``batch``."""
    checked, report, updated = _recheck(
        state,
        checks.records(batch),
        identity=checks.RECORD_IDENTITY,
        scope=("topic", "partition"),
        annotate=checks.with_newer_below,
        hit=checks.above_newer_generation(),
    )
    generation = ("topic", "partition", "generation")
    lowest = _first_by(generation, F.col("offset").asc())
    highest = _first_by(generation, F.col("offset").desc())
    return Step(
        checks.written_across_barrier_anomalies(report),
        _retain(updated, cutoff, [lowest, highest]),
        checked,
    )


def stateless_step(batch: DataFrame) -> DataFrame:
    """The checks that look at one event at a time, on the batch: ``gate_evidence``
    (each gate_opened carries its evidence), ``unaudited_delivery`` and
    ``consumer_truncated``."""
    return (
        checks.gate_evidence(batch)
        .unionByName(checks.unaudited_deliveries(batch))
        .unionByName(checks.consumer_truncations(batch))
    )


def lost_step(
    states: Mapping[str, DataFrame], batch: DataFrame, cutoff: float | None
) -> tuple[DataFrame, dict[str, DataFrame]]:
    """``checks.lost`` for the acknowledged records older than ``cutoff``.

    Whether a group skipped a record can be told only once no delivery of it can still
    come: records are judged once the cutoff (the watermark less the horizon) passes
    their acknowledgement, against the groups' progress then; a group that had not read
    past a record by then never judges it (the batch job counts it as unseen, or lost
    later). Returns (the anomalies, the states ``acks``, ``progress`` and ``seen``).
    """
    position = ["topic", "partition", "offset"]
    fresh = (
        checks.acked(batch)
        .dropDuplicates(position)
        .join(states["acks"].select(*position), position, "left_anti")
    )
    acks = states["acks"].unionByName(fresh)
    progress = (
        states["progress"]
        .unionByName(checks.partition_progress(batch))
        .groupBy("group", "topic", "partition")
        .agg(
            F.min("first_delivered").alias("first_delivered"),
            F.max("delivered_end").alias("delivered_end"),
            F.min("first_time").alias("first_time"),
            F.max("committed_end").alias("committed_end"),
        )
    )
    seen = (
        states["seen"]
        .unionByName(checks.delivered_offsets(batch))
        .dropDuplicates(["group", *position])
    )
    due = F.lit(False) if cutoff is None else F.col("acked_at") < F.lit(cutoff)
    recent = F.lit(True) if cutoff is None else F.col("time") >= F.lit(cutoff)
    missing = checks.skipped(acks.where(due), checks.with_read_to(progress), seen)
    pending = acks.where(~due)
    # A delivery matters while its record waits to be judged, or while its record's
    # acknowledgement may still come.
    kept = seen.join(pending.select(*position), position, "left_semi").unionByName(
        seen.where(recent)
    )
    return checks.lost_anomalies(missing), {
        "acks": pending,
        "progress": progress,
        "seen": kept.dropDuplicates(["group", *position]),
    }


def check_batch(states: Mapping[str, DataFrame], batch: DataFrame, cutoff: float | None) -> Checked:
    """Every stream check of ``batch`` against the states the batches before it left."""
    order = nonmonotonic_step(states["deliveries"], batch, cutoff)
    barrier = written_across_barrier_step(states["records"], batch, cutoff)
    lost, lost_states = lost_step(states, batch, cutoff)
    found = (
        order.anomalies.unionByName(barrier.anomalies)
        .unionByName(stateless_step(batch))
        .unionByName(lost)
    )
    return Checked(
        found,
        {"deliveries": order.state, "records": barrier.state, **lost_states},
        (order.checked, barrier.checked),
    )
