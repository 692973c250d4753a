"""The ordering checks: pure DataFrame transformations of audit events.

Input: the flat event frame of ``ordered_audit.sources`` (``EVENT_SCHEMA``). Output:
anomaly rows with ``ANOMALY_SCHEMA``'s columns, and the per-operation facts the audit
can tell without Prometheus. No IO, no actions (nothing here calls ``collect``), so a
test builds a few events in memory and calls one check.

The kinds (see docs/audit.md for the reasoning):

``lost``                    a produce_acked record the group never got, although the
                            group read past its offset in that partition
``duplicate``               a record (topic, partition, offset) delivered to the group
                            more than once; ``detail`` says whether the re-delivery came
                            from the same consumer instance in one assignment, after a
                            restart, or after a rebalance (to another instance, or back
                            to the same one)
``nonmonotonic``            within a group, a (producer, key)'s producer_seq went
                            backwards in delivery order (re-deliveries of seqs already
                            delivered are ignored)
``written_across_barrier``  within a partition, a record of generation g at an offset
                            above a record of a newer generation g' > g
``gate_evidence``           a gate opened relying on a source partition that was not
                            committed to its boundary, still held data below it, and was
                            not removed
``unaudited_delivery``      a delivered record without the sidecar's headers: written by
                            a producer that bypassed the sidecars
``consumer_truncated``      a consumer instance found the log cut below what it had read
                            (an unclean leader election): the records it read from
                            ``offset`` on are no longer in the log. Kafka lost them, not
                            the sidecar; the deliveries of the records the log then wrote
                            at those offsets are not duplicates
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from ordered_audit import kinds

# The kinds, named ``checks.LOST`` and so on by the job and its tests.
LOST = kinds.LOST
DUPLICATE = kinds.DUPLICATE
NONMONOTONIC = kinds.NONMONOTONIC
WRITTEN_ACROSS_BARRIER = kinds.WRITTEN_ACROSS_BARRIER
GATE_EVIDENCE = kinds.GATE_EVIDENCE
UNAUDITED_DELIVERY = kinds.UNAUDITED_DELIVERY
CONSUMER_TRUNCATED = kinds.CONSUMER_TRUNCATED
KINDS = kinds.KINDS

# Duplicate details.
SAME_INSTANCE = "same_instance"
AFTER_RESTART = "after_restart"
REBALANCE = "rebalance"

ANOMALY_SCHEMA = StructType(
    [
        StructField("kind", StringType()),
        StructField("detail", StringType()),
        StructField("topic", StringType()),
        StructField("group", StringType()),
        StructField("producer", StringType()),
        StructField("key", StringType()),
        StructField("partition", LongType()),
        StructField("offset", LongType()),
        StructField("generation", LongType()),
        StructField("producer_seq", LongType()),
        StructField("time", DoubleType()),
        StructField("sidecar", StringType()),
        StructField("instance", StringType()),
    ]
)

Check = Callable[[DataFrame], DataFrame]
"""A transformation of events (or of rows derived from them) into other rows."""

FINAL_PHASES = ("done", "rolled_back")
COUNT_CHANGES = ("expand", "shrink")

# The order in which one consumer group saw its records: the emitting sidecar's clock,
# then its audit sequence (exact within one sidecar; across sidecars, the clocks).
_DELIVERY_ORDER = ("time", "sidecar", "seq")


# What makes one event: a repeat of these is the same event read twice.
EVENT_IDENTITY = ("sidecar", "seq", "time", "type")


def distinct_events(events: DataFrame) -> DataFrame:
    """``events`` without repeats of one event (the same sidecar, seq, time and type),
    as a file read twice or an audit topic copied into files would have."""
    return events.dropDuplicates(list(EVENT_IDENTITY))


def may_repeat_events(events: DataFrame) -> DataFrame:
    """Empty when no event of ``events`` is there twice (``distinct_events`` would drop
    nothing); else a row for each hash of the identity that more than one row has (an
    event twice, or, rarely, two events whose identities hash alike).

    A hash aggregation over one long column: much cheaper than ``distinct_events``,
    which keeps one whole row of each event and sorts them all, so a job asks this
    first and deduplicates only when it is not empty."""
    # Equal times are equal however they are written: 0.0 and -0.0 hash alike too.
    time = F.when(F.col("time") == F.lit(0.0), F.lit(0.0)).otherwise(F.col("time"))
    identity = F.xxhash64(F.col("sidecar"), F.col("seq"), time, F.col("type"))
    return events.groupBy(identity.alias("_identity")).count().where(F.col("count") > 1)


def _of_type(events: DataFrame, event_type: str) -> DataFrame:
    return events.where(F.col("type") == F.lit(event_type))


def _anomalies(frame: DataFrame, kind: str, detail: Column) -> DataFrame:
    """``frame`` as anomaly rows: its columns that the schema has, null for the rest."""
    present = set(frame.columns)
    columns = [F.lit(kind).alias("kind"), detail.cast(StringType()).alias("detail")]
    for field in ANOMALY_SCHEMA.fields[2:]:
        value = F.col(field.name) if field.name in present else F.lit(None)
        columns.append(value.cast(field.dataType).alias(field.name))
    return frame.select(*columns)


def with_incarnation(events: DataFrame) -> DataFrame:
    """``events`` plus ``incarnation``: how many times its sidecar restarted before it.

    A sidecar numbers its audit events from 0 (``seq``) each time it starts, so a seq
    that is not above the previous one of the same sidecar id begins a new incarnation.
    """
    by_sidecar = Window.partitionBy("sidecar").orderBy("time", "seq")
    restarted = F.lag("seq").over(by_sidecar) >= F.col("seq")
    marked = events.withColumn("_restart", F.coalesce(restarted.cast("long"), F.lit(0)))
    return marked.withColumn(
        "incarnation",
        F.sum("_restart").over(by_sidecar.rowsBetween(Window.unboundedPreceding, 0)),
    ).drop("_restart")


# lost -------------------------------------------------------------------------------


def acked(events: DataFrame) -> DataFrame:
    """The produce_acked records, ``acked_at`` their event's time."""
    return _of_type(events, "produce_acked").select(
        "topic",
        "partition",
        "offset",
        "key",
        "generation",
        "producer",
        "producer_seq",
        "sidecar",
        F.col("time").alias("acked_at"),
    )


