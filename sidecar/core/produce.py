"""What a produce request is and what it yields, apart from its wire format. Pure.

The HTTP layer decodes a request into a ``ProduceRequest`` and encodes the
``ProduceResult`` of each record; the produce service works on these alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TypeAlias

from sidecar.core.errors import SidecarError


class EmbeddedFormat(StrEnum):
    """How record keys and values are embedded in the JSON request."""

    JSON = "json"
    BINARY = "binary"


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    """One record to write. ``value`` None is a tombstone; ``partition`` None is routed."""

    key: bytes | None
    value: bytes | None
    partition: int | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int | None = None
    """The record's timestamp (v3 requests); None: the producer stamps it when sent."""


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    """A validated produce request: at least one record, plus the app's expectations."""

    records: tuple[OutgoingRecord, ...]
    expected_generation: int | None
    expected_count: int | None
    idempotency_key: str | None
    format: EmbeddedFormat


@dataclass(frozen=True, slots=True)
class RecordWritten:
    """A record Kafka acknowledged."""

    partition: int
    offset: int
    timestamp_ms: int | None = None
    """The record's timestamp as Kafka reports it (None: not reported)."""


@dataclass(frozen=True, slots=True)
class RecordFailed:
    """A record that was not written; the other records of the request may have been."""

    error_code: int
    message: str

    @classmethod
    def from_error(cls, error: SidecarError) -> RecordFailed:
        """The entry for a record that failed with ``error`` (its code and message)."""
        return cls(error.error_code, error.message)


ProduceResult: TypeAlias = RecordWritten | RecordFailed
