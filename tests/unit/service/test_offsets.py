"""One consumer instance's commits (``sidecar.service.offsets``), over fakes of Kafka,
ZooKeeper and the metrics, with the real positions model and generation log.

In the ordered topic used here, partition 0 was expanded to two at offset 5: keys of
partition 0 move to partition 1 there (revocation (0, 1) at boundary 5), so a commit of
partition 0 that reaches 5 needs the app's keys_revoked acknowledgement first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

import sidecar.service.offsets as offsets_module
from sidecar.config import ConsumerSettings
from sidecar.core.consume import ConsumedRecord, TopicPartition
from sidecar.core.errors import (
    BadRequest,
    CallbackFailed,
    ConsumerStateConflict,
    KafkaUnavailable,
    MetadataUnavailable,
    SidecarError,
)
from sidecar.core.handoff import (
    HandoffCallback,
    HandoffEvent,
    HandoffKind,
    Revocation,
    Subject,
)
from sidecar.core.positions import Fetch
from sidecar.service.consume_state import ConsumeState
from sidecar.service.handoff import HandoffTeller
from sidecar.service.offsets import Offsets
from tests.unit.service import fakes

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
BOUNDARY = 5
"""Where keys of partition 0 move to partition 1 (generation 1)."""


@dataclass
class _Kafka(fakes.GroupConsumer):
    """The group consumer, whose commits can fail, or be overtaken by a rebalance."""

    failure: SidecarError | None = None
    during_commit: Callable[[], object] | None = None

    async def commit(
        self, offsets: Mapping[TopicPartition, int], epochs: Mapping[TopicPartition, int | None]
    ) -> None:
        if self.during_commit is not None:
            self.during_commit()
        if self.failure is not None:
            raise self.failure
        await super().commit(offsets, epochs)


class _Callbacks:
    """The app's hand-off callback URL: answers 2xx, or fails with ``failure``."""

    timeout_s = 0.1

    def __init__(self, failure: str | None = None) -> None:
        self.failure = failure
        self.messages: list[HandoffCallback] = []

    async def post(
        self,
        message: HandoffCallback,
        *,
        within_s: float,
        still_needed: Callable[[], Any] | None = None,
    ) -> str | None:
        if still_needed is not None and not await still_needed():
            return None
        self.messages.append(message)
        return self.failure


class _AwayStore(fakes.Store):
    """ZooKeeper's records while its session is suspended."""

    async def waits(self, group: str, topic: str) -> dict[int, int]:
        raise MetadataUnavailable()


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


def _ordered(*, ordered: bool = True) -> fakes.Context:
    context = fakes.Context(consumer=_Kafka())
    context.registry = fakes.Registry(
        fakes.runtime("t", fakes.expanded_log(BOUNDARY), ordered=ordered)
    )
    return context


def _unmanaged() -> fakes.Context:
    return fakes.Context(consumer=_Kafka())


def _offsets(
    context: fakes.Context,
    assigned: tuple[TopicPartition, ...] = (TP0,),
    *,
    callbacks: _Callbacks | None = None,
) -> Offsets:
    """The instance's commit path, with ``assigned`` given to it by the group."""
    store: Any = context.store
    client: Any = callbacks
    consumer: Any = context.consumer
    state = ConsumeState("g", "i")
    state.consumer = consumer
    state.positions.follow(assigned, 1)
    return Offsets(
        state,
        context.build(),
        HandoffTeller(state, store, client),
        callbacks=callbacks is not None,
    )


def _fetch(
    offsets: Offsets, tp: TopicPartition, first: int, last: int, *, position: int | None = None
) -> None:
    """The consumer fetched records ``first``..``last``; its position after them is
    ``position`` (past transaction markers) if given."""
    batch: list[ConsumedRecord] = list(fakes.records(tp.topic, tp.partition, first, last))
    after = last + 1 if position is None else position
    offsets.positions.take(Fetch(1, offsets.positions.seek_epoch, {tp: batch}, {tp: after}))


def _send(offsets: Offsets, tp: TopicPartition, count: int) -> None:
    """The next ``count`` buffered records of ``tp`` reached the app."""
    for _ in range(count):
        offsets.positions.release(tp)
    offsets.positions.sent()


