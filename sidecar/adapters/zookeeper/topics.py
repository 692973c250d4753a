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
from kazoo.recipe.watchers import ChildrenWatch

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
        self._watchers: dict[str, tuple[Callable[[], None], Callable[[Any], None]]] = {}
        """Per topic, the ``changed`` callback its reads arm and the watcher made for it."""
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

    async def read_topic(self, topic: str, changed: Callable[[], None] | None = None) -> TopicState:
        """Everything about one topic at one moment. Raises UnknownTopic if unmanaged.

        With ``changed``, the reads arm ZooKeeper watches on the topic node, its
        partitions and its pending barrier (its creation too, when there is none):
        ``changed`` is called on the loop once after the next change of any of them.
        A watch fires once; whoever is told reads again with ``changed`` to be told of
        the next one. ZooKeeper keeps the watches across a reconnect of the same
        session; after a new session, read again. The same ``changed`` for a topic is
        armed once however often it is read (one watcher per topic)."""
        return await self._connection.run(self._read_topic, topic, changed)

    def _watcher(self, topic: str, changed: Callable[[], None]) -> Callable[[Any], None]:
        """The one watcher function of ``topic`` for ``changed``: kazoo keeps a set of
        watchers per path, so the same function read again is armed once."""
        known = self._watchers.get(topic)
        if known is not None and known[0] is changed:
            return known[1]

        def watcher(event: Any) -> None:
            self._connection.to_loop(changed)

        self._watchers[topic] = (changed, watcher)
        return watcher

    def _read_topic(self, topic: str, changed: Callable[[], None] | None = None) -> TopicState:
        path = self._connection.topic_path(topic)
        watch = None if changed is None else self._watcher(topic, changed)
        client = self._connection.client
        while True:
            # Every request of a round is sent before any answer is awaited (ZooKeeper
            # answers a session's requests in the order sent): a topic costs two round
            # trips, not one per node. At every change each sidecar reads the topic.
            head_asked = client.get_async(path, watch=watch)
            names_asked = client.get_children_async(f"{path}/generations")
            partitions_asked = client.get_async(f"{path}/partitions", watch=watch)
            pending_asked = self._ask_pending(f"{path}/pending", watch)
            operation_asked = client.get_async(self._connection.ops_path(topic))
            try:
                raw, stat = head_asked.get()
            except NoNodeError as exc:
                raise UnknownTopic(f"topic {topic!r} is not managed") from exc
            head = json.loads(raw)
            config = config_from_json(head["config"])
            folded = head.get("folded")
            first = _first_kept(folded)
            names = names_asked.get()
            partitions = json.loads(partitions_asked.get()[0])
            pending = _pending_value(*pending_asked)
            operation = self._operations.operation_from_answer(operation_asked)
            # The reads above are not one snapshot: a commit and a compaction move the
            # topic node, so an unchanged topic node means neither landed in between.
            # The generations not read before are asked together with that check.
            generations, after = self._committed_generations(topic, path, stat.czxid, names, first)
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

    def _ask_pending(self, path: str, watch: Callable[[Any], None] | None) -> tuple[Any, Any]:
        """Ask for the pending barrier's value; with ``watch``, armed for its change,
        removal or (absent) creation: a read of a missing node arms nothing, an
        existence check does. Both are asked at once; ``_pending_value`` reads them."""
        client = self._connection.client
        exists = None if watch is None else client.exists_async(path, watch=watch)
        return exists, client.get_async(path, watch=watch)

    def _committed_generations(
        self, topic: str, path: str, created: int, names: Sequence[str], first: int = 0
    ) -> tuple[list[Generation], Any]:
        """The topic's committed generations among ``names`` from ``first`` (the first one
        a compacted log keeps), in order, and the topic node's stat read after them
        (None: removed). Only generations not read before are read from ZooKeeper, all
        at once (every sidecar reads the log at every change: with a long log that was
        one read per generation, each time).

        A compaction may delete generation nodes between the listing and their reads: a
        node gone is left out, and the caller, which finds the topic node moved, reads
        again. Nothing is kept of a node no longer listed or below ``first``."""
        known_created, known = self._generations.get(topic, (created, {}))
        if known_created != created:
            known = {}
        client = self._connection.client
        ordered = sorted(name for name in names if int(name) >= first)
        new = [name for name in ordered if name not in known]
        asked = [client.get_async(f"{path}/generations/{name}") for name in new]
        after_asked = client.exists_async(path)
        for name, answer in zip(new, asked, strict=True):
            try:
                data = answer.get()[0]
            except NoNodeError:
                continue  # folded meanwhile: the topic node moved, read again
            known[name] = generation_from_json(json.loads(data))
        after = after_asked.get()
        kept = {name: known[name] for name in ordered if name in known}
        self._generations[topic] = (created, kept)
        return list(kept.values()), after

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


def _pending_value(exists: Any, value: Any) -> Any:
    """The pending barrier's decoded value from the answers ``Topics._ask_pending`` got,
    or None if there is none."""
    if exists is not None and exists.get() is None:
        return None
    try:
        return json.loads(value.get()[0])
    except NoNodeError:
        return None  # removed since: a watch armed on it has fired


def _delete_after_from_json(raw: Any) -> tuple[float | None, ...]:
    if not isinstance(raw, list):
        raise ValueError(f"malformed delete_after: {raw!r}")
    values: list[float | None] = []
    for item in raw:
        if item is not None and (isinstance(item, bool) or not isinstance(item, int | float)):
            raise ValueError(f"malformed delete_after: {raw!r}")
        values.append(None if item is None else float(item))
    return tuple(values)
