"""What the ZooKeeper adapter's unit tests share: a connection whose kazoo client is a
fake (it never connects), believed CONNECTED, and a kazoo node stat."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from sidecar.adapters.zookeeper.connection import ZooKeeperConnection
from sidecar.core.participant import SessionState


def connection(client: Any, *, root: str = "/ordered", attempts: int = 5) -> ZooKeeperConnection:
    """A connection to nothing, with ``client`` in place of kazoo's, as if its session
    were up (kazoo's client is made, never started)."""
    made = ZooKeeperConnection(
        "127.0.0.1:1",
        root=root,
        session_timeout_s=10.0,
        transaction_attempts=attempts,
        security=None,
    )
    made.client = client
    made.state = SessionState.CONNECTED
    return made


def stat(**fields: Any) -> SimpleNamespace:
    """A kazoo ZnodeStat with only the fields a test gives."""
    return SimpleNamespace(**fields)


class Answer:
    """kazoo's IAsyncResult of a request a fake client answers at once: ``get`` returns
    the value or raises what the request raised."""

    def __init__(self, request: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: Exception | None = None
        try:
            self._value = request()
        except Exception as exc:
            self._error = exc

    def get(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value
