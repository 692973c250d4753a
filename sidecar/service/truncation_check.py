"""KIP-320 for the consumers: a fetch from a partition's new leader is validated before
it is taken.

After an unclean leader election a partition's log can be cut below what a consumer
instance has read, and the offsets from there are reused by records written after the
loss. Kafka's own consumer validates its position after every leader change; aiokafka
0.14 does not: it goes on fetching from its position (skipping what was written at the
reused offsets below it) or, past the log end, resets by ``auto.offset.reset``. And the
positions model takes records only above what it holds, so records coming again from
below would be taken for ones already read.

So, per partition and reading, this remembers the position after the last record taken
and that record's leader epoch (``adapters.record_epochs``). Before a fetch is taken,
a partition whose records come from a newer leader epoch, or start below that position
(aiokafka reset it), is validated: the current leader says where the remembered epoch
ends (OffsetForLeaderEpoch), and ``core.truncation.consumer_truncation`` decides. A
position the log no longer reaches is moved back to where the logs diverge, a seek of
the instance's own: the fetch's records of the partition are then dropped, the records
buffered above it are never released (the log no longer has them), and reading resumes
there, so nothing written after the loss is skipped. It is logged and counted
(``sidecar_consumer_truncations_total``, ``sidecar_consumer_truncated_records_total``),
sent as a ``consumer_truncated`` audit event, and told to the app (``log_truncated``,
by callback or first in the next records response) when it reads a managed topic or
asked for ``assignment_events``.

A reading that starts from the group's committed offset (a new assignment, no seek by
this instance) has read nothing yet: its first fetch with records has the commit read
with its leader epoch (OffsetFetch v5, ``GroupConsumer.committed_epochs``; commits
carry the epoch of the last batch read below them, ``sidecar.core.commit_epochs``), and
that commit is validated as a position read before, the same way: after an unclean
election below it, reading resumes where the logs diverge instead of skipping what was
written at the reused offsets below the commit (or, past the new log end, going where
``auto.offset.reset`` says). It is validated with the first fetch that reports the
partition's position, records or not, as Kafka's consumer validates a committed position
before fetching: past the new log's end, aiokafka would reset the position to the end,
and nothing would ever come to be validated. One OffsetFetch per such reading, asked
again while it fails and nothing was fetched; a reading whose records came meanwhile,
or whose commit carries no epoch, goes on unvalidated until its first record is taken.

A clean leader change costs one OffsetForLeaderEpoch request per partition and changes
nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sidecar.adapters.record_epochs import NO_EPOCH, leader_epoch_of
from sidecar.audit import events as audit_events
from sidecar.core.consume import ConsumedRecord, TopicPartition
from sidecar.core.errors import SidecarError
from sidecar.core.handoff import TruncationNotice
from sidecar.core.positions import Fetch
from sidecar.core.truncation import ConsumerTruncation, consumer_truncation
from sidecar.service.consume_context import ConsumeContext, InstanceConsumer
from sidecar.service.consume_state import ConsumeState
from sidecar.service.notices import AssignmentNotices

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LastRead:
    """The last record taken from a partition in one reading: the position after it and
    its leader epoch. Or, before anything was taken in a reading that began at the
    group's committed offset, that commit: its offset and the epoch it carries."""

    incarnation: int
    seek_stamp: int
    position: int
    leader_epoch: int
    committed: bool = False
    """The group's commit, not a record this instance read."""