def _deliver(
    offsets: Offsets, tp: TopicPartition, first: int, last: int, *, position: int | None = None
) -> None:
    _fetch(offsets, tp, first, last, position=position)
    _send(offsets, tp, last - first + 1)


def _pending(offsets: Offsets) -> list[tuple[HandoffKind, Subject]]:
    return [(e.kind, e.subject) for e in offsets.state.ledger.pending.values()]


def _only_event(offsets: Offsets) -> HandoffEvent:
    (event,) = offsets.state.ledger.pending.values()
    return event


REVOKED_0 = (HandoffKind.KEYS_REVOKED, Subject("t", 0, 1))


# The app's commits -----------------------------------------------------------------------


async def test_a_commit_of_everything_delivered_reaches_kafka_and_is_recorded() -> None:
    context = _unmanaged()
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 2)
    await offsets.commit(None)
    assert context.consumer.commits == [{TP0: 3}]
    assert offsets.positions[TP0].committed == 3
    assert context.metrics.commits == 1
    assert context.audit.events == [
        {
            "type": "committed",
            "group": "g",
            "instance": "i",
            "topic": "t",
            "partition": 0,
            "offset": 3,
        }
    ]


async def test_a_commit_naming_the_last_record_covers_the_markers_after_it() -> None:
    # Records 0-2 were sent; 3 and 4 are transaction markers the app never sees.
    context = _unmanaged()
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 2, position=5)
    assert offsets.positions[TP0].delivered == 5
    # Below the last record sent, the app's offset is taken as it is.
    await offsets.commit({TP0: 2})
    # At it, the commit covers the markers up to the delivered position.
    await offsets.commit({TP0: 3})
    assert context.consumer.commits == [{TP0: 2}, {TP0: 5}]
    assert offsets.positions[TP0].committed == 5


async def test_a_commit_beyond_the_delivered_position_is_refused() -> None:
    context = _unmanaged()
    offsets = _offsets(context, (TP0, TP1))
    _deliver(offsets, TP0, 0, 2)
    beyond = r"^offset 7 of t\[0\] is beyond the delivered position 3$"
    with pytest.raises(BadRequest, match=beyond):
        await offsets.commit({TP0: 7})
    # Partition 1 is assigned but nothing of it was delivered yet.
    with pytest.raises(BadRequest, match=r"beyond the delivered position none$"):
        await offsets.commit({TP1: 0})
    assert context.consumer.commits == []
    assert offsets.positions[TP0].committed is None


async def test_a_partition_not_assigned_fails_the_whole_commit() -> None:
    context = _unmanaged()
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 2)
    with pytest.raises(BadRequest, match=r"^t\[1\] is not assigned to this instance$"):
        await offsets.commit({TP0: 3, TP1: 0})
    # Partition 0's valid offset was not committed either.
    assert context.consumer.commits == []
    assert offsets.positions[TP0].committed is None


async def test_nothing_reaches_kafka_when_nothing_was_delivered() -> None:
    context = _unmanaged()
    offsets = _offsets(context, (TP0, TP1))
    _fetch(offsets, TP1, 0, 2)  # buffered, not sent: delivered stays at the buffer's head
    await offsets.commit(None)
    await offsets.commit({})
    assert context.consumer.commits == [{TP1: 0}]
    # The partition without a delivered position was left out, not committed at 0.
    assert offsets.positions[TP0].committed is None


# Revocation boundaries -------------------------------------------------------------------


async def test_a_commit_below_a_revocation_boundary_goes_through() -> None:
    context = _ordered()
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 7)
    await offsets.commit({TP0: BOUNDARY - 1})
    assert context.consumer.commits == [{TP0: 4}]
    assert offsets.positions[TP0].committed == 4
    assert _pending(offsets) == []  # the app was not asked for anything


async def test_a_commit_past_an_unacknowledged_boundary_is_refused() -> None:
    context = _ordered()
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 7)
    with pytest.raises(ConsumerStateConflict) as refused:
        await offsets.commit(None)
    assert refused.value.message == (
        "acknowledge event 1 (keys_revoked for t[0]) before committing past offset 5; "
        "it is in the next records response"
    )
    assert context.consumer.commits == []
    assert offsets.positions[TP0].committed is None
    assert context.audit.events == []
    assert context.metrics.commits == 0
    # The event the app is told to acknowledge is pending for its next poll.
    assert _pending(offsets) == [REVOKED_0]
    assert _only_event(offsets).event_id == 1


