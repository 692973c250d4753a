"""The sidecars' shared metadata in ZooKeeper: one asyncio adapter over kazoo.

Znodes, under a configurable root (default ``/ordered``); every value is UTF-8 JSON
in the shapes of ``sidecar.core.serialization``::

    <root>/sidecars/<id>                     ephemeral: a live sidecar's info, with the
                                             transactional ids it writes with now
    <root>/producers/<transactional id>      {"sidecar": id}: every transactional id a
                                             sidecar registered and has not retired; the
                                             ones no live sidecar names are fenced by the
                                             next change (DESIGN §5)
    <root>/topics/<t>                        {"config": ..., "current_generation": g}
    <root>/topics/<t>/generations/<g>        a committed generation; g as %010d
    <root>/topics/<t>/partitions             {"modes": [...], "delete_after": [float|null, ...]}
    <root>/topics/<t>/pending                the pending barrier; only while one is pending
    <root>/topics/<t>/truncations            {"confirmed": [[g, p, offset, epoch], ...]}: lost
                                             boundaries an operator confirmed (KIP-320)
    <root>/topics/<t>/barrier/<g>/<id>       {"acked": {"<partition>": next_offset}}
    <root>/ops/<t>                           journal of the change in progress (or last done),
                                             written compare-and-set by znode version
    <root>/locks/<t>                         ephemeral {"owner", "purpose", "acquired_at"}: the
                                             topic's change lock; one change at a time
    <root>/groups/<group>                    a consumer group some sidecar consumes for
    <root>/groups/<group>/waits/<t>:<q>:<b>:<instance>
                                             ephemeral: an instance waits for the group
                                             to consume partition q of t up to offset b
    <root>/groups/<group>/revoked/<t>:<q>:<g>
                                             the group's app acknowledged keys_revoked of
                                             partition q of t for change g (written once)

Every path is built from names checked again here (``sidecar.core.names``), although
the HTTP layer checks them first: a name that reaches this adapter unchecked is refused
with InvalidName, never turned into a path.

A commit changes the generation log, the current generation, the modes, the pending
barrier and the journal in one multi-op transaction, so a reader never sees half of it.

The change lock is one ephemeral node rather than kazoo's Lock recipe: a recipe's
acquisition interrupted by a lost connection can leave its node behind under a session
that lives on (seen: every later change refused for minutes). Here the store knows
which lock nodes it holds; a node of its own session it does not hold is a leftover
and ``release_leftover_locks`` deletes it.

kazoo calls block, so they run in worker threads; kazoo's watch and session callbacks
run on kazoo's threads and are handed to the event loop. While the session is not
CONNECTED every call fails fast with MetadataUnavailable instead of queueing in kazoo
until a reconnect.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, NoReturn, ParamSpec, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    AuthFailedError,
    BadVersionError,
    ConnectionDropped,
    ConnectionLoss,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KeeperState
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.retry import KazooRetry

from sidecar.adapters.zookeeper_security import diagnose_tls, identity_of, kazoo_arguments
from sidecar.config import ZooKeeperSecuritySettings
from sidecar.core import names as _names
from sidecar.core.errors import (
    ChangeTakenOver,
    MetadataNotAuthorized,
    MetadataUnavailable,
    OperationInProgress,
    TopicAlreadyManaged,
    UnknownTopic,
)
from sidecar.core.generations import Generation, PartitionMode
from sidecar.core.procedures import Operation, SessionState, SidecarId, TransactionalId
from sidecar.core.serialization import (
    config_from_json,
    config_to_json,
    generation_from_json,
    generation_to_json,
    log_from_generations,
    modes_from_json,
    modes_to_json,
    operation_from_json,
    operation_to_json,
    pending_from_json,
    pending_to_json,
)
from sidecar.core.topics import PendingBarrier, TopicConfig, TopicState
from sidecar.core.truncation import ConfirmedLoss

_P = ParamSpec("_P")
_T = TypeVar("_T")

_CONNECT_POLL_S = 0.05
"""How often ``start`` looks whether kazoo's thread has a session yet."""

log = logging.getLogger(__name__)

# ConnectionClosedError (a stopped client) is a SessionExpiredError subclass.
_CONNECTION_ERRORS = (
    ConnectionLoss,
    ConnectionDropped,
    SessionExpiredError,
    OperationTimeoutError,
    KazooTimeoutError,
)
# A concurrent writer changed what a transaction was built from: read again and retry.
_RACE_ERRORS = (BadVersionError, NodeExistsError, NoNodeError, NotEmptyError)
_SESSION_STATES = {
    KazooState.CONNECTED: SessionState.CONNECTED,
    KazooState.SUSPENDED: SessionState.SUSPENDED,
    KazooState.LOST: SessionState.LOST,
}