class TruncationCheck:
    def __init__(
        self, state: ConsumeState, context: ConsumeContext, notices: AssignmentNotices
    ) -> None:
        self.state = state
        """The instance's shared state: its ``positions`` say which reading is current,
        and a truncation moves them."""
        self.context = context
        self.notices = notices
        """Tells the app of a truncation (``TruncationNotice``)."""
        self._last: dict[TopicPartition, LastRead] = {}
        self._commit_read: dict[TopicPartition, tuple[int, int]] = {}
        """Per partition, the last reading whose group commit was asked for: once per
        reading at most."""

    def _last_in(self, tp: TopicPartition, reading: tuple[int, int] | None) -> LastRead | None:
        """What was last read of ``tp`` in ``reading`` (None: nothing yet)."""
        last = self._last.get(tp)
        if last is None or reading is None or (last.incarnation, last.seek_stamp) != reading:
            return None
        return last

    def _reading(self, tp: TopicPartition, incarnation: int) -> tuple[int, int] | None:
        """The current reading of ``tp`` in the consumer's assignment ``incarnation``."""
        positions = self.state.positions
        return positions.reading_of(tp, incarnation, positions.seek_epoch)

    def to_validate(self, fetch: Fetch[ConsumedRecord]) -> dict[TopicPartition, LastRead]:
        """The partitions of ``fetch`` to validate before it is taken, with what was read
        of them: a batch (records, or only a transaction marker) of a newer leader epoch
        than the last read, or records or a position below its position (the consumer's
        position was reset: to the start, or to the end of a log now shorter)."""
        asked: dict[TopicPartition, LastRead] = {}
        positions = self.state.positions
        for tp in fetch.batches.keys() | fetch.last_batches.keys() | fetch.positions.keys():
            last = self._last_in(tp, positions.reading_of(tp, fetch.incarnation, fetch.seek_epoch))
            if last is None or last.leader_epoch == NO_EPOCH:
                continue
            records = fetch.batches.get(tp, ())
            newest = fetch.last_batches.get(tp)
            # A partition's batches come in offset order, so epochs never decrease.
            epochs = [leader_epoch_of(records[-1])] if records else []
            if newest is not None:
                epochs.append(newest.leader_epoch)
            position = fetch.positions.get(tp)
            if (
                max(epochs, default=NO_EPOCH) > last.leader_epoch
                or (records and records[0].offset < last.position)
                or (position is not None and position < last.position)
            ):
                asked[tp] = last
        return asked

    async def validate(self, consumer: InstanceConsumer, fetch: Fetch[ConsumedRecord]) -> None:
        """Before ``fetch`` is taken: move back every partition whose log was cut below
        what was read, or below the group's commit its reading began at (its records in
        ``fetch`` are then not taken). A partition whose leader cannot be asked now is
        read again from what was delivered, and validated by that fetch. Raises
        nothing."""
        commits = await self._read_commits(consumer, fetch)
        by_topic: dict[str, dict[int, LastRead]] = {}
        for tp, last in (commits | self.to_validate(fetch)).items():
            by_topic.setdefault(tp.topic, {})[tp.partition] = last
        for topic, partitions in by_topic.items():
            epochs = {partition: last.leader_epoch for partition, last in partitions.items()}
            try:
                ends = await self.context.offsets.epoch_end_offsets(topic, epochs)
            except SidecarError as exc:
                _log.info("positions in %s not validated, read again: %s", topic, exc.message)
                for partition, last in partitions.items():
                    await self._read_again(consumer, TopicPartition(topic, partition), last, None)
                continue
            for partition, last in partitions.items():
                end = ends.get(partition)
                found = consumer_truncation(
                    last.position, last.leader_epoch, None if end is None else end.offset
                )
                if found is not None:
                    await self._read_again(consumer, TopicPartition(topic, partition), last, found)

    async def _read_commits(
        self, consumer: InstanceConsumer, fetch: Fetch[ConsumedRecord]
    ) -> dict[TopicPartition, LastRead]:
        """For each partition of ``fetch`` (one it read, or whose position it reports)
        whose reading began at the group's committed offset (the assignment's start, no
        seek by this instance) and took nothing yet: read that commit's offset and
        leader epoch (OffsetFetch v5), to be validated now as a position read before,
        whether or not the fetch brought records of it. Validated at once, as Kafka's
        consumer validates a committed position before it fetches: a commit past the
        new log's end has aiokafka reset the position by ``auto.offset.reset``, and at
        the end of a log nothing written after the loss would come to validate it by.

        Returns those partitions with the commit read (the ones carrying an epoch).
        Asked once per reading; a failure (Kafka away, a broker before 2.1) is asked
        again with the next fetch for partitions that have taken nothing yet, while a
        partition whose records this fetch brings goes on unvalidated, as before
        commits carried epochs (logged at info). A commit without an epoch (an older
        client's, or one that knew none) cannot be validated."""
        positions = self.state.positions
        starting: dict[TopicPartition, tuple[int, int]] = {}
        for tp in fetch.batches.keys() | fetch.positions.keys():
            reading = positions.reading_of(tp, fetch.incarnation, fetch.seek_epoch)
            if (
                reading is None
                or reading[1] != 0
                or self._commit_read.get(tp) == reading
                or self._last_in(tp, reading) is not None
            ):
                continue
            starting[tp] = reading
        if not starting:
            return {}
        try:
            committed = await consumer.committed_epochs(sorted(starting))
        except SidecarError as exc:
            given_up = sorted(tp for tp in starting if fetch.batches.get(tp))
            self._commit_read.update((tp, starting[tp]) for tp in given_up)
            _log.info(
                "%s/%s: the group's commits of %s not read (%s); %s",
                self.state.group,
                self.state.instance_id,
                ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(starting)),
                exc.message,
                "asked again with the next fetch"
                if not given_up
                else "readings with records fetched go on unvalidated: "
                + ", ".join(f"{tp.topic}[{tp.partition}]" for tp in given_up),
            )
            return {}
        self._commit_read.update(starting)
        found_commits: dict[TopicPartition, LastRead] = {}
        for tp, reading in starting.items():
            found = committed.get(tp)
            # The request awaited: the reading may have ended, or taken records.
            if (
                found is None
                or found.leader_epoch is None
                or self._reading(tp, reading[0]) != reading
                or self._last_in(tp, reading) is not None
            ):
                continue
            incarnation, seek_stamp = reading
            last = LastRead(
                incarnation, seek_stamp, found.offset, found.leader_epoch, committed=True
            )
            self._last[tp] = found_commits[tp] = last
            # A commit of the same offset carries the same epoch again.
            self.state.epochs.start_at_commit(tp, incarnation, found.offset, found.leader_epoch)
        return found_commits

    async def _read_again(
        self,
        consumer: InstanceConsumer,
        tp: TopicPartition,
        last: LastRead,
        found: ConsumerTruncation | None,
    ) -> None:
        """A seek of the instance's own: from where the logs diverge (``found``), or, when
        the leader could not be asked, from what was delivered, the same validation
        then due again. Never past a record not delivered that the log still has."""
        # The request to the leader awaited: the partition may have been revoked or
        # sought meanwhile, and then its new reading starts elsewhere anyway.
        if (
            self._last_in(tp, self._reading(tp, last.incarnation)) is not last
            or consumer.incarnation() != last.incarnation
        ):
            return
        positions = self.state.positions
        state = positions.get(tp)
        delivered = None
        if state is not None and state.incarnation == last.incarnation:
            delivered = state.delivered
        # (else a reading that began at the group's commit and has no state yet)
        positions.begin_seek(tp, last.incarnation)
        if found is not None and found.resume_at is None:
            # The leader knows no epoch that old: where the logs diverge is not known, so
            # the whole log is read again rather than anything skipped.
            await consumer.seek_to([tp], beginning=True)
            target = await consumer.position(tp)
        else:
            below = [] if delivered is None else [delivered]
            if found is not None and found.resume_at is not None:
                below.append(found.resume_at)
            # Buffered records below the divergence are still in the log: read again.
            target = min(below, default=last.position)
            consumer.seek(tp, target)
        positions.seek_landed(tp, target)
        if found is not None:
            # What was read from ``target`` on is no longer in the log, and commits carry
            # the epochs of what is (nothing is vouched for where the divergence is not
            # known).
            self.state.epochs.cut(tp, last.incarnation, 0 if found.resume_at is None else target)
        if found is None:
            reading = positions[tp]
            self._last[tp] = LastRead(
                reading.incarnation,
                reading.seek_stamp,
                last.position,
                last.leader_epoch,
                committed=last.committed,
            )
            return
        # Read (delivered, or buffered and now dropped) and no longer in the log; not
        # known when the leader knows no epoch that old (the whole log is read again).
        lost = found.lost if found.lost is not None else 0
        # ``delivered`` may stand past a transaction marker that ``lost`` does not count.
        lost_delivered = (
            0 if found.lost is None or delivered is None else min(lost, max(0, delivered - target))
        )
        self.context.metrics.truncated(self.state.group, tp, lost)
        self.context.audit.emit(
            audit_events.consumer_truncated(
                group=self.state.group,
                instance=self.state.instance_id,
                topic=tp.topic,
                partition=tp.partition,
                position=found.position,
                leader_epoch=found.leader_epoch,
                resume_at=found.resume_at,
                lost=lost,
            )
        )
        _log.warning(
            "%s[%d]: the log was cut below what %s/%s %s (leader epoch %d ends at %s, "
            "position %d): %d offset(s) read, %d of them delivered, are no longer in the "
            "log; reading again from offset %d",
            tp.topic,
            tp.partition,
            self.state.group,
            self.state.instance_id,
            "started from (the group's commit)" if last.committed else "had read",
            found.leader_epoch,
            "an unknown offset" if found.resume_at is None else found.resume_at,
            found.position,
            lost,
            lost_delivered,
            target,
        )
        if self.state.notices.enabled or tp.topic in self.context.registry.topics:
            # Before anything read again from ``target`` is released: a queued notice
            # goes first in the next response, and a callback returns before this does.
            notice = TruncationNotice(tp, found.position, found.leader_epoch, found.resume_at, lost)
            if await self.notices.tell_truncated(notice) is not None:
                self.state.notices.queue(notice)

    def taken(self, fetch: Fetch[ConsumedRecord]) -> None:
        """After ``fetch`` was taken: remember the last record held of each partition."""
        for tp in fetch.batches:
            reading = self.state.positions.get(tp)
            if reading is None or not reading.buffer:
                continue
            newest = reading.buffer[-1]
            self._last[tp] = LastRead(
                reading.incarnation,
                reading.seek_stamp,
                newest.offset + 1,
                leader_epoch_of(newest),
            )
