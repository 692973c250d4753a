"""The leader-epoch requests against bytes a real broker exchanged.

``data/kafka_wire.json`` was written by ``python -m ordered_dev.wire_capture`` against
Kafka 4.3.0: five records written to partition 0 under leader epoch 0, its leader
stopped, three more written under epoch 1. Each request is encoded again and compared
with what was sent (and with the layout of Kafka's message definitions, packed by hand,
so that an encoder bug cannot be pinned by its own output); each answer is decoded.
Then a commit of partition 0 past every record, with the epoch they were written under,
for a group with no members (OffsetCommit v6), and that commit fetched back (OffsetFetch
v5). Those two are also checked against layouts and answers packed by hand after Kafka's
message definitions, for the cases a capture does not show (an error per partition, a
commit without an epoch, a coordinator still loading).
"""

from __future__ import annotations

import json
import struct
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest

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

_CAPTURED = json.loads((Path(__file__).parent / "data" / "kafka_wire.json").read_text())
_TOPIC = _CAPTURED["topic"]
_CLIENT = _CAPTURED["client_id"]
_OLD_EPOCH, _EPOCH = _CAPTURED["old_epoch"], _CAPTURED["epoch"]
_BEFORE, _AFTER = (
    _CAPTURED["records_before_leader_change"],
    _CAPTURED["records_after_leader_change"],
)
FENCED_LEADER_EPOCH = 74


def _exchange(name: str) -> tuple[bytes, bytes]:
    exchange = _CAPTURED["exchanges"][name]
    return bytes.fromhex(exchange["request"]), bytes.fromhex(exchange["response"])


def _encoded(request_struct: Any, correlation_id: int) -> bytes:
    header = request_struct.build_request_header(correlation_id, _CLIENT)
    return bytes(header.encode() + request_struct.encode())


def _string(value: str) -> bytes:
    return struct.pack(">h", len(value)) + value.encode()


def _header(api_key: int, version: int, correlation_id: int) -> bytes:
    return struct.pack(">hhi", api_key, version, correlation_id) + _string(_CLIENT)


def _decoded(request_struct: Any, answer: bytes) -> dict[str, Any]:
    buffer = BytesIO(answer)
    request_struct.parse_response_header(buffer)
    decoded = request_struct.RESPONSE_TYPE.decode(buffer)
    assert buffer.read() == b"", "bytes left over: the schema is shorter than the answer"
    return decoded.to_object()  # type: ignore[no-any-return]


def test_metadata_v7_is_encoded_as_kafka_defines_it() -> None:
    sent, _ = _exchange("metadata_v7")
    request = EpochMetadataRequest([_TOPIC]).build(MetadataRequest_v7)
    # Topics: an array of one name; AllowAutoTopicCreation false.
    by_hand = _header(3, 7, 7) + struct.pack(">i", 1) + _string(_TOPIC) + b"\x00"
    assert _encoded(request, 7) == sent == by_hand


def test_metadata_v7_answers_each_partitions_leader_epoch() -> None:
    _, answer = _exchange("metadata_v7")
    request = EpochMetadataRequest([_TOPIC]).build(MetadataRequest_v7)
    metadata = _decoded(request, answer)
    [topic] = metadata["topics"]
    assert (topic["error_code"], topic["topic"], topic["is_internal"]) == (0, _TOPIC, False)
    by_partition = {p["partition"]: p for p in topic["partitions"]}
    moved = by_partition[0]
    assert moved["leader"] == _CAPTURED["leader"]
    assert moved["leader_epoch"] == _EPOCH == 1
    assert _CAPTURED["old_leader"] in moved["offline_replicas"]
    assert _CAPTURED["old_leader"] not in moved["isr"]
    # Partition 1 kept its leader if that was not the stopped broker, its epoch then 0.
    assert by_partition[1]["leader_epoch"] in (0, 1)
    assert sorted(b["node_id"] for b in metadata["brokers"]) == sorted(
        {1, 2, 3} - {_CAPTURED["old_leader"]}
    )
    assert metadata["cluster_id"]


def test_metadata_request_never_asks_to_create_the_topic() -> None:
    request = EpochMetadataRequest(None).build(MetadataRequest_v7)
    assert request.to_object() == {"topics": None, "allow_auto_topic_creation": False}


