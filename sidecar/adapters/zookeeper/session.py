"""The store's ZooKeeper session: start and stop, its state, and who hears of it.

kazoo's session callbacks run on its connection thread and are handed to the event
loop, where the state is kept (``ZooKeeperConnection.state``) and told to the listeners.
A session lost forgets the change locks it held (``Operations``); a new session after a
lost one registers the sidecars again (``Sidecars``) before any listener hears of it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from kazoo.client import KazooState
from kazoo.protocol.states import KeeperState

from sidecar.adapters.zookeeper.connection import ZooKeeperConnection
from sidecar.adapters.zookeeper.operations import Operations
from sidecar.adapters.zookeeper.sidecars import Sidecars
from sidecar.adapters.zookeeper_security import diagnose_tls
from sidecar.core.errors import MetadataNotAuthorized, MetadataUnavailable
from sidecar.core.participant import SessionState

_CONNECT_POLL_S = 0.05
"""How often ``start`` looks whether kazoo's thread has a session yet."""

# The adapter's modules log under one name, the package's.
log = logging.getLogger(__package__)

_SESSION_STATES = {
    KazooState.CONNECTED: SessionState.CONNECTED,
    KazooState.SUSPENDED: SessionState.SUSPENDED,
    KazooState.LOST: SessionState.LOST,
}


class Session:
    """Connect, close, and the session's state changes, told on the event loop."""

    def __init__(
        self, connection: ZooKeeperConnection, sidecars: Sidecars, operations: Operations
    ) -> None:
        self._connection = connection
        self._sidecars = sidecars
        self._operations = operations
        self._auth_failed = False
        self._connecting = False
        self._state_events_seen = False
        self._listeners: list[Callable[[SessionState], None]] = []
        self._reregister_needed = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, timeout: float = 15.0) -> None:  # noqa: ASYNC109
        """Connect. Raises MetadataUnavailable if ZooKeeper does not answer in time (kazoo
        keeps trying in its thread meanwhile, so calling again waits on), and
        MetadataNotAuthorized if it refuses the TLS handshake or the credentials (the
        message names the setting), or if the znodes' ACLs do not let this identity in."""
        self._connection.loop = asyncio.get_running_loop()
        if not self._connecting:
            self._connecting = True
            self._connection.client.add_listener(self._on_kazoo_state)
            # Not kazoo's start(): after its timeout it stops and closes the client.
            self._connection.client.start_async()
        deadline = self._connection.loop.time() + timeout
        while not self._connection.client.connected:
            if self._auth_failed:
                raise MetadataNotAuthorized(
                    "zookeeper.security.digest_username / digest_password: ZooKeeper refused "
                    f"the {self._connection.security.sasl_mechanism or 'digest'} credentials "
                    f"of {self._connection.security.digest_username!r}"
                )
            if self._connection.loop.time() >= deadline:
                refused = (
                    await asyncio.to_thread(
                        diagnose_tls, self._connection.hosts, self._connection.security
                    )
                    if self._connection.security.tls
                    else None
                )
                if refused is not None:
                    raise MetadataNotAuthorized(refused)
                raise MetadataUnavailable(
                    f"cannot connect to ZooKeeper at {self._connection.hosts}: "
                    f"no session within {timeout:g} s"
                )
            await asyncio.sleep(_CONNECT_POLL_S)
        # The CONNECTED callback races with start() returning; a later event wins.
        if not self._state_events_seen:
            self._connection.state = SessionState.CONNECTED
        await self._connection.run(self._connection.ensure_layout)

    async def stop(self) -> None:
        """Close the session: its ephemeral nodes, the sidecar's registration, go away."""
        self._connection.stopped = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.to_thread(self._connection.client.stop)
        await asyncio.to_thread(self._connection.client.close)

    @property
    def session_state(self) -> SessionState:
        return self._connection.state

    def add_session_listener(self, callback: Callable[[SessionState], None]) -> None:
        """Call ``callback`` on the event loop at every session state change."""
        self._listeners.append(callback)

    def _on_kazoo_state(self, state: KazooState) -> None:
        # On kazoo's connection thread, which must never block.
        if self._connection.client.client_state == KeeperState.AUTH_FAILED:
            self._auth_failed = True
        self._connection.to_loop(self._session_changed, _SESSION_STATES[state])

    def _session_changed(self, state: SessionState) -> None:
        self._state_events_seen = True
        if state is self._connection.state:
            return
        self._connection.state = state
        if state is SessionState.LOST:
            self._reregister_needed = True
            self._operations.forget_held_locks()  # ephemeral: gone with the session
        elif (
            state is SessionState.CONNECTED
            and self._reregister_needed
            and not self._connection.stopped
        ):
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
        while self._connection.state is SessionState.CONNECTED and not self._connection.stopped:
            try:
                await self._sidecars.reregister()
            except MetadataUnavailable:
                log.warning("re-registration failed; retrying", exc_info=True)
                await asyncio.sleep(0.2)
                continue
            self._reregister_needed = False
            if self._connection.state is SessionState.CONNECTED:
                self._notify(SessionState.CONNECTED)
            return

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
