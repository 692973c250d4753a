"""Assignment notices: telling an app of its instance's rebalances.

Only for instances created with ``assignment_events``: a partitions_revoked /
partitions_assigned notice, by callback, or queued for the next records response in
the instance's ``ConsumeState`` (``NoticeQueue``; the instance queues it, under its
delivery lock). Unlike key hand-off, nothing waits for the app to act on it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sidecar.adapters.callbacks import CallbackClient
from sidecar.core.consume import TopicPartition
from sidecar.core.handoff import AssignmentCallback, AssignmentChange, AssignmentNotice
from sidecar.service.consume_state import ConsumeState

_log = logging.getLogger(__name__)


class AssignmentNotices:
    def __init__(self, state: ConsumeState, callbacks: CallbackClient | None) -> None:
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

    async def _call_back(self, notice: AssignmentNotice) -> None:
        # Bounded by the callback timeout and then given up (counted, logged): a
        # rebalance listener that never returns would get the member evicted.
        assert self.callbacks is not None
        message = AssignmentCallback(self.state.group, self.state.instance_id, notice)
        failure = await self.callbacks.post(message, within_s=self.callbacks.timeout_s)
        if failure is not None:
            _log.warning("%s callback gave up: %s", notice.kind.value, failure)