@dataclass(frozen=True, slots=True)
class LockHolder:
    """Who holds a topic's change lock, for what, and since when (wall clock)."""

    owner: str
    purpose: str
    acquired_at: float


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
        self._root = root.rstrip("/")
        self._hosts = hosts
        self._lock_poll_s = lock_poll_s
        self._transaction_attempts = transaction_attempts
        self._security = security or ZooKeeperSecuritySettings()
        self._identity = identity_of(self._security)
        self._auth_failed = False
        self._client = KazooClient(
            hosts=hosts,
            timeout=session_timeout_s,
            # kazoo retries connecting for ever in its own thread; its default pause grows
            # to an hour, this one to 1 s, so a sidecar reconnects soon after ZooKeeper is
            # back (at start as after an outage).
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=1.0),
            **kazoo_arguments(self._security),
        )
        self._connecting = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state = SessionState.LOST
        self._state_events_seen = False
        self._listeners: list[Callable[[SessionState], None]] = []
        self._registrations: dict[str, tuple[bytes, tuple[TransactionalId, ...]]] = {}
        self._reregister_needed = False
        self._held_locks: dict[str, int] = {}
        """Topic -> czxid of the lock node this store holds."""
        self._journal_versions: dict[str, int] = {}
        self._generations: dict[str, tuple[int, dict[str, Generation]]] = {}
        """Per topic, the committed generations read so far, under the topic node's
        creation (czxid): a generation node is written once, in the commit's multi-op,
        and never changed, so only new ones are read (a topic made anew under the same
        name has another czxid, and its generations are read again)."""
        """Topic -> version of the journal node as this store last wrote or read it."""
        self._stopped = False
        self._tasks: set[asyncio.Task[None]] = set()

    # Session --------------------------------------------------------------------------

    async def start(self, timeout: float = 15.0) -> None:  # noqa: ASYNC109
        """Connect. Raises MetadataUnavailable if ZooKeeper does not answer in time (kazoo
        keeps trying in its thread meanwhile, so calling again waits on), and
        MetadataNotAuthorized if it refuses the TLS handshake or the credentials (the
        message names the setting), or if the znodes' ACLs do not let this identity in."""
        self._loop = asyncio.get_running_loop()
        if not self._connecting:
            self._connecting = True
            self._client.add_listener(self._on_kazoo_state)
            # Not kazoo's start(): after its timeout it stops and closes the client.
            self._client.start_async()
        deadline = self._loop.time() + timeout
        while not self._client.connected:
            if self._auth_failed:
                raise MetadataNotAuthorized(
                    "zookeeper.security.digest_username / digest_password: ZooKeeper refused "
                    f"the {self._security.sasl_mechanism or 'digest'} credentials of "
                    f"{self._security.digest_username!r}"
                )
            if self._loop.time() >= deadline:
                refused = (
                    await asyncio.to_thread(diagnose_tls, self._hosts, self._security)
                    if self._security.tls
                    else None
                )
                if refused is not None:
                    raise MetadataNotAuthorized(refused)
                raise MetadataUnavailable(
                    f"cannot connect to ZooKeeper at {self._hosts}: no session within {timeout:g} s"
                )
            await asyncio.sleep(_CONNECT_POLL_S)
        # The CONNECTED callback races with start() returning; a later event wins.
        if not self._state_events_seen:
            self._state = SessionState.CONNECTED
        await self._run(self._ensure_layout)

    async def stop(self) -> None:
        """Close the session: its ephemeral nodes, the sidecar's registration, go away."""
        self._stopped = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.to_thread(self._client.stop)
        await asyncio.to_thread(self._client.close)

    @property
    def session_state(self) -> SessionState:
        return self._state

    def add_session_listener(self, callback: Callable[[SessionState], None]) -> None:
        """Call ``callback`` on the event loop at every session state change."""
        self._listeners.append(callback)

    def _on_kazoo_state(self, state: KazooState) -> None:
        # On kazoo's connection thread, which must never block.
        if self._client.client_state == KeeperState.AUTH_FAILED:
            self._auth_failed = True
        self._to_loop(self._session_changed, _SESSION_STATES[state])

    def _session_changed(self, state: SessionState) -> None:
        self._state_events_seen = True
        if state is self._state:
            return
        self._state = state
        if state is SessionState.LOST:
            self._reregister_needed = True
            self._held_locks.clear()  # ephemeral: gone with the session
        elif state is SessionState.CONNECTED and self._reregister_needed and not self._stopped:
            # Listeners hear of the new session only once the registrations are back: a
            # sidecar must be registered before it re-reads anything and writes again.
            self._spawn(self._reregister_then_notify())
            return
        self._notify(state)

    def _notify(self, state: SessionState) -> None:
        for listener in list(self._listeners):
            listener(state)

    async def _reregister_then_notify(self) -> None:
        # The expired session took the ephemeral registrations with it.
        while self._state is SessionState.CONNECTED and not self._stopped:
            try:
                for sidecar_id, (data, transactional_ids) in list(self._registrations.items()):
                    await self._run(self._register, sidecar_id, data, transactional_ids)
            except MetadataUnavailable:
                log.warning("re-registration failed; retrying", exc_info=True)
                await asyncio.sleep(0.2)
                continue
            self._reregister_needed = False
            if self._state is SessionState.CONNECTED:
                self._notify(SessionState.CONNECTED)
            return

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
        self.prepare_registration(sidecar_id, info, transactional_ids)
        data, ids = self._registrations[sidecar_id]
        await self._run(self._register, sidecar_id, data, ids)

    def prepare_registration(
        self, sidecar_id: str, info: dict[str, Any], transactional_ids: Sequence[TransactionalId]
    ) -> None:
        """What to register for ``sidecar_id`` once a new session is up (no IO now)."""
        # Refused now, not at every re-registration after a new session.
        self._sidecar_path(sidecar_id)
        ids = tuple(transactional_ids)
        for transactional_id in ids:
            self._producer_path(transactional_id)
        # ``transactional_id`` (the first) is what sidecars from before lanes read: a
        # coordinator of theirs fences the other lanes, which costs a new incarnation,
        # never a write across a barrier.
        data = _encode(
            info | {"transactional_ids": list(ids), "transactional_id": ids[0] if ids else None}
        )
        self._registrations[sidecar_id] = (data, ids)

    def _register(
        self, sidecar_id: str, data: bytes, transactional_ids: tuple[TransactionalId, ...]
    ) -> None:
        path = self._sidecar_path(sidecar_id)
        for _ in range(self._transaction_attempts):
            transaction = self._client.transaction()
            stat = self._client.exists(path)
            if stat is not None and stat.ephemeralOwner == self._session_id():
                transaction.set_data(path, data, version=stat.version)
            else:
                if stat is not None:
                    # Left by an older session of ours that the server has not expired yet.
                    transaction.delete(path, version=stat.version)
                transaction.create(path, data, ephemeral=True)
            for transactional_id in transactional_ids:
                producer = self._producer_path(transactional_id)
                if self._client.exists(producer) is None:
                    transaction.create(producer, _encode({"sidecar": sidecar_id}))
            try:
                _commit(transaction)
                return
            except _RACE_ERRORS:
                continue
        raise MetadataUnavailable(f"registering {sidecar_id} kept racing")

    async def registered_producers(self) -> frozenset[TransactionalId]:
        """Every transactional id registered and not yet fenced or retired."""
        children = await self._run(self._client.get_children, f"{self._root}/producers")
        return frozenset(TransactionalId(child) for child in children)

    async def live_producers(self) -> frozenset[TransactionalId]:
        """The transactional ids the live sidecars' registrations name now."""
        return await self._run(self._live_producers)

    def _live_producers(self) -> frozenset[TransactionalId]:
        owned: set[TransactionalId] = set()
        for child in self._client.get_children(f"{self._root}/sidecars"):
            # A listed child is a node already: read it whatever rule named it, as a
            # registration a live sidecar made before ids were checked must count.
            raw = self._get_json(f"{self._root}/sidecars/{child}")
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
        await self._run(self._forget_producers, transactional_ids)

    def _forget_producers(self, transactional_ids: tuple[TransactionalId, ...]) -> None:
        for transactional_id in transactional_ids:
            with suppress(NoNodeError):
                self._client.delete(self._producer_path(transactional_id))

    async def live_sidecars(self) -> frozenset[SidecarId]:
        children = await self._run(self._client.get_children, f"{self._root}/sidecars")
        return frozenset(SidecarId(child) for child in children)

    async def known_groups(self) -> list[str]:
        """Consumer groups registered by sidecars: the groups retirement waits for."""
        return sorted(await self._run(self._client.get_children, f"{self._root}/groups"))

    async def register_group(self, group: str) -> None:
        """Record that ``group`` consumes through the sidecars (persistent, idempotent)."""
        await self._run(self._client.ensure_path, self._group_path(group))

    async def add_wait(
        self, group: str, topic: str, source: int, boundary: int, instance: str
    ) -> None:
        """Announce that ``instance`` waits for ``group`` to consume ``source`` up to
        ``boundary``, so the instance owning ``source`` commits promptly. Ephemeral: it
        goes away with this session."""
        await self._run(self._add_wait, group, _wait_name(topic, source, boundary, instance))

    def _add_wait(self, group: str, name: str) -> None:
        self._client.ensure_path(f"{self._group_path(group)}/waits")
        with suppress(NodeExistsError):
            self._client.create(f"{self._group_path(group)}/waits/{name}", b"", ephemeral=True)

    async def remove_wait(
        self, group: str, topic: str, source: int, boundary: int, instance: str
    ) -> None:
        name = _wait_name(topic, source, boundary, instance)
        path = f"{self._group_path(group)}/waits/{name}"
        with suppress(NoNodeError):
            await self._run(self._client.delete, path)

    async def waits(self, group: str, topic: str) -> dict[int, int]:
        """Per source partition of ``topic``, the highest boundary someone in ``group``
        waits for."""
        try:
            names = await self._run(self._client.get_children, f"{self._group_path(group)}/waits")
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
        path = f"{self._revoked_path(group)}/{name}"
        await self._run(self._client.ensure_path, path)

    async def acknowledged_revocations(self, group: str, topic: str) -> set[tuple[int, int]]:
        """``(partition, generation)`` of every keys_revoked of ``topic`` that ``group``
        acknowledged."""
        try:
            names = await self._run(self._client.get_children, self._revoked_path(group))
        except NoNodeError:
            return set()
        acknowledged = set()
        for name in names:
            # Topic names may not contain ":" (they are validated).
            revoked_topic, partition, generation = name.rsplit(":", 2)
            if revoked_topic == topic:
                acknowledged.add((int(partition), int(generation)))
        return acknowledged

    # Topics ---------------------------------------------------------------------------

    async def list_topics(self) -> list[str]:
        return sorted(await self._run(self._client.get_children, f"{self._root}/topics"))

    async def create_topic(
        self, config: TopicConfig, generation0: Generation, modes: tuple[PartitionMode, ...]
    ) -> None:
        """Start managing a topic. Raises TopicAlreadyManaged if it is managed already."""
        await self._run(self._create_topic, config, generation0, modes)

    def _create_topic(
        self, config: TopicConfig, generation0: Generation, modes: tuple[PartitionMode, ...]
    ) -> None:
        topic = self._topic_path(config.name)
        transaction = self._client.transaction()
        transaction.create(topic, _encode(_topic_json(config, generation0.number)))
        transaction.create(f"{topic}/generations")
        transaction.create(self._generation_path(config.name, 0), _encode_generation(generation0))
        transaction.create(f"{topic}/partitions", _encode_partitions(modes, (None,) * len(modes)))
        transaction.create(f"{topic}/barrier")
        try:
            _commit(transaction)
        except NodeExistsError as exc:
            raise TopicAlreadyManaged(f"topic {config.name!r} is already managed") from exc

    async def read_topic(self, topic: str) -> TopicState:
        """Everything about one topic at one moment. Raises UnknownTopic if unmanaged."""
        return await self._run(self._read_topic, topic)

    def _read_topic(self, topic: str) -> TopicState:
        path = self._topic_path(topic)
        while True:
            try:
                raw, stat = self._client.get(path)
            except NoNodeError as exc:
                raise UnknownTopic(f"topic {topic!r} is not managed") from exc
            head = json.loads(raw)
            config = config_from_json(head["config"])
            generations = self._committed_generations(topic, path, stat.czxid)
            partitions = json.loads(self._client.get(f"{path}/partitions")[0])
            pending = self._get_json(f"{path}/pending")
            operation = self._read_operation(topic)
            # The reads above are not one snapshot: a commit moves the topic node, so an
            # unchanged topic node means no commit landed in between.
            after = self._client.exists(path)
            if after is not None and after.mzxid == stat.mzxid:
                break
        return TopicState(
            config=config,
            log=log_from_generations(config.initial_count, generations),
            modes=modes_from_json(partitions["modes"]),
            delete_after=_delete_after_from_json(partitions["delete_after"]),
            pending=None if pending is None else pending_from_json(pending),
            operation=operation,
        )

    def _committed_generations(self, topic: str, path: str, created: int) -> list[Generation]:
        """The topic's committed generations, in order; only those not read before are
        read from ZooKeeper (every sidecar reads the log at every change: with a long log
        that was one read per generation, each time)."""
        known_created, known = self._generations.get(topic, (created, {}))
        if known_created != created:
            known = {}
        names = sorted(self._client.get_children(f"{path}/generations"))
        for name in names:
            if name not in known:
                data = self._client.get(f"{path}/generations/{name}")[0]
                known[name] = generation_from_json(json.loads(data))
        kept = {name: known[name] for name in names}  # nothing kept of removed ones
        self._generations[topic] = (created, kept)
        return list(kept.values())

    def watch_topic_list(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the loop whenever a topic becomes managed or stops being
        managed (the children of the topics node change), and once when the watch is set,
        and again after every reconnect (kazoo re-reads the children then)."""

        def changed(children: list[str]) -> None:
            self._to_loop(callback)

        self._client.handler.spawn(ChildrenWatch, self._client, f"{self._root}/topics", changed)

    def watch_topic(self, topic: str, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the loop whenever the topic, its partitions or its pending
        barrier changes, appears or disappears, until the store stops.

        It is also called once as soon as each watch is set: the watches are set in the
        background, and a change between the caller's last read and the watch would
        otherwise go unnoticed.
        """
        path = self._topic_path(topic)

        def changed(data: bytes | None, stat: Any, event: Any) -> None:
            self._to_loop(callback)

        for watched in (path, f"{path}/partitions", f"{path}/pending"):
            # DataWatch reads the node before it returns, retrying forever while
            # disconnected: that must not happen on the event loop.
            self._client.handler.spawn(DataWatch, self._client, watched, changed)

    async def set_partitions(
        self,
        topic: str,
        modes: tuple[PartitionMode, ...],
        delete_after: tuple[float | None, ...],
    ) -> None:
        """Overwrite the partition modes. Hold ``lock(topic)``: the last writer wins, and a
        commit also writes the modes. Raises UnknownTopic."""
        await self._run(self._set_partitions, topic, modes, delete_after)

    def _set_partitions(
        self,
        topic: str,
        modes: tuple[PartitionMode, ...],
        delete_after: tuple[float | None, ...],
    ) -> None:
        try:
            self._client.set(
                f"{self._topic_path(topic)}/partitions", _encode_partitions(modes, delete_after)
            )
        except NoNodeError as exc:
            raise UnknownTopic(f"topic {topic!r} is not managed") from exc

    # Operations -----------------------------------------------------------------------

    def lock(
        self, topic: str, owner: str, timeout: float, purpose: str = "change"
    ) -> AbstractAsyncContextManager[None]:
        """Hold the topic's change lock. Raises OperationInProgress if another holder keeps
        it longer than ``timeout`` seconds (0: do not wait), MetadataUnavailable."""
        return self._locked(topic, owner, timeout, purpose)

    @asynccontextmanager
    async def _locked(
        self, topic: str, owner: str, wait_s: float, purpose: str
    ) -> AsyncIterator[None]:
        self._lock_path(topic)  # InvalidName before any attempt
        deadline = time.monotonic() + wait_s
        data = _encode({"owner": owner, "purpose": purpose, "acquired_at": time.time()})
        while True:
            holder = await self._run(self._try_lock, topic, data)
            if holder is None:
                break
            if time.monotonic() >= deadline:
                raise OperationInProgress(
                    f"{holder.owner} holds the change lock of {topic!r} for {holder.purpose} "
                    f"({time.time() - holder.acquired_at:.1f} s)"
                )
            await asyncio.sleep(self._lock_poll_s)
        try:
            yield
        finally:
            await self._release_lock(topic)

    def _try_lock(self, topic: str, data: bytes) -> LockHolder | None:
        """Take the lock (None) or say who holds it."""
        path = self._lock_path(topic)
        try:
            # On a lost connection the create may still have happened: the node is then
            # a leftover of this session, deleted by the next attempt or by
            # release_leftover_locks.
            _, stat = self._client.create(path, data, ephemeral=True, include_data=True)
        except NodeExistsError:
            pass
        else:
            self._held_locks[topic] = stat.czxid
            return None
        try:
            raw, stat = self._client.get(path)
        except NoNodeError:
            return LockHolder("nobody", "a lock released meanwhile", time.time())
        if stat.ephemeralOwner == self._session_id() and topic not in self._held_locks:
            # Ours, yet not held: left by an interrupted attempt. Delete it and retry.
            with suppress(NoNodeError, BadVersionError):
                self._client.delete(path, version=stat.version)
            return LockHolder("nobody", "a leftover of this sidecar", time.time())
        if stat.ephemeralOwner == 0:
            # A parent node of the lock recipe used before: empty, it is no lock.
            with suppress(NoNodeError, NotEmptyError, BadVersionError):
                self._client.delete(path, version=stat.version)
            return LockHolder("nobody", "an old lock layout", time.time())
        return _lock_holder(raw, stat)

    async def _release_lock(self, topic: str) -> None:
        czxid = self._held_locks.pop(topic, None)
        if czxid is None:
            return  # lost with the session already
        try:
            await self._run(self._delete_if_created, self._lock_path(topic), czxid)
        except MetadataUnavailable:
            # The node stays while this session lives: release_leftover_locks deletes it
            # once ZooKeeper answers again (this store no longer counts it as held).
            log.info("could not release the lock of %s now; it will be cleaned up", topic)

    def _delete_if_created(self, path: str, czxid: int) -> None:
        stat = self._client.exists(path)
        if stat is not None and stat.czxid == czxid:
            with suppress(NoNodeError, BadVersionError):
                self._client.delete(path, version=stat.version)

    async def release_leftover_locks(self) -> list[str]:
        """Delete every lock node of this session that this store does not hold (left by
        an interrupted acquisition or release); returns their topics."""
        return await self._run(self._release_leftover_locks)

    def _release_leftover_locks(self) -> list[str]:
        released = []
        session = self._session_id()
        for topic in self._client.get_children(f"{self._root}/locks"):
            path = f"{self._root}/locks/{topic}"  # listed: a node already
            stat = self._client.exists(path)
            if stat is None or stat.ephemeralOwner != session or topic in self._held_locks:
                continue
            with suppress(NoNodeError, BadVersionError):
                self._client.delete(path, version=stat.version)
                released.append(topic)
                log.warning("released a leftover change lock of %s", topic)
        return released

    def holds_lock(self, topic: str) -> bool:
        return topic in self._held_locks

    async def lock_holder(self, topic: str) -> LockHolder | None:
        """Who holds the topic's change lock now, or None."""
        return await self._run(self._lock_holder, topic)

    def _lock_holder(self, topic: str) -> LockHolder | None:
        try:
            raw, stat = self._client.get(self._lock_path(topic))
        except NoNodeError:
            return None
        if stat.ephemeralOwner == 0:
            return None
        return _lock_holder(raw, stat)

    async def confirmed_truncations(self, topic: str) -> frozenset[ConfirmedLoss]:
        """The lost boundaries of ``topic`` an operator confirmed (``confirm_truncations``)."""
        raw = await self._run(self._get_json, f"{self._topic_path(topic)}/truncations")
        if raw is None:
            return frozenset()
        return frozenset((int(g), int(p), int(o), int(e)) for g, p, o, e in raw["confirmed"])

    async def confirm_truncations(self, topic: str, losses: Sequence[ConfirmedLoss]) -> None:
        """Add ``losses`` to the topic's confirmed ones. Raises UnknownTopic."""
        await self._run(self._confirm_truncations, topic, losses)

    def _confirm_truncations(self, topic: str, losses: Sequence[ConfirmedLoss]) -> None:
        path = f"{self._topic_path(topic)}/truncations"
        while True:  # compare-and-set: two operators confirming at once both count
            try:
                raw, stat = self._client.get(path)
            except NoNodeError:
                if self._client.exists(self._topic_path(topic)) is None:
                    raise UnknownTopic(f"topic {topic!r} is not managed") from None
                data = _encode({"confirmed": sorted(set(losses))})
                with suppress(NodeExistsError):
                    self._client.create(path, data)
                    return
                continue
            known = {tuple(entry) for entry in json.loads(raw)["confirmed"]}
            data = _encode({"confirmed": sorted(known | set(losses))})
            with suppress(BadVersionError):
                self._client.set(path, data, version=stat.version)
                return

    async def save_operation(self, operation: Operation) -> None:
        """Create or overwrite the topic's operation journal. After this store has read or
        written it, only if nobody else wrote it since: raises ChangeTakenOver then (a
        coordinator that was paused must not overwrite its successor's progress)."""
        await self._run(self._save_operation, operation)

    def _save_operation(self, operation: Operation) -> None:
        path, data = self._ops_path(operation.topic), _encode(operation_to_json(operation))
        expected = self._journal_versions.get(operation.topic)
        try:
            if expected is None:
                stat = self._client.set(path, data)
            else:
                stat = self._client.set(path, data, version=expected)
        except BadVersionError:
            self._journal_taken_over(operation.topic)
        except NoNodeError:
            self._client.create(path, data)
            stat = self._client.exists(path)
        if stat is not None:
            self._journal_versions[operation.topic] = stat.version

    def forget_journal_version(self, topic: str) -> None:
        """Stop checking the journal's version (before starting a new change or resuming)."""
        self._journal_versions.pop(topic, None)

    async def read_operation(self, topic: str) -> Operation | None:
        return await self._run(self._read_operation, topic)

    def _read_operation(self, topic: str) -> Operation | None:
        try:
            raw, _ = self._client.get(self._ops_path(topic))
        except NoNodeError:
            return None
        return operation_from_json(json.loads(raw))

    async def take_over_operation(self, topic: str) -> Operation | None:
        """Read the journal to drive it from now on: later saves by this store check that
        nobody else wrote it in between."""
        return await self._run(self._take_over_operation, topic)

    def _take_over_operation(self, topic: str) -> Operation | None:
        try:
            raw, stat = self._client.get(self._ops_path(topic))
        except NoNodeError:
            self._journal_versions.pop(topic, None)
            return None
        self._journal_versions[topic] = stat.version
        return operation_from_json(json.loads(raw))

    # Barrier --------------------------------------------------------------------------

    async def publish_barrier(self, topic: str, pending: PendingBarrier) -> None:
        """Publish ``pending``; publishing it again is a no-op. Raises UnknownTopic,
        OperationInProgress if a different barrier is pending, and ChangeTakenOver if
        another coordinator wrote the journal since this store did."""
        await self._run(self._publish_barrier, topic, pending)

    def _publish_barrier(self, topic: str, pending: PendingBarrier) -> None:
        path = self._topic_path(topic)
        barrier = self._barrier_path(topic, pending.generation)
        existing = self._get_json(f"{path}/pending")
        if existing is not None:
            if pending_from_json(existing) != pending:
                raise OperationInProgress(f"another barrier is pending on {topic!r}: {existing}")
            return
        if self._client.exists(path) is None:
            raise UnknownTopic(f"topic {topic!r} is not managed")
        # A coordinator that lost its lock (paused past its session) and retries its
        # publish after a successor finished the change would leave a barrier nobody
        # owns, and every later change would be refused: only the journal's owner writes.
        self._require_journal_owner(topic)
        # Acks left by an earlier attempt at this generation, interrupted while rolling
        # back, would count for sidecars that never held for this one.
        self._delete_tree(barrier)
        self._client.ensure_path(f"{path}/barrier")
        transaction = self._client.transaction()
        self._check_journal_owner(transaction, topic)
        transaction.create(barrier)
        transaction.create(f"{path}/pending", _encode(pending_to_json(pending)))
        self._commit_as_owner(transaction, topic)

    def _require_journal_owner(self, topic: str) -> None:
        """Raise ChangeTakenOver if another coordinator wrote ``topic``'s journal since this
        store read or wrote it (nothing is checked if it did neither)."""
        expected = self._journal_versions.get(topic)
        if expected is None:
            return
        stat = self._client.exists(self._ops_path(topic))
        if stat is None or stat.version != expected:
            self._journal_taken_over(topic)

    def _check_journal_owner(self, transaction: Any, topic: str) -> None:
        """Make ``transaction`` fail unless the journal is as this store last saw it."""
        expected = self._journal_versions.get(topic)
        if expected is not None:
            transaction.check(self._ops_path(topic), expected)

    def _commit_as_owner(self, transaction: Any, topic: str) -> None:
        """Commit a transaction made with ``_check_journal_owner``; ChangeTakenOver if its
        check failed."""
        try:
            _commit(transaction)
        except BadVersionError:
            self._require_journal_owner(topic)
            raise

    def _journal_taken_over(self, topic: str) -> NoReturn:
        self._journal_versions.pop(topic, None)
        raise ChangeTakenOver(f"the journal of {topic!r} was changed by another coordinator")

    async def ack_barrier(
        self, topic: str, generation: int, sidecar_id: str, acked: Mapping[int, int]
    ) -> None:
        """Record that ``sidecar_id`` holds for ``generation``; ``acked`` maps a partition to
        one past its highest acknowledged offset. An ack for a barrier already committed or
        rolled back is dropped."""
        await self._run(self._ack_barrier, topic, generation, sidecar_id, acked)

    def _ack_barrier(
        self, topic: str, generation: int, sidecar_id: str, acked: Mapping[int, int]
    ) -> None:
        path = f"{self._barrier_path(topic, generation)}/{_names.sidecar_id(sidecar_id)}"
        data = _encode({"acked": {str(p): offset for p, offset in acked.items()}})
        try:
            self._client.create(path, data)
        except NodeExistsError:
            self._client.set(path, data)
        except NoNodeError:
            log.info("dropped an ack for the finished barrier %s of %s", generation, topic)

    async def barrier_acks(self, topic: str, generation: int) -> dict[SidecarId, dict[int, int]]:
        return await self._run(self._barrier_acks, topic, generation)

    def _barrier_acks(self, topic: str, generation: int) -> dict[SidecarId, dict[int, int]]:
        barrier = self._barrier_path(topic, generation)
        try:
            children = self._client.get_children(barrier)
        except NoNodeError:
            return {}
        acks: dict[SidecarId, dict[int, int]] = {}
        for child in children:
            raw = self._get_json(f"{barrier}/{child}")
            if raw is not None:
                acks[SidecarId(child)] = {int(p): int(o) for p, o in raw["acked"].items()}
        return acks

    async def remove_barrier(self, topic: str, generation: int) -> None:
        """Withdraw the barrier for ``generation`` (a rollback) and its acks; idempotent.
        Raises ChangeTakenOver if another coordinator wrote the journal since this store
        did: the barrier may then be its successor's, published again when resuming."""
        await self._run(self._withdraw_barrier, topic, generation)

    def _withdraw_barrier(self, topic: str, generation: int) -> None:
        pending_path = f"{self._topic_path(topic)}/pending"
        self._require_journal_owner(topic)
        try:
            raw, stat = self._client.get(pending_path)
        except NoNodeError:
            pass
        else:
            if pending_from_json(json.loads(raw)).generation == generation:
                transaction = self._client.transaction()
                self._check_journal_owner(transaction, topic)
                transaction.delete(pending_path, version=stat.version)
                with suppress(NoNodeError):  # withdrawn meanwhile: that is the goal
                    self._commit_as_owner(transaction, topic)
        self._delete_tree(self._barrier_path(topic, generation))

    def _remove_barrier(self, topic: str, generation: int) -> None:
        pending_path = f"{self._topic_path(topic)}/pending"
        try:
            raw, stat = self._client.get(pending_path)
            if pending_from_json(json.loads(raw)).generation == generation:
                self._client.delete(pending_path, version=stat.version)
        except NoNodeError:
            pass
        self._delete_tree(self._barrier_path(topic, generation))

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
        await self._run(self._commit_generation, topic, generation, modes, delete_after, operation)

    def _commit_generation(
        self,
        topic: str,
        generation: Generation,
        modes: tuple[PartitionMode, ...],
        delete_after: tuple[float | None, ...],
        operation: Operation,
    ) -> None:
        path, number = self._topic_path(topic), generation.number
        for _ in range(self._transaction_attempts):
            if self._client.exists(self._generation_path(topic, number)) is not None:
                self._remove_barrier(topic, number)
                self._save_operation(operation)
                return
            try:
                raw, topic_stat = self._client.get(path)
            except NoNodeError as exc:
                raise UnknownTopic(f"topic {topic!r} is not managed") from exc
            head = json.loads(raw)
            current = head["current_generation"]
            if number != current + 1:
                raise ValueError(f"generation {number} cannot follow {current} of {topic!r}")
            transaction = self._client.transaction()
            transaction.create(self._generation_path(topic, number), _encode_generation(generation))
            head["current_generation"] = number
            transaction.set_data(path, _encode(head), version=topic_stat.version)
            transaction.set_data(f"{path}/partitions", _encode_partitions(modes, delete_after))
            pending_stat = self._client.exists(f"{path}/pending")
            if pending_stat is not None:
                transaction.delete(f"{path}/pending", version=pending_stat.version)
            barrier = self._barrier_path(topic, number)
            if self._client.exists(barrier) is not None:
                for child in self._client.get_children(barrier):
                    transaction.delete(f"{barrier}/{child}")
                transaction.delete(barrier)
            ops_path, ops_data = self._ops_path(topic), _encode(operation_to_json(operation))
            expected = self._journal_versions.get(topic)
            ops_stat = self._client.exists(ops_path)
            if ops_stat is None:
                transaction.create(ops_path, ops_data)
            elif expected is not None and ops_stat.version != expected:
                self._journal_versions.pop(topic, None)
                raise ChangeTakenOver(
                    f"the journal of {topic!r} was changed by another coordinator"
                )
            else:
                transaction.set_data(ops_path, ops_data, version=ops_stat.version)
            try:
                _commit(transaction)
                self._journal_versions.pop(topic, None)
                return
            except _RACE_ERRORS:
                log.info("commit of generation %s of %s raced; retrying", number, topic)
        raise MetadataUnavailable(f"commit of generation {number} of {topic!r} kept racing")

    # Plumbing -------------------------------------------------------------------------

    def _session_id(self) -> int:
        """The id of this client's ZooKeeper session, the owner of its ephemeral nodes.

        kazoo forgets it when the session is lost, which can happen between a call that
        succeeded and the comparison that needs it: that is a lost connection too."""
        client_id = self._client.client_id
        if client_id is None:
            raise SessionExpiredError("the ZooKeeper session was lost")
        return int(client_id[0])

    async def _run(self, function: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run a blocking kazoo call in a thread, with connection errors translated."""
        if self._state is not SessionState.CONNECTED:
            raise MetadataUnavailable(f"ZooKeeper session is {self._state.value}")
        try:
            return await asyncio.to_thread(function, *args, **kwargs)
        except _CONNECTION_ERRORS as exc:
            raise MetadataUnavailable(f"ZooKeeper: {exc!r}") from exc
        except NoAuthError as exc:
            raise MetadataNotAuthorized(
                f"ZooKeeper refused a write under {self._root}: the znodes' ACLs do not let "
                f"{self._identity} change them (zookeeper.security.digest_username)"
            ) from exc
        except AuthFailedError as exc:
            raise MetadataNotAuthorized(
                "zookeeper.security.digest_username / digest_password: ZooKeeper refused "
                "the credentials"
            ) from exc

    def _to_loop(self, callback: Callable[_P, None], *args: _P.args, **kwargs: _P.kwargs) -> None:
        loop = self._loop
        if loop is None or self._stopped:
            return
        with suppress(RuntimeError):  # the loop is already closed
            loop.call_soon_threadsafe(lambda: callback(*args, **kwargs))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _ensure_layout(self) -> None:
        for child in ("sidecars", "producers", "topics", "ops", "locks", "groups"):
            self._client.ensure_path(f"{self._root}/{child}")

    def _delete_tree(self, path: str) -> None:
        for _ in range(self._transaction_attempts):
            try:
                self._client.delete(path, recursive=True)
                return
            except NotEmptyError:
                continue  # a late ack landed while the children were deleted
        raise MetadataUnavailable(f"could not delete {path}: children keep appearing")

    def _get_json(self, path: str) -> Any:
        """The node's decoded value, or None if it does not exist."""
        try:
            return json.loads(self._client.get(path)[0])
        except NoNodeError:
            return None

    def _sidecar_path(self, sidecar_id: str) -> str:
        return f"{self._root}/sidecars/{_names.sidecar_id(sidecar_id)}"

    def _topic_path(self, topic: str) -> str:
        return f"{self._root}/topics/{_names.topic_name(topic)}"

    def _generation_path(self, topic: str, number: int) -> str:
        return f"{self._topic_path(topic)}/generations/{number:010d}"

    def _barrier_path(self, topic: str, number: int) -> str:
        return f"{self._topic_path(topic)}/barrier/{number}"

    def _ops_path(self, topic: str) -> str:
        return f"{self._root}/ops/{_names.topic_name(topic)}"

    def _group_path(self, group: str) -> str:
        return f"{self._root}/groups/{_names.group_name(group)}"

    def _lock_path(self, topic: str) -> str:
        return f"{self._root}/locks/{_names.topic_name(topic)}"

    def _producer_path(self, transactional_id: str) -> str:
        return f"{self._root}/producers/{_names.node_name(transactional_id, 'transactional id')}"

    def _revoked_path(self, group: str) -> str:
        return f"{self._group_path(group)}/revoked"


def _lock_holder(raw: bytes, stat: Any) -> LockHolder:
    try:
        value = json.loads(raw)
        return LockHolder(str(value["owner"]), str(value["purpose"]), float(value["acquired_at"]))
    except (ValueError, KeyError, TypeError):
        return LockHolder("unknown", "unknown", stat.ctime / 1000)


def _commit(transaction: Any) -> None:
    """Commit a kazoo transaction, raising the error of the operation that failed.

    kazoo returns failures as exception *instances* in the result list; every other
    operation of a failed transaction reports RolledBackError.
    """
    results = transaction.commit()
    failures = [r for r in results if isinstance(r, Exception)]
    for failure in failures:
        if not isinstance(failure, RolledBackError):
            raise failure
    if failures:
        raise failures[0]


def _encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _topic_json(config: TopicConfig, current_generation: int) -> dict[str, Any]:
    return {"config": config_to_json(config), "current_generation": current_generation}


def _encode_generation(generation: Generation) -> bytes:
    return _encode(generation_to_json(generation))


def _encode_partitions(
    modes: tuple[PartitionMode, ...], delete_after: tuple[float | None, ...]
) -> bytes:
    return _encode({"modes": modes_to_json(modes), "delete_after": list(delete_after)})


def _delete_after_from_json(raw: Any) -> tuple[float | None, ...]:
    if not isinstance(raw, list):
        raise ValueError(f"malformed delete_after: {raw!r}")
    values: list[float | None] = []
    for item in raw:
        if item is not None and (isinstance(item, bool) or not isinstance(item, int | float)):
            raise ValueError(f"malformed delete_after: {raw!r}")
        values.append(None if item is None else float(item))
    return tuple(values)


def _wait_name(topic: str, source: int, boundary: int, instance: str) -> str:
    checked = _names.topic_name(topic), _names.node_name(instance, "waiting instance")
    return f"{checked[0]}:{source}:{boundary}:{checked[1]}"
