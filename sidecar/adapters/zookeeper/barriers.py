"""A change's barrier in ZooKeeper: publish it, the sidecars' acks, its withdrawal, and
the commit of the generation that ends it.

``<root>/topics/<t>/pending`` is the pending barrier (only while one is pending);
``<root>/topics/<t>/barrier/<g>/<id>`` a sidecar's ack, ``{"acked": {"<partition>":
next_offset}}``. Only the journal's owner writes them (``Operations``).

A commit changes the generation log, the current generation, the modes, the pending
barrier and the journal in one multi-op transaction, so a reader never sees half of it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from contextlib import suppress

from kazoo.exceptions import NodeExistsError, NoNodeError

from sidecar.adapters.zookeeper.connection import (
    RACE_ERRORS,
    ZooKeeperConnection,
    commit,
    encode,
)
from sidecar.adapters.zookeeper.operations import Operations
from sidecar.adapters.zookeeper.topics import encode_generation, encode_partitions
from sidecar.core import names as _names
from sidecar.core.errors import (
    ChangeTakenOver,
    MetadataUnavailable,
    OperationInProgress,
    UnknownTopic,
)
from sidecar.core.generations import Generation, PartitionMode
from sidecar.core.procedures import Operation, SidecarId
from sidecar.core.serialization import operation_to_json, pending_from_json, pending_to_json
from sidecar.core.topics import PendingBarrier

# The adapter's modules log under one name, the package's.
log = logging.getLogger(__package__)


class Barriers:
    """Barriers, their acks and the commit of a generation, written as the journal's
    owner (``Operations``)."""

    def __init__(self, connection: ZooKeeperConnection, operations: Operations) -> None:
        self._connection = connection
        self._operations = operations

    async def publish_barrier(self, topic: str, pending: PendingBarrier) -> None:
        """Publish ``pending``; publishing it again is a no-op. Raises UnknownTopic,
        OperationInProgress if a different barrier is pending, and ChangeTakenOver if
        another coordinator wrote the journal since this store did."""
        await self._connection.run(self._publish_barrier, topic, pending)

    def _publish_barrier(self, topic: str, pending: PendingBarrier) -> None:
        path = self._connection.topic_path(topic)
        barrier = self._connection.barrier_path(topic, pending.generation)
        existing = self._connection.get_json(f"{path}/pending")
        if existing is not None:
            if pending_from_json(existing) != pending:
                raise OperationInProgress(f"another barrier is pending on {topic!r}: {existing}")
            return
        if self._connection.client.exists(path) is None:
            raise UnknownTopic(f"topic {topic!r} is not managed")
        # A coordinator that lost its lock (paused past its session) and retries its
        # publish after a successor finished the change would leave a barrier nobody
        # owns, and every later change would be refused: only the journal's owner writes.
        self._operations.require_journal_owner(topic)
        # Acks left by an earlier attempt at this generation, interrupted while rolling
        # back, would count for sidecars that never held for this one.
        self._connection.delete_tree(barrier)
        self._connection.client.ensure_path(f"{path}/barrier")
        transaction = self._connection.client.transaction()
        self._operations.check_journal_owner(transaction, topic)
        transaction.create(barrier)
        transaction.create(f"{path}/pending", encode(pending_to_json(pending)))
        self._operations.commit_as_owner(transaction, topic)

    async def ack_barrier(
        self, topic: str, generation: int, sidecar_id: str, acked: Mapping[int, int]
    ) -> None:
        """Record that ``sidecar_id`` holds for ``generation``; ``acked`` maps a partition to
        one past its highest acknowledged offset. An ack for a barrier already committed or
        rolled back is dropped."""
        await self._connection.run(self._ack_barrier, topic, generation, sidecar_id, acked)

    def _ack_barrier(
        self, topic: str, generation: int, sidecar_id: str, acked: Mapping[int, int]
    ) -> None:
        path = f"{self._connection.barrier_path(topic, generation)}/{_names.sidecar_id(sidecar_id)}"
        data = encode({"acked": {str(p): offset for p, offset in acked.items()}})
        try:
            self._connection.client.create(path, data)
        except NodeExistsError:
            self._connection.client.set(path, data)
        except NoNodeError:
            log.info("dropped an ack for the finished barrier %s of %s", generation, topic)

    async def barrier_acks(self, topic: str, generation: int) -> dict[SidecarId, dict[int, int]]:
        return await self._connection.run(self._barrier_acks, topic, generation)

    def _barrier_acks(self, topic: str, generation: int) -> dict[SidecarId, dict[int, int]]:
        barrier = self._connection.barrier_path(topic, generation)
        try:
            children = self._connection.client.get_children(barrier)
        except NoNodeError:
            return {}
        acks: dict[SidecarId, dict[int, int]] = {}
        values = self._connection.get_json_many([f"{barrier}/{child}" for child in children])
        for child, raw in zip(children, values, strict=True):
            if raw is not None:
                acks[SidecarId(child)] = {int(p): int(o) for p, o in raw["acked"].items()}
        return acks

    async def barrier_ackers(self, topic: str, generation: int) -> frozenset[SidecarId]:
        """The sidecars that have acked the barrier for ``generation``: its children's
        names alone, one request however many sidecars (``barrier_acks`` reads each
        ack's offsets too)."""
        return await self._connection.run(self._barrier_ackers, topic, generation)

    def _barrier_ackers(self, topic: str, generation: int) -> frozenset[SidecarId]:
        barrier = self._connection.barrier_path(topic, generation)
        try:
            return frozenset(
                SidecarId(child) for child in self._connection.client.get_children(barrier)
            )
        except NoNodeError:
            return frozenset()

    async def remove_barrier(self, topic: str, generation: int) -> None:
        """Withdraw the barrier for ``generation`` (a rollback) and its acks; idempotent.
        Raises ChangeTakenOver if another coordinator wrote the journal since this store
        did: the barrier may then be its successor's, published again when resuming."""
        await self._connection.run(self._withdraw_barrier, topic, generation)

    def _withdraw_barrier(self, topic: str, generation: int) -> None:
        pending_path = f"{self._connection.topic_path(topic)}/pending"
        self._operations.require_journal_owner(topic)
        try:
            raw, stat = self._connection.client.get(pending_path)
        except NoNodeError:
            pass
        else:
            if pending_from_json(json.loads(raw)).generation == generation:
                transaction = self._connection.client.transaction()
                self._operations.check_journal_owner(transaction, topic)
                transaction.delete(pending_path, version=stat.version)
                with suppress(NoNodeError):  # withdrawn meanwhile: that is the goal
                    self._operations.commit_as_owner(transaction, topic)
        self._connection.delete_tree(self._connection.barrier_path(topic, generation))

    def _remove_barrier(self, topic: str, generation: int) -> None:
        pending_path = f"{self._connection.topic_path(topic)}/pending"
        try:
            raw, stat = self._connection.client.get(pending_path)
            if pending_from_json(json.loads(raw)).generation == generation:
                self._connection.client.delete(pending_path, version=stat.version)
        except NoNodeError:
            pass
        self._connection.delete_tree(self._connection.barrier_path(topic, generation))

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
        await self._connection.run(
            self._commit_generation, topic, generation, modes, delete_after, operation
        )

    def _commit_generation(
        self,
        topic: str,
        generation: Generation,
        modes: tuple[PartitionMode, ...],
        delete_after: tuple[float | None, ...],
        operation: Operation,
    ) -> None:
        path, number = self._connection.topic_path(topic), generation.number
        for _ in range(self._connection.transaction_attempts):
            if (
                self._connection.client.exists(self._connection.generation_path(topic, number))
                is not None
            ):
                self._remove_barrier(topic, number)
                self._operations.save_operation_blocking(operation)
                return
            try:
                raw, topic_stat = self._connection.client.get(path)
            except NoNodeError as exc:
                raise UnknownTopic(f"topic {topic!r} is not managed") from exc
            head = json.loads(raw)
            current = head["current_generation"]
            if number != current + 1:
                raise ValueError(f"generation {number} cannot follow {current} of {topic!r}")
            transaction = self._connection.client.transaction()
            transaction.create(
                self._connection.generation_path(topic, number), encode_generation(generation)
            )
            head["current_generation"] = number
            transaction.set_data(path, encode(head), version=topic_stat.version)
            transaction.set_data(f"{path}/partitions", encode_partitions(modes, delete_after))
            pending_stat = self._connection.client.exists(f"{path}/pending")
            if pending_stat is not None:
                transaction.delete(f"{path}/pending", version=pending_stat.version)
            barrier = self._connection.barrier_path(topic, number)
            if self._connection.client.exists(barrier) is not None:
                for child in self._connection.client.get_children(barrier):
                    transaction.delete(f"{barrier}/{child}")
                transaction.delete(barrier)
            ops_path, ops_data = (
                self._connection.ops_path(topic),
                encode(operation_to_json(operation)),
            )
            expected = self._operations.journal_version(topic)
            ops_stat = self._connection.client.exists(ops_path)
            if ops_stat is None:
                transaction.create(ops_path, ops_data)
            elif expected is not None and ops_stat.version != expected:
                self._operations.forget_journal_version(topic)
                raise ChangeTakenOver(
                    f"the journal of {topic!r} was changed by another coordinator"
                )
            else:
                transaction.set_data(ops_path, ops_data, version=ops_stat.version)
            try:
                commit(transaction)
                self._operations.forget_journal_version(topic)
                return
            except RACE_ERRORS:
                log.info("commit of generation %s of %s raced; retrying", number, topic)
        raise MetadataUnavailable(f"commit of generation {number} of {topic!r} kept racing")
