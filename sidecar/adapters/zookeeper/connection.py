"""The one kazoo client every part of the store shares, and the plumbing they all use.

``ZooKeeperConnection`` holds the client, the root, the event loop and the session state
as the store last heard it (``Session`` keeps it current); ``run`` is the thread hop of
every kazoo call and ``to_loop`` the way back from kazoo's threads. The path helpers
build every path of the znode layout (``sidecar.adapters.zookeeper``); ``commit`` and
``encode`` are the transaction and value formats every part writes with.

Every path is built from names checked again here (``sidecar.core.names``), although
the HTTP layer checks them first: a name that reaches this adapter unchecked is refused
with InvalidName, never turned into a path.

kazoo calls block, so they run in worker threads; kazoo's watch and session callbacks
run on kazoo's threads and are handed to the event loop. While the session is not
CONNECTED every call fails fast with MetadataUnavailable instead of queueing in kazoo
until a reconnect.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any, ParamSpec, TypeVar

from kazoo.client import KazooClient
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
from kazoo.retry import KazooRetry

from sidecar.adapters.zookeeper_security import identity_of, kazoo_arguments
from sidecar.config import ZooKeeperSecuritySettings
from sidecar.core import names as _names
from sidecar.core.errors import MetadataNotAuthorized, MetadataUnavailable
from sidecar.core.participant import SessionState

_P = ParamSpec("_P")
_T = TypeVar("_T")

# ConnectionClosedError (a stopped client) is a SessionExpiredError subclass.
_CONNECTION_ERRORS = (
    ConnectionLoss,
    ConnectionDropped,
    SessionExpiredError,
    OperationTimeoutError,
    KazooTimeoutError,
)
# A concurrent writer changed what a transaction was built from: read again and retry.
RACE_ERRORS = (BadVersionError, NodeExistsError, NoNodeError, NotEmptyError)


class ZooKeeperConnection:
    """One kazoo client under one root, shared by every part of the store."""

    def __init__(
        self,
        hosts: str,
        *,
        root: str,
        session_timeout_s: float,
        transaction_attempts: int,
        security: ZooKeeperSecuritySettings | None,
    ) -> None:
        self.root = root.rstrip("/")
        self.hosts = hosts
        self.transaction_attempts = transaction_attempts
        self.security = security or ZooKeeperSecuritySettings()
        self._identity = identity_of(self.security)
        self.client = KazooClient(
            hosts=hosts,
            timeout=session_timeout_s,
            # kazoo retries connecting for ever in its own thread; its default pause grows
            # to an hour, this one to 1 s, so a sidecar reconnects soon after ZooKeeper is
            # back (at start as after an outage).
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=1.0),
            **kazoo_arguments(self.security),
        )
        self.loop: asyncio.AbstractEventLoop | None = None
        self.state = SessionState.LOST
        self.stopped = False

    def session_id(self) -> int:
        """The id of this client's ZooKeeper session, the owner of its ephemeral nodes.

        kazoo forgets it when the session is lost, which can happen between a call that
        succeeded and the comparison that needs it: that is a lost connection too."""
        client_id = self.client.client_id
        if client_id is None:
            raise SessionExpiredError("the ZooKeeper session was lost")
        return int(client_id[0])

    async def run(self, function: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run a blocking kazoo call in a thread, with connection errors translated."""
        if self.state is not SessionState.CONNECTED:
            raise MetadataUnavailable(f"ZooKeeper session is {self.state.value}")
        try:
            return await asyncio.to_thread(function, *args, **kwargs)
        except _CONNECTION_ERRORS as exc:
            raise MetadataUnavailable(f"ZooKeeper: {exc!r}") from exc
        except NoAuthError as exc:
            raise MetadataNotAuthorized(
                f"ZooKeeper refused a write under {self.root}: the znodes' ACLs do not let "
                f"{self._identity} change them (zookeeper.security.digest_username)"
            ) from exc
        except AuthFailedError as exc:
            raise MetadataNotAuthorized(
                "zookeeper.security.digest_username / digest_password: ZooKeeper refused "
                "the credentials"
            ) from exc

    def to_loop(self, callback: Callable[_P, None], *args: _P.args, **kwargs: _P.kwargs) -> None:
        loop = self.loop
        if loop is None or self.stopped:
            return
        with suppress(RuntimeError):  # the loop is already closed
            loop.call_soon_threadsafe(lambda: callback(*args, **kwargs))

    def ensure_layout(self) -> None:
        for child in ("sidecars", "producers", "topics", "ops", "locks", "groups"):
            self.client.ensure_path(f"{self.root}/{child}")

    def delete_tree(self, path: str) -> None:
        for _ in range(self.transaction_attempts):
            try:
                self.client.delete(path, recursive=True)
                return
            except NotEmptyError:
                continue  # a late ack landed while the children were deleted
        raise MetadataUnavailable(f"could not delete {path}: children keep appearing")

    def get_json(self, path: str) -> Any:
        """The node's decoded value, or None if it does not exist."""
        try:
            return json.loads(self.client.get(path)[0])
        except NoNodeError:
            return None

    def get_json_many(self, paths: Sequence[str]) -> list[Any]:
        """Each node's decoded value (None for one that does not exist), the reads
        pipelined: every request is sent before any answer is awaited, so n nodes cost
        about one round trip instead of n (a coordinator reads one ack per sidecar)."""
        asked = [self.client.get_async(path) for path in paths]
        values: list[Any] = []
        for answer in asked:
            try:
                values.append(json.loads(answer.get()[0]))
            except NoNodeError:
                values.append(None)
        return values

    def sidecar_path(self, sidecar_id: str) -> str:
        return f"{self.root}/sidecars/{_names.sidecar_id(sidecar_id)}"

    def topic_path(self, topic: str) -> str:
        return f"{self.root}/topics/{_names.topic_name(topic)}"

    def generation_path(self, topic: str, number: int) -> str:
        return f"{self.topic_path(topic)}/generations/{number:010d}"

    def barrier_path(self, topic: str, number: int) -> str:
        return f"{self.topic_path(topic)}/barrier/{number}"

    def ops_path(self, topic: str) -> str:
        return f"{self.root}/ops/{_names.topic_name(topic)}"

    def group_path(self, group: str) -> str:
        return f"{self.root}/groups/{_names.group_name(group)}"

    def lock_path(self, topic: str) -> str:
        return f"{self.root}/locks/{_names.topic_name(topic)}"

    def producer_path(self, transactional_id: str) -> str:
        return f"{self.root}/producers/{_names.node_name(transactional_id, 'transactional id')}"

    def revoked_path(self, group: str) -> str:
        return f"{self.group_path(group)}/revoked"


def commit(transaction: Any) -> None:
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


def encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
