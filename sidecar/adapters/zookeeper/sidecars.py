"""The live sidecars and the transactional ids they write with, in ZooKeeper.

``<root>/sidecars/<id>`` is a live sidecar's registration (ephemeral, made again by
``reregister`` once a new session is up); ``<root>/producers/<transactional id>`` every
transactional id a sidecar registered and has not retired (persistent, until fenced).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from typing import Any

from kazoo.exceptions import NoNodeError

from sidecar.adapters.zookeeper.connection import (
    RACE_ERRORS,
    ZooKeeperConnection,
    commit,
    encode,
)
from sidecar.core.errors import MetadataUnavailable
from sidecar.core.procedures import SidecarId, TransactionalId


class Sidecars:
    """Registration of the sidecars and their producers, and the live sets."""

    def __init__(self, connection: ZooKeeperConnection) -> None:
        self._connection = connection
        self._registrations: dict[str, tuple[bytes, tuple[TransactionalId, ...]]] = {}

    async def register_sidecar(
        self,
        sidecar_id: str,
        info: dict[str, Any],
        transactional_ids: Sequence[TransactionalId] = (),
    ) -> None:
        """Register a live sidecar (ephemeral; re-created after an expired session) and
        the ``transactional_ids`` it writes with (persistent, until fenced or retired),
        in one transaction. Registering again replaces the info."""
        self.prepare_registration(sidecar_id, info, transactional_ids)
        data, ids = self._registrations[sidecar_id]
        await self._connection.run(self._register, sidecar_id, data, ids)

    def prepare_registration(
        self, sidecar_id: str, info: dict[str, Any], transactional_ids: Sequence[TransactionalId]
    ) -> None:
        """What to register for ``sidecar_id`` once a new session is up (no IO now)."""
        # Refused now, not at every re-registration after a new session.
        self._connection.sidecar_path(sidecar_id)
        ids = tuple(transactional_ids)
        for transactional_id in ids:
            self._connection.producer_path(transactional_id)
        # ``transactional_id`` (the first) is what sidecars from before lanes read: a
        # coordinator of theirs fences the other lanes, which costs a new incarnation,
        # never a write across a barrier.
        data = encode(
            info | {"transactional_ids": list(ids), "transactional_id": ids[0] if ids else None}
        )
        self._registrations[sidecar_id] = (data, ids)

    async def reregister(self) -> None:
        """Register again every sidecar registered or prepared here, in a new session.
        Raises MetadataUnavailable."""
        for sidecar_id, (data, transactional_ids) in list(self._registrations.items()):
            await self._connection.run(self._register, sidecar_id, data, transactional_ids)

    def _register(
        self, sidecar_id: str, data: bytes, transactional_ids: tuple[TransactionalId, ...]
    ) -> None:
        path = self._connection.sidecar_path(sidecar_id)
        for _ in range(self._connection.transaction_attempts):
            transaction = self._connection.client.transaction()
            stat = self._connection.client.exists(path)
            if stat is not None and stat.ephemeralOwner == self._connection.session_id():
                transaction.set_data(path, data, version=stat.version)
            else:
                if stat is not None:
                    # Left by an older session of ours that the server has not expired yet.
                    transaction.delete(path, version=stat.version)
                transaction.create(path, data, ephemeral=True)
            for transactional_id in transactional_ids:
                producer = self._connection.producer_path(transactional_id)
                if self._connection.client.exists(producer) is None:
                    transaction.create(producer, encode({"sidecar": sidecar_id}))
            try:
                commit(transaction)
                return
            except RACE_ERRORS:
                continue
        raise MetadataUnavailable(f"registering {sidecar_id} kept racing")

    async def registered_producers(self) -> frozenset[TransactionalId]:
        """Every transactional id registered and not yet fenced or retired."""
        children = await self._connection.run(
            self._connection.client.get_children, f"{self._connection.root}/producers"
        )
        return frozenset(TransactionalId(child) for child in children)

    async def live_producers(self) -> frozenset[TransactionalId]:
        """The transactional ids the live sidecars' registrations name now."""
        return await self._connection.run(self._live_producers)

    def _live_producers(self) -> frozenset[TransactionalId]:
        owned: set[TransactionalId] = set()
        sidecars = f"{self._connection.root}/sidecars"
        # A listed child is a node already: read it whatever rule named it, as a
        # registration a live sidecar made before ids were checked must count.
        children = self._connection.client.get_children(sidecars)
        for raw in self._connection.get_json_many([f"{sidecars}/{c}" for c in children]):
            if not isinstance(raw, dict):
                continue
            if isinstance(raw.get("transactional_id"), str):
                owned.add(TransactionalId(raw["transactional_id"]))
            if isinstance(raw.get("transactional_ids"), list):
                ids = raw["transactional_ids"]
                owned.update(TransactionalId(i) for i in ids if isinstance(i, str))
        return frozenset(owned)

    async def forget_producers(self, transactional_ids: tuple[TransactionalId, ...]) -> None:
        """Drop fenced or retired transactional ids from the registry (idempotent)."""
        await self._connection.run(self._forget_producers, transactional_ids)

    def _forget_producers(self, transactional_ids: tuple[TransactionalId, ...]) -> None:
        for transactional_id in transactional_ids:
            with suppress(NoNodeError):
                self._connection.client.delete(self._connection.producer_path(transactional_id))

    async def live_sidecars(self) -> frozenset[SidecarId]:
        children = await self._connection.run(
            self._connection.client.get_children, f"{self._connection.root}/sidecars"
        )
        return frozenset(SidecarId(child) for child in children)