def delivered_offsets(events: DataFrame) -> DataFrame:
    """(group, topic, partition, offset, time) of every delivery."""
    return _of_type(events, "delivered").select("group", "topic", "partition", "offset", "time")


def partition_progress(events: DataFrame) -> DataFrame:
    """Per (group, topic, partition): first delivered offset, the end of the delivered
    (last + 1) and committed offsets, and the first delivery's time. Each is a min or a
    max, so the progress of two sets of events merges by taking them again."""
    delivered = (
        _of_type(events, "delivered")
        .groupBy("group", "topic", "partition")
        .agg(
            F.min("offset").alias("first_delivered"),
            (F.max("offset") + 1).alias("delivered_end"),
            F.min("time").alias("first_time"),
        )
    )
    committed = (
        _of_type(events, "committed")
        .groupBy("group", "topic", "partition")
        .agg(F.max("offset").alias("committed_end"))
    )
    return delivered.join(committed, ["group", "topic", "partition"], "full")


def with_read_to(progress: DataFrame) -> DataFrame:
    """``partition_progress`` plus ``group_started`` (the group's first delivery of the
    topic) and ``read_to``: the offset the group provably read up to (past its last
    delivery, or its highest commit)."""
    return progress.withColumn(
        "group_started", F.min("first_time").over(Window.partitionBy("group", "topic"))
    ).withColumn(
        "read_to",
        F.greatest(F.coalesce("delivered_end", F.lit(0)), F.coalesce("committed_end", F.lit(0))),
    )


def _group_progress(events: DataFrame) -> DataFrame:
    return with_read_to(partition_progress(events))


