"""The Kafka requests that carry leader epochs (KIP-320), as aiokafka protocol classes.

aiokafka 0.14 negotiates Metadata up to v5, ListOffsets, OffsetCommit and OffsetFetch
up to v3, and has no OffsetForLeaderEpoch; leader epochs appear only in Metadata v7,
ListOffsets v4, OffsetForLeaderEpoch v2 (v3 adds the replica id a consumer sends),
OffsetCommit v6 and OffsetFetch v5 (a committed offset's epoch). The classes here are
defined the way aiokafka defines its own (``aiokafka/protocol/metadata.py``): a
``RequestStruct`` and a ``Response`` per version, and a ``Request`` builder whose type
parameter lists the versions, so ``AIOKafkaClient.send`` negotiates the version with the
broker (the highest both know) and decodes the answer. Only versions before each API's
flexible versions are defined (Metadata v9, ListOffsets v6, OffsetForLeaderEpoch v4 use
tagged fields, which aiokafka's schemas do not encode; OffsetCommit's are v8+ and
OffsetFetch's v6+).

Field layouts follow Kafka's message definitions (``common/message/*.json`` in
kafka-clients). aiokafka's own ``OffsetRequest_v4`` declares ``current_leader_epoch`` as
an INT64 where Kafka has an INT32 (one reason it is not negotiated there), so ListOffsets
is defined again here rather than reused. Field names follow aiokafka's where it names
the same field (``partition``, ``leader``, ``replicas``, ``isr``), so a decoded answer
reads like one of aiokafka's; OffsetCommit and OffsetFetch take the names of Kafka's
definitions (aiokafka's commit path reads their answers by position).

``tests/unit/adapters/test_kafka_protocol.py`` encodes each request and decodes each
answer against bytes a Kafka 4.3 broker sent (``ordered_dev/wire_capture.py``); the
OffsetCommit and OffsetFetch answers there are packed by hand after Kafka's message
definitions, not captured yet.
"""

from __future__ import annotations

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Int8, Int16, Int32, Int64, Schema, String

NO_EPOCH = -1
"""The sentinel Kafka uses for "no leader epoch" in every field that carries one."""

CONSUMER_REPLICA_ID = -1
"""The replica id of a client that is not a broker (Kafka's ``CONSUMER_REPLICA_ID``)."""

LATEST_TIMESTAMP = -1
"""ListOffsets: the end of the log (the last stable offset under read_committed)."""

READ_UNCOMMITTED = 0
"""ListOffsets isolation level: the high watermark."""

READ_COMMITTED = 1
"""ListOffsets isolation level: the last stable offset, not the high watermark."""

# Metadata (API key 3) -------------------------------------------------------------------

_BROKERS = (
    "brokers",
    Array(
        ("node_id", Int32),
        ("host", String("utf-8")),
        ("port", Int32),
        ("rack", String("utf-8")),
    ),
)


class MetadataResponse_v7(Response):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 7
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        _BROKERS,
        ("cluster_id", String("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            Array(
                ("error_code", Int16),
                ("topic", String("utf-8")),
                ("is_internal", Boolean),
                (
                    "partitions",
                    Array(
                        ("error_code", Int16),
                        ("partition", Int32),
                        ("leader", Int32),
                        ("leader_epoch", Int32),
                        ("replicas", Array(Int32)),
                        ("isr", Array(Int32)),
                        ("offline_replicas", Array(Int32)),
                    ),
                ),
            ),
        ),
    )


class MetadataRequest_v7(RequestStruct):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 7
    RESPONSE_TYPE = MetadataResponse_v7
    SCHEMA = Schema(("topics", Array(String("utf-8"))), ("allow_auto_topic_creation", Boolean))


class EpochMetadataRequest(Request[MetadataRequest_v7]):  # type: ignore[misc]
    """Metadata of ``topics`` (None: every topic) with each partition's leader epoch.

    Never asks the broker to create a topic: aiokafka's ``MetadataRequest`` defaults
    ``allow_auto_topic_creation`` to True, so on a broker with
    ``auto.create.topics.enable`` merely asking about a topic would create it.
    """

    API_KEY = 3

    def __init__(self, topics: list[str] | None) -> None:
        self.topics = topics

    def build(self, request_struct_class: type[MetadataRequest_v7]) -> MetadataRequest_v7:
        return request_struct_class(self.topics, False)


# ListOffsets (API key 2) ----------------------------------------------------------------

