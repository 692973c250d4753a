"""keys_revoked told once per revocation and group.

By callback: the release loop, a commit and a rebalance listener can each find the same
revocation unacknowledged at the same moment; the app must be called once. And a
partition's new owner must not tell what the group acknowledged through its previous
owner. A real HTTP endpoint
plays the app; the sidecar around the instance is reduced to the acknowledgements it
writes to ZooKeeper.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiokafka import TopicPartition

from sidecar.core.errors import CallbackFailed, MetadataUnavailable
from sidecar.core.handoff import HandoffKind, Revocation
from sidecar.service.consumers import ConsumerInstance, InstanceConfig


class _App:
    """Answers keys_revoked callbacks after ``delay_s``; 503 for ``refuse_s`` after the
    first call."""

    def __init__(self, *, refuse_s: float = 0.0, delay_s: float = 0.1) -> None:
        self.calls: list[dict[str, Any]] = []
        self.refuse_s = refuse_s
        self.delay_s = delay_s
        self._first: float | None = None
        self.called = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.calls.append(await request.json())
        self.called.set()
        now = asyncio.get_running_loop().time()
        if self._first is None:
            self._first = now
        await asyncio.sleep(self.delay_s)
        if now - self._first < self.refuse_s:
            return web.Response(status=503)
        return web.Response(status=204)


class _Store:
    """The group's keys_revoked acknowledgements, as ZooKeeper holds them."""

    def __init__(self) -> None:
        self.acknowledged: list[tuple[str, str, int, int]] = []
        self.away = False
        self.reads = 0
        self.read_thrice = asyncio.Event()

    def _asked(self) -> None:
        self.reads += 1
        if self.reads >= 3:
            self.read_thrice.set()
        if self.away:
            raise MetadataUnavailable()

    async def acknowledge_revocation(
        self, group: str, topic: str, partition: int, generation: int
    ) -> None:
        self._asked()
        self.acknowledged.append((group, topic, partition, generation))

    async def acknowledged_revocations(self, group: str, topic: str) -> set[tuple[int, int]]:
        self._asked()
        return {(p, g) for (gr, t, p, g) in self.acknowledged if (gr, t) == (group, topic)}


class _Consumers:
    def callback_done(self, kind: object, seconds: float, ok: bool) -> None:
        pass


async def _instance(app: _App) -> tuple[ConsumerInstance, web.AppRunner, _Store]:
    server = web.Application()
    server.router.add_post("/hand-off", app.handle)
    runner = web.AppRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    config = InstanceConfig(
        group="g",
        name="i",
        format="binary",
        callback_url=f"http://127.0.0.1:{port}/hand-off",
        callback_timeout_s=0.5,
    )
    store = _Store()
    sidecar: Any = SimpleNamespace(store=store)
    consumers: Any = _Consumers()
    return ConsumerInstance(config, sidecar, consumers), runner, store


async def test_needs_at_once_call_the_app_once() -> None:
    app = _App()
    instance, runner, store = await _instance(app)
    revocation = Revocation(partition=0, generation=1, boundary=10)
    try:
        answers = await asyncio.gather(
            instance._revocation_pending("t", revocation, patient=False),
            instance._revocation_pending("t", revocation),
            instance._revocation_pending("t", revocation),
        )
        assert list(answers) == [None, None, None]
        assert len(app.calls) == 1, app.calls
        # Known from now on: a later need calls nobody.
        assert await instance._revocation_pending("t", revocation) is None
        assert len(app.calls) == 1
        assert ("g", "t", 0, 1) in store.acknowledged
    finally:
        await instance.close()
        await runner.cleanup()


async def test_a_patient_need_calls_again_when_the_impatient_call_fails() -> None:
    # The impatient call is tried for one callback timeout (0.5 s) and refused throughout;
    # the patient need that joined it then calls with its own patience and gets through.
    app = _App(refuse_s=1.0)
    instance, runner, store = await _instance(app)
    revocation = Revocation(partition=2, generation=3, boundary=40)
    try:
        impatient = asyncio.create_task(
            instance._revocation_pending("t", revocation, patient=False)
        )
        await asyncio.sleep(0.05)  # the impatient call is under way
        patient = asyncio.create_task(instance._revocation_pending("t", revocation))
        with pytest.raises(CallbackFailed):
            await impatient
        refused = len(app.calls)
        assert await patient is None
        assert len(app.calls) > refused  # called again, and the app acknowledged it
        assert store.acknowledged == [("g", "t", 2, 3)]
    finally:
        await instance.close()
        await runner.cleanup()


async def test_a_cancelled_need_leaves_the_call_to_the_others() -> None:
    app = _App(delay_s=0.2)
    instance, runner, _ = await _instance(app)
    revocation = Revocation(partition=1, generation=2, boundary=5)
    try:
        first = asyncio.create_task(instance._revocation_pending("t", revocation))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(instance._revocation_pending("t", revocation))
        await asyncio.sleep(0.05)
        first.cancel()
        assert await second is None
        assert len(app.calls) == 1
    finally:
        await instance.close()
        await runner.cleanup()


