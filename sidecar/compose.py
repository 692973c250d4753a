"""The composition root: builds adapters and services and hands them to each other.

The one module that knows every layer: the consume path gets its adapters (the group
consumer, the callback client with the HTTP layer's callback codec) from here.
"""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.adapters.callbacks import CallbackClient
from sidecar.adapters.group_consumer import GroupConsumer, GroupConsumerOptions, ordered_assignor
from sidecar.adapters.kafka import KafkaGateway
from sidecar.adapters.zookeeper import MetadataStore
from sidecar.config import Settings
from sidecar.core.generations import PartitionMode
from sidecar.http.callback_codec import encode_callback
from sidecar.metrics import SidecarMetrics
from sidecar.service.consume_context import ConsumeContext, ConsumerMetrics
from sidecar.service.consumers import Consumers
from sidecar.service.sidecar import Sidecar


def build_consumers(
    settings: Settings,
    sidecar: Sidecar,
    store: MetadataStore,
    kafka: KafkaGateway,
    metrics: SidecarMetrics,
) -> Consumers:
    """The consumer-instance registry, wired to this sidecar's adapters."""
    consumer_metrics = ConsumerMetrics(metrics)

    def modes_of(topic: str) -> Sequence[PartitionMode] | None:
        runtime = sidecar.topics.get(topic)
        return None if runtime is None else runtime.state.modes

    assignor = ordered_assignor(modes_of)

    async def start_consumer(options: GroupConsumerOptions) -> GroupConsumer:
        return await GroupConsumer.start(settings.kafka, options, assignor)

    def callback_client(url: str, timeout_s: float) -> CallbackClient:
        return CallbackClient(
            url,
            timeout_s=timeout_s,
            retry_s=settings.consumer.callback_retry_s,
            encode=encode_callback,
            observe=consumer_metrics.callback_done,
        )

    context = ConsumeContext(
        sidecar_id=settings.sidecar_id,
        registry=sidecar,
        store=store,
        offsets=kafka,
        audit=sidecar.audit,
        audit_sample_rate=settings.audit.sample_rate,
        settings=settings.consumer,
        metrics=consumer_metrics,
        start_consumer=start_consumer,
        callback_client=callback_client,
    )
    consumers = Consumers(context)
    sidecar.on_assignable_change(consumers.assignable_changed)
    return consumers
