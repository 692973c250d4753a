"""``Settings``, the one frozen object of every section, with the checks that span
sections (``Settings.validate``), and the table of its sections by name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sidecar.config.clusters import MAX_TRANSACTION_LANES, KafkaSettings, ZooKeeperSettings
from sidecar.config.errors import ConfigError
from sidecar.config.operations import (
    AuditSettings,
    FaultSettings,
    LogSettings,
    MetricsSettings,
    ProcessSettings,
    StartupSettings,
)
from sidecar.config.serving import ChangeSettings, ConsumerSettings, HttpSettings, ProduceSettings
from sidecar.core import names
from sidecar.core.errors import InvalidName


@dataclass(frozen=True, slots=True)
class Settings:
    sidecar_id: str
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    zookeeper: ZooKeeperSettings = field(default_factory=ZooKeeperSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    produce: ProduceSettings = field(default_factory=ProduceSettings)
    changes: ChangeSettings = field(default_factory=ChangeSettings)
    consumer: ConsumerSettings = field(default_factory=ConsumerSettings)
    audit: AuditSettings = field(default_factory=AuditSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    process: ProcessSettings = field(default_factory=ProcessSettings)
    faults: FaultSettings = field(default_factory=FaultSettings)
    startup: StartupSettings = field(default_factory=StartupSettings)
    log: LogSettings = field(default_factory=LogSettings)

    def validate(self) -> Settings:
        """Refuse combinations that break the timing the design rests on; returns self.

        Raises ConfigError naming the settings involved.
        """
        try:
            # Both are part of ZooKeeper node names (registration, barrier acks, the
            # producer registry) and of Kafka transactional ids: refused at start, not
            # at registration.
            names.sidecar_id(self.sidecar_id, "sidecar_id")
            names.node_name(self.kafka.client_id, "kafka.client_id")
        except InvalidName as exc:
            raise ConfigError(
                f"{exc.message} (it is part of ZooKeeper node names and Kafka transactional ids)"
            ) from exc
        session_ms = self.zookeeper.session_timeout_s * 1000
        send_ms = self.kafka.request_timeout_ms + self.kafka.replication_margin_ms
        if session_ms <= send_ms:
            raise ConfigError(
                f"zookeeper.session_timeout_s ({self.zookeeper.session_timeout_s:g} s) must exceed "
                f"kafka.request_timeout_ms + kafka.replication_margin_ms ({send_ms / 1000:g} s): "
                "a sidecar whose session expired must have no send left that could still land"
            )
        if self.produce.barrier_timeout_s <= self.zookeeper.session_timeout_s:
            raise ConfigError(
                f"produce.barrier_timeout_s ({self.produce.barrier_timeout_s:g} s) must exceed "
                f"zookeeper.session_timeout_s ({self.zookeeper.session_timeout_s:g} s): otherwise "
                "a crashed sidecar rolls every change back instead of being left behind"
            )
        if not 0 <= self.produce.unmanaged_cache_s < self.zookeeper.session_timeout_s:
            raise ConfigError(
                f"produce.unmanaged_cache_s ({self.produce.unmanaged_cache_s:g} s) must be at "
                f"least 0 and less than zookeeper.session_timeout_s "
                f"({self.zookeeper.session_timeout_s:g} s): a sidecar resumed after a pause past "
                "its session must ask again whether a topic became managed meanwhile"
            )
        if self.kafka.transaction_timeout_ms <= self.kafka.request_timeout_ms:
            raise ConfigError(
                f"kafka.transaction_timeout_ms ({self.kafka.transaction_timeout_ms}) must exceed "
                f"kafka.request_timeout_ms ({self.kafka.request_timeout_ms}): a transaction "
                "commits within one request timeout"
            )
        if not 1 <= self.kafka.transaction_lanes <= MAX_TRANSACTION_LANES:
            raise ConfigError(
                f"kafka.transaction_lanes ({self.kafka.transaction_lanes}) must be from 1 to "
                f"{MAX_TRANSACTION_LANES}: each lane is a producer of its own"
            )
        if self.changes.housekeeping_interval_s >= self.produce.barrier_timeout_s:
            raise ConfigError(
                f"changes.housekeeping_interval_s ({self.changes.housekeeping_interval_s:g} s) "
                f"must be below produce.barrier_timeout_s ({self.produce.barrier_timeout_s:g} s): "
                "a change whose coordinator died is resumed before its barrier times out"
            )
        if self.zookeeper.lock_poll_s >= self.changes.lock_timeout_s:
            raise ConfigError(
                f"zookeeper.lock_poll_s ({self.zookeeper.lock_poll_s:g} s) must be below "
                f"changes.lock_timeout_s ({self.changes.lock_timeout_s:g} s): the lock is "
                "tried at least twice"
            )
        if self.consumer.gate_recheck_s >= self.consumer.instance_idle_timeout_s:
            raise ConfigError(
                f"consumer.gate_recheck_s ({self.consumer.gate_recheck_s:g} s) must be below "
                f"consumer.instance_idle_timeout_s ({self.consumer.instance_idle_timeout_s:g} s)"
            )
        return self


_SECTIONS: dict[str, type[Any]] = {
    "kafka": KafkaSettings,
    "zookeeper": ZooKeeperSettings,
    "http": HttpSettings,
    "produce": ProduceSettings,
    "changes": ChangeSettings,
    "consumer": ConsumerSettings,
    "audit": AuditSettings,
    "metrics": MetricsSettings,
    "process": ProcessSettings,
    "faults": FaultSettings,
    "startup": StartupSettings,
    "log": LogSettings,
}
