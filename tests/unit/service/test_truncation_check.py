"""KIP-320 for the consumers: a fetch from a new leader is validated before it is taken,
and commits carry the leader epoch of what was read below them.

A real instance (positions, fetcher, release, commits) over a fake group consumer whose
records carry leader epochs, and a fake leader that answers OffsetForLeaderEpoch. The
log of partition ``TP``: offsets 0..9 written in leader epoch 1; then an unclean
election makes a replica that had only 0..6 leader in epoch 2, and new records take
offsets 7.. there. A log may hold transaction markers: the consumer skips them, and
reports the epoch of the last batch it read (a marker's, if last) with its position.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Any

from aiokafka.structs import ConsumerRecord

from sidecar.adapters.group_consumer import Fetched
from sidecar.adapters.kafka import OffsetAndEpoch
from sidecar.config import ConsumerSettings
from sidecar.core.consume import LastBatch, TopicPartition
from sidecar.core.errors import KafkaUnavailable
from sidecar.core.handoff import TruncationNotice
from sidecar.service.instance import ConsumerInstance, InstanceConfig
from tests.unit.service import fakes

TP = TopicPartition("t", 0)


def record(offset: int, epoch: int, value: bytes) -> ConsumerRecord[bytes, bytes]:
    fetched = ConsumerRecord("t", 0, offset, 0, 0, b"k", value, None, 1, 1, [])
    fetched.leader_epoch = epoch  # as record_epochs sets it
    return fetched


def marker(offset: int, epoch: int) -> Any:
    """A transaction's commit marker: in the log, never handed out as a record."""
    return SimpleNamespace(offset=offset, leader_epoch=epoch, marker=True)


def is_marker(entry: Any) -> bool:
    return getattr(entry, "marker", False) is True


class Group:
    """The group's committed offsets, as its coordinator holds them: (offset, leader
    epoch) per partition, the epoch None where a commit carried none."""

    def __init__(self) -> None:
        self.committed: dict[TopicPartition, tuple[int, int | None]] = {}
        self.away = False
        """The coordinator cannot be reached."""


class Log:
    """One partition's log on its current leader, with the leader's epoch cache."""

    def __init__(self) -> None:
        self.records = [record(o, 1, b"old") for o in range(10)]
        self.epoch_starts = [(1, 0)]

    def unclean_election(self, kept: int, epoch: int, new: int) -> None:
        del self.records[kept:]
        self.epoch_starts = [(e, s) for e, s in self.epoch_starts if s < kept]
        self.epoch_starts.append((epoch, kept))
        self.records += [record(kept + i, epoch, b"new") for i in range(new)]

    def clean_election(self, epoch: int, new: int) -> None:
        self.epoch_starts.append((epoch, len(self.records)))
        end = len(self.records)
        self.records += [record(end + i, epoch, b"new") for i in range(new)]

    def end_of(self, asked: int) -> OffsetAndEpoch | None:
        known = [(e, s) for e, s in self.epoch_starts if e <= asked]
        if not known:
            return None
        epoch = known[-1][0]
        later = [s for e, s in self.epoch_starts if e > epoch]
        return OffsetAndEpoch(later[0] if later else len(self.records), epoch)


