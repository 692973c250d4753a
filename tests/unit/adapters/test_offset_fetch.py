"""OffsetFetch answers with a group-level error, through aiokafka's own code paths.

A coordinator that is loading a group's offsets (it took over when a broker left) or
that no longer coordinates the group answers OffsetFetch v2+ with a top-level error and
no partitions. aiokafka 0.14 reads that as "nothing committed"; these tests run its
real ``GroupCoordinator`` and ``AIOKafkaAdminClient`` methods on a stand-in for the
network, first showing the loss unchecked, then that the checked sender raises.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    GroupLoadInProgressError,
    NotCoordinatorForGroupError,
)
from aiokafka.protocol.commit import OffsetFetchResponse_v1, OffsetFetchResponse_v3

from sidecar.adapters.offset_fetch import (
    check_admin_client,
    check_group_consumer,
    raise_group_error,
)

TP = TopicPartition("orders", 1)
UNKNOWN_OFFSET = -1


def _group_error(code: int) -> OffsetFetchResponse_v3:
    return OffsetFetchResponse_v3(0, [], code)


def _committed(offset: int) -> OffsetFetchResponse_v3:
    return OffsetFetchResponse_v3(0, [(TP.topic, [(TP.partition, offset, "", 0)])], 0)


class _PartitionState:
    def __init__(self) -> None:
        self.committed: list[int] = []

    def update_committed(self, offset_and_metadata: Any) -> None:
        self.committed.append(offset_and_metadata.offset)


class _Assignment:
    """The subscription state's part that refreshing committed offsets uses."""

    def __init__(self) -> None:
        self.state = _PartitionState()

    def requesting_committed(self) -> list[TopicPartition]:
        return [TP]

    def state_value(self, tp: TopicPartition) -> _PartitionState:
        assert tp == TP
        return self.state


class _Coordinator:
    """aiokafka's GroupCoordinator methods for committed offsets, over a scripted
    connection to the coordinator."""

    _send_req = GroupCoordinator._send_req
    _do_fetch_commit_offsets = GroupCoordinator._do_fetch_commit_offsets
    _maybe_refresh_commit_offsets = GroupCoordinator._maybe_refresh_commit_offsets

    def __init__(self, response: Any) -> None:
        self.group_id = "billing"
        self.coordinator_id = 1
        self.forgotten = 0
        self.sent: list[Any] = []

        async def send(node_id: int, request: Any, **_: Any) -> Any:
            self.sent.append(request)
            return response

        self._client = SimpleNamespace(send=send)

    def coordinator_dead(self) -> None:
        self.forgotten += 1


async def test_unchecked_aiokafka_reads_a_loading_coordinator_as_nothing_committed() -> None:
    # The defect this module exists for: shown here so the checked tests below mean
    # something (if aiokafka fixes it, this fails and the check can go).
    coordinator = _Coordinator(_group_error(GroupLoadInProgressError.errno))
    assignment = _Assignment()
    assert await coordinator._maybe_refresh_commit_offsets(assignment) is True
    assert assignment.state.committed == [UNKNOWN_OFFSET]


async def test_a_loading_coordinator_is_asked_again_not_read_as_nothing_committed() -> None:
    coordinator = _Coordinator(_group_error(GroupLoadInProgressError.errno))
    check_group_consumer(SimpleNamespace(_coordinator=coordinator))
    assignment = _Assignment()
    # False: aiokafka's refresh routine tries again after its backoff.
    assert await coordinator._maybe_refresh_commit_offsets(assignment) is False
    assert assignment.state.committed == []
    assert coordinator.forgotten == 0  # still the coordinator, just not ready


async def test_a_moved_coordinator_is_forgotten_and_asked_again() -> None:
    coordinator = _Coordinator(_group_error(NotCoordinatorForGroupError.errno))
    check_group_consumer(SimpleNamespace(_coordinator=coordinator))
    assignment = _Assignment()
    assert await coordinator._maybe_refresh_commit_offsets(assignment) is False
    assert assignment.state.committed == []
    assert coordinator.forgotten == 1


async def test_an_answer_without_group_error_is_read_as_before() -> None:
    coordinator = _Coordinator(_committed(36882))
    check_group_consumer(SimpleNamespace(_coordinator=coordinator))
    assignment = _Assignment()
    assert await coordinator._maybe_refresh_commit_offsets(assignment) is True
    assert assignment.state.committed == [36882]
    assert len(coordinator.sent) == 1


async def test_a_group_without_a_commit_still_gets_its_reset() -> None:
    # Per partition, offset -1 without error: the group really never committed here.
    coordinator = _Coordinator(_committed(UNKNOWN_OFFSET))
    check_group_consumer(SimpleNamespace(_coordinator=coordinator))
    assignment = _Assignment()
    assert await coordinator._maybe_refresh_commit_offsets(assignment) is True
    assert assignment.state.committed == [UNKNOWN_OFFSET]


async def test_a_refusal_is_raised_not_retried() -> None:
    coordinator = _Coordinator(_group_error(GroupAuthorizationFailedError.errno))
    check_group_consumer(SimpleNamespace(_coordinator=coordinator))
    with pytest.raises(GroupAuthorizationFailedError):
        await coordinator._maybe_refresh_commit_offsets(_Assignment())


def test_a_consumer_without_group_is_left_alone() -> None:
    consumer = SimpleNamespace(_coordinator=SimpleNamespace())
    check_group_consumer(consumer)
    assert vars(consumer._coordinator) == {}


def test_old_versions_have_no_group_level_code() -> None:
    raise_group_error(OffsetFetchResponse_v1([]), None)  # nothing to raise


class _Admin:
    """AIOKafkaAdminClient's list_consumer_group_offsets over a scripted coordinator."""

    list_consumer_group_offsets = AIOKafkaAdminClient.list_consumer_group_offsets

    def __init__(self, response: Any) -> None:
        async def send_request(request: Any, node_id: int | None = None) -> Any:
            return response

        self._send_request = send_request

    async def find_coordinator(self, group_id: str) -> int:
        return 1


async def test_the_admin_client_raises_instead_of_returning_no_offsets() -> None:
    unchecked = _Admin(_group_error(GroupLoadInProgressError.errno))
    assert await unchecked.list_consumer_group_offsets("billing", partitions=[TP]) == {}
    checked = _Admin(_group_error(GroupLoadInProgressError.errno))
    check_admin_client(checked)
    with pytest.raises(GroupLoadInProgressError):
        await checked.list_consumer_group_offsets("billing", partitions=[TP])
    answered = _Admin(_committed(7))
    check_admin_client(answered)
    offsets = await answered.list_consumer_group_offsets("billing", partitions=[TP])
    assert offsets[TP].offset == 7
