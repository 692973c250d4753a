"""The sidecar's produce side: managed topics, barriers, holds and fencing.

This is the glue between the pure core and the adapters. Per managed topic it keeps
the topic's shared state (read from ZooKeeper) and a ``Participant`` (the core's
decision of whether to route now, and when a barrier may be acked). Every change
(a watch firing, a send settling, the session changing) updates both in one
synchronous step, so a produce never sees a generation and a participant that
disagree.

Produces to a managed topic are held (never failed) while a barrier is pending or
the ZooKeeper session is not connected; the hold ends when the generation commits,
the barrier is removed, or ``produce.hold_timeout_s`` passes (then 503, retriable).

Managed topics are written through a transactional producer (DESIGN §5, fencing)
whose transactional id is registered with this sidecar's ZooKeeper registration: a
coordinator fences every registered id no live sidecar names before it reads a
change's boundaries. Each new session, and each time the producer turns out fenced,
the sidecar takes a new id (an *incarnation*): it registers it, initialises it, and
re-reads the metadata before it writes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from sidecar.adapters.kafka import KafkaGateway, OutgoingKafkaRecord, SendFailed, SentRecord
from sidecar.adapters.transactions import Outcome, TransactionalWriter, WriteResult
from sidecar.adapters.zookeeper import MetadataStore
from sidecar.audit import events as audit_events
from sidecar.audit.emitter import AuditEmitter
from sidecar.audit.events import key_sampled
from sidecar.config import Settings
from sidecar.core.errors import (
    FencedGeneration,
    InvalidGeneration,
    KafkaUnavailable,
    MetadataUnavailable,
    ProduceHoldTimeout,
    ProducerFenced,
    ShuttingDown,
    SidecarError,
    UnknownGeneration,
    UnknownTopic,
)
from sidecar.core.generations import assignable_partitions
from sidecar.core.placement import (
    RELOCATION_HEADER,
    place_record,
    relocation_sources,
    require_key_for_tombstone,
    sidecar_headers,
)
from sidecar.core.procedures import Admission, Participant, SessionState, TransactionalId
from sidecar.core.routing import default_partition
from sidecar.core.topics import TopicState
from sidecar.http.produce_codec import ProduceRequest, ProduceResult, RecordFailed, RecordWritten
from sidecar.metrics import SidecarMetrics

_log = logging.getLogger(__name__)

# How often the list of managed topics is re-read, so that a topic managed by another
# sidecar is watched (and its barriers acked) within this delay.
TOPIC_LIST_INTERVAL_S = 1.0
UNMANAGED_CACHE_SIZE = 10_000
RECOVERY_RETRY_S = 0.5


@dataclass
class ProduceOutcome:
    """What a produce request did, for the HTTP answer."""

    results: list[ProduceResult]
    generation: int | None
    partition_count: int | None


@dataclass
class TopicRuntime:
    """One managed topic as this sidecar sees it."""

    name: str
    state: TopicState
    participant: Participant
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    refreshing: asyncio.Lock = field(default_factory=asyncio.Lock)

    def notify(self) -> None:
        """Wake everyone waiting for a change; later waiters wait for the next one."""
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()


class Sidecar:
    def __init__(
        self,
        settings: Settings,
        store: MetadataStore,
        kafka: KafkaGateway,
        metrics: SidecarMetrics,
    ) -> None:
        self.settings = settings
        self.sidecar_id = settings.sidecar_id
        self.store = store
        self.kafka = kafka
        self.metrics = metrics
        self.topics: dict[str, TopicRuntime] = {}
        self._unmanaged: dict[str, float] = {}
        """Topics ZooKeeper said are not managed, and when it said so (monotonic): a
        produce to an unmanaged topic asks again only after ``unmanaged_cache_s`` or a
        change of the managed topics' list."""
        self._sequence = itertools.count()
        self._unkeyed = itertools.count()
        self._tombstones_sent: OrderedDict[tuple[bytes, str, int, int], None] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._ready = False
        self.audit = AuditEmitter(settings.audit, settings.sidecar_id, kafka, metrics)
        self.writer: TransactionalWriter | None = None
        """Writes managed topics; None while it is being replaced."""
        self._incarnation = 0
        self._registered: TransactionalId | None = None
        """The transactional id this sidecar's registration names (or will, once the
        store has registered again after a lost session)."""
        self._retired: set[TransactionalId] = set()
        """Ids of writers closed cleanly, to drop from the registry once ZooKeeper answers."""
        self._recovering = asyncio.Lock()
        self._started_at = time.time()
        self._assignable_listeners: list[Callable[[str], None]] = []

    # Lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.kafka.start()
        await self.audit.start()
        await self.store.start()
        self.store.add_session_listener(self._on_session)
        # The listener hears of changes only; the gauge must start from the present.
        self.metrics.zookeeper_connected.set(
            1 if self.store.session_state is SessionState.CONNECTED else 0
        )
        transactional_id = self.transactional_id
        await self.store.register_sidecar(
            self.sidecar_id, self._registration_info(), transactional_id
        )
        self._registered = transactional_id
        try:
            self.writer = await self._start_writer(transactional_id)
        except (KafkaUnavailable, ProducerFenced) as exc:
            # Kafka's transaction coordinator can take a while (a broker just restarted, a
            # loaded cluster): the sidecar starts, not ready and holding managed produces,
            # and initialises the producer in the background.
            _log.warning("transactional producer not initialised yet: %s", exc.message)
            if isinstance(exc, ProducerFenced):
                self._incarnation += 1
            self._spawn(self._recover())
        await self.refresh_topic_list()
        self.store.watch_topic_list(self._topic_list_changed)
        self._spawn(self._topic_list_loop())
        self._ready = True

    async def stop(self) -> None:
        """Stop taking produces, let the ones in flight finish, then close the adapters."""
        self._stopping = True
        self._ready = False
        for runtime in self.topics.values():
            runtime.notify()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        writer, self.writer = self.writer, None
        if writer is not None:
            await writer.stop()  # commits what is queued
            if not writer.fenced:
                self._retired.add(TransactionalId(writer.transactional_id))
        await self._forget_retired()
        await self.audit.stop()
        # The gateway flushes in-flight sends before it closes.
        await self.kafka.stop()
        await self.store.stop()

    @property
    def ready(self) -> bool:
        writer = self.writer
        return (
            self._ready
            and self.store.session_state is SessionState.CONNECTED
            and writer is not None
            and not writer.fenced
        )

    @property
    def transactional_id(self) -> TransactionalId:
        """The id of this incarnation's transactional producer."""
        prefix = self.settings.kafka.client_id
        return TransactionalId(f"{prefix}.{self.sidecar_id}.{self._incarnation}")

    def _registration_info(self) -> dict[str, object]:
        return {
            "started_at": self._started_at,
            "http_port": self.settings.http.port,
            "incarnation": self._incarnation,
        }

    async def _start_writer(self, transactional_id: TransactionalId) -> TransactionalWriter:
        writer = TransactionalWriter(
            self.settings.kafka,
            transactional_id,
            on_fenced=self._on_writer_fenced,
            # The fault stops the process once, in its first incarnation.
            stop_before_commit=self.settings.faults.stop_before_commit
            if self._incarnation == 0
            else 0,
        )
        await writer.start()
        self.metrics.producer_incarnations.inc()
        return writer

    # Managed topics -------------------------------------------------------------------------

    async def runtime(self, topic: str) -> TopicRuntime | None:
        """The managed topic's runtime, loading it on first use; None if unmanaged."""
        existing = self.topics.get(topic)
        if existing is not None:
            return existing
        now = time.monotonic()
        said_at = self._unmanaged.get(topic)
        if said_at is not None and now - said_at < self.settings.produce.unmanaged_cache_s:
            return None
        try:
            state = await self.store.read_topic(topic)
        except UnknownTopic:
            if len(self._unmanaged) >= UNMANAGED_CACHE_SIZE:
                self._unmanaged.clear()  # bounded: names come from clients
            self._unmanaged[topic] = now
            return None
        return self._adopt_runtime(state)

    def _topic_list_changed(self) -> None:
        """A topic became managed (or stopped being): believe no "not managed" read before."""
        self._unmanaged.clear()
        self._spawn(self._refresh_topic_list_quietly())

    async def _refresh_topic_list_quietly(self) -> None:
        with contextlib.suppress(MetadataUnavailable):
            await self.refresh_topic_list()

    async def refresh_topic_list(self) -> None:
        for name in await self.store.list_topics():
            if name not in self.topics:
                try:
                    self._adopt_runtime(await self.store.read_topic(name))
                except UnknownTopic:
                    continue  # deleted between list and read

    def _adopt_runtime(self, state: TopicState) -> TopicRuntime:
        name = state.config.name
        if name in self.topics:
            return self.topics[name]
        self._unmanaged.pop(name, None)
        generation = state.current
        participant = Participant(generation.number, generation.undeleted_count)
        if state.pending is not None:
            # A change is under way whose coordinator may not count this sidecar among
            # its participants (it registered after the barrier was published) and so
            # will not wait for its sends: route nothing under the old generation.
            participant = participant.barrier_published(state.pending.generation)
        if self.writer is None:
            participant = participant.producer_replaced()  # held until _recover re-reads
        runtime = TopicRuntime(name, state, participant)
        self.topics[name] = runtime
        self._record_generation(runtime)
        self.store.watch_topic(name, lambda: self._spawn(self.refresh(runtime)))
        # A barrier may already be pending: handle it as a watch would.
        self._spawn(self.refresh(runtime))
        return runtime

    async def refresh(self, runtime: TopicRuntime) -> None:
        """Re-read the topic and apply what changed: a commit, a barrier, a rollback."""
        async with runtime.refreshing:
            try:
                state = await self.store.read_topic(runtime.name)
            except MetadataUnavailable:
                return  # the session listener re-reads on reconnect
            self._apply_state(runtime, state)
        await self._maybe_ack_barrier(runtime)

    def _apply_state(self, runtime: TopicRuntime, state: TopicState) -> None:
        participant = runtime.participant
        if state.current.number > participant.generation:
            participant = participant.generation_committed(state.current)
        pending = state.pending
        if pending is not None and pending.generation > participant.generation:
            participant = participant.barrier_published(pending.generation)
        elif pending is None and participant.pending_generation is not None:
            participant = participant.barrier_removed()
        self._set_state(runtime, state)
        runtime.participant = participant
        self._record_generation(runtime)
        runtime.notify()

    def _set_state(self, runtime: TopicRuntime, state: TopicState) -> None:
        """Take ``state`` as the topic's; tell the listeners if the partitions a consumer
        group may be assigned changed (a retirement, a removed partition brought back)."""
        before = assignable_partitions(runtime.state.modes)
        runtime.state = state
        if assignable_partitions(state.modes) != before:
            for listener in list(self._assignable_listeners):
                listener(runtime.name)

    def on_assignable_change(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(topic)`` whenever a managed topic's assignable partitions
        change: the consumer groups must rebalance, the partition count alone (what
        Kafka's consumers watch) does not change."""
        self._assignable_listeners.append(listener)

    async def _maybe_ack_barrier(self, runtime: TopicRuntime) -> None:
        participant = runtime.participant
        if not participant.ready_to_ack() or self.settings.faults.withhold_barrier_acks:
            return
        pending = participant.pending_generation
        assert pending is not None
        runtime.participant, acked = participant.barrier_ack()
        try:
            await self.store.ack_barrier(runtime.name, pending, self.sidecar_id, acked)
        except SidecarError:
            # Try again on the next change; the coordinator waits or times out.
            if runtime.participant.pending_generation == pending:
                runtime.participant = _unacked(runtime.participant)
            return
        self.metrics.barrier_acks.labels(runtime.name).inc()

    def _on_session(self, session: SessionState) -> None:
        self.metrics.zookeeper_connected.set(1 if session is SessionState.CONNECTED else 0)
        for runtime in self.topics.values():
            runtime.participant = runtime.participant.session_changed(session)
            runtime.notify()
        if session is SessionState.LOST:
            # A coordinator may fence this incarnation's id any time from now on: the next
            # session registers a new one (the store registers it before telling us).
            self._incarnation += 1
            self._registered = self.transactional_id
            self.store.prepare_registration(
                self.sidecar_id, self._registration_info(), self._registered
            )
            self._retire_writer()
        if session is SessionState.CONNECTED:
            self._spawn(self._recover())

    def _on_writer_fenced(self) -> None:
        """A coordinator fenced this sidecar's producer (it was taken for a zombie), or the
        producer retired itself after settling a doubt (which may have undone a fence)."""
        _log.warning("the transactional producer of %s was fenced or retired", self.sidecar_id)
        for runtime in self.topics.values():
            runtime.participant = runtime.participant.producer_replaced()
            runtime.notify()
        self._spawn(self._recover())

    def _retire_writer(self) -> None:
        writer, self.writer = self.writer, None
        if writer is not None:
            self._spawn(self._close_writer(writer))

    async def _close_writer(self, writer: TransactionalWriter) -> None:
        # Its queued transactions end (committed, or refused if fenced meanwhile); after
        # that nothing can be written with its id, which may leave the registry.
        await writer.stop()
        if not writer.fenced:
            self._retired.add(TransactionalId(writer.transactional_id))

    async def _recover(self) -> None:
        """After a reconnect or a fence: a writer under a registered transactional id,
        then every topic's metadata read again, before anything is written."""
        async with self._recovering:
            while not self._stopping:
                if self.store.session_state is not SessionState.CONNECTED:
                    return  # the next CONNECTED starts over
                try:
                    await self._ensure_writer()
                    break
                except SidecarError as exc:
                    _log.warning("re-registering the producer failed, retrying: %s", exc.message)
                    await asyncio.sleep(RECOVERY_RETRY_S)
            await self._forget_retired()
            await self._reload_after_reconnect()

    async def _ensure_writer(self) -> None:
        if self.writer is not None and not self.writer.fenced:
            return
        if self.writer is not None:
            self._retire_writer()  # fenced: its id was dropped by whoever fenced it
            self._incarnation += 1
        transactional_id = self.transactional_id
        if self._registered != transactional_id:
            await self.store.register_sidecar(
                self.sidecar_id, self._registration_info(), transactional_id
            )
            self._registered = transactional_id
        try:
            self.writer = await self._start_writer(transactional_id)
        except ProducerFenced:
            # A coordinator fenced the id between its registration and now (and dropped
            # it from the registry): writing with it would go unfenced. Take a new one.
            self._incarnation += 1
            raise

    async def _forget_retired(self) -> None:
        if not self._retired:
            return
        retired = tuple(sorted(self._retired))
        try:
            await self.store.forget_producers(retired)
        except SidecarError:
            return  # next time; meanwhile the next change fences them, harmlessly
        self._retired.difference_update(retired)

    async def _reload_after_reconnect(self) -> None:
        """After a reconnect nothing is trusted until it has been read again."""
        for runtime in list(self.topics.values()):
            try:
                state = await self.store.read_topic(runtime.name)
            except (MetadataUnavailable, UnknownTopic):
                continue
            pending = state.pending.generation if state.pending else None
            runtime.participant = runtime.participant.metadata_reloaded(state.current, pending)
            self._set_state(runtime, state)
            self._record_generation(runtime)
            runtime.notify()
            await self._maybe_ack_barrier(runtime)

    async def _topic_list_loop(self) -> None:
        while True:
            await asyncio.sleep(TOPIC_LIST_INTERVAL_S)
            with contextlib.suppress(MetadataUnavailable):
                await self.refresh_topic_list()

    # Produce --------------------------------------------------------------------------------

    async def produce(
        self, topic: str, request: ProduceRequest, partition: int | None = None
    ) -> ProduceOutcome:
        """Write ``request``'s records (to ``partition`` if the URL names one).

        Raises SidecarError for what fails the whole request (fenced, held too long,
        unknown topic); a record that fails alone gets a RecordFailed entry.
        """
        if self._stopping:
            raise ShuttingDown()
        runtime = await self.runtime(topic)
        if runtime is None:
            return await self._produce_unmanaged(topic, request, partition)
        await self._wait_until_admitted(runtime)
        await self._check_expected(runtime, request)
        return await self._produce_managed(runtime, request, partition)

    async def _wait_until_admitted(self, runtime: TopicRuntime) -> None:
        if runtime.participant.admission() is Admission.ROUTE:
            return
        held = self.metrics.held_requests.labels(runtime.name)
        held.inc()
        began = time.monotonic()
        deadline = began + self.settings.produce.hold_timeout_s
        try:
            while runtime.participant.admission() is not Admission.ROUTE:
                if self._stopping:
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
            self._spawn(self.refresh(runtime))
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
            state = await self.store.read_topic(runtime.name)
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
        self, runtime: TopicRuntime, request: ProduceRequest, partition: int | None
    ) -> ProduceOutcome:
        # Everything from here to the sends is synchronous: the participant that
        # admitted the request is the one that counts its sends in flight.
        state = runtime.state
        generation = state.current
        results: list[ProduceResult | None] = [None] * len(request.records)
        outgoing: list[OutgoingKafkaRecord] = []
        owners: list[int | None] = []  # request index of each outgoing record, None: tombstone
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
                        outgoing.append(self._tombstone(runtime, source, record.key))
                        owners.append(None)
            headers = [
                *record.headers,
                *sidecar_headers(
                    generation.number,
                    generation.undeleted_count,
                    self.sidecar_id,
                    next(self._sequence),
                ),
            ]
            outgoing.append(OutgoingKafkaRecord(target, record.key, record.value, headers))
            owners.append(index)
        if outgoing:
            runtime.participant = runtime.participant.send_started(len(outgoing))
        written = await self._write(runtime.name, outgoing)
        sent = written.outcomes
        self._settle_batch(runtime, outgoing, written)
        for sent_record, owner, outcome in zip(outgoing, owners, sent, strict=True):
            if owner is None:
                if isinstance(outcome, SentRecord):
                    self.metrics.relocation_tombstones.labels(runtime.name).inc()
                continue
            results[owner] = _result(outcome)
            if isinstance(outcome, SentRecord) and key_sampled(
                sent_record.key, self.settings.audit.sample_rate
            ):
                self.audit.emit(
                    audit_events.produce_acked(
                        topic=runtime.name,
                        partition=outcome.partition,
                        offset=outcome.offset,
                        key=sent_record.key,
                        generation=generation.number,
                        count=generation.undeleted_count,
                        producer=self.sidecar_id,
                        producer_seq=_sequence_of(sent_record),
                    )
                )
        await self._maybe_ack_barrier(runtime)
        return ProduceOutcome(
            [r for r in results if r is not None], generation.number, generation.undeleted_count
        )

    def _tombstone(self, runtime: TopicRuntime, partition: int, key: bytes) -> OutgoingKafkaRecord:
        generation = runtime.state.current
        headers = [
            *sidecar_headers(
                generation.number,
                generation.undeleted_count,
                self.sidecar_id,
                next(self._sequence),
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
        writer = self.writer
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
        records: list[OutgoingKafkaRecord],
        written: WriteResult,
    ) -> None:
        """Tell the participant how the sends ended: one update for all acknowledged."""
        highest: dict[int, int] = {}
        acknowledged = 0
        uncertain: list[int] = []
        for record, outcome in zip(records, written.outcomes, strict=True):
            if isinstance(outcome, SentRecord):
                acknowledged += 1
                highest[outcome.partition] = max(highest.get(outcome.partition, -1), outcome.offset)
                continue
            send_id = _sequence_of(record)
            runtime.participant = runtime.participant.send_failed(
                send_id, maybe_appended=outcome.maybe_appended
            )
            if outcome.maybe_appended:
                uncertain.append(send_id)
        if acknowledged:
            runtime.participant = runtime.participant.sends_acknowledged(highest, acknowledged)
        if uncertain:
            self._spawn(self._settle_uncertain(runtime, records, written, uncertain))

    async def _settle_uncertain(
        self,
        runtime: TopicRuntime,
        records: list[OutgoingKafkaRecord],
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
            _sequence_of(record): (outcome.partition, outcome.offset)
            for record, outcome in zip(records, final, strict=True)
            if isinstance(outcome, SentRecord)
        }
        for send_id in send_ids:
            runtime.participant = runtime.participant.uncertain_resolved(
                send_id, landed.get(send_id)
            )
        await self._maybe_ack_barrier(runtime)

    async def _produce_unmanaged(
        self, topic: str, request: ProduceRequest, partition: int | None
    ) -> ProduceOutcome:
        """A plain proxy: Kafka's default partitioner (murmur2, as the Java client)."""
        count = await self.kafka.partition_count(topic)
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
                results[index] = RecordFailed(40402, f"partition {target} does not exist")
                continue
            outgoing.append(OutgoingKafkaRecord(target, record.key, record.value, record.headers))
            owners.append(index)
        for owner, outcome in zip(
            owners, await self.kafka.send_batch(topic, outgoing), strict=True
        ):
            results[owner] = _result(outcome)
        return ProduceOutcome([r for r in results if r is not None], None, None)

    # Helpers --------------------------------------------------------------------------------

    def _record_generation(self, runtime: TopicRuntime) -> None:
        self.metrics.generation.labels(runtime.name).set(runtime.participant.generation)
        self.metrics.partition_count.labels(runtime.name).set(runtime.participant.undeleted_count)

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.error("background task failed", exc_info=task.exception())


def _result(outcome: SentRecord | SendFailed) -> ProduceResult:
    if isinstance(outcome, SentRecord):
        return RecordWritten(outcome.partition, outcome.offset)
    code = 50002 if outcome.retriable else 50001
    return RecordFailed(code, str(outcome))


def _sequence_of(record: OutgoingKafkaRecord) -> int:
    for name, value in record.headers:
        if name == "ordered.sequence" and value is not None:
            return int(value)
    raise AssertionError("a managed record without a sequence header")


def _unacked(participant: Participant) -> Participant:
    return replace(participant, barrier_acked=False)


def _hold_reason(participant: Participant) -> str:
    if participant.session is not SessionState.CONNECTED:
        return f"the ZooKeeper session is {participant.session.value}"
    if not participant.metadata_fresh:
        return "the topic metadata is being re-read after a reconnect"
    return f"generation {participant.pending_generation} is being committed"