class Consumer:
    """The group consumer: reads ``log`` from ``at`` (the group's committed offset, if
    any, as aiokafka starts an assignment), ``batch`` entries a fetch; past the log end
    it resets to the beginning, as aiokafka does with auto.offset.reset earliest
    (``reset`` "earliest"), or goes to the end ("latest"). Commits go to ``group``."""

    def __init__(self, log: Log, group: Group) -> None:
        self.log = log
        self.group = group
        committed = group.committed.get(TP)
        self.at = 0 if committed is None else committed[0]
        self.batch = 100
        self.reset = "earliest"
        self.sought: list[int] = []
        self.commits: list[tuple[dict[TopicPartition, int], dict[TopicPartition, int | None]]] = []
        self.offset_fetches: list[list[TopicPartition]] = []
        """The partitions of each OffsetFetch (v5) asked of the coordinator."""

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def incarnation(self) -> int:
        return 1

    def fetch_position(self, tp: TopicPartition) -> int | None:
        return self.at

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.at = offset
        self.sought.append(offset)

    async def seek_to(self, partitions: Iterable[TopicPartition], *, beginning: bool) -> None:
        self.seek(TP, 0 if beginning else len(self.log.records))

    async def position(self, tp: TopicPartition) -> int:
        return self.at

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        pass

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        pass

    async def fetch(self, timeout_ms: int) -> Fetched:
        await asyncio.sleep(0)
        if self.at > len(self.log.records):  # OFFSET_OUT_OF_RANGE
            self.at = 0 if self.reset == "earliest" else len(self.log.records)
        read = self.log.records[self.at : self.at + self.batch]
        taken = [entry for entry in read if not is_marker(entry)]
        last_batches = {}
        if read:
            self.at = read[-1].offset + 1
            last_batches[TP] = LastBatch(self.at, read[-1].leader_epoch)
        return Fetched(1, {TP: taken} if taken else {}, {TP: self.at}, last_batches)

    async def commit(
        self, offsets: Mapping[TopicPartition, int], epochs: Mapping[TopicPartition, int | None]
    ) -> None:
        self.commits.append((dict(offsets), dict(epochs)))
        for tp, offset in offsets.items():
            self.group.committed[tp] = (offset, epochs.get(tp))

    async def committed_epochs(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndEpoch]:
        """OffsetFetch v5 to the group's coordinator."""
        self.offset_fetches.append(sorted(partitions))
        if self.group.away:
            raise KafkaUnavailable("no coordinator")
        return {
            tp: OffsetAndEpoch(*self.group.committed[tp])
            for tp in partitions
            if tp in self.group.committed
        }


class Leader:
    def __init__(self, log: Log) -> None:
        self.log = log
        self.asked: list[dict[int, int]] = []
        self.away = False

    async def epoch_end_offsets(
        self, topic: str, epochs: Mapping[int, int]
    ) -> dict[int, OffsetAndEpoch | None]:
        self.asked.append(dict(epochs))
        if self.away:
            raise KafkaUnavailable("no leader")
        return {partition: self.log.end_of(epoch) for partition, epoch in epochs.items()}


async def _unmanaged(topic: str) -> None:
    return None


class Setup:
    def __init__(
        self,
        *,
        managed: bool = False,
        assignment_events: bool = False,
        log: Log | None = None,
        group: Group | None = None,
    ) -> None:
        """A new instance of group "g"; ``log`` and ``group`` shared with an earlier one
        (a restart) if given."""
        self.log = Log() if log is None else log
        self.group = Group() if group is None else group
        self.leader = Leader(self.log)
        self.metrics = fakes.Metrics()
        self.audit = fakes.Audit()
        context: Any = SimpleNamespace(
            settings=ConsumerSettings(),
            store=SimpleNamespace(),
            metrics=self.metrics,
            offsets=self.leader,
            audit=self.audit,
            registry=SimpleNamespace(topics={"t": object()} if managed else {}, runtime=_unmanaged),
        )
        config = InstanceConfig(
            group="g", name="i", format="binary", assignment_events=assignment_events
        )
        self.instance = ConsumerInstance(config, context, instance_key="s-i")
        self.consumer = Consumer(self.log, self.group)
        fake: Any = self.consumer
        self.instance.state.consumer = fake
        self.delivered: list[tuple[int, bytes | None]] = []

    async def poll(self, deliver: int | None = None) -> None:
        """One fetch into the positions model, then up to ``deliver`` records (all if
        None) released and sent to the app."""
        fake: Any = self.consumer
        await self.instance.fetcher.fetch(fake, 0.01)
        positions = self.instance.partitions
        state = positions.get(TP)
        count = 0
        while state is not None and state.buffer and (deliver is None or count < deliver):
            taken = positions.release(TP)
            self.delivered.append((taken.offset, taken.value))
            count += 1
        positions.sent()


def expected_after_loss(kept: int, new: int) -> list[tuple[int, bytes | None]]:
    return [(o, b"new") for o in range(kept, kept + new)]


async def test_an_unclean_election_below_the_position_is_found_and_read_again_from_it() -> None:
    s = Setup()
    await s.poll()
    assert s.delivered == [(o, b"old") for o in range(10)]
    s.log.unclean_election(kept=7, epoch=2, new=6)  # offsets 7..12 now hold new records
    await s.poll()  # aiokafka fetches 10..12 of the new log: validated first, not taken
    assert s.leader.asked == [{0: 1}]
    assert s.consumer.sought == [7]
    assert s.metrics.truncations == [(TP, 3)]
    assert s.audit.events == [
        {
            "type": "consumer_truncated",
            "group": "g",
            "instance": "i",
            "topic": "t",
            "partition": 0,
            "position": 10,
            "leader_epoch": 1,
            "resume_at": 7,
            "lost": 3,
        }
    ]
    await s.poll()
    # Nothing written after the loss is skipped: 7..12 of the new log, in order.
    assert s.delivered[10:] == expected_after_loss(7, 6)


