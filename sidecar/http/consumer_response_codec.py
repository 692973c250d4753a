"""The bodies of REST Proxy v2 consumer responses, as pure functions: every consumer
route's answer but the records response (``records_codec``). The requests are decoded
by ``consumer_codec`` and ``create_consumer_codec``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict
from urllib.parse import quote

from sidecar.http.records_codec import PartitionRef


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A group's committed offset (the next to read), as Kafka stores it."""

    topic: str
    partition: int
    offset: int
    metadata: str


class CreateConsumerResponseBody(TypedDict):
    instance_id: str
    base_uri: str


class PartitionEntry(TypedDict):
    topic: str
    partition: int


class SubscriptionResponseBody(TypedDict):
    topics: list[str]


class AssignmentsResponseBody(TypedDict):
    partitions: list[PartitionEntry]


class CommittedOffsetEntry(TypedDict):
    topic: str
    partition: int
    offset: int
    metadata: str


class CommittedOffsetsResponseBody(TypedDict):
    offsets: list[CommittedOffsetEntry]


def consumer_instance_uri(base_url: str, group: str, instance_id: str) -> str:
    """The instance's URL: ``{base_url}/consumers/{group}/instances/{instance_id}``.

    ``base_url`` is the sidecar's address as the app reaches it (scheme, host, port and
    any path prefix); group and instance are percent-encoded as path segments.
    """
    return (
        f"{base_url.rstrip('/')}/consumers/{quote(group, safe='')}"
        f"/instances/{quote(instance_id, safe='')}"
    )


def create_consumer_body(
    instance_id: str, *, base_url: str, group: str
) -> CreateConsumerResponseBody:
    """The REST Proxy v2 answer to a created consumer instance."""
    return {
        "instance_id": instance_id,
        "base_uri": consumer_instance_uri(base_url, group, instance_id),
    }


def subscription_body(topics: Sequence[str]) -> SubscriptionResponseBody:
    """``GET subscription``: the subscribed topics (for a pattern, those it matches now)."""
    return {"topics": list(topics)}


def assignments_body(partitions: Sequence[PartitionRef]) -> AssignmentsResponseBody:
    """``GET assignments``: the partitions assigned to the instance."""
    return {"partitions": [_partition_entry(ref) for ref in partitions]}


def committed_offsets_body(offsets: Sequence[CommittedOffset]) -> CommittedOffsetsResponseBody:
    """``GET offsets``: committed offsets as Kafka stores them (leave uncommitted ones out)."""
    return {
        "offsets": [
            {
                "topic": committed.topic,
                "partition": committed.partition,
                "offset": committed.offset,
                "metadata": committed.metadata,
            }
            for committed in offsets
        ]
    }


def _partition_entry(ref: PartitionRef) -> PartitionEntry:
    return {"topic": ref.topic, "partition": ref.partition}
