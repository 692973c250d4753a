"""Commits that carry leader epochs (KIP-320): OffsetCommit v6 in place of aiokafka's.

KIP-320 has a commit carry the leader epoch of the last batch read below the committed
offset, so that whoever starts reading there later (after a rebalance or a restart)
can ask the partition's leader whether its log still reaches that offset
(OffsetForLeaderEpoch). aiokafka 0.14 commits with OffsetCommit up to v3, which has no
epoch. Its commit path (``GroupCoordinator.commit_offsets``: the retries, the
coordinator's moves, the errors read per partition) is kept as it is: ``epoch_sender``
wraps the coordinator's send so that the commit request aiokafka builds goes out as
``EpochOffsetCommitRequest`` (v6) with the same group, generation, member, offsets and
metadata, plus the epoch recorded for each (partition, offset) by the commit in flight
(``CommitEpochsInFlight.carrying``; ``NO_EPOCH`` where none was). The v6 answer has the
shape aiokafka reads of its own. A broker older than Kafka 2.1 knows no v6: it gets
aiokafka's own request, without epochs, as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from aiokafka.protocol.commit import OffsetCommitRequest

from sidecar.adapters.kafka_protocol import NO_EPOCH, CommittedPartition, EpochOffsetCommitRequest
from sidecar.adapters.offset_fetch import Send

CommitKey = tuple[str, int, int]
"""(topic, partition, committed offset)."""


class CommitEpochsInFlight:
    """The leader epochs of the commits one consumer has in flight, by (topic, partition,
    offset): a commit of the same offset carries the same epoch, so concurrent commits
    cannot mix them up."""

    def __init__(self) -> None:
        self._commits: list[Mapping[CommitKey, int]] = []

    @contextlib.contextmanager
    def carrying(self, epochs: Mapping[CommitKey, int]) -> Iterator[None]:
        """While the commit of these offsets is in flight (retries included)."""
        self._commits.append(epochs)
        try:
            yield
        finally:
            self._commits.remove(epochs)

    def epoch(self, topic: str, partition: int, offset: int) -> int:
        """The epoch a commit in flight carries for this offset; NO_EPOCH if none."""
        for epochs in reversed(self._commits):
            epoch = epochs.get((topic, partition, offset))
            if epoch is not None:
                return epoch
        return NO_EPOCH


def with_epochs(request: Any, epochs: CommitEpochsInFlight) -> EpochOffsetCommitRequest:
    """aiokafka's ``OffsetCommitRequest`` as OffsetCommit v6: the same group, generation,
    member and (partition, offset, metadata) triples, each with its epoch."""
    topics: list[tuple[str, list[CommittedPartition]]] = [
        (
            topic,
            [
                (partition, offset, epochs.epoch(topic, partition, offset), metadata)
                for partition, offset, metadata in partitions
            ],
        )
        for topic, partitions in request._topics
    ]
    return EpochOffsetCommitRequest(
        request._consumer_group,
        request._consumer_group_generation_id,
        request._consumer_id,
        topics,
    )


def epoch_sender(send: Send, epochs: CommitEpochsInFlight) -> Send:
    """``send`` (a coordinator's request-sending coroutine function, the request first),
    with aiokafka's commit requests sent as v6 carrying ``epochs``; other requests pass
    as they are."""

    async def send_with_epochs(request: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(request, OffsetCommitRequest):
            try:
                return await send(with_epochs(request, epochs), *args, **kwargs)
            except NotImplementedError:
                # Raised by Request.prepare before anything is sent: the broker knows no
                # v6 (Kafka before 2.1). Committed without epochs, as aiokafka does.
                pass
        return await send(request, *args, **kwargs)

    return send_with_epochs


def carry_epochs(consumer: Any) -> CommitEpochsInFlight | None:
    """Make a started ``AIOKafkaConsumer`` with a group commit with leader epochs; the
    epochs of each commit are handed to the returned object for its duration. None for
    a consumer without a group (it never commits). Set on the consumer's coordinator
    object only: nothing else of aiokafka changes."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None or not hasattr(coordinator, "coordinator_dead"):
        return None
    epochs = CommitEpochsInFlight()
    coordinator._send_req = epoch_sender(coordinator._send_req, epochs)
    return epochs
