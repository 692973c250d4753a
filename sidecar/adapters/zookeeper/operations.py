"""A topic's change in ZooKeeper: its journal, its take-over, and its change lock.

``<root>/ops/<t>`` is the journal of the change in progress (or last done), written
compare-and-set by znode version: once this store has read or written it, it writes it
again only if nobody else did meanwhile (``ChangeTakenOver`` otherwise), and the
barrier's writes check the same (``require_journal_owner``, ``check_journal_owner``).
``<root>/locks/<t>`` is the topic's change lock (ephemeral
``{"owner", "purpose", "acquired_at"}``): one change at a time.

The change lock is one ephemeral node rather than kazoo's Lock recipe: a recipe's
acquisition interrupted by a lost connection can leave its node behind under a session
that lives on (seen: every later change refused for minutes). Here the store knows
which lock nodes it holds; a node of its own session it does not hold is a leftover
and ``release_leftover_locks`` deletes it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, NoReturn

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.recipe.watchers import DataWatch

from sidecar.adapters.zookeeper.connection import ZooKeeperConnection, commit, encode
from sidecar.core.errors import ChangeTakenOver, MetadataUnavailable, OperationInProgress
from sidecar.core.procedures import Operation
from sidecar.core.serialization import operation_from_json, operation_to_json

# The adapter's modules log under one name, the package's.
log = logging.getLogger(__package__)


@dataclass(frozen=True, slots=True)
class LockHolder:
    """Who holds a topic's change lock, for what, and since when (wall clock)."""

    owner: str
    purpose: str
    acquired_at: float


