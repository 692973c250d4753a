"""``sidecar.adapters.zookeeper.session``: starting with a client that connects, never
does or is refused, and the session's state changes as the listeners hear them, with a
fake kazoo client and fakes of the registrations and the locks. A real session
suspended, lost and re-established is tested in
``tests/integration/test_zookeeper_store.py`` and
``tests/integration/test_zookeeper_outage.py``."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from kazoo.client import KazooState
from kazoo.protocol.states import KeeperState

from sidecar.adapters.zookeeper.operations import Operations
from sidecar.adapters.zookeeper.session import Session
from sidecar.adapters.zookeeper.sidecars import Sidecars
from sidecar.config import Secret, ZooKeeperSecuritySettings
from sidecar.core.errors import MetadataNotAuthorized, MetadataUnavailable
from sidecar.core.participant import SessionState
from tests.unit.adapters.zookeeper.support import connection


class _Client:
    def __init__(self, *, connected: bool) -> None:
        self.connected = connected
        self.client_state = KeeperState.CONNECTING
        self.listeners: list[Any] = []
        self.started = 0
        self.ensured: list[str] = []
        self.calls: list[str] = []

    def add_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def start_async(self) -> None:
        self.started += 1

    def ensure_path(self, path: str) -> None:
        self.ensured.append(path)

    def stop(self) -> None:
        self.calls.append("stop")

    def close(self) -> None:
        self.calls.append("close")


class _Sidecars:
    def __init__(self, events: list[str], failures: int = 0) -> None:
        self.events = events
        self.failures = failures

    async def reregister(self) -> None:
        if self.failures:
            self.failures -= 1
            self.events.append("reregister failed")
            raise MetadataUnavailable("ZooKeeper: ConnectionLoss()")
        self.events.append("reregistered")


class _Operations:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def forget_held_locks(self) -> None:
        self.events.append("locks forgotten")


def _session(
    client: _Client, events: list[str], *, failures: int = 0, **connection_options: Any
) -> Session:
    made = connection(client, **connection_options)
    made.state = SessionState.LOST
    session = Session(
        made,
        cast(Sidecars, _Sidecars(events, failures)),
        cast(Operations, _Operations(events)),
    )
    session.add_session_listener(lambda state: events.append(f"heard {state.value}"))
    return session


async def _kazoo_says(session: Session, client: _Client, state: KazooState) -> None:
    """kazoo's connection thread reports ``state``; the loop runs what it handed over."""
    for listener in client.listeners:
        await asyncio.to_thread(listener, state)
    for _ in range(3):
        await asyncio.sleep(0)


async def test_start_connects_once_and_makes_the_layout() -> None:
    client = _Client(connected=True)
    session = _session(client, [])
    await session.start(timeout=1)
    await session.start(timeout=1)  # again: waits on the same attempt
    assert client.started == 1
    assert session.session_state is SessionState.CONNECTED
    assert client.ensured[:6] == [
        f"/ordered/{child}"
        for child in ("sidecars", "producers", "topics", "ops", "locks", "groups")
    ]


async def test_a_zookeeper_that_never_answers_is_unavailable_in_time() -> None:
    session = _session(_Client(connected=False), [])
    with pytest.raises(
        MetadataUnavailable,
        match=r"^cannot connect to ZooKeeper at 127\.0\.0\.1:1: no session "
        r"within 0\.1 s$",
    ):
        await session.start(timeout=0.1)


async def test_refused_credentials_are_not_authorized_naming_the_user() -> None:
    client = _Client(connected=False)
    made = connection(client)
    made.security = ZooKeeperSecuritySettings(
        digest_username="sidecar", digest_password=Secret("pw")
    )
    session = Session(made, cast(Sidecars, _Sidecars([])), cast(Operations, _Operations([])))
    starting = asyncio.ensure_future(session.start(timeout=5))
    await asyncio.sleep(0.01)
    client.client_state = KeeperState.AUTH_FAILED
    await _kazoo_says(session, client, KazooState.LOST)
    with pytest.raises(MetadataNotAuthorized, match="refused the digest credentials of 'sidecar'"):
        await starting


async def test_a_lost_session_forgets_its_locks_before_anyone_hears() -> None:
    events: list[str] = []
    client = _Client(connected=True)
    session = _session(client, events)
    await session.start(timeout=1)
    await _kazoo_says(session, client, KazooState.SUSPENDED)
    await _kazoo_says(session, client, KazooState.SUSPENDED)  # no change: nobody told
    await _kazoo_says(session, client, KazooState.LOST)
    assert events == ["heard suspended", "locks forgotten", "heard lost"]
    assert session.session_state is SessionState.LOST


async def test_after_a_lost_session_the_sidecars_register_before_anyone_hears() -> None:
    events: list[str] = []
    client = _Client(connected=True)
    session = _session(client, events, failures=1)
    await session.start(timeout=1)
    await _kazoo_says(session, client, KazooState.LOST)
    events.clear()
    await _kazoo_says(session, client, KazooState.CONNECTED)
    for _ in range(50):  # one failed try, then the pause before the next
        if "heard connected" in events:
            break
        await asyncio.sleep(0.05)
    assert events == ["reregister failed", "reregistered", "heard connected"]


async def test_a_suspension_that_ends_keeps_the_session_and_registers_nothing() -> None:
    events: list[str] = []
    client = _Client(connected=True)
    session = _session(client, events)
    await session.start(timeout=1)
    await _kazoo_says(session, client, KazooState.SUSPENDED)
    await _kazoo_says(session, client, KazooState.CONNECTED)
    assert events == ["heard suspended", "heard connected"]


async def test_stop_closes_the_client_and_nothing_is_heard_after() -> None:
    events: list[str] = []
    client = _Client(connected=True)
    session = _session(client, events)
    await session.start(timeout=1)
    await session.stop()
    assert client.calls == ["stop", "close"]
    await _kazoo_says(session, client, KazooState.LOST)
    assert events == []