async def test_a_call_stops_once_another_instance_got_it_acknowledged() -> None:
    # The app refuses; between attempts the partition's new owner (another instance of
    # the group) gets the same keys_revoked acknowledged: this call stops calling.
    app = _App(refuse_s=10.0, delay_s=0.0)
    instance, runner, store = await _instance(app)
    revocation = Revocation(partition=3, generation=5, boundary=7)
    try:
        call = asyncio.create_task(instance._revocation_pending("t", revocation))
        await app.called.wait()
        store.acknowledged.append(("g", "t", 3, 5))
        assert await call is None
        assert len(app.calls) == 1
        assert instance._ledger.acknowledged(HandoffKind.KEYS_REVOKED, "t", 3, 5)
    finally:
        await instance.close()
        await runner.cleanup()


async def test_no_call_is_made_while_the_group_cannot_be_read() -> None:
    # A sidecar resumed after a pause, its ZooKeeper session gone: it cannot tell
    # whether the partition's new owner got the revocation acknowledged, so it waits.
    app = _App(delay_s=0.0)
    instance, runner, store = await _instance(app)
    store.away = True
    revocation = Revocation(partition=0, generation=2, boundary=3)
    try:
        call = asyncio.create_task(instance._revocation_pending("t", revocation))
        await asyncio.wait_for(store.read_thrice.wait(), 30)
        assert app.calls == []
        store.away = False
        assert await call is None
        assert len(app.calls) == 1
    finally:
        await instance.close()
        await runner.cleanup()


async def test_a_rebalance_waits_for_acknowledgements_zookeeper_did_not_take() -> None:
    # Seen in a chaos run: the app answered keys_revoked while ZooKeeper was paused, the
    # partition moved to another instance, and that instance told it again. The old
    # owner now writes what it holds before the rebalance gives the partition away.
    app = _App(delay_s=0.0)
    instance, runner, store = await _instance(app)
    revocation = Revocation(partition=7, generation=113, boundary=2533)
    try:
        assert await instance._revocation_pending("t", revocation) is None
        assert store.acknowledged == [("g", "t", 7, 113)]
        store.acknowledged.clear()
        instance._unrecorded.add(("t", 7, 113))  # as if ZooKeeper had been away then
        store.away, store.reads = True, 0
        store.read_thrice.clear()
        leaving = asyncio.create_task(instance.record_before_revoke([TopicPartition("t", 7)]))
        await asyncio.wait_for(store.read_thrice.wait(), 30)
        assert not leaving.done()
        store.away = False
        await asyncio.wait_for(leaving, 30)
        assert store.acknowledged == [("g", "t", 7, 113)]
        assert not instance._unrecorded
        # Another partition's acknowledgements do not hold a rebalance up.
        instance._unrecorded.add(("t", 8, 113))
        store.away = True
        await asyncio.wait_for(instance.record_before_revoke([TopicPartition("t", 7)]), 1)
    finally:
        store.away = False
        await instance.close()
        await runner.cleanup()


class _Check:
    """The release loop's view of one partition: its revocation points, and the group's
    progress, whose reading refreshes the instance's record of the group's
    acknowledgements (as ``ConsumerInstance._progress`` does)."""

    def __init__(
        self, instance: ConsumerInstance, revocation: Revocation, group_acknowledged: bool
    ) -> None:
        self.tp = TopicPartition("t", revocation.partition)
        self.revocations = [revocation]
        self.first_revocation = revocation.boundary
        self.reads = 0
        self._instance = instance
        self._acknowledged = group_acknowledged
        self.zookeeper_away = False

    async def progress(self) -> None:
        self.reads += 1
        if self.zookeeper_away:
            raise MetadataUnavailable()
        if self._acknowledged:
            instance = self._instance
            instance._ledger = instance._ledger.with_group_revocations(
                "t", {(self.revocations[0].partition, self.revocations[0].generation)}
            )


async def _events_instance() -> ConsumerInstance:
    config = InstanceConfig(group="g", name="new-owner", format="binary")
    sidecar: Any = SimpleNamespace(store=_Store())
    consumers: Any = _Consumers()
    return ConsumerInstance(config, sidecar, consumers)


async def test_a_new_owner_does_not_tell_what_the_group_acknowledged() -> None:
    # The partition's previous owner got keys_revoked acknowledged; the new owner
    # delivers past the boundary with a ledger that has not read the group since.
    instance = await _events_instance()
    revocation = Revocation(partition=1, generation=4, boundary=20)
    check: Any = _Check(instance, revocation, group_acknowledged=True)
    events: list[Any] = []
    assert await instance._revoked_before(check, 25, events)
    assert events == []
    assert check.reads == 1


async def test_nothing_is_told_while_the_group_cannot_be_read() -> None:
    instance = await _events_instance()
    revocation = Revocation(partition=1, generation=4, boundary=20)
    check: Any = _Check(instance, revocation, group_acknowledged=False)
    check.zookeeper_away = True
    events: list[Any] = []
    with pytest.raises(MetadataUnavailable):
        await instance._revoked_before(check, 25, events)
    assert events == []
    # Once it answers (and nobody acknowledged it), the new owner tells it.
    check.zookeeper_away = False
    assert not await instance._revoked_before(check, 25, events)
    assert [e.kind.value for e in events] == ["keys_revoked"]