@pytest.mark.parametrize(
    ("name", "version"),
    [("list_offsets_v4", ListOffsetsRequest_v4), ("list_offsets_v5", ListOffsetsRequest_v5)],
)
def test_list_offsets_is_encoded_as_kafka_defines_it(name: str, version: Any) -> None:
    sent, _ = _exchange(name)
    request = EpochListOffsetsRequest(_TOPIC, {0: _EPOCH}).build(version)
    # ReplicaId -1, IsolationLevel 1 (read_committed), one topic with one partition:
    # PartitionIndex, CurrentLeaderEpoch (INT32), Timestamp -1 (the end).
    body = struct.pack(">ib", -1, 1) + struct.pack(">i", 1) + _string(_TOPIC)
    body += struct.pack(">i", 1) + struct.pack(">iiq", 0, _EPOCH, -1)
    by_hand = _header(2, version.API_VERSION, version.API_VERSION) + body
    assert _encoded(request, version.API_VERSION) == sent == by_hand


@pytest.mark.parametrize(
    ("name", "version"),
    [("list_offsets_v4", ListOffsetsRequest_v4), ("list_offsets_v5", ListOffsetsRequest_v5)],
)
def test_list_offsets_answers_the_end_with_the_current_leader_epoch(
    name: str, version: Any
) -> None:
    _, answer = _exchange(name)
    request = EpochListOffsetsRequest(_TOPIC, {0: _EPOCH}).build(version)
    [topic] = _decoded(request, answer)["topics"]
    assert topic["topic"] == _TOPIC
    assert topic["partitions"] == [
        {
            "partition": 0,
            "error_code": 0,
            "timestamp": -1,
            "offset": _BEFORE + _AFTER,
            "leader_epoch": _EPOCH,
        }
    ]


def test_list_offsets_with_a_stale_epoch_is_fenced() -> None:
    _, answer = _exchange("list_offsets_v5_stale_epoch")
    request = EpochListOffsetsRequest(_TOPIC, {0: _OLD_EPOCH}).build(ListOffsetsRequest_v5)
    [partition] = _decoded(request, answer)["topics"][0]["partitions"]
    assert partition["error_code"] == FENCED_LEADER_EPOCH
    assert (partition["offset"], partition["leader_epoch"]) == (-1, NO_EPOCH)


@pytest.mark.parametrize(
    ("name", "asked"),
    [
        ("offset_for_leader_epoch_v3_old", _OLD_EPOCH),
        ("offset_for_leader_epoch_v3_current", _EPOCH),
    ],
)
def test_offset_for_leader_epoch_is_encoded_as_kafka_defines_it(name: str, asked: int) -> None:
    sent, _ = _exchange(name)
    request = OffsetForLeaderEpochRequest(_TOPIC, {0: (NO_EPOCH, asked)}).build(
        OffsetForLeaderEpochRequest_v3
    )
    # ReplicaId -1 (a consumer), one topic with one partition: Partition,
    # CurrentLeaderEpoch, LeaderEpoch.
    body = struct.pack(">i", -1) + struct.pack(">i", 1) + _string(_TOPIC)
    body += struct.pack(">i", 1) + struct.pack(">iii", 0, NO_EPOCH, asked)
    assert _encoded(request, 23) == sent == _header(23, 3, 23) + body


@pytest.mark.parametrize(
    ("name", "asked", "end_offset"),
    [
        # Epoch 0 ended where epoch 1 began: after the records written before the change.
        ("offset_for_leader_epoch_v3_old", _OLD_EPOCH, _BEFORE),
        # The current epoch ends at the log end.
        ("offset_for_leader_epoch_v3_current", _EPOCH, _BEFORE + _AFTER),
    ],
)
def test_offset_for_leader_epoch_answers_where_the_epoch_ended(
    name: str, asked: int, end_offset: int
) -> None:
    _, answer = _exchange(name)
    request = OffsetForLeaderEpochRequest(_TOPIC, {0: (NO_EPOCH, asked)}).build(
        OffsetForLeaderEpochRequest_v3
    )
    [topic] = _decoded(request, answer)["topics"]
    assert topic["partitions"] == [
        {"error_code": 0, "partition": 0, "leader_epoch": asked, "end_offset": end_offset}
    ]


def test_the_highest_version_both_sides_know_is_chosen() -> None:
    # What Kafka 4.3 announces in ApiVersions for these keys.
    versions = {3: (0, 13), 2: (1, 11), 23: (2, 4), 8: (2, 9), 9: (1, 9)}
    assert type(EpochMetadataRequest(["t"]).prepare(versions)) is MetadataRequest_v7
    assert type(EpochListOffsetsRequest("t", {0: 1}).prepare(versions)) is ListOffsetsRequest_v5
    leader_epoch = OffsetForLeaderEpochRequest("t", {0: (NO_EPOCH, 1)})
    assert type(leader_epoch.prepare(versions)) is OffsetForLeaderEpochRequest_v3
    commit = EpochOffsetCommitRequest("g", 1, "m", [("t", [(0, 5, 1, "")])])
    assert type(commit.prepare(versions)) is OffsetCommitRequest_v6
    assert type(EpochOffsetFetchRequest("g", [("t", [0])]).prepare(versions)) is (
        OffsetFetchRequest_v5
    )
    assert type(EpochListOffsetsRequest("t", {0: 1}).prepare({2: (0, 4)})) is (
        ListOffsetsRequest_v4
    )


