"""Compaction of a topic's generation log (DESIGN §4): fold the generations whose
records are all gone. Pure.

Every partition-count change appends a generation and nothing removes one, so the log of
a long-lived topic grows with its history. Generation ``f`` can become the log's first
once no record routed before it exists: every boundary of ``f`` lies at or below its
partition's log start (retention or DeleteRecords moved past it). Generations
``0 .. f-1`` and the changes into ``1 .. f`` are then folded; ``f`` keeps its boundaries.
A partition whose log start is not known stops the fold at the first generation that has
it. The current generation is never folded, and ``f`` only grows.

What each decision reads of the log, and why folding leaves it unchanged for every record
still there (at or above its partition's log start) and every record written later:

* **Routing** (``placement.place_record``) reads N and the current generation: kept.
* **generation_of** ``(p, o)`` is the newest generation whose boundary in ``p`` is at or
  below ``o``. For ``o >= log_start[p] >= boundary_f[p]`` that is ``f`` or a newer one,
  all kept; a partition that appeared after ``f`` has every boundary in kept ones.
* **Gate waits** (``gate.waits_into``, ``handoff.is_gated``, hence keys_assigned and
  the gate_opened evidence): the closure over every change ``<= g`` that moved keys into
  ``p``, and recursively what each source had reached before that change. It reaches
  back to the first change, so the folded changes cannot simply be dropped: ``compact``
  keeps ``waits_into(p, f)`` for every partition as the log's folded waits, and the gate
  starts from them where it would go on into a folded change. Every path of the closure
  from a kept generation leaves the kept changes at some ``(q, f)``, so a record's waits
  are exactly those of the full log. The folded ones are waits on records that are gone
  (their boundaries are at most ``boundary_f <= log start``): the gate finds them met by
  the log start for a group without a committed offset in the source, and by
  ``revoked_through`` for one with it (next point).
* **Hand-off** (``handoff.revocation_points`` and what reads them: ``revocations_due``,
  ``revoked_through``, ``revocations_crossed``, the release's rule 3e): the revocations
  of the kept changes are kept, and they include every one whose boundary lies above
  the log start. The folded changes' revocations are dropped, and one kind of group
  still needs them: one that read the source and committed there before retention
  removed the rest (the gate's "read, then removed" case). It holds state for the keys
  that moved and must still be told keys_revoked, and acknowledge it, before the
  destination's gate opens. So a change is folded only once no known group owes one of
  its revocations: every group with a committed offset in the source acknowledged it
  (``GroupHandoff``). Then ``revoked_through`` of every such source is unchanged, and so
  are the gate's decisions and the revocations due for that group. A group without a
  committed offset there never read it as far as the gate is concerned (its waits pass
  on the log start alone), and a group created later starts at or above the log start:
  the full log would tell them keys_revoked about records they never had, the compacted
  one does not.
* **Relocation tombstones** (``placement.relocation_sources``, compacted topics) list
  where older generations routed a key. A partition only folded generations routed it
  to holds none of its records any more (they lay below the log start), so the
  tombstone it no longer gets had nothing to delete.
* **Truncation checks** (``truncation.epochs_to_check``) ask about the kept boundaries;
  a folded one has no record above the log start to vouch for.

``compact`` is idempotent and composes (``compact(compact(log, a), b) == compact(log,
b)``): the folded waits are ``waits_into`` of the log, the same before and after. A log
whose log starts are all 0 (a compacted topic without retention) folds only changes
made while every boundary was 0, i.e. before any record was written.

Reading the log starts and the groups' progress, and replacing the stored log (the
folded generations' nodes and the folded waits in one multi-op, journaled like a
change) is the caller's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass

from sidecar.core.gate import waits_into
from sidecar.core.generations import FoldedWait, Generation, GenerationLog
from sidecar.core.handoff import revocation_points


@dataclass(frozen=True, slots=True)
class GroupHandoff:
    """What compaction must know of one consumer group known to the sidecars."""

    committed: Mapping[int, int]
    """The group's committed offset per partition of the topic (only which partitions
    have one matters: those the group read, as the gate sees it)."""
    acknowledged: Set[tuple[int, int]]
    """The (partition, generation) keys_revoked the group acknowledged."""


def foldable_count(
    log: GenerationLog, log_start: Mapping[int, int], *, groups: Iterable[GroupHandoff]
) -> int:
    """How many leading generations of ``log`` may be folded: the number of the oldest
    generation to keep, from ``log.first_number`` (nothing more) to the current one's.

    ``log_start``: each partition's log start offset; a partition missing from it is
    unknown, and a generation that has it is kept. ``groups``: every consumer group known
    to the sidecars. Generation ``f`` may be the first kept when every one of its
    boundaries is at or below its partition's log start, and no group owes a revocation
    of a change up to ``f``: with a committed offset in its partition, not acknowledged.
    """
    owing = [(group.committed.keys(), group.acknowledged) for group in groups]
    folded_revocations = _revocations_by_change(log)
    first = log.first_number
    for generation in log.generations[1:]:
        if not _records_gone_before(generation, log_start):
            break
        revoked = folded_revocations.get(generation.number, ())
        if any(
            partition in committed and (partition, generation.number) not in acknowledged
            for committed, acknowledged in owing
            for partition in revoked
        ):
            break
        first = generation.number
    return first


def compact(log: GenerationLog, first_number: int) -> GenerationLog:
    """``log`` with the generations before ``first_number`` folded (``log`` itself if
    they already are): generation ``first_number`` becomes the first, and the waits the
    folded changes impose on its records and later ones are kept (``FoldedWait``).

    Fold only as far as ``foldable_count`` allows: this checks only that the log has the
    generation. Raises ValueError if ``first_number`` is newer than the current one.
    """
    if first_number <= log.first_number:
        return log
    if first_number > log.current.number:
        raise ValueError(
            f"generation {first_number} is not committed: the current one is "
            f"{log.current.number}, and it is never folded"
        )
    base = log[first_number]
    folded_waits = [
        FoldedWait(partition, wait.source, wait.boundary, wait.generation, wait.kind)
        for partition in range(base.physical_count)
        for wait in waits_into(log, partition, first_number)
    ]
    folded = GenerationLog.after_fold(log.initial_count, base, folded_waits)
    # The kept generations follow one another as they did in ``log``, which checked each
    # when it was appended; appending them again one by one would copy the tuple each
    # time (seconds for a log of 10,000).
    kept = log.generations[first_number - log.first_number :]
    return GenerationLog(log.initial_count, kept, folded.folded_waits)


def _records_gone_before(generation: Generation, log_start: Mapping[int, int]) -> bool:
    """True if no record older than ``generation`` is left: each of its boundaries is
    at or below a known log start."""
    return all(
        partition in log_start and boundary.offset <= log_start[partition]
        for partition, boundary in enumerate(generation.boundaries)
    )


def _revocations_by_change(log: GenerationLog) -> dict[int, list[int]]:
    """Per change the log keeps, the partitions it moved keys away from at a boundary
    above 0 (a revocation at 0 is never told: nothing was there)."""
    by_change: dict[int, list[int]] = {}
    for partition in range(log.current.physical_count):
        for revocation in revocation_points(log, partition):
            if revocation.boundary > 0:
                by_change.setdefault(revocation.generation, []).append(partition)
    return by_change
