"""The JSON bodies the sidecar POSTs to an app's hand-off callback URL.

``keys_revoked`` / ``keys_assigned``::

    {"type": ..., "group": ..., "instance_id": ..., "topic": ..., "partition": ...,
     "generation": ...}

``partitions_revoked`` / ``partitions_assigned``::

    {"type": ..., "group": ..., "instance_id": ...,
     "partitions": [{"topic": ..., "partition": ...}, ...]}
"""

from __future__ import annotations

import json

from sidecar.core.handoff import AssignmentCallback, HandoffCallback


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