def undelivered(events: DataFrame) -> DataFrame:
    """The ``acked`` records not delivered to a group that consumed (or committed in)
    their topic, one row per (record, group): what ``lost`` and ``unseen`` tell apart by
    the group's progress. One anti-join of every acknowledgement against every
    delivery, so a job computes it once for both (the ``undelivered`` argument)."""
    groups = (
        events.where(F.col("type").isin("delivered", "committed"))
        .select("group", "topic")
        .distinct()
    )
    offsets = delivered_offsets(events).select("group", "topic", "partition", "offset")
    candidates = acked(events).join(F.broadcast(groups), ["topic"])
    return candidates.join(offsets, ["group", "topic", "partition", "offset"], "left_anti")


def skipped(pending: DataFrame, progress: DataFrame) -> DataFrame:
    """The ``undelivered`` records a group read past, one row per (record, group);
    ``progress`` is ``with_read_to``'s."""
    # Every group's progress in the record's partition: the group as the join's key
    # too, a null one matching a null one as a join on (topic, partition) alone would.
    theirs = progress.withColumnRenamed("group", "_progress_group")
    return (
        pending.join(F.broadcast(theirs), ["topic", "partition"])
        .where(F.col("group").eqNullSafe(F.col("_progress_group")))
        .drop("_progress_group")
        .where(F.col("offset") < F.col("read_to"))
        .where(
            (F.col("first_delivered").isNotNull() & (F.col("offset") >= F.col("first_delivered")))
            | (F.col("group_started").isNotNull() & (F.col("acked_at") >= F.col("group_started")))
        )
    )


def lost_anomalies(missing: DataFrame) -> DataFrame:
    """``skipped`` rows as anomaly rows, at the time of their acknowledgement."""
    detail = F.format_string(
        "acknowledged at offset %d; the group read partition %d up to offset %d",
        F.col("offset"),
        F.col("partition"),
        F.col("read_to"),
    )
    return _anomalies(missing.withColumn("time", F.col("acked_at")), LOST, detail)


def lost(events: DataFrame, undelivered_records: DataFrame | None = None) -> DataFrame:
    """Acknowledged records a group skipped.

    A record counts as skipped by a group when the group read past its offset in its
    partition (delivered a later offset there, or committed beyond it) and either the
    group's deliveries there began at or below it, or the record was acknowledged after
    the group began consuming the topic. Records the group has not reached yet are
    ``unseen`` (see ``unseen``), not lost. ``undelivered_records``: ``undelivered``'s
    rows of ``events`` when the caller has them already.
    """
    if undelivered_records is None:
        undelivered_records = undelivered(events)
    return lost_anomalies(skipped(undelivered_records, _group_progress(events)))


def unseen(events: DataFrame, undelivered_records: DataFrame | None = None) -> DataFrame:
    """Per (group, topic): acknowledged records the group has not reached (not anomalies:
    the window ended before the group read that far). ``undelivered_records`` as for
    ``lost``."""
    if undelivered_records is None:
        undelivered_records = undelivered(events)
    progress = _group_progress(events).select("group", "topic", "partition", "read_to")
    ahead = undelivered_records.join(
        F.broadcast(progress), ["group", "topic", "partition"], "left"
    ).where(F.col("read_to").isNull() | (F.col("offset") >= F.col("read_to")))
    return ahead.groupBy("group", "topic").agg(F.count(F.lit(1)).alias("unseen"))


# duplicate --------------------------------------------------------------------------


def _deliveries_with_identity(events: DataFrame) -> DataFrame:
    """Delivered events with the consumer instance that got them, and when that instance
    (sidecar incarnation + instance name) first appears in the audit."""
    # Only consumer-side events name an instance; their seq still restarts from 0.
    incarnated = with_incarnation(events.where(F.col("instance").isNotNull()))
    # A window over the rows the incarnations' window already spread by sidecar (no
    # second shuffle, nor a second run of that window for an aggregate joined back). An
    # instance without a sidecar or group has no start, as an equi-join finds none.
    identity = Window.partitionBy("sidecar", "incarnation", "group", "instance")
    started = F.when(
        F.col("sidecar").isNotNull() & F.col("group").isNotNull(),
        F.min("time").over(identity),
    )
    return _of_type(incarnated.withColumn("instance_started", started), "delivered")


