"""keys_revoked told once per revocation and group (``sidecar.service.handoff``).

By callback: the release loop, a commit and a rebalance listener can each find the same
revocation unacknowledged at the same moment; the app must be called once. A real HTTP
endpoint plays the app, called through the real callback client; the sidecar around the
teller is reduced to the acknowledgements it writes to ZooKeeper. (That a partition's
new owner does not tell what the group acknowledged through its previous owner is in
``test_release.py``.)
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from sidecar.adapters.callbacks import CallbackClient
from sidecar.core.consume import TopicPartition
from sidecar.core.errors import CallbackFailed, ConsumerStateConflict, MetadataUnavailable
from sidecar.core.handoff import HandoffKind, Revocation, Subject
from sidecar.http.callback_codec import encode_callback
from sidecar.service.consume_state import ConsumeState
from sidecar.service.handoff import HandoffTeller


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


def _attempted(message: object, seconds: float, ok: bool) -> None:
    pass


async def _teller(app: _App) -> tuple[HandoffTeller, web.AppRunner, _Store]:
    server = web.Application()
    server.router.add_post("/hand-off", app.handle)
    runner = web.AppRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = CallbackClient(
        f"http://127.0.0.1:{port}/hand-off",
        timeout_s=0.5,
        retry_s=0.2,
        encode=encode_callback,
        observe=_attempted,
    )
    store = _Store()
    group_store: Any = store
    return HandoffTeller(ConsumeState("g", "i"), group_store, client), runner, store


async def _close(teller: HandoffTeller) -> None:
    await teller.close()
    if teller.callbacks is not None:
        await teller.callbacks.close()


async def test_needs_at_once_call_the_app_once() -> None:
    app = _App()
    teller, runner, store = await _teller(app)
    revocation = Revocation(partition=0, generation=1, boundary=10)
    try:
        answers = await asyncio.gather(
            teller.revocation_pending("t", revocation, patient=False),
            teller.revocation_pending("t", revocation),
            teller.revocation_pending("t", revocation),
        )
        assert list(answers) == [None, None, None]
        assert len(app.calls) == 1, app.calls
        # Known from now on: a later need calls nobody.
        assert await teller.revocation_pending("t", revocation) is None
        assert len(app.calls) == 1
        assert ("g", "t", 0, 1) in store.acknowledged
    finally:
        await _close(teller)
        await runner.cleanup()


async def test_a_fenced_teller_tells_nothing_until_unfenced() -> None:
    """After a stall of the process the group may have given the partition to another
    instance, whose app is told: this one tells nothing until the group reassigned."""
    app = _App()
    teller, runner, store = await _teller(app)
    revocation = Revocation(partition=0, generation=1, boundary=10)
    try:
        teller.state.fence()
        with pytest.raises(ConsumerStateConflict, match="rebalancing"):
            await teller.revocation_pending("t", revocation)
        assert await teller.pending_events() == []
        assert app.calls == []
        teller.state.unfence()
        assert await teller.revocation_pending("t", revocation) is None
        assert len(app.calls) == 1
        assert ("g", "t", 0, 1) in store.acknowledged
    finally:
        await _close(teller)
        await runner.cleanup()


async def test_a_patient_need_calls_again_when_the_impatient_call_fails() -> None:
    # The impatient call is tried for one callback timeout (0.5 s) and refused throughout;
    # the patient need that joined it then calls with its own patience and gets through.
    app = _App(refuse_s=1.0)
    teller, runner, store = await _teller(app)
    revocation = Revocation(partition=2, generation=3, boundary=40)
    try:
        impatient = asyncio.create_task(teller.revocation_pending("t", revocation, patient=False))
        await asyncio.sleep(0.05)  # the impatient call is under way
        patient = asyncio.create_task(teller.revocation_pending("t", revocation))
        with pytest.raises(CallbackFailed):
            await impatient
        refused = len(app.calls)
        assert await patient is None
        assert len(app.calls) > refused  # called again, and the app acknowledged it
        assert store.acknowledged == [("g", "t", 2, 3)]
    finally:
        await _close(teller)
        await runner.cleanup()


async def test_a_cancelled_need_leaves_the_call_to_the_others() -> None:
    app = _App(delay_s=0.2)
    teller, runner, _ = await _teller(app)
    revocation = Revocation(partition=1, generation=2, boundary=5)
    try:
        first = asyncio.create_task(teller.revocation_pending("t", revocation))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(teller.revocation_pending("t", revocation))
        await asyncio.sleep(0.05)
        first.cancel()
        assert await second is None
        assert len(app.calls) == 1
    finally:
        await _close(teller)
        await runner.cleanup()


async def test_a_call_stops_once_another_instance_got_it_acknowledged() -> None:
    # The app refuses; between attempts the partition's new owner (another instance of
    # the group) gets the same keys_revoked acknowledged: this call stops calling.
    app = _App(refuse_s=10.0, delay_s=0.0)
    teller, runner, store = await _teller(app)
    revocation = Revocation(partition=3, generation=5, boundary=7)
    try:
        call = asyncio.create_task(teller.revocation_pending("t", revocation))
        await app.called.wait()
        store.acknowledged.append(("g", "t", 3, 5))
        assert await call is None
        assert len(app.calls) == 1
        assert teller.state.ledger.acknowledged(HandoffKind.KEYS_REVOKED, "t", 3, 5)
    finally:
        await _close(teller)
        await runner.cleanup()


async def test_no_call_is_made_while_the_group_cannot_be_read() -> None:
    # A sidecar resumed after a pause, its ZooKeeper session gone: it cannot tell
    # whether the partition's new owner got the revocation acknowledged, so it waits.
    app = _App(delay_s=0.0)
    teller, runner, store = await _teller(app)
    store.away = True
    revocation = Revocation(partition=0, generation=2, boundary=3)
    try:
        call = asyncio.create_task(teller.revocation_pending("t", revocation))
        await asyncio.wait_for(store.read_thrice.wait(), 30)
        assert app.calls == []
        store.away = False
        assert await call is None
        assert len(app.calls) == 1
    finally:
        await _close(teller)
        await runner.cleanup()


async def test_a_rebalance_waits_for_acknowledgements_zookeeper_did_not_take() -> None:
    # Seen in a chaos run: the app answered keys_revoked while ZooKeeper was paused, the
    # partition moved to another instance, and that instance told it again. The old
    # owner now writes what it holds before the rebalance gives the partition away.
    app = _App(delay_s=0.0)
    teller, runner, store = await _teller(app)
    revocation = Revocation(partition=7, generation=113, boundary=2533)
    try:
        assert await teller.revocation_pending("t", revocation) is None
        assert store.acknowledged == [("g", "t", 7, 113)]
        store.acknowledged.clear()
        teller._unrecorded.add(Subject("t", 7, 113))  # as if ZooKeeper had been away then
        store.away, store.reads = True, 0
        store.read_thrice.clear()
        leaving = asyncio.create_task(
            teller.record_before_revoke([TopicPartition("t", 7)], wait_s=10.0, retry_s=0.2)
        )
        await asyncio.wait_for(store.read_thrice.wait(), 30)
        assert not leaving.done()
        store.away = False
        await asyncio.wait_for(leaving, 30)
        assert store.acknowledged == [("g", "t", 7, 113)]
        assert not teller._unrecorded
        # Another partition's acknowledgements do not hold a rebalance up.
        teller._unrecorded.add(Subject("t", 8, 113))
        store.away = True
        await asyncio.wait_for(
            teller.record_before_revoke([TopicPartition("t", 7)], wait_s=10.0, retry_s=0.2), 1
        )
    finally:
        store.away = False
        await _close(teller)
        await runner.cleanup()
