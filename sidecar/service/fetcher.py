"""Fetching from the instance's Kafka consumer into its partition buffers.

Partitions whose buffers are full are paused (re-applied every fetch: a rebalance
forgets pauses). A fetch still waiting when the poll's time is up is left running and
taken up by the next poll.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sidecar.adapters.group_consumer import Fetched, GroupConsumer
from sidecar.service.notices import AssignmentNotices
from sidecar.service.partitions import PartitionBuffers


class Fetcher:
    def __init__(
        self,
        buffers: PartitionBuffers,
        notices: AssignmentNotices,
        *,
        buffer_limit: int,
        grace_s: float,
    ) -> None:
        self.buffers = buffers
        self.notices = notices
        self.buffer_limit = buffer_limit
        self.grace_s = grace_s
        """How much longer than its own timeout a poll waits for the consumer's fetch."""
        self._fetching: asyncio.Future[tuple[int, Fetched]] | None = None
        """A getmany still waiting for a rebalance to end, taken up by the next poll."""

    async def fetch(self, consumer: GroupConsumer, wait_s: float) -> None:
        """Take what the consumer fetches within ``wait_s`` into the buffers. Raises
        KafkaUnavailable."""
        assigned = consumer.assignment()
        self.notices.forget(self.buffers.keep_only(assigned))
        paused = self.buffers.full(assigned, self.buffer_limit)
        # Re-applied every time: a rebalance forgets pauses.
        consumer.resume([tp for tp in assigned if tp not in paused])
        if paused:
            consumer.pause(paused)
        if len(paused) == len(assigned):
            return
        # aiokafka's getmany waits, whatever its timeout, until a rebalance has ended, and
        # a rebalance's listener may wait for the app to acknowledge keys_revoked events,
        # which only this poll's response carries. So the poll waits for the fetch no
        # longer than asked and leaves it running (not cancelled: aiokafka would lose
        # count of its fetches); a later poll takes its records.
        if self._fetching is None:
            self._fetching = asyncio.ensure_future(self._getmany(consumer, wait_s))
            self._fetching.add_done_callback(_retrieve_outcome)
        done, _ = await asyncio.wait({self._fetching}, timeout=wait_s + self.grace_s)
        if not done:
            return
        fetching, self._fetching = self._fetching, None
        fetched_in, batches = fetching.result()
        self.buffers.take(batches, fetched_in=fetched_in, assigned=consumer.assignment())
        # The positions moved with the records just taken (and past the markers and
        # aborted records among and after them); nothing else moves them until the next
        # fetch, so they are read here, once.
        self.buffers.note_positions(assigned, consumer.fetch_position)

    async def _getmany(self, consumer: GroupConsumer, wait_s: float) -> tuple[int, Fetched]:
        batches = await consumer.getmany(timeout_ms=int(wait_s * 1000))
        # Read in the same step as the fetch returns, before a rebalance listener or a
        # seek can run: the batches belong to the partitions' states of this epoch.
        return self.buffers.epoch, batches

    def cancel(self) -> None:
        if self._fetching is not None:
            self._fetching.cancel()  # it may wait for an assignment that never comes
            self._fetching = None


def _retrieve_outcome(future: asyncio.Future[Any]) -> None:
    # A fetch left running when its instance closes ends with an error nobody awaits.
    if not future.cancelled():
        future.exception()
