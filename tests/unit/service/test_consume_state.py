"""``sidecar.service.consume_state``: what one consumer instance's components share
(``ConsumeState``) and its queue of assignment notices (``NoticeQueue``), on their own
(``test_notices.py`` tells the notices as the rebalance listener does)."""

from __future__ import annotations

from typing import cast

import pytest

from sidecar.adapters.group_consumer import GroupConsumer
from sidecar.core.consume import TopicPartition
from sidecar.core.errors import ConsumerStateConflict
from sidecar.core.handoff import AssignmentChange, AssignmentNotice
from sidecar.service.consume_state import ConsumeState, NoticeQueue

A, B, C = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)


def assigned(*partitions: TopicPartition) -> AssignmentNotice:
    return AssignmentNotice(AssignmentChange.PARTITIONS_ASSIGNED, partitions)


def revoked(*partitions: TopicPartition) -> AssignmentNotice:
    return AssignmentNotice(AssignmentChange.PARTITIONS_REVOKED, partitions)


# NoticeQueue -------------------------------------------------------------------------------


def test_an_instance_that_did_not_ask_for_notices_never_waits_for_one() -> None:
    queue = NoticeQueue(enabled=False)
    assert not queue.must_tell_assigned(A, manual=False)
    assert not queue.must_tell_assigned(A, manual=True)


def test_a_partition_waits_for_its_notice_until_it_is_told() -> None:
    queue = NoticeQueue(enabled=True)
    assert queue.must_tell_assigned(A, manual=False)
    queue.told_assigned([A])
    assert not queue.must_tell_assigned(A, manual=False)
    assert queue.must_tell_assigned(B, manual=False)


def test_a_partition_assigned_by_hand_has_no_notice_to_wait_for() -> None:
    assert not NoticeQueue(enabled=True).must_tell_assigned(A, manual=True)


def test_notices_are_taken_once_in_the_order_queued() -> None:
    queue = NoticeQueue(enabled=True)
    queue.queue(assigned(A, B))
    queue.queue(revoked(A))
    assert queue.take() == [assigned(A, B), revoked(A)]
    assert queue.take() == []


def test_notices_put_back_come_before_those_queued_since() -> None:
    queue = NoticeQueue(enabled=True)
    queue.queue(assigned(A))
    queue.queue(revoked(B))
    taken = queue.take()
    queue.queue(assigned(C))
    queue.put_back(taken)
    assert queue.take() == [assigned(A), revoked(B), assigned(C)]


def test_forgetting_some_partitions_makes_only_those_wait_again() -> None:
    queue = NoticeQueue(enabled=True)
    queue.told_assigned([A, B, C])
    queue.forget([B, TopicPartition("never", 9)])
    assert queue.must_tell_assigned(B, manual=False)
    assert not queue.must_tell_assigned(A, manual=False)
    assert not queue.must_tell_assigned(C, manual=False)


def test_forgetting_every_partition_makes_all_wait_again_and_keeps_the_queue() -> None:
    queue = NoticeQueue(enabled=True)
    queue.told_assigned([A, C])
    queue.queue(assigned(A, C))
    queue.forget()
    assert queue.must_tell_assigned(A, manual=False)
    assert queue.must_tell_assigned(C, manual=False)
    assert queue.take() == [assigned(A, C)]


# ConsumeState ------------------------------------------------------------------------------


def test_a_new_state_has_no_consumer_and_stands_nowhere() -> None:
    state = ConsumeState("billing", "c1")
    assert (state.group, state.instance_id) == ("billing", "c1")
    assert state.consumer is None
    assert state.manual == []
    assert state.revoking == set()
    assert not state.fenced
    assert not state.notices.enabled


def test_assignment_events_turn_the_notice_queue_on() -> None:
    state = ConsumeState("g", "i", assignment_events=True)
    assert state.notices.enabled
    assert state.notices.must_tell_assigned(A, manual=False)


def test_a_call_that_needs_the_consumer_is_refused_before_subscribing() -> None:
    state = ConsumeState("g", "i")
    with pytest.raises(ConsumerStateConflict, match="neither subscribed nor assigned"):
        state.require_consumer()


def test_the_consumer_is_given_once_the_instance_has_one() -> None:
    state = ConsumeState("g", "i")
    consumer = cast(GroupConsumer, object())
    state.consumer = consumer
    assert state.require_consumer() is consumer


def test_a_fence_holds_until_the_next_assignment() -> None:
    state = ConsumeState("g", "i")
    state.fence()
    assert state.fenced
    state.fence()
    assert state.fenced
    state.unfence()
    assert not state.fenced


def test_a_stall_not_reported_yet_fences_while_it_lasts() -> None:
    stalled = [True]
    state = ConsumeState("g", "i", stalled=lambda: stalled[0])
    assert state.fenced
    state.unfence()  # the next assignment does not end a stall still going on
    assert state.fenced
    stalled[0] = False
    assert not state.fenced


def test_the_states_of_two_instances_are_their_own() -> None:
    first, second = ConsumeState("g", "a"), ConsumeState("g", "b")
    first.revoking.add(A)
    first.manual.append(B)
    first.fence()
    assert second.revoking == set()
    assert second.manual == []
    assert not second.fenced
    assert first.positions is not second.positions
    assert first.ledger is not second.ledger
