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
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=settings.buffer_size)
        """Events to send; None tells the sending task to stop."""
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
        """Send what is queued (best effort), then stop.

        The sending task itself sends what was emitted before this call and then ends:
        cancelling it could cut a batch off half sent, counted neither sent nor dropped.
        """
        task, self._task = self._task, None
        if task is None:
            return
        if not task.done():
            await self._queue.put(None)  # waits for room: the task keeps draining
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def emit(self, event: Event) -> None:
        if not self.enabled:
            return
        stamped_event = stamped(event, sidecar=self.sidecar_id, seq=next(self._sequence))
        try:
            self._queue.put_nowait(stamped_event)
        except asyncio.QueueFull:
            self.metrics.audit_dropped.inc()

    async def _send_forever(self) -> None:
        stopping = False
        while not stopping:
            batch: list[Event] = []
            item = await self._queue.get()
            while item is not None:
                batch.append(item)
                if len(batch) >= self.settings.batch_size or self._queue.empty():
                    break
                item = self._queue.get_nowait()
            stopping = item is None
            if not batch:
                continue
            try:
                await self._send(batch)
            except Exception:  # the audit outlives any failure of a send
                self.metrics.audit_dropped.inc(len(batch))
                _log.exception("audit batch of %d events lost", len(batch))

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