async def test_a_commit_reaching_the_boundary_exactly_needs_the_acknowledgement() -> None:
    # Committing 5 says every record of the old generation below 5 is done: that is
    # what opens the gate of partition 1.
    context = _ordered()
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 7)
    with pytest.raises(ConsumerStateConflict, match="acknowledge event 1"):
        await offsets.commit({TP0: BOUNDARY})
    assert context.consumer.commits == []


async def test_once_the_app_acknowledges_keys_revoked_the_commit_goes_through() -> None:
    context = _ordered()
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 7)
    with pytest.raises(ConsumerStateConflict):
        await offsets.commit(None)
    await offsets.teller.acknowledge_events([_only_event(offsets).event_id])
    await offsets.commit(None)
    assert context.consumer.commits == [{TP0: 8}]
    assert offsets.positions[TP0].committed == 8
    # The acknowledgement is the group's: recorded in ZooKeeper for other instances.
    assert context.store.acknowledged == [("g", "t", 0, 1)]


async def test_a_revocation_the_group_acknowledged_elsewhere_lets_the_commit_through() -> None:
    # The partition's previous owner got keys_revoked acknowledged; once this instance
    # has read the group's acknowledgements, it does not ask its own app again.
    context = _ordered()
    context.store.acknowledged.append(("g", "t", 0, 1))
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 7)
    await offsets.teller.read_group("t")
    await offsets.commit(None)
    assert context.consumer.commits == [{TP0: 8}]
    assert _pending(offsets) == []


async def test_a_boundary_below_the_groups_committed_offset_is_not_crossed_again() -> None:
    # This instance has not committed partition 0 yet: the group's committed offset in
    # Kafka (6, past the boundary) is where its commit starts from.
    context = _ordered()
    context.offsets.committed[("g", "t")] = {0: 6}
    offsets = _offsets(context)
    _deliver(offsets, TP0, 6, 7)
    await offsets.commit(None)
    assert context.consumer.commits == [{TP0: 8}]
    assert _pending(offsets) == []
    assert context.offsets.reads == 1


async def test_without_a_group_offset_a_commit_starts_from_the_beginning() -> None:
    # Nothing committed in Kafka either: the boundary lies between 0 and the commit.
    context = _ordered()
    offsets = _offsets(context)
    _deliver(offsets, TP0, 6, 7)
    with pytest.raises(ConsumerStateConflict):
        await offsets.commit(None)
    assert context.consumer.commits == []


async def test_a_refused_partition_holds_back_the_whole_commit() -> None:
    # Partition 1 has no revocation and comes first; partition 0 is refused.
    context = _ordered()
    offsets = _offsets(context, (TP0, TP1))
    _deliver(offsets, TP1, 0, 2)
    _deliver(offsets, TP0, 0, 7)
    with pytest.raises(ConsumerStateConflict):
        await offsets.commit({TP1: 3, TP0: 8})
    assert context.consumer.commits == []
    assert offsets.positions[TP1].committed is None


@pytest.mark.parametrize(
    "context_of",
    [lambda: _ordered(ordered=False), _unmanaged],
    ids=["unordered-topic", "unmanaged-topic"],
)
async def test_topics_without_ordered_delivery_commit_past_boundaries_freely(
    context_of: Callable[[], fakes.Context],
) -> None:
    context = context_of()
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 7)
    await offsets.commit(None)
    assert context.consumer.commits == [{TP0: 8}]
    assert _pending(offsets) == []


async def test_a_commit_in_callback_mode_calls_the_app_before_crossing() -> None:
    context = _ordered()
    callbacks = _Callbacks()
    offsets = _offsets(context, callbacks=callbacks)
    _deliver(offsets, TP0, 0, 7)
    await offsets.commit(None)
    assert [(m.kind, m.subject) for m in callbacks.messages] == [REVOKED_0]
    assert context.consumer.commits == [{TP0: 8}]
    assert context.store.acknowledged == [("g", "t", 0, 1)]


async def test_a_failed_keys_revoked_callback_fails_the_commit() -> None:
    context = _ordered()
    offsets = _offsets(context, callbacks=_Callbacks(failure="HTTP 503"))
    _deliver(offsets, TP0, 0, 7)
    with pytest.raises(CallbackFailed, match="keys_revoked callback for t\\[0\\] failed: HTTP 503"):
        await offsets.commit(None)
    assert context.consumer.commits == []
    assert offsets.positions[TP0].committed is None