def test_a_broker_without_leader_epochs_is_refused_before_sending() -> None:
    # Kafka before 2.1 (KIP-320): Metadata up to v6, ListOffsets up to v3, OffsetCommit up
    # to v5, OffsetFetch up to v4.
    with pytest.raises(NotImplementedError):
        EpochMetadataRequest(["t"]).prepare({3: (0, 6)})
    with pytest.raises(NotImplementedError):
        EpochListOffsetsRequest("t", {0: 1}).prepare({2: (0, 3)})
    with pytest.raises(NotImplementedError):
        EpochOffsetCommitRequest("g", 1, "m", []).prepare({8: (0, 5)})
    with pytest.raises(NotImplementedError):
        EpochOffsetFetchRequest("g", []).prepare({9: (0, 4)})


# OffsetCommit v6 and OffsetFetch v5 -------------------------------------------------------
#
# Packed by hand after Kafka's definitions (OffsetCommitRequest/Response.json,
# OffsetFetchRequest/Response.json): the cases the capture below does not show.

_GROUP, _MEMBER = "billing", "sidecar-1-4b7c"


def _answer(correlation_id: int, body: bytes) -> bytes:
    """A non-flexible response: the header is the correlation id alone."""
    return struct.pack(">i", correlation_id) + body


def test_offset_commit_v6_is_encoded_as_kafka_defines_it() -> None:
    request = EpochOffsetCommitRequest(
        _GROUP, 7, _MEMBER, [(_TOPIC, [(0, 42, 3, ""), (2, 10, NO_EPOCH, "")])]
    ).build(OffsetCommitRequest_v6)
    # GroupId, GenerationId, MemberId (no GroupInstanceId before v7, no RetentionTimeMs
    # after v4); Topics: Name, Partitions: PartitionIndex, CommittedOffset,
    # CommittedLeaderEpoch, CommittedMetadata.
    body = _string(_GROUP) + struct.pack(">i", 7) + _string(_MEMBER)
    body += struct.pack(">i", 1) + _string(_TOPIC) + struct.pack(">i", 2)
    body += struct.pack(">iqi", 0, 42, 3) + _string("")
    body += struct.pack(">iqi", 2, 10, -1) + _string("")
    assert _encoded(request, 11) == _header(8, 6, 11) + body


def test_offset_commit_v6_answers_as_aiokafkas_commit_path_reads_them() -> None:
    """The answer's bytes follow OffsetCommitResponse.json v6 (not captured from a
    broker): ThrottleTimeMs, Topics [Name, Partitions [PartitionIndex, ErrorCode]]."""
    body = struct.pack(">i", 0) + struct.pack(">i", 1) + _string(_TOPIC) + struct.pack(">i", 2)
    body += struct.pack(">ih", 0, 0) + struct.pack(">ih", 2, 22)  # ILLEGAL_GENERATION
    request = EpochOffsetCommitRequest(_GROUP, 7, _MEMBER, []).build(OffsetCommitRequest_v6)
    buffer = BytesIO(_answer(11, body))
    assert request.parse_response_header(buffer).correlation_id == 11
    response = request.RESPONSE_TYPE.decode(buffer)
    assert buffer.read() == b""
    # aiokafka's _do_commit_offsets: for topic, partitions in response.topics: for
    # partition, error_code in partitions.
    assert [(topic, list(partitions)) for topic, partitions in response.topics] == [
        (_TOPIC, [(0, 0), (2, 22)])
    ]


def test_offset_fetch_v5_is_encoded_as_kafka_defines_it() -> None:
    request = EpochOffsetFetchRequest(_GROUP, [(_TOPIC, [0, 2])]).build(OffsetFetchRequest_v5)
    # GroupId; Topics: Name, PartitionIndexes.
    body = _string(_GROUP) + struct.pack(">i", 1) + _string(_TOPIC)
    body += struct.pack(">iii", 2, 0, 2)
    assert _encoded(request, 12) == _header(9, 5, 12) + body


