"""The topic admin's, the registry's and the produce service's ports are what the
production adapters offer: every method a port names exists on ``MetadataStore`` or
``KafkaGateway`` with the same parameters and kind, and every property is the
adapter's."""

from __future__ import annotations

import pytest

from sidecar.adapters.kafka import KafkaGateway
from sidecar.adapters.zookeeper import MetadataStore
from sidecar.service.topic_ports import (
    AdminKafka,
    AdminStore,
    DirectoryKafka,
    ProduceKafka,
    ProducerRegistration,
    RegistryStore,
)
from tests.support.ports import assert_adapter_offers, port_properties


@pytest.mark.parametrize(
    ("port", "adapter"),
    [
        (AdminStore, MetadataStore),
        (AdminKafka, KafkaGateway),
        (RegistryStore, MetadataStore),
        (ProducerRegistration, MetadataStore),
        (ProduceKafka, KafkaGateway),
        (DirectoryKafka, KafkaGateway),
    ],
)
def test_every_method_of_a_port_is_the_adapters(port: type, adapter: type) -> None:
    assert_adapter_offers(port, adapter)


def test_the_registry_reads_the_session_state_as_a_property() -> None:
    assert port_properties(RegistryStore) == {"session_state"}