# When Kafka does not take the commit ---------------------------------------------------


async def test_a_commit_kafka_fails_is_not_recorded() -> None:
    context = _unmanaged()
    kafka = _Kafka(failure=KafkaUnavailable("the group coordinator moved"))
    context.consumer = kafka
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 2)
    with pytest.raises(KafkaUnavailable, match="the group coordinator moved"):
        await offsets.commit(None)
    assert kafka.group_committed == {}
    assert offsets.positions[TP0].committed is None
    assert context.audit.events == []
    assert context.metrics.commits == 0
    # Once Kafka takes it again, the same commit goes through.
    kafka.failure = None
    await offsets.commit(None)
    assert kafka.group_committed == {TP0: 3}
    assert offsets.positions[TP0].committed == 3


async def test_a_rebalance_during_the_commit_leaves_the_new_reading_alone() -> None:
    # While Kafka takes the commit, a rebalance gives partition 0 back in a new
    # assignment: the new reading starts from Kafka's offsets, not from the old state.
    context = _unmanaged()
    kafka = _Kafka()
    context.consumer = kafka
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 2)
    kafka.during_commit = lambda: offsets.positions.follow([TP0], 2)
    await offsets.commit(None)
    assert kafka.commits == [{TP0: 3}]
    assert offsets.positions[TP0].incarnation == 2
    assert offsets.positions[TP0].committed is None
    assert [e["offset"] for e in context.audit.events] == [3]


# Reading the group's offsets -------------------------------------------------------------


async def test_committed_reads_the_groups_offsets_and_leaves_out_partitions_without_one() -> None:
    context = _unmanaged()
    context.consumer.group_committed = {TP0: 7}
    offsets = _offsets(context)
    assert await offsets.committed([TP0, TP1]) == {TP0: 7}
    assert await offsets.committed([]) == {}


# Auto-commit -----------------------------------------------------------------------------


async def test_auto_commit_commits_once_per_interval_unless_forced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock(100.0)
    monkeypatch.setattr(offsets_module, "time", clock)
    context = _unmanaged()
    context.settings = ConsumerSettings(auto_commit_interval_s=5.0)
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 2)
    clock.now = 104.9
    await offsets.auto_commit(force=False)
    assert context.consumer.commits == []
    clock.now = 105.0
    await offsets.auto_commit(force=False)
    assert context.consumer.commits == [{TP0: 3}]
    # The interval starts again from that commit; a forced one does not wait for it.
    _deliver(offsets, TP0, 3, 4)
    await offsets.auto_commit(force=False)
    assert context.consumer.commits == [{TP0: 3}]
    await offsets.auto_commit(force=True)
    assert context.consumer.commits == [{TP0: 3}, {TP0: 5}]


async def test_auto_commit_leaves_committed_and_undelivered_partitions_alone() -> None:
    context = _unmanaged()
    offsets = _offsets(context, (TP0, TP1))
    _deliver(offsets, TP0, 0, 2)
    await offsets.commit(None)
    await offsets.auto_commit(force=True)
    assert context.consumer.commits == [{TP0: 3}]


async def test_auto_commit_stops_below_an_unacknowledged_boundary_and_tells_the_app() -> None:
    context = _ordered()
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 7)
    await offsets.auto_commit(force=True)
    assert context.consumer.commits == [{TP0: BOUNDARY - 1}]
    assert offsets.positions[TP0].committed == 4
    assert _pending(offsets) == [REVOKED_0]
    # Acknowledged, the next auto-commit covers everything delivered.
    await offsets.teller.acknowledge_events([_only_event(offsets).event_id])
    await offsets.auto_commit(force=True)
    assert context.consumer.commits == [{TP0: 4}, {TP0: 8}]


async def test_auto_commit_in_callback_mode_calls_the_app_and_commits_everything() -> None:
    context = _ordered()
    callbacks = _Callbacks()
    offsets = _offsets(context, callbacks=callbacks)
    _deliver(offsets, TP0, 0, 7)
    await offsets.auto_commit(force=True)
    assert [(m.kind, m.subject) for m in callbacks.messages] == [REVOKED_0]
    assert context.consumer.commits == [{TP0: 8}]