class Operations:
    """The topics' change journals and change locks."""

    def __init__(self, connection: ZooKeeperConnection, *, lock_poll_s: float) -> None:
        self._connection = connection
        self._lock_poll_s = lock_poll_s
        self._held_locks: dict[str, int] = {}
        """Topic -> czxid of the lock node this store holds."""
        self._journal_versions: dict[str, int] = {}
        """Topic -> version of the journal node as this store last wrote or read it."""
        self._maybe_leftover = True
        """A lock node of this session may be left that this store does not hold: an
        attempt or a release met an error after it may have reached ZooKeeper (or, at
        first, a previous store of the same session). Only then does
        ``release_leftover_locks`` read the locks."""

    # Locks ----------------------------------------------------------------------------

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
        self._connection.lock_path(topic)  # InvalidName before any attempt
        deadline = time.monotonic() + wait_s
        data = encode({"owner": owner, "purpose": purpose, "acquired_at": time.time()})
        while True:
            try:
                holder = await self._connection.run(self._try_lock, topic, data)
            except BaseException:
                # The create may have reached ZooKeeper before the error (or the
                # cancellation) came back: the node would be a leftover of this session.
                self._maybe_leftover = True
                raise
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
        path = self._connection.lock_path(topic)
        try:
            # On a lost connection the create may still have happened: the node is then
            # a leftover of this session, deleted by the next attempt or by
            # release_leftover_locks.
            _, stat = self._connection.client.create(path, data, ephemeral=True, include_data=True)
        except NodeExistsError:
            pass
        else:
            self._held_locks[topic] = stat.czxid
            return None
        try:
            raw, stat = self._connection.client.get(path)
        except NoNodeError:
            return LockHolder("nobody", "a lock released meanwhile", time.time())
        if stat.ephemeralOwner == self._connection.session_id() and topic not in self._held_locks:
            # Ours, yet not held: left by an interrupted attempt. Delete it and retry.
            with suppress(NoNodeError, BadVersionError):
                self._connection.client.delete(path, version=stat.version)
            return LockHolder("nobody", "a leftover of this sidecar", time.time())
        if stat.ephemeralOwner == 0:
            # A parent node of the lock recipe used before: empty, it is no lock.
            with suppress(NoNodeError, NotEmptyError, BadVersionError):
                self._connection.client.delete(path, version=stat.version)
            return LockHolder("nobody", "an old lock layout", time.time())
        return _lock_holder(raw, stat)

    async def _release_lock(self, topic: str) -> None:
        czxid = self._held_locks.pop(topic, None)
        if czxid is None:
            return  # lost with the session already
        try:
            await self._connection.run(
                self._delete_if_created, self._connection.lock_path(topic), czxid
            )
        except MetadataUnavailable:
            # The node stays while this session lives: release_leftover_locks deletes it
            # once ZooKeeper answers again (this store no longer counts it as held).
            self._maybe_leftover = True
            log.info("could not release the lock of %s now; it will be cleaned up", topic)
        except BaseException:
            self._maybe_leftover = True  # cancelled: the delete may not have been sent
            raise

    def _delete_if_created(self, path: str, czxid: int) -> None:
        stat = self._connection.client.exists(path)
        if stat is not None and stat.czxid == czxid:
            with suppress(NoNodeError, BadVersionError):
                self._connection.client.delete(path, version=stat.version)

    async def release_leftover_locks(self) -> list[str]:
        """Delete every lock node of this session that this store does not hold (left by
        an interrupted acquisition or release); returns their topics. Reads nothing
        unless an acquisition or a release was interrupted since the last complete look
        (an idle sidecar then costs ZooKeeper nothing here)."""
        if not self._maybe_leftover:
            return []
        # Cleared first: an interruption during this look marks it again.
        self._maybe_leftover = False
        try:
            return await self._connection.run(self._release_leftover_locks)
        except BaseException:
            self._maybe_leftover = True
            raise

    def _release_leftover_locks(self) -> list[str]:
        released = []
        session = self._connection.session_id()
        for topic in self._connection.client.get_children(f"{self._connection.root}/locks"):
            path = f"{self._connection.root}/locks/{topic}"  # listed: a node already
            stat = self._connection.client.exists(path)
            if stat is None or stat.ephemeralOwner != session or topic in self._held_locks:
                continue
            with suppress(NoNodeError, BadVersionError):
                self._connection.client.delete(path, version=stat.version)
                released.append(topic)
                log.warning("released a leftover change lock of %s", topic)
        return released

    def holds_lock(self, topic: str) -> bool:
        return topic in self._held_locks

    def forget_held_locks(self) -> None:
        """The session was lost: the lock nodes it held, ephemeral, went with it."""
        self._held_locks.clear()

    async def lock_holder(self, topic: str) -> LockHolder | None:
        """Who holds the topic's change lock now, or None."""
        return await self._connection.run(self._lock_holder, topic)

    def _lock_holder(self, topic: str) -> LockHolder | None:
        try:
            raw, stat = self._connection.client.get(self._connection.lock_path(topic))
        except NoNodeError:
            return None
        if stat.ephemeralOwner == 0:
            return None
        return _lock_holder(raw, stat)

    # Journal --------------------------------------------------------------------------

    async def save_operation(self, operation: Operation) -> None:
        """Create or overwrite the topic's operation journal. After this store has read or
        written it, only if nobody else wrote it since: raises ChangeTakenOver then (a
        coordinator that was paused must not overwrite its successor's progress)."""
        await self._connection.run(self.save_operation_blocking, operation)

    def save_operation_blocking(self, operation: Operation) -> None:
        """``save_operation`` in the calling (worker) thread."""
        path, data = (
            self._connection.ops_path(operation.topic),
            encode(operation_to_json(operation)),
        )
        expected = self._journal_versions.get(operation.topic)
        try:
            if expected is None:
                stat = self._connection.client.set(path, data)
            else:
                stat = self._connection.client.set(path, data, version=expected)
        except BadVersionError:
            self._journal_taken_over(operation.topic)
        except NoNodeError:
            self._connection.client.create(path, data)
            stat = self._connection.client.exists(path)
        if stat is not None:
            self._journal_versions[operation.topic] = stat.version

    def journal_version(self, topic: str) -> int | None:
        """The version of the journal as this store last wrote or read it, if it did."""
        return self._journal_versions.get(topic)

    def forget_journal_version(self, topic: str) -> None:
        """Stop checking the journal's version (before starting a new change or resuming)."""
        self._journal_versions.pop(topic, None)

    async def read_operation(self, topic: str) -> Operation | None:
        return await self._connection.run(self.read_operation_blocking, topic)

    def read_operation_blocking(self, topic: str) -> Operation | None:
        """``read_operation`` in the calling (worker) thread."""
        try:
            raw, _ = self._connection.client.get(self._connection.ops_path(topic))
        except NoNodeError:
            return None
        return operation_from_json(json.loads(raw))

    @staticmethod
    def operation_from_answer(answer: Any) -> Operation | None:
        """The journal from kazoo's answer to a read of it (``get_async``), or None."""
        try:
            raw, _ = answer.get()
        except NoNodeError:
            return None
        return operation_from_json(json.loads(raw))

    def watch_journal(
        self,
        topic: str,
        seen: Callable[[Operation | None], None],
        unreadable: Callable[[], None],
    ) -> None:
        """Call ``seen`` on the loop with the topic's journal (None: there is none) as soon
        as the watch is set, each time the topic's change lock is released (or found free
        after a reconnect: kazoo reads the lock node again then), and ``unreadable``
        instead when the journal cannot be read or decoded. Until the store stops: a
        topic no longer managed keeps its watch (one per topic this process managed).

        The watch is on the lock, not on the journal. Only the lock's holder writes the
        journal (a change's coordinator, or its successor that took the lock over), so a
        journal read after the lock was released is at least as new as its last
        holder's writes, and a journal left unfinished (its coordinator died) is read
        once its lock goes with the session. While a holder has the lock, what was
        reported may be older than the journal; a change then goes on, or its lock has
        to be taken first, so nothing acts on it. A change writes its journal 6-8
        times and takes its lock once: every other sidecar is woken twice per change,
        and reads the journal once, instead of once per write.

        Every lock taken wakes the watch, also a compaction pass or a retirement that
        writes no journal: one notification and one read more per pass, per sidecar.
        """
        client = self._connection.client
        journal_path = self._connection.ops_path(topic)
        first = True

        def read_journal() -> None:
            client.get_async(journal_path).rawlink(report)

        def report(answer: Any) -> None:
            try:
                operation = self.operation_from_answer(answer)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("the journal of %s cannot be read: %r", topic, exc)
                self._connection.to_loop(unreadable)
                return
            except Exception as exc:  # the connection failed under the read
                log.debug("the journal of %s was not read: %r", topic, exc)
                self._connection.to_loop(unreadable)
                return
            self._connection.to_loop(seen, operation)

        def lock_changed(data: bytes | None, stat: Any, event: Any) -> None:
            nonlocal first
            # Held: its release will be reported. The first call reads the journal
            # either way, so a sidecar starting beside a held lock knows it at once.
            if data is None or first:
                first = False
                read_journal()

        # DataWatch reads the node before it returns, retrying while disconnected: not on
        # the event loop.
        client.handler.spawn(DataWatch, client, self._connection.lock_path(topic), lock_changed)

    async def take_over_operation(self, topic: str) -> Operation | None:
        """Read the journal to drive it from now on: later saves by this store check that
        nobody else wrote it in between."""
        return await self._connection.run(self._take_over_operation, topic)

    def _take_over_operation(self, topic: str) -> Operation | None:
        try:
            raw, stat = self._connection.client.get(self._connection.ops_path(topic))
        except NoNodeError:
            self._journal_versions.pop(topic, None)
            return None
        self._journal_versions[topic] = stat.version
        return operation_from_json(json.loads(raw))

    def require_journal_owner(self, topic: str) -> None:
        """Raise ChangeTakenOver if another coordinator wrote ``topic``'s journal since this
        store read or wrote it (nothing is checked if it did neither)."""
        expected = self._journal_versions.get(topic)
        if expected is None:
            return
        stat = self._connection.client.exists(self._connection.ops_path(topic))
        if stat is None or stat.version != expected:
            self._journal_taken_over(topic)

    def check_journal_owner(self, transaction: Any, topic: str) -> None:
        """Make ``transaction`` fail unless the journal is as this store last saw it."""
        expected = self._journal_versions.get(topic)
        if expected is not None:
            transaction.check(self._connection.ops_path(topic), expected)

    def commit_as_owner(self, transaction: Any, topic: str) -> None:
        """Commit a transaction made with ``check_journal_owner``; ChangeTakenOver if its
        check failed."""
        try:
            commit(transaction)
        except BadVersionError:
            self.require_journal_owner(topic)
            raise

    def _journal_taken_over(self, topic: str) -> NoReturn:
        self._journal_versions.pop(topic, None)
        raise ChangeTakenOver(f"the journal of {topic!r} was changed by another coordinator")


def _lock_holder(raw: bytes, stat: Any) -> LockHolder:
    try:
        value = json.loads(raw)
        return LockHolder(str(value["owner"]), str(value["purpose"]), float(value["acquired_at"]))
    except (ValueError, KeyError, TypeError):
        return LockHolder("unknown", "unknown", stat.ctime / 1000)
