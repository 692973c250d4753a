"""Audit events, schema version 1. Pure: builders of JSON-ready dicts.

Every event is one JSON object (one Kafka record on the audit topic, or one line of
a JSON-lines file) with these common fields:

=================  ===========================================================
``schema``         1
``type``           one of the types below
``sidecar``        id of the sidecar that emitted it
``seq``            that sidecar's audit sequence number (from 0, no gaps unless
                   events were dropped: ``sidecar_audit_events_dropped_total``)
``time``           wall-clock seconds (float) when it was emitted
=================  ===========================================================

Types and their own fields (``key`` is base64 or null; ``producer`` and
``producer_seq`` are the sidecar id and sequence of the record's stamp (its
``ordered.stamp`` header, or the four headers of older sidecars), which identify it
across partitions and generations):

``produce_acked``   topic, partition, offset, key, generation, count, producer, producer_seq
``delivered``       group, instance, topic, partition, offset, key, generation, producer,
                    producer_seq (generation/producer null for a record without headers)
``committed``       group, instance, topic, partition, offset (the next offset to read)
``gate_opened``     group, instance, topic, partition, offset, generation, evidence: a list
                    of {source, boundary, committed, log_start, mode} the gate relied on
``barrier_phase``   topic, kind (expand/shrink), from_generation, from_count, target_count,
                    phase, coordinator
``admin``           topic, kind (create/adopt/expand/shrink), result, from_count, target_count
``boundary_truncated``  topic, generation, partition, boundary, leader_epoch, log_end (where
                    that epoch ends on the current leader, null if it knows none): a
                    boundary an unclean leader election cut the log below (KIP-320)
``truncation_confirmed``  topic, boundaries: the lost boundaries an operator confirmed
                    (``sidecar topics confirm-truncation``), after which the topic
                    changes again
``consumer_truncated``  group, instance, topic, partition, position, leader_epoch,
                    resume_at (null: the leader knew no epoch that old), lost: a consumer
                    instance found the log cut below what it had read (KIP-320) and reads
                    again from ``resume_at``; the records it delivers at offsets from there
                    are new ones, not repeats

Record events (``produce_acked``, ``delivered``) are sampled by key hash
(``audit.sample_rate``) so that a sampled key's history is complete; the others are
always emitted.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sidecar.core.placement import Header, record_stamp
from sidecar.core.routing import positive_hash

SCHEMA_VERSION = 1
Event = dict[str, Any]


def key_sampled(key: bytes | None, sample_rate: float) -> bool:
    """Whether record events of ``key`` are emitted. Stable across sidecars (murmur2)."""
    if sample_rate >= 1.0:
        return True
    if key is None:
        return sample_rate > 0.0
    # round, not int: 0.57 * 10_000 is 5699.999..., one bucket short of the rate.
    return positive_hash(key) % 10_000 < round(sample_rate * 10_000)


def _key(key: bytes | None) -> str | None:
    return None if key is None else base64.b64encode(key).decode("ascii")


def produce_acked(
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    generation: int,
    count: int,
    producer: str,
    producer_seq: int,
) -> Event:
    return {
        "type": "produce_acked",
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "key": _key(key),
        "generation": generation,
        "count": count,
        "producer": producer,
        "producer_seq": producer_seq,
    }


def delivered(
    *,
    group: str,
    instance: str,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    headers: Sequence[Header],
    ordered: bool = True,
    assignment: int | None = None,
) -> Event:
    """``ordered``: whether the topic promises per-key order (a managed topic with
    ordered delivery); the audit checks order only where it does. ``assignment``: which
    of the instance's assignments the record was read in (its consumer's count, new at
    every rebalance): a record delivered again by the same instance in a later one came
    again through a rebalance, as at-least-once allows, not through a seek or a bug."""
    stamp = record_stamp(headers)
    return {
        "type": "delivered",
        "group": group,
        "instance": instance,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "key": _key(key),
        "generation": None if stamp is None else stamp.generation,
        "producer": None if stamp is None else stamp.sidecar,
        "producer_seq": None if stamp is None else stamp.sequence,
        "ordered": ordered,
        "assignment": assignment,
    }


def committed(*, group: str, instance: str, topic: str, partition: int, offset: int) -> Event:
    return {
        "type": "committed",
        "group": group,
        "instance": instance,
        "topic": topic,
        "partition": partition,
        "offset": offset,
    }


def gate_opened(
    *,
    group: str,
    instance: str,
    topic: str,
    partition: int,
    offset: int,
    generation: int,
    evidence: Sequence[Mapping[str, Any]],
) -> Event:
    return {
        "type": "gate_opened",
        "group": group,
        "instance": instance,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "generation": generation,
        "evidence": [dict(item) for item in evidence],
    }


def barrier_phase(
    *,
    topic: str,
    kind: str,
    from_generation: int,
    from_count: int,
    target_count: int,
    phase: str,
    coordinator: str,
) -> Event:
    return {
        "type": "barrier_phase",
        "topic": topic,
        "kind": kind,
        "from_generation": from_generation,
        "from_count": from_count,
        "target_count": target_count,
        "phase": phase,
        "coordinator": coordinator,
    }


def admin(*, topic: str, kind: str, result: str, from_count: int, target_count: int) -> Event:
    return {
        "type": "admin",
        "topic": topic,
        "kind": kind,
        "result": result,
        "from_count": from_count,
        "target_count": target_count,
    }


def boundary_truncated(
    *,
    topic: str,
    generation: int,
    partition: int,
    boundary: int,
    leader_epoch: int,
    log_end: int | None,
) -> Event:
    return {
        "type": "boundary_truncated",
        "topic": topic,
        "generation": generation,
        "partition": partition,
        "boundary": boundary,
        "leader_epoch": leader_epoch,
        "log_end": log_end,
    }


def truncation_confirmed(*, topic: str, boundaries: list[dict[str, int | None]]) -> Event:
    """An operator confirmed these lost boundaries: the topic changes again."""
    return {"type": "truncation_confirmed", "topic": topic, "boundaries": boundaries}


def consumer_truncated(
    *,
    group: str,
    instance: str,
    topic: str,
    partition: int,
    position: int,
    leader_epoch: int,
    resume_at: int | None,
    lost: int,
) -> Event:
    """A consumer instance found its partition's log cut below what it had read."""
    return {
        "type": "consumer_truncated",
        "group": group,
        "instance": instance,
        "topic": topic,
        "partition": partition,
        "position": position,
        "leader_epoch": leader_epoch,
        "resume_at": resume_at,
        "lost": lost,
    }


def stamped(event: Event, *, sidecar: str, seq: int, now: float | None = None) -> Event:
    """``event`` with the common fields."""
    return {
        "schema": SCHEMA_VERSION,
        "sidecar": sidecar,
        "seq": seq,
        "time": time.time() if now is None else now,
    } | event
