"""The job end to end on files, its command line, and its Prometheus arithmetic."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from ordered_audit import checks, prometheus
from ordered_audit.job import (
    AuditConfig,
    AuditError,
    SparkOptions,
    config_from_args,
    parse_time,
    run_audit,
    session_settings,
    stream_config_from_args,
)
from ordered_audit.stream import run_stream_command
from sidecar.cli import build_parser, main
from tests.audit.history import History, injected, write_json_lines

# The job on files -------------------------------------------------------------------


def test_the_job_writes_tables_summary_report_and_charts(
    spark: SparkSession, tmp_path: Path
) -> None:
    scenario = injected()
    events = scenario.history.events
    half = len(events) // 2
    # Two inputs, one of them Parquet: both readers, one event table.
    first = write_json_lines(History(events=events[:half]), tmp_path / "a.jsonl")
    parquet = tmp_path / "b.parquet"
    second = write_json_lines(History(events=events[half:]), tmp_path / "b.jsonl")
    spark.read.json(str(second)).write.parquet(str(parquet))
    # An event of a future schema version is counted, not read.
    other = tmp_path / "c.jsonl"
    other.write_text(json.dumps({"schema": 2, "type": "delivered", "time": 1.0}) + "\n")
    out = tmp_path / "out"
    result = run_audit(
        spark,
        AuditConfig(out=out, inputs=(str(first), str(parquet), str(other)), bucket_s=0.5),
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["anomalies"]["total"] == result.anomaly_count == 2
    assert summary["anomalies"]["by_kind"] == {kind: 0 for kind in checks.KINDS} | {
        checks.UNAUDITED_DELIVERY: 1,
        checks.WRITTEN_ACROSS_BARRIER: 1,
    }
    assert summary["events"]["total"] == len(events)
    assert summary["events"]["other_schema"] == 1
    assert summary["prometheus"] is None
    (operation,) = summary["operations"]
    assert (operation["kind"], operation["from_count"], operation["target_count"]) == (
        "expand",
        2,
        3,
    )
    assert operation["keys_moved"] == len(scenario.moved_keys)
    assert operation["violations"] == 2
    tables = {
        name: spark.read.parquet(str(out / name)) for name in ("anomalies", "operations", "buckets")
    }
    assert tables["anomalies"].count() == 2
    assert tables["operations"].count() == 1
    buckets = tables["buckets"].collect()
    assert sum(row["violations"] for row in buckets) == 2
    assert (
        sum(row["produce_acked"] for row in buckets)
        == summary["events"]["by_type"]["produce_acked"]
    )
    report = (out / "report.md").read_text()
    assert "**2 anomalies**" in report
    assert "| unaudited_delivery | 1 |" in report
    assert "expand 2→3" in report
    for chart in ("violations.png", "gate_stalls.png"):
        assert (out / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({chart})" in report
    textfile = (out / "anomalies.prom").read_text()
    assert 'sidecar_audit_anomalies_total{kind="written_across_barrier"} 1' in textfile


def test_a_time_window_limits_the_events(spark: SparkSession, tmp_path: Path) -> None:
    scenario = injected()
    events = scenario.history.events
    path = write_json_lines(scenario.history, tmp_path / "events.jsonl")
    # Up to (not including) the bypassed delivery: the clean part only.
    cut = next(e["time"] for e in events if e["type"] == "delivered" and e["producer"] is None)
    out = tmp_path / "out"
    result = run_audit(spark, AuditConfig(out=out, inputs=(str(path),), end=cut))
    assert result.anomaly_count == 0
    assert result.summary["window"]["end"] == cut
    assert result.summary["events"]["total"] == sum(1 for e in events if e["time"] < cut)


@pytest.mark.parametrize("file_format", ["json", "parquet"])
def test_events_read_twice_count_once(
    spark: SparkSession, tmp_path: Path, file_format: str
) -> None:
    scenario = injected()
    events = scenario.history.events
    whole = write_json_lines(scenario.history, tmp_path / "events.jsonl")
    # A copy of the first half of the topic beside the whole of it.
    copy = write_json_lines(History(events=events[: len(events) // 2]), tmp_path / "copy.jsonl")
    inputs = [str(whole), str(copy)]
    if file_format == "parquet":
        # Parquet is read again by each action, not cached: the same result.
        for number, path in enumerate(list(inputs)):
            inputs[number] = str(tmp_path / f"{number}.parquet")
            spark.read.json(path).write.parquet(inputs[number])
    out = tmp_path / "out"
    result = run_audit(spark, AuditConfig(out=out, inputs=tuple(inputs)))
    assert result.summary["events"]["total"] == len(events)
    assert result.anomaly_count == 2
    assert spark.read.parquet(str(out / "anomalies")).count() == 2


# The command line --------------------------------------------------------------------


def test_the_audit_command_is_registered_and_checks_its_arguments(tmp_path: Path) -> None:
    parser = build_parser()
    args = parser.parse_args(
        [
            "audit",
            "run",
            "--bootstrap",
            "127.0.0.1:9092",
            "--topic",
            "audit",
            "--from",
            "2026-01-01T00:00:00Z",
            "--to",
            "1767225660",
            "--prometheus",
            "http://127.0.0.1:9090",
            "--out",
            str(tmp_path),
            "--master",
            "spark://127.0.0.1:7077",
            "--conf",
            "spark.executor.memory=512m",
            "--kafka-option",
            "kafka.security.protocol=PLAINTEXT",
        ]
    )
    config, options = config_from_args(args)
    assert (config.start, config.end) == (1767225600.0, 1767225660.0)
    assert config.kafka_options == {"kafka.security.protocol": "PLAINTEXT"}
    assert options.master == "spark://127.0.0.1:7077"
    assert options.conf == {"spark.executor.memory": "512m"}
    neither = parser.parse_args(["audit", "run", "--out", str(tmp_path)])
    with pytest.raises(AuditError, match="either --bootstrap"):
        config_from_args(neither)
    backwards = parser.parse_args(
        ["audit", "run", "--input", "x", "--from=-1m", "--to=-2m", "--out", str(tmp_path)]
    )
    with pytest.raises(AuditError, match="after --from"):
        config_from_args(backwards)


def test_the_stream_command_is_registered_and_checks_its_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = build_parser()
    base = ["audit", "stream", "--bootstrap", "127.0.0.1:9092", "--checkpoint", str(tmp_path)]
    args = parser.parse_args(
        [
            *base,
            "--topic",
            "audit",
            "--kafka-option",
            "kafka.security.protocol=PLAINTEXT",
            "--starting-offsets",
            "latest",
            "--max-offsets-per-trigger",
            "5000",
            "--metrics-port",
            "0",
            "--master",
            "spark://127.0.0.1:7077",
        ]
    )
    assert args.handler is run_stream_command
    config, options = stream_config_from_args(args)
    assert (config.bootstrap, config.topic, config.checkpoint) == (
        "127.0.0.1:9092",
        "audit",
        tmp_path,
    )
    assert config.kafka_options == {"kafka.security.protocol": "PLAINTEXT"}
    assert config.source_settings() == {"startingOffsets": "latest", "maxOffsetsPerTrigger": "5000"}
    assert (config.metrics_host, config.metrics_port) == ("127.0.0.1", 0)
    assert options.master == "spark://127.0.0.1:7077"
    for wrong, message in [
        (["--trigger", "0"], "--trigger"),
        (["--horizon", "-1"], "--horizon"),
        (["--metrics-port", "70000"], "--metrics-port"),
        (["--max-topic-labels", "0"], "--max-topic-labels"),
        (["--stop-grace", "-1"], "--stop-grace"),
    ]:
        with pytest.raises(AuditError, match=message):
            stream_config_from_args(parser.parse_args([*base, *wrong]))
    with pytest.raises(SystemExit):
        parser.parse_args(["audit", "stream", "--bootstrap", "127.0.0.1:9092"])
    # A checkpoint whose Spark part was deleted and the checks' state kept: refused.
    (tmp_path / "state").mkdir(parents=True)
    (tmp_path / "state" / "3.json").write_text('{"newest": null}')
    with pytest.raises(AuditError, match="keep or delete the checkpoint whole"):
        stream_config_from_args(parser.parse_args(base))
    (tmp_path / "spark" / "offsets").mkdir(parents=True)
    (tmp_path / "spark" / "offsets" / "3").write_text("v1")
    stream_config_from_args(parser.parse_args(base))
    # A checkpoint of the earlier version (a Parquet directory per batch): refused, not
    # read as an empty state that would start the counters and the checks from nothing.
    (tmp_path / "state" / "2").mkdir()
    with pytest.raises(AuditError, match="start on a new checkpoint"):
        stream_config_from_args(parser.parse_args(base))
    # The command refuses them before it starts Spark.
    assert main([*base, "--trigger", "-1"]) == 2
    assert "--trigger must be positive" in capsys.readouterr().err


def test_times_parse_in_every_accepted_form() -> None:
    now = 1_800_000_000.0
    assert parse_time("now", now) == now
    assert parse_time("-15m", now) == now - 900
    assert parse_time("-1.5h", now) == now - 5400
    assert parse_time("1700000000.5", now) == 1_700_000_000.5
    assert parse_time("2026-01-01T00:00:00", now) == 1767225600.0
    assert parse_time("2026-01-01T01:00:00+01:00", now) == 1767225600.0
    with pytest.raises(ValueError, match="Invalid isoformat"):
        parse_time("yesterday", now)


def test_the_session_is_embedded_quiet_and_local_by_default() -> None:
    settings = session_settings(SparkOptions(), kafka=True)
    assert settings["spark.master"] == "local[*]"
    assert settings["spark.ui.enabled"] == "false"
    assert settings["spark.driver.bindAddress"] == settings["spark.driver.host"] == "127.0.0.1"
    assert int(settings["spark.sql.shuffle.partitions"]) <= 8
    import pyspark

    assert settings["spark.jars.packages"] == (
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"
    )
    assert settings["spark.jars.ivy"].endswith("spark-ivy")
    assert "spark.jars.packages" not in session_settings(SparkOptions(), kafka=False)
    # Without the query context's five py4j round trips a column function.
    assert settings["spark.python.sql.dataFrameDebugging.enabled"] == "false"
    overridden = session_settings(SparkOptions(conf={"spark.ui.enabled": "true"}), kafka=False)
    assert overridden["spark.ui.enabled"] == "true"


def test_the_running_session_skips_the_query_context(spark: SparkSession) -> None:
    from pyspark.errors.utils import is_debugging_enabled

    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    # What PySpark's column functions read before each call (cached for the process).
    assert not is_debugging_enabled()


# Prometheus arithmetic ---------------------------------------------------------------


def series(name: str, points: list[tuple[float, float]], **labels: object) -> prometheus.Series:
    return prometheus.Series(
        name,
        str(labels.get("instance", "a")),
        str(labels.get("topic", "t")),
        labels.get("le"),  # type: ignore[arg-type]
        tuple(points),
        existed_at_start=bool(labels.get("existed", True)),
    )


def test_increase_counts_new_series_from_zero_and_survives_resets() -> None:
    points = [(0.0, 5.0), (1.0, 5.0), (2.0, 7.0), (3.0, 1.0), (4.0, 4.0)]
    assert prometheus.increase(series("fenced", points), 0, 10) == 2 + 1 + 3
    assert prometheus.increase(series("fenced", points), 2.5, 10) == 1 + 3
    assert prometheus.increase(series("fenced", points), 0, 2) == 0
    appeared = series("fenced", [(3.0, 1.0), (4.0, 1.0)], existed=False)
    assert prometheus.increase(appeared, 0, 10) == 1  # the first observation counts


def test_bucket_quantiles_follow_histogram_quantile() -> None:
    buckets = [(0.1, 0.0), (0.5, 90.0), (1.0, 100.0), (math.inf, 100.0)]
    assert prometheus.bucket_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * 50 / 90)
    assert prometheus.bucket_quantile(0.99, buckets) == pytest.approx(0.5 + 0.5 * 9 / 10)
    assert prometheus.largest_bucket(buckets) == 1.0
    overflow = [(1.0, 0.0), (math.inf, 3.0)]
    assert prometheus.bucket_quantile(0.99, overflow) == 1.0
    assert prometheus.largest_bucket(overflow) == 1.0
    assert prometheus.bucket_quantile(0.99, [(1.0, 0.0), (math.inf, 0.0)]) is None


def test_period_stats_per_topic_and_over_all_topics() -> None:
    hold = [
        series("hold_seconds", [(10.0, 1.0)], le=0.25, existed=False),
        series("hold_seconds", [(10.0, 2.0)], le=0.5, existed=False),
        series("hold_seconds", [(10.0, 2.0)], le=math.inf, existed=False),
        series("held_requests", [(9.0, 3.0), (10.0, 0.0)]),
        series("held_requests", [(9.0, 7.0)], topic="other"),
        series("fenced", [(0.0, 0.0), (11.0, 2.0)], instance="b"),
    ]
    stats = prometheus.period_stats(hold, 5, 15, "t")
    assert stats.holds == 2
    assert stats.hold_max_s == 0.5
    assert stats.hold_p99_s is not None
    assert 0.25 < stats.hold_p99_s <= 0.5
    assert stats.held_max == 3
    assert stats.fenced == 2
    assert stats.gate_waits is None
    assert prometheus.period_stats(hold, 5, 15).held_max == 7
    assert prometheus.period_stats(hold, 20, 30, "t").holds == 0


def test_a_query_range_matrix_parses_into_series() -> None:
    result = [
        {"metric": {"topic": "t", "le": "+Inf", "instance": "a"}, "values": [[12, "1"], [13, "2"]]},
        {"metric": {"topic": "t"}, "values": [[10, "NaN"], [11, "3"]]},
    ]
    parsed = prometheus.parse_matrix("hold_seconds", result, start=10.0, step=1.0)
    assert parsed[0].le == math.inf
    assert parsed[0].existed_at_start is False
    assert parsed[1].points == ((11.0, 3.0),)
    assert parsed[1].instance is None


def test_bucket_stats_agree_with_period_stats_bucket_by_bucket() -> None:
    rng = random.Random(7)
    every: list[prometheus.Series] = []
    for instance in ("a", "b"):
        for topic in ("t", "u"):
            value = 0.0
            counts: list[tuple[float, float]] = []
            for second in range(5, 60):
                value = 0.0 if rng.random() < 0.05 else value + rng.choice([0, 0, 1, 2])
                counts.append((float(second), value))
            every.append(series("fenced", counts, instance=instance, topic=topic, existed=False))
            for le in (0.5, 1.0, math.inf):
                bucket_points = [(t, v * le if not math.isinf(le) else v * 2) for t, v in counts]
                every.append(series("hold_seconds", bucket_points, le=le, topic=topic))
        every.append(
            series("held_requests", [(float(t), float(rng.randint(0, 5))) for t in range(60)])
        )
    per_bucket = prometheus.bucket_stats(every, 0.0, 7.0, 9)
    for index, stats in enumerate(per_bucket):
        assert stats == prometheus.period_stats(every, index * 7.0, index * 7.0 + 7.0)


def test_the_sidecars_security_becomes_the_kafka_source_options(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text('pa"ss\n')
    cafile = tmp_path / "ca.pem"
    cafile.write_text("-----BEGIN CERTIFICATE-----\n")
    config = tmp_path / "sidecar.toml"
    config.write_text(
        "[kafka.security]\n"
        'protocol = "SASL_SSL"\n'
        f'ssl_cafile = "{cafile}"\n'
        'sasl_mechanism = "SCRAM-SHA-256"\n'
        'sasl_username = "auditor"\n'
        f'sasl_password_file = "{password}"\n'
    )
    args = build_parser().parse_args(
        [
            "audit",
            "run",
            "--bootstrap",
            "127.0.0.1:9093",
            "--sidecar-config",
            str(config),
            "--out",
            str(tmp_path),
            "--kafka-option",
            "kafka.client.id=audit",
        ]
    )
    options, _ = config_from_args(args)
    assert options.kafka_options == {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": str(cafile),
        "kafka.sasl.mechanism": "SCRAM-SHA-256",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
        'required username="auditor" password="pa\\"ss";',
        "kafka.client.id": "audit",
    }


def test_a_client_certificate_and_oauth_become_java_client_options(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    from ordered_audit.sources import spark_kafka_options
    from ordered_dev.devcluster.certificates import CertificateAuthority
    from sidecar.config import KafkaSecuritySettings, Secret

    client = CertificateAuthority().issue(tmp_path, "auditor", server=False, key_password="k3y")
    options = spark_kafka_options(
        KafkaSecuritySettings(
            protocol="SSL",
            ssl_certfile=str(client.certfile),
            ssl_keyfile=str(client.keyfile),
            ssl_key_password=Secret("k3y"),
            ssl_check_hostname=False,
        )
    )
    assert options["kafka.ssl.keystore.type"] == "PEM"
    assert options["kafka.ssl.keystore.certificate.chain"] == client.certfile.read_text()
    # Decrypted for the JVM, and the same key.
    key = serialization.load_pem_private_key(options["kafka.ssl.keystore.key"].encode(), None)
    original = serialization.load_pem_private_key(client.keyfile.read_bytes(), b"k3y")
    assert key.public_key().public_numbers() == original.public_key().public_numbers()  # type: ignore[union-attr]
    assert "kafka.ssl.key.password" not in options
    assert options["kafka.ssl.endpoint.identification.algorithm"] == ""

    oauth = spark_kafka_options(
        KafkaSecuritySettings(
            protocol="SASL_SSL",
            sasl_mechanism="OAUTHBEARER",
            oauth_token_endpoint="https://login.example.com/token",
            oauth_client_id="auditor",
            oauth_client_secret=Secret("s3cret"),
            oauth_scope="kafka",
        )
    )
    assert oauth["kafka.sasl.oauthbearer.token.endpoint.url"] == "https://login.example.com/token"
    assert oauth["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
        'clientId="auditor" clientSecret="s3cret" scope="kafka";'
    )
