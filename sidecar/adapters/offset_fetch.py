"""OffsetFetch answers read with the group-level error that aiokafka 0.14 drops.

From version 2 on (KIP-88), an OffsetFetch response carries a top-level ``error_code``.
A coordinator that is still loading the group's offsets (it just took over after a
broker left), or that is no longer the group's coordinator, answers with that code set
and *no partitions at all*. aiokafka reads only the per-partition codes, so it takes
such an answer for "this group never committed here":

* the group consumer (``GroupCoordinator._maybe_refresh_commit_offsets``) marks every
  assigned partition as uncommitted and applies ``auto.offset.reset``: ``earliest``
  reads the partition again from its start, ``latest`` skips everything the group had
  not read yet;
* the admin client (``list_consumer_group_offsets``) returns an empty mapping.

``checked_sender`` wraps the send of one client so that such an answer raises the
error instead; aiokafka's callers already retry retriable errors (a loading or moved
coordinator) and give up on the others, as they do for per-partition codes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka.errors import (
    GroupCoordinatorNotAvailableError,
    NoError,
    NotCoordinatorForGroupError,
    for_code,
)
from aiokafka.protocol.commit import OffsetFetchRequest

Send = Callable[..., Awaitable[Any]]

_COORDINATOR_MOVED = (NotCoordinatorForGroupError, GroupCoordinatorNotAvailableError)


def raise_group_error(response: Any, on_coordinator_moved: Callable[[], None] | None) -> None:
    """Raise the top-level error of an OffsetFetch response, if it has one.

    ``on_coordinator_moved`` runs first when the error says the coordinator is elsewhere
    or unavailable (the group consumer forgets its coordinator, so the retry finds the
    new one). Version 0 and 1 responses have no top-level code: nothing to check."""
    error_type = for_code(getattr(response, "error_code", 0))
    if error_type is NoError:
        return
    if on_coordinator_moved is not None and issubclass(error_type, _COORDINATOR_MOVED):
        on_coordinator_moved()
    raise error_type()


def checked_sender(send: Send, on_coordinator_moved: Callable[[], None] | None = None) -> Send:
    """``send`` (a client's request-sending coroutine function, the request first), with
    OffsetFetch answers checked by ``raise_group_error``; other requests pass as they are."""

    async def send_checked(request: Any, *args: Any, **kwargs: Any) -> Any:
        response = await send(request, *args, **kwargs)
        if isinstance(request, OffsetFetchRequest):
            raise_group_error(response, on_coordinator_moved)
        return response

    return send_checked


def check_group_consumer(consumer: Any) -> None:
    """Make a started ``AIOKafkaConsumer`` with a group raise OffsetFetch's group-level
    errors. Set on the consumer's coordinator object only: nothing else of aiokafka
    changes. Call it after ``start()`` and before the first subscribe or assign (the
    coordinator exists from ``start()``; offsets are fetched only once partitions are
    assigned)."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is None or not hasattr(coordinator, "coordinator_dead"):
        return  # no group: offsets are never fetched from a coordinator
    coordinator._send_req = checked_sender(coordinator._send_req, coordinator.coordinator_dead)


def check_admin_client(admin: Any) -> None:
    """Make an ``AIOKafkaAdminClient`` raise OffsetFetch's group-level errors from
    ``list_consumer_group_offsets`` instead of returning no offsets."""
    admin._send_request = checked_sender(admin._send_request)