_LIST_OFFSETS_RESPONSE = Schema(
    ("throttle_time_ms", Int32),
    (
        "topics",
        Array(
            ("topic", String("utf-8")),
            (
                "partitions",
                Array(
                    ("partition", Int32),
                    ("error_code", Int16),
                    ("timestamp", Int64),
                    ("offset", Int64),
                    ("leader_epoch", Int32),
                ),
            ),
        ),
    ),
)

_LIST_OFFSETS_REQUEST = Schema(
    ("replica_id", Int32),
    ("isolation_level", Int8),
    (
        "topics",
        Array(
            ("topic", String("utf-8")),
            (
                "partitions",
                Array(
                    ("partition", Int32),
                    ("current_leader_epoch", Int32),
                    ("timestamp", Int64),
                ),
            ),
        ),
    ),
)


class ListOffsetsResponse_v4(Response):  # type: ignore[misc]
    API_KEY = 2
    API_VERSION = 4
    SCHEMA = _LIST_OFFSETS_RESPONSE


class ListOffsetsResponse_v5(Response):  # type: ignore[misc]
    """As v4; the broker may answer OFFSET_NOT_AVAILABLE (a new leader whose high
    watermark is not known yet) where v4 gets LEADER_NOT_AVAILABLE."""

    API_KEY = 2
    API_VERSION = 5
    SCHEMA = _LIST_OFFSETS_RESPONSE


class ListOffsetsRequest_v4(RequestStruct):  # type: ignore[misc]
    API_KEY = 2
    API_VERSION = 4
    RESPONSE_TYPE = ListOffsetsResponse_v4
    SCHEMA = _LIST_OFFSETS_REQUEST


class ListOffsetsRequest_v5(RequestStruct):  # type: ignore[misc]
    API_KEY = 2
    API_VERSION = 5
    RESPONSE_TYPE = ListOffsetsResponse_v5
    SCHEMA = _LIST_OFFSETS_REQUEST


class EpochListOffsetsRequest(Request[ListOffsetsRequest_v4 | ListOffsetsRequest_v5]):  # type: ignore[misc]
    """Offsets at ``timestamp`` of partitions of one topic, each with the leader epoch
    the leader answers with (for the end of the log: its current epoch).

    ``partitions`` maps a partition to the leader epoch the caller believes current
    (``NO_EPOCH``: unchecked); a leader in another epoch answers FENCED_LEADER_EPOCH or
    UNKNOWN_LEADER_EPOCH instead of an offset.
    """

    API_KEY = 2

    def __init__(
        self,
        topic: str,
        partitions: dict[int, int],
        *,
        timestamp: int = LATEST_TIMESTAMP,
        isolation_level: int = READ_COMMITTED,
    ) -> None:
        self.topic = topic
        self.partitions = partitions
        self.timestamp = timestamp
        self.isolation_level = isolation_level

    def build(
        self, request_struct_class: type[ListOffsetsRequest_v4 | ListOffsetsRequest_v5]
    ) -> ListOffsetsRequest_v4 | ListOffsetsRequest_v5:
        partitions = [
            (partition, epoch, self.timestamp) for partition, epoch in self.partitions.items()
        ]
        return request_struct_class(
            CONSUMER_REPLICA_ID, self.isolation_level, [(self.topic, partitions)]
        )


# OffsetForLeaderEpoch (API key 23) ------------------------------------------------------


class OffsetForLeaderEpochResponse_v3(Response):  # type: ignore[misc]
    API_KEY = 23
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            Array(
                ("topic", String("utf-8")),
                (
                    "partitions",
                    Array(
                        ("error_code", Int16),
                        ("partition", Int32),
                        ("leader_epoch", Int32),
                        ("end_offset", Int64),
                    ),
                ),
            ),
        ),
    )


class OffsetForLeaderEpochRequest_v3(RequestStruct):  # type: ignore[misc]
    API_KEY = 23
    API_VERSION = 3
    RESPONSE_TYPE = OffsetForLeaderEpochResponse_v3
    SCHEMA = Schema(
        ("replica_id", Int32),
        (
            "topics",
            Array(
                ("topic", String("utf-8")),
                (
                    "partitions",
                    Array(
                        ("partition", Int32),
                        ("current_leader_epoch", Int32),
                        ("leader_epoch", Int32),
                    ),
                ),
            ),
        ),
    )


