"""Everything the sidecar asks of Kafka: one asyncio adapter over aiokafka.

Three long-lived clients: an idempotent producer (``acks="all"``, so a retry neither
duplicates nor reorders a record within a partition) for unmanaged topics and the
audit topic, an admin client, and a consumer without a group for offset queries. It
reads with ``read_committed``, so the end offsets it reports are last stable offsets:
what a change's boundaries are made of once every transaction writing there has ended.
Managed topics are written through ``sidecar.adapters.transactions``. aiokafka errors
come out as the ``sidecar.core.errors`` hierarchy; a send that fails comes out as
``SendFailed``, which says whether the record may have been appended.

The package, one concern a module: ``gateway`` (``KafkaGateway``, the front class, over
the two components that share its clients), ``admin`` (topics, metadata, offsets,
leader epochs, group offsets), ``writes`` (the idempotent producer's sends, fencing,
and what the transactional writer builds on), ``errors`` (aiokafka's errors as the
sidecar's) and ``clients`` (the arguments of every Kafka client, the gateway's clients).
The rest of the sidecar imports what it needs from here.
"""

from sidecar.adapters.kafka.admin import FALLBACK_CLUSTER_ID, OffsetAndEpoch, PartitionInfo
from sidecar.adapters.kafka.clients import _Clients, client_settings, consumer_settings
from sidecar.adapters.kafka.errors import (
    FENCED_ERRORS,
    SendFailed,
    TopicExists,
    refused_identity,
)
from sidecar.adapters.kafka.gateway import KafkaGateway
from sidecar.adapters.kafka.writes import (
    Header,
    OutgoingKafkaRecord,
    QueuedRecord,
    SentRecord,
    add_partitions_ahead,
    await_partition_count,
    enqueue_all,
    in_transaction,
    ready_to_begin,
    set_transaction_poll,
    start_transactional_producer,
)

__all__ = [
    "FALLBACK_CLUSTER_ID",
    "FENCED_ERRORS",
    "Header",
    "KafkaGateway",
    "OffsetAndEpoch",
    "OutgoingKafkaRecord",
    "PartitionInfo",
    "QueuedRecord",
    "SendFailed",
    "SentRecord",
    "TopicExists",
    "_Clients",
    "add_partitions_ahead",
    "await_partition_count",
    "client_settings",
    "consumer_settings",
    "enqueue_all",
    "in_transaction",
    "ready_to_begin",
    "refused_identity",
    "set_transaction_poll",
    "start_transactional_producer",
]
