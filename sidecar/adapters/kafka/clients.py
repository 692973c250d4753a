"""The aiokafka clients of the Kafka gateway: the arguments every Kafka client of the
sidecar is built from (``kafka.client`` and ``kafka.security``), the gateway's three
clients, and ``ConnectionState``, which holds them for the gateway's components."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import KafkaError

from sidecar.adapters.kafka_security import coerced_client_options, security_arguments
from sidecar.config import KafkaSettings
from sidecar.core.errors import KafkaUnavailable, ShuttingDown

# One logger for the whole gateway: every module of the package logs as
# ``sidecar.adapters.kafka``.
_log = logging.getLogger(__package__)

# Settings every aiokafka client accepts (they configure AIOKafkaClient's connections);
# any other key of ``kafka.client`` tunes the producer only. Security settings come from
# ``kafka.security`` (``sidecar.adapters.kafka_security``), never from ``kafka.client``.
_CONNECTION_KEYS = frozenset(
    {
        "sasl_kerberos_service_name",
        "sasl_kerberos_domain_name",
        "connections_max_idle_ms",
        "retry_backoff_ms",
        "metadata_max_age_ms",
    }
)

# The producers' batch size unless ``kafka.client.max_batch_size`` says otherwise.
# aiokafka's 16 KiB held about 70 managed records of 100 B, and a partition sends one
# batch per produce request, so a transaction of 4,000 records took about seven round
# trips before it could commit. With 64 KiB: 1.26-1.32x the managed records/s with
# 40 x 100 records in flight, 1.03-1.16x the unmanaged ones, 0.98-1.02x with 4 x 100,
# and a lone record's latency no different (bench/README.md, "`ab.py`: the producers'
# batch size"). Far below a topic's default limit on a batch (max.message.bytes, 1 MiB).
PRODUCER_BATCH_BYTES = 65_536


@dataclass(frozen=True, slots=True)
class _Clients:
    producer: Any
    admin: Any
    consumer: Any


class ConnectionState:
    """The gateway's clients, which its components share: ``KafkaGateway.start`` sets
    them, ``stop`` takes them away."""

    def __init__(self) -> None:
        self.clients: _Clients | None = None
        self.stopped = False

    def require(self) -> _Clients:
        """The clients. Raises ShuttingDown once stopped, KafkaUnavailable before start."""
        if self.clients is None:
            if self.stopped:
                raise ShuttingDown("the Kafka connection is closed")
            raise KafkaUnavailable("the Kafka connection is not started")
        return self.clients


def client_settings(settings: KafkaSettings) -> tuple[dict[str, Any], dict[str, Any]]:
    """(settings for every aiokafka client, extra settings for producers only).

    Every client the sidecar makes is built from these, so each connects with the same
    ``kafka.security``. Raises ConfigError (a TLS file that cannot be used, a
    ``kafka.client`` value of the wrong type)."""
    common: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "client_id": settings.client_id,
        "request_timeout_ms": settings.request_timeout_ms,
        **security_arguments(settings.security),
    }
    producer: dict[str, Any] = {"max_batch_size": PRODUCER_BATCH_BYTES}
    for name, value in coerced_client_options(settings.client).items():
        if name in _CONNECTION_KEYS:
            common[name] = value
        elif name in ("acks", "enable_idempotence", "transactional_id"):
            # Ordering and fencing depend on these: they are not settings.
            _log.warning("ignoring kafka.client.%s: the sidecar needs its own value", name)
        else:
            producer[name] = value
    return common, producer


def consumer_settings(settings: KafkaSettings, client_suffix: str, **own: Any) -> dict[str, Any]:
    """A group consumer's arguments: ``client_settings``' common part (security
    included) with its own client id, then ``own`` (which wins)."""
    common, _ = client_settings(settings)
    return common | {"client_id": f"{settings.client_id}-{client_suffix}"} | own


async def _close_all(*clients: Any) -> None:
    for client in clients:
        close = getattr(client, "stop", None) or client.close
        try:
            await close()
        except (KafkaError, OSError) as exc:
            _log.warning("closing %s failed: %s", type(client).__name__, exc)
