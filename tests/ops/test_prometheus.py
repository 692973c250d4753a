"""Prometheus files: the alert rules pass `promtool check rules` and the unit tests in
prometheus/tests/ (`promtool test rules`), every alert is tested both firing and not
firing, the scrape configurations pass `promtool check config`, and every metric they
name is one the sidecar exports.

promtool comes from Debian's prometheus package (`./run test` installs it); a missing
promtool fails these tests with that hint, it never skips them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from sidecar.inject.patch import CONTAINER_NAME, InjectConfig, sidecar_container
from tests.ops.support import (
    AUDIT_JOB_METRICS,
    PROMETHEUS_DIR,
    exported_metric_names,
    metric_names_in,
    require_tool,
)

ALERTS = PROMETHEUS_DIR / "alerts.yml"
RULE_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))


def promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("promtool"), *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        timeout=120,
    )


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_alert_rules_pass_promtool_check() -> None:
    result = promtool("check", "rules", ALERTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_alert_unit_tests_pass() -> None:
    assert RULE_TESTS, "no prometheus/tests/*.yml"
    result = promtool("test", "rules", *RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS)


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for path in RULE_TESTS:
        document = yaml.safe_load(path.read_text())
        assert document["rule_files"] == ["../alerts.yml"], path
        for case in document["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - silent == set(), "alerts never tested not firing"
    assert (firing | silent) <= names, "tests name alerts that do not exist"


def test_the_alerts_the_issue_asks_for_exist() -> None:
    expressions = {rule["alert"]: rule["expr"] for rule in alert_rules()}
    wanted = {
        "OrderedSidecarProducesFenced": "sidecar_produce_fenced_total",
        "OrderedSidecarGateStalled": "sidecar_gated_partitions",
        "OrderedSidecarChangeRolledBack": 'result="rolled_back"',
        "OrderedSidecarAuditAnomalies": "sidecar_audit_anomalies_total",
        "OrderedSidecarAuditEventsDropped": "sidecar_audit_events_dropped_total",
        "OrderedSidecarZooKeeperDisconnected": "sidecar_zookeeper_connected == 0",
    }
    for alert, fragment in wanted.items():
        assert fragment in expressions[alert], alert


def test_alerts_name_only_metrics_the_sidecar_exports() -> None:
    known = exported_metric_names() | AUDIT_JOB_METRICS
    for rule in alert_rules():
        promql_parser.parse(rule["expr"])  # raises ValueError when it does not parse
        unknown = metric_names_in(rule["expr"]) - known
        assert not unknown, f"{rule['alert']} names unknown metrics {unknown}"
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
        assert rule["annotations"]["description"]


def test_the_static_scrape_config_passes_promtool(tmp_path: Path) -> None:
    result = promtool("check", "config", "prometheus-static.yml", cwd=PROMETHEUS_DIR)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_kubernetes_scrape_config_passes_promtool_and_keeps_the_sidecar(
    tmp_path: Path,
) -> None:
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus-kubernetes.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    # Debian's Prometheus is built without Kubernetes discovery, so promtool rejects the
    # key itself: check everything else (relabelling included) with static targets.
    checked = dict(job)
    del checked["kubernetes_sd_configs"]
    checked["static_configs"] = [{"targets": ["127.0.0.1:8081"]}]
    config["scrape_configs"] = [checked]
    config["rule_files"] = [str(ALERTS)]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = promtool("check", "config", path)
    assert result.returncode == 0, result.stdout + result.stderr
    # The keep rule matches the container and port the sidecar is injected with.
    keep = job["relabel_configs"][0]
    assert keep["action"] == "keep"
    assert keep["source_labels"] == [
        "__meta_kubernetes_pod_container_name",
        "__meta_kubernetes_pod_container_port_name",
    ]
    port_name = sidecar_container(InjectConfig(image="i"))["ports"][0]["name"]
    assert keep["regex"] == f"{CONTAINER_NAME};{port_name}"


@pytest.mark.parametrize("name", ["prometheus-kubernetes.yml", "prometheus-static.yml"])
def test_both_configs_load_the_alerts_and_name_the_job_the_alerts_use(name: str) -> None:
    config = yaml.safe_load((PROMETHEUS_DIR / name).read_text())
    assert config["rule_files"] == ["alerts.yml"]
    assert [job["job_name"] for job in config["scrape_configs"]] == ["ordered-sidecar"]
    down = next(rule for rule in alert_rules() if rule["alert"] == "OrderedSidecarDown")
    assert 'job="ordered-sidecar"' in down["expr"]
