"""Every sidecar's side of a partition-count change (DESIGN §5): the participant, a pure
state machine per managed topic; the coordinator's is ``sidecar.core.procedures``.

The participant decides whether a produce may be routed now, with which generation, and
when the sidecar may ack a barrier: only when every send made under the old generation
is known to have landed or known not to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from sidecar.core.errors import (
    FencedGeneration,
    MetadataUnavailable,
    UnknownGeneration,
)
from sidecar.core.generations import Generation


class SessionState(StrEnum):
    """The sidecar's ZooKeeper session as kazoo reports it."""

    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"


class Admission(StrEnum):
    ROUTE = "route"
    """Route and send now under the participant's generation."""
    HOLD = "hold"
    """Wait: a barrier is pending or the metadata is being re-read."""


@dataclass(frozen=True, slots=True)
class Participant:
    """One sidecar's view of one managed topic, for producing.

    ``in_flight`` counts sends made under ``generation`` whose outcome is not known
    yet; ``uncertain`` holds the ids of sends that failed or timed out, which the
    broker may still have appended. ``acked_next`` is, per partition, one past the
    highest offset acknowledged under ``generation``.
    """

    generation: int
    undeleted_count: int
    session: SessionState = SessionState.CONNECTED
    metadata_fresh: bool = True
    pending_generation: int | None = None
    in_flight: int = 0
    uncertain: frozenset[int] = frozenset()
    acked_next: Mapping[int, int] = field(default_factory=dict)
    barrier_acked: bool = False

    def admission(self) -> Admission:
        """Whether a new produce may be routed now."""
        if self.session is not SessionState.CONNECTED or not self.metadata_fresh:
            return Admission.HOLD
        if self.pending_generation is not None:
            return Admission.HOLD
        return Admission.ROUTE

    def check_expected(self, expected_generation: int | None, expected_count: int | None) -> None:
        """Fence a produce that names a generation or count (KIP-253 ``undeleted_partition_count``).

        Raises FencedGeneration (older generation, or another count) or
        UnknownGeneration (newer than this sidecar knows); MetadataUnavailable if the
        session is not connected.
        """
        if self.session is not SessionState.CONNECTED:
            raise MetadataUnavailable()
        if expected_generation is not None:
            if expected_generation < self.generation:
                raise FencedGeneration(
                    f"generation {expected_generation} is older than the current {self.generation}",
                    current_generation=self.generation,
                    current_count=self.undeleted_count,
                )
            if expected_generation > self.generation:
                raise UnknownGeneration(
                    f"generation {expected_generation} is newer than {self.generation}"
                )
        if expected_count is not None and expected_count != self.undeleted_count:
            raise FencedGeneration(
                f"partition count {expected_count} is not the current {self.undeleted_count}",
                current_generation=self.generation,
                current_count=self.undeleted_count,
            )

    def send_started(self, count: int = 1) -> Participant:
        """Record ``count`` sends routed under ``generation``. Raises if not admitted."""
        if self.admission() is not Admission.ROUTE:
            raise RuntimeError("send started while the participant holds produces")
        return replace(self, in_flight=self.in_flight + count)

    def send_acknowledged(self, partition: int, offset: int) -> Participant:
        return self.sends_acknowledged({partition: offset}, 1)

    def sends_acknowledged(self, highest: Mapping[int, int], count: int) -> Participant:
        """``count`` sends acknowledged; ``highest`` is the highest offset per partition."""
        acked = dict(self.acked_next)
        for partition, offset in highest.items():
            acked[partition] = max(acked.get(partition, 0), offset + 1)
        return replace(self, in_flight=self.in_flight - count, acked_next=acked)

    def send_failed(self, send_id: int, *, maybe_appended: bool) -> Participant:
        """A send failed; if the broker may still have appended it, it stays uncertain."""
        uncertain = self.uncertain | {send_id} if maybe_appended else self.uncertain
        return replace(self, in_flight=self.in_flight - 1, uncertain=uncertain)

    def uncertain_resolved(self, send_id: int, landed_at: tuple[int, int] | None) -> Participant:
        """An uncertain send was found in the log at ``(partition, offset)``, or proven absent."""
        resolved = replace(self, uncertain=self.uncertain - {send_id})
        if landed_at is None:
            return resolved
        partition, offset = landed_at
        acked = dict(resolved.acked_next)
        acked[partition] = max(acked.get(partition, 0), offset + 1)
        return replace(resolved, acked_next=acked)

    def barrier_published(self, pending_generation: int) -> Participant:
        """A coordinator published generation ``pending_generation``: hold new produces."""
        if pending_generation <= self.generation:
            return self  # a stale notification of a barrier already passed
        return replace(self, pending_generation=pending_generation, barrier_acked=False)

    def ready_to_ack(self) -> bool:
        """True when the pending barrier may be acked: no send of the old generation unsettled."""
        return (
            self.pending_generation is not None
            and not self.barrier_acked
            and self.in_flight == 0
            and not self.uncertain
            and self.session is SessionState.CONNECTED
        )

    def barrier_ack(self) -> tuple[Participant, dict[int, int]]:
        """Mark the barrier acked and return the acked offsets to publish with the ack."""
        if not self.ready_to_ack():
            raise RuntimeError("barrier acked with sends still unsettled")
        return replace(self, barrier_acked=True), dict(self.acked_next)

    def generation_committed(self, generation: Generation) -> Participant:
        """Route with the committed generation from now on."""
        if generation.number <= self.generation:
            return self
        return replace(
            self,
            generation=generation.number,
            undeleted_count=generation.undeleted_count,
            pending_generation=None,
            barrier_acked=False,
            acked_next={},
        )

    def producer_replaced(self) -> Participant:
        """The sidecar's transactional producer was fenced and is being replaced under a
        new registration: hold until the metadata has been re-read after it."""
        return replace(self, metadata_fresh=False)

    def barrier_removed(self) -> Participant:
        """The change was rolled back: resume routing with the current generation."""
        return replace(self, pending_generation=None, barrier_acked=False)

    def session_changed(self, session: SessionState) -> Participant:
        """Suspended or lost: hold. Reconnected: still hold until the metadata is re-read."""
        if session is SessionState.CONNECTED:
            return replace(self, session=session)
        return replace(self, session=session, metadata_fresh=False)

    def metadata_reloaded(
        self, generation: Generation, pending_generation: int | None
    ) -> Participant:
        """Fresh metadata read after (re)connecting."""
        updated = self.generation_committed(generation)
        if pending_generation is not None and pending_generation <= updated.generation:
            pending_generation = None
        if pending_generation != updated.pending_generation:
            updated = replace(updated, pending_generation=pending_generation, barrier_acked=False)
        return replace(updated, metadata_fresh=True)
