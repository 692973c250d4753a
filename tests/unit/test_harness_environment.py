"""The harness starts ``sidecar serve`` processes with their settings as environment
variables (``settings_environment``): what it sets must be what the process loads, or a
test runs the sidecar with defaults it did not ask for and cannot tell."""

from __future__ import annotations

import dataclasses

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import settings_environment, settings_for
from sidecar.config import ChangeSettings, ConsumerSettings, ProduceSettings
from sidecar.config.loading import load_settings

CLUSTER = ClusterEndpoints("local", "127.0.0.1:9092", "127.0.0.1:2181", 3)


def test_the_sections_the_harness_sets_reach_the_process() -> None:
    settings = dataclasses.replace(
        settings_for(CLUSTER, "/root", "env"),
        changes=ChangeSettings(compaction_interval_s=8.5, housekeeping_interval_s=0.75),
        consumer=ConsumerSettings(gate_recheck_s=0.125),
        produce=ProduceSettings(hold_timeout_s=12.0, barrier_timeout_s=20.0),
    )
    loaded = load_settings(environ=settings_environment(settings))
    for section in ("kafka", "zookeeper", "http", "produce", "changes", "consumer", "faults"):
        mine, theirs = getattr(settings, section), getattr(loaded, section)
        if section == "kafka":  # aiokafka's own settings are not passed (a dict)
            mine, theirs = (
                dataclasses.replace(mine, client={}),
                dataclasses.replace(theirs, client={}),
            )
        assert theirs == mine, section
    assert loaded.sidecar_id == settings.sidecar_id


def test_a_default_left_alone_can_come_from_the_environment() -> None:
    settings = dataclasses.replace(
        settings_for(CLUSTER, "/root", "env"), changes=ChangeSettings(warm_within_s=0.5)
    )
    environment = settings_environment(settings)
    assert environment["ORDERED_SIDECAR__CHANGES__WARM_WITHIN_S"] == "0.5"
    assert "ORDERED_SIDECAR__CHANGES__COMPACTION_INTERVAL_S" not in environment
    outside = {"ORDERED_SIDECAR__CHANGES__COMPACTION_INTERVAL_S": "15"}
    loaded = load_settings(environ=outside | environment)
    assert loaded.changes == ChangeSettings(warm_within_s=0.5, compaction_interval_s=15.0)
