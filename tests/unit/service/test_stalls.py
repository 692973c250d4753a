"""StallWatch: a loop that did not run is noticed at once, and reported once."""

from __future__ import annotations

import asyncio
import time

from sidecar.service.stalls import StallWatch


async def test_a_blocked_loop_is_a_stall_reported_once() -> None:
    watch = StallWatch(threshold_s=0.2)
    stalls: list[float] = []
    task = watch.start(stalls.append)
    try:
        await asyncio.sleep(0.3)  # six ticks of a loop that runs: none is a stall
        assert stalls == []
        assert not watch.stalled()
        time.sleep(0.5)  # noqa: ASYNC251 - the loop must not run, as in a stopped process
        # Known before the watch has ticked again: the first request after resuming
        # already sees it.
        assert watch.stalled()
        await asyncio.sleep(0.2)
        assert len(stalls) == 1, stalls
        assert 0.5 <= stalls[0] < 0.7
        assert not watch.stalled()
    finally:
        task.cancel()


async def test_a_threshold_of_zero_watches_nothing() -> None:
    watch = StallWatch(threshold_s=0.0)
    stalls: list[float] = []
    task = watch.start(stalls.append)
    time.sleep(0.1)  # noqa: ASYNC251 - a stall
    assert not watch.stalled()
    await asyncio.sleep(0.05)
    assert task.done()
    assert stalls == []


async def test_the_watch_outlives_a_failing_reaction() -> None:
    watch = StallWatch(threshold_s=0.2)
    calls: list[float] = []

    def react(seconds: float) -> None:
        calls.append(seconds)
        raise RuntimeError("an instance could not be fenced")

    task = watch.start(react)
    try:
        time.sleep(0.3)  # noqa: ASYNC251 - a stall
        await asyncio.sleep(0.15)
        assert len(calls) == 1
        assert not task.done()
        assert not watch.stalled()  # still ticking
    finally:
        task.cancel()
