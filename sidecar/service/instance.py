"""A REST consumer instance: the small front class over the consume path's components.

Each instance is one Kafka group consumer (``sidecar.adapters.group_consumer``).
Records are fetched into per-partition buffers (``partitions``, ``fetcher``) and
released to the app only at delivery time through the gate (``release``); the app is
told of key hand-off (``handoff``) and, if it asks, of rebalances (``notices``); its
commits, and the instance's own auto-commits, never pass an unacknowledged hand-off
(``offsets``); gate waits are announced in ZooKeeper (``waits``).

The components share one ``ConsumeState`` (``sidecar.service.consume_state``), as
aiokafka's fetcher and coordinator share one ``SubscriptionState``: the instance makes
it and hands it to each; none holds another to reach its state, and none is handed a
function of the instance. The instance owns its two locks and is the only one to take
them: ``_lock`` serializes the app's requests (every public operation takes it; the
HTTP layer only calls them), ``_delivery_lock`` keeps a release and a rebalance
listener's final commit apart. It also holds the state of its subscription.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from sidecar.adapters.group_consumer import GroupConsumerOptions
from sidecar.core.consume import ConsumedRecord, TopicPartition
from sidecar.core.errors import BadRequest, ConsumerStateConflict, SidecarError
from sidecar.core.positions import Positions
from sidecar.core.reading_start import EARLIEST, from_log_start
from sidecar.service.consume_context import AppCallbacks, ConsumeContext, InstanceConsumer
from sidecar.service.consume_state import ConsumeState
from sidecar.service.fetcher import Fetcher
from sidecar.service.handoff import HandoffTeller
from sidecar.service.notices import AssignmentNotices
from sidecar.service.offsets import Offsets
from sidecar.service.release import PollResult, Release
from sidecar.service.waits import GateWaits

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InstanceConfig:
    group: str
    name: str
    format: str
    """"binary" or "json": how the HTTP layer encodes keys and values."""
    auto_offset_reset: str = "latest"
    auto_commit: bool = False
    callback_url: str | None = None
    callback_timeout_s: float = 5.0
    poll_timeout_ms: int = 1000
    """Default (and longest) wait of a records request, as REST Proxy's
    ``consumer.request.timeout.ms``."""
    fetch_min_bytes: int = 1
    """REST Proxy's ``fetch.min.bytes``: the fetch waits for this much (up to its wait)."""
    assignment_events: bool = False
    """Tell the app of rebalances (AssignmentNotice), by callback or in records
    responses. Off by default: a REST Proxy client expects only records there."""
    record_headers: str = "app"
    """"all", "app" or "none": which record headers the HTTP layer writes in a records
    response (the service hands every record over with all of its headers)."""


