"""``sidecar.adapters.zookeeper.connection``: the paths of the znode layout, the value
and transaction formats, and the translation of kazoo's errors, with a fake kazoo
client. The calls against a real ZooKeeper are tested in
``tests/integration/test_zookeeper_store.py``."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from kazoo.exceptions import (
    AuthFailedError,
    ConnectionLoss,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    SessionExpiredError,
)

from sidecar.adapters.zookeeper.connection import ZooKeeperConnection, commit, encode
from sidecar.config import Secret, ZooKeeperSecuritySettings
from sidecar.core.errors import InvalidName, MetadataNotAuthorized, MetadataUnavailable
from sidecar.core.participant import SessionState
from tests.unit.adapters.zookeeper.support import connection, stat


def test_every_path_is_under_the_root_as_the_layout_says() -> None:
    paths = connection(None, root="/ordered/")  # a trailing slash is dropped
    assert paths.root == "/ordered"
    assert paths.sidecar_path("host-1") == "/ordered/sidecars/host-1"
    assert paths.topic_path("orders") == "/ordered/topics/orders"
    assert paths.generation_path("orders", 12) == "/ordered/topics/orders/generations/0000000012"
    assert paths.barrier_path("orders", 12) == "/ordered/topics/orders/barrier/12"
    assert paths.ops_path("orders") == "/ordered/ops/orders"
    assert paths.lock_path("orders") == "/ordered/locks/orders"
    assert paths.group_path("billing~eu") == "/ordered/groups/billing~eu"
    assert paths.revoked_path("billing") == "/ordered/groups/billing/revoked"
    assert paths.producer_path("ordered-host-1-0") == "/ordered/producers/ordered-host-1-0"


def test_generation_nodes_sort_by_number() -> None:
    # ZooKeeper lists children as names: the zero padding makes name order number order.
    paths = connection(None)
    names = [paths.generation_path("t", n).rsplit("/", 1)[1] for n in (10, 9, 100, 0)]
    assert sorted(names) == ["0000000000", "0000000009", "0000000010", "0000000100"]


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda c: c.topic_path("../sidecars"), "../sidecars"),
        (lambda c: c.ops_path("a/b"), "a/b"),
        (lambda c: c.sidecar_path(".."), ".."),
        (lambda c: c.group_path("a/b"), "a/b"),
        (lambda c: c.producer_path("x/../y"), "x/../y"),
        (lambda c: c.generation_path("", 1), ""),
    ],
)
def test_no_path_is_built_from_a_name_that_is_not_one(build: Any, name: str) -> None:
    with pytest.raises(InvalidName, match=re.escape(repr(name))):
        build(connection(None))


def test_values_are_compact_json() -> None:
    assert encode({"acked": {"0": 5}, "x": None}) == b'{"acked":{"0":5},"x":null}'


class _Transaction:
    def __init__(self, results: list[Any]) -> None:
        self.results = results

    def commit(self) -> list[Any]:
        return self.results


def test_a_committed_transaction_raises_nothing() -> None:
    commit(_Transaction([True, "/ordered/topics/t", True]))


def test_a_failed_transaction_raises_the_operations_own_error() -> None:
    # kazoo reports the failing operation's error and RolledBackError for the others,
    # in whatever position the failing one is.
    with pytest.raises(NodeExistsError):
        commit(_Transaction([RolledBackError(), NodeExistsError(), RolledBackError()]))


def test_a_transaction_only_rolled_back_raises_that() -> None:
    with pytest.raises(RolledBackError):
        commit(_Transaction([RolledBackError(), RolledBackError()]))


async def test_calls_fail_fast_while_the_session_is_not_connected() -> None:
    calls: list[str] = []
    made = connection(None)
    for state in (SessionState.SUSPENDED, SessionState.LOST):
        made.state = state
        with pytest.raises(MetadataUnavailable, match=f"^ZooKeeper session is {state.value}$"):
            await made.run(calls.append, "called")
    assert calls == []


def _raise(error: Exception) -> None:
    raise error


async def test_connection_errors_are_metadata_unavailable() -> None:
    for error in (ConnectionLoss(), SessionExpiredError()):
        with pytest.raises(MetadataUnavailable, match=r"^ZooKeeper: ") as caught:
            await connection(None).run(_raise, error)
        assert caught.value.__cause__ is error


async def test_refusals_name_the_identity_and_the_settings() -> None:
    security = ZooKeeperSecuritySettings(digest_username="sidecar", digest_password=Secret("pw"))
    made = ZooKeeperConnection(
        "127.0.0.1:1",
        root="/ordered",
        session_timeout_s=10.0,
        transaction_attempts=5,
        security=security,
    )
    made.state = SessionState.CONNECTED
    with pytest.raises(
        MetadataNotAuthorized,
        match=r"^ZooKeeper refused a write under /ordered: the znodes' ACLs do not let "
        r"digest:sidecar change them \(zookeeper\.security\.digest_username\)$",
    ):
        await made.run(_raise, NoAuthError())
    with pytest.raises(MetadataNotAuthorized, match="ZooKeeper refused the credentials"):
        await made.run(_raise, AuthFailedError())


async def test_other_kazoo_errors_reach_the_caller_as_they_are() -> None:
    # NoNodeError and the like are answers the parts of the store act on.
    with pytest.raises(NoNodeError):
        await connection(None).run(_raise, NoNodeError())


class _Client:
    def __init__(self) -> None:
        self.client_id: tuple[int, bytes] | None = (0x1234, b"password")
        self.deletes = 0
        self.nodes: dict[str, bytes] = {"/ordered/ops/t": b'{"phase":"done"}'}

    def delete(self, path: str, recursive: bool = False) -> None:
        self.deletes += 1
        raise NotEmptyError()

    def get(self, path: str) -> tuple[bytes, object]:
        if path not in self.nodes:
            raise NoNodeError()
        return self.nodes[path], None


def test_the_session_id_is_kazoos_and_a_forgotten_one_is_a_lost_session() -> None:
    client = _Client()
    made = connection(client)
    assert made.session_id() == 0x1234
    client.client_id = None
    with pytest.raises(SessionExpiredError):
        made.session_id()


def test_a_node_read_as_json_and_a_missing_one_as_none() -> None:
    made = connection(_Client())
    assert made.get_json("/ordered/ops/t") == {"phase": "done"}
    assert made.get_json("/ordered/ops/absent") is None


def test_a_tree_whose_children_keep_appearing_is_given_up_after_the_attempts() -> None:
    client = _Client()
    made = connection(client, attempts=3)
    with pytest.raises(MetadataUnavailable, match="children keep appearing"):
        made.delete_tree("/ordered/topics/t/barrier/3")
    assert client.deletes == 3


async def test_kazoo_callbacks_reach_the_loop_until_the_store_stops() -> None:
    made = connection(None)
    heard: list[str] = []
    made.to_loop(heard.append, "before the loop is known")  # dropped: no loop yet
    made.loop = asyncio.get_running_loop()
    await asyncio.to_thread(made.to_loop, heard.append, "from kazoo's thread")
    await asyncio.sleep(0)
    made.stopped = True
    made.to_loop(heard.append, "after stop")
    await asyncio.sleep(0)
    assert heard == ["from kazoo's thread"]


def test_many_nodes_are_read_with_every_request_sent_before_any_answer() -> None:
    events: list[str] = []
    nodes = {"/a": b'{"n":1}', "/c": b"[3]"}

    class _Pending:
        def __init__(self, path: str) -> None:
            self._path = path

        def get(self) -> tuple[bytes, Any]:
            events.append(f"answer {self._path}")
            if self._path not in nodes:
                raise NoNodeError()
            return nodes[self._path], stat()

    class _Client:
        def get_async(self, path: str) -> _Pending:
            events.append(f"ask {path}")
            return _Pending(path)

    assert connection(_Client()).get_json_many(["/a", "/b", "/c"]) == [{"n": 1}, None, [3]]
    assert events == ["ask /a", "ask /b", "ask /c", "answer /a", "answer /b", "answer /c"]