async def test_a_failed_auto_commit_is_deferred_not_raised() -> None:
    context = _unmanaged()
    kafka = _Kafka(failure=KafkaUnavailable())
    context.consumer = kafka
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 2)
    await offsets.commit_quietly(force=True)
    assert kafka.group_committed == {}
    assert offsets.positions[TP0].committed is None
    kafka.failure = None
    await offsets.commit_quietly(force=True)
    assert kafka.group_committed == {TP0: 3}


async def test_a_failed_callback_defers_the_auto_commit() -> None:
    context = _ordered()
    offsets = _offsets(context, callbacks=_Callbacks(failure="timed out"))
    _deliver(offsets, TP0, 0, 7)
    await offsets.commit_quietly(force=True)
    assert context.consumer.commits == []


async def test_auto_commit_never_moves_the_groups_offset_back() -> None:
    # The group had caught up and committed partition 0 at 5 before the change that
    # put the boundary there committed; a rebalance gave the partition to this instance
    # before the app acknowledged keys_revoked. Its records from 5 on are held.
    context = _ordered()
    context.offsets.committed[("g", "t")] = {0: BOUNDARY}
    context.consumer.group_committed[TP0] = BOUNDARY
    offsets = _offsets(context)
    _fetch(offsets, TP0, 5, 7)
    assert offsets.positions[TP0].delivered == BOUNDARY
    await offsets.auto_commit(force=True)
    assert context.consumer.group_committed[TP0] == BOUNDARY
    assert context.consumer.commits == []


async def test_auto_commit_of_an_unordered_topic_commits_past_boundaries() -> None:
    context = _ordered(ordered=False)
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 7)
    await offsets.auto_commit(force=True)
    assert context.consumer.commits == [{TP0: 8}]
    assert _pending(offsets) == []


# Helping waiters -------------------------------------------------------------------------


async def test_a_waiter_past_the_committed_position_gets_a_commit_at_once() -> None:
    # Partition 1's gate waits for partition 0 to be committed to 5; this instance has
    # delivered 0-2 and commits them now rather than at its next interval.
    context = _ordered()
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 2)
    await offsets.help_waiters()
    assert context.consumer.commits == []
    await context.store.add_wait("g", "t", 0, BOUNDARY, "other")
    await offsets.help_waiters()
    assert context.consumer.commits == [{TP0: 3}]
    # Committed as far as it can help: no further commit.
    await offsets.help_waiters()
    assert context.consumer.commits == [{TP0: 3}]


async def test_waits_that_cannot_be_read_are_left_for_later() -> None:
    context = _ordered()
    context.store = _AwayStore()
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 2)
    await offsets.help_waiters()
    assert context.consumer.commits == []


# Before a rebalance takes the partitions -------------------------------------------------


async def _before_revoke(offsets: Offsets, partitions: list[TopicPartition]) -> None:
    """What the instance's rebalance listener does before the partitions go (the
    final commit apart): tell what a commit needs, wait for the acknowledgements."""
    await offsets.tell_before_revoke(partitions)
    settings = offsets.context.settings
    await offsets.teller.record_before_revoke(
        partitions,
        wait_s=settings.revoke_ack_wait_s,
        retry_s=settings.callback_retry_s,
        poll_s=settings.revoke_ack_poll_s,
    )


async def test_a_rebalance_waits_for_the_app_to_acknowledge_keys_revoked() -> None:
    context = _ordered()
    context.settings = ConsumerSettings(revoke_ack_wait_s=30.0, revoke_ack_poll_s=0.01)
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 7)
    settling = asyncio.create_task(_before_revoke(offsets, [TP0]))
    await asyncio.sleep(0.05)
    assert not settling.done()
    # The app finds the event in its next poll and acknowledges it.
    assert _pending(offsets) == [REVOKED_0]
    await offsets.teller.acknowledge_events([_only_event(offsets).event_id])
    await asyncio.wait_for(settling, 5)
    await offsets.auto_commit(force=True)
    assert context.consumer.commits == [{TP0: 8}]


