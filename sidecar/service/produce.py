"""The produce service: writing a produce request's records to Kafka.

A produce to a managed topic is held (never failed) while its topic's participant does
not admit routing (a barrier pending, the ZooKeeper session not connected, the writer
being replaced); the hold ends when the generation commits, the barrier is removed, or
``produce.hold_timeout_s`` passes (then 503, retriable). Admitted records are placed by
the core (``sidecar.core.placement``), with a relocation tombstone in a key's old
partition the first time it moves, and written in one transaction by the registry's
writer. The topic registry (``sidecar.service.registry``) keeps the runtimes, the
participants and the writer; this module only reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.adapters.kafka import OutgoingKafkaRecord, SendFailed, SentRecord
from sidecar.adapters.transactions import Outcome, WriteResult
from sidecar.audit import events as audit_events
from sidecar.audit.events import key_sampled
from sidecar.config import Settings
from sidecar.core.errors import (
    FencedGeneration,
    InvalidGeneration,
    KafkaAuthenticationFailed,
    KafkaFailure,
    KafkaNotAuthorized,
    KafkaUnavailable,
    ProduceHoldTimeout,
    ShuttingDown,
    SidecarError,
    UnknownGeneration,
    UnknownPartition,
)
from sidecar.core.participant import Admission, Participant, SessionState
from sidecar.core.placement import (
    RELOCATION_HEADER,
    HeaderFormat,
    place_record,
    relocation_sources,
    require_key_for_tombstone,
    sidecar_headers,
)
from sidecar.core.produce import ProduceRequest, ProduceResult, RecordFailed, RecordWritten
from sidecar.core.routing import default_partition
from sidecar.metrics import SidecarMetrics
from sidecar.service.registry import TopicRegistry, TopicRuntime
from sidecar.service.topic_ports import ProduceKafka

_log = logging.getLogger(__name__)


@dataclass
class ProduceOutcome:
    """What a produce request did, for the HTTP answer."""

    results: list[ProduceResult]
    generation: int | None
    partition_count: int | None


class ProduceService:
    def __init__(
        self,
        settings: Settings,
        registry: TopicRegistry,
        kafka: ProduceKafka,
        metrics: SidecarMetrics,
    ) -> None:
        self.settings = settings
        self.header_format = HeaderFormat(settings.produce.header_format)
        self.sidecar_id = settings.sidecar_id
        self.registry = registry
        self.kafka = kafka
        self.metrics = metrics
        self._sequence = itertools.count()
        self._unkeyed = itertools.count()
        self._tombstones_sent: OrderedDict[tuple[bytes, str, int, int], None] = OrderedDict()

    async def produce(
        self,
        topic: str,
        request: ProduceRequest,
        partition: int | None = None,
        *,
        on_sent: Callable[[], None] | None = None,
    ) -> ProduceOutcome:
        """Write ``request``'s records (to ``partition`` if the URL names one).

        ``on_sent`` is called (synchronously; it must only schedule) once a managed
        topic's records are placed and queued for the writer, in order, before they are
        acknowledged: a caller that keeps several requests' records in one order may
        send the next then (a REST Proxy v3 stream). Unmanaged topics never call it.

        Raises SidecarError for what fails the whole request (fenced, held too long,
        unknown topic); a record that fails alone gets a RecordFailed entry.
        """
        if self.registry.stopping:
            raise ShuttingDown()
        runtime = await self.registry.runtime(topic)
        if runtime is None:
            return await self._produce_unmanaged(topic, request, partition)
        await self._wait_until_admitted(runtime)
        await self._check_expected(runtime, request)
        return await self._produce_managed(runtime, request, partition, on_sent)

    async def _wait_until_admitted(self, runtime: TopicRuntime) -> None:
        if runtime.participant.admission() is Admission.ROUTE:
            return
        held = self.metrics.held_requests.labels(runtime.name)
        held.inc()
        began = time.monotonic()
        deadline = began + self.settings.produce.hold_timeout_s
        try:
            while runtime.participant.admission() is not Admission.ROUTE:
                if self.registry.stopping:
                    raise ShuttingDown()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ProduceHoldTimeout(
                        f"held {self.settings.produce.hold_timeout_s:.0f} s: "
                        + _hold_reason(runtime.participant)
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(runtime.changed.wait(), remaining)
        finally:
            held.dec()
            self.metrics.hold_seconds.labels(runtime.name).observe(time.monotonic() - began)

    async def _check_expected(self, runtime: TopicRuntime, request: ProduceRequest) -> None:
        if not runtime.state.config.ordered_delivery:
            return
        try:
            runtime.participant.check_expected(request.expected_generation, request.expected_count)
        except FencedGeneration:
            self.metrics.fenced.labels(runtime.name).inc()
            raise
        except UnknownGeneration:
            self.metrics.unknown_generation.labels(runtime.name).inc()
            # The app has seen a newer generation than this sidecar: re-read now.
            self.registry.spawn(self.registry.refresh(runtime))
            await self._refuse_a_generation_that_does_not_exist(runtime, request)
            raise

    async def _refuse_a_generation_that_does_not_exist(
        self, runtime: TopicRuntime, request: ProduceRequest
    ) -> None:
        """Raise InvalidGeneration (409) if the expected generation is newer than any in
        ZooKeeper, committed or pending; return if it exists, or if ZooKeeper cannot say
        (then the retriable "unknown generation" stands)."""
        expected = request.expected_generation
        if expected is None:
            return
        try:
            state = await self.registry.store.read_topic(runtime.name)
        except SidecarError:
            return
        newest = max(state.current.number, state.pending.generation if state.pending else 0)
        if expected > newest:
            raise InvalidGeneration(
                f"generation {expected} of {runtime.name} does not exist; the current one is "
                f"{state.current.number}",
                current_generation=state.current.number,
                current_count=state.current.undeleted_count,
            )

    async def _produce_managed(
        self,
        runtime: TopicRuntime,
        request: ProduceRequest,
        partition: int | None,
        on_sent: Callable[[], None] | None = None,
    ) -> ProduceOutcome:
        # Everything from here to the sends is synchronous: the participant that
        # admitted the request is the one that counts its sends in flight.
        state = runtime.state
        generation = state.current
        results: list[ProduceResult | None] = [None] * len(request.records)
        outgoing: list[OutgoingKafkaRecord] = []
        owners: list[int | None] = []  # request index of each outgoing record, None: tombstone
        # The stamp's sequence of each outgoing record, kept rather than parsed back
        # from its headers for the audit and for failed sends.
        sequences: list[int] = []
        for index, record in enumerate(request.records):
            try:
                require_key_for_tombstone(record.key, record.value, index)
                target = place_record(
                    log=state.log,
                    modes=state.modes,
                    key=record.key,
                    explicit_partition=partition if partition is not None else record.partition,
                    unkeyed_index=next(self._unkeyed),
                )
            except SidecarError as exc:
                results[index] = RecordFailed.from_error(exc)
                continue
            if state.config.compacted and record.key is not None:
                for source in relocation_sources(
                    log=state.log, modes=state.modes, key=record.key, partition=target
                ):
                    if self._first_tombstone(record.key, runtime.name, source, generation.number):
                        sequence = next(self._sequence)
                        outgoing.append(self._tombstone(runtime, source, record.key, sequence))
                        owners.append(None)
                        sequences.append(sequence)
            sequence = next(self._sequence)
            headers = [
                *record.headers,
                *sidecar_headers(
                    generation.number,
                    generation.undeleted_count,
                    self.sidecar_id,
                    sequence,
                    self.header_format,
                ),
            ]
            outgoing.append(
                OutgoingKafkaRecord(target, record.key, record.value, headers, record.timestamp_ms)
            )
            owners.append(index)
            sequences.append(sequence)
        if outgoing:
            runtime.participant = runtime.participant.send_started(len(outgoing))
        if on_sent is not None:
            # What it schedules runs after _write has queued these records: nothing
            # between here and the writer's queue suspends.
            on_sent()
        written = await self._write(runtime.name, outgoing)
        sent = written.outcomes
        self._settle_batch(runtime, sequences, written)
        audited = self.registry.audit.enabled
        for sent_record, owner, sequence, outcome in zip(
            outgoing, owners, sequences, sent, strict=True
        ):
            if owner is None:
                if isinstance(outcome, SentRecord):
                    self.metrics.relocation_tombstones.labels(runtime.name).inc()
                continue
            results[owner] = _result(outcome)
            if (
                audited
                and isinstance(outcome, SentRecord)
                and key_sampled(sent_record.key, self.settings.audit.sample_rate)
            ):
                self.registry.audit.emit(
                    audit_events.produce_acked(
                        topic=runtime.name,
                        partition=outcome.partition,
                        offset=outcome.offset,
                        key=sent_record.key,
                        generation=generation.number,
                        count=generation.undeleted_count,
                        producer=self.sidecar_id,
                        producer_seq=sequence,
                    )
                )
        await self.registry.maybe_ack_barrier(runtime)
        refusal = _identity_refusal(sent)
        if refusal is not None:
            # Nothing of the request was appended, and nothing of it can be until an
            # operator fixes kafka.security: the request fails as a whole (503).
            raise refusal
        return ProduceOutcome(
            [r for r in results if r is not None], generation.number, generation.undeleted_count
        )

    def _tombstone(
        self, runtime: TopicRuntime, partition: int, key: bytes, sequence: int
    ) -> OutgoingKafkaRecord:
        generation = runtime.state.current
        headers = [
            *sidecar_headers(
                generation.number,
                generation.undeleted_count,
                self.sidecar_id,
                sequence,
                self.header_format,
            ),
            (RELOCATION_HEADER, b"1"),
        ]
        return OutgoingKafkaRecord(partition, key, None, headers)

    def _first_tombstone(self, key: bytes, topic: str, source: int, generation: int) -> bool:
        """True the first time (within the bounded cache) for this key, source, generation."""
        entry = (key, topic, source, generation)
        if entry in self._tombstones_sent:
            self._tombstones_sent.move_to_end(entry)
            return False
        self._tombstones_sent[entry] = None
        if len(self._tombstones_sent) > self.settings.produce.tombstone_cache_size:
            self._tombstones_sent.popitem(last=False)
        return True

    async def _write(self, topic: str, records: list[OutgoingKafkaRecord]) -> WriteResult:
        writer = self.registry.writer
        if writer is None:
            # Replaced since the request was admitted (a lost session, a fence).
            loop = asyncio.get_running_loop()
            failed: list[Outcome] = [
                SendFailed("the producer is being replaced", maybe_appended=False, retriable=True)
            ] * len(records)
            final: asyncio.Future[list[Outcome]] = loop.create_future()
            final.set_result(failed)
            return WriteResult(failed, final)
        return await writer.write(topic, records)

    def _settle_batch(
        self,
        runtime: TopicRuntime,
        sequences: list[int],
        written: WriteResult,
    ) -> None:
        """Tell the participant how the sends ended: one update for all acknowledged.
        ``sequences``: each record's stamp sequence, its send id."""
        highest: dict[int, int] = {}
        acknowledged = 0
        uncertain: list[int] = []
        for send_id, outcome in zip(sequences, written.outcomes, strict=True):
            if isinstance(outcome, SentRecord):
                acknowledged += 1
                highest[outcome.partition] = max(highest.get(outcome.partition, -1), outcome.offset)
                continue
            runtime.participant = runtime.participant.send_failed(
                send_id, maybe_appended=outcome.maybe_appended
            )
            if outcome.maybe_appended:
                uncertain.append(send_id)
        if acknowledged:
            runtime.participant = runtime.participant.sends_acknowledged(highest, acknowledged)
        if uncertain:
            self.registry.spawn(self._settle_uncertain(runtime, sequences, written, uncertain))

    async def _settle_uncertain(
        self,
        runtime: TopicRuntime,
        sequences: list[int],
        written: WriteResult,
        send_ids: list[int],
    ) -> None:
        """Wait until the transaction of sends in doubt has ended for good.

        The barrier cannot be acked meanwhile: such a record might still become visible
        after the boundary is read. A late commit tells where the records landed (the
        boundary must be past them: the markers that make them visible may trail); an
        id re-initialised to settle the doubt has had its markers written already.
        """
        final = await written.final
        landed = {
            sequence: (outcome.partition, outcome.offset)
            for sequence, outcome in zip(sequences, final, strict=True)
            if isinstance(outcome, SentRecord)
        }
        for send_id in send_ids:
            runtime.participant = runtime.participant.uncertain_resolved(
                send_id, landed.get(send_id)
            )
        await self.registry.maybe_ack_barrier(runtime)

    async def _produce_unmanaged(
        self, topic: str, request: ProduceRequest, partition: int | None
    ) -> ProduceOutcome:
        """A plain proxy: Kafka's default partitioner (murmur2, as the Java client)."""
        count = await self.kafka.routing_partition_count(topic)
        results: list[ProduceResult | None] = [None] * len(request.records)
        outgoing: list[OutgoingKafkaRecord] = []
        owners: list[int] = []
        for index, record in enumerate(request.records):
            try:
                require_key_for_tombstone(record.key, record.value, index)
            except SidecarError as exc:
                results[index] = RecordFailed.from_error(exc)
                continue
            target = partition if partition is not None else record.partition
            if target is None:
                target = (
                    default_partition(record.key, count)
                    if record.key is not None
                    else next(self._unkeyed) % count
                )
            elif not 0 <= target < count:
                results[index] = RecordFailed.from_error(
                    UnknownPartition(f"partition {target} does not exist")
                )
                continue
            outgoing.append(
                OutgoingKafkaRecord(
                    target, record.key, record.value, record.headers, record.timestamp_ms
                )
            )
            owners.append(index)
        for owner, outcome in zip(
            owners, await self.kafka.send_batch(topic, outgoing), strict=True
        ):
            results[owner] = _result(outcome)
        return ProduceOutcome([r for r in results if r is not None], None, None)

    # Helpers --------------------------------------------------------------------------------


