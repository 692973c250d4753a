"""Each check on hand-built histories: exactly the injected anomalies, none when clean."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from ordered_audit import checks
from ordered_audit.sources import events_from_dicts
from sidecar.audit import events as audit_events
from tests.audit.history import (
    CONSUMER,
    GROUP,
    KEYS,
    TOPIC,
    History,
    Scenario,
    clean,
    deliver_in_order,
    written,
)


def frame(spark: SparkSession, scenario: Scenario) -> DataFrame:
    return events_from_dicts(spark, scenario.history.events)


def found(spark: SparkSession, scenario: Scenario) -> list[dict[str, Any]]:
    return [row.asDict() for row in checks.anomalies(frame(spark, scenario)).collect()]


def kinds(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(row["kind"] for row in rows)


def b64(key: bytes) -> str:
    import base64

    return base64.b64encode(key).decode()


def test_a_clean_history_has_no_anomaly(spark: SparkSession) -> None:
    assert found(spark, clean()) == []


def test_a_record_the_group_skipped_is_lost_and_one_not_reached_yet_is_not(
    spark: SparkSession,
) -> None:
    scenario = clean()
    events = scenario.history.events
    in_partition_1 = sorted(
        (r for r in scenario.before + scenario.after if r.partition == 1), key=lambda r: r.offset
    )
    skipped, last = in_partition_1[3], in_partition_1[-1]

    def delivery_of(record: Any, event: dict[str, Any]) -> bool:
        return bool(
            event["type"] == "delivered"
            and event["partition"] == record.partition
            and event["offset"] == record.offset
        )

    # The skipped record is not delivered; the last one neither, nor is partition 1
    # committed past it: the group has not reached it.
    scenario.history.events = [
        e
        for e in events
        if not delivery_of(skipped, e)
        and not delivery_of(last, e)
        and not (e["type"] == "committed" and e["partition"] == 1)
    ]
    rows = found(spark, scenario)
    assert kinds(rows) == {checks.LOST: 1}
    (row,) = rows
    assert (row["group"], row["partition"], row["offset"], row["key"]) == (
        GROUP,
        1,
        skipped.offset,
        skipped.key_b64,
    )
    assert (row["producer"], row["producer_seq"]) == (skipped.producer, skipped.producer_seq)
    unseen = [r.asDict() for r in checks.unseen(frame(spark, scenario)).collect()]
    assert unseen == [{"group": GROUP, "topic": TOPIC, "unseen": 1}]  # the last one


def test_a_record_acknowledged_after_the_group_started_is_lost_even_at_its_first_offset(
    spark: SparkSession,
) -> None:
    # The group consumes while the topic grows, and misses the first record of the new
    # partition although it reads on from there (a new partition read from "latest").
    history = History()
    for record in [history.produce(key, 0, 2) for key in KEYS]:
        history.deliver(record)
    history.change("expand", 0, 2, 3)
    after = [history.produce(key, 1, 3) for key in KEYS]
    first_in_2 = min((r for r in after if r.partition == 2), key=lambda r: r.offset)
    for record in after:
        if record != first_in_2:
            history.deliver(record)
    rows = found(spark, Scenario(history, [], after, 0))
    assert [(r["kind"], r["partition"], r["offset"], r["key"]) for r in rows] == [
        (checks.LOST, 2, first_in_2.offset, first_in_2.key_b64)
    ]


def test_duplicates_are_found_and_told_apart_by_cause(spark: SparkSession) -> None:
    scenario = clean()
    history = scenario.history
    records = sorted(scenario.before + scenario.after, key=lambda r: (r.partition, r.offset))
    by_partition_1 = [r for r in records if r.partition == 1]
    # The same instance delivers a record again (an app that seeks back).
    history.deliver(by_partition_1[0])
    # The consumer's sidecar restarts (its audit seq starts again at 0) and delivers
    # uncommitted records again to a new instance.
    history.restart("consumer-sc")
    history.deliver(by_partition_1[1], instance="c1-restarted")
    # An instance that existed all along takes partition 1 over in a rebalance.
    history.events.insert(
        1,
        {
            "schema": 1,
            "type": "committed",
            "sidecar": "other-sc",
            "seq": 0,
            "time": history.events[0]["time"] + 0.001,
            "group": GROUP,
            "instance": "c2",
            "topic": TOPIC,
            "partition": 9,
            "offset": 0,
        },
    )
    history._seq["other-sc"] = 1
    history.deliver(by_partition_1[2], instance="c2", sidecar="other-sc")
    rows = found(spark, scenario)
    assert kinds(rows) == {checks.DUPLICATE: 3}
    causes = {(r["offset"], r["detail"], r["key"]) for r in rows}
    assert causes == {
        (by_partition_1[0].offset, checks.SAME_INSTANCE, by_partition_1[0].key_b64),
        (by_partition_1[1].offset, checks.AFTER_RESTART, by_partition_1[1].key_b64),
        (by_partition_1[2].offset, checks.REBALANCE, by_partition_1[2].key_b64),
    }


def test_the_same_instance_in_a_later_assignment_got_a_record_again_by_a_rebalance(
    spark: SparkSession,
) -> None:
    """Its commit before the rebalance did not land (the group's coordinator moved), and
    the partition came back to it: at-least-once, not a seek or a bug. Within one
    assignment, or from a sidecar whose events do not say, it is the same instance's."""
    history = History()
    rebalanced, sought, older = (history.produce(key, 0, 2) for key in KEYS[:3])
    history.deliver(rebalanced, assignment=1)
    history.deliver(rebalanced, assignment=2)
    history.deliver(sought, assignment=2)
    history.deliver(sought, assignment=2)
    history.deliver(older)
    history.deliver(older)
    rows = [
        row.asDict()
        for row in checks.duplicates(frame(spark, Scenario(history, [], [], 0))).collect()
    ]
    assert sorted((r["offset"], r["partition"], r["detail"]) for r in rows) == sorted(
        [
            (rebalanced.offset, rebalanced.partition, checks.REBALANCE),
            (sought.offset, sought.partition, checks.SAME_INSTANCE),
            (older.offset, older.partition, checks.SAME_INSTANCE),
        ]
    )


def test_an_ungated_consumer_delivers_the_moved_keys_out_of_order(spark: SparkSession) -> None:
    scenario = written()
    history = scenario.history
    records = scenario.before + scenario.after
    # The new partition first, then the rest: no gate held partition 2 back.
    for record in sorted(records, key=lambda r: (r.partition != 2, r.partition, r.offset)):
        history.deliver(record)
    rows = found(spark, scenario)
    assert kinds(rows) == {checks.NONMONOTONIC: 2 * len(scenario.moved_keys)}
    assert {row["key"] for row in rows} == {b64(key) for key in scenario.moved_keys}
    for row in rows:
        # Each flagged delivery is a generation-0 record of partition 0.
        assert (row["partition"], row["generation"], row["group"]) == (0, 0, GROUP)
        assert "delivered after seq" in row["detail"]


def test_order_is_checked_only_where_the_topic_promises_it(spark: SparkSession) -> None:
    """The same ungated delivery on a topic without ordered delivery is no anomaly; from
    a sidecar that does not say (no ``ordered`` field), the topic is taken as ordered."""
    for ordered in (False, None):
        scenario = written()
        records = scenario.before + scenario.after
        for record in sorted(records, key=lambda r: (r.partition != 2, r.partition, r.offset)):
            scenario.history.deliver(record, ordered=ordered)
        expected = {} if ordered is False else {checks.NONMONOTONIC: 2 * len(scenario.moved_keys)}
        assert kinds(found(spark, scenario)) == expected, ordered


def test_re_deliveries_of_seen_seqs_are_not_order_violations(spark: SparkSession) -> None:
    scenario = clean()
    history = scenario.history
    # Everything delivered again, in order, after a restart: duplicates only.
    history.restart("consumer-sc")
    for record in sorted(scenario.before + scenario.after, key=lambda r: r.producer_seq)[:5]:
        history.deliver(record, instance="c1-again")
    assert kinds(found(spark, scenario)) == {checks.DUPLICATE: 5}


def test_a_record_of_an_old_generation_above_a_newer_one_was_written_across_a_barrier(
    spark: SparkSession,
) -> None:
    scenario = clean()
    # A zombie that never saw generation 1 appends with generation 0 (count 2).
    key = next(r.key for r in scenario.before if r.partition == 0)
    late = scenario.history.write(0, key, 0, 2, producer="zombie-sc")
    rows = found(spark, scenario)
    assert kinds(rows) == {checks.WRITTEN_ACROSS_BARRIER: 1}
    (row,) = rows
    assert (row["partition"], row["offset"], row["generation"], row["key"], row["producer"]) == (
        0,
        late.offset,
        0,
        b64(key),
        "zombie-sc",
    )
    assert "above generation 1" in row["detail"]


def test_gate_evidence_must_show_each_source_released(spark: SparkSession) -> None:
    scenario = clean()
    history = scenario.history
    boundary = scenario.boundary
    # Released: committed to the boundary, data gone, or removed.
    history.gate(2, 50, 1, 0, boundary, None, log_start=boundary)
    history.gate(2, 51, 1, 0, boundary, 0, mode="removed")
    # Not released: committed below the boundary, data still there.
    history.gate(2, 52, 1, 0, boundary, boundary - 1)
    history.gate(2, 53, 1, 0, boundary, None, log_start=None, mode=None)
    rows = found(spark, scenario)
    assert kinds(rows) == {checks.GATE_EVIDENCE: 2}
    assert sorted(row["offset"] for row in rows) == [52, 53]
    assert all(row["partition"] == 2 and row["group"] == GROUP for row in rows)


def test_a_record_without_sidecar_headers_is_an_unaudited_delivery(spark: SparkSession) -> None:
    scenario = clean()
    history = scenario.history
    offset = history.bypass(1, b"rogue")
    history.deliver_bare(1, offset, b"rogue")
    rows = found(spark, scenario)
    assert kinds(rows) == {checks.UNAUDITED_DELIVERY: 1}
    (row,) = rows
    assert (row["partition"], row["offset"], row["key"], row["producer"]) == (
        1,
        offset,
        b64(b"rogue"),
        None,
    )


def test_operations_are_delimited_by_phases_and_matched_to_admin_events(
    spark: SparkSession,
) -> None:
    scenario = written()
    history = scenario.history
    history.change("shrink", 1, 3, 2, result="rolled_back")
    # A change finished by a successor: no admin event.
    history.change("shrink", 1, 3, 2, admin=False)
    deliver_in_order(scenario)
    ops = [
        row.asDict() for row in checks.operations(frame(spark, scenario)).orderBy("start").collect()
    ]
    assert [(o["kind"], o["from_count"], o["target_count"], o["result"]) for o in ops] == [
        ("expand", 2, 3, "done"),
        ("shrink", 3, 2, "rolled_back"),
        ("shrink", 3, 2, "done"),
    ]
    expansion = ops[0]
    assert expansion["keys_moved"] == len(scenario.moved_keys)
    assert expansion["keys_seen_in_both"] == len(KEYS)
    assert expansion["phase_events"] == 5
    assert 0 < expansion["barrier_s"] < expansion["duration_s"]
    # The produce pause: from the last write before the change to the first after it
    # (5 phase events and the admin event in between, 0.01 s apart).
    assert expansion["ack_gap_s"] == pytest.approx(0.07)
    assert expansion["period_end"] == ops[1]["start"]
    assert ops[1]["keys_moved"] is None  # rolled back: nothing moved
    assert ops[2]["period_end"] is None


def test_violations_and_buckets_count_anomalies_in_their_time(spark: SparkSession) -> None:
    scenario = clean()
    history = scenario.history
    offset = history.bypass(1, b"rogue")
    history.deliver_bare(1, offset, b"rogue")
    events = frame(spark, scenario)
    anomalies = checks.anomalies(events)
    (op,) = checks.violations_per_operation(checks.operations(events), anomalies).collect()
    assert op["violations"] == 1
    buckets = checks.per_bucket(events, anomalies, 1.0).collect()
    assert sum(b["violations"] for b in buckets) == 1
    assert sum(b[checks.UNAUDITED_DELIVERY] for b in buckets) == 1
    assert sum(b["produce_acked"] for b in buckets) == 4 * len(KEYS)
    assert sum(b["delivered"] for b in buckets) == 4 * len(KEYS) + 1


def test_only_events_held_twice_may_repeat(spark: SparkSession) -> None:
    events = clean().history.events
    assert checks.may_repeat_events(events_from_dicts(spark, events)).isEmpty()
    # The same event twice (a file read twice); one of a restarted sidecar, whose seq
    # is used again at another time, is not a repeat.
    twice = events_from_dicts(spark, [*events, events[3]])
    assert not checks.may_repeat_events(twice).isEmpty()
    assert checks.distinct_events(twice).count() == len(events)
    again = events_from_dicts(spark, [*events, events[3] | {"time": events[3]["time"] + 1}])
    assert checks.may_repeat_events(again).isEmpty()


def test_incarnations_follow_seq_resets(spark: SparkSession) -> None:
    scenario = clean()
    history = scenario.history
    history.restart("consumer-sc")
    history.commit(0, 0)
    history.restart("consumer-sc")
    history.commit(0, 0)
    rows = (
        checks.with_incarnation(frame(spark, scenario))
        .where("sidecar = 'consumer-sc'")
        .groupBy("incarnation")
        .count()
        .orderBy("incarnation")
        .collect()
    )
    assert [(r["incarnation"], r["count"]) for r in rows][1:] == [(1, 1), (2, 1)]


def test_a_consumer_truncation_is_reported_and_the_reused_offsets_are_not_duplicates(
    spark: SparkSession,
) -> None:
    scenario = clean()
    history = scenario.history
    records = sorted(scenario.before + scenario.after, key=lambda r: (r.partition, r.offset))
    on_1 = [r for r in records if r.partition == 1]
    cut_from, position = on_1[1].offset, on_1[-1].offset + 1
    # An unclean election cut partition 1 below what the group had read: the instance
    # reads again from ``cut_from`` and gets the records the new leader wrote there.
    history.emit(
        CONSUMER,
        audit_events.consumer_truncated(
            group=GROUP,
            instance="c1",
            topic=TOPIC,
            partition=1,
            position=position,
            leader_epoch=3,
            resume_at=cut_from,
            lost=position - cut_from,
        ),
    )
    for record in on_1[1:]:
        history.deliver(record)
    # A delivery again below the cut is still a duplicate.
    history.deliver(on_1[0])
    rows = found(spark, scenario)
    assert kinds(rows) == {checks.CONSUMER_TRUNCATED: 1, checks.DUPLICATE: 1}
    [cut] = [r for r in rows if r["kind"] == checks.CONSUMER_TRUNCATED]
    assert (cut["group"], cut["partition"], cut["offset"]) == (GROUP, 1, cut_from)
    assert f"below the position {position}: {position - cut_from} offset(s)" in cut["detail"]
    [again] = [r for r in rows if r["kind"] == checks.DUPLICATE]
    assert (again["offset"], again["detail"]) == (on_1[0].offset, checks.SAME_INSTANCE)
