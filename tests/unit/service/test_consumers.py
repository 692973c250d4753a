"""The sidecar's consumer instances (``sidecar.service.consumers``): which groups a change
rebalances, and how often."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from sidecar.service.consumers import Consumers
from sidecar.service.instance import InstanceConfig
from tests.unit.service import fakes


async def _consumers(window_s: float) -> tuple[Consumers, fakes.Context]:
    context = fakes.Context()
    context.settings = replace(context.settings, rebalance_window_s=window_s)
    consumers = Consumers(context.build())
    return consumers, context


async def test_changes_within_the_window_rebalance_a_subscribed_group_once() -> None:
    consumers, context = await _consumers(0.05)
    reader = await consumers.create(InstanceConfig(group="g", name="a", format="binary"))
    await reader.subscribe(["t"], None)
    try:
        for _ in range(3):
            consumers.assignable_changed("t")
        assert context.consumer.rejoins == 0  # folded: nothing asked yet
        await asyncio.sleep(0.15)
        assert context.consumer.rejoins == 1
        assert context.metrics.rebalance_requests == 1
        consumers.assignable_changed("t")  # a later change: a rebalance of its own
        await asyncio.sleep(0.15)
        assert context.consumer.rejoins == 2
    finally:
        await consumers.close()


async def test_a_change_of_another_topic_rebalances_nobody() -> None:
    consumers, context = await _consumers(0.01)
    reader = await consumers.create(InstanceConfig(group="g", name="a", format="binary"))
    await reader.subscribe(["t"], None)
    try:
        consumers.assignable_changed("other")
        await asyncio.sleep(0.05)
        assert context.consumer.rejoins == 0
    finally:
        await consumers.close()