def duplicates(events: DataFrame) -> DataFrame:
    """Every delivery of a record to a group after its first one."""
    deliveries = _deliveries_with_identity(events)
    same_record = Window.partitionBy("group", "topic", "partition", "offset").orderBy(
        *_DELIVERY_ORDER
    )
    first = [
        F.first(name).over(same_record).alias(f"first_{name}")
        for name in ("time", "sidecar", "incarnation", "instance", "assignment")
    ]
    ranked = deliveries.select("*", F.row_number().over(same_record).alias("nth"), *first)
    again = ranked.where(F.col("nth") > 1)
    same_instance = (
        (F.col("sidecar") == F.col("first_sidecar"))
        & (F.col("incarnation") == F.col("first_incarnation"))
        & (F.col("instance") == F.col("first_instance"))
        # The same instance in a later assignment got it back through a rebalance (its
        # commit before the rebalance did not land: the coordinator moved, say). Older
        # sidecars' events do not say: counted as the same instance, as before.
        & ~F.coalesce(F.col("assignment") != F.col("first_assignment"), F.lit(False))
    )
    # The log was cut below what the group had read and then wrote other records at
    # those offsets: delivering those is not delivering a record again. (One anti-join
    # of the re-deliveries against the few cuts: the delivery is named by its time,
    # sidecar and seq, so one without them is never taken for a reused offset's.)
    cuts = _of_type(events, "consumer_truncated").select(
        F.col("group").alias("_cut_group"),
        F.col("topic").alias("_cut_topic"),
        F.col("partition").alias("_cut_partition"),
        F.col("resume_at").alias("_cut_from"),
        F.col("position").alias("_cut_to"),
        F.col("time").alias("_cut_at"),
    )
    again = again.join(
        F.broadcast(cuts),
        (F.col("group") == F.col("_cut_group"))
        & (F.col("topic") == F.col("_cut_topic"))
        & (F.col("partition") == F.col("_cut_partition"))
        & (F.col("offset") >= F.col("_cut_from"))
        & (F.col("offset") < F.col("_cut_to"))
        & (F.col("time") > F.col("_cut_at"))
        & F.col("time").isNotNull()
        & F.col("sidecar").isNotNull()
        & F.col("seq").isNotNull(),
        "left_anti",
    )
    cause = (
        F.when(same_instance, F.lit(SAME_INSTANCE))
        .when(F.col("instance_started") > F.col("first_time"), F.lit(AFTER_RESTART))
        .otherwise(F.lit(REBALANCE))
    )
    return _anomalies(again, DUPLICATE, cause)


# nonmonotonic -----------------------------------------------------------------------

# One (producer, key)'s records as one group received them, and one record of them.
KEY_IDENTITY = ("group", "topic", "producer", "key")
SEQ_IDENTITY = (*KEY_IDENTITY, "producer_seq")


def first_deliveries(events: DataFrame) -> DataFrame:
    """The first delivery to each group of each (topic, producer, key, producer_seq), in
    delivery order: re-deliveries are duplicates, not reorderings. Records without a key
    or without the sidecar's headers have no order to keep, nor have those of a topic
    without ordered delivery (``ordered`` false; older sidecars leave it out, null)."""
    keyed = (
        _of_type(events, "delivered")
        .where(
            F.col("key").isNotNull()
            & F.col("producer").isNotNull()
            & F.col("producer_seq").isNotNull()
            & F.coalesce(F.col("ordered"), F.lit(True))
        )
        # Spread by (producer, key), which also groups each seq's deliveries: this
        # window and ``with_newest_before``'s share the one shuffle.
        .repartition(*KEY_IDENTITY)
    )
    per_seq = Window.partitionBy(*SEQ_IDENTITY).orderBy(*_DELIVERY_ORDER)
    return (
        keyed.withColumn("_nth", F.row_number().over(per_seq))
        .where(F.col("_nth") == 1)
        .drop("_nth")
    )


