"""Sends audit events to the audit topic without ever holding up the app.

``emit`` puts the event in a bounded queue and returns at once; a background task
sends batches through the sidecar's Kafka gateway. A full queue drops the event and
counts it (``sidecar_audit_events_dropped_total``), so the audit can tell "no event"
from "event lost". Events are keyed by what they are about (topic/partition), so one
partition's events stay in order on one audit partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging

from sidecar.adapters.kafka import KafkaGateway, OutgoingKafkaRecord, SendFailed, TopicExists
from sidecar.audit.events import Event, stamped
from sidecar.config import AuditSettings
from sidecar.core.errors import SidecarError
from sidecar.core.routing import default_partition
from sidecar.metrics import SidecarMetrics

_log = logging.getLogger(__name__)


class AuditEmitter:
    def __init__(
        self,
        settings: AuditSettings,
        sidecar_id: str,
        kafka: KafkaGateway,
        metrics: SidecarMetrics,
        *,
        replication_factor: int = 3,
    ) -> None:
        self.settings = settings
        self.sidecar_id = sidecar_id
        self.kafka = kafka
        self.metrics = metrics
        self.replication_factor = replication_factor
        self._queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=settings.buffer_size)
        self._sequence = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._partitions = self.settings.partitions

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    async def start(self) -> None:
        if not self.enabled:
            return
        try:
            await self.kafka.create_topic(
                self.settings.topic,
                self.settings.partitions,
                min(3, self.replication_factor),
                compacted=False,
            )
            # Not asked back: a broker other than the one that answered the creation may
            # not list the new topic yet.
            self._partitions = self.settings.partitions
        except TopicExists:
            # Perhaps created by another sidecar starting beside this one, in which case
            # the broker asked may not list it yet (a sidecar of the demo stopped here).
            self._partitions = await self.kafka.existing_partition_count(self.settings.topic)
        self._task = asyncio.create_task(self._send_forever())

    async def stop(self) -> None:
        """Send what is queued (best effort), then stop."""
        if self._task is None:
            return
        await self._flush()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def emit(self, event: Event) -> None:
        if not self.enabled:
            return
        stamped_event = stamped(event, sidecar=self.sidecar_id, seq=next(self._sequence))
        try:
            self._queue.put_nowait(stamped_event)
        except asyncio.QueueFull:
            self.metrics.audit_dropped.inc()

    async def _send_forever(self) -> None:
        while True:
            first = await self._queue.get()
            await self._send([first, *self._drain(self.settings.batch_size - 1)])

    async def _flush(self) -> None:
        while not self._queue.empty():
            await self._send(self._drain(self.settings.batch_size))

    def _drain(self, limit: int) -> list[Event]:
        batch: list[Event] = []
        while len(batch) < limit and not self._queue.empty():
            batch.append(self._queue.get_nowait())
        return batch

    async def _send(self, batch: list[Event]) -> None:
        records = []
        for event in batch:
            routing_key = f"{event.get('topic', '')}/{event.get('partition', '')}".encode()
            records.append(
                OutgoingKafkaRecord(
                    default_partition(routing_key, self._partitions),
                    routing_key,
                    json.dumps(event, separators=(",", ":")).encode(),
                    [],
                )
            )
        try:
            outcomes = await self.kafka.send_batch(self.settings.topic, records)
        except SidecarError as exc:
            self.metrics.audit_dropped.inc(len(batch))
            _log.warning("audit batch of %d events lost: %s", len(batch), exc.message)
            return
        failed = sum(1 for outcome in outcomes if isinstance(outcome, SendFailed))
        self.metrics.audit_events.inc(len(batch) - failed)
        if failed:
            self.metrics.audit_dropped.inc(failed)
