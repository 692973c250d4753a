"""The consumer instance front class over fakes of its adapters: subscribing, the
rebalance handler, polls through the gate, commits and seeks. No cluster."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.config import ConsumerSettings
from sidecar.core.consume import TopicPartition
from sidecar.core.errors import BadRequest, ConsumerStateConflict, KafkaUnavailable
from sidecar.core.generations import Boundary, GenerationLog
from sidecar.core.handoff import AssignmentChange, AssignmentNotice
from sidecar.core.placement import GENERATION_HEADER
from sidecar.faults import FaultHooks
from sidecar.service.instance import ConsumerInstance, InstanceConfig
from sidecar.service.release import PollResult
from tests.unit.service import fakes

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


async def _subscribed(
    context: fakes.Context, *, auto_commit: bool = False, assignment_events: bool = False
) -> ConsumerInstance:
    config = InstanceConfig(
        group="g",
        name="i",
        format="binary",
        auto_commit=auto_commit,
        assignment_events=assignment_events,
    )
    instance = ConsumerInstance(config, context.build(), instance_key="s-i")
    await instance.subscribe(["t"], None)
    return instance


async def _poll(instance: ConsumerInstance, timeout_s: float, max_bytes: int | None) -> PollResult:
    """A poll whose response reached the app, as the HTTP layer confirms it."""
    result = await instance.poll(timeout_s, max_bytes)
    instance.sent(result)
    return result


async def _assign(context: fakes.Context, instance: ConsumerInstance, *tps: TopicPartition) -> None:
    context.consumer.assigned = set(tps)
    await instance.partitions_assigned(set(tps))


async def test_an_unmanaged_topic_is_delivered_in_offset_order() -> None:
    context = fakes.Context()
    instance = await _subscribed(context)
    assert context.consumer.handler is instance
    await _assign(context, instance, TP0)
    context.consumer.next_fetch = {TP0: fakes.records("t", 0, 0, 4)}
    context.consumer.highwaters[TP0] = 9
    result = await _poll(instance, 0.05, None)
    assert [r.offset for r in result.records] == [0, 1, 2, 3, 4]
    assert context.metrics.delivered_counts == {TP0: 5}
    assert context.metrics.lags == {TP0: 4}


async def test_a_poll_stops_at_max_bytes_and_keeps_the_rest() -> None:
    context = fakes.Context()
    instance = await _subscribed(context)
    await _assign(context, instance, TP0)
    context.consumer.next_fetch = {TP0: fakes.records("t", 0, 0, 4)}
    first = await _poll(instance, 0.05, 4)  # each record is 2 bytes (key and value)
    assert [r.offset for r in first.records] == [0, 1]
    second = await _poll(instance, 0.05, None)
    assert [r.offset for r in second.records] == [2, 3, 4]


async def test_a_gated_record_waits_for_the_group_and_keys_assigned() -> None:
    # Partition 1 took keys of partition 0 at its offset 5: its first record waits until
    # the group committed partition 0 to 5 and acknowledged that keys_revoked, then the
    # app is told keys_assigned, and the record follows once it acknowledges that.
    context = fakes.Context()
    context.registry = fakes.Registry(fakes.runtime("t", fakes.expanded_log(5)))
    instance = await _subscribed(context)
    await _assign(context, instance, TP1)
    context.consumer.next_fetch = {TP1: fakes.records("t", 1, 0, 1)}
    held = await _poll(instance, 0.03, None)
    assert held.records == []
    assert held.events == []
    assert context.store.waiting == [("g", "t", 0, 5, "s-i")]
    assert context.metrics.waiting == 1

    context.offsets.committed[("g", "t")] = {0: 5}
    context.store.acknowledged.append(("g", "t", 0, 1))
    told = await _poll(instance, 0.03, None)
    assert told.records == []
    assert [(e.kind.value, e.partition, e.generation) for e in told.events] == [
        ("keys_assigned", 1, 1)
    ]
    assert context.store.waiting == []
    assert context.metrics.waiting == 0
    assert [e["type"] for e in context.audit.events] == ["gate_opened"]

    await instance.acknowledge_events([told.events[0].event_id])
    released = await _poll(instance, 0.03, None)
    assert [r.offset for r in released.records] == [0, 1]
    assert released.events == []


async def test_the_ungated_fault_delivers_a_gated_record_at_once() -> None:
    # The record of the test above, with faults.ungated_delivery armed: no wait, no
    # hand-off, no gate_opened, delivered (and audited) as if the topic were unordered.
    context = fakes.Context(faults=FaultHooks(ungated_delivery=True))
    context.registry = fakes.Registry(fakes.runtime("t", fakes.expanded_log(5)))
    instance = await _subscribed(context)
    await _assign(context, instance, TP1)
    context.consumer.next_fetch = {TP1: fakes.records("t", 1, 0, 1)}
    released = await _poll(instance, 0.03, None)
    assert [r.offset for r in released.records] == [0, 1]
    assert released.events == []
    assert context.store.waiting == []
    assert [e["type"] for e in context.audit.events] == ["delivered", "delivered"]
    # The topic still promises order: the audit is told so, and checks it.
    assert [e["ordered"] for e in context.audit.events] == [True, True]


async def test_deliveries_of_a_topic_without_ordered_delivery_say_so_to_the_audit() -> None:
    context = fakes.Context()
    context.registry = fakes.Registry(fakes.runtime("t", fakes.expanded_log(5), ordered=False))
    instance = await _subscribed(context)
    await _assign(context, instance, TP1)
    context.consumer.next_fetch = {TP1: fakes.records("t", 1, 0, 1)}
    released = await _poll(instance, 0.03, None)
    assert [r.offset for r in released.records] == [0, 1]
    delivered = [e for e in context.audit.events if e["type"] == "delivered"]
    assert [e["ordered"] for e in delivered] == [False, False]


async def test_relocation_tombstones_are_skipped_but_count_as_delivered() -> None:
    context = fakes.Context()
    context.registry = fakes.Registry(fakes.runtime("t", fakes.expanded_log(0), ordered=False))
    instance = await _subscribed(context)
    await _assign(context, instance, TP0)
    context.consumer.next_fetch = {
        TP0: [fakes.Record("t", 0, 0), fakes.tombstone("t", 0, 1), fakes.Record("t", 0, 2)]
    }
    result = await _poll(instance, 0.05, None)
    assert [r.offset for r in result.records] == [0, 2]
    await instance.commit(None)
    assert context.consumer.commits == [{TP0: 3}]


async def test_a_commit_names_the_last_record_and_covers_what_follows_it() -> None:
    # A read-committed fetch ends past a transaction marker: committing the last
    # record's next offset commits the fetch position.
    context = fakes.Context()
    instance = await _subscribed(context)
    await _assign(context, instance, TP0)
    context.consumer.next_fetch = {TP0: fakes.records("t", 0, 0, 2)}
    await _poll(instance, 0.05, None)
    context.consumer.positions[TP0] = 4  # a marker at 3
    await _poll(instance, 0.02, None)
    await instance.commit({TP0: 3})
    assert context.consumer.commits == [{TP0: 4}]
    assert context.metrics.commits == 1
    commits = [e for e in context.audit.events if e["type"] == "committed"]
    assert [(e["type"], e["offset"]) for e in commits] == [("committed", 4)]


async def test_a_commit_beyond_the_delivered_position_is_refused() -> None:
    context = fakes.Context()
    instance = await _subscribed(context)
    await _assign(context, instance, TP0)
    context.consumer.next_fetch = {TP0: fakes.records("t", 0, 0, 2)}
    await _poll(instance, 0.05, None)
    with pytest.raises(BadRequest, match="beyond the delivered position 3"):
        await instance.commit({TP0: 7})
    with pytest.raises(BadRequest, match="not assigned"):
        await instance.commit({TP1: 0})
    assert context.consumer.commits == []


async def test_a_commit_past_an_unacknowledged_revocation_is_refused() -> None:
    # Partition 0's keys moved away at offset 2: the app must acknowledge keys_revoked
    # before a commit passes it; the event is in the next records response.
    context = fakes.Context()
    context.registry = fakes.Registry(fakes.runtime("t", fakes.expanded_log(2)))
    instance = await _subscribed(context)
    await _assign(context, instance, TP0)
    context.consumer.next_fetch = {TP0: fakes.records("t", 0, 0, 1)}
    result = await _poll(instance, 0.05, None)
    assert [r.offset for r in result.records] == [0, 1]
    with pytest.raises(ConsumerStateConflict, match="acknowledge event 1"):
        await instance.commit(None)
    told = await _poll(instance, 0.02, None)
    assert [(e.kind.value, e.partition) for e in told.events] == [("keys_revoked", 0)]
    await instance.acknowledge_events([told.events[0].event_id])
    assert context.store.acknowledged == [("g", "t", 0, 1)]
    await instance.commit(None)
    assert context.consumer.commits == [{TP0: 2}]


async def test_a_released_run_stops_at_a_revocation_until_the_app_is_told() -> None:
    # The gate is decided once for a run of records, not per record: the run must still
    # end at offset 5, where partition 0's keys moved away, until keys_revoked is
    # acknowledged.
    context = fakes.Context()
    context.registry = fakes.Registry(fakes.runtime("t", fakes.expanded_log(5)))
    instance = await _subscribed(context)
    await _assign(context, instance, TP0)
    context.consumer.next_fetch = {TP0: fakes.records("t", 0, 0, 9)}
    first = await _poll(instance, 0.05, None)
    assert [r.offset for r in first.records] == [0, 1, 2, 3, 4]
    told = await _poll(instance, 0.02, None)
    assert told.records == []
    assert [(e.kind.value, e.partition) for e in told.events] == [("keys_revoked", 0)]
    await instance.acknowledge_events([told.events[0].event_id])
    rest = await _poll(instance, 0.02, None)
    assert [r.offset for r in rest.records] == [5, 6, 7, 8, 9]


async def test_a_record_of_a_generation_not_read_yet_ends_the_released_run() -> None:
    # Records 0-2 are of the current generation (1); record 3 was written under
    # generation 2, which this sidecar has not read: it is not released until the
    # sidecar has read it, though it lies where the log's current generation runs on.
    context = fakes.Context()
    context.registry = fakes.Registry(fakes.runtime("t", fakes.expanded_log(0)))
    instance = await _subscribed(context)
    await _assign(context, instance, TP0)
    written_under = [b"1", b"1", b"1", b"2"]
    context.consumer.next_fetch = {
        TP0: [
            fakes.Record("t", 0, offset, headers=[(GENERATION_HEADER, generation)])
            for offset, generation in enumerate(written_under)
        ]
    }
    result = await _poll(instance, 0.03, None)
    assert [r.offset for r in result.records] == [0, 1, 2]
    assert context.registry.refreshed >= 1
    assert [r.offset for r in instance.partitions[TP0].buffer] == [3]


async def test_a_record_of_generation_1_ends_a_released_run_of_generation_0() -> None:
    # The same at generation 0, which a run of the current generation once could not
    # tell from a run that ends before the log does: record 2, written under
    # generation 1, went out with the run, unjudged.
    context = fakes.Context()
    context.registry = fakes.Registry(fakes.runtime("t", GenerationLog.start(1)))
    instance = await _subscribed(context)
    await _assign(context, instance, TP0)
    written_under = [b"0", b"0", b"1"]
    context.consumer.next_fetch = {
        TP0: [
            fakes.Record("t", 0, offset, headers=[(GENERATION_HEADER, generation)])
            for offset, generation in enumerate(written_under)
        ]
    }
    result = await _poll(instance, 0.03, None)
    assert [r.offset for r in result.records] == [0, 1]
    assert context.registry.refreshed >= 1
    assert [r.offset for r in instance.partitions[TP0].buffer] == [2]


async def test_a_released_run_ends_where_the_next_generation_begins() -> None:
    # Generation 2 shrinks the topic back to one partition at partition 0's offset 8:
    # records 8 and on wait for the group to drain partition 1, however the run that
    # reached them was decided.
    context = fakes.Context()
    expanded = fakes.expanded_log(0)
    shrunk = expanded.append(expanded.next_generation(1, [Boundary(8), Boundary(3)]))
    context.registry = fakes.Registry(fakes.runtime("t", shrunk))
    context.offsets.committed[("g", "t")] = {0: 0, 1: 0}
    instance = await _subscribed(context)
    await _assign(context, instance, TP0)
    context.consumer.next_fetch = {TP0: fakes.records("t", 0, 0, 11)}
    result = await _poll(instance, 0.03, None)
    assert [r.offset for r in result.records] == list(range(8))
    assert [r.offset for r in instance.partitions[TP0].buffer] == [8, 9, 10, 11]


async def test_auto_commit_stops_below_an_unacknowledged_revocation() -> None:
    context = fakes.Context()
    context.registry = fakes.Registry(fakes.runtime("t", fakes.expanded_log(2)))
    instance = await _subscribed(context, auto_commit=True)
    await _assign(context, instance, TP0)
    context.consumer.next_fetch = {TP0: fakes.records("t", 0, 0, 1)}
    await _poll(instance, 0.05, None)
    await instance.offsets.auto_commit(force=True)
    assert context.consumer.commits == [{TP0: 1}]


async def test_a_revoked_partition_is_committed_and_forgotten() -> None:
    context = fakes.Context()
    instance = await _subscribed(context, auto_commit=True)
    await _assign(context, instance, TP0)
    context.consumer.next_fetch = {TP0: fakes.records("t", 0, 0, 2)}
    await _poll(instance, 0.05, None)
    await instance.partitions_revoked({TP0})
    assert context.consumer.commits[-1] == {TP0: 3}
    assert TP0 not in instance.partitions


async def test_records_wait_for_their_partitions_assigned_notice() -> None:
    context = fakes.Context()
    instance = await _subscribed(context, assignment_events=True)
    context.consumer.assigned = {TP0}
    context.consumer.next_fetch = {TP0: fakes.records("t", 0, 0, 0)}
    before = await _poll(instance, 0.03, None)
    assert before.records == []
    assert before.notices == []
    await instance.partitions_assigned({TP0})
    after = await _poll(instance, 0.03, None)
    assert after.notices == [AssignmentNotice(AssignmentChange.PARTITIONS_ASSIGNED, (TP0,))]
    assert [r.offset for r in after.records] == [0]


async def test_seeks_need_an_assigned_partition_and_restart_its_buffer() -> None:
    context = fakes.Context()
    instance = await _subscribed(context)
    await _assign(context, instance, TP0)
    context.consumer.next_fetch = {TP0: fakes.records("t", 0, 0, 4)}
    await _poll(instance, 0.05, 2)
    with pytest.raises(BadRequest):
        await instance.seek({TP1: 0})
    await instance.seek({TP0: 10})
    assert context.consumer.positions[TP0] == 10
    assert instance.partitions[TP0].delivered == 10
    assert not instance.partitions[TP0].buffer


async def test_subscribe_and_manual_assignment_exclude_each_other() -> None:
    context = fakes.Context()
    instance = await _subscribed(context)
    with pytest.raises(ConsumerStateConflict):
        await instance.assign_manually([TP0])
    await instance.unsubscribe()
    assert context.consumer.stopped
    await instance.assign_manually([TP0])
    with pytest.raises(ConsumerStateConflict):
        await instance.subscribe(["t"], None)


async def test_a_rebalance_is_asked_only_of_subscribers_of_the_topic() -> None:
    context = fakes.Context()
    instance = await _subscribed(context)
    assert not instance.rebalance_if_subscribed(["other"])
    assert instance.rebalance_if_subscribed(["t"])
    assert context.consumer.rejoins == 1


async def test_a_partition_without_a_commit_of_a_group_reading_the_topic_begins_at_its_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Partition 1 came with an expansion after the group committed in partition 0:
    "latest" would begin it at its end and skip what was written before this rebalance
    (``sidecar.core.reading_start``). It begins at its log start; partition 0 at the
    group's commit, as aiokafka places it."""
    context = fakes.Context()
    context.registry = fakes.Registry(fakes.runtime("t", fakes.expanded_log(5)))
    context.offsets.committed[("g", "t")] = {0: 5}

    async def log_starts(topic: str, count: int) -> list[int]:
        return [3, 7][:count]

    monkeypatch.setattr(context.offsets, "log_start_offsets", log_starts)
    instance = await _subscribed(context)
    await _assign(context, instance, TP0, TP1)
    assert context.consumer.positions == {TP1: 7}
    assert instance.partitions[TP1].fetched == 7