def with_newest_before(deliveries: DataFrame) -> DataFrame:
    """``deliveries`` plus ``_before``: the (producer_seq, partition, offset) of the
    highest seq delivered earlier to the same group for the same (topic, producer, key),
    null for the first."""
    earlier = (
        Window.partitionBy(*KEY_IDENTITY)
        .orderBy(*_DELIVERY_ORDER)
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    return deliveries.withColumn(
        "_before", F.max(F.struct("producer_seq", "partition", "offset")).over(earlier)
    )


def delivered_late() -> Column:
    """On ``with_newest_before``'s rows: the delivery came after a higher seq's."""
    return F.coalesce(F.col("producer_seq") < F.col("_before.producer_seq"), F.lit(False))


def nonmonotonic_anomalies(late: DataFrame) -> DataFrame:
    """``with_newest_before`` rows that came late, as anomaly rows."""
    detail = F.format_string(
        "seq %d (partition %d offset %d) delivered after seq %d (partition %d offset %d)",
        F.col("producer_seq"),
        F.col("partition"),
        F.col("offset"),
        F.col("_before.producer_seq"),
        F.col("_before.partition"),
        F.col("_before.offset"),
    )
    return _anomalies(late, NONMONOTONIC, detail)


def nonmonotonic(events: DataFrame) -> DataFrame:
    """Deliveries whose producer_seq is below one delivered earlier to the same group for
    the same (topic, producer, key); the first delivery of each seq only."""
    ordered = with_newest_before(first_deliveries(events))
    return nonmonotonic_anomalies(ordered.where(delivered_late()))


# written_across_barrier -------------------------------------------------------------

# One record of a partition, however many events name it.
RECORD_IDENTITY = ("topic", "partition", "offset", "generation")


def records(events: DataFrame) -> DataFrame:
    """(topic, partition, offset, generation, key, producer, producer_seq, time) of every
    record named by a produce_acked or delivered event with a generation (a delivery
    carries the record's generation header), once per record."""
    return (
        events.where(
            F.col("type").isin("produce_acked", "delivered") & F.col("generation").isNotNull()
        )
        .select(
            "topic", "partition", "offset", "generation", "key", "producer", "producer_seq", "time"
        )
        # Spread by partition, which also groups each record's events: the repeats are
        # dropped and ``with_newer_below``'s window runs after the one shuffle.
        .repartition("topic", "partition")
        .dropDuplicates(list(RECORD_IDENTITY))
    )


def with_newer_below(records_frame: DataFrame) -> DataFrame:
    """``records_frame`` plus ``_newer``: the (generation, offset) of the newest
    generation among the records below each one's offset in its partition."""
    lower = (
        Window.partitionBy("topic", "partition")
        .orderBy("offset")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    return records_frame.withColumn("_newer", F.max(F.struct("generation", "offset")).over(lower))


def above_newer_generation() -> Column:
    """On ``with_newer_below``'s rows: a newer generation was written below this one."""
    return F.coalesce(F.col("generation") < F.col("_newer.generation"), F.lit(False))


def written_across_barrier_anomalies(flagged: DataFrame) -> DataFrame:
    """``with_newer_below`` rows above a newer generation, as anomaly rows."""
    detail = F.format_string(
        "generation %d at offset %d, above generation %d at offset %d",
        F.col("generation"),
        F.col("offset"),
        F.col("_newer.generation"),
        F.col("_newer.offset"),
    )
    return _anomalies(flagged, WRITTEN_ACROSS_BARRIER, detail)


def written_across_barrier(events: DataFrame) -> DataFrame:
    """Records of a generation at an offset above a record of a newer generation in the
    same partition: every record of g' > g must follow every record of g. One row per
    record (its produce_acked and its deliveries are one record)."""
    ordered = with_newer_below(records(events))
    return written_across_barrier_anomalies(ordered.where(above_newer_generation()))


# gate_evidence ----------------------------------------------------------------------


def gate_evidence(events: DataFrame) -> DataFrame:
    """Gate openings whose evidence shows a source partition that still blocked it.

    A source releases the gate when the group committed it to the boundary, or its data
    below the boundary is gone (log start at or past it), or it is removed. An unknown
    committed offset counts as nothing committed; an unknown log start as 0.
    """
    opened = _of_type(events, "gate_opened").select("*", F.explode("evidence").alias("_evidence"))
    boundary = F.col("_evidence.boundary")
    blocked = (
        (F.coalesce(F.col("_evidence.committed"), F.lit(-1)) < boundary)
        & (F.coalesce(F.col("_evidence.log_start"), F.lit(0)) < boundary)
        & (F.coalesce(F.col("_evidence.mode"), F.lit("")) != F.lit("removed"))
    )
    detail = F.format_string(
        "source partition %d: committed %s < boundary %d, log start %s, mode %s",
        F.col("_evidence.source"),
        F.coalesce(F.col("_evidence.committed").cast("string"), F.lit("none")),
        boundary,
        F.coalesce(F.col("_evidence.log_start").cast("string"), F.lit("unknown")),
        F.coalesce(F.col("_evidence.mode"), F.lit("unknown")),
    )
    return _anomalies(opened.where(blocked), GATE_EVIDENCE, detail)


# unaudited_delivery -----------------------------------------------------------------


def unaudited_deliveries(events: DataFrame) -> DataFrame:
    """Delivered records without the sidecar's headers (no producer): a bypassing writer."""
    bare = _of_type(events, "delivered").where(F.col("producer").isNull())
    detail = F.lit("no ordered.* headers: written by a producer that bypassed the sidecars")
    return _anomalies(bare, UNAUDITED_DELIVERY, detail)


# consumer_truncated -----------------------------------------------------------------


def consumer_truncations(events: DataFrame) -> DataFrame:
    """Each time a consumer instance found the log cut below what it had read."""
    cut = _of_type(events, "consumer_truncated").withColumn(
        "offset", F.coalesce(F.col("resume_at"), F.lit(0))
    )
    detail = F.format_string(
        "leader epoch %d ends at %s, below the position %d: %d offset(s) read are no longer "
        "in the log (an unclean leader election); read again from there",
        F.col("leader_epoch"),
        F.coalesce(F.col("resume_at").cast("string"), F.lit("an unknown offset")),
        F.col("position"),
        F.col("lost"),
    )
    return _anomalies(cut, CONSUMER_TRUNCATED, detail)


def anomalies(events: DataFrame, undelivered_records: DataFrame | None = None) -> DataFrame:
    """Every anomaly of every kind, with ``ANOMALY_SCHEMA``'s columns.
    ``undelivered_records`` as for ``lost``."""
    found = lost(events, undelivered_records)
    for check in (
        duplicates,
        nonmonotonic,
        written_across_barrier,
        gate_evidence,
        unaudited_deliveries,
        consumer_truncations,
    ):
        found = found.unionByName(check(events))
    return found


# Operations -------------------------------------------------------------------------


def operations(events: DataFrame) -> DataFrame:
    """One row per partition-count change (expand/shrink) in the events.

    A change is the run of a topic's barrier_phase events up to a final phase (done or
    rolled back); it begins at its first phase event and ends at its admin event (the
    coordinator's answer) or, when the admin event is missing (a successor finished a
    change whose coordinator died), at its final phase. ``period_end`` is the start of
    the topic's next change (null for the last one): stalls and violations that follow a
    change are charged to it until the next one begins.
    """
    by_topic = Window.partitionBy("topic").orderBy(*_DELIVERY_ORDER)
    phases = _of_type(events, "barrier_phase").withColumn(
        "_final", F.col("phase").isin(*FINAL_PHASES).cast("long")
    )
    phases = phases.withColumn(
        "op_index",
        F.coalesce(
            F.sum("_final").over(by_topic.rowsBetween(Window.unboundedPreceding, -1)), F.lit(0)
        ),
    )
    changes = phases.groupBy("topic", "op_index").agg(
        F.min("time").alias("start"),
        F.min_by("kind", "time").alias("kind"),
        F.min_by("from_generation", "time").alias("from_generation"),
        F.min_by("from_count", "time").alias("from_count"),
        F.min_by("target_count", "time").alias("target_count"),
        F.min_by("coordinator", "time").alias("coordinator"),
        F.max_by("phase", "time").alias("last_phase"),
        F.min(F.when(F.col("phase") == "barrier", F.col("time"))).alias("barrier_at"),
        F.max(F.when(F.col("_final") == 1, F.col("time"))).alias("finished_at"),
        F.max("time").alias("last_phase_at"),
        F.count(F.lit(1)).alias("phase_events"),
    )
    changes = changes.withColumn(
        "period_end", F.lead("start").over(Window.partitionBy("topic").orderBy("start"))
    )
    admin = (
        _of_type(events, "admin")
        .where(F.col("kind").isin(*COUNT_CHANGES))
        .select(
            F.col("topic").alias("_topic"),
            F.col("kind").alias("_kind"),
            F.col("time").alias("admin_at"),
            F.col("result").alias("admin_result"),
        )
    )
    matched = changes.join(
        admin,
        (F.col("_topic") == F.col("topic"))
        & (F.col("_kind") == F.col("kind"))
        & (F.col("admin_at") >= F.col("start"))
        & (F.col("period_end").isNull() | (F.col("admin_at") < F.col("period_end"))),
        "left",
    )
    keys = list(changes.columns)
    answered = matched.groupBy(*keys).agg(
        F.min("admin_at").alias("admin_at"),
        F.min_by("admin_result", "admin_at").alias("admin_result"),
    )
    result = F.coalesce(
        F.col("admin_result"),
        F.when(F.col("last_phase").isin(*FINAL_PHASES), F.col("last_phase")),
        F.lit("unfinished"),
    )
    end = F.coalesce("admin_at", "finished_at", "last_phase_at")
    moved = keys_moved(events)
    gaps = _ack_gaps(events, answered.select("topic", "start", end.alias("end")))
    return (
        answered.select(
            "topic",
            "kind",
            "from_generation",
            "from_count",
            "target_count",
            result.alias("result"),
            "coordinator",
            "start",
            end.alias("end"),
            (end - F.col("start")).alias("duration_s"),
            (F.coalesce("finished_at", "last_phase_at") - F.col("barrier_at")).alias("barrier_s"),
            "period_end",
            "phase_events",
        )
        .join(moved, ["topic", "from_generation"], "left")
        .join(gaps, ["topic", "start"], "left")
        .withColumn(
            "keys_moved",
            F.when(F.col("result") == "done", F.coalesce("keys_moved", F.lit(0))),
        )
        .withColumn(
            "keys_seen_in_both",
            F.when(F.col("result") == "done", F.coalesce("keys_seen_in_both", F.lit(0))),
        )
    )


def _ack_gaps(events: DataFrame, changes: DataFrame) -> DataFrame:
    """Per change (topic, start): ``ack_gap_s``, the longest time without any
    produce_acked of the topic that overlaps the change (the produce pause producers
    saw, whatever held them: the barrier, or a client waiting for new partitions'
    metadata). Meaningful while producers write steadily.

    The overlapping gaps are those between consecutive acks from the last one at or
    before the change's start to the first one at or after its end: found per change
    with joins against the (few, broadcast) changes, not by sorting a topic's acks.
    """
    acks = _of_type(events, "produce_acked").select("topic", "time")
    change = F.broadcast(changes.withColumnRenamed("start", "c_start"))
    joined = acks.join(change, "topic")
    before = (
        joined.where(F.col("time") <= F.col("c_start"))
        .groupBy("topic", "c_start")
        .agg(F.max("time").alias("time"))
    )
    after = (
        joined.where(F.col("time") >= F.col("end"))
        .groupBy("topic", "c_start")
        .agg(F.min("time").alias("time"))
    )
    inside = joined.where(
        (F.col("time") > F.col("c_start")) & (F.col("time") < F.col("end"))
    ).select("topic", "c_start", "time")
    points = before.unionByName(inside).unionByName(after)
    per_change = Window.partitionBy("topic", "c_start").orderBy("time")
    gaps = points.withColumn("_gap", F.col("time") - F.lag("time").over(per_change))
    return gaps.groupBy("topic", F.col("c_start").alias("start")).agg(
        F.max("_gap").alias("ack_gap_s")
    )


def keys_moved(events: DataFrame) -> DataFrame:
    """Per (topic, from_generation g): keys whose partition in generation g+1 differs
    from their partition in g, among the keys written in both (produce_acked and
    delivered records; a key written in only one of them cannot be judged).

    A key's partition in a generation is the lowest one of its records there; every
    event naming a record names its key, so the events are grouped as they are, without
    first making them one row per record (``records``: a sort of every record), and
    each generation is set beside the key's next one by a window over the few rows per
    key, not by a join of the table with itself."""
    keyed = (
        events.where(
            F.col("type").isin("produce_acked", "delivered")
            & F.col("generation").isNotNull()
            & F.col("topic").isNotNull()
            & F.col("key").isNotNull()
        )
        .groupBy("topic", "generation", "key")
        .agg(F.min("partition").alias("partition"))
    )
    following = Window.partitionBy("topic", "key").orderBy("generation")
    both = keyed.select(
        "topic",
        F.col("generation").alias("from_generation"),
        F.col("partition").alias("p0"),
        F.lead("generation").over(following).alias("_next"),
        F.lead("partition").over(following).alias("p1"),
    ).where(F.col("_next") == F.col("from_generation") + 1)
    # One row per (topic, key, g) in ``both``: counting rows counts distinct keys.
    return both.groupBy("topic", "from_generation").agg(
        F.count(F.when(F.col("p0") != F.col("p1"), F.lit(1))).alias("keys_moved"),
        F.count(F.lit(1)).alias("keys_seen_in_both"),
    )


def violations_per_operation(operations_frame: DataFrame, found: DataFrame) -> DataFrame:
    """``operations_frame`` plus ``violations``: anomalies of its topic in its period
    (from its start to the next change's start)."""
    ops = operations_frame.alias("op")
    hits = found.alias("a")
    joined = ops.join(
        hits,
        (F.col("a.topic") == F.col("op.topic"))
        & (F.col("a.time") >= F.col("op.start"))
        & (F.col("op.period_end").isNull() | (F.col("a.time") < F.col("op.period_end"))),
        "left",
    )
    counted = joined.groupBy("op.topic", "op.start").agg(
        F.count(F.col("a.kind")).alias("violations")
    )
    return operations_frame.join(counted, ["topic", "start"], "left")


def per_bucket(events: DataFrame, found: DataFrame, bucket_s: float) -> DataFrame:
    """Per time bucket (``bucket`` = its start, epoch seconds): record events and
    anomalies of each kind."""
    bucket = (F.floor(F.col("time") / F.lit(bucket_s)) * F.lit(bucket_s)).cast(DoubleType())
    counts = events.groupBy(bucket.alias("bucket")).agg(
        F.count(F.when(F.col("type") == "produce_acked", 1)).alias("produce_acked"),
        F.count(F.when(F.col("type") == "delivered", 1)).alias("delivered"),
    )
    by_kind = found.groupBy(bucket.alias("bucket")).agg(
        F.count(F.lit(1)).alias("violations"),
        *[F.count(F.when(F.col("kind") == kind, 1)).alias(kind) for kind in KINDS],
    )
    merged = counts.join(by_kind, ["bucket"], "full")
    return merged.fillna(0, ["produce_acked", "delivered", "violations", *KINDS]).orderBy("bucket")
