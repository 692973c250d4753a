"""Capture a real broker's answers to the leader-epoch requests, for the protocol tests.

``python -m ordered_dev.wire_capture OUT.json`` starts a local three-node cluster in a
temporary directory, writes records to a topic of two partitions, moves the leadership of
partition 0 by stopping its leader (so its leader epoch is no longer 0), writes again,
then sends each request of ``sidecar.adapters.kafka_protocol`` over a plain socket (the
group requests to the coordinator of a group with no members) and
stores every request and answer as hex (without the size prefix), with what is known
about the log, in ``OUT.json``; the cluster is stopped at the end.
``tests/unit/adapters/test_kafka_protocol.py`` reads that file.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.protocol.coordination import FindCoordinatorRequest, FindCoordinatorRequest_v1

from ordered_dev.devcluster.cluster import LocalCluster, wait_until
from sidecar.adapters.kafka_protocol import (
    NO_EPOCH,
    EpochListOffsetsRequest,
    EpochMetadataRequest,
    EpochOffsetCommitRequest,
    EpochOffsetFetchRequest,
    ListOffsetsRequest_v4,
    ListOffsetsRequest_v5,
    MetadataRequest_v7,
    OffsetCommitRequest_v6,
    OffsetFetchRequest_v5,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochRequest_v3,
)

TOPIC = "kip320-wire"
CLIENT_ID = "wire-capture"
RECORDS_BEFORE = 5
RECORDS_AFTER = 3
GROUP = "wire-group"
"""A group with no members: its offsets are committed as a standalone consumer commits
them (generation -1, no member id)."""


async def _exchange(port: int, correlation_id: int, request_struct: Any) -> tuple[bytes, bytes]:
    """Send one request struct to the broker at ``port``; (request bytes, answer bytes)."""
    header = request_struct.build_request_header(correlation_id, CLIENT_ID)
    message = header.encode() + request_struct.encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(struct.pack(">i", len(message)) + message)
        await writer.drain()
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        answer = await reader.readexactly(size)
    finally:
        writer.close()
        await writer.wait_closed()
    return message, answer


def _body(request_struct: Any, answer: bytes) -> Any:
    buffer = BytesIO(answer)
    request_struct.parse_response_header(buffer)
    return request_struct.RESPONSE_TYPE.decode(buffer)


async def _metadata(port: int) -> tuple[bytes, bytes, Any]:
    request = EpochMetadataRequest([TOPIC]).build(MetadataRequest_v7)
    sent, answer = await _exchange(port, 7, request)
    return sent, answer, _body(request, answer)


def _leader_and_epoch(metadata: Any, partition: int) -> tuple[int, int]:
    for _, _, _, partitions in metadata.topics:
        for _, index, leader, epoch, *_ in partitions:
            if index == partition:
                return int(leader), int(epoch)
    raise AssertionError(f"partition {partition} not in the metadata")


async def _produce(bootstrap: str, count: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(count):
            await producer.send_and_wait(TOPIC, b"v%d" % i, key=b"k", partition=0)
    finally:
        await producer.stop()


async def capture(cluster: LocalCluster) -> dict[str, Any]:
    ports = {int(node): port for node, port in cluster._require_state().kafka_ports.items()}
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(TOPIC, 2, 3)])
    finally:
        await admin.close()
    await asyncio.sleep(2)
    await _produce(cluster.kafka_bootstrap, RECORDS_BEFORE)

    any_port = next(iter(ports.values()))
    _, _, before = await _metadata(any_port)
    old_leader, old_epoch = _leader_and_epoch(before, 0)
    cluster.stop_broker(old_leader)
    alive = {node: port for node, port in ports.items() if node != old_leader}
    survivor = next(iter(alive.values()))

    def moved() -> bool:
        _, _, now = asyncio.run(_metadata(survivor))
        return _leader_and_epoch(now, 0)[0] not in (old_leader, -1)

    await asyncio.to_thread(
        wait_until,
        moved,
        60.0,
        "the leadership of partition 0 did not move",
        lambda: cluster.log_tail(f"kafka-{old_leader}"),
    )
    await _produce(",".join(f"127.0.0.1:{p}" for p in alive.values()), RECORDS_AFTER)

    metadata_sent, metadata_answer, after = await _metadata(survivor)
    leader, epoch = _leader_and_epoch(after, 0)
    leader_port = ports[leader]
    exchanges: dict[str, Any] = {
        "metadata_v7": {"request": metadata_sent.hex(), "response": metadata_answer.hex()}
    }
    for name, version, current in (
        ("list_offsets_v4", ListOffsetsRequest_v4, epoch),
        ("list_offsets_v5", ListOffsetsRequest_v5, epoch),
        ("list_offsets_v5_stale_epoch", ListOffsetsRequest_v5, old_epoch),
    ):
        request = EpochListOffsetsRequest(TOPIC, {0: current}).build(version)
        sent, answer = await _exchange(leader_port, version.API_VERSION, request)
        exchanges[name] = {"request": sent.hex(), "response": answer.hex()}
    for name, asked in (
        ("offset_for_leader_epoch_v3_old", old_epoch),
        ("offset_for_leader_epoch_v3_current", epoch),
    ):
        request = OffsetForLeaderEpochRequest(TOPIC, {0: (NO_EPOCH, asked)}).build(
            OffsetForLeaderEpochRequest_v3
        )
        sent, answer = await _exchange(leader_port, 23, request)
        exchanges[name] = {"request": sent.hex(), "response": answer.hex()}
    exchanges.update(await _group_exchanges(ports, alive, epoch))
    return {
        "broker": "Apache Kafka 4.3.0, KRaft, three combined nodes",
        "topic": TOPIC,
        "client_id": CLIENT_ID,
        "records_before_leader_change": RECORDS_BEFORE,
        "records_after_leader_change": RECORDS_AFTER,
        "old_leader": old_leader,
        "old_epoch": old_epoch,
        "leader": leader,
        "epoch": epoch,
        "group": GROUP,
        "exchanges": exchanges,
    }


async def _coordinator(port: int) -> int:
    """The node id of the coordinator of ``GROUP``, asked of the broker at ``port``."""
    finding = FindCoordinatorRequest(GROUP, 0).build(FindCoordinatorRequest_v1)
    while True:
        _, answer = await _exchange(port, 10, finding)
        found = _body(finding, answer)
        if found.error_code == 0:
            return int(found.coordinator_id)
        await asyncio.sleep(0.5)  # the offsets topic's partition is still electing


async def _group_exchanges(
    ports: dict[int, int], alive: dict[int, int], epoch: int
) -> dict[str, Any]:
    """OffsetCommit v6 of partition 0 past every record, with the leader epoch they were
    read under, then OffsetFetch v5 of partitions 0 (committed) and 1 (never), both to
    the group's coordinator."""
    offset = RECORDS_BEFORE + RECORDS_AFTER
    commit = EpochOffsetCommitRequest(GROUP, -1, "", [(TOPIC, [(0, offset, epoch, "")])]).build(
        OffsetCommitRequest_v6
    )
    fetch = EpochOffsetFetchRequest(GROUP, [(TOPIC, [0, 1])]).build(OffsetFetchRequest_v5)
    # The offsets topic was made by this run's first group request: until its partition
    # is loaded, the coordinator answers COORDINATOR_LOAD_IN_PROGRESS and the like. The
    # stored exchanges are the first ones answered without an error.
    for _ in range(120):
        coordinator = await _coordinator(next(iter(alive.values())))
        commit_sent, commit_answer = await _exchange(ports[coordinator], 8, commit)
        [(_, [(_, commit_error)])] = _body(commit, commit_answer).topics
        if commit_error != 0:
            await asyncio.sleep(0.5)
            continue
        fetch_sent, fetch_answer = await _exchange(ports[coordinator], 9, fetch)
        if _body(fetch, fetch_answer).error_code == 0:
            break
        await asyncio.sleep(0.5)
    else:
        raise AssertionError("the group's coordinator did not take the commit within 60 s")
    return {
        "offset_commit_v6": {"request": commit_sent.hex(), "response": commit_answer.hex()},
        "offset_fetch_v5": {"request": fetch_sent.hex(), "response": fetch_answer.hex()},
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m ordered_dev.wire_capture OUT.json", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="wire-capture-") as work_dir:
        cluster = LocalCluster(Path(work_dir))
        cluster.start()
        try:
            captured = asyncio.run(capture(cluster))
        finally:
            cluster.stop()
    Path(argv[0]).write_text(json.dumps(captured, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