async def test_a_reset_to_the_beginning_is_validated_and_read_again_from_the_divergence() -> None:
    s = Setup()
    await s.poll()
    s.log.unclean_election(kept=7, epoch=2, new=0)
    await s.poll()  # past the end: nothing yet (aiokafka resets on its next fetch)
    s.log.clean_election(epoch=3, new=0)
    s.log.records += [record(7 + i, 3, b"new") for i in range(2)]
    s.consumer.reset = "earliest"
    await s.poll()  # from 0: below the position, so validated before it is taken
    assert s.consumer.sought == [7]
    await s.poll()
    assert s.delivered[10:] == expected_after_loss(7, 2)


async def test_a_reset_to_the_end_skips_nothing_written_after_the_loss() -> None:
    s = Setup()
    await s.poll()
    s.log.unclean_election(kept=7, epoch=2, new=0)
    s.consumer.reset = "latest"
    await s.poll()
    s.log.records += [record(7 + i, 2, b"new") for i in range(5)]
    await s.poll()  # at 12 after the reset: 12.. only (none yet), then records of epoch 2
    s.log.records += [record(12, 2, b"new")]
    await s.poll()
    await s.poll()
    assert s.delivered[10:] == expected_after_loss(7, 6)


async def test_a_reset_to_the_end_of_a_shorter_log_is_validated_with_nothing_written_after() -> (
    None
):
    s = Setup()
    await s.poll()
    s.log.unclean_election(kept=7, epoch=2, new=2)  # the log ends at 9, below 10
    s.consumer.reset = "latest"
    await s.poll()  # out of range: at 9, no records; the position alone tells
    assert s.consumer.sought == [7]
    await s.poll()
    assert s.delivered[10:] == expected_after_loss(7, 2)


async def test_a_fetch_of_only_a_marker_from_the_new_leader_is_validated() -> None:
    s = Setup()
    await s.poll()
    s.log.unclean_election(kept=7, epoch=2, new=3)
    s.log.records.append(marker(10, 2))  # the position, 10, now holds a commit marker
    await s.poll()  # reads the marker only: no record, but a batch of epoch 2
    assert s.leader.asked == [{0: 1}]
    assert s.consumer.sought == [7]
    await s.poll()
    assert s.delivered[10:] == expected_after_loss(7, 3)


async def test_a_clean_leader_change_is_validated_once_and_changes_nothing() -> None:
    s = Setup()
    await s.poll()
    s.log.clean_election(epoch=2, new=4)
    await s.poll()
    await s.poll()
    assert s.leader.asked == [{0: 1}]
    assert s.consumer.sought == []
    assert s.metrics.truncations == []
    assert s.audit.events == []
    assert s.delivered == [(o, b"old") for o in range(10)] + [(o, b"new") for o in range(10, 14)]


async def test_records_buffered_below_the_divergence_are_read_again_not_dropped() -> None:
    s = Setup()
    await s.poll(deliver=4)  # 0..3 delivered, 4..9 buffered
    s.log.unclean_election(kept=7, epoch=2, new=4)
    await s.poll(deliver=0)
    # Back to what was delivered (4), not to the divergence (7): 4..6 are still there;
    # 7..9 buffered are gone from the log and are never delivered.
    assert s.consumer.sought == [4]
    assert s.metrics.truncations == [(TP, 3)]
    await s.poll()
    assert s.delivered == [(o, b"old") for o in range(7)] + expected_after_loss(7, 4)


async def test_a_new_log_ending_at_the_position_is_found_with_its_next_record() -> None:
    # Validation follows the records: nothing comes from the new leader while its log
    # ends where the consumer stands, and its first record there triggers it.
    s = Setup()
    await s.poll()
    s.log.unclean_election(kept=7, epoch=2, new=3)  # 7..9 again: the log ends at 10
    await s.poll()
    assert s.leader.asked == []
    s.log.records.append(record(10, 2, b"new"))
    await s.poll()
    await s.poll()
    assert s.consumer.sought == [7]
    assert s.delivered[10:] == expected_after_loss(7, 4)


