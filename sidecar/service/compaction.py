"""Compacting a topic's generation log (DESIGN §4, docs/compaction.md): one pass.

Under the topic's change lock (so no change runs meanwhile and one sidecar compacts at
a time), a pass reads the log, each partition's log start (ListOffsets earliest) and
every known consumer group's hand-off progress (its committed offsets, the keys_revoked
it acknowledged), asks the core how far the log may be folded
(``core.compaction.foldable_count``), and writes the folded log
(``MetadataStore.compact_log``), at most ``batch`` generations per ZooKeeper multi-op.

What is read is only ever a safe under-estimate by the time it is written: log starts
and acknowledgements only grow, and the log itself is the one the write is conditional
on. A pass that dies anywhere leaves the stored log as it was or compacted by whole
multi-ops, each a valid log; the next pass (of any sidecar) goes on from there.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from sidecar.core.compaction import GroupHandoff, compact, foldable_count
from sidecar.core.generations import GenerationLog
from sidecar.core.procedures import FINAL_PHASES
from sidecar.core.topics import TopicState
from sidecar.faults import FaultHooks
from sidecar.metrics import SidecarMetrics

_log = logging.getLogger(__name__)


class CompactionStore(Protocol):
    """What a compaction needs of ZooKeeper: the topic, its lock, the groups' hand-off
    acknowledgements, and the write of the folded log."""

    def lock(
        self, topic: str, owner: str, timeout: float, purpose: str = "change"
    ) -> AbstractAsyncContextManager[None]: ...

    async def read_topic(self, topic: str) -> TopicState: ...

    async def known_groups(self) -> list[str]: ...

    async def acknowledged_revocations(self, group: str, topic: str) -> set[tuple[int, int]]: ...

    async def compact_log(
        self, topic: str, log: GenerationLog, compacted: GenerationLog
    ) -> int: ...


class CompactionOffsets(Protocol):
    """What a compaction needs of Kafka: log starts and the groups' committed offsets."""

    async def log_start_offsets(self, topic: str, count: int) -> list[int]: ...

    async def committed_offsets(self, group: str, topic: str, count: int) -> dict[int, int]: ...


@dataclass(frozen=True, slots=True)
class Compaction:
    """What one pass did: how many generations it folded, and the log it left."""

    folded: int
    first_generation: int
    """The first generation the stored log keeps now (0: never compacted)."""
    current_generation: int


class Compactor:
    """Compacts one topic's generation log at a time, as far as its records are gone."""

    def __init__(
        self,
        sidecar_id: str,
        store: CompactionStore,
        kafka: CompactionOffsets,
        metrics: SidecarMetrics,
        *,
        batch: int = 1000,
        lock_timeout_s: float = 0.5,
        faults: FaultHooks | None = None,
    ) -> None:
        if batch < 1:
            raise ValueError(f"a compaction folds at least one generation, not {batch}")
        self.sidecar_id = sidecar_id
        self.store = store
        self.kafka = kafka
        self.metrics = metrics
        self.batch = batch
        self.lock_timeout_s = lock_timeout_s
        self.faults = faults or FaultHooks()

    async def compact(
        self,
        topic: str,
        *,
        lock_timeout_s: float | None = None,
        seen: TopicState | None = None,
    ) -> Compaction:
        """One pass over ``topic``: what it folded (nothing if nothing could be, or a
        change is in progress). ``lock_timeout_s``: how long to wait for the topic's
        lock (the compactor's own timeout unless given).

        ``seen``: the topic as this sidecar last read it (housekeeping's periodic pass).
        The pass then asks Kafka and ZooKeeper first, without the lock, whether that
        log could be folded at all, and takes the lock only if it could. Taking the lock
        wakes every sidecar's journal watch (``watch_journal``): a pass of each of N
        sidecars per interval would otherwise cost the fleet N x N wake-ups and reads
        per topic and interval, for a fold that happens only when retention moved past
        a boundary. A stale ``seen`` is harmless: it delays a fold to a later pass, or
        the locked pass reads again and decides from the stored log.

        Raises SidecarError subclasses (OperationInProgress while another sidecar holds
        the topic's lock or the log changed under the write, MetadataUnavailable,
        KafkaUnavailable, UnknownTopic): the caller tries again at its next pass. What
        was folded before such an error stays folded.
        """
        wait_s = self.lock_timeout_s if lock_timeout_s is None else lock_timeout_s
        if seen is not None and not await self._may_fold(topic, seen):
            log = seen.log
            return Compaction(0, log.first_number, log.current.number)
        async with self.store.lock(topic, self.sidecar_id, wait_s, "compaction"):
            state = await self.store.read_topic(topic)
            log = state.log
            unchanged = Compaction(0, log.first_number, log.current.number)
            if state.operation is not None and state.operation.phase not in FINAL_PHASES:
                return unchanged  # a change in progress: its coordinator goes first
            if len(log.generations) == 1:
                return unchanged  # only the current generation: never folded
            first = await self._foldable(topic, log, len(state.modes))
            folded = 0
            if log.first_number < first:
                self.faults.before_compaction_write(topic)
            while log.first_number < first:
                # Folded from the log as read, whose waits are computed once for every
                # batch (``compact`` composes: the same log as folding the last batch).
                compacted = compact(state.log, min(first, log.first_number + self.batch))
                await self.store.compact_log(topic, log, compacted)
                count = compacted.first_number - log.first_number
                folded += count
                self.metrics.generations_folded.labels(topic).inc(count)
                log = compacted
            if folded:
                _log.info(
                    "%s: folded %d generations of its log; it begins at %d now",
                    topic,
                    folded,
                    log.first_number,
                )
            return Compaction(folded, log.first_number, log.current.number)

    async def _may_fold(self, topic: str, seen: TopicState) -> bool:
        """Whether a locked pass over ``seen`` could fold anything (no lock taken). The
        journal is left to the locked pass: the topic as last read may show the phase a
        change had at its commit, not the end written after it."""
        if len(seen.log.generations) == 1:
            return False
        first = await self._foldable(topic, seen.log, len(seen.modes))
        return seen.log.first_number < first

    async def _foldable(self, topic: str, log: GenerationLog, count: int) -> int:
        """The number of the first generation the log may keep (``foldable_count``),
        from what Kafka and ZooKeeper say now."""
        starts = await self.kafka.log_start_offsets(topic, count)
        groups = await self._groups(topic, count, await self.store.known_groups())
        return foldable_count(log, dict(enumerate(starts)), groups=groups)

    async def _groups(self, topic: str, count: int, names: Sequence[str]) -> list[GroupHandoff]:
        groups = []
        for name in names:
            committed = await self.kafka.committed_offsets(name, topic, count)
            acknowledged = await self.store.acknowledged_revocations(name, topic)
            groups.append(GroupHandoff(committed, frozenset(acknowledged)))
        return groups
