"""Waiting for a condition that no event announces (a ZooKeeper node, an offset)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

POLL_S = 0.05


async def eventually(check: Callable[[], Awaitable[bool]], within_s: float, what: str) -> None:
    """Return once ``check()`` is true; raise AssertionError naming ``what`` after
    ``within_s`` seconds. For states nobody notifies of: poll them."""
    try:
        async with asyncio.timeout(within_s):
            while not await check():  # noqa: ASYNC110 (nothing to await but the state itself)
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise AssertionError(f"not within {within_s:g} s: {what}") from None
