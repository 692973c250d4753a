"""What the REST Proxy v2 consumer codec tests share: the content types a request may
carry, and a JSON request body."""

from __future__ import annotations

import json

V2 = "application/vnd.kafka.v2+json"
BINARY_V2 = "application/vnd.kafka.binary.v2+json"
JSON_V2 = "application/vnd.kafka.json.v2+json"


def body(document: object) -> bytes:
    return json.dumps(document).encode("utf-8")