async def test_a_leader_that_cannot_be_asked_holds_the_fetch_until_it_can() -> None:
    s = Setup()
    await s.poll()
    s.log.unclean_election(kept=7, epoch=2, new=6)
    s.leader.away = True
    await s.poll()
    await s.poll()
    # Read again from what was delivered, and validated again each time: nothing of
    # the new leader's log is taken unvalidated.
    assert s.delivered == [(o, b"old") for o in range(10)]
    assert s.consumer.sought == [10, 10]
    s.leader.away = False
    await s.poll()
    await s.poll()
    assert s.consumer.sought == [10, 10, 7]
    assert s.delivered[10:] == expected_after_loss(7, 6)


async def test_a_leader_knowing_no_epoch_that_old_has_the_partition_read_from_its_start() -> None:
    s = Setup()
    await s.poll()
    s.log.records = [record(o, 5, b"new") for o in range(4)]
    s.log.epoch_starts = [(5, 0)]
    await s.poll()
    assert s.consumer.sought == [0]
    assert s.metrics.truncations == [(TP, 0)]
    await s.poll()
    assert s.delivered[10:] == [(o, b"new") for o in range(4)]


async def test_the_app_is_told_of_a_truncation_of_a_managed_topic_before_reading_again() -> None:
    s = Setup(managed=True)
    await s.poll()
    s.log.unclean_election(kept=7, epoch=2, new=6)
    await s.poll()
    told = TruncationNotice(TP, position=10, leader_epoch=1, resume_at=7, lost=3)
    # Queued for the next response, which sends notices before any record.
    assert s.instance.state.notices.take() == [told]
    await s.poll()
    assert s.delivered[10:] == expected_after_loss(7, 6)
    assert s.instance.state.notices.take() == []


async def test_an_app_that_asked_for_notices_is_told_of_a_truncation_of_any_topic() -> None:
    s = Setup(assignment_events=True)
    await s.poll()
    s.log.unclean_election(kept=7, epoch=2, new=6)
    await s.poll()
    assert [n.kind.value for n in s.instance.state.notices.take()] == ["log_truncated"]


async def test_a_rest_proxy_client_of_an_unmanaged_topic_gets_no_notice() -> None:
    # Its responses carry records only, as REST Proxy's: the loss is logged and counted.
    s = Setup()
    await s.poll()
    s.log.unclean_election(kept=7, epoch=2, new=6)
    await s.poll()
    assert s.metrics.truncations == [(TP, 3)]
    assert s.instance.state.notices.take() == []


# Commits ----------------------------------------------------------------------------------


def transaction_then_marker(log: Log, *, marker_epoch: int) -> None:
    """The log: a transaction's records 0..4 in epoch 1, its commit marker at 5 in
    ``marker_epoch`` (2: a clean leader change between the records and the marker)."""
    log.records = [record(o, 1, b"old") for o in range(5)] + [marker(5, marker_epoch)]
    if marker_epoch != 1:
        log.epoch_starts.append((marker_epoch, 5))


async def test_a_commit_past_a_marker_carries_the_markers_epoch() -> None:
    s = Setup()
    transaction_then_marker(s.log, marker_epoch=2)
    await s.poll()
    assert s.delivered == [(o, b"old") for o in range(5)]
    await s.instance.commit(None)  # everything delivered: up to past the marker
    await s.instance.commit({TP: 3})
    assert s.consumer.commits == [({TP: 6}, {TP: 2}), ({TP: 3}, {TP: 1})]


async def test_a_commit_of_what_was_not_read_carries_no_epoch() -> None:
    s = Setup()
    await s.instance.seek({TP: 4})
    await s.instance.commit(None)
    assert s.consumer.commits == [({TP: 4}, {TP: None})]


async def test_after_a_truncation_commits_carry_the_epochs_of_the_new_log() -> None:
    s = Setup()
    await s.poll()
    s.log.unclean_election(kept=7, epoch=2, new=6)
    await s.poll()  # validated: read again from 7
    await s.poll()
    assert s.delivered[10:] == expected_after_loss(7, 6)
    # 7..12 are epoch 2's now; what was read of epoch 1 there is forgotten.
    await s.instance.commit({TP: 7})
    await s.instance.commit({TP: 9})
    await s.instance.commit(None)
    assert [epochs for _, epochs in s.consumer.commits] == [{TP: 1}, {TP: 2}, {TP: 2}]


# Readings that start from the group's commit ----------------------------------------------


