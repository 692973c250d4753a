"""``sidecar.config.operations``: the ``metrics``, ``audit``, ``process``, ``startup``,
``log`` and ``faults`` sections. Their checks as they are loaded are
``test_validation``'s and their defaults are pinned by
``tests/unit/test_settings_table.py``; here: the choices they offer and what their
defaults promise (nothing injected, nothing audited, a sane collector threshold)."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from sidecar.config import (
    LOG_FORMATS,
    LOG_LEVELS,
    MIN_GC_YOUNG_THRESHOLD,
    AuditSettings,
    FaultSettings,
    LogSettings,
    MetricsSettings,
    ProcessSettings,
    StartupSettings,
)
from sidecar.config.validation import EVENT_LOOPS
from sidecar.core import names


def test_every_log_level_is_one_the_logging_module_knows() -> None:
    # ``sidecar serve`` hands the level to ``logging.basicConfig`` by name.
    known = logging.getLevelNamesMapping()
    assert [known[level] for level in LOG_LEVELS] == [
        logging.DEBUG,
        logging.INFO,
        logging.WARNING,
        logging.ERROR,
    ]


def test_logs_default_to_readable_lines_at_info() -> None:
    log = LogSettings()
    assert LOG_FORMATS == ("text", "json")
    assert log.format == "text"
    assert log.level == "INFO"


def test_no_fault_is_injected_by_default() -> None:
    faults = FaultSettings()
    for field in dataclasses.fields(faults):
        assert not getattr(faults, field.name), f"faults.{field.name} is on by default"


def test_the_audit_is_off_by_default_and_samples_every_key_when_on() -> None:
    audit = AuditSettings()
    assert audit.enabled is False
    assert audit.sample_rate == 1.0
    assert names.is_topic_name(audit.topic)
    assert 0 < audit.batch_size <= audit.buffer_size


def test_the_collector_threshold_is_raised_and_stays_above_the_floor() -> None:
    process = ProcessSettings()
    # Python's own young-generation threshold is 700; 0 would switch the collector off.
    assert process.gc_young_threshold > 700
    assert process.gc_young_threshold >= MIN_GC_YOUNG_THRESHOLD > 0
    assert process.event_loop == "auto"
    assert process.event_loop in EVENT_LOOPS


def test_startup_starts_with_the_shorter_pause() -> None:
    startup = StartupSettings()
    assert 0 < startup.retry_initial_s <= startup.retry_max_s


def test_metric_labels_are_bounded_by_default() -> None:
    metrics = MetricsSettings()
    assert metrics.max_topic_labels > 0
    assert metrics.max_group_labels > 0


@pytest.mark.parametrize(
    "section",
    [
        MetricsSettings(),
        AuditSettings(),
        ProcessSettings(),
        StartupSettings(),
        LogSettings(),
        FaultSettings(),
    ],
)
def test_the_sections_are_frozen(section: object) -> None:
    first = dataclasses.fields(section)[0].name  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(section, first, getattr(section, first))