def _result(outcome: SentRecord | SendFailed) -> ProduceResult:
    if isinstance(outcome, SentRecord):
        return RecordWritten(outcome.partition, outcome.offset, outcome.timestamp_ms)
    if outcome.not_authorized:
        return RecordFailed.from_error(KafkaNotAuthorized(str(outcome)))
    if outcome.identity_refused:
        return RecordFailed.from_error(KafkaAuthenticationFailed(str(outcome)))
    error = KafkaUnavailable if outcome.retriable else KafkaFailure
    return RecordFailed.from_error(error(str(outcome)))


def _identity_refusal(outcomes: list[Outcome]) -> KafkaAuthenticationFailed | None:
    """The refusal of this sidecar's credentials, if it failed every one of ``outcomes``
    (a writer refuses a request whole: none of its records was appended)."""
    if not outcomes:
        return None
    refused = [o for o in outcomes if isinstance(o, SendFailed) and o.identity_refused]
    if len(refused) < len(outcomes):
        return None
    return KafkaAuthenticationFailed(refused[0].message)


def _hold_reason(participant: Participant) -> str:
    if participant.session is not SessionState.CONNECTED:
        return f"the ZooKeeper session is {participant.session.value}"
    if not participant.metadata_fresh:
        return "the topic metadata is being re-read after a reconnect"
    return f"generation {participant.pending_generation} is being committed"
