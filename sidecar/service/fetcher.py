"""Fetching from the instance's Kafka consumer into its positions model, and into the
leader epochs of what was read, which commits carry (``sidecar.core.commit_epochs``);
a fetch from a new leader, or from the group's commit, is validated first
(``sidecar.service.truncation_check``).

Partitions whose buffers are full are paused (re-applied every fetch: a rebalance
forgets pauses). A fetch still waiting when the poll's time is up is left running and
taken up by the next poll; whether its records still belong to a live reading of their
partition is the positions model's decision (``sidecar.core.positions``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sidecar.adapters.record_epochs import leader_epoch_of
from sidecar.core.consume import ConsumedRecord, TopicPartition
from sidecar.core.positions import Fetch
from sidecar.service.consume_context import ConsumeContext, InstanceConsumer
from sidecar.service.consume_state import ConsumeState
from sidecar.service.notices import AssignmentNotices
from sidecar.service.truncation_check import TruncationCheck

_log = logging.getLogger(__name__)


class Fetcher:
    def __init__(
        self,
        state: ConsumeState,
        context: ConsumeContext,
        notices: AssignmentNotices,
        *,
        buffer_limit: int,
        grace_s: float,
    ) -> None:
        self.state = state
        """The instance's shared state: the fetcher feeds its ``positions``."""
        self.truncations = TruncationCheck(state, context, notices)
        """Validates a fetch from a new leader before it is taken (KIP-320)."""
        self.buffer_limit = buffer_limit
        self.grace_s = grace_s
        """How much longer than its own timeout a poll waits for the consumer's fetch."""
        self._fetching: asyncio.Future[Fetch[ConsumedRecord]] | None = None
        """A fetch still waiting for a rebalance to end, taken up by the next poll."""

    async def fetch(self, consumer: InstanceConsumer, wait_s: float) -> None:
        """Take what the consumer fetches within ``wait_s`` into the positions model.
        Raises KafkaUnavailable."""
        positions = self.state.positions
        assigned = consumer.assignment()
        gone = positions.follow(assigned, consumer.incarnation())
        unassigned = [tp for tp in gone if tp not in assigned]
        self.state.notices.forget(unassigned)
        self.state.epochs.forget(unassigned)
        paused = positions.full(assigned, self.buffer_limit)
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
            self._fetching = asyncio.ensure_future(self._fetch(consumer, wait_s))
            self._fetching.add_done_callback(_retrieve_outcome)
        done, _ = await asyncio.wait({self._fetching}, timeout=wait_s + self.grace_s)
        if not done:
            return
        fetching, self._fetching = self._fetching, None
        fetched = fetching.result()
        await self.truncations.validate(consumer, fetched)
        starts = self._starts(fetched)
        for dropped in positions.take(fetched):
            _log.info(
                "%s[%d]: fetch of %d..%d not taken, %s: the consumer reads them again from "
                "its new position",
                dropped.tp.topic,
                dropped.tp.partition,
                dropped.first,
                dropped.last,
                dropped.reason,
            )
        self.truncations.taken(fetched)
        self._note_epochs(fetched, starts)

    def _of_reading(self, fetched: Fetch[ConsumedRecord]) -> list[TopicPartition]:
        """The partitions ``fetched`` read whose state is the reading it belongs to."""
        partitions = []
        for tp in fetched.batches.keys() | fetched.last_batches.keys():
            reading = self.state.positions.get(tp)
            if (
                reading is not None
                and reading.incarnation == fetched.incarnation
                and fetched.seek_epoch >= reading.seek_stamp
            ):
                partitions.append(tp)
        return partitions

    def _starts(self, fetched: Fetch[ConsumedRecord]) -> dict[TopicPartition, int | None]:
        """Before ``fetched`` is taken: where it started reading each partition, as far as
        the positions model knows (the position a previous fetch or a seek left)."""
        return {tp: self.state.positions[tp].fetched for tp in self._of_reading(fetched)}

    def _note_epochs(
        self, fetched: Fetch[ConsumedRecord], starts: dict[TopicPartition, int | None]
    ) -> None:
        """After ``fetched`` was taken: the leader epochs of what it read, for commits
        (KIP-320): of its records and, past them, of the batch it read last (a marker's,
        usually)."""
        for tp in self._of_reading(fetched):  # not the partitions whose reading ended
            self.state.epochs.read(
                tp,
                fetched.incarnation,
                starts.get(tp),
                fetched.batches.get(tp, ()),
                leader_epoch_of,
                fetched.last_batches.get(tp),
            )

    async def _fetch(self, consumer: InstanceConsumer, wait_s: float) -> Fetch[ConsumedRecord]:
        fetched = await consumer.fetch(timeout_ms=int(wait_s * 1000))
        # Read in the same step as the fetch returned, before a seek can run: a fetch
        # taken after a later seek of its partition is dropped.
        return Fetch(
            fetched.incarnation,
            self.state.positions.seek_epoch,
            fetched.batches,
            fetched.positions,
            fetched.last_batches,
        )

    def cancel(self) -> None:
        if self._fetching is not None:
            self._fetching.cancel()  # it may wait for an assignment that never comes
            self._fetching = None


def _retrieve_outcome(future: asyncio.Future[Any]) -> None:
    # A fetch left running when its instance closes ends with an error nobody awaits.
    if not future.cancelled():
        future.exception()
