"""AssignmentNotices in events mode: what an app reads of its rebalances, and when."""

from __future__ import annotations

import asyncio

from sidecar.core.consume import TopicPartition
from sidecar.core.handoff import AssignmentChange, AssignmentNotice
from sidecar.service.notices import AssignmentNotices

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def _notices(*, enabled: bool = True) -> AssignmentNotices:
    return AssignmentNotices(
        "g", "i", enabled=enabled, callbacks=None, delivery_lock=asyncio.Lock()
    )


async def test_records_of_a_partition_wait_for_its_assigned_notice() -> None:
    notices = _notices()
    assert notices.must_tell_assigned(A, manual=False)
    assert not notices.must_tell_assigned(A, manual=True)  # assigned by hand: no rebalance
    await notices.tell_assigned([A, B])
    assert not notices.must_tell_assigned(A, manual=False)
    assert notices.take() == [AssignmentNotice(AssignmentChange.PARTITIONS_ASSIGNED, (A, B))]
    assert notices.take() == []


async def test_a_revocation_needs_a_new_assigned_notice_and_is_queued_in_order() -> None:
    notices = _notices()
    await notices.tell_assigned([A, B])
    await notices.tell_revoked([A])
    assert notices.must_tell_assigned(A, manual=False)
    assert not notices.must_tell_assigned(B, manual=False)
    assert [n.kind for n in notices.take()] == [
        AssignmentChange.PARTITIONS_ASSIGNED,
        AssignmentChange.PARTITIONS_REVOKED,
    ]


async def test_notices_put_back_come_first_next_time() -> None:
    notices = _notices()
    await notices.tell_assigned([A])
    taken = notices.take()
    await notices.tell_revoked([A])
    notices.put_back(taken)  # the response carrying them never reached the app
    assert [n.kind for n in notices.take()] == [
        AssignmentChange.PARTITIONS_ASSIGNED,
        AssignmentChange.PARTITIONS_REVOKED,
    ]


async def test_forget_makes_partitions_wait_again() -> None:
    notices = _notices()
    await notices.tell_assigned([A, B])
    notices.forget([B])
    assert notices.must_tell_assigned(B, manual=False)
    assert not notices.must_tell_assigned(A, manual=False)
    notices.forget()
    assert notices.must_tell_assigned(A, manual=False)


async def test_an_instance_without_assignment_events_is_told_nothing() -> None:
    notices = _notices(enabled=False)
    assert not notices.must_tell_assigned(A, manual=False)
    await notices.tell_assigned([A])
    await notices.tell_revoked([A])
    assert notices.take() == []
