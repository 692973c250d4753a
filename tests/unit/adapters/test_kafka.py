"""The Kafka adapter's hold on aiokafka internals it depends on."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest
from aiokafka.producer import sender as aiokafka_sender

from sidecar.adapters.kafka import set_transaction_poll


@pytest.fixture
def restore_backoff_override() -> Iterator[None]:
    before = aiokafka_sender.BACKOFF_OVERRIDE
    yield
    aiokafka_sender.BACKOFF_OVERRIDE = before


def test_aiokafka_still_polls_a_busy_coordinator_with_the_constant_set() -> None:
    # If aiokafka renames the constant or stops returning it for CONCURRENT_TRANSACTIONS,
    # the setting would silently do nothing: fail here instead.
    handler = inspect.getsource(aiokafka_sender.AddPartitionsToTxnHandler.handle_response)
    assert "ConcurrentTransactions" in handler
    assert "return BACKOFF_OVERRIDE" in handler


@pytest.mark.usefixtures("restore_backoff_override")
def test_the_transaction_poll_setting_reaches_aiokafka() -> None:
    set_transaction_poll(5.0)
    assert aiokafka_sender.BACKOFF_OVERRIDE == 0.005
    set_transaction_poll(2.0)
    assert aiokafka_sender.BACKOFF_OVERRIDE == 0.002
