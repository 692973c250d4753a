"""The JSON bodies the sidecar POSTs to an app's hand-off callback URL.

``keys_revoked`` / ``keys_assigned``::

    {"type": ..., "group": ..., "instance_id": ..., "topic": ..., "partition": ...,
     "generation": ...}

``partitions_revoked`` / ``partitions_assigned``::

    {"type": ..., "group": ..., "instance_id": ...,
     "partitions": [{"topic": ..., "partition": ...}, ...]}

``log_truncated``::

    {"type": "log_truncated", "group": ..., "instance_id": ..., "topic": ...,
     "partition": ..., "offset": ... | null, "position": ..., "leader_epoch": ...,
     "lost": ...}
"""

from __future__ import annotations

import json

from sidecar.core.handoff import AssignmentCallback, HandoffCallback, TruncationNotice


def encode_callback(message: HandoffCallback | AssignmentCallback) -> bytes:
    if isinstance(message, HandoffCallback):
        body: dict[str, object] = {
            "type": message.kind.value,
            "group": message.group,
            "instance_id": message.instance_id,
            "topic": message.subject.topic,
            "partition": message.subject.partition,
            "generation": message.subject.generation,
        }
    elif isinstance(message.notice, TruncationNotice):
        body = {
            "type": message.notice.kind.value,
            "group": message.group,
            "instance_id": message.instance_id,
        } | truncation_fields(message.notice)
    else:
        body = {
            "type": message.notice.kind.value,
            "group": message.group,
            "instance_id": message.instance_id,
            "partitions": [
                {"topic": tp.topic, "partition": tp.partition} for tp in message.notice.partitions
            ],
        }
    return json.dumps(body).encode()


def truncation_fields(notice: TruncationNotice) -> dict[str, object]:
    """What a ``log_truncated`` notice says of the partition, in a callback or a records
    response: ``offset`` is where the instance reads again (null: the log's start, where
    the logs diverge not being known), ``position`` where it stood, ``lost`` the offsets
    read from ``offset`` up to ``position`` that the log no longer has."""
    return {
        "topic": notice.tp.topic,
        "partition": notice.tp.partition,
        "offset": notice.resume_at,
        "position": notice.position,
        "leader_epoch": notice.leader_epoch,
        "lost": notice.lost,
    }
