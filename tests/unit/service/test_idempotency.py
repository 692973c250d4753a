from __future__ import annotations

import asyncio

import pytest

from sidecar.core.errors import IdempotencyKeyReused, ProduceHoldTimeout
from sidecar.service.idempotency import IdempotencyCache


async def test_a_retry_gets_the_first_answer_without_running_again() -> None:
    cache: IdempotencyCache[int] = IdempotencyCache()
    runs = 0
    release = asyncio.Event()

    async def produce() -> int:
        nonlocal runs
        runs += 1
        await release.wait()
        return runs

    first = asyncio.create_task(cache.run(("t", "k"), b"body", produce))
    concurrent = asyncio.create_task(cache.run(("t", "k"), b"body", produce))
    await asyncio.sleep(0)
    release.set()
    assert await first == 1
    assert await concurrent == 1
    assert await cache.run(("t", "k"), b"body", produce) == 1
    assert runs == 1
    assert await cache.run(("t", "other"), b"body", produce) == 2


async def test_the_same_key_with_another_body_is_refused() -> None:
    cache: IdempotencyCache[int] = IdempotencyCache()

    async def produce() -> int:
        return 1

    await cache.run(("t", "k"), b"a", produce)
    with pytest.raises(IdempotencyKeyReused):
        await cache.run(("t", "k"), b"b", produce)


async def test_a_failed_request_is_not_remembered() -> None:
    cache: IdempotencyCache[int] = IdempotencyCache()
    attempts = 0

    async def produce() -> int:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ProduceHoldTimeout()
        return 7

    with pytest.raises(ProduceHoldTimeout):
        await cache.run(("t", "k"), b"a", produce)
    assert await cache.run(("t", "k"), b"a", produce) == 7


async def test_old_entries_are_dropped_beyond_the_bound() -> None:
    cache: IdempotencyCache[int] = IdempotencyCache(max_entries=2)
    runs = 0

    async def produce() -> int:
        nonlocal runs
        runs += 1
        return runs

    for key in ("a", "b", "c", "d"):
        await cache.run((key,), b"x", produce)
    assert await cache.run(("a",), b"x", produce) == 5