class ConsumerInstance:
    def __init__(
        self,
        config: InstanceConfig,
        context: ConsumeContext,
        *,
        instance_key: str,
        stalled: Callable[[], bool] = lambda: False,
    ) -> None:
        self.config = config
        self.context = context
        self.last_used = time.monotonic()
        self._lock = asyncio.Lock()
        """One request of the app at a time: every public operation takes it (a records
        response is held until it is sent, ``delivery``)."""
        self._delivery_lock = asyncio.Lock()
        """Held while records are released, and while a rebalance listener queues a
        notice or makes the final commit of what was delivered: the listener runs
        beside the request that holds ``_lock`` (it may wait for the app's next poll)."""
        self.subscription: list[str] = []
        self.pattern: str | None = None
        self._callbacks: AppCallbacks | None = None
        if config.callback_url is not None:
            self._callbacks = context.callback_client(
                config.callback_url, config.callback_timeout_s
            )
        # One state, shared by the components; none of them holds another to reach it.
        self.state = ConsumeState(
            config.group,
            config.name,
            assignment_events=config.assignment_events,
            stalled=stalled,
        )
        self.handoff = HandoffTeller(
            self.state,
            context.store,
            self._callbacks,
            patience_s=context.settings.callback_patience_s,
        )
        self.waits = GateWaits(config.group, instance_key, context.store, context.metrics)
        self.notices = AssignmentNotices(self.state, self._callbacks)
        self.release = Release(self.state, context, self.handoff, self.waits)
        self.offsets = Offsets(
            self.state, context, self.handoff, callbacks=self._callbacks is not None
        )
        self.fetcher = Fetcher(
            self.state,
            context,
            self.notices,
            buffer_limit=context.settings.buffer_limit,
            grace_s=context.settings.fetch_grace_s,
        )

    @property
    def partitions(self) -> Positions[ConsumedRecord]:
        """Where the instance stands in each partition it reads."""
        return self.state.positions

    @property
    def instance_id(self) -> str:
        return self.config.name

    # Subscription and assignment ----------------------------------------------------------

    async def subscribe(self, topics: Sequence[str] | None, pattern: str | None) -> None:
        async with self._lock:
            await self._subscribe(topics, pattern)

    async def _subscribe(self, topics: Sequence[str] | None, pattern: str | None) -> None:
        if self.state.manual:
            raise ConsumerStateConflict("the instance has manual assignments; delete them first")
        if (self.subscription or self.pattern) and (pattern is None) != (self.pattern is None):
            # REST Proxy replaces a subscription; aiokafka refuses to turn topics into a
            # pattern or back (mutually exclusive), so the old one is left first.
            await self._unsubscribe()
        consumer = await self._ensure_consumer()
        self.subscription = list(topics or [])
        self.pattern = pattern
        consumer.subscribe(self.subscription, pattern, self)
        for topic in self.subscription:
            await self.context.registry.runtime(topic)  # load and watch managed topics now

    async def unsubscribe(self) -> None:
        """Leave the subscription and any manual assignment, as Kafka's unsubscribe.

        The Kafka consumer is closed (leaving the group), not only unsubscribed: its
        coordinator may still be rejoining for the old subscription, and a manual
        assignment made meanwhile fails inside aiokafka ("Should not be called"). The
        next subscribe or assign starts a fresh one.
        """
        async with self._lock:
            await self._unsubscribe()

    async def _unsubscribe(self) -> None:
        await self._stop_consumer()
        self.subscription, self.pattern, self.state.manual = [], None, []
        self.state.positions.reset()
        self.state.notices.forget()

    async def assign_manually(self, partitions: Sequence[TopicPartition]) -> None:
        async with self._lock:
            await self._assign_manually(partitions)

    async def _assign_manually(self, partitions: Sequence[TopicPartition]) -> None:
        if self.subscription or self.pattern:
            raise ConsumerStateConflict("the instance is subscribed; unsubscribe first")
        if not partitions:
            # Kafka's assign of nothing is its unsubscribe; aiokafka would keep the consumer
            # in manual mode with nothing assigned, refusing a later subscription.
            await self._unsubscribe()
            return
        consumer = await self._ensure_consumer()
        consumer.assign(partitions)
        self.state.manual = list(partitions)
        self.state.positions.follow(partitions, consumer.incarnation())

    def subscribed_topics(self) -> list[str]:
        """The topics named, or those a pattern matches now (as Kafka's consumer says)."""
        consumer = self.state.consumer
        if self.pattern is None or consumer is None:
            return list(self.subscription)
        return sorted(consumer.subscription())

    def assignment(self) -> list[TopicPartition]:
        consumer = self.state.consumer
        if consumer is None:
            return []
        return sorted(consumer.assignment())

    def rebalance_if_subscribed(self, topics: Iterable[str]) -> bool:
        """Ask the group to rebalance if this instance subscribes to one of ``topics``;
        True if so.

        Kafka's consumer rebalances on its own when a topic's partition count changes,
        not when the sidecar's assignor would assign differently.
        """
        consumer = self.state.consumer
        if consumer is None or self.state.manual or not set(topics) & set(self.subscribed_topics()):
            return False
        consumer.request_rejoin()
        self.context.metrics.rebalance_requested(self.config.group)
        return True

    def stalled(self, seconds: float) -> bool:
        """This process did not run for ``seconds``: fence the hand-off and ask the group
        to rebalance (True if asked). An instance with partitions assigned by hand has no
        group to lose them to."""
        if not self.rebalance_if_subscribed(self.subscribed_topics()):
            return False
        self.state.fence()
        return True

    # Polling ------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def delivery(self, timeout_s: float, max_bytes: int | None) -> AsyncIterator[PollResult]:
        """Poll (see ``poll``) and hold the instance until the caller has sent the result:
        it counts as delivered if the block ends normally, and is put back (delivered
        again by the next poll, never skipped) if the block raises, e.g. because the
        response could not be encoded or the client went away."""
        async with self._lock:
            result = await self._poll(timeout_s, max_bytes)
            try:
                yield result
            except BaseException:
                self.undeliver(result)
                raise
            self.sent(result)

    async def poll(self, timeout_s: float, max_bytes: int | None) -> PollResult:
        """Records the gate lets through (and pending hand-off events), waiting up to
        ``timeout_s`` for at least one. Raises ConsumerStateConflict if not subscribed.
        The caller says ``sent`` or ``undeliver`` before the next poll (``delivery``
        does both)."""
        async with self._lock:
            return await self._poll(timeout_s, max_bytes)

    async def _poll(self, timeout_s: float, max_bytes: int | None) -> PollResult:
        consumer = self._require_subscribed()
        recheck_s = self.context.settings.gate_recheck_s
        deadline = time.monotonic() + timeout_s
        if self.config.auto_commit:
            await self.offsets.commit_quietly(force=False)
            await self.offsets.help_waiters()
        while True:
            await self.fetcher.fetch(
                consumer, max(0.0, min(recheck_s, deadline - time.monotonic()))
            )
            # A rebalance listener commits what was delivered only once no release runs,
            # so a record is never released after the commit that hands its partition over.
            async with self._delivery_lock:
                result = await self.release.release(max_bytes)
            if result.records or result.events or result.notices:
                return result
            if time.monotonic() >= deadline:
                return result
            if self.config.auto_commit:
                await self.offsets.help_waiters()
            await asyncio.sleep(recheck_s)

    def undeliver(self, result: PollResult) -> None:
        """Put back what was released but could not be sent to the app."""
        self.release.undeliver(result)

    def sent(self, result: PollResult) -> None:
        """The response carrying ``result`` reached the app: its records count as
        delivered (what a commit may cover from now on), and are audited."""
        self.release.sent()
        self.release.audit_delivered(result)

    async def acknowledge_events(self, event_ids: Iterable[int]) -> None:
        """The app handled these events. Raises BadRequest for an id that is not pending
        (and then acknowledges none of them)."""
        async with self._lock:
            await self.handoff.acknowledge_events(event_ids)

    # Offsets and positions ----------------------------------------------------------------

    async def commit(self, offsets: Mapping[TopicPartition, int] | None) -> None:
        """See ``Offsets.commit``."""
        async with self._lock:
            await self.offsets.commit(offsets)

    async def committed(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        async with self._lock:
            return await self.offsets.committed(partitions)

    def require_assigned(self, partitions: Iterable[TopicPartition]) -> None:
        """Raises ConsumerStateConflict (no consumer yet) or BadRequest (a partition not
        assigned to this instance)."""
        assigned = self.state.require_consumer().assignment()
        for tp in partitions:
            if tp not in assigned:
                raise BadRequest(f"{tp.topic}[{tp.partition}] is not assigned to this instance")

    async def seek(self, offsets: Mapping[TopicPartition, int]) -> None:
        async with self._lock:
            await self._seek(offsets)

    async def seek_positions(
        self, offsets: Mapping[TopicPartition, int], timestamps: Mapping[TopicPartition, int]
    ) -> None:
        """Seek to ``offsets`` and to the offsets of ``timestamps``, after checking that
        every partition of both is assigned here (nothing moves otherwise)."""
        async with self._lock:
            self.require_assigned([*offsets, *timestamps])
            await self._seek(offsets)
            if timestamps:
                await self._seek_to_timestamps(timestamps)

    async def _seek(self, offsets: Mapping[TopicPartition, int]) -> None:
        consumer = self.state.require_consumer()
        self.require_assigned(offsets)
        for tp, offset in offsets.items():
            consumer.seek(tp, offset)
            self.state.positions.seek(tp, offset, consumer.incarnation())

    async def _seek_to_timestamps(self, timestamps: Mapping[TopicPartition, int]) -> None:
        consumer = self.state.require_consumer()
        # Before the lookup: for a partition not assigned (or of no topic) aiokafka waits
        # for metadata until the request timeout, holding the instance's lock.
        self.require_assigned(timestamps)
        found = await consumer.offsets_for_times(timestamps)
        offsets = {}
        for tp, hit in found.items():
            # No record at or after the time: the end, as Kafka's seek by time does.
            offsets[tp] = await consumer.end_offset(tp) if hit is None else hit
        await self._seek(offsets)

    async def seek_to(self, partitions: Sequence[TopicPartition], *, beginning: bool) -> None:
        async with self._lock:
            await self._seek_to(partitions, beginning=beginning)

    async def _seek_to(self, partitions: Sequence[TopicPartition], *, beginning: bool) -> None:
        consumer = self.state.require_consumer()
        self.require_assigned(partitions)
        if not partitions:
            return  # an empty list seeks none (aiokafka would read it as "all assigned")
        # A new reading from here: a fetch that returns before the seek is dropped; one
        # from the new position, returning before it is known, is kept.
        positions = self.state.positions
        for tp in partitions:
            positions.begin_seek(tp, consumer.incarnation())
        await consumer.seek_to(partitions, beginning=beginning)
        for tp in partitions:
            positions.seek_landed(tp, await consumer.position(tp))

    # Rebalances (the group consumer's RebalanceHandler) -------------------------------------

    async def partitions_revoked(self, partitions: set[TopicPartition]) -> None:
        # From here on nothing more is released from these partitions.
        self.state.revoking |= partitions
        try:
            ordered = sorted(partitions)
            notice = await self.notices.tell_revoked(ordered)
            if notice is not None:
                async with self._delivery_lock:
                    self.state.notices.queue(notice)
            if self.config.auto_commit:
                with contextlib.suppress(SidecarError):
                    await self.offsets.tell_before_revoke(ordered)
            # Outside the delivery lock: the app keeps polling, and finds and acknowledges
            # the keys-revoked events this waits for.
            await self.handoff.record_before_revoke(
                ordered,
                wait_s=self.context.settings.revoke_ack_wait_s,
                retry_s=self.context.settings.callback_retry_s,
                poll_s=self.context.settings.revoke_ack_poll_s,
            )
            async with self._delivery_lock:
                if self.config.auto_commit:
                    with contextlib.suppress(SidecarError):
                        await self.offsets.auto_commit(force=True)
                self.revoked(partitions)
        finally:
            self.state.revoking -= partitions

    async def partitions_assigned(self, partitions: set[TopicPartition]) -> None:
        # Buffers start empty; positions come from the group's committed offsets.
        ordered = sorted(partitions)
        # The group has said again who owns what: a fence of a stall is lifted.
        self.state.unfence()
        self.context.metrics.rebalanced(self.config.group)
        consumer = self.state.consumer
        if consumer is not None:
            self.state.positions.follow(ordered, consumer.incarnation())
            await self._begin_uncommitted_at_log_start(consumer, ordered)
        if self.state.notices.enabled:
            notice = await self.notices.tell_assigned(ordered)
            # A release under way took the queued notices before it looked at any
            # partition: marked told during it, a partition would release records in a
            # response without its notice.
            async with self._delivery_lock:
                if notice is not None:
                    self.state.notices.queue(notice)
                self.state.notices.told_assigned(ordered)

    async def _begin_uncommitted_at_log_start(
        self, consumer: InstanceConsumer, partitions: Sequence[TopicPartition]
    ) -> None:
        """Begin each assigned partition of a managed topic that the group has no
        commit for, while it has commits in the topic, at its log start
        (``sidecar.core.reading_start``): a partition a change made since the group
        began, whose records "latest" would skip.

        In the rebalance listener, before the new assignment is fetched from: aiokafka
        places its positions (the group's commits, or ``auto.offset.reset``) once the
        listener has returned, and a seek made here comes first. If Kafka cannot say
        (the commits or log starts not read), the setting places them, as before; that
        is logged."""
        if self.config.auto_offset_reset == EARLIEST:
            return
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        for topic, assigned in sorted(by_topic.items()):
            runtime = await self.context.registry.runtime(topic)
            if runtime is None:
                continue  # not managed: no change adds its partitions under the group
            # The topic as last read may not show a partition a change just added yet.
            count = max(len(runtime.state.modes), max(assigned) + 1)
            try:
                # Bounded: the whole group's rebalance waits for this listener.
                async with asyncio.timeout(self.context.settings.reading_start_wait_s):
                    offsets = self.context.offsets
                    committed = await offsets.committed_offsets(self.state.group, topic, count)
                    begin = from_log_start(self.config.auto_offset_reset, assigned, committed)
                    if not begin:
                        continue
                    log_start = await offsets.log_start_offsets(topic, count)
            except (SidecarError, TimeoutError) as exc:
                _log.warning(
                    "%s/%s: partitions %s of %s placed by auto.offset.reset %s: the group's "
                    "commits or the log starts could not be read (%s)",
                    self.state.group,
                    self.instance_id,
                    assigned,
                    topic,
                    self.config.auto_offset_reset,
                    exc.message if isinstance(exc, SidecarError) else "timed out",
                )
                continue
            for partition in begin:
                tp = TopicPartition(topic, partition)
                consumer.seek(tp, log_start[partition])
                self.state.positions.seek(tp, log_start[partition], consumer.incarnation())
            _log.info(
                "%s/%s: %s partitions %s begin at their log start: no commit of the group "
                "there, which has commits in the topic",
                self.state.group,
                self.instance_id,
                topic,
                begin,
            )

    def revoked(self, partitions: Iterable[TopicPartition]) -> None:
        gone = set(partitions)
        consumer = self.state.consumer
        if consumer is None:
            self.state.positions.reset()
        else:
            # The whole assignment goes, with aiokafka's eager rebalancing, and no state
            # is made for it again (aiokafka reports it until the next one is in).
            self.state.positions.revoked(consumer.incarnation())
        self.handoff.partitions_lost(gone)

    # Life cycle ---------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A request of the app is being served (the idle reaper leaves it alone)."""
        return self._lock.locked()

    async def close(self) -> None:
        """Once the request being served (if any) is done: leave the group, stop."""
        async with self._lock:
            await self._stop_consumer()
            if self._callbacks is not None:
                await self._callbacks.close()

    async def _stop_consumer(self) -> None:
        await self.waits.clear_all()
        self.fetcher.cancel()
        await self.handoff.close()
        consumer = self.state.consumer
        if consumer is not None:
            if self.config.auto_commit:
                with contextlib.suppress(SidecarError):
                    await self.offsets.auto_commit(force=True)
            await consumer.stop()
            self.state.consumer = None

    async def _ensure_consumer(self) -> InstanceConsumer:
        consumer = self.state.consumer
        if consumer is None:
            consumer = self.state.consumer = await self.context.start_consumer(
                GroupConsumerOptions(
                    group=self.config.group,
                    client_suffix=self.instance_id,
                    auto_offset_reset=self.config.auto_offset_reset,
                    fetch_min_bytes=self.config.fetch_min_bytes,
                    metadata_max_age_ms=self.context.settings.metadata_max_age_ms,
                )
            )
        return consumer

    def _require_subscribed(self) -> InstanceConsumer:
        consumer = self.state.require_consumer()
        if not (self.subscription or self.pattern or self.state.manual):
            raise ConsumerStateConflict("the instance is neither subscribed nor assigned")
        return consumer