async def test_a_group_new_to_the_topic_or_reading_from_earliest_is_placed_by_the_setting() -> None:
    context = fakes.Context()
    context.registry = fakes.Registry(fakes.runtime("t", fakes.expanded_log(5)))
    instance = await _subscribed(context)
    await _assign(context, instance, TP0, TP1)  # no commit of the group in the topic
    assert context.consumer.positions == {}

    context.offsets.committed[("g", "t")] = {0: 5}
    config = InstanceConfig(group="g", name="e", format="binary", auto_offset_reset="earliest")
    earliest = ConsumerInstance(config, context.build(), instance_key="s-e")
    await earliest.subscribe(["t"], None)
    await _assign(context, earliest, TP0, TP1)
    assert context.consumer.positions == {}


async def test_an_unmanaged_topic_is_placed_by_the_setting() -> None:
    context = fakes.Context()
    context.offsets.committed[("g", "t")] = {0: 5}
    instance = await _subscribed(context)
    await _assign(context, instance, TP0, TP1)
    assert context.consumer.positions == {}


async def test_commits_that_cannot_be_read_leave_the_placement_to_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    context = fakes.Context()
    context.registry = fakes.Registry(fakes.runtime("t", fakes.expanded_log(5)))

    async def away(group: str, topic: str, count: int) -> dict[int, int]:
        raise KafkaUnavailable("coordinator away")

    monkeypatch.setattr(context.offsets, "committed_offsets", away)
    instance = await _subscribed(context)
    await _assign(context, instance, TP0, TP1)  # logged; the rebalance goes on
    assert context.consumer.positions == {}
    assert instance.partitions[TP1] is not None


async def test_commits_that_do_not_come_within_the_bound_leave_the_placement_to_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The group's whole rebalance waits for the listener: a coordinator that does not
    answer holds it no longer than ``consumer.reading_start_wait_s``."""
    context = fakes.Context()
    context.settings = ConsumerSettings(reading_start_wait_s=0.05)
    context.registry = fakes.Registry(fakes.runtime("t", fakes.expanded_log(5)))

    async def silent(group: str, topic: str, count: int) -> dict[int, int]:
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    monkeypatch.setattr(context.offsets, "committed_offsets", silent)
    instance = await _subscribed(context)
    await asyncio.wait_for(_assign(context, instance, TP0, TP1), 5)
    assert context.consumer.positions == {}
