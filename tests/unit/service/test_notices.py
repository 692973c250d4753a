"""AssignmentNotices in events mode: what an app reads of its rebalances, and when.

The notices are queued in the instance's ``ConsumeState`` (``NoticeQueue``), by the
instance's rebalance listener as ``_Listener`` does here."""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.core.consume import TopicPartition
from sidecar.core.handoff import AssignmentChange, AssignmentNotice
from sidecar.service.consume_state import ConsumeState
from sidecar.service.notices import AssignmentNotices

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


class _Listener:
    """The notices of one instance, told as its rebalance listener tells them
    (``ConsumerInstance.partitions_revoked`` and ``partitions_assigned``), with the
    queue's own calls for a response."""

    def __init__(self, *, enabled: bool) -> None:
        self.state = ConsumeState("g", "i", assignment_events=enabled)
        self.telling = AssignmentNotices(self.state, None)
        queue = self.state.notices
        self.must_tell_assigned, self.take = queue.must_tell_assigned, queue.take
        self.put_back, self.forget = queue.put_back, queue.forget

    async def tell_revoked(self, partitions: Sequence[TopicPartition]) -> None:
        notice = await self.telling.tell_revoked(partitions)
        if notice is not None:
            self.state.notices.queue(notice)

    async def tell_assigned(self, partitions: Sequence[TopicPartition]) -> None:
        if self.state.notices.enabled:
            notice = await self.telling.tell_assigned(partitions)
            if notice is not None:
                self.state.notices.queue(notice)
            self.state.notices.told_assigned(partitions)


def _notices(*, enabled: bool = True) -> _Listener:
    return _Listener(enabled=enabled)


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