async def test_a_rebalance_stops_waiting_for_keys_revoked_after_revoke_ack_wait_s() -> None:
    context = _ordered()
    context.settings = ConsumerSettings(revoke_ack_wait_s=0.2, revoke_ack_poll_s=0.01)
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 7)
    began = time.monotonic()
    await asyncio.wait_for(_before_revoke(offsets, [TP0]), 5)
    assert time.monotonic() - began >= 0.2
    # The final commit then stops below the boundary.
    await offsets.auto_commit(force=True)
    assert context.consumer.commits == [{TP0: BOUNDARY - 1}]


async def test_a_rebalance_does_not_wait_when_nothing_needs_acknowledging() -> None:
    context = _ordered()
    context.settings = ConsumerSettings(revoke_ack_wait_s=30.0, revoke_ack_poll_s=0.01)
    offsets = _offsets(context, (TP0, TP1))
    _deliver(offsets, TP0, 0, 3)  # below the boundary
    _deliver(offsets, TP1, 0, 9)  # partition 1 gives no keys away
    await asyncio.wait_for(_before_revoke(offsets, [TP0, TP1]), 5)
    assert _pending(offsets) == []


async def test_a_rebalance_does_not_wait_for_a_boundary_the_group_committed_past() -> None:
    # The group committed partition 0 at the boundary before this instance got it: the
    # records it delivered since (5-7) cross nothing, so nothing needs acknowledging.
    context = _ordered()
    context.settings = ConsumerSettings(revoke_ack_wait_s=30.0, revoke_ack_poll_s=0.01)
    context.offsets.committed[("g", "t")] = {0: BOUNDARY}
    context.consumer.group_committed[TP0] = BOUNDARY
    offsets = _offsets(context)
    _deliver(offsets, TP0, 5, 7)
    await asyncio.wait_for(_before_revoke(offsets, [TP0]), 5)
    assert _pending(offsets) == []
    await offsets.auto_commit(force=True)
    assert context.consumer.commits == [{TP0: 8}]


async def test_a_rebalance_waits_for_keys_revoked_told_even_if_no_commit_crosses_it() -> None:
    # The group had committed partition 0 at the boundary before the change (its
    # consumers caught up while produces were held); this instance got it there and told
    # the app of the keys leaving at 5. The final commit crosses nothing, yet given away
    # unacknowledged, the partition's next owner would tell its own app too.
    context = _ordered()
    context.settings = ConsumerSettings(revoke_ack_wait_s=30.0, revoke_ack_poll_s=0.01)
    context.offsets.committed[("g", "t")] = {0: BOUNDARY}
    context.consumer.group_committed[TP0] = BOUNDARY
    offsets = _offsets(context)
    _fetch(offsets, TP0, BOUNDARY, BOUNDARY - 1)  # nothing after the boundary yet
    assert offsets.positions[TP0].delivered == BOUNDARY
    told = await offsets.teller.revocation_pending("t", Revocation(0, 1, BOUNDARY))
    assert told is not None
    settling = asyncio.create_task(_before_revoke(offsets, [TP0]))
    await asyncio.sleep(0.05)
    assert not settling.done()
    await offsets.teller.acknowledge_events([told.event_id])
    await asyncio.wait_for(settling, 5)
    assert context.store.acknowledged == [("g", "t", 0, 1)]


async def test_a_rebalance_does_not_wait_for_keys_revoked_of_partitions_it_keeps() -> None:
    context = _ordered()
    context.settings = ConsumerSettings(revoke_ack_wait_s=30.0, revoke_ack_poll_s=0.01)
    offsets = _offsets(context, (TP0, TP1))
    _deliver(offsets, TP0, 0, BOUNDARY - 1)
    assert await offsets.teller.revocation_pending("t", Revocation(0, 1, BOUNDARY)) is not None
    await asyncio.wait_for(_before_revoke(offsets, [TP1]), 5)


async def test_a_rebalance_of_an_instance_being_deleted_does_not_wait_for_its_app() -> None:
    context = _ordered()
    context.settings = ConsumerSettings(revoke_ack_wait_s=30.0, revoke_ack_poll_s=0.01)
    offsets = _offsets(context)
    _deliver(offsets, TP0, 0, 7)
    settling = asyncio.create_task(_before_revoke(offsets, [TP0]))
    await asyncio.sleep(0.05)
    assert not settling.done()
    await offsets.teller.close()
    await asyncio.wait_for(settling, 5)
    assert context.store.acknowledged == []
