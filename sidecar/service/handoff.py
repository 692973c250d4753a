"""Telling one consumer instance's app of key hand-off (``sidecar.core.handoff``).

By calling the app's callback URL (and waiting for a 2xx), or as events in the poll
response that the app acknowledges. The ``HandoffLedger`` (pure) holds what was told
and acknowledged; this component keeps the instance's ledger (in its ``ConsumeState``)
current, records the app's keys_revoked acknowledgements for the group in ZooKeeper
(``acknowledge_revocation``), and reads the group's (another instance, a previous owner
of the partition, may have got one acknowledged).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from sidecar.config import ConsumerSettings
from sidecar.core.consume import TopicPartition
from sidecar.core.errors import CallbackFailed, ConsumerStateConflict, SidecarError
from sidecar.core.handoff import (
    HandoffCallback,
    HandoffEvent,
    HandoffKind,
    Revocation,
    Subject,
)
from sidecar.service.consume_context import AppCallbacks, GroupStore
from sidecar.service.consume_state import ConsumeState

_log = logging.getLogger(__name__)


class HandoffTeller:
    def __init__(
        self,
        state: ConsumeState,
        store: GroupStore,
        callbacks: AppCallbacks | None,
        *,
        patience_s: float = ConsumerSettings().callback_patience_s,
    ) -> None:
        self.state = state
        """The instance's shared state: this component keeps its ``ledger`` current and
        tells nothing while it is ``fenced``."""
        self.patience_s = patience_s
        """How long a patient callback is retried, at least (``consumer.callback_patience_s``)."""
        self.store = store
        self.callbacks = callbacks
        self._unrecorded: set[Subject] = set()
        """keys_revoked acknowledged here but not written to ZooKeeper yet (it was away)."""
        self._revoke_calls: dict[Subject, tuple[asyncio.Task[None], bool]] = {}
        """keys_revoked callbacks under way (and whether each is patient): the release
        loop, a commit and a rebalance listener can all need the same one at once, and
        the app must be called once, not once per need."""
        self._closed = False
        """The instance is being deleted: its app no longer polls, so nothing told is
        waited for."""

    def _require_unfenced(self) -> None:
        if self.state.fenced:
            raise ConsumerStateConflict(
                "this sidecar was stopped for a while; its consumer group is rebalancing "
                "before anything more is told or delivered: retry the request"
            )

    # The group's acknowledgements ---------------------------------------------------------

    async def read_group(self, topic: str) -> frozenset[tuple[int, int]]:
        """Write what is unrecorded, then read the group's acknowledged revocations of
        ``topic`` into the ledger. Raises SidecarError while ZooKeeper is away."""
        await self.record_unrecorded()
        state = self.state
        group_acknowledged = await self.store.acknowledged_revocations(state.group, topic)
        state.ledger = state.ledger.with_group_revocations(topic, group_acknowledged)
        return state.ledger.revocations(topic)

    async def pending_events(self) -> list[HandoffEvent]:
        """The events the app still has to acknowledge, less the keys_revoked the group
        acknowledged meanwhile through another instance (a previous owner of the
        partition, whose app got it first): those are told once, not again. None while
        fenced."""
        state = self.state
        if state.fenced:
            return []
        pending = state.ledger.pending.values()
        revoking = {e.topic for e in pending if e.kind is HandoffKind.KEYS_REVOKED}
        for topic in revoking:
            try:
                group = await self.store.acknowledged_revocations(state.group, topic)
            except SidecarError:
                continue  # ZooKeeper away: tell what is pending, as before
            state.ledger = state.ledger.with_group_revocations(topic, group)
        return list(state.ledger.pending.values())

    def told_revocations(self) -> list[HandoffEvent]:
        """The keys_revoked events told to the app and not acknowledged yet."""
        pending = self.state.ledger.pending.values()
        return [e for e in pending if e.kind is HandoffKind.KEYS_REVOKED]

    async def record_unrecorded(self) -> None:
        for subject in sorted(self._unrecorded):
            try:
                await self.store.acknowledge_revocation(self.state.group, *subject)
            except SidecarError as exc:
                _log.info("keys_revoked acknowledgement kept for later: %s", exc.message)
                return
            self._unrecorded.discard(subject)

    async def record_before_revoke(
        self,
        partitions: Sequence[TopicPartition],
        *,
        wait_s: float,
        retry_s: float,
        poll_s: float = ConsumerSettings().revoke_ack_poll_s,
    ) -> None:
        """Before a rebalance gives ``partitions`` away, let the app acknowledge the
        keys_revoked events it was told for them, and write the acknowledgements this
        instance holds for them to ZooKeeper; for at most ``wait_s`` in all.

        The partitions' next owner reads the group's acknowledgements before telling its
        own app: one told here and acknowledged just after the rebalance, or kept here
        (ZooKeeper was away when the app answered), would be told again. The rebalance
        waits (aiokafka awaits the listener); the app keeps polling meanwhile and finds
        the events in its records responses.
        """
        leaving = {(tp.topic, tp.partition) for tp in partitions}
        deadline = time.monotonic() + wait_s
        while any((e.topic, e.partition) in leaving for e in self.told_revocations()):
            if self._closed or time.monotonic() >= deadline:
                break
            await asyncio.sleep(poll_s)
        while True:
            held = [s for s in self._unrecorded if (s.topic, s.partition) in leaving]
            if not held:
                return
            await self.record_unrecorded()
            if not any(s in self._unrecorded for s in held):
                return
            if time.monotonic() >= deadline:
                _log.warning(
                    "keys_revoked acknowledgements of %s not recorded before the rebalance; "
                    "the partitions' next owner may tell them again",
                    sorted(held),
                )
                return
            await asyncio.sleep(retry_s)

    def partitions_lost(self, partitions: Iterable[TopicPartition]) -> None:
        """Their keys_revoked events are no longer this instance's to tell: the new owner
        tells its app whatever the group has not acknowledged. An app that already got
        one may still acknowledge it (and spare the new owner's app the telling)."""
        state = self.state
        state.ledger = state.ledger.partitions_lost({(tp.topic, tp.partition) for tp in partitions})

    # Telling the app ----------------------------------------------------------------------

    async def announce(
        self, kind: HandoffKind, subject: Subject, events: list[HandoffEvent]
    ) -> bool:
        """Tell the app; True once it has confirmed (callback 2xx or event acknowledged).
        Raises ConsumerStateConflict while fenced."""
        self._require_unfenced()
        if self.callbacks is not None:
            await self._call_back(kind, subject)
            self.state.ledger = self.state.ledger.confirmed(kind, *subject)
            return True
        self.state.ledger, event = self.state.ledger.tell(kind, *subject)
        if event is None:
            return True
        if event not in events:
            events.append(event)
        return False

    async def acknowledge_events(self, event_ids: Iterable[int]) -> None:
        """The app handled these events. Raises BadRequest for an id that is not pending
        (and then acknowledges none of them)."""
        self.state.ledger, acknowledged = self.state.ledger.acknowledge(list(event_ids))
        for event in acknowledged:
            if event.kind is HandoffKind.KEYS_REVOKED:
                self._unrecorded.add(event.subject)
        await self.record_unrecorded()

    async def revocation_pending(
        self, topic: str, revocation: Revocation, *, patient: bool = True
    ) -> HandoffEvent | None:
        """None once the app knows of ``revocation`` (its callback answered, or its event
        was acknowledged, here or through another instance of the group); otherwise the
        event it still has to acknowledge, created on first need. In callback mode this
        calls the callback (see ``_call_back``; raises CallbackFailed). Raises
        ConsumerStateConflict while fenced."""
        subject = Subject(topic, revocation.partition, revocation.generation)
        if self.state.ledger.acknowledged(HandoffKind.KEYS_REVOKED, *subject):
            return None
        self._require_unfenced()
        if self.callbacks is not None:
            await self._revoke_call(subject, patient=patient)
            await self.record_unrecorded()
            return None
        self.state.ledger, event = self.state.ledger.tell(HandoffKind.KEYS_REVOKED, *subject)
        return event

    async def require_revoked(self, topic: str, revocation: Revocation) -> None:
        """Raises ConsumerStateConflict until the app has acknowledged ``revocation``."""
        pending = await self.revocation_pending(topic, revocation)
        if pending is not None:
            raise ConsumerStateConflict(
                f"acknowledge event {pending.event_id} (keys_revoked for {topic}"
                f"[{revocation.partition}]) before committing past offset "
                f"{revocation.boundary}; it is in the next records response"
            )

    async def close(self) -> None:
        self._closed = True
        for call, _ in list(self._revoke_calls.values()):
            call.cancel()

    # Callbacks ----------------------------------------------------------------------------

    async def _call_back(
        self,
        kind: HandoffKind,
        subject: Subject,
        *,
        patient: bool = True,
        still_needed: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """POST the hand-off event and wait for a 2xx; retried for ``patience_s`` if ``patient``,
        else for one callback timeout. ``still_needed`` is asked before every attempt
        (False: done without calling). Raises CallbackFailed."""
        assert self.callbacks is not None
        within_s = self.callbacks.timeout_s
        if patient:
            within_s = max(self.patience_s, within_s)
        message = HandoffCallback(kind, self.state.group, self.state.instance_id, subject)
        failure = await self.callbacks.post(message, within_s=within_s, still_needed=still_needed)
        if failure is not None:
            raise CallbackFailed(
                f"{kind.value} callback for {subject.topic}[{subject.partition}] failed: "
                f"{failure}; nothing was delivered or committed past it, retry the request"
            )

    async def _revoke_call(self, subject: Subject, *, patient: bool) -> None:
        """Call the keys_revoked callback for ``subject``, or join the call under way.

        A patient caller that joined an impatient call which failed calls again, with
        its own patience. Raises CallbackFailed.
        """
        while True:
            under_way = self._revoke_calls.get(subject)
            if under_way is None:
                call = asyncio.ensure_future(self._call_back_revoked(subject, patient=patient))
                under_way = (call, patient)
                self._revoke_calls[subject] = under_way
                call.add_done_callback(lambda done: self._revoke_call_ended(subject, done))
            call, call_patient = under_way
            try:
                # Shielded: a caller cancelled (a poll timing out) leaves the call to
                # the others, instead of cutting it off after the app may have acted.
                await asyncio.shield(call)
                return
            except CallbackFailed:
                if call_patient or not patient:
                    raise

    async def _call_back_revoked(self, subject: Subject, *, patient: bool) -> None:
        topic, partition, generation = subject

        async def not_acknowledged_yet() -> bool:
            # Asked again before every attempt: a call that waited (a retry, a rebalance,
            # a process paused past its sessions) may find that the partition's new owner
            # got it acknowledged meanwhile. While ZooKeeper cannot say, nothing is sent.
            group = await self.store.acknowledged_revocations(self.state.group, topic)
            self.state.ledger = self.state.ledger.with_group_revocations(topic, group)
            return (partition, generation) not in group

        await self._call_back(
            HandoffKind.KEYS_REVOKED, subject, patient=patient, still_needed=not_acknowledged_yet
        )
        # Noted before the call counts as ended, so that no caller in between finds it
        # neither acknowledged nor under way and calls the app again.
        self.state.ledger = self.state.ledger.with_group_revocations(
            topic, {(partition, generation)}
        )
        self._unrecorded.add(subject)

    def _revoke_call_ended(self, subject: Subject, call: asyncio.Task[None]) -> None:
        under_way = self._revoke_calls.get(subject)
        if under_way is not None and under_way[0] is call:
            del self._revoke_calls[subject]
        if not call.cancelled():
            call.exception()  # retrieved: every waiter got it, or none is left to
