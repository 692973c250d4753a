"""The live audit's checks on hand-built histories cut into micro-batches: the same
anomalies as the batch checks over the whole history, each reported once, in the batch
that reveals it; and the driver's journal and snapshots, replayed after a restart."""

from __future__ import annotations

import base64
import gc
import json
import random
import weakref
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from ordered_audit import checks, live_checks
from ordered_audit.live_checks import LiveState
from ordered_audit.sources import EVENT_SCHEMA, EVIDENCE_SCHEMA, events_from_dicts
from ordered_audit.stream import LiveAudit, StateStore, StreamConfig
from ordered_audit.stream_metrics import OTHER_TOPIC, StreamMetrics, Totals
from sidecar.audit import events as audit_events
from sidecar.audit.events import Event
from tests.audit.history import CONSUMER, GROUP, TOPIC, Scenario, clean, written

# The identity of one anomaly, as both jobs report it.
Found = tuple[str, str | None, str | None, int | None, int | None, int | None]


def identity(row: dict[str, Any]) -> Found:
    return (
        row["kind"],
        row["group"],
        row["key"],
        row["partition"],
        row["offset"],
        row["producer_seq"],
    )


def batch_check(spark: SparkSession, events: Sequence[Event]) -> list[Found]:
    frame = events_from_dicts(spark, events)
    found = (
        checks.lost(frame)
        .unionByName(checks.nonmonotonic(frame))
        .unionByName(checks.written_across_barrier(frame))
        .unionByName(checks.gate_evidence(frame))
        .unionByName(checks.unaudited_deliveries(frame))
        .unionByName(checks.consumer_truncations(frame))
    )
    return sorted(identity(row.asDict()) for row in found.collect())


def values(events: Sequence[Event]) -> list[str]:
    """The events as the audit topic holds them."""
    return [json.dumps(event) for event in events]


def check(state: LiveState, events: Sequence[Event], cutoff: float | None) -> list[Found]:
    parsed = live_checks.parse_events(values(events))
    return sorted(
        identity(found) for found in live_checks.check_batch(state, parsed.events, cutoff)
    )


def incremental_check(
    batches: Sequence[Sequence[Event]],
    cutoff: float | None = None,
    cutoffs: Sequence[float | None] = (),
    state: LiveState | None = None,
) -> list[list[Found]]:
    """Each batch's anomalies, the state carried from one batch to the next; ``cutoff``
    for every batch, or ``cutoffs`` one per batch."""
    state = state or LiveState()
    return [
        check(state, events, cutoffs[index] if cutoffs else cutoff)
        for index, events in enumerate(batches)
    ]


