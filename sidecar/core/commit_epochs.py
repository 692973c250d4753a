"""The leader epoch a commit carries (KIP-320). Pure.

A commit of offset ``O`` says the group has read everything below ``O``. KIP-320 has it
carry the leader epoch of the last batch read below ``O``, so that a reading that
starts at ``O`` later (a rebalance, a restart) can ask the partition's current leader
where that epoch ends: below ``O`` means the log was cut under the commit
(``core.truncation.consumer_truncation``). Kafka's consumer commits the epoch of the
last batch it consumed, control batches included, and so does this: the sidecar writes
managed topics in transactions, so a committed offset usually lies just past a commit
marker, and a leader change between a transaction's records and its marker puts the
marker in a newer epoch than the last record. A commit carrying the record's epoch
would be found truncated (that epoch ends at the marker, below ``O``) when it is not.

**What is kept.** Per partition and assignment of the consumer (its ``incarnation``,
``core.positions``), the epochs of what was read, as *runs*: ``(first, epoch)`` says the
batches from offset ``first`` up to the next run's first offset are of ``epoch``, and
everything from the first run's offset up to ``known_to`` was read. A fetch adds what
it read from where it started: its records, run by run (found by bisection: per epoch
change, not per record), and the batch it read last with the position that left
(``LastBatch``: a marker's epoch is seen only there). Offsets a fetch returns again
(the consumer was moved back) are known already and left out; a fetch that starts
outside what is known (a seek) starts the runs over. About one run per leader change
seen; a new assignment starts over.

**The gaps.** Between where a fetch started and its first record, between two records
of different epochs, and between the last record and a newer last batch, lie markers
or aborted batches whose epochs are not seen. A gap is given to the newer epoch (its
run starts where what is known of the older one ends). For a commit of ``O``,
``epoch_for`` answers the epoch of the run holding ``O - 1``, which is, with ``e`` the
epoch of the batch at ``O - 1``:

- never older than ``e``: the leader of ``e`` wrote at ``O - 1``, so while the log
  holds what was read, ``e`` ends at or after ``O`` and no loss is found that is not
  one;
- never newer than the epoch of a batch read at or after ``O - 1``: a log cut below
  ``O`` by an unclean election (a newer epoch) no longer has that batch, so the epoch
  asked ends below ``O`` there, and the loss is found.

None (the commit carries none) for an offset not within what was read in the current
assignment, or read from batches without an epoch (magic 0 and 1). A truncation found
moves reading back: the runs are cut back to where it resumes (``cut``). A reading that
starts from the group's commit begins knowing the committed epoch, once read
(``start_at_commit``), so that a commit of the same offset carries it again.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from sidecar.core.consume import LastBatch, Offsetted, TopicPartition

R = TypeVar("R", bound=Offsetted)


def _offset(record: Offsetted) -> int:
    return record.offset


@dataclass(slots=True)
class _Runs:
    """One partition's runs in one assignment (see the module docstring)."""

    incarnation: int
    firsts: list[int] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)
    known_to: int | None = None
    """Every offset from ``firsts[0]`` up to it was read; with no runs, where reading
    started (None: not known)."""

    def begin(self, start: int) -> None:
        """A fetch read from ``start``."""
        if not self.epochs or self.known_to is None or not self.firsts[0] <= start <= self.known_to:
            # Nothing known yet, or a seek out of what was read (a hole, past it).
            self.firsts, self.epochs, self.known_to = [], [], start

    def add(self, first_seen: int, epoch: int, end: int) -> None:
        """Batches of ``epoch`` were read from ``first_seen`` up to ``end`` (exclusive),
        nothing of another epoch in between."""
        if not self.epochs:
            # What lies between where reading started and ``first_seen`` is of an epoch
            # not newer: given to this one (see the module docstring).
            first = first_seen if self.known_to is None else min(self.known_to, first_seen)
            self.firsts, self.epochs, self.known_to = [first], [epoch], end
            return
        if self.known_to is None or end <= self.known_to:
            return
        newest = self.epochs[-1]
        if epoch > newest:
            # The gap since what was known is the newer epoch's: see the module docstring.
            self.firsts.append(min(self.known_to, first_seen))
            self.epochs.append(epoch)
        elif epoch < newest:
            # Epochs never go back within a log read in order: these records are not of
            # the log the runs describe (or have no epoch). Start over from them.
            self.firsts, self.epochs = [first_seen], [epoch]
        self.known_to = end

    def epoch_for(self, offset: int) -> int | None:
        if self.known_to is None or not self.firsts or offset > self.known_to:
            return None
        index = bisect.bisect_right(self.firsts, offset - 1) - 1
        if index < 0:
            return None
        epoch = self.epochs[index]
        return epoch if epoch >= 0 else None

    def cut(self, at: int) -> None:
        keep = bisect.bisect_left(self.firsts, at)
        del self.firsts[keep:], self.epochs[keep:]
        if not self.firsts or self.known_to is None:
            self.known_to = None
        else:
            self.known_to = min(self.known_to, at)


