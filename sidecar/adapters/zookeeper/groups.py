"""The consumer groups' records in ZooKeeper: the groups, their gate waits and the
keys_revoked their apps acknowledged.

``<root>/groups/<group>`` is a group some sidecar consumes for; under it,
``waits/<t>:<q>:<b>:<instance>`` (ephemeral) an instance waiting for the group to
consume partition q of t up to offset b, and ``revoked/<t>:<q>:<g>`` (written once) the
app's acknowledgement of keys_revoked of partition q of t for change g.
"""

from __future__ import annotations

from contextlib import suppress

from kazoo.exceptions import NodeExistsError, NoNodeError

from sidecar.adapters.zookeeper.connection import ZooKeeperConnection
from sidecar.core import names as _names


class Groups:
    """The groups, their waits and their acknowledged revocations."""

    def __init__(self, connection: ZooKeeperConnection) -> None:
        self._connection = connection

    async def known_groups(self) -> list[str]:
        """Consumer groups registered by sidecars: the groups retirement waits for."""
        return sorted(
            await self._connection.run(
                self._connection.client.get_children, f"{self._connection.root}/groups"
            )
        )

    async def register_group(self, group: str) -> None:
        """Record that ``group`` consumes through the sidecars (persistent, idempotent)."""
        await self._connection.run(
            self._connection.client.ensure_path, self._connection.group_path(group)
        )

    async def add_wait(
        self, group: str, topic: str, source: int, boundary: int, instance: str
    ) -> None:
        """Announce that ``instance`` waits for ``group`` to consume ``source`` up to
        ``boundary``, so the instance owning ``source`` commits promptly. Ephemeral: it
        goes away with this session."""
        await self._connection.run(
            self._add_wait, group, _wait_name(topic, source, boundary, instance)
        )

    def _add_wait(self, group: str, name: str) -> None:
        self._connection.client.ensure_path(f"{self._connection.group_path(group)}/waits")
        with suppress(NodeExistsError):
            self._connection.client.create(
                f"{self._connection.group_path(group)}/waits/{name}", b"", ephemeral=True
            )

    async def remove_wait(
        self, group: str, topic: str, source: int, boundary: int, instance: str
    ) -> None:
        name = _wait_name(topic, source, boundary, instance)
        path = f"{self._connection.group_path(group)}/waits/{name}"
        with suppress(NoNodeError):
            await self._connection.run(self._connection.client.delete, path)

    async def waits(self, group: str, topic: str) -> dict[int, int]:
        """Per source partition of ``topic``, the highest boundary someone in ``group``
        waits for."""
        try:
            names = await self._connection.run(
                self._connection.client.get_children,
                f"{self._connection.group_path(group)}/waits",
            )
        except NoNodeError:
            return {}
        highest: dict[int, int] = {}
        for name in names:
            # Neither topic names nor instance names may contain ":" (both are validated).
            wait_topic, source, boundary, _ = name.rsplit(":", 3)
            if wait_topic == topic:
                highest[int(source)] = max(highest.get(int(source), 0), int(boundary))
        return highest

    async def acknowledge_revocation(
        self, group: str, topic: str, partition: int, generation: int
    ) -> None:
        """Record that ``group``'s app acknowledged keys_revoked of ``partition`` for change
        ``generation`` (persistent, idempotent): the gate of the keys' new partition waits
        for it, whichever sidecar it consults."""
        name = f"{_names.topic_name(topic)}:{partition}:{generation}"
        path = f"{self._connection.revoked_path(group)}/{name}"
        await self._connection.run(self._connection.client.ensure_path, path)

    async def acknowledged_revocations(self, group: str, topic: str) -> set[tuple[int, int]]:
        """``(partition, generation)`` of every keys_revoked of ``topic`` that ``group``
        acknowledged."""
        try:
            names = await self._connection.run(
                self._connection.client.get_children, self._connection.revoked_path(group)
            )
        except NoNodeError:
            return set()
        acknowledged = set()
        for name in names:
            # Topic names may not contain ":" (they are validated).
            revoked_topic, partition, generation = name.rsplit(":", 2)
            if revoked_topic == topic:
                acknowledged.add((int(partition), int(generation)))
        return acknowledged


def _wait_name(topic: str, source: int, boundary: int, instance: str) -> str:
    checked = _names.topic_name(topic), _names.node_name(instance, "waiting instance")
    return f"{checked[0]}:{source}:{boundary}:{checked[1]}"
