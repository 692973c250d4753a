"""The warmer of the partitions a change adds: one replicated write to each, in a
Kafka transaction that is then aborted, before the change's barrier holds any produce.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from aiokafka.errors import KafkaError

from sidecar.adapters.kafka import await_partition_count, start_transactional_producer
from sidecar.adapters.transactions import close_transactional_producer
from sidecar.config import KafkaSettings
from sidecar.core.errors import SidecarError
from sidecar.core.placement import WARM_HEADER

_log = logging.getLogger(__name__)

WARM_MARK: tuple[str, bytes] = (WARM_HEADER, b"1")
WARM_KEY = b""
"""The warm-up record's key: a compacted topic refuses a record without one (Kafka
answers CorruptRecordException, which aiokafka reports as UnknownError), and an empty
key is a key."""


class PartitionWarmer:
    """Gives each partition a change adds one replicated write before the change's
    barrier holds any produce, in a transaction that is then aborted.

    A new partition's first ``acks=all`` write waits until its followers have started
    fetching it: 300-400 ms on the idle dev cluster, about a second under load
    (bench/README.md). Without this, the first requests after an expansion's commit paid
    it, on top of the barrier's hold. The records are aborted, so no consumer the
    sidecar runs (all read committed) nor any other read-committed reader ever sees
    them; a read-uncommitted reader sees a record with an empty key and value and the
    ``ordered.warm`` header. They sit below the new partitions' first boundaries, where
    nothing is gated.

    Best effort: a warm-up that fails or outlasts ``within_s`` is logged, its transaction
    aborted at once (``_abort_left_open``), and the change goes on (its first writes
    then wait as before). One transaction at a time, under a
    transactional id of the coordinating sidecar's own that no lane uses.
    """

    def __init__(self, settings: KafkaSettings, transactional_id: str, within_s: float) -> None:
        self.transactional_id = transactional_id
        self.within_s = within_s
        self._settings = settings
        self._producer: Any = None
        self._lock = asyncio.Lock()

    async def warm(self, topic: str, partitions: Sequence[int]) -> bool:
        """Write to and abort in each of ``partitions``; True if they all took the write
        within ``within_s``. Never raises for Kafka's failures."""
        if not partitions or self.within_s <= 0:
            return False
        began = asyncio.get_running_loop().time()
        async with self._lock:
            try:
                async with asyncio.timeout(self.within_s):
                    await self._write_and_abort(topic, partitions)
            except (SidecarError, KafkaError, OSError, TimeoutError) as exc:
                reason = exc.message if isinstance(exc, SidecarError) else repr(exc)
                _log.info("warming partitions %s of %s: %s", list(partitions), topic, reason)
                await self._abort_left_open(topic)
                return False
        took = asyncio.get_running_loop().time() - began
        _log.info("warmed partitions %s of %s in %.0f ms", list(partitions), topic, 1000 * took)
        return True

    async def _write_and_abort(self, topic: str, partitions: Sequence[int]) -> None:
        if self._producer is None:
            self._producer = await start_transactional_producer(
                self._settings, self.transactional_id
            )
        producer = self._producer
        await await_partition_count(
            producer.client,
            topic,
            max(partitions) + 1,
            self.within_s,
            backoff_s=self._settings.retry_backoff_s,
        )
        await producer.begin_transaction()
        deliveries = [
            await producer.send(
                topic, key=WARM_KEY, value=b"", partition=partition, headers=[WARM_MARK]
            )
            for partition in partitions
        ]
        failure = next(
            (
                outcome
                for outcome in await asyncio.gather(*deliveries, return_exceptions=True)
                if isinstance(outcome, BaseException)
            ),
            None,
        )
        if failure is not None:
            raise failure  # the producer is dropped, which aborts the transaction
        await producer.abort_transaction()

    async def _abort_left_open(self, topic: str) -> None:
        """End the transaction a failed warm-up may have left open, at once.

        Left open, it would hold the last stable offset of every partition it wrote to
        at its record until the coordinator's transaction timeout: read-committed
        consumers stop there, retirement would take such a partition for empty, and a
        change reading boundaries would have to wait. The producer in doubt is dropped
        (its pending batches sent or given up) and the id initialised anew, which aborts
        whatever the old epoch left open and fences its late writes. Failing that (the
        coordinator away too), the next warm-up's initialisation or the transaction
        timeout ends it."""
        await self._drop_producer()
        try:
            # Bounded by the request timeout (start_transactional_producer's own).
            self._producer = await start_transactional_producer(
                self._settings, self.transactional_id
            )
        except (SidecarError, KafkaError, OSError, TimeoutError) as exc:
            reason = exc.message if isinstance(exc, SidecarError) else repr(exc)
            _log.warning(
                "the failed warm-up of %s may have left its transaction open until the "
                "transaction timeout: %s",
                topic,
                reason,
            )

    async def stop(self) -> None:
        async with self._lock:
            await self._drop_producer()

    async def _drop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await close_transactional_producer(
                producer, self._settings.request_timeout_ms / 1000, self.transactional_id
            )
