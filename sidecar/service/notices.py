"""Assignment notices: telling an app of its instance's rebalances.

Only for instances created with ``assignment_events``: a partitions_revoked /
partitions_assigned notice, by callback or queued for the next records response.
Unlike key hand-off, nothing waits for the app to act on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from sidecar.adapters.callbacks import CallbackClient
from sidecar.core.consume import TopicPartition
from sidecar.core.handoff import AssignmentCallback, AssignmentChange, AssignmentNotice

_log = logging.getLogger(__name__)


class AssignmentNotices:
    def __init__(
        self,
        group: str,
        instance_id: str,
        *,
        enabled: bool,
        callbacks: CallbackClient | None,
        delivery_lock: asyncio.Lock,
    ) -> None:
        self.group = group
        self.instance_id = instance_id
        self.enabled = enabled
        self.callbacks = callbacks
        self._delivery_lock = delivery_lock
        self._queued: list[AssignmentNotice] = []
        self._told_assigned: set[TopicPartition] = set()
        """Subscribed partitions whose partitions_assigned notice the app has been given
        (queued or called back). Only these release records, so the notice always comes
        first, even when aiokafka fetches before its rebalance listener runs."""

    def must_tell_assigned(self, tp: TopicPartition, *, manual: bool) -> bool:
        """True while ``tp``'s records must wait for its partitions_assigned notice."""
        return self.enabled and not manual and tp not in self._told_assigned

    def take(self) -> list[AssignmentNotice]:
        """The queued notices, for a response (under the delivery lock)."""
        queued, self._queued = self._queued, []
        return queued

    def put_back(self, notices: Sequence[AssignmentNotice]) -> None:
        self._queued[:0] = notices

    def forget(self, partitions: Sequence[TopicPartition] | None = None) -> None:
        """Partitions no longer assigned (all if None) need a new notice to release."""
        if partitions is None:
            self._told_assigned.clear()
        else:
            self._told_assigned -= set(partitions)

    async def tell_revoked(self, partitions: Sequence[TopicPartition]) -> None:
        """Before the revocation's final commit (as Java's ``onPartitionsRevoked``): a
        callback the app can commit from, or a notice queued for the next response."""
        self._told_assigned -= set(partitions)
        if not self.enabled or not partitions:
            return
        notice = AssignmentNotice(AssignmentChange.PARTITIONS_REVOKED, tuple(partitions))
        if self.callbacks is not None:
            await self._call_back(notice)
        else:
            async with self._delivery_lock:
                self._queued.append(notice)

    async def tell_assigned(self, partitions: Sequence[TopicPartition]) -> None:
        """Before the first record of ``partitions`` is released."""
        if not self.enabled:
            return
        notice = AssignmentNotice(AssignmentChange.PARTITIONS_ASSIGNED, tuple(partitions))
        if self.callbacks is not None:
            await self._call_back(notice)
        async with self._delivery_lock:
            if self.callbacks is None:
                self._queued.append(notice)
            self._told_assigned |= set(partitions)

    async def _call_back(self, notice: AssignmentNotice) -> None:
        # Bounded by the callback timeout and then given up (counted, logged): a
        # rebalance listener that never returns would get the member evicted.
        assert self.callbacks is not None
        message = AssignmentCallback(self.group, self.instance_id, notice)
        failure = await self.callbacks.post(message, within_s=self.callbacks.timeout_s)
        if failure is not None:
            _log.warning("%s callback gave up: %s", notice.kind.value, failure)
