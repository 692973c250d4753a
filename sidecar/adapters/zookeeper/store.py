"""``MetadataStore``, the front class of the ZooKeeper adapter: one method per metadata
operation, each carried out by the part of the store that holds its domain.

The parts share one connection (``ZooKeeperConnection``: the kazoo client and the
session's state) and each keeps its own state; the few that need another part's
operation are handed that part here: the session forgets the change locks it lost and
registers the sidecars again (``Operations``, ``Sidecars``), and reading a topic or
writing a barrier goes through the journal (``Operations``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from sidecar.adapters.zookeeper.barriers import Barriers
from sidecar.adapters.zookeeper.connection import ZooKeeperConnection
from sidecar.adapters.zookeeper.groups import Groups
from sidecar.adapters.zookeeper.operations import LockHolder, Operations
from sidecar.adapters.zookeeper.session import Session
from sidecar.adapters.zookeeper.sidecars import Sidecars
from sidecar.adapters.zookeeper.topics import Topics
from sidecar.config import ZooKeeperSecuritySettings
from sidecar.core.generations import Generation, GenerationLog, PartitionMode
from sidecar.core.participant import SessionState
from sidecar.core.procedures import Operation, SidecarId, TransactionalId
from sidecar.core.topics import PendingBarrier, TopicConfig, TopicState
from sidecar.core.truncation import ConfirmedLoss


class MetadataStore:
    """One ZooKeeper session and one method per metadata operation."""

    def __init__(
        self,
        hosts: str,
        *,
        root: str = "/ordered",
        session_timeout_s: float = 10.0,
        lock_poll_s: float = 0.05,
        transaction_attempts: int = 5,
        security: ZooKeeperSecuritySettings | None = None,
    ) -> None:
        self._connection = ZooKeeperConnection(
            hosts,
            root=root,
            session_timeout_s=session_timeout_s,
            transaction_attempts=transaction_attempts,
            security=security,
        )
        self._sidecars = Sidecars(self._connection)
        self._operations = Operations(self._connection, lock_poll_s=lock_poll_s)
        self._session = Session(self._connection, self._sidecars, self._operations)
        self._topics = Topics(self._connection, self._operations)
        self._barriers = Barriers(self._connection, self._operations)
        self._groups = Groups(self._connection)

    # Session --------------------------------------------------------------------------

    async def start(self, timeout: float = 15.0) -> None:  # noqa: ASYNC109
        """Connect. Raises MetadataUnavailable if ZooKeeper does not answer in time (kazoo
        keeps trying in its thread meanwhile, so calling again waits on), and
        MetadataNotAuthorized if it refuses the TLS handshake or the credentials (the
        message names the setting), or if the znodes' ACLs do not let this identity in."""
        await self._session.start(timeout)

    async def stop(self) -> None:
        """Close the session: its ephemeral nodes, the sidecar's registration, go away."""
        await self._session.stop()

    @property
    def session_state(self) -> SessionState:
        return self._session.session_state

    def add_session_listener(self, callback: Callable[[SessionState], None]) -> None:
        """Call ``callback`` on the event loop at every session state change."""
        self._session.add_session_listener(callback)

    # Sidecars -------------------------------------------------------------------------

    async def register_sidecar(
        self,
        sidecar_id: str,
        info: dict[str, Any],
        transactional_ids: Sequence[TransactionalId] = (),
    ) -> None:
        """Register a live sidecar (ephemeral; re-created after an expired session) and
        the ``transactional_ids`` it writes with (persistent, until fenced or retired),
        in one transaction. Registering again replaces the info."""
        await self._sidecars.register_sidecar(sidecar_id, info, transactional_ids)

    def prepare_registration(
        self, sidecar_id: str, info: dict[str, Any], transactional_ids: Sequence[TransactionalId]
    ) -> None:
        """What to register for ``sidecar_id`` once a new session is up (no IO now)."""
        self._sidecars.prepare_registration(sidecar_id, info, transactional_ids)

    async def registered_producers(self) -> frozenset[TransactionalId]:
        """Every transactional id registered and not yet fenced or retired."""
        return await self._sidecars.registered_producers()

    async def live_producers(self) -> frozenset[TransactionalId]:
        """The transactional ids the live sidecars' registrations name now."""
        return await self._sidecars.live_producers()

    async def forget_producers(self, transactional_ids: tuple[TransactionalId, ...]) -> None:
        """Drop fenced or retired transactional ids from the registry (idempotent)."""
        await self._sidecars.forget_producers(transactional_ids)

    async def live_sidecars(self) -> frozenset[SidecarId]:
        return await self._sidecars.live_sidecars()

    # Groups ---------------------------------------------------------------------------

    async def known_groups(self) -> list[str]:
        """Consumer groups registered by sidecars: the groups retirement waits for."""
        return await self._groups.known_groups()

    async def register_group(self, group: str) -> None:
        """Record that ``group`` consumes through the sidecars (persistent, idempotent)."""
        await self._groups.register_group(group)

    async def add_wait(
        self, group: str, topic: str, source: int, boundary: int, instance: str
    ) -> None:
        """Announce that ``instance`` waits for ``group`` to consume ``source`` up to
        ``boundary``, so the instance owning ``source`` commits promptly. Ephemeral: it
        goes away with this session."""
        await self._groups.add_wait(group, topic, source, boundary, instance)

    async def remove_wait(
        self, group: str, topic: str, source: int, boundary: int, instance: str
    ) -> None:
        await self._groups.remove_wait(group, topic, source, boundary, instance)

    async def waits(self, group: str, topic: str) -> dict[int, int]:
        """Per source partition of ``topic``, the highest boundary someone in ``group``
        waits for."""
        return await self._groups.waits(group, topic)

    async def acknowledge_revocation(
        self, group: str, topic: str, partition: int, generation: int
    ) -> None:
        """Record that ``group``'s app acknowledged keys_revoked of ``partition`` for change
        ``generation`` (persistent, idempotent): the gate of the keys' new partition waits
        for it, whichever sidecar it consults."""
        await self._groups.acknowledge_revocation(group, topic, partition, generation)

    async def acknowledged_revocations(self, group: str, topic: str) -> set[tuple[int, int]]:
        """``(partition, generation)`` of every keys_revoked of ``topic`` that ``group``
        acknowledged."""
        return await self._groups.acknowledged_revocations(group, topic)

    # Topics ---------------------------------------------------------------------------

    async def list_topics(self) -> list[str]:
        return await self._topics.list_topics()

    async def create_topic(
        self, config: TopicConfig, generation0: Generation, modes: tuple[PartitionMode, ...]
    ) -> None:
        """Start managing a topic. Raises TopicAlreadyManaged if it is managed already."""
        await self._topics.create_topic(config, generation0, modes)

    async def read_topic(self, topic: str, changed: Callable[[], None] | None = None) -> TopicState:
        """Everything about one topic at one moment. Raises UnknownTopic if unmanaged.
        With ``changed``: called once on the loop after the topic, its partitions or its
        pending barrier next change (the reads arm the watches; read again with it to
        hear of the change after)."""
        return await self._topics.read_topic(topic, changed)

    async def compact_log(self, topic: str, log: GenerationLog, compacted: GenerationLog) -> int:
        """Replace the stored ``log`` by ``compacted``, its folded generations' nodes
        deleted, in one multi-op; returns how many were. Hold ``lock(topic)``. Raises
        OperationInProgress if a change is in progress or the stored log is not ``log``
        any more (nothing is written then), UnknownTopic."""
        return await self._topics.compact_log(topic, log, compacted)

    def watch_topic_list(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the loop whenever a topic becomes managed or stops being
        managed (the children of the topics node change), and once when the watch is set,
        and again after every reconnect (kazoo re-reads the children then)."""
        self._topics.watch_topic_list(callback)

    async def set_partitions(
        self,
        topic: str,
        modes: tuple[PartitionMode, ...],
        delete_after: tuple[float | None, ...],
    ) -> None:
        """Overwrite the partition modes. Hold ``lock(topic)``: the last writer wins, and a
        commit also writes the modes. Raises UnknownTopic."""
        await self._topics.set_partitions(topic, modes, delete_after)

    async def confirmed_truncations(self, topic: str) -> frozenset[ConfirmedLoss]:
        """The lost boundaries of ``topic`` an operator confirmed (``confirm_truncations``)."""
        return await self._topics.confirmed_truncations(topic)

    async def confirm_truncations(self, topic: str, losses: Sequence[ConfirmedLoss]) -> None:
        """Add ``losses`` to the topic's confirmed ones. Raises UnknownTopic."""
        await self._topics.confirm_truncations(topic, losses)

    # Operations -----------------------------------------------------------------------

    def lock(
        self, topic: str, owner: str, timeout: float, purpose: str = "change"
    ) -> AbstractAsyncContextManager[None]:
        """Hold the topic's change lock. Raises OperationInProgress if another holder keeps
        it longer than ``timeout`` seconds (0: do not wait), MetadataUnavailable."""
        return self._operations.lock(topic, owner, timeout, purpose)

    async def release_leftover_locks(self) -> list[str]:
        """Delete every lock node of this session that this store does not hold (left by
        an interrupted acquisition or release); returns their topics."""
        return await self._operations.release_leftover_locks()

    def holds_lock(self, topic: str) -> bool:
        return self._operations.holds_lock(topic)

    async def lock_holder(self, topic: str) -> LockHolder | None:
        """Who holds the topic's change lock now, or None."""
        return await self._operations.lock_holder(topic)

    async def save_operation(self, operation: Operation) -> None:
        """Create or overwrite the topic's operation journal. After this store has read or
        written it, only if nobody else wrote it since: raises ChangeTakenOver then (a
        coordinator that was paused must not overwrite its successor's progress)."""
        await self._operations.save_operation(operation)

    def forget_journal_version(self, topic: str) -> None:
        """Stop checking the journal's version (before starting a new change or resuming)."""
        self._operations.forget_journal_version(topic)

    async def read_operation(self, topic: str) -> Operation | None:
        return await self._operations.read_operation(topic)

    def watch_journal(
        self,
        topic: str,
        seen: Callable[[Operation | None], None],
        unreadable: Callable[[], None],
    ) -> None:
        """Call ``seen`` on the loop with the topic's change journal (None: none) when the
        watch is set, each time the topic's change lock is released, and after a
        reconnect that finds the lock free; ``unreadable`` instead when it cannot be
        read or decoded (``Operations.watch_journal``)."""
        self._operations.watch_journal(topic, seen, unreadable)

    async def take_over_operation(self, topic: str) -> Operation | None:
        """Read the journal to drive it from now on: later saves by this store check that
        nobody else wrote it in between."""
        return await self._operations.take_over_operation(topic)

    # Barrier --------------------------------------------------------------------------

    async def publish_barrier(self, topic: str, pending: PendingBarrier) -> None:
        """Publish ``pending``; publishing it again is a no-op. Raises UnknownTopic,
        OperationInProgress if a different barrier is pending, and ChangeTakenOver if
        another coordinator wrote the journal since this store did."""
        await self._barriers.publish_barrier(topic, pending)

    async def ack_barrier(
        self, topic: str, generation: int, sidecar_id: str, acked: Mapping[int, int]
    ) -> None:
        """Record that ``sidecar_id`` holds for ``generation``; ``acked`` maps a partition to
        one past its highest acknowledged offset. An ack for a barrier already committed or
        rolled back is dropped."""
        await self._barriers.ack_barrier(topic, generation, sidecar_id, acked)

    async def barrier_acks(self, topic: str, generation: int) -> dict[SidecarId, dict[int, int]]:
        return await self._barriers.barrier_acks(topic, generation)

    async def barrier_ackers(self, topic: str, generation: int) -> frozenset[SidecarId]:
        """Who acked the barrier for ``generation``, without their offsets."""
        return await self._barriers.barrier_ackers(topic, generation)

    async def remove_barrier(self, topic: str, generation: int) -> None:
        """Withdraw the barrier for ``generation`` (a rollback) and its acks; idempotent.
        Raises ChangeTakenOver if another coordinator wrote the journal since this store
        did: the barrier may then be its successor's, published again when resuming."""
        await self._barriers.remove_barrier(topic, generation)

    async def commit_generation(
        self,
        topic: str,
        generation: Generation,
        modes: tuple[PartitionMode, ...],
        delete_after: tuple[float | None, ...],
        operation: Operation,
    ) -> None:
        """Commit ``generation`` with its modes, end its barrier and journal ``operation``,
        all in one transaction. Committing it again only finishes the cleanup and saves
        ``operation``. Raises ValueError if it does not follow the current generation,
        UnknownTopic."""
        await self._barriers.commit_generation(topic, generation, modes, delete_after, operation)