class OffsetForLeaderEpochRequest(Request[OffsetForLeaderEpochRequest_v3]):  # type: ignore[misc]
    """The end offset of a leader epoch in partitions of one topic, asked of their leader.

    ``partitions`` maps a partition to (the leader epoch the caller believes current,
    ``NO_EPOCH`` for unchecked; the epoch whose end offset is asked). The leader answers
    the largest epoch it knows at or below the asked one and the offset where the next
    epoch began (its log end offset for its current epoch); ``NO_EPOCH`` and -1 when the
    asked epoch is newer than any it knows.
    """

    API_KEY = 23

    def __init__(self, topic: str, partitions: dict[int, tuple[int, int]]) -> None:
        self.topic = topic
        self.partitions = partitions

    def build(
        self, request_struct_class: type[OffsetForLeaderEpochRequest_v3]
    ) -> OffsetForLeaderEpochRequest_v3:
        partitions = [
            (partition, current, asked) for partition, (current, asked) in self.partitions.items()
        ]
        return request_struct_class(CONSUMER_REPLICA_ID, [(self.topic, partitions)])


# OffsetCommit (API key 8) ---------------------------------------------------------------


class OffsetCommitResponse_v6(Response):  # type: ignore[misc]
    """Read by aiokafka's commit path as its own answers are: ``topics`` is a list of
    (name, [(partition_index, error_code)])."""

    API_KEY = 8
    API_VERSION = 6
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            Array(
                ("name", String("utf-8")),
                ("partitions", Array(("partition_index", Int32), ("error_code", Int16))),
            ),
        ),
    )


class OffsetCommitRequest_v6(RequestStruct):  # type: ignore[misc]
    API_KEY = 8
    API_VERSION = 6
    RESPONSE_TYPE = OffsetCommitResponse_v6
    SCHEMA = Schema(
        ("group_id", String("utf-8")),
        ("generation_id", Int32),
        ("member_id", String("utf-8")),
        (
            "topics",
            Array(
                ("name", String("utf-8")),
                (
                    "partitions",
                    Array(
                        ("partition_index", Int32),
                        ("committed_offset", Int64),
                        ("committed_leader_epoch", Int32),
                        ("committed_metadata", String("utf-8")),
                    ),
                ),
            ),
        ),
    )


CommittedPartition = tuple[int, int, int, str]
"""OffsetCommit: (partition, offset, leader epoch or ``NO_EPOCH``, metadata)."""


class EpochOffsetCommitRequest(Request[OffsetCommitRequest_v6]):  # type: ignore[misc]
    """A group member's commit of ``topics`` (name, partitions), each offset with the
    leader epoch of the last batch read below it (``NO_EPOCH``: unknown), so that a
    reading starting there later can validate it (KIP-320). v6 has neither the
    retention time of v2-v4 (the broker's ``offsets.retention.minutes`` rules) nor the
    group instance id of v7+ (static membership, which the sidecar does not use)."""

    API_KEY = 8

    def __init__(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        topics: list[tuple[str, list[CommittedPartition]]],
    ) -> None:
        self.group_id = group_id
        self.generation_id = generation_id
        self.member_id = member_id
        self.topics = topics

    def build(self, request_struct_class: type[OffsetCommitRequest_v6]) -> OffsetCommitRequest_v6:
        return request_struct_class(self.group_id, self.generation_id, self.member_id, self.topics)


# OffsetFetch (API key 9) ----------------------------------------------------------------


class OffsetFetchResponse_v5(Response):  # type: ignore[misc]
    API_KEY = 9
    API_VERSION = 5
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            Array(
                ("name", String("utf-8")),
                (
                    "partitions",
                    Array(
                        ("partition_index", Int32),
                        ("committed_offset", Int64),
                        ("committed_leader_epoch", Int32),
                        ("metadata", String("utf-8")),
                        ("error_code", Int16),
                    ),
                ),
            ),
        ),
        ("error_code", Int16),
    )


class OffsetFetchRequest_v5(RequestStruct):  # type: ignore[misc]
    API_KEY = 9
    API_VERSION = 5
    RESPONSE_TYPE = OffsetFetchResponse_v5
    SCHEMA = Schema(
        ("group_id", String("utf-8")),
        ("topics", Array(("name", String("utf-8")), ("partition_indexes", Array(Int32)))),
    )


class EpochOffsetFetchRequest(Request[OffsetFetchRequest_v5]):  # type: ignore[misc]
    """The offsets ``group_id`` committed in ``topics`` (name, partitions), each with
    the leader epoch it was committed with (``NO_EPOCH``: none; offset -1: no commit).
    A coordinator that cannot answer for the group (loading it, or no longer its
    coordinator) sets the top-level ``error_code`` and lists no partitions."""

    API_KEY = 9

    def __init__(self, group_id: str, topics: list[tuple[str, list[int]]]) -> None:
        self.group_id = group_id
        self.topics = topics

    def build(self, request_struct_class: type[OffsetFetchRequest_v5]) -> OffsetFetchRequest_v5:
        return request_struct_class(self.group_id, self.topics)
