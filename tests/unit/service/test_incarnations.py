"""``sidecar.service.incarnations``: which transactional ids the writer takes, when a
new incarnation begins, what is registered before a writer writes, and which ids leave
the registration. The writer is a fake; the fences themselves against a real cluster
are tested in ``tests/integration/test_zombie_sidecar.py`` and
``test_zookeeper_outage.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, ClassVar

import pytest

import sidecar.service.incarnations as incarnations_module
from sidecar.config import Settings
from sidecar.core.errors import KafkaUnavailable, MetadataUnavailable, ProducerFenced
from sidecar.core.procedures import TransactionalId
from sidecar.metrics import SidecarMetrics
from sidecar.service.incarnations import WriterIncarnations


class _Store:
    def __init__(self) -> None:
        self.trail: list[tuple[str, tuple[str, ...]]] = []
        self.forget_fails = False

    async def register_sidecar(
        self, sidecar_id: str, info: dict[str, Any], transactional_ids: Sequence[str] = ()
    ) -> None:
        self.trail.append(("register", tuple(transactional_ids)))

    def prepare_registration(
        self, sidecar_id: str, info: dict[str, Any], transactional_ids: Sequence[str]
    ) -> None:
        self.trail.append(("prepare", tuple(transactional_ids)))

    async def forget_producers(self, transactional_ids: tuple[TransactionalId, ...]) -> None:
        if self.forget_fails:
            raise MetadataUnavailable("ZooKeeper session is lost")
        self.trail.append(("forget", transactional_ids))


class _Writer:
    """Started with the ids it is given; ``refuse`` makes the next start fail."""

    refuse: ClassVar[list[Exception]] = []
    started: ClassVar[list[tuple[str, ...]]] = []

    def __init__(self, settings: Any, transactional_ids: Sequence[str], **_: Any) -> None:
        self.transactional_ids = tuple(transactional_ids)
        self.fenced = False
        self.stopped = False

    async def start(self) -> None:
        if _Writer.refuse:
            raise _Writer.refuse.pop(0)
        _Writer.started.append(self.transactional_ids)

    async def stop(self) -> None:
        self.stopped = True


@pytest.fixture(autouse=True)
def _fake_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    _Writer.refuse = []
    _Writer.started = []
    monkeypatch.setattr(incarnations_module, "TransactionalWriter", _Writer)


class _Made:
    def __init__(self) -> None:
        self.store = _Store()
        self.fenced_told = 0
        self.tasks: list[Awaitable[None]] = []
        settings = Settings(sidecar_id="host-1")
        self.incarnations = WriterIncarnations(
            settings,
            self.store,
            SidecarMetrics(),
            on_fenced=self._told,
            spawn=self.tasks.append,
        )

    def _told(self) -> None:
        self.fenced_told += 1

    async def run_tasks(self) -> None:
        while self.tasks:
            await self.tasks.pop(0)


def _lane_ids(made: _Made) -> tuple[str, ...]:
    return tuple(made.incarnations.transactional_ids)


async def test_the_ids_are_registered_before_their_writer_starts() -> None:
    made = _Made()
    first = _lane_ids(made)
    assert len(first) == Settings(sidecar_id="x").kafka.transaction_lanes
    await made.incarnations.register()
    assert await made.incarnations.first_writer()
    assert made.store.trail == [("register", first)]
    assert _Writer.started == [first]
    assert made.incarnations.writing


async def test_a_lost_session_takes_the_next_incarnation_and_retires_the_writer() -> None:
    made = _Made()
    await made.incarnations.register()
    await made.incarnations.first_writer()
    first = _lane_ids(made)
    writer: Any = made.incarnations.writer  # a _Writer
    made.incarnations.session_lost()
    second = _lane_ids(made)
    assert second != first
    # The next session's registration names the new ids before anything is written.
    assert made.store.trail[-1] == ("prepare", second)
    assert made.incarnations.writer is None
    assert not made.incarnations.writing
    await made.run_tasks()
    assert isinstance(writer, _Writer)
    assert writer.stopped
    # The new ids are registered already: the writer starts without registering again.
    await made.incarnations.ensure_writer()
    assert _Writer.started[-1] == second
    assert [step for step, _ in made.store.trail].count("register") == 1
    # The old writer closed cleanly: its ids leave the registration.
    await made.incarnations.forget_retired()
    assert made.store.trail[-1] == ("forget", tuple(sorted(first)))


async def test_a_fenced_writer_is_replaced_under_new_registered_ids() -> None:
    made = _Made()
    await made.incarnations.register()
    await made.incarnations.first_writer()
    first = _lane_ids(made)
    writer: Any = made.incarnations.writer  # a _Writer
    assert isinstance(writer, _Writer)
    writer.fenced = True
    await made.incarnations.ensure_writer()
    second = _lane_ids(made)
    assert second != first
    assert made.store.trail[-1] == ("register", second)
    assert _Writer.started[-1] == second
    await made.run_tasks()
    # Whoever fenced the ids dropped them: they are not forgotten again.
    await made.incarnations.forget_retired()
    assert [step for step, _ in made.store.trail].count("forget") == 0


async def test_ids_fenced_between_registration_and_start_are_never_written_with() -> None:
    made = _Made()
    await made.incarnations.register()
    first = _lane_ids(made)
    _Writer.refuse = [ProducerFenced("fenced by a coordinator")]
    assert not await made.incarnations.first_writer()
    assert _lane_ids(made) != first
    _Writer.refuse = [ProducerFenced("fenced again")]
    with pytest.raises(ProducerFenced):
        await made.incarnations.ensure_writer()
    third = _lane_ids(made)
    await made.incarnations.ensure_writer()
    assert _Writer.started == [third]
    assert made.store.trail[-1] == ("register", third)


async def test_a_slow_transaction_coordinator_keeps_the_ids() -> None:
    made = _Made()
    await made.incarnations.register()
    first = _lane_ids(made)
    _Writer.refuse = [KafkaUnavailable("coordinator not available")]
    assert not await made.incarnations.first_writer()
    await made.incarnations.ensure_writer()
    assert _Writer.started == [first]
    assert [step for step, _ in made.store.trail] == ["register"]


async def test_retired_ids_wait_for_zookeeper_to_be_forgotten() -> None:
    made = _Made()
    await made.incarnations.register()
    await made.incarnations.first_writer()
    first = _lane_ids(made)
    made.store.forget_fails = True
    await made.incarnations.stop()
    assert not any(step == "forget" for step, _ in made.store.trail)
    made.store.forget_fails = False
    await made.incarnations.forget_retired()
    assert made.store.trail[-1] == ("forget", tuple(sorted(first)))
    await asyncio.sleep(0)
