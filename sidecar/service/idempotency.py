"""Produce requests retried with the same idempotency key are written once.

Scope: one sidecar process (apps reach their own sidecar on localhost, so a retry
comes back here), keyed by (topic, partition in the URL, key). The first request with
a key runs; a retry that arrives while it runs waits for its answer; a retry after it
gets the same answer, as long as it is within the cache's size and age bounds. A
request that failed as a whole (fenced, held too long) is not remembered: retrying
it is what the client should do.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sidecar.core.errors import IdempotencyKeyReused

_T = TypeVar("_T")


@dataclass
class _Entry(Generic[_T]):
    fingerprint: str
    created: float
    result: asyncio.Future[_T]


class IdempotencyCache(Generic[_T]):
    def __init__(self, max_entries: int = 10_000, max_age_s: float = 600.0) -> None:
        self.max_entries = max_entries
        self.max_age_s = max_age_s
        self._entries: OrderedDict[tuple[str, ...], _Entry[_T]] = OrderedDict()

    async def run(
        self, scope: tuple[str, ...], body: bytes, produce: Callable[[], Awaitable[_T]]
    ) -> _T:
        """``produce()`` once per scope; raises IdempotencyKeyReused on another body."""
        self._expire()
        fingerprint = hashlib.sha256(body).hexdigest()
        entry = self._entries.get(scope)
        if entry is not None:
            if entry.fingerprint != fingerprint:
                raise IdempotencyKeyReused(
                    "this idempotency key was used for a different request body"
                )
            return await asyncio.shield(entry.result)
        future: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
        self._entries[scope] = _Entry(fingerprint, time.monotonic(), future)
        try:
            result = await produce()
        except BaseException as exc:
            del self._entries[scope]
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody logs it as lost
            raise
        future.set_result(result)
        return result

    def _expire(self) -> None:
        now = time.monotonic()
        while self._entries:
            scope, oldest = next(iter(self._entries.items()))
            too_many = len(self._entries) > self.max_entries
            if not too_many and now - oldest.created < self.max_age_s:
                break
            if not oldest.result.done():
                break  # still running: it stays until it has answered
            del self._entries[scope]