class CommitEpochs:
    """The epochs of what one consumer instance read, per partition, for its commits."""

    def __init__(self) -> None:
        self._runs: dict[TopicPartition, _Runs] = {}

    def _of(self, tp: TopicPartition, incarnation: int) -> _Runs:
        runs = self._runs.get(tp)
        if runs is None or runs.incarnation != incarnation:
            runs = self._runs[tp] = _Runs(incarnation)
        return runs

    def read(
        self,
        tp: TopicPartition,
        incarnation: int,
        start: int | None,
        records: Sequence[R],
        epoch_of: Callable[[R], int],
        last_batch: LastBatch | None,
    ) -> None:
        """A fetch of assignment ``incarnation`` was taken, which read ``tp`` from
        ``start`` (None: not known): ``records`` (in offset order, each of the epoch
        ``epoch_of`` tells; epochs never decrease along them), and the batch it read
        last (None: not known)."""
        runs = self._of(tp, incarnation)
        if start is not None and (records or last_batch is not None):
            runs.begin(start)
        first, stop = 0, len(records)
        if runs.epochs and runs.known_to is not None and stop and records[0].offset < runs.known_to:
            first = bisect.bisect_left(records, runs.known_to, key=_offset)
        while first < stop:
            epoch = epoch_of(records[first])
            # The first record of a newer epoch: one bisection per epoch change.
            after = bisect.bisect_right(records, epoch, first, stop, key=epoch_of)
            runs.add(records[first].offset, epoch, records[after - 1].offset + 1)
            first = after
        if last_batch is not None:
            end = last_batch.next_offset
            runs.add(end - 1, last_batch.leader_epoch, end)

    def epoch_for(self, tp: TopicPartition, incarnation: int, offset: int) -> int | None:
        """The leader epoch a commit of ``offset`` carries: of the last batch read below
        it, or newer within a gap (see the module docstring); None if unknown."""
        runs = self._runs.get(tp)
        if runs is None or runs.incarnation != incarnation:
            return None
        return runs.epoch_for(offset)

    def start_at_commit(
        self, tp: TopicPartition, incarnation: int, offset: int, epoch: int
    ) -> None:
        """The reading of ``tp`` in ``incarnation`` started from the group's commit of
        ``offset`` with ``epoch`` (the batch at ``offset - 1`` is of ``epoch``). Only
        while nothing was read in it: what was read is known better."""
        runs = self._of(tp, incarnation)
        if not runs.epochs and offset > 0 and epoch >= 0:
            runs.known_to = None
            runs.add(offset - 1, epoch, offset)

    def cut(self, tp: TopicPartition, incarnation: int, at: int) -> None:
        """The log of ``tp`` no longer holds what was read from ``at`` on (or it may not:
        it is read again from ``at``): forget it."""
        runs = self._runs.get(tp)
        if runs is not None and runs.incarnation == incarnation:
            runs.cut(at)

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Partitions no longer assigned."""
        for tp in partitions:
            self._runs.pop(tp, None)