def cut(events: Sequence[Event], parts: int) -> list[list[Event]]:
    size = -(-len(events) // parts)
    return [list(events[i : i + size]) for i in range(0, len(events), size)]


def b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


def everything(per_batch: list[list[Found]]) -> list[Found]:
    return sorted(found for batch in per_batch for found in batch)


def ungated() -> Scenario:
    """The new partition delivered first, as by a consumer without the gate."""
    scenario = written()
    records = scenario.before + scenario.after
    for record in sorted(records, key=lambda r: (r.partition != 2, r.partition, r.offset)):
        scenario.history.deliver(record)
    return scenario


def test_a_clean_history_in_batches_has_no_anomaly() -> None:
    assert incremental_check(cut(clean().history.events, 2)) == [[], []]


def test_reordered_deliveries_are_found_as_the_batch_check_finds_them(
    spark: SparkSession,
) -> None:
    scenario = ungated()
    events = scenario.history.events
    expected = batch_check(spark, events)
    assert Counter(found[0] for found in expected) == {
        checks.NONMONOTONIC: 2 * len(scenario.moved_keys)
    }
    per_batch = incremental_check(cut(events, 3))
    assert everything(per_batch) == expected


def test_re_deliveries_in_a_later_batch_are_not_reported_again(spark: SparkSession) -> None:
    scenario = ungated()
    events = scenario.history.events
    # The consumer restarts and delivers the first records again: duplicates, not
    # reorderings, though their seqs are below the highest delivered.
    scenario.history.restart("consumer-sc")
    for record in sorted(scenario.before, key=lambda r: r.producer_seq)[:6]:
        scenario.history.deliver(record, instance="c1-again")
    # The audit topic holds the first batch's events twice (an emitter that resent).
    first, rest = events[: len(events) // 2], events[len(events) // 2 :]
    per_batch = incremental_check([first, rest, first])
    assert per_batch[2] == []
    assert everything(per_batch) == batch_check(spark, events)


def test_a_record_shown_across_a_barrier_by_a_later_batch_is_reported_once(
    spark: SparkSession,
) -> None:
    scenario = clean()
    history = scenario.history
    key = next(r.key for r in scenario.before if r.partition == 0)
    zombie = history.write(0, key, 0, 2, producer="zombie-sc")
    events = history.events
    zombie_event = events[-1]
    # The zombie's produce_acked comes first; the generation-1 records below it later
    # (their sidecar's events were delayed), then every event again.
    newer = [e for e in events[:-1] if e.get("generation") == 1 and e["partition"] == 0]
    others = [e for e in events[:-1] if e not in newer]
    per_batch = incremental_check([[*others, zombie_event], newer, events])
    assert per_batch[0] == []
    assert per_batch[1] == [
        (
            checks.WRITTEN_ACROSS_BARRIER,
            None,
            zombie_event["key"],
            0,
            zombie.offset,
            zombie.producer_seq,
        )
    ]
    assert per_batch[2] == []
    assert everything(per_batch) == batch_check(spark, events)


def test_a_record_across_a_barrier_is_reported_once_whatever_reveals_it_later() -> None:
    scenario = clean()
    history = scenario.history
    key = next(r.key for r in scenario.before if r.partition == 0)
    events = list(history.events)
    # Partition 0's lowest generation-1 record: its events held back (a slow emitter).
    lowest = min(e["offset"] for e in events if e.get("generation") == 1 and e["partition"] == 0)
    held = [
        e
        for e in events
        if e.get("generation") == 1 and e["partition"] == 0 and e["offset"] == lowest
    ]
    zombie = history.write(0, key, 0, 2, producer="zombie-sc")
    first = [e for e in history.events if e not in held]
    per_batch = incremental_check([first, held])
    across = (checks.WRITTEN_ACROSS_BARRIER, None, b64(key), 0, zombie.offset, zombie.producer_seq)
    assert per_batch == [[across], []]


def test_a_skipped_record_is_lost_once_the_horizon_passed_its_acknowledgement(
    spark: SparkSession,
) -> None:
    scenario = written()
    history = scenario.history
    records = sorted(scenario.before + scenario.after, key=lambda r: r.producer_seq)
    in_1 = [r for r in records if r.partition == 1]
    gone, late = in_1[2], in_1[4]
    unreached = max((r for r in records if r.partition == 2), key=lambda r: r.offset)
    for record in records:
        if record not in (gone, late, unreached):
            history.deliver(record)
    first = list(history.events)
    history.deliver(late)
    # The first batch has no watermark yet; by the second, the horizon has passed every
    # acknowledgement.
    per_batch = incremental_check(
        [first, history.events[len(first) :]], cutoffs=[None, history.now + 1]
    )
    lost = (checks.LOST, GROUP, gone.key_b64, 1, gone.offset, gone.producer_seq)
    assert per_batch[0] == []
    assert [found for found in per_batch[1] if found[0] == checks.LOST] == [lost]
    assert per_batch[1] == batch_check(spark, history.events)


def test_single_event_anomalies_are_found_in_their_batch(spark: SparkSession) -> None:
    scenario = clean()
    history = scenario.history
    history.gate(2, 52, 1, 0, scenario.boundary, scenario.boundary - 1)
    history.gate(2, 53, 1, 0, scenario.boundary, scenario.boundary)
    offset = history.bypass(1, b"rogue")
    history.deliver_bare(1, offset, b"rogue")
    history.emit(
        CONSUMER,
        audit_events.consumer_truncated(
            group=GROUP,
            instance="c1",
            topic=TOPIC,
            partition=0,
            position=5,
            leader_epoch=3,
            resume_at=4,
            lost=1,
        ),
    )
    per_batch = incremental_check(cut(history.events, 2))
    assert per_batch[0] == []
    assert sorted((f[0], f[3], f[4]) for f in per_batch[1]) == [
        (checks.CONSUMER_TRUNCATED, 0, 4),
        (checks.GATE_EVIDENCE, 2, 52),
        (checks.UNAUDITED_DELIVERY, 1, offset),
    ]
    assert everything(per_batch) == batch_check(spark, history.events)


def test_past_the_horizon_the_state_keeps_only_what_every_later_event_needs(
    spark: SparkSession,
) -> None:
    scenario = written()
    history = scenario.history
    moved = next(iter(scenario.moved_keys))
    skipped = next(r for r in scenario.before if r.key == moved)
    for record in sorted(scenario.before + scenario.after, key=lambda r: r.producer_seq):
        if record != skipped:
            history.deliver(record)
    first = list(history.events)
    # Long after everything the state remembered in full: a zombie writes generation 0
    # above generation 1 in partition 0, and the skipped record of a moved key comes,
    # below the highest seq delivered for its key.
    history.now += 3600
    key = next(r.key for r in scenario.before if r.partition == 0)
    history.write(0, key, 0, 2, producer="zombie-sc")
    history.deliver(skipped)
    cutoff = history.now - 60
    per_batch = incremental_check([first, history.events[len(first) :]], cutoff)
    # Its delivery came after the horizon: by then the record was judged lost (the
    # horizon's false positive), and its delivery is late for its key.
    lost = (
        checks.LOST,
        GROUP,
        skipped.key_b64,
        skipped.partition,
        skipped.offset,
        skipped.producer_seq,
    )
    assert per_batch[0] == [lost]
    assert Counter(found[0] for found in per_batch[1]) == {
        checks.WRITTEN_ACROSS_BARRIER: 1,
        checks.NONMONOTONIC: 1,
    }
    assert everything(per_batch) == sorted([*batch_check(spark, history.events), lost])
    # What is left of the first batch: the highest seq per (group, producer, key), and
    # the lowest and highest offset per (partition, generation).
    state = LiveState()
    check(state, first, cutoff)
    keys = {(e["producer"], e["key"]) for e in first if e["type"] == "delivered"}
    assert state.rows()["deliveries"] == len(keys)
    offsets: dict[tuple[int, int], set[int]] = {}
    for e in first:
        if e["type"] == "produce_acked":
            offsets.setdefault((e["partition"], e["generation"]), set()).add(e["offset"])
    ends = {(p, g, o) for (p, g), found in offsets.items() for o in (min(found), max(found))}
    kept = {
        (partition, generation, offset)
        for (_, partition), generations in state.barrier.partitions.items()
        for generation, records in generations.items()
        for offset in records.rows
    }
    assert kept == ends


# The driver ---------------------------------------------------------------------------


def metric(metrics: StreamMetrics, name: str, labels: dict[str, str] | None = None) -> float:
    value = metrics.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def kafka_records(spark: SparkSession, events: Sequence[Event]) -> Any:
    """A micro-batch as Spark's Kafka source gives it: ``value`` bytes."""
    rows = [(bytearray(value.encode()),) for value in values(events)]
    return spark.createDataFrame(rows, "value binary")


def test_after_a_restart_the_driver_counts_each_anomaly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    scenario = ungated()
    events = scenario.history.events
    # The last batch holds the last reordered delivery.
    last = max(
        i
        for i, e in enumerate(events)
        if e["type"] == "delivered"
        and e["partition"] == 0
        and e["generation"] == 0
        and e["key"] in {b64(k) for k in scenario.moved_keys}
    )
    parts = [events[: last // 2], events[last // 2 : last], events[last:]]
    batches = [kafka_records(spark, part) for part in parts]
    config = StreamConfig(bootstrap="unused", topic="unused", checkpoint=tmp_path)
    labels = {"kind": checks.NONMONOTONIC, "topic": TOPIC}

    first = StreamMetrics(
        live_checks.STREAM_KINDS, max_topics=5, clock=lambda: events[-1]["time"] + 2
    )
    audit = LiveAudit(config, first)
    for batch_id, batch in enumerate(batches[:2]):
        audit(batch, batch_id)
    before_last = metric(first, "sidecar_audit_stream_anomalies_total", labels)
    audit(batches[2], 2)
    in_last = metric(first, "sidecar_audit_stream_anomalies_total", labels) - before_last
    assert before_last + in_last == 2 * len(scenario.moved_keys)
    assert in_last > 0
    assert metric(first, "sidecar_audit_stream_events_total") == len(events)
    assert metric(first, "sidecar_audit_stream_lag_seconds") == pytest.approx(2.0)
    kept = {
        check: metric(first, "sidecar_audit_stream_state_rows", {"check": check})
        for check in ("deliveries", "records", "acknowledgements")
    }
    # No cutoff yet (lateness and horizon are minutes): every delivery and record kept.
    named = [e for e in events if e["type"] in ("produce_acked", "delivered")]
    assert kept["deliveries"] == len(
        {(e["producer"], e["key"], e["producer_seq"]) for e in named if e["type"] == "delivered"}
    )
    assert kept["records"] == len({(e["partition"], e["offset"], e["generation"]) for e in named})

    # A restart after the last batch was saved (killed before Spark committed it): the
    # counters start from the saved totals, and the batch Spark runs again is not
    # counted again.
    saved = StateStore(tmp_path / "state")
    assert saved.latest() == (events[-1]["time"], totals_of(first))
    again = StreamMetrics(live_checks.STREAM_KINDS, max_topics=5)
    again.restore(*saved.latest())
    LiveAudit(config, again)(batches[2], 2)
    assert totals_of(again) == totals_of(first)
    assert metric(again, "sidecar_audit_stream_anomalies_total", labels) == before_last + in_last

    # A restart before the last batch was complete (killed while checking it): the
    # counters start from the batch before, and the batch run again counts its own,
    # from the state the journal rebuilds.
    (tmp_path / "state" / "2.json").unlink()
    third = StreamMetrics(live_checks.STREAM_KINDS, max_topics=5)
    third.restore(*saved.latest())
    assert metric(third, "sidecar_audit_stream_anomalies_total", labels) == before_last
    LiveAudit(config, third)(batches[2], 2)
    assert totals_of(third) == totals_of(first)


def test_a_state_rebuilt_from_snapshot_and_journal_finds_what_the_running_one_finds(
    tmp_path: Path,
) -> None:
    scenario = ungated()
    history = scenario.history
    history.commit(1, history.end_offset(1))
    parts = cut(history.events, 7)
    config = StreamConfig(bootstrap="unused", topic="unused", checkpoint=tmp_path, lateness_s=0.0)
    # A snapshot after every second batch or so, and the journal between them.
    store = StateStore(tmp_path / "state", snapshot_events=len(parts[0]) * 2, events_per_row=0)
    running = LiveAudit(config, StreamMetrics(live_checks.STREAM_KINDS, 5), store)
    reference = LiveState()
    for batch_id, part in enumerate(parts[:-1]):
        running.check_values(values(part), batch_id, 0.0)
        cutoff = None if reference.newest is None else reference.newest - config.horizon_s
        check(reference, part, cutoff)
    names = sorted(p.name for p in (tmp_path / "state").iterdir())
    snapshots = [int(n.split(".")[0]) for n in names if n.endswith(".state.pickle")]
    assert len(snapshots) == 1, names
    # Every batch after the snapshot is still in the journal.
    assert {n for n in names if n.endswith(".values.json")} == {
        f"{i}.values.json" for i in range(snapshots[0] + 1, len(parts) - 1)
    }
    rebuilt, totals, batch = store.restore(len(parts) - 1)
    assert batch == len(parts) - 2
    assert totals == store.latest()[1]
    assert rebuilt.rows() == reference.rows()
    assert rebuilt.newest == reference.newest
    assert check(rebuilt, parts[-1], rebuilt.newest) == check(
        reference, parts[-1], reference.newest
    )


def test_events_older_than_the_watermark_are_counted_late(tmp_path: Path) -> None:
    events = sorted(clean().history.events, key=live_checks.delivery_order)
    older, newer = events[: len(events) // 2], events[len(events) // 2 :]
    # The watermark falls inside the older half.
    lateness = newer[-1]["time"] - older[len(older) // 2]["time"]
    config = StreamConfig(
        bootstrap="unused", topic="unused", checkpoint=tmp_path, lateness_s=lateness
    )
    metrics = StreamMetrics(live_checks.STREAM_KINDS, 5)
    audit = LiveAudit(config, metrics)
    audit.check_values(values(newer), 0, 0.0)
    assert metric(metrics, "sidecar_audit_stream_late_events_total") == 0
    # The older half, after the newer: late where older than the newest time less the
    # lateness.
    audit.check_values(values(older), 1, 0.0)
    watermark = newer[-1]["time"] - lateness
    expected = sum(1 for e in older if e["time"] < watermark)
    assert 0 < expected < len(older)
    assert metric(metrics, "sidecar_audit_stream_late_events_total") == expected
    assert metric(metrics, "sidecar_audit_stream_events_total") == len(events)


class _Node:
    """An object that can be in a reference cycle and be watched by a weak reference."""

    me: object = None


def test_a_batch_is_checked_with_the_collector_paused_and_its_cycles_then_collected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = StreamConfig(bootstrap="unused", topic="unused", checkpoint=tmp_path)
    audit = LiveAudit(config, StreamMetrics(live_checks.STREAM_KINDS, 5))
    seen: list[bool] = []
    cycles: list[weakref.ref[_Node]] = []
    original = live_checks.check_batch

    def watched(state: LiveState, events: Sequence[Event], cutoff: float | None) -> list[Any]:
        seen.append(gc.isenabled())
        node = _Node()
        node.me = node  # garbage once this call returns: only the collector frees it
        cycles.append(weakref.ref(node))
        return original(state, events, cutoff)

    monkeypatch.setattr(live_checks, "check_batch", watched)
    frozen = gc.get_freeze_count()
    try:
        audit.check_values(values(clean().history.events), 0, 0.0)
        assert seen == [False]
        assert gc.isenabled()
        assert cycles[0]() is None, "the batch's cycle was frozen, not collected"
        # The state the batch left is out of the collector's reach.
        assert gc.get_freeze_count() > frozen
    finally:
        gc.unfreeze()


def test_a_cycle_alive_across_a_batch_is_freed_by_the_next_full_collection(
    tmp_path: Path,
) -> None:
    # As the batch's DataFrame is: alive while the batch is checked, a cycle (py4j's
    # proxies refer to themselves), dropped once the batch function returns.
    config = StreamConfig(
        bootstrap="unused", topic="unused", checkpoint=tmp_path, full_collection_batches=2
    )
    audit = LiveAudit(config, StreamMetrics(live_checks.STREAM_KINDS, 5))
    parts = cut(clean().history.events, 2)
    try:
        spark_object = _Node()
        spark_object.me = spark_object
        watched = weakref.ref(spark_object)
        audit.check_values(values(parts[0]), 0, 0.0)
        del spark_object
        gc.collect()
        assert watched() is not None, "frozen with the state: out of the collector's reach"
        audit.check_values(values(parts[1]), 1, 0.0)  # the second: everything collected
        assert watched() is None
    finally:
        gc.unfreeze()


def totals_of(metrics: StreamMetrics) -> Totals:
    """The counters' values, as ``Totals``."""
    anomalies = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "sidecar_audit_stream_anomalies_total" and sample.value:
                anomalies[(sample.labels["kind"], sample.labels["topic"])] = int(sample.value)
    return Totals(
        anomalies,
        int(metric(metrics, "sidecar_audit_stream_events_total")),
        int(metric(metrics, "sidecar_audit_stream_late_events_total")),
    )


def test_topic_labels_are_capped() -> None:
    metrics = StreamMetrics(live_checks.STREAM_KINDS, max_topics=2)
    metrics.record_batch(
        events=3,
        late=0,
        newest=None,
        anomalies={(checks.NONMONOTONIC, t): 1 for t in ("a", "b", "c", "d")},
    )
    counted = {
        topic: metric(
            metrics,
            "sidecar_audit_stream_anomalies_total",
            {"kind": checks.NONMONOTONIC, "topic": topic},
        )
        for topic in ("a", "b", "c", OTHER_TOPIC)
    }
    assert counted == {"a": 1, "b": 1, "c": 0, OTHER_TOPIC: 2}
    with pytest.raises(ValueError, match="unknown anomaly kind"):
        metrics.record_batch(events=0, late=0, newest=None, anomalies={(checks.DUPLICATE, "a"): 1})


# Events -------------------------------------------------------------------------------


def test_the_event_fields_are_the_batch_jobs() -> None:
    spark_types = {"long": "bigint", "double": "double", "string": "string", "boolean": "boolean"}
    for schema, fields in (
        (EVENT_SCHEMA, live_checks.EVENT_FIELDS),
        (EVIDENCE_SCHEMA, live_checks.EVIDENCE_FIELDS),
    ):
        assert [f.name for f in schema.fields] == list(fields)
        for f in schema.fields:
            if fields[f.name] != "evidence":
                assert f.dataType.simpleString() == spark_types[fields[f.name]], f.name
    assert live_checks.SCHEMA_VERSION == audit_events.SCHEMA_VERSION


def test_values_that_are_not_events_are_left_out_and_counted() -> None:
    event = clean().history.events[0]
    parsed = live_checks.parse_events(
        [
            json.dumps(event),
            json.dumps(event),  # sent twice: once
            "not json",
            None,
            "[1, 2]",
            json.dumps({**event, "time": "yesterday"}),
            json.dumps({**event, "seq": 99, "schema": 2}),
            json.dumps({**event, "seq": 100, "partition": "one", "extra": 1}).encode(),
        ]
    )
    assert parsed.unreadable == 4
    assert parsed.other_schema == 1
    assert [e["seq"] for e in parsed.events] == [event["seq"], 100]
    # A field of the wrong type is absent, as Spark's JSON reader has it; unknown ones go.
    assert "partition" not in parsed.events[1]
    assert "extra" not in parsed.events[1]


_FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(),
    st.text(max_size=3),
    st.lists(st.fixed_dictionaries({"source": st.integers(0, 9)}), max_size=2),
)


@given(
    st.dictionaries(st.sampled_from([*live_checks.EVENT_FIELDS, "extra", "other"]), _FIELD_VALUES)
)
def test_an_event_is_conformed_field_by_field_whatever_its_shape(raw: dict[str, Any]) -> None:
    # What conform promises, field by field: known fields only, each of its type or
    # absent. Its shortcut by the event's shape must give the same.
    expected = {}
    for name, value in raw.items():
        kind = live_checks.EVENT_FIELDS.get(name)
        if kind is not None and value is not None:
            typed = live_checks._typed(value, kind)
            if typed is not None:
                expected[name] = typed
    assert live_checks.conform(dict(raw)) == expected
    # Again, with the shape now known.
    assert live_checks.conform(dict(raw)) == expected


# Any history, any cut: what the batch checks find ----------------------------------------


def random_history(seed: int) -> list[Event]:
    """The clean history's records delivered in a random order by instances of two
    sidecars that come and go, some delivered twice, some skipped, with commits, a
    bypassing writer and a zombie now and then."""
    rng = random.Random(seed)
    scenario = written()
    history = scenario.history
    records = scenario.before + scenario.after
    order = sorted(records, key=lambda r: (r.partition, r.offset))
    if rng.random() < 0.5:
        rng.shuffle(order)
    instance, sidecar = "c1", CONSUMER
    for record in order:
        if rng.random() < 0.05:
            continue
        if rng.random() < 0.1:
            # Another instance, in this sidecar or the other one (a rebalance).
            instance = f"c{rng.randrange(2, 9)}"
            sidecar = rng.choice([CONSUMER, "consumer-2"])
            if rng.random() < 0.5:
                history.restart(sidecar)
        ordered = rng.choice([True, True, None, False])
        history.deliver(record, instance=instance, sidecar=sidecar, ordered=ordered)
        if rng.random() < 0.1:
            history.deliver(record, instance=instance, sidecar=sidecar)
        if rng.random() < 0.1:
            history.commit(record.partition, record.offset + rng.randrange(0, 3), instance=instance)
        if rng.random() < 0.03:
            key = rng.choice(records).key
            history.write(rng.randrange(0, 3), key, rng.randrange(0, 2), 2, producer="zombie-sc")
        if rng.random() < 0.02:
            offset = history.bypass(1, b"rogue")
            history.deliver_bare(1, offset, b"rogue")
    return history.events


def arrive(events: Sequence[Event], seed: int, parts: int) -> list[list[Event]]:
    """``events`` cut into ``parts`` batches, one sidecar's events from some point on
    held back to later batches (a slow emitter: its events still in their order),
    and some batches sent again."""
    rng = random.Random(seed)
    batches = [list(b) for b in cut(events, parts)]
    sidecars = sorted({e["sidecar"] for e in events})
    slow = rng.choice(sidecars)
    for index in range(len(batches) - 1):
        if rng.random() < 0.5:
            held = [e for e in batches[index] if e["sidecar"] == slow]
            batches[index] = [e for e in batches[index] if e["sidecar"] != slow]
            batches[index + 1] = held + batches[index + 1]
    if rng.random() < 0.3:
        batches.insert(rng.randrange(1, len(batches) + 1), list(rng.choice(batches)))
    return batches


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**32 - 1), parts=st.integers(1, 9))
def test_any_history_in_any_batches_finds_what_the_batch_checks_find(
    spark: SparkSession, seed: int, parts: int
) -> None:
    events = random_history(seed)
    batches = arrive(events, seed, parts)
    # The last batch comes after the horizon has passed every acknowledgement: every
    # record is judged, against everything delivered.
    after_all = max(e["time"] for e in events) + 1
    cutoffs = [None] * (len(batches) - 1) + [after_all]
    per_batch = incremental_check(batches, cutoffs=cutoffs)
    found = everything(per_batch)
    assert len(found) == len(set(found)), "an anomaly reported twice"
    assert found == batch_check(spark, events)


def test_a_snapshot_waits_for_twice_as_many_events_as_the_state_keeps_rows(
    tmp_path: Path,
) -> None:
    events = clean().history.events
    store = StateStore(tmp_path, snapshot_events=1, events_per_row=2.0)
    state = LiveState()
    for batch_id, part in enumerate(cut(events, 4)):
        check(state, part, None)
        store.save(batch_id, values(part), len(part), None, state, Totals())
        rows = sum(state.rows().values())
        journaled = sum(len(p) for p in cut(events, 4)[: batch_id + 1])
        snapshots = sorted(tmp_path.glob("*.state.pickle"))
        # Every delivery and record is kept: more rows than half the events so far.
        assert rows * 2 > journaled
        assert snapshots == []
