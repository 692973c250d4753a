"""The ZooKeeper metadata store against the real ZooKeeper of the test cluster."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from kazoo.client import KazooClient

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.waiting import eventually
from sidecar.adapters.zookeeper import MetadataStore
from sidecar.core.compaction import compact
from sidecar.core.errors import (
    ChangeTakenOver,
    InvalidName,
    MetadataUnavailable,
    OperationInProgress,
    TopicAlreadyManaged,
    UnknownTopic,
)
from sidecar.core.generations import Boundary, GenerationLog, PartitionMode, modes_after_commit
from sidecar.core.participant import SessionState
from sidecar.core.procedures import (
    Operation,
    OperationKind,
    Phase,
    SidecarId,
    TransactionalId,
)
from sidecar.core.topics import PendingBarrier, TopicConfig

RW = PartitionMode.READ_WRITE
WAIT_S = 10.0


@pytest.fixture
def root() -> str:
    return f"/t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def store(cluster: ClusterEndpoints, root: str) -> AsyncIterator[MetadataStore]:
    async with _started(cluster, root) as started:
        yield started


@asynccontextmanager
async def _started(
    cluster: ClusterEndpoints, root: str, session_timeout_s: float = 10.0
) -> AsyncIterator[MetadataStore]:
    store = MetadataStore(cluster.zookeeper_hosts, root=root, session_timeout_s=session_timeout_s)
    await store.start()
    try:
        yield store
    finally:
        await store.stop()


async def _managed_topic(store: MetadataStore, name: str = "orders") -> GenerationLog:
    log = GenerationLog.start(2)
    await store.create_topic(TopicConfig(name, 2, 1), log.current, (RW, RW))
    return log


def _operation(topic: str, phase: Phase = Phase.BARRIER) -> Operation:
    return Operation(
        topic=topic,
        kind=OperationKind.EXPAND,
        from_generation=0,
        from_count=2,
        target_count=3,
        phase=phase,
        coordinator=SidecarId("coordinator"),
        started_at=1000.0,
        barrier_deadline=1030.0,
        physical_count=3,
        previous_boundaries=(0, 0),
    )


class _Changes:
    """Counts watch callbacks."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = asyncio.Event()

    def __call__(self) -> None:
        self.count += 1
        self._changed.set()

    async def reach(self, count: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while self.count < count:
                await self._changed.wait()
                self._changed.clear()


async def _until_registered(store: MetadataStore, sidecar_id: str) -> None:
    # After an expired session the registration comes back in the background.
    async with asyncio.timeout(WAIT_S):
        while sidecar_id not in await store.live_sidecars():  # noqa: ASYNC110 (no event to await)
            await asyncio.sleep(0.1)


async def _next_state(states: asyncio.Queue[SessionState], wanted: SessionState) -> None:
    async with asyncio.timeout(30.0):
        while await states.get() is not wanted:
            pass


# Topics ---------------------------------------------------------------------------------


async def test_create_and_read_round_trip(store: MetadataStore) -> None:
    log = await _managed_topic(store)

    state = await store.read_topic("orders")

    assert state.config == TopicConfig("orders", 2, 1)
    assert state.log == log
    assert state.modes == (RW, RW)
    assert state.delete_after == (None, None)
    assert state.pending is None
    assert state.operation is None
    assert await store.list_topics() == ["orders"]


async def test_create_twice_is_refused(store: MetadataStore) -> None:
    await _managed_topic(store)
    with pytest.raises(TopicAlreadyManaged):
        await _managed_topic(store)


async def test_unknown_topic(store: MetadataStore) -> None:
    with pytest.raises(UnknownTopic):
        await store.read_topic("missing")
    with pytest.raises(UnknownTopic):
        await store.publish_barrier("missing", PendingBarrier(1, 3))
    with pytest.raises(UnknownTopic):
        await store.set_partitions("missing", (RW,), (None,))
    assert await store.read_operation("missing") is None


async def test_no_path_is_built_from_a_name_that_is_not_valid(
    cluster: ClusterEndpoints, root: str, store: MetadataStore
) -> None:
    bad_topic, bad_group = "../../escaped", "a/b"
    log = GenerationLog.start(1)
    attempts = [
        store.create_topic(TopicConfig(bad_topic, 1, 1), log.current, (RW,)),
        store.read_topic(bad_topic),
        store.read_operation(bad_topic),
        store.save_operation(_operation(bad_topic)),
        store.publish_barrier(bad_topic, PendingBarrier(1, 2)),
        store.ack_barrier("orders", 1, "../sidecar", {}),
        store.register_sidecar("..", {}),
        store.register_sidecar("s", {}, (TransactionalId("a/b"),)),
        store.register_group(bad_group),
        store.add_wait(bad_group, "orders", 0, 5, "i"),
        store.add_wait("g", bad_topic, 0, 5, "i"),
        store.add_wait("g", "orders", 0, 5, "i:j"),
        store.waits(bad_group, "orders"),
        store.acknowledge_revocation(bad_group, "orders", 0, 1),
        store.acknowledge_revocation("g", bad_topic, 0, 1),
        store.acknowledged_revocations(bad_group, "orders"),
        store.lock_holder(bad_topic),
    ]
    for attempt in attempts:
        with pytest.raises(InvalidName):
            await attempt
    with pytest.raises(InvalidName):
        async with store.lock(bad_topic, "me", 1.0):
            pass
    # Nothing was created anywhere, under the root or above it.
    kazoo = KazooClient(hosts=cluster.zookeeper_hosts)
    await asyncio.to_thread(kazoo.start)
    try:
        for parent in ("topics", "ops", "locks", "groups", "sidecars", "producers"):
            assert await asyncio.to_thread(kazoo.get_children, f"{root}/{parent}") == []
        assert await asyncio.to_thread(kazoo.exists, "/escaped") is None
    finally:
        await asyncio.to_thread(kazoo.stop)


async def test_set_partitions(store: MetadataStore) -> None:
    await _managed_topic(store)
    await store.set_partitions("orders", (RW, PartitionMode.READ_ONLY), (None, 1234.5))
    state = await store.read_topic("orders")
    assert state.modes == (RW, PartitionMode.READ_ONLY)
    assert state.delete_after == (None, 1234.5)


async def test_operation_journal(store: MetadataStore) -> None:
    await _managed_topic(store)
    operation = _operation("orders")
    await store.save_operation(operation)
    assert await store.read_operation("orders") == operation
    finished = dataclasses.replace(operation, phase=Phase.DONE, outcome="expanded to 3")
    await store.save_operation(finished)
    assert await store.read_operation("orders") == finished
    assert (await store.read_topic("orders")).operation == finished


class _Journals:
    """What a journal watch reported, in order (``unreadable`` as the string)."""

    def __init__(self) -> None:
        self.seen: list[Operation | str | None] = []
        self._reported = asyncio.Event()

    def seen_one(self, operation: Operation | None) -> None:
        self.seen.append(operation)
        self._reported.set()

    def unreadable(self) -> None:
        self.seen.append("unreadable")
        self._reported.set()

    async def reach(self, count: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while len(self.seen) < count:
                await self._reported.wait()
                self._reported.clear()


async def test_the_journal_watch_reports_the_journal_once_the_lock_is_released(
    cluster: ClusterEndpoints, root: str, store: MetadataStore
) -> None:
    """The journal is reported when the watch is set, then after each release of the
    topic's lock (the journal's writes under it are not reported one by one), also a
    release by a coordinator whose session ended: then the unfinished journal it left."""
    await _managed_topic(store)
    journals = _Journals()
    store.watch_journal("orders", journals.seen_one, journals.unreadable)
    await journals.reach(1)
    assert journals.seen == [None]

    operation = _operation("orders")
    async with _started(cluster, root, session_timeout_s=4.0) as coordinator:
        async with coordinator.lock("orders", "coordinator", timeout=5.0):
            await coordinator.save_operation(operation)
            done = dataclasses.replace(operation, phase=Phase.DONE, outcome="expanded to 3")
            await coordinator.save_operation(done)
            await asyncio.sleep(0.5)
            assert journals.seen == [None]  # held: nothing reported yet
        await journals.reach(2)
        assert journals.seen == [None, done]

        # A coordinator that dies with its change unfinished: its lock goes with its
        # session, and the journal it left is reported then.
        async with coordinator.lock("orders", "coordinator", timeout=5.0):
            await coordinator.save_operation(operation)
            session = coordinator._connection.client.client_id
            intruder = KazooClient(hosts=cluster.zookeeper_hosts, client_id=session)
            await asyncio.to_thread(intruder.start)
            await asyncio.to_thread(intruder.stop)
            await asyncio.to_thread(intruder.close)
            await journals.reach(3)
            assert journals.seen[2] == operation
    # A journal nobody can decode is reported as such at the next release.
    await asyncio.to_thread(
        store._connection.client.set, store._connection.ops_path("orders"), b"not json"
    )
    async with store.lock("orders", "a", timeout=5.0):
        pass
    await journals.reach(4)
    assert journals.seen[3] == "unreadable"


async def test_a_journal_taken_over_refuses_its_former_writer(
    cluster: ClusterEndpoints, root: str, store: MetadataStore
) -> None:
    """A coordinator paused past its session lost the lock; another took the journal
    over and moved it on. The first one's next save must fail, not overwrite."""
    await _managed_topic(store)
    operation = _operation("orders")
    await store.take_over_operation("orders")
    await store.save_operation(operation)
    async with _started(cluster, root) as successor:
        taken = await successor.take_over_operation("orders")
        assert taken == operation
        await successor.save_operation(dataclasses.replace(operation, phase=Phase.FENCING))
    with pytest.raises(ChangeTakenOver):
        await store.save_operation(dataclasses.replace(operation, phase=Phase.ROLLING_BACK))
    assert (await store.read_operation("orders")).phase is Phase.FENCING  # type: ignore[union-attr]
    # Taking it over again (after the lock) makes this store its writer once more.
    await store.take_over_operation("orders")
    await store.save_operation(dataclasses.replace(operation, phase=Phase.DONE))


async def test_a_coordinator_taken_over_can_neither_publish_nor_withdraw_a_barrier(
    cluster: ClusterEndpoints, root: str, store: MetadataStore
) -> None:
    """The leak of a long chaos run: a coordinator paused past its session retried its
    publish after a successor had finished the change, and left a barrier that refused
    every later change. Only the journal's owner writes the barrier."""
    await _managed_topic(store)
    operation = _operation("orders")
    pending = PendingBarrier(operation.pending_generation, operation.target_count)
    await store.take_over_operation("orders")
    await store.save_operation(operation)
    async with _started(cluster, root) as successor:
        await successor.take_over_operation("orders")
        await successor.publish_barrier("orders", pending)
        await successor.save_operation(dataclasses.replace(operation, phase=Phase.ROLLING_BACK))
        await successor.remove_barrier("orders", pending.generation)
        await successor.save_operation(dataclasses.replace(operation, phase=Phase.ROLLED_BACK))
    with pytest.raises(ChangeTakenOver):
        await store.publish_barrier("orders", pending)
    assert (await store.read_topic("orders")).pending is None
    assert await store.barrier_acks("orders", pending.generation) == {}

    # A barrier published by the owner: the former coordinator cannot withdraw it either.
    await store.take_over_operation("orders")
    async with _started(cluster, root) as owner:
        await owner.take_over_operation("orders")
        await owner.save_operation(operation)
        await owner.publish_barrier("orders", pending)
        with pytest.raises(ChangeTakenOver):
            await store.remove_barrier("orders", pending.generation)
        assert (await store.read_topic("orders")).pending == pending
        await owner.remove_barrier("orders", pending.generation)
    assert (await store.read_topic("orders")).pending is None


# Barrier and commit ---------------------------------------------------------------------


async def test_barrier_then_commit(store: MetadataStore) -> None:
    log = await _managed_topic(store)
    pending = PendingBarrier(generation=1, target_count=3)
    await store.publish_barrier("orders", pending)
    await store.publish_barrier("orders", pending)  # a resumed coordinator
    assert (await store.read_topic("orders")).pending == pending

    await store.ack_barrier("orders", 1, "a", {0: 4, 1: 6})
    await store.ack_barrier("orders", 1, "a", {0: 5, 1: 7})
    await store.ack_barrier("orders", 1, "b", {})
    assert await store.barrier_acks("orders", 1) == {"a": {0: 5, 1: 7}, "b": {}}

    generation = log.next_generation(3, [Boundary(5), Boundary(7, 2), Boundary(0)])
    modes = modes_after_commit((RW, RW), generation)
    done = _operation("orders", Phase.DONE)
    await store.commit_generation("orders", generation, modes, (None,) * 3, done)

    state = await store.read_topic("orders")
    assert state.log == log.append(generation)
    assert state.modes == (RW, RW, RW)
    assert state.delete_after == (None, None, None)
    assert state.pending is None
    assert state.operation == done
    assert await store.barrier_acks("orders", 1) == {}

    # Re-committing (a resumed coordinator) changes nothing, a late ack is dropped.
    await store.commit_generation("orders", generation, modes, (None,) * 3, done)
    await store.ack_barrier("orders", 1, "c", {0: 5})
    assert await store.read_topic("orders") == state
    assert await store.barrier_acks("orders", 1) == {}

    skipping = log.append(generation).next_generation(4, [Boundary(9)] * 4)
    with pytest.raises(ValueError, match="cannot follow"):
        await store.commit_generation(
            "orders", dataclasses.replace(skipping, number=3), (RW,) * 4, (None,) * 4, done
        )


async def test_remove_barrier(store: MetadataStore) -> None:
    await _managed_topic(store)
    await store.publish_barrier("orders", PendingBarrier(1, 3))
    with pytest.raises(OperationInProgress):
        await store.publish_barrier("orders", PendingBarrier(1, 4))
    await store.ack_barrier("orders", 1, "a", {0: 1})

    await store.remove_barrier("orders", 2)  # not the pending one: kept
    assert (await store.read_topic("orders")).pending == PendingBarrier(1, 3)

    await store.remove_barrier("orders", 1)
    await store.remove_barrier("orders", 1)
    assert (await store.read_topic("orders")).pending is None
    assert await store.barrier_acks("orders", 1) == {}

    # A new attempt at the same generation starts without acks.
    await store.publish_barrier("orders", PendingBarrier(1, 4))
    assert await store.barrier_acks("orders", 1) == {}


async def test_reads_arm_one_shot_watches(store: MetadataStore) -> None:
    log = await _managed_topic(store)
    changes = _Changes()
    await store.read_topic("orders", changes)
    await asyncio.sleep(0.2)
    assert changes.count == 0  # arming a watch tells nothing

    await store.publish_barrier("orders", PendingBarrier(1, 3))
    await changes.reach(1)  # the pending barrier's creation (an existence watch)

    # Read again: the pending barrier's watch is armed anew; the topic's and its
    # partitions' are still armed and not doubled (one watcher per topic).
    await store.read_topic("orders", changes)
    generation = log.next_generation(3, [Boundary(1)] * 3)
    modes = modes_after_commit((RW, RW), generation)
    done = _operation("orders", Phase.DONE)
    await store.commit_generation("orders", generation, modes, (None,) * 3, done)
    await changes.reach(4)  # topic and partitions set, pending deleted
    await asyncio.sleep(0.2)
    assert changes.count == 4

    # Every watch has fired and nobody read again: the next change is not told.
    await store.set_partitions("orders", modes, (None,) * 3)
    await asyncio.sleep(0.3)
    assert changes.count == 4

    # A read arms them again.
    await store.read_topic("orders", changes)
    await store.set_partitions("orders", modes, (None,) * 3)
    await changes.reach(5)


async def _grown(store: MetadataStore, changes: int) -> GenerationLog:
    """The topic "orders" through ``changes`` commits, alternately to 3 and 2
    partitions; boundary ``10 * i`` everywhere at change ``i``."""
    log = await _managed_topic(store)
    modes: tuple[PartitionMode, ...] = (RW, RW)
    for index in range(1, changes + 1):
        count = 3 if log.current.undeleted_count == 2 else 2
        generation = log.next_generation(count, [Boundary(10 * index)] * 3)
        modes = modes_after_commit(modes, generation)
        done = dataclasses.replace(_operation("orders", Phase.DONE), from_generation=index - 1)
        await store.commit_generation("orders", generation, modes, (None,) * 3, done)
        log = log.append(generation)
    return log


async def test_a_compacted_log_is_stored_watched_and_read_by_every_store(
    cluster: ClusterEndpoints, root: str, store: MetadataStore
) -> None:
    log = await _grown(store, 4)
    async with _started(cluster, root) as other:
        changes = _Changes()
        # every generation cached; the read arms the topic's watches
        assert (await other.read_topic("orders", changes)).log == log
        async with store.lock("orders", "compactor", 1.0, "compaction"):
            assert await store.compact_log("orders", log, compact(log, 3)) == 3
        await changes.reach(1)  # the topic node moved: every sidecar reads again
        assert (await other.read_topic("orders")).log == compact(log, 3)
        client = KazooClient(hosts=cluster.zookeeper_hosts)
        client.start()
        try:
            names = client.get_children(f"{root}/topics/orders/generations")
        finally:
            client.stop()
            client.close()
        assert sorted(int(name) for name in names) == [3, 4]
        # A commit after the compaction keeps the folded part; both read the longer log.
        compacted = compact(log, 3)
        generation = compacted.next_generation(3, [Boundary(50)] * 3)
        modes = modes_after_commit((RW, RW, PartitionMode.READ_ONLY), generation)
        done = dataclasses.replace(_operation("orders", Phase.DONE), from_generation=4)
        await store.commit_generation("orders", generation, modes, (None,) * 3, done)
        for reader in (store, other):
            assert (await reader.read_topic("orders")).log == compacted.append(generation)
        # A compactor holding the log it read before that commit writes nothing.
        with pytest.raises(OperationInProgress):
            await other.compact_log("orders", compacted, compact(compacted, 4))
        assert (await store.read_topic("orders")).log == compacted.append(generation)


async def test_no_compaction_is_written_while_a_change_is_in_progress(store: MetadataStore) -> None:
    log = await _grown(store, 2)
    await store.save_operation(dataclasses.replace(_operation("orders"), from_generation=2))
    with pytest.raises(OperationInProgress, match="in progress"):
        await store.compact_log("orders", log, compact(log, 2))
    assert (await store.read_topic("orders")).log == log


# Sidecars, lock, session ----------------------------------------------------------------


async def test_live_sidecars(cluster: ClusterEndpoints, root: str, store: MetadataStore) -> None:
    await store.register_sidecar("a", {"http_port": 1})
    async with _started(cluster, root) as other:
        await other.register_sidecar("b", {"http_port": 2})
        assert await store.live_sidecars() == {"a", "b"}
    assert await store.live_sidecars() == {"a"}


async def test_every_lane_of_a_registration_is_registered_and_counts_as_live(
    cluster: ClusterEndpoints, root: str, store: MetadataStore
) -> None:
    """A coordinator fences the registered ids no live registration names: every lane's id
    must be named, or a live sidecar's lanes would be taken for a zombie's."""
    lanes = (TransactionalId("c.a.0"), TransactionalId("c.a.0~1"), TransactionalId("c.a.0~2"))
    await store.register_sidecar("a", {"http_port": 1}, lanes)
    async with _started(cluster, root) as other:
        # One lane: one id.
        await other.register_sidecar("b", {"http_port": 2}, (TransactionalId("c.b.0"),))
        assert await store.registered_producers() == {*lanes, "c.b.0"}
        assert await store.live_producers() == {*lanes, "c.b.0"}
    assert await store.live_producers() == set(lanes)
    assert await store.registered_producers() == {*lanes, "c.b.0"}


async def test_lock_contention(cluster: ClusterEndpoints, root: str, store: MetadataStore) -> None:
    async with _started(cluster, root) as other:
        async with store.lock("orders", "a", timeout=5.0):
            with pytest.raises(OperationInProgress):
                async with other.lock("orders", "b", timeout=0.5):
                    pass
        async with other.lock("orders", "b", timeout=5.0):
            pass


async def test_start_fails_without_zookeeper() -> None:
    store = MetadataStore("127.0.0.1:1")
    try:
        with pytest.raises(MetadataUnavailable):
            await store.start(timeout=1.0)
    finally:
        # kazoo keeps trying in its thread after start() gives up (a later start waits
        # on); left running, it would go on for the rest of the test session.
        await store.stop()


async def test_suspended_then_reconnected(cluster: ClusterEndpoints, root: str) -> None:
    if cluster.servers is None:
        pytest.skip("stopping ZooKeeper needs a cluster this run starts")
    local = cluster.servers
    states: asyncio.Queue[SessionState] = asyncio.Queue()
    async with _started(cluster, root, session_timeout_s=4.0) as store:
        store.add_session_listener(states.put_nowait)
        await store.register_sidecar("a", {})
        try:
            await asyncio.to_thread(local.stop_zookeeper)
            await _next_state(states, SessionState.SUSPENDED)
            with pytest.raises(MetadataUnavailable):
                await store.live_sidecars()
        finally:
            await asyncio.to_thread(local.start_zookeeper)
        await _next_state(states, SessionState.CONNECTED)
        assert store.session_state is SessionState.CONNECTED
        await _until_registered(store, "a")


async def test_registration_survives_an_expired_session(
    cluster: ClusterEndpoints, root: str
) -> None:
    states: asyncio.Queue[SessionState] = asyncio.Queue()
    async with _started(cluster, root, session_timeout_s=4.0) as store:
        store.add_session_listener(states.put_nowait)
        await store.register_sidecar("a", {"http_port": 1})
        # ZooKeeper's classic way to expire a session: another client joins it and
        # closes it.
        session = store._connection.client.client_id
        intruder = KazooClient(hosts=cluster.zookeeper_hosts, client_id=session)
        await asyncio.to_thread(intruder.start)
        await asyncio.to_thread(intruder.stop)
        await asyncio.to_thread(intruder.close)

        await _next_state(states, SessionState.LOST)
        await _next_state(states, SessionState.CONNECTED)

        await _until_registered(store, "a")


async def test_a_leftover_lock_of_this_session_is_released(
    cluster: ClusterEndpoints, root: str, store: MetadataStore
) -> None:
    """What an acquisition interrupted after its create reached ZooKeeper leaves: a lock
    node of this (still live) session that the store does not count as held. It blocks
    the other sidecars only until the leftover sweep or this store's next attempt."""
    path = f"{root}/locks/orders"
    await asyncio.to_thread(store._connection.client.create, path, b"{}", ephemeral=True)
    async with _started(cluster, root) as other:
        with pytest.raises(OperationInProgress):
            async with other.lock("orders", "b", timeout=0.2):
                pass
        assert await store.release_leftover_locks() == ["orders"]
        assert await store.release_leftover_locks() == []
        async with other.lock("orders", "b", timeout=0.2):
            holder = await store.lock_holder("orders")
            assert holder is not None
            assert (holder.owner, holder.purpose) == ("b", "change")
            # Held by another session: never a leftover of this one.
            assert await store.release_leftover_locks() == []
        assert await store.lock_holder("orders") is None
    # This store's own next attempt clears a leftover of its session too.
    await asyncio.to_thread(store._connection.client.create, path, b"{}", ephemeral=True)
    async with store.lock("orders", "a", timeout=1.0):
        assert store.holds_lock("orders")
    assert not store.holds_lock("orders")


async def test_a_lock_attempt_interrupted_by_a_zookeeper_pause_leaves_no_lock(
    cluster: ClusterEndpoints, root: str
) -> None:
    """ZooKeeper frozen (SIGSTOP) for less than the session timeout while a lock is being
    taken: whatever the attempt answered, once ZooKeeper is back and the leftover sweep
    has run, nobody holds the lock and another sidecar takes it at once."""
    if cluster.local is None:
        pytest.skip("pausing ZooKeeper needs the local cluster")
    local = cluster.local
    async with _started(cluster, root, session_timeout_s=10.0) as store:

        async def attempt() -> str:
            try:
                async with store.lock("orders", "a", timeout=3.0):
                    return "held"
            except MetadataUnavailable:
                return "interrupted"

        await asyncio.to_thread(local.pause_zookeeper)
        try:
            pending = asyncio.create_task(attempt())
            await asyncio.sleep(5.0)
        finally:
            await asyncio.to_thread(local.resume_zookeeper)
        outcome = await asyncio.wait_for(pending, 30)
        assert outcome in ("held", "interrupted")
        async with _started(cluster, root) as other:

            async def swept() -> bool:
                try:
                    await store.release_leftover_locks()
                except MetadataUnavailable:
                    return False
                return await store.lock_holder("orders") is None

            await eventually(swept, 15, "no lock node left after the pause")
            async with other.lock("orders", "b", timeout=0.5):
                pass
