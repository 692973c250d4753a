"""A managed topic as the sidecars share it: its config and its current metadata."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.generations import Generation, GenerationLog, PartitionMode
from sidecar.core.procedures import FINAL_PHASES, Operation


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """What is fixed when a topic becomes managed."""

    name: str
    initial_count: int
    """N: the partition count the topic was created (or adopted) with."""
    replication_factor: int
    compacted: bool = False
    ordered_delivery: bool = True
    """KIP-253's topic config: False skips gating and fencing."""


@dataclass(frozen=True, slots=True)
class PendingBarrier:
    """A generation published as pending by a coordinator and not yet committed."""

    generation: int
    target_count: int


def orphaned_barrier(pending: PendingBarrier | None, journal: Operation | None) -> int | None:
    """The generation of ``pending`` if no change owns it, else None.

    Only the driver of the journal's change publishes a barrier, and only its own
    (``journal.pending_generation`` to ``journal.target_count``); a barrier that is not
    that of an unfinished journal was left behind (a coordinator that lost its lock
    published it after a successor finished), and would refuse every later change.
    Ask only while holding the topic's lock: a change just started has its journal
    saved before it publishes, so between the two its barrier is owned.
    """
    if pending is None:
        return None
    if journal is None or journal.phase in FINAL_PHASES:
        return pending.generation
    owned = PendingBarrier(journal.pending_generation, journal.target_count)
    return None if pending == owned else pending.generation


@dataclass(frozen=True, slots=True)
class TopicState:
    """Everything a sidecar reads about one managed topic, at one moment."""

    config: TopicConfig
    log: GenerationLog
    modes: tuple[PartitionMode, ...]
    delete_after: tuple[float | None, ...] = ()
    """Per partition: wall-clock time after which a read-only partition is removed."""
    pending: PendingBarrier | None = None
    operation: Operation | None = None

    @property
    def current(self) -> Generation:
        return self.log.current
