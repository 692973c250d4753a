"""Boundaries checked against log truncation before a topic changes (KIP-320).

At start, before each partition-count change and each retirement round, every boundary of the
topic's generation log that carries a leader epoch is checked with OffsetForLeaderEpoch
(``sidecar.core.truncation``). A boundary the log no longer reaches means an unclean
leader election truncated acknowledged records below it: the change or retirement is
refused (``BoundaryTruncated``, 409); the number of such boundaries is the gauge
``sidecar_truncated_boundaries``, and each one is logged and sent as a
``boundary_truncated`` audit event the first time this sidecar finds it. The check is
made again on every attempt, so the refusal stands for as long as the boundary is lost,
until an operator confirms the loss (``confirm``, ``sidecar topics confirm-truncation``):
the confirmed boundaries are kept in ZooKeeper and no longer refuse anything.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from sidecar.audit import events as audit_events
from sidecar.audit.emitter import AuditEmitter
from sidecar.core.errors import BoundaryTruncated, NoTruncationToConfirm, SidecarError
from sidecar.core.generations import GenerationLog
from sidecar.core.truncation import (
    TruncatedBoundary,
    confirmed_loss,
    epochs_to_check,
    truncated_boundaries,
    unconfirmed,
)
from sidecar.metrics import SidecarMetrics
from sidecar.service.change_ports import EpochEnds, TruncationStore

_log = logging.getLogger(__name__)


class BoundaryCheck:
    def __init__(
        self,
        kafka: EpochEnds,
        store: TruncationStore,
        metrics: SidecarMetrics,
        audit: AuditEmitter | None = None,
    ) -> None:
        self.kafka = kafka
        self.store = store
        self.metrics = metrics
        self.audit = audit
        self._reported: set[tuple[str, TruncatedBoundary]] = set()
        """What was logged and audited already: a retirement round repeats the check."""

    async def truncated(self, topic: str, log: GenerationLog) -> list[TruncatedBoundary]:
        """The boundaries of ``log`` that ``topic``'s partitions no longer reach.

        Raises KafkaUnavailable, KafkaFailure.
        """
        ends: dict[tuple[int, int], int | None] = {}
        for asked in epochs_to_check(log):
            answered = await self.kafka.epoch_end_offsets(topic, asked)
            for partition, epoch in asked.items():
                end = answered.get(partition)
                ends[(partition, epoch)] = None if end is None else end.offset
        return truncated_boundaries(log, ends)

    async def require_intact(self, topic: str, log: GenerationLog, before: str) -> None:
        """Raise BoundaryTruncated if a boundary of ``log`` was lost; ``before`` names
        what is refused. Raises KafkaUnavailable, KafkaFailure, MetadataUnavailable too."""
        found = await self.lost(topic, log)
        if not found:
            return
        where = ", ".join(
            f"partition {lost.partition} (generation {lost.generation}, boundary "
            f"{lost.offset}, log reaches {'?' if lost.log_end is None else lost.log_end})"
            for lost in found
        )
        raise BoundaryTruncated(
            f"{before} of {topic} refused: an unclean leader election truncated the log "
            f"below boundaries of {where}"
        )

    async def lost(self, topic: str, log: GenerationLog) -> list[TruncatedBoundary]:
        """The boundaries of ``log`` lost and not confirmed, each logged and audited the
        first time this sidecar finds it; the gauge is set to their number. Raises
        KafkaUnavailable, KafkaFailure, MetadataUnavailable."""
        found = await self.truncated(topic, log)
        if found:
            found = unconfirmed(found, await self.store.confirmed_truncations(topic))
        label = self.metrics.topic_label(topic, exists=True)
        self.metrics.truncated_boundaries.labels(label).set(len(found))
        for lost in found:
            if (topic, lost) in self._reported:
                continue
            self._reported.add((topic, lost))
            _log.error(
                "%s[%d]: boundary %d of generation %d (leader epoch %d) is lost: that epoch "
                "ends at %s on the current leader",
                topic,
                lost.partition,
                lost.offset,
                lost.generation,
                lost.leader_epoch,
                "an unknown offset" if lost.log_end is None else lost.log_end,
            )
            if self.audit is not None:
                self.audit.emit(
                    audit_events.boundary_truncated(
                        topic=topic,
                        generation=lost.generation,
                        partition=lost.partition,
                        boundary=lost.offset,
                        leader_epoch=lost.leader_epoch,
                        log_end=lost.log_end,
                    )
                )
        return found

    async def report_lost(self, logs: Mapping[str, GenerationLog]) -> dict[str, int | None]:
        """Check every topic of ``logs`` (at start: a truncation that happened while no
        sidecar ran is reported then, not at the next change). Per topic, the number of
        unconfirmed lost boundaries, each logged, audited and counted in the gauge as
        ``require_intact`` does; None where the check could not be made (Kafka or
        ZooKeeper away: the next change checks again). Raises nothing."""
        found: dict[str, int | None] = {}
        for topic, log in logs.items():
            try:
                found[topic] = len(await self.lost(topic, log))
            except SidecarError as exc:
                _log.info("boundaries of %s not checked at start: %s", topic, exc.message)
                found[topic] = None
        return found

    async def confirm(self, topic: str) -> list[TruncatedBoundary]:
        """An operator accepts the loss of ``topic``'s lost boundaries: they are recorded
        as confirmed, and the topic's changes and retirements go on. Returns them.

        Raises UnknownTopic, NoTruncationToConfirm (nothing lost, or every loss confirmed
        already: nothing is written), KafkaUnavailable, KafkaFailure, MetadataUnavailable.
        """
        state = await self.store.read_topic(topic)
        found = await self.truncated(topic, state.log)
        if found:
            found = unconfirmed(found, await self.store.confirmed_truncations(topic))
        if not found:
            raise NoTruncationToConfirm(
                f"no lost boundary of {topic} awaits confirmation: every boundary its "
                "partitions' logs were checked against is intact or confirmed already"
            )
        await self.store.confirm_truncations(topic, [confirmed_loss(lost) for lost in found])
        self.metrics.truncated_boundaries.labels(self.metrics.topic_label(topic, exists=True)).set(
            0
        )
        _log.warning(
            "%s: an operator confirmed the loss of %d boundaries: %s",
            topic,
            len(found),
            ", ".join(f"partition {lost.partition} generation {lost.generation}" for lost in found),
        )
        if self.audit is not None:
            self.audit.emit(
                audit_events.truncation_confirmed(
                    topic=topic,
                    boundaries=[
                        {
                            "generation": lost.generation,
                            "partition": lost.partition,
                            "boundary": lost.offset,
                            "leader_epoch": lost.leader_epoch,
                            "log_end": lost.log_end,
                        }
                        for lost in found
                    ],
                )
            )
        return found
