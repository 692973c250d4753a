"""The change's ports are what the production adapters offer: every method a port names
exists on ``MetadataStore`` or ``KafkaGateway`` with the same parameters and the same
kind (coroutine or not). mypy checks the types where the runner and the retirer are built
(``sidecar.compose``); this checks the names and parameters at run time too, so a port
cannot drift from its adapter in a way a fake would hide."""

from __future__ import annotations

import inspect

import pytest

from sidecar.adapters.kafka import KafkaGateway
from sidecar.adapters.zookeeper import MetadataStore
from sidecar.service.change_ports import (
    ChangeKafka,
    ChangeStore,
    EpochEnds,
    RetirementKafka,
    RetirementStore,
    TruncationStore,
)


def _members(port: type) -> dict[str, object]:
    members: dict[str, object] = {}
    for klass in reversed(port.__mro__):
        if klass is object or klass.__name__ in ("Protocol", "Generic"):
            continue
        members |= {
            name: value
            for name, value in vars(klass).items()
            if callable(value) and not name.startswith("_")
        }
    return members


@pytest.mark.parametrize(
    ("port", "adapter"),
    [
        (ChangeStore, MetadataStore),
        (TruncationStore, MetadataStore),
        (ChangeKafka, KafkaGateway),
        (EpochEnds, KafkaGateway),
        (RetirementStore, MetadataStore),
        (RetirementKafka, KafkaGateway),
    ],
)
def test_every_method_of_a_port_is_the_adapters(port: type, adapter: type) -> None:
    members = _members(port)
    assert members, f"{port.__name__} names no method"
    for name, declared in members.items():
        offered = getattr(adapter, name, None)
        assert offered is not None, f"{adapter.__name__} has no {name}"
        assert list(inspect.signature(offered).parameters) == list(
            inspect.signature(declared).parameters  # type: ignore[arg-type]
        ), name
        assert inspect.iscoroutinefunction(offered) == inspect.iscoroutinefunction(declared), name


def test_a_change_store_includes_what_the_boundary_check_reads() -> None:
    assert set(_members(TruncationStore)) <= set(_members(ChangeStore))
    assert set(_members(EpochEnds)) <= set(_members(ChangeKafka))


def test_a_retirement_is_refused_by_the_same_boundary_check() -> None:
    assert set(_members(TruncationStore)) <= set(_members(RetirementStore))
    assert set(_members(EpochEnds)) <= set(_members(RetirementKafka))
