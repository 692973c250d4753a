"""The sections of the two clusters the sidecar connects to: ``kafka`` and
``zookeeper`` (their ``security`` tables are in ``sidecar.config.security``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecar.config.security import KafkaSecuritySettings, ZooKeeperSecuritySettings

MAX_TRANSACTION_LANES = 8
_SECRET_WORDS = ("password", "secret", "token", "key")


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    bootstrap_servers: str = "127.0.0.1:9092"
    client_id: str = "ordered-sidecar"
    request_timeout_ms: int = 10_000
    """How long any Kafka request may take, a produce's replication included."""
    replication_margin_ms: int = 2_000
    """How long an appended record may take to reach the high watermark after its request
    timed out (follower fetch waits, a leader change). With ``request_timeout_ms`` it is
    what ``zookeeper.session_timeout_s`` must exceed (see ``Settings.validate``)."""
    transaction_timeout_ms: int = 20_000
    """Kafka aborts a transaction of this sidecar left open longer (a paused process)."""
    reset_backoff_s: float = 0.5
    """Pause between tries of re-initialising the transactional producer."""
    retry_backoff_s: float = 0.1
    """Pause between tries of a retriable metadata or admin request, and between looks
    at the metadata while waiting for a topic or its new partitions to show."""
    transaction_poll_ms: float = 5.0
    """How often the transactional producer asks again to add a partition to a new
    transaction while Kafka is still writing the previous one's markers. 20 ms is
    aiokafka's and Java's value; the markers take a few ms, so most of a lone
    transaction's time is that wait: with 5 ms a lone managed request's p50 / p90 went
    from 7.9 / 28.7 to 4.8 / 10.2 ms in ``bench.ab`` (docs/fencing.md). Lower costs the
    transaction coordinator more requests while it writes markers."""
    transaction_linger_ms: float = 5.0
    """How long a transaction waits for more requests before its records are sent, when
    requests come from more than one client at a time (a transaction of the sidecar's is
    still in progress, or the last one carried several requests); a lone client's request
    never waits. Transactions commit one after the other, each about as long whatever
    it carries, so throughput follows the requests a transaction takes: over HTTP the
    clients' next requests arrive one by one, and without a wait the first began a
    transaction of its own (docs/fencing.md, "Requests gathered into a transaction").
    0 turns it off."""
    transaction_lanes: int = 3
    """Transactional ids (each with its own producer) a sidecar writes through in turn:
    with more than one, the next transaction is appended while the previous one commits
    and Kafka writes its markers, instead of waiting for them. Transactions still commit
    one after the other, in order. Each lane is one more producer (connections, memory)
    and one more id to fence at a change."""
    security: KafkaSecuritySettings = field(default_factory=KafkaSecuritySettings)
    """TLS, mutual TLS and SASL of every Kafka client (``kafka.security``)."""
    client: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    """Other aiokafka client settings (``linger_ms``, ...), passed through; a value from
    the environment is converted to the type aiokafka expects."""

    def __repr__(self) -> str:
        return (
            f"KafkaSettings(bootstrap_servers={self.bootstrap_servers!r}, "
            f"client_id={self.client_id!r}, request_timeout_ms={self.request_timeout_ms}, "
            f"security={self.security!r}, client={_redacted(self.client)!r})"
        )


@dataclass(frozen=True, slots=True)
class ZooKeeperSettings:
    hosts: str = "127.0.0.1:2181"
    root: str = "/ordered"
    session_timeout_s: float = 15.0
    """A sidecar cut off (or paused) this long is no longer waited for by barriers."""
    lock_poll_s: float = 0.05
    """How often a topic's change lock is tried again while another sidecar holds it."""
    transaction_attempts: int = 5
    """Tries of a multi-node ZooKeeper transaction that lost a compare-and-set race."""
    topic_list_interval_s: float = 10.0
    """How often the list of managed topics is read again (±20 %), besides the watch on
    it: a watch that missed a topic managed by another sidecar (set while ZooKeeper was
    away) has it watched, and its barriers acked, within this delay. Each read is one
    ZooKeeper request per sidecar; the watch itself costs none while idle."""
    read_concurrency: int = 8
    """How many managed topics are read from ZooKeeper at once when a sidecar starts (or
    finds several new ones): each read is a few round trips, overlapped this many at a
    time on the one session."""
    security: ZooKeeperSecuritySettings = field(default_factory=ZooKeeperSecuritySettings)
    """TLS, authentication and the ACLs of the znodes (``zookeeper.security``)."""


def _redacted(values: Mapping[str, Any]) -> dict[str, Any]:
    return {
        key: "***" if any(word in key.lower() for word in _SECRET_WORDS) else value
        for key, value in values.items()
    }
