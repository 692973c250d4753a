"""Boundaries checked against log truncation (KIP-320 for the generation log).

Every boundary is stored with the leader epoch of the leader that answered its offset
(``Boundary.leader_epoch``). KIP-320's check then applies: ask the partition's current
leader where that epoch ends (OffsetForLeaderEpoch). The leader answers the largest epoch
it knows at or below the asked one and the offset at which the next epoch began (its
log end, if the asked epoch is its own). Records below that offset written in that epoch
are still in the log. If it is below the boundary, an unclean leader election made a
replica leader that never had the records up to the boundary, and the log was cut
below it: acknowledged records of the older generation are gone, and the offsets from
there up to the boundary are (or will be) reused by records written after the loss.

Pure: the caller asks Kafka the epochs ``epochs_to_check`` names and passes the answers.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from sidecar.core.generations import GenerationLog


@dataclass(frozen=True, slots=True)
class TruncatedBoundary:
    """A boundary the log no longer reaches."""

    generation: int
    partition: int
    offset: int
    leader_epoch: int
    log_end: int | None
    """Where the boundary's epoch ends on the current leader; None: the leader knows no
    epoch that new, so nothing of it can be vouched for (KIP-320's consumer treats this
    as truncation at an unknown offset, and so does this check)."""


def epochs_to_check(log: GenerationLog) -> list[dict[int, int]]:
    """The leader epochs to ask about, as rounds of {partition: epoch}: OffsetForLeaderEpoch
    names one epoch per partition and request, and a partition's boundaries may carry
    several. A boundary at offset 0 cannot be cut below; one stored without an epoch
    (before epochs were stored) cannot be checked. Both are left out."""
    wanted: dict[int, set[int]] = {}
    for generation in log.generations:
        for partition, boundary in enumerate(generation.boundaries):
            if boundary.offset > 0 and boundary.leader_epoch is not None:
                wanted.setdefault(partition, set()).add(boundary.leader_epoch)
    rounds: list[dict[int, int]] = []
    for partition, epochs in sorted(wanted.items()):
        for index, epoch in enumerate(sorted(epochs)):
            if index == len(rounds):
                rounds.append({})
            rounds[index][partition] = epoch
    return rounds


def truncated_boundaries(
    log: GenerationLog, epoch_ends: Mapping[tuple[int, int], int | None]
) -> list[TruncatedBoundary]:
    """Every boundary of ``log`` that its partition's log no longer reaches, oldest first.

    ``epoch_ends[(partition, epoch)]`` is where that epoch ends on the partition's current
    leader (None: the leader knows no epoch that new). A boundary whose epoch was not
    asked about is not judged. Raises nothing.
    """
    found: list[TruncatedBoundary] = []
    for generation in log.generations:
        for partition, boundary in enumerate(generation.boundaries):
            epoch = boundary.leader_epoch
            if boundary.offset <= 0 or epoch is None or (partition, epoch) not in epoch_ends:
                continue
            log_end = epoch_ends[(partition, epoch)]
            if log_end is None or log_end < boundary.offset:
                found.append(
                    TruncatedBoundary(generation.number, partition, boundary.offset, epoch, log_end)
                )
    return found


ConfirmedLoss = tuple[int, int, int, int]
"""A lost boundary an operator confirmed: (generation, partition, offset, leader epoch)."""


def confirmed_loss(lost: TruncatedBoundary) -> ConfirmedLoss:
    return (lost.generation, lost.partition, lost.offset, lost.leader_epoch)


def unconfirmed(
    found: list[TruncatedBoundary], confirmed: Collection[ConfirmedLoss]
) -> list[TruncatedBoundary]:
    """The lost boundaries of ``found`` no operator has confirmed yet. A confirmation
    names the boundary and the epoch it was stored with, so a boundary lost again later
    (another generation, another epoch) is refused again until confirmed again."""
    return [lost for lost in found if confirmed_loss(lost) not in confirmed]


# KIP-320 for consumers ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConsumerTruncation:
    """A consumer's position its partition's log no longer reaches: records it consumed
    below it were lost to an unclean leader election, and the offsets from ``resume_at``
    are (or will be) reused by records written after the loss."""

    position: int
    """The offset the consumer would have read next."""
    leader_epoch: int
    """The leader epoch of the last record it consumed."""
    resume_at: int | None
    """Where its log and the partition's diverge (the end of that epoch on the current
    leader): read again from here, so that nothing written after the loss is skipped.
    None: the leader knows no epoch that old, so where they diverge is not known."""

    @property
    def lost(self) -> int | None:
        """How many records the consumer read that the log no longer has (None: unknown)."""
        return None if self.resume_at is None else self.position - self.resume_at


def consumer_truncation(
    position: int, leader_epoch: int | None, epoch_end: int | None
) -> ConsumerTruncation | None:
    """KIP-320's validation of a consumer's position after a leader change.

    ``leader_epoch`` is the epoch of the last record the consumer read (None or negative:
    it read none since it took the position, or the record had none, so there is
    nothing to validate); ``epoch_end`` is the current leader's OffsetForLeaderEpoch
    answer for it (where the largest epoch at or below it ends; None: it knows no epoch
    that old). The position stands if the epoch ends at or above it; else the log was
    truncated below it (Kafka's consumer: ``SubscriptionState.maybeCompleteValidation``).
    """
    if leader_epoch is None or leader_epoch < 0:
        return None
    if epoch_end is not None and epoch_end >= position:
        return None
    return ConsumerTruncation(position, leader_epoch, epoch_end)
