"""``sidecar.core.consume``: the consume path's own ``TopicPartition`` and record shape.

The module claims that its ``TopicPartition`` compares and hashes as aiokafka's does,
and that aiokafka's ``ConsumerRecord`` has the ``ConsumedRecord`` shape (so the adapter
passes it through without copying). Both are checked against aiokafka itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import aiokafka.structs
import pytest

from sidecar.core.consume import ConsumedRecord, TopicPartition
from tests.unit.service.fakes import Record


def test_fields_are_topic_then_partition() -> None:
    tp = TopicPartition("orders", 3)
    assert TopicPartition._fields == ("topic", "partition")
    assert (tp.topic, tp.partition) == ("orders", 3)
    assert tuple(tp) == ("orders", 3)


def test_equal_topic_and_partition_are_one_key() -> None:
    positions = {TopicPartition("orders", 3): 10}
    positions[TopicPartition("orders", 3)] = 11
    assert positions == {TopicPartition("orders", 3): 11}
    assert TopicPartition("orders", 3) != TopicPartition("orders", 4)
    assert TopicPartition("orders", 3) != TopicPartition("payments", 3)


def test_it_is_immutable() -> None:
    tp = TopicPartition("orders", 3)
    with pytest.raises(AttributeError):
        tp.partition = 4  # type: ignore[misc]


def test_partitions_sort_by_topic_then_partition() -> None:
    # Sorted output (assignments, offsets) lists a topic's partitions together, in order.
    unsorted = [TopicPartition("b", 0), TopicPartition("a", 10), TopicPartition("a", 2)]
    assert sorted(unsorted) == [
        TopicPartition("a", 2),
        TopicPartition("a", 10),
        TopicPartition("b", 0),
    ]


def test_it_compares_and_hashes_as_aiokafkas_topic_partition() -> None:
    ours = TopicPartition("orders", 3)
    theirs = aiokafka.structs.TopicPartition("orders", 3)
    assert ours == theirs
    assert hash(ours) == hash(theirs)
    # A mapping keyed by one finds the other's key: no conversion needed for lookups.
    assert {theirs: "committed"}[ours] == "committed"
    assert ours != aiokafka.structs.TopicPartition("orders", 4)


def _protocol_members() -> list[str]:
    return sorted(
        name for name, value in vars(ConsumedRecord).items() if isinstance(value, property)
    )


def test_a_consumed_record_has_the_six_fields_the_service_reads() -> None:
    assert _protocol_members() == ["headers", "key", "offset", "partition", "topic", "value"]


def test_aiokafkas_consumer_record_has_the_consumed_record_shape() -> None:
    record = aiokafka.structs.ConsumerRecord(
        topic="orders",
        partition=3,
        offset=42,
        timestamp=1_700_000_000_000,
        timestamp_type=0,
        key=b"k",
        value=b"v",
        checksum=None,
        serialized_key_size=1,
        serialized_value_size=1,
        headers=[("ordered.stamp", b"\x01")],
    )
    expected: dict[str, object] = {
        "topic": "orders",
        "partition": 3,
        "offset": 42,
        "key": b"k",
        "value": b"v",
        "headers": [("ordered.stamp", b"\x01")],
    }
    assert {name: getattr(record, name) for name in _protocol_members()} == expected


def _read(record: ConsumedRecord) -> tuple[str, int, int, bytes | None, bytes | None]:
    # Typed against the protocol: mypy checks that the fakes below fit it.
    return (record.topic, record.partition, record.offset, record.key, record.value)


def test_a_plain_record_class_fits_the_protocol_structurally() -> None:
    # No inheritance needed: the tests' fake record (tests/unit/service/fakes.py) is a
    # frozen dataclass, and a tombstone's missing key and value are part of the shape.
    record = Record("orders", 1, 7, key=None, value=None)
    assert _read(record) == ("orders", 1, 7, None, None)
    headers: Sequence[tuple[str, bytes | None]] = record.headers
    assert list(headers) == []