def test_offset_fetch_v5_answers_each_committed_offset_with_its_leader_epoch() -> None:
    """The answer's bytes follow OffsetFetchResponse.json v5 (not captured from a
    broker): ThrottleTimeMs, Topics [Name, Partitions [PartitionIndex, CommittedOffset,
    CommittedLeaderEpoch, Metadata (nullable), ErrorCode]], ErrorCode."""
    body = struct.pack(">i", 0) + struct.pack(">i", 1) + _string(_TOPIC) + struct.pack(">i", 3)
    body += struct.pack(">iqi", 0, 42, 3) + _string("") + struct.pack(">h", 0)
    # Committed before epochs were (v5 answers -1), and never committed (offset -1,
    # metadata null).
    body += struct.pack(">iqi", 1, 17, -1) + _string("") + struct.pack(">h", 0)
    body += struct.pack(">iqih", 2, -1, -1, -1) + struct.pack(">h", 0)
    body += struct.pack(">h", 0)
    request = EpochOffsetFetchRequest(_GROUP, [(_TOPIC, [0, 1, 2])]).build(OffsetFetchRequest_v5)
    assert _decoded(request, _answer(12, body)) == {
        "throttle_time_ms": 0,
        "topics": [
            {
                "name": _TOPIC,
                "partitions": [
                    {
                        "partition_index": 0,
                        "committed_offset": 42,
                        "committed_leader_epoch": 3,
                        "metadata": "",
                        "error_code": 0,
                    },
                    {
                        "partition_index": 1,
                        "committed_offset": 17,
                        "committed_leader_epoch": NO_EPOCH,
                        "metadata": "",
                        "error_code": 0,
                    },
                    {
                        "partition_index": 2,
                        "committed_offset": -1,
                        "committed_leader_epoch": NO_EPOCH,
                        "metadata": None,
                        "error_code": 0,
                    },
                ],
            }
        ],
        "error_code": 0,
    }


def test_offset_fetch_v5_answers_a_loading_coordinator_with_a_group_error() -> None:
    """Bytes after OffsetFetchResponse.json v5 (not captured): no topics, and the
    top-level ErrorCode COORDINATOR_LOAD_IN_PROGRESS (14)."""
    body = struct.pack(">i", 0) + struct.pack(">i", 0) + struct.pack(">h", 14)
    request = EpochOffsetFetchRequest(_GROUP, [(_TOPIC, [0])]).build(OffsetFetchRequest_v5)
    assert _decoded(request, _answer(12, body)) == {
        "throttle_time_ms": 0,
        "topics": [],
        "error_code": 14,
    }


# The same, against a broker's bytes ----------------------------------------------------------
#
# The capture commits partition 0 of its topic past every record, with the leader epoch
# they were written under, for a group with no members (generation -1, no member id), and
# fetches partitions 0 and 1 back (1 never committed).

_CAPTURED_GROUP = _CAPTURED["group"]
_COMMITTED = _BEFORE + _AFTER


def test_offset_commit_v6_is_encoded_as_the_broker_received_it() -> None:
    sent, _ = _exchange("offset_commit_v6")
    request = EpochOffsetCommitRequest(
        _CAPTURED_GROUP, -1, "", [(_TOPIC, [(0, _COMMITTED, _EPOCH, "")])]
    ).build(OffsetCommitRequest_v6)
    assert _encoded(request, 8) == sent


def test_offset_commit_v6_answer_of_a_broker_is_decoded() -> None:
    _, answer = _exchange("offset_commit_v6")
    request = EpochOffsetCommitRequest(_CAPTURED_GROUP, -1, "", []).build(OffsetCommitRequest_v6)
    buffer = BytesIO(answer)
    assert request.parse_response_header(buffer).correlation_id == 8
    response = request.RESPONSE_TYPE.decode(buffer)
    assert buffer.read() == b""
    assert [(topic, list(partitions)) for topic, partitions in response.topics] == [
        (_TOPIC, [(0, 0)])
    ]


def test_offset_fetch_v5_is_encoded_as_the_broker_received_it() -> None:
    sent, _ = _exchange("offset_fetch_v5")
    request = EpochOffsetFetchRequest(_CAPTURED_GROUP, [(_TOPIC, [0, 1])]).build(
        OffsetFetchRequest_v5
    )
    assert _encoded(request, 9) == sent


def test_offset_fetch_v5_answer_of_a_broker_carries_the_committed_epoch() -> None:
    _, answer = _exchange("offset_fetch_v5")
    request = EpochOffsetFetchRequest(_CAPTURED_GROUP, [(_TOPIC, [0, 1])]).build(
        OffsetFetchRequest_v5
    )
    decoded = _decoded(request, answer)
    assert decoded["error_code"] == 0
    [topic] = decoded["topics"]
    assert topic["name"] == _TOPIC
    by_partition = {p["partition_index"]: p for p in topic["partitions"]}
    assert (by_partition[0]["committed_offset"], by_partition[0]["committed_leader_epoch"]) == (
        _COMMITTED,
        _EPOCH,
    )
    assert by_partition[0]["error_code"] == 0
    # Never committed: offset -1 and no epoch.
    assert (by_partition[1]["committed_offset"], by_partition[1]["committed_leader_epoch"]) == (
        -1,
        NO_EPOCH,
    )