async def test_a_restart_above_where_the_new_log_diverges_reads_again_from_there() -> None:
    s = Setup()
    await s.poll()
    await s.instance.commit(None)
    assert s.group.committed[TP] == (10, 1)
    s.log.unclean_election(kept=7, epoch=2, new=6)  # offsets 7..12 now hold new records
    # A new instance of the group starts from its commit, 10: the new log's 10..12.
    restarted = Setup(log=s.log, group=s.group)
    await restarted.poll()
    assert restarted.consumer.offset_fetches == [[TP]]
    assert restarted.leader.asked == [{0: 1}]
    assert restarted.consumer.sought == [7]
    assert restarted.metrics.truncations == [(TP, 3)]
    [event] = restarted.audit.events
    assert (event["position"], event["leader_epoch"], event["resume_at"], event["lost"]) == (
        10,
        1,
        7,
        3,
    )
    await restarted.poll()
    # Nothing written after the loss is skipped: 7..12 of the new log, in order.
    assert restarted.delivered == expected_after_loss(7, 6)
    assert restarted.consumer.offset_fetches == [[TP]]  # once per reading


async def test_a_commit_past_the_new_log_end_is_validated_after_the_offset_reset() -> None:
    s = Setup()
    await s.poll()
    await s.instance.commit(None)
    s.log.unclean_election(kept=7, epoch=2, new=2)  # the log ends at 9, below the commit
    restarted = Setup(log=s.log, group=s.group)
    restarted.consumer.reset = "latest"
    await restarted.poll()  # out of range: aiokafka goes to the end, 9
    s.log.records += [record(9 + i, 2, b"new") for i in range(4)]
    await restarted.poll()  # 9..12: below the commit, validated first
    assert restarted.consumer.sought == [7]
    await restarted.poll()
    assert restarted.delivered == expected_after_loss(7, 6)


async def test_a_commit_past_the_new_log_end_is_validated_with_nothing_written_after() -> None:
    s = Setup()
    await s.poll()
    await s.instance.commit(None)
    s.log.unclean_election(kept=7, epoch=2, new=2)  # the log ends at 9, below the commit
    restarted = Setup(log=s.log, group=s.group)
    restarted.consumer.reset = "latest"
    # Out of range: aiokafka goes to the end, 9, and nothing more is written. The commit
    # is validated all the same, not left waiting for a record that never comes.
    await restarted.poll()
    assert restarted.consumer.sought == [7]
    assert restarted.metrics.truncations == [(TP, 3)]
    await restarted.poll()
    assert restarted.delivered == expected_after_loss(7, 2)


async def test_a_commit_not_read_before_anything_was_fetched_is_asked_again() -> None:
    s = Setup()
    await s.poll()
    await s.instance.commit(None)
    s.log.unclean_election(kept=7, epoch=2, new=2)
    restarted = Setup(log=s.log, group=s.group)
    restarted.consumer.reset = "latest"
    restarted.group.away = True
    await restarted.poll()  # at the end: no records, and the commit not read
    restarted.group.away = False
    await restarted.poll()
    assert restarted.consumer.offset_fetches == [[TP], [TP]]
    assert restarted.consumer.sought == [7]
    await restarted.poll()
    assert restarted.delivered == expected_after_loss(7, 2)


async def test_a_clean_leader_change_between_a_record_and_its_marker_is_no_truncation() -> None:
    s = Setup()
    transaction_then_marker(s.log, marker_epoch=2)
    await s.poll()
    await s.instance.commit(None)
    assert s.group.committed[TP] == (6, 2)  # the marker's epoch, not the last record's
    s.log.clean_election(epoch=3, new=4)
    restarted = Setup(log=s.log, group=s.group)
    await restarted.poll()
    await restarted.poll()
    # Validated once (epoch 2 ends at 6, where epoch 3 began): nothing moves.
    assert restarted.leader.asked == [{0: 2}]
    assert restarted.consumer.sought == []
    assert restarted.metrics.truncations == []
    assert restarted.audit.events == []
    assert restarted.delivered == [(o, b"new") for o in range(6, 10)]
    assert restarted.consumer.offset_fetches == [[TP]]


async def test_a_commit_that_cannot_be_read_leaves_the_reading_unvalidated() -> None:
    s = Setup()
    await s.poll()
    await s.instance.commit(None)
    s.log.unclean_election(kept=7, epoch=2, new=6)
    restarted = Setup(log=s.log, group=s.group)
    restarted.group.away = True
    await restarted.poll()
    await restarted.poll()
    # As before commits carried epochs: from the commit on, asked once.
    assert restarted.consumer.offset_fetches == [[TP]]
    assert restarted.leader.asked == []
    assert restarted.delivered == [(o, b"new") for o in range(10, 13)]
