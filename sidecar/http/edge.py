"""What every request passes before its handler runs: the names in its path are checked.

A topic, group or instance name in the URL is checked here, once for every route (also
routes added later), before a handler can hand it to Kafka, ZooKeeper or a metric
label. The rules are ``sidecar.core.names``'; a name they refuse is answered 400
(40001) at once, whatever the route would have done with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler

from sidecar.core import names
from sidecar.core.errors import UnknownPartition

_PATH_NAMES: Final[Mapping[str, Callable[[object, str], str]]] = {
    "topic": names.topic_name,
    "group": names.group_name,
    "name": names.instance_name,
}


@web.middleware
async def path_names_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Raises InvalidName for a path parameter that is not a valid name of its kind."""
    for parameter, check in _PATH_NAMES.items():
        value = request.match_info.get(parameter)
        if value is not None:
            check(value, f"{parameter} in the path")
    return await handler(request)


def partition_in_path(request: web.Request) -> int | None:
    """The ``{partition}`` of the route, None if it has none.

    Raises UnknownPartition (404, as REST Proxy answers) for one that is not a partition
    number: no such partition can exist.
    """
    raw = request.match_info.get("partition")
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 10 or int(raw) > 2**31 - 1:
        raise UnknownPartition(f"partition {raw[:20]!r} is not a partition number")
    return int(raw)
