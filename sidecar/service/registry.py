"""The topic registry: the managed topics as this sidecar knows them, their
participants and barrier acks, and recovery after a lost session or a fence.

This is the glue between the pure core and the adapters. Per managed topic it keeps
the topic's shared state (read from ZooKeeper) and a ``Participant`` (the core's
decision of whether to route now, and when a barrier may be acked). Every change
(a watch firing, a send settling, the session changing) updates both in one
synchronous step, so a produce never sees a generation and a participant that
disagree.

The produce service (``sidecar.service.produce``) and the consume path read the
runtimes kept here; a produce is admitted only when its topic's participant says so.

Managed topics are written through transactional producers whose ids name an
*incarnation* (``sidecar.service.incarnations``). Each new session, and each time the
writer turns out fenced, the sidecar takes a new incarnation and re-reads every topic's
metadata before it writes again (``_recover``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from sidecar.adapters.kafka import KafkaGateway
from sidecar.adapters.transactions import TransactionalWriter
from sidecar.audit.emitter import AuditEmitter
from sidecar.config import Settings
from sidecar.core.backoff import jittered
from sidecar.core.errors import MetadataUnavailable, SidecarError, UnknownTopic
from sidecar.core.generations import assignable_partitions
from sidecar.core.participant import Participant, SessionState
from sidecar.core.topics import PendingBarrier, TopicState
from sidecar.faults import FaultHooks
from sidecar.metrics import SidecarMetrics
from sidecar.service.incarnations import WriterIncarnations
from sidecar.service.topic_ports import RegistryStore

_log = logging.getLogger(__name__)


@dataclass
class TopicRuntime:
    """One managed topic as this sidecar sees it."""

    name: str
    state: TopicState
    participant: Participant
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    refreshing: asyncio.Lock = field(default_factory=asyncio.Lock)
    refreshes_asked: int = 0
    """How many re-reads of the topic were asked for (a watch firing, a caller)."""
    refreshes_covered: int = 0
    """Up to which of them a completed read began after the asking: those are done."""

    def notify(self) -> None:
        """Wake everyone waiting for a change; later waiters wait for the next one."""
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()


class TopicRegistry:
    def __init__(
        self,
        settings: Settings,
        store: RegistryStore,
        kafka: KafkaGateway,
        metrics: SidecarMetrics,
        faults: FaultHooks | None = None,
    ) -> None:
        self.settings = settings
        self.faults = faults or FaultHooks()
        """Fault injection for the crash tests; empty in production."""
        self.sidecar_id = settings.sidecar_id
        self.store = store
        self.kafka = kafka
        self.metrics = metrics
        self.topics: dict[str, TopicRuntime] = {}
        self._unmanaged: dict[str, float] = {}
        """Topics ZooKeeper said are not managed, and when it said so (monotonic): a
        produce to an unmanaged topic asks again only after ``unmanaged_cache_s`` or a
        change of the managed topics' list."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._ready = False
        self._started_steps: set[str] = set()
        self._waiting_for: str | None = "kafka"
        """The step of ``start`` in progress (None once started)."""
        self.audit = AuditEmitter(settings.audit, settings.sidecar_id, kafka, metrics)
        self.incarnations = WriterIncarnations(
            settings,
            store,
            metrics,
            on_fenced=self._on_writer_fenced,
            spawn=self.spawn,
            faults=self.faults,
        )
        self._recovering = asyncio.Lock()
        self._assignable_listeners: list[Callable[[str], None]] = []
        self._changed_callbacks: dict[str, Callable[[], None]] = {}
        """Per topic, what its reads arm their watches with (``_changed_callback``)."""

    # Lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """One try at every step of starting not done yet, in order: Kafka, the audit
        emitter, the ZooKeeper session, the registration, the topic list.

        Raises the SidecarError of the first step that fails (KafkaUnavailable,
        MetadataUnavailable, ...); calling again resumes from that step. The
        transactional producers start in the background when Kafka's coordinator is slow.
        """
        if "kafka" not in self._started_steps:
            self._waiting_for = "kafka"
            await self.kafka.start()
            self._started_steps.add("kafka")
        if "audit" not in self._started_steps:
            await self.audit.start()
            self._started_steps.add("audit")
        if "zookeeper" not in self._started_steps:
            self._waiting_for = "zookeeper"
            await self.store.start(timeout=self.settings.zookeeper.session_timeout_s)
            self.store.add_session_listener(self._on_session)
            self._started_steps.add("zookeeper")
            # The listener hears of changes only; the gauge must start from the present.
            self.metrics.zookeeper_connected.set(
                1 if self.store.session_state is SessionState.CONNECTED else 0
            )
        if "producers" not in self._started_steps:
            self._waiting_for = "producers"
            await self.incarnations.register()
            self._started_steps.add("producers")
            if not await self.incarnations.first_writer():
                self.spawn(self._recover())
        self._waiting_for = "topics"
        await self.refresh_topic_list()
        self.store.watch_topic_list(self._topic_list_changed)
        self.spawn(self._topic_list_loop())
        self._waiting_for = None
        self._ready = True

    @property
    def started(self) -> bool:
        """Every step of ``start`` is done: produces and consumes are taken (and held
        or refused one by one while a dependency is away)."""
        return self._ready

    def waiting_for(self) -> list[str]:
        """What readiness still waits for: ``kafka``, ``zookeeper``, ``producers``
        (the transactional producers), ``topics`` (the managed topics' list); empty
        when ready."""
        if self._stopping:
            return ["shutdown"]
        waiting: list[str] = []
        if self._waiting_for == "kafka":
            waiting.append("kafka")
        if self.store.session_state is not SessionState.CONNECTED:
            waiting.append("zookeeper")
        if not self.incarnations.writing:
            waiting.append("producers")
        if self._waiting_for == "topics" and not waiting:
            waiting.append("topics")
        return waiting

    async def stop(self) -> None:
        """Stop taking produces, let the ones in flight finish, then close the adapters."""
        self._stopping = True
        self._ready = False
        for runtime in self.topics.values():
            runtime.notify()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.incarnations.stop()  # commits what is queued
        await self.audit.stop()
        # The gateway flushes in-flight sends before it closes.
        await self.kafka.stop()
        await self.store.stop()

    @property
    def ready(self) -> bool:
        return (
            self._ready
            and self.store.session_state is SessionState.CONNECTED
            and self.incarnations.writing
        )

    @property
    def stopping(self) -> bool:
        """Stopping: take no more produces."""
        return self._stopping

    @property
    def zookeeper_state(self) -> SessionState:
        """This sidecar's ZooKeeper session, as readiness reports it."""
        return self.store.session_state

    @property
    def writer(self) -> TransactionalWriter | None:
        """The writer of managed topics; None while it is being replaced."""
        return self.incarnations.writer

    @writer.setter
    def writer(self, writer: TransactionalWriter | None) -> None:
        self.incarnations.writer = writer

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
            state = await self.store.read_topic(topic, self._changed_callback(topic))
        except UnknownTopic:
            if len(self._unmanaged) >= self.settings.produce.unmanaged_cache_size:
                self._unmanaged.clear()  # bounded: names come from clients
            self._unmanaged[topic] = now
            return None
        return self._adopt_runtime(state)

    def _topic_list_changed(self) -> None:
        """A topic became managed (or stopped being): believe no "not managed" read before."""
        self._unmanaged.clear()
        self.spawn(self._refresh_topic_list_quietly())

    async def _refresh_topic_list_quietly(self) -> None:
        with contextlib.suppress(MetadataUnavailable):
            await self.refresh_topic_list()

    async def refresh_topic_list(self) -> None:
        """Adopt every managed topic not known yet. They are read a few at a time
        (``zookeeper.read_concurrency``): one after the other, a sidecar starting with a
        thousand topics waited a thousand times for a few ZooKeeper round trips. Raises
        the first MetadataUnavailable, once every read has ended."""
        new = [name for name in await self.store.list_topics() if name not in self.topics]
        gate = asyncio.Semaphore(self.settings.zookeeper.read_concurrency)

        async def adopt(name: str) -> None:
            async with gate:
                try:
                    state = await self.store.read_topic(name, self._changed_callback(name))
                except UnknownTopic:
                    return  # deleted between list and read
            self._adopt_runtime(state)  # a no-op if a produce adopted it meanwhile

        failures = [
            outcome
            for outcome in await asyncio.gather(*map(adopt, new), return_exceptions=True)
            if isinstance(outcome, BaseException)
        ]
        if failures:
            raise failures[0]

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
        # The read that found the topic armed its watches (``_changed_callback``); what
        # it read is applied as a watch's refresh would apply it, without reading again
        # (a barrier may already be pending).
        self._apply_state(runtime, state)
        self.spawn(self.maybe_ack_barrier(runtime))
        return runtime

    def _changed_callback(self, name: str) -> Callable[[], None]:
        """What a read of topic ``name`` arms its watches with: refresh its runtime (which
        reads again, arming them for the change after). One callable per topic."""
        known = self._changed_callbacks.get(name)
        if known is None:

            def changed() -> None:
                runtime = self.topics.get(name)
                if runtime is not None:
                    self.spawn(self.refresh(runtime))

            known = self._changed_callbacks[name] = changed
        return known

    async def refresh(self, runtime: TopicRuntime) -> None:
        """Re-read the topic and apply what changed: a commit, a barrier, a rollback.

        Re-reads asked for while one waits for another to finish are done by one read:
        each watch of a topic fires once when set, and a change fires several, so a
        sidecar starting with many topics read each several times over."""
        runtime.refreshes_asked += 1
        asked = runtime.refreshes_asked
        async with runtime.refreshing:
            if runtime.refreshes_covered >= asked:
                return  # a read that began after this was asked is done
            covers = runtime.refreshes_asked
            try:
                state = await self.store.read_topic(
                    runtime.name, self._changed_callback(runtime.name)
                )
            except MetadataUnavailable:
                return  # the session listener re-reads on reconnect
            runtime.refreshes_covered = covers
            self._apply_state(runtime, state)
        await self.maybe_ack_barrier(runtime)

    def _apply_state(self, runtime: TopicRuntime, state: TopicState) -> None:
        participant = runtime.participant
        if state.current.number > participant.generation:
            participant = participant.generation_committed(state.current)
        pending = state.pending
        if pending is not None and pending.generation > participant.generation:
            if participant.pending_generation != pending.generation:
                self._prepare_partitions(runtime.name, pending, state)
            participant = participant.barrier_published(pending.generation)
        elif pending is None and participant.pending_generation is not None:
            participant = participant.barrier_removed()
        self._set_state(runtime, state)
        runtime.participant = participant
        self._record_generation(runtime)
        runtime.notify()

    def _prepare_partitions(self, name: str, pending: PendingBarrier, state: TopicState) -> None:
        """A change that adds partitions was published: have the writer learn of them
        while produces are held for the barrier, not after the commit."""
        if self.writer is not None and pending.target_count > state.current.undeleted_count:
            self.spawn(self.writer.prepare(name, pending.target_count))

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

    async def maybe_ack_barrier(self, runtime: TopicRuntime) -> None:
        participant = runtime.participant
        if not participant.ready_to_ack() or self.faults.withhold_barrier_acks:
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
            self.incarnations.session_lost()
        if session is SessionState.CONNECTED:
            self.spawn(self._recover())

    def _on_writer_fenced(self) -> None:
        """A coordinator fenced this sidecar's producer (it was taken for a zombie), or the
        producer retired itself after settling a doubt (which may have undone a fence)."""
        for runtime in self.topics.values():
            runtime.participant = runtime.participant.producer_replaced()
            runtime.notify()
        self.spawn(self._recover())

    async def _recover(self) -> None:
        """After a reconnect or a fence: a writer under a registered transactional id,
        then every topic's metadata read again, before anything is written."""
        async with self._recovering:
            while not self._stopping:
                if self.store.session_state is not SessionState.CONNECTED:
                    return  # the next CONNECTED starts over
                try:
                    await self.incarnations.ensure_writer()
                    break
                except SidecarError as exc:
                    _log.warning("re-registering the producer failed, retrying: %s", exc.message)
                    await asyncio.sleep(self.settings.produce.writer_retry_s)
            await self.incarnations.forget_retired()
            await self._reload_after_reconnect()

    async def _reload_after_reconnect(self) -> None:
        """After a reconnect nothing is trusted until it has been read again."""
        for runtime in list(self.topics.values()):
            try:
                # A new session has none of the old one's watches: armed again here.
                state = await self.store.read_topic(
                    runtime.name, self._changed_callback(runtime.name)
                )
            except (MetadataUnavailable, UnknownTopic):
                continue
            pending = state.pending.generation if state.pending else None
            runtime.participant = runtime.participant.metadata_reloaded(state.current, pending)
            self._set_state(runtime, state)
            self._record_generation(runtime)
            runtime.notify()
            await self.maybe_ack_barrier(runtime)

    async def _topic_list_loop(self) -> None:
        while True:
            await asyncio.sleep(
                jittered(self.settings.zookeeper.topic_list_interval_s, random.random())
            )
            with contextlib.suppress(MetadataUnavailable):
                await self.refresh_topic_list()

    def _record_generation(self, runtime: TopicRuntime) -> None:
        self.metrics.generation.labels(runtime.name).set(runtime.participant.generation)
        self.metrics.partition_count.labels(runtime.name).set(runtime.participant.undeleted_count)
        self.metrics.generation_log_length.labels(runtime.name).set(
            len(runtime.state.log.generations)
        )

    def spawn(self, coroutine: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.error("background task failed", exc_info=task.exception())


def _unacked(participant: Participant) -> Participant:
    return replace(participant, barrier_acked=False)
