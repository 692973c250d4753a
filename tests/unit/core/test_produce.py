"""``sidecar.core.produce``: what a produce request is and what each record yields,
apart from the wire format."""

from __future__ import annotations

import dataclasses

import pytest

from sidecar.core.errors import InvalidRecord, KafkaUnavailable, PartitionReadOnly
from sidecar.core.produce import (
    EmbeddedFormat,
    OutgoingRecord,
    ProduceRequest,
    RecordFailed,
    RecordWritten,
)


def test_the_embedded_formats_are_named_as_rest_proxy_names_them() -> None:
    assert EmbeddedFormat("json") is EmbeddedFormat.JSON
    assert EmbeddedFormat("binary") is EmbeddedFormat.BINARY
    assert [fmt.value for fmt in EmbeddedFormat] == ["json", "binary"]


@pytest.mark.parametrize("name", ["avro", "JSON", "protobuf", ""])
def test_other_format_names_are_not_formats(name: str) -> None:
    with pytest.raises(ValueError, match=repr(name)):
        EmbeddedFormat(name)


def test_a_failed_record_carries_its_errors_code_and_message() -> None:
    failed = RecordFailed.from_error(PartitionReadOnly("partition 1 of orders is read-only"))
    assert failed == RecordFailed(40902, "partition 1 of orders is read-only")


def test_a_failed_record_without_a_message_carries_the_errors_default() -> None:
    assert RecordFailed.from_error(InvalidRecord()) == RecordFailed(42201, "invalid record")


def test_a_retriable_failure_keeps_its_own_code() -> None:
    # 50002, not the root's 50000: the app tells a retriable failure by its code.
    assert RecordFailed.from_error(KafkaUnavailable("no leader")) == RecordFailed(
        50002, "no leader"
    )


def test_a_record_written_has_no_timestamp_unless_kafka_reports_one() -> None:
    assert RecordWritten(2, 41).timestamp_ms is None
    assert RecordWritten(2, 41, 1_700_000_000_000).timestamp_ms == 1_700_000_000_000


def test_a_request_and_its_records_cannot_be_changed_once_validated() -> None:
    record = OutgoingRecord(b"k", b"v", 0, (("h", None),))
    request = ProduceRequest((record,), 3, 4, "retry-1", EmbeddedFormat.BINARY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.expected_generation = 5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.partition = 1  # type: ignore[misc]
    assert record.timestamp_ms is None  # stamped by the producer when sent
