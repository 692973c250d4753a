"""The managed topics in ZooKeeper: create, read and watch them, their generations,
their partition modes and the truncations an operator confirmed.

``<root>/topics/<t>`` holds ``{"config": ..., "current_generation": g}``; under it,
``generations/<g>`` the committed generations (g as %010d, each written once),
``partitions`` the modes and ``delete_after``, and ``truncations`` the lost boundaries
an operator confirmed (KIP-320). The barrier's nodes under it are ``Barriers``'.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from sidecar.adapters.zookeeper.connection import (
    RACE_ERRORS,
    ZooKeeperConnection,
    commit,
    encode,
)
from sidecar.adapters.zookeeper.operations import Operations
from sidecar.core.errors import OperationInProgress, TopicAlreadyManaged, UnknownTopic
from sidecar.core.generations import Generation, GenerationLog, PartitionMode
from sidecar.core.procedures import FINAL_PHASES
from sidecar.core.serialization import (
    config_from_json,
    config_to_json,
    folded_to_json,
    generation_from_json,
    generation_to_json,
    log_from_generations,
    modes_from_json,
    modes_to_json,
    operation_from_json,
    pending_from_json,
)
from sidecar.core.topics import TopicConfig, TopicState
from sidecar.core.truncation import ConfirmedLoss


class Topics:
    """The managed topics, their generation logs, partitions and confirmed truncations.

    Reading a topic reads its journal too (``Operations``)."""

    def __init__(self, connection: ZooKeeperConnection, operations: Operations) -> None:
        self._connection = connection
        self._operations = operations
        self._generations: dict[str, tuple[int, dict[str, Generation]]] = {}
        """Per topic, the committed generations read so far, under the topic node's
        creation (czxid): a generation node is written once, in the commit's multi-op,
        and never changed, so only new ones are read (a topic made anew under the same
        name has another czxid, and its generations are read again)."""

    async def list_topics(self) -> list[str]:
        return sorted(
            await self._connection.run(
                self._connection.client.get_children, f"{self._connection.root}/topics"
            )
        )

    async def create_topic(
        self, config: TopicConfig, generation0: Generation, modes: tuple[PartitionMode, ...]
    ) -> None:
        """Start managing a topic. Raises TopicAlreadyManaged if it is managed already."""
        await self._connection.run(self._create_topic, config, generation0, modes)

    def _create_topic(
        self, config: TopicConfig, generation0: Generation, modes: tuple[PartitionMode, ...]
    ) -> None:
        topic = self._connection.topic_path(config.name)
        transaction = self._connection.client.transaction()
        transaction.create(topic, encode(_topic_json(config, generation0.number)))
        transaction.create(f"{topic}/generations")
        transaction.create(
            self._connection.generation_path(config.name, 0), encode_generation(generation0)
        )
        transaction.create(f"{topic}/partitions", encode_partitions(modes, (None,) * len(modes)))
        transaction.create(f"{topic}/barrier")
        try:
            commit(transaction)
        except NodeExistsError as exc:
            raise TopicAlreadyManaged(f"topic {config.name!r} is already managed") from exc

    async def read_topic(self, topic: str) -> TopicState:
        """Everything about one topic at one moment. Raises UnknownTopic if unmanaged."""
        return await self._connection.run(self._read_topic, topic)

    def _read_topic(self, topic: str) -> TopicState:
        path = self._connection.topic_path(topic)
        while True:
            try:
                raw, stat = self._connection.client.get(path)
            except NoNodeError as exc:
                raise UnknownTopic(f"topic {topic!r} is not managed") from exc
            head = json.loads(raw)
            config = config_from_json(head["config"])
            folded = head.get("folded")
            first = _first_kept(folded)
            generations = self._committed_generations(topic, path, stat.czxid, first)
            partitions = json.loads(self._connection.client.get(f"{path}/partitions")[0])
            pending = self._connection.get_json(f"{path}/pending")
            operation = self._operations.read_operation_blocking(topic)
            # The reads above are not one snapshot: a commit and a compaction move the
            # topic node, so an unchanged topic node means neither landed in between.
            after = self._connection.client.exists(path)
            if after is not None and after.mzxid == stat.mzxid:
                break
        return TopicState(
            config=config,
            log=log_from_generations(config.initial_count, generations, folded),
            modes=modes_from_json(partitions["modes"]),
            delete_after=_delete_after_from_json(partitions["delete_after"]),
            pending=None if pending is None else pending_from_json(pending),
            operation=operation,
        )

    def _committed_generations(
        self, topic: str, path: str, created: int, first: int = 0
    ) -> list[Generation]:
        """The topic's committed generations from ``first`` (the first one a compacted log
        keeps), in order; only those not read before are read from ZooKeeper (every
        sidecar reads the log at every change: with a long log that was one read per
        generation, each time).

        A compaction may delete generation nodes between the listing and their reads: a
        node gone is left out, and the caller, which finds the topic node moved, reads
        again. Nothing is kept of a node no longer listed or below ``first``."""
        known_created, known = self._generations.get(topic, (created, {}))
        if known_created != created:
            known = {}
        names = sorted(
            name
            for name in self._connection.client.get_children(f"{path}/generations")
            if int(name) >= first
        )
        kept: dict[str, Generation] = {}
        for name in names:
            if name not in known:
                try:
                    data = self._connection.client.get(f"{path}/generations/{name}")[0]
                except NoNodeError:
                    continue  # folded meanwhile: the topic node moved, read again
                known[name] = generation_from_json(json.loads(data))
            kept[name] = known[name]
        self._generations[topic] = (created, kept)
        return list(kept.values())

    async def compact_log(self, topic: str, log: GenerationLog, compacted: GenerationLog) -> int:
        """Replace the stored ``log`` by ``compacted`` (``sidecar.core.compaction.compact``
        of it): the topic node's folded part written and the folded generations' nodes
        deleted in one multi-op, so a reader sees the old log or the new one, and a
        compactor that dies or loses its session before the commit leaves the old one.
        Returns how many generation nodes it deleted (0 if ``compacted`` folds nothing
        more than is stored).

        Hold ``lock(topic)``. The multi-op is conditional on the topic node's version as
        read here and on ``log`` being the stored one (the same current and first
        generation), and on the journal's version: a commit or a change started meanwhile
        fails it and nothing is written. Raises OperationInProgress if the journal holds
        a change not finished (its generation may be the one to fold next), or if the
        stored log is not ``log`` any more (read it again); UnknownTopic.
        """
        return await self._connection.run(self._compact_log, topic, log, compacted)

    def _compact_log(self, topic: str, log: GenerationLog, compacted: GenerationLog) -> int:
        if compacted.current != log.current or compacted.first_number < log.first_number:
            raise ValueError("a compaction keeps the current generation and folds forward")
        path = self._connection.topic_path(topic)
        try:
            raw, stat = self._connection.client.get(path)
        except NoNodeError as exc:
            raise UnknownTopic(f"topic {topic!r} is not managed") from exc
        head = json.loads(raw)
        stored_first = _first_kept(head.get("folded"))
        if head["current_generation"] != log.current.number or stored_first != log.first_number:
            raise OperationInProgress(
                f"the generation log of {topic!r} changed since it was read "
                f"(generations {stored_first}..{head['current_generation']} stored)"
            )
        if compacted.first_number == stored_first:
            return 0
        ops_path = self._connection.ops_path(topic)
        try:
            ops_raw, ops_stat = self._connection.client.get(ops_path)
        except NoNodeError:
            ops_stat = None
        else:
            operation = operation_from_json(json.loads(ops_raw))
            if operation.phase not in FINAL_PHASES:
                raise OperationInProgress(
                    f"a change of {topic!r} is in progress ({operation.phase.value})"
                )
        head["folded"] = folded_to_json(compacted)
        transaction = self._connection.client.transaction()
        transaction.set_data(path, encode(head), version=stat.version)
        if ops_stat is not None:
            transaction.check(ops_path, ops_stat.version)
        deleted = 0
        for name in self._connection.client.get_children(f"{path}/generations"):
            if int(name) < compacted.first_number:
                transaction.delete(f"{path}/generations/{name}")
                deleted += 1
        try:
            commit(transaction)
        except RACE_ERRORS as exc:
            # A commit, a change or another compaction got there first: nothing written.
            raise OperationInProgress(
                f"the generation log of {topic!r} changed during its compaction"
            ) from exc
        return deleted

    def watch_topic_list(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the loop whenever a topic becomes managed or stops being
        managed (the children of the topics node change), and once when the watch is set,
        and again after every reconnect (kazoo re-reads the children then)."""

        def changed(children: list[str]) -> None:
            self._connection.to_loop(callback)

        self._connection.client.handler.spawn(
            ChildrenWatch, self._connection.client, f"{self._connection.root}/topics", changed
        )

    def watch_topic(self, topic: str, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the loop whenever the topic, its partitions or its pending
        barrier changes, appears or disappears, until the store stops.

        It is also called once as soon as each watch is set: the watches are set in the
        background, and a change between the caller's last read and the watch would
        otherwise go unnoticed.
        """
        path = self._connection.topic_path(topic)

        def changed(data: bytes | None, stat: Any, event: Any) -> None:
            self._connection.to_loop(callback)

        for watched in (path, f"{path}/partitions", f"{path}/pending"):
            # DataWatch reads the node before it returns, retrying forever while
            # disconnected: that must not happen on the event loop.
            self._connection.client.handler.spawn(
                DataWatch, self._connection.client, watched, changed
            )

    async def set_partitions(
        self,
        topic: str,
        modes: tuple[PartitionMode, ...],
        delete_after: tuple[float | None, ...],
    ) -> None:
        """Overwrite the partition modes. Hold ``lock(topic)``: the last writer wins, and a
        commit also writes the modes. Raises UnknownTopic."""
        await self._connection.run(self._set_partitions, topic, modes, delete_after)

    def _set_partitions(
        self,
        topic: str,
        modes: tuple[PartitionMode, ...],
        delete_after: tuple[float | None, ...],
    ) -> None:
        try:
            self._connection.client.set(
                f"{self._connection.topic_path(topic)}/partitions",
                encode_partitions(modes, delete_after),
            )
        except NoNodeError as exc:
            raise UnknownTopic(f"topic {topic!r} is not managed") from exc

    async def confirmed_truncations(self, topic: str) -> frozenset[ConfirmedLoss]:
        """The lost boundaries of ``topic`` an operator confirmed (``confirm_truncations``)."""
        raw = await self._connection.run(
            self._connection.get_json, f"{self._connection.topic_path(topic)}/truncations"
        )
        if raw is None:
            return frozenset()
        return frozenset((int(g), int(p), int(o), int(e)) for g, p, o, e in raw["confirmed"])

    async def confirm_truncations(self, topic: str, losses: Sequence[ConfirmedLoss]) -> None:
        """Add ``losses`` to the topic's confirmed ones. Raises UnknownTopic."""
        await self._connection.run(self._confirm_truncations, topic, losses)

    def _confirm_truncations(self, topic: str, losses: Sequence[ConfirmedLoss]) -> None:
        path = f"{self._connection.topic_path(topic)}/truncations"
        while True:  # compare-and-set: two operators confirming at once both count
            try:
                raw, stat = self._connection.client.get(path)
            except NoNodeError:
                if self._connection.client.exists(self._connection.topic_path(topic)) is None:
                    raise UnknownTopic(f"topic {topic!r} is not managed") from None
                data = encode({"confirmed": sorted(set(losses))})
                with suppress(NodeExistsError):
                    self._connection.client.create(path, data)
                    return
                continue
            known = {tuple(entry) for entry in json.loads(raw)["confirmed"]}
            data = encode({"confirmed": sorted(known | set(losses))})
            with suppress(BadVersionError):
                self._connection.client.set(path, data, version=stat.version)
                return


def _first_kept(folded: Any) -> int:
    """The first generation a stored log keeps: 0 unless it was compacted."""
    if folded is None:
        return 0
    first = folded.get("first_generation") if isinstance(folded, dict) else None
    if not isinstance(first, int) or isinstance(first, bool) or first < 0:
        raise ValueError(f"malformed folded generations: {folded!r}")
    return first


def _topic_json(config: TopicConfig, current_generation: int) -> dict[str, Any]:
    return {"config": config_to_json(config), "current_generation": current_generation}


def encode_generation(generation: Generation) -> bytes:
    return encode(generation_to_json(generation))


def encode_partitions(
    modes: tuple[PartitionMode, ...], delete_after: tuple[float | None, ...]
) -> bytes:
    return encode({"modes": modes_to_json(modes), "delete_after": list(delete_after)})


def _delete_after_from_json(raw: Any) -> tuple[float | None, ...]:
    if not isinstance(raw, list):
        raise ValueError(f"malformed delete_after: {raw!r}")
    values: list[float | None] = []
    for item in raw:
        if item is not None and (isinstance(item, bool) or not isinstance(item, int | float)):
            raise ValueError(f"malformed delete_after: {raw!r}")
        values.append(None if item is None else float(item))
    return tuple(values)
