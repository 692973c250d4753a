"""Notices: telling an app of its instance's rebalances, and of truncations.

Rebalances only to instances created with ``assignment_events``: a partitions_revoked /
partitions_assigned notice, by callback, or queued for the next records response in
the instance's ``ConsumeState`` (``NoticeQueue``; the instance queues it, under its
delivery lock). A log cut below what the instance had read (``TruncationNotice``) is
told the same way to those instances and to every reader of a managed topic, whose
responses carry hand-off events already. Unlike key hand-off, nothing waits for the app
to act on either.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sidecar.core.consume import TopicPartition
from sidecar.core.handoff import (
    AssignmentCallback,
    AssignmentChange,
    AssignmentNotice,
    Notice,
    TruncationNotice,
)
from sidecar.service.consume_context import AppCallbacks
from sidecar.service.consume_state import ConsumeState

_log = logging.getLogger(__name__)


class AssignmentNotices:
    def __init__(self, state: ConsumeState, callbacks: AppCallbacks | None) -> None:
        self.state = state
        """The instance's shared state: its ``notices`` hold what is queued for a
        response and which partitions were told assigned."""
        self.callbacks = callbacks

    async def tell_revoked(self, partitions: Sequence[TopicPartition]) -> AssignmentNotice | None:
        """Before the revocation's final commit (as Java's ``onPartitionsRevoked``): a
        callback the app can commit from. Returns the notice to queue for the next
        response instead (the app has no callback URL); None if there is none to tell."""
        notices = self.state.notices
        notices.forget(partitions)
        if not notices.enabled or not partitions:
            return None
        notice = AssignmentNotice(AssignmentChange.PARTITIONS_REVOKED, tuple(partitions))
        if self.callbacks is None:
            return notice
        await self._call_back(notice)
        return None

    async def tell_assigned(self, partitions: Sequence[TopicPartition]) -> AssignmentNotice | None:
        """Before the first record of ``partitions`` is released, for an app that asked
        for notices (the instance then marks them told: ``NoticeQueue.told_assigned``).
        Returns the notice to queue for the next response instead of a callback; None
        if called back."""
        notice = AssignmentNotice(AssignmentChange.PARTITIONS_ASSIGNED, tuple(partitions))
        if self.callbacks is None:
            return notice
        await self._call_back(notice)
        return None

    async def tell_truncated(self, notice: TruncationNotice) -> TruncationNotice | None:
        """After the instance moved back to where the logs diverge, before it delivers
        what it reads from there. Returns the notice to queue for the next response
        instead of a callback; None if called back."""
        if self.callbacks is None:
            return notice
        await self._call_back(notice)
        return None

    async def _call_back(self, notice: Notice) -> None:
        # Bounded by the callback timeout and then given up (counted, logged): a
        # rebalance listener that never returns would get the member evicted.
        assert self.callbacks is not None
        message = AssignmentCallback(self.state.group, self.state.instance_id, notice)
        failure = await self.callbacks.post(message, within_s=self.callbacks.timeout_s)
        if failure is not None:
            _log.warning("%s callback gave up: %s", notice.kind.value, failure)
