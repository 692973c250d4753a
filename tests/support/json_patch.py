"""RFC 6902 JSON Patch, as far as the injection webhook emits it: applied to a copy of a
document, so the tests can look at the pod the API server would store."""

from __future__ import annotations

import copy
from typing import Any


def apply_patch(document: dict[str, Any], operations: list[Any]) -> dict[str, Any]:
    """``document`` after RFC 6902 "add" operations (all that injection emits), as a copy."""
    result = copy.deepcopy(document)
    for operation in operations:
        assert operation["op"] == "add", operation
        *parents, last = [
            part.replace("~1", "/").replace("~0", "~") for part in operation["path"].split("/")[1:]
        ]
        target: Any = result
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        value = copy.deepcopy(operation["value"])
        if isinstance(target, list):
            if last == "-":
                target.append(value)
            else:
                target.insert(int(last), value)
        else:
            target[last] = value
    return result
