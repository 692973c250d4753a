"""Audit events as a Spark DataFrame: from the audit topic, from files, or from dicts.

Every reader returns the same flat frame, one row per event, with the columns of
``EVENT_SCHEMA`` (the union of the fields of every event type of schema 1, see
``sidecar/audit/events.py``; a field an event type does not have is null). Events of
another schema version are kept out and counted by ``split_schema_versions``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from sidecar.audit.events import SCHEMA_VERSION
from sidecar.config import ConfigError, KafkaSecuritySettings

EVIDENCE_SCHEMA = StructType(
    [
        StructField("source", LongType()),
        StructField("boundary", LongType()),
        StructField("committed", LongType()),
        StructField("log_start", LongType()),
        StructField("mode", StringType()),
    ]
)

EVENT_SCHEMA = StructType(
    [
        # Common to every event.
        StructField("schema", LongType()),
        StructField("type", StringType()),
        StructField("sidecar", StringType()),
        StructField("seq", LongType()),
        StructField("time", DoubleType()),
        # Record events and the consumer-side events.
        StructField("topic", StringType()),
        StructField("partition", LongType()),
        StructField("offset", LongType()),
        StructField("key", StringType()),
        StructField("generation", LongType()),
        StructField("count", LongType()),
        StructField("producer", StringType()),
        StructField("producer_seq", LongType()),
        # delivered: whether the topic promises per-key order (absent from older
        # sidecars' events: it did, as far as they said).
        StructField("ordered", BooleanType()),
        # delivered: the consuming instance's assignment (absent from older sidecars'
        # events: unknown).
        StructField("assignment", LongType()),
        StructField("group", StringType()),
        StructField("instance", StringType()),
        StructField("evidence", ArrayType(EVIDENCE_SCHEMA)),
        # barrier_phase and admin.
        StructField("kind", StringType()),
        StructField("from_generation", LongType()),
        StructField("from_count", LongType()),
        StructField("target_count", LongType()),
        StructField("phase", StringType()),
        StructField("coordinator", StringType()),
        StructField("result", StringType()),
        # consumer_truncated.
        StructField("position", LongType()),
        StructField("leader_epoch", LongType()),
        StructField("resume_at", LongType()),
        StructField("lost", LongType()),
    ]
)
EVENT_COLUMNS = tuple(field.name for field in EVENT_SCHEMA.fields)

# Kafka stamps an audit record when the sidecar's emitter sends its batch, a little
# after the event's own ``time``; the topic is read this much wider than the window,
# and the window is then applied to ``time`` exactly.
KAFKA_TIMESTAMP_MARGIN_S = 120.0


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """Event times ``start <= time < end`` in epoch seconds; None leaves that side open."""

    start: float | None = None
    end: float | None = None

    def apply(self, events: DataFrame) -> DataFrame:
        if self.start is not None:
            events = events.where(F.col("time") >= F.lit(self.start))
        if self.end is not None:
            events = events.where(F.col("time") < F.lit(self.end))
        return events


def events_from_dicts(spark: SparkSession, events: Iterable[dict[str, Any]]) -> DataFrame:
    """A frame of in-memory events (as ``sidecar.audit.events`` builds them): for tests."""
    rows = [tuple(_value(event, field.name) for field in EVENT_SCHEMA.fields) for event in events]
    return spark.createDataFrame(rows, EVENT_SCHEMA)


def _value(event: dict[str, Any], name: str) -> Any:
    value = event.get(name)
    if name == "evidence" and value is not None:
        return [tuple(item.get(f.name) for f in EVIDENCE_SCHEMA.fields) for item in value]
    if name == "time" and value is not None:
        return float(value)
    return value


def kafka_source_options(
    bootstrap: str,
    topic: str,
    settings: dict[str, str] | None = None,
    options: dict[str, str] | None = None,
) -> dict[str, str]:
    """The options of Spark's Kafka source for the audit topic, as both jobs (``audit
    run`` and ``audit stream``) read it: ``settings`` are the job's own (where to start,
    where to end), ``options`` the user's (``--kafka-option``, the secured cluster's
    ``kafka.*``), applied last so they can override anything."""
    return (
        {
            "kafka.bootstrap.servers": bootstrap,
            "subscribe": topic,
            # Records the topic's retention removed are gone either way: audit the rest
            # rather than fail (their absence can only hide anomalies, never make one).
            "failOnDataLoss": "false",
        }
        | (settings or {})
        | (options or {})
    )


def parse_events(raw: DataFrame) -> DataFrame:
    """The Kafka source's records (``value``: one event's JSON) as the flat event frame;
    records that are not events (no ``type``) are left out."""
    parsed = raw.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
    return parsed.select("e.*").where(F.col("type").isNotNull())


def read_kafka(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    window: TimeWindow,
    options: dict[str, str] | None = None,
) -> DataFrame:
    """The events of the audit topic within ``window``, with Spark's Kafka source.

    ``options`` are passed to the source as they are (e.g. ``kafka.security.protocol``).
    Needs the spark-sql-kafka package on the session (``job.build_session``).
    """
    # A partition without a record after the start timestamp reads nothing, rather than
    # failing the query (the default strategy, "error").
    settings = {"startingOffsetsByTimestampStrategy": "latest"}
    if window.start is not None:
        start_ms = int((window.start - KAFKA_TIMESTAMP_MARGIN_S) * 1000)
        settings["startingTimestamp"] = str(max(start_ms, 0))
    if window.end is not None:
        settings["endingTimestamp"] = str(int((window.end + KAFKA_TIMESTAMP_MARGIN_S) * 1000))
    reader = spark.read.format("kafka").options(
        **kafka_source_options(bootstrap, topic, settings, options)
    )
    return window.apply(parse_events(reader.load()))


def read_kafka_stream(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    settings: dict[str, str],
    options: dict[str, str] | None = None,
) -> DataFrame:
    """The audit topic's records as a stream (``spark.readStream``): the Kafka source's
    columns, ``value`` one event's JSON. The live audit reads the JSON in the driver
    (``live_checks.parse_events``), where its checks run.

    ``settings`` are the stream's own source settings (``startingOffsets``,
    ``maxOffsetsPerTrigger``); ``options`` as for ``read_kafka``."""
    reader = spark.readStream.format("kafka").options(
        **kafka_source_options(bootstrap, topic, settings, options)
    )
    return reader.load()


def read_files(
    spark: SparkSession, paths: Sequence[str], window: TimeWindow, file_format: str = "auto"
) -> DataFrame:
    """Events from JSON-lines files (one event per line) or Parquet files of events.

    ``file_format`` "auto" takes Parquet for paths ending in ``.parquet`` or directories
    holding ``*.parquet`` files, JSON lines otherwise. Raises ValueError for an unknown
    format.
    """
    parquet = [p for p in paths if _is_parquet(p, file_format)]
    json_lines = [p for p in paths if p not in parquet]
    frames: list[DataFrame] = []
    if json_lines:
        frames.append(spark.read.schema(EVENT_SCHEMA).json(list(json_lines)))
    if parquet:
        frames.append(conform(spark.read.parquet(*parquet)))
    if not frames:
        raise ValueError("no input files")
    events = frames[0]
    for frame in frames[1:]:
        events = events.unionByName(frame)
    return window.apply(events.where(F.col("type").isNotNull()))


def all_parquet(paths: Sequence[str], file_format: str = "auto") -> bool:
    """Whether ``read_files`` reads every one of ``paths`` as Parquet."""
    return all(_is_parquet(path, file_format) for path in paths)


def _is_parquet(path: str, file_format: str) -> bool:
    if file_format not in {"auto", "json", "parquet"}:
        raise ValueError(f"unknown input format {file_format!r} (auto, json, parquet)")
    if file_format != "auto":
        return file_format == "parquet"
    candidate = Path(path)
    if candidate.suffix == ".parquet":
        return True
    return candidate.is_dir() and any(candidate.glob("*.parquet"))


def conform(frame: DataFrame) -> DataFrame:
    """``frame`` with exactly the columns and types of ``EVENT_SCHEMA`` (missing: null).

    Struct fields are matched by name (a Parquet file written from inferred JSON has
    the evidence fields in alphabetical order).
    """
    present = {field.name: field.dataType for field in frame.schema.fields}
    columns = []
    for field in EVENT_SCHEMA.fields:
        if field.name not in present:
            value = F.lit(None).cast(field.dataType)
        elif field.name == "evidence":
            value = _conform_evidence(F.col("evidence"), present["evidence"])
        else:
            value = F.col(field.name).cast(field.dataType)
        columns.append(value.alias(field.name))
    return frame.select(*columns)


def _conform_evidence(evidence: Column, found: DataType) -> Column:
    names = set()
    if isinstance(found, ArrayType) and isinstance(found.elementType, StructType):
        names = {field.name for field in found.elementType.fields}

    def item(entry: Column) -> Column:
        return F.struct(
            *[
                (entry[field.name] if field.name in names else F.lit(None))
                .cast(field.dataType)
                .alias(field.name)
                for field in EVIDENCE_SCHEMA.fields
            ]
        )

    return F.transform(evidence, item)


def split_schema_versions(events: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(events of the schema this job reads, every other event)."""
    known = F.col("schema") == F.lit(SCHEMA_VERSION)
    return events.where(known), events.where(~known | F.col("schema").isNull())


def spark_kafka_options(security: KafkaSecuritySettings) -> dict[str, str]:
    """The sidecar's ``kafka.security`` as options of Spark's Kafka source (``kafka.*``,
    the Java client's names), so the job reads a secured audit topic as the sidecars
    write it. PEM files are given as PEM (``ssl.*.type=PEM``); the client certificate and
    key as their text, since the Java client takes a PEM key store only as one file or
    as values, the key decrypted (the JVM cannot read its encryption). Raises
    ConfigError when a secret file cannot be read.

    OAUTHBEARER uses the Java client's own login handler: its token endpoint (or the
    token file, as a ``file:`` URL) must be allowed by the driver's and executors' JVM
    property ``org.apache.kafka.sasl.oauthbearer.allowed.urls`` (Kafka 4 clients)."""
    options = {"kafka.security.protocol": security.protocol}
    if security.tls:
        if security.ssl_cafile:
            options["kafka.ssl.truststore.type"] = "PEM"
            options["kafka.ssl.truststore.location"] = security.ssl_cafile
        if not security.ssl_check_hostname:
            options["kafka.ssl.endpoint.identification.algorithm"] = ""
        if security.ssl_certfile:
            options["kafka.ssl.keystore.type"] = "PEM"
            options["kafka.ssl.keystore.certificate.chain"] = _read(
                "kafka.security.ssl_certfile", security.ssl_certfile
            )
            options["kafka.ssl.keystore.key"] = _unencrypted_key(security)
    if not security.sasl:
        return options
    options["kafka.sasl.mechanism"] = security.sasl_mechanism
    if security.sasl_mechanism == "OAUTHBEARER":
        module = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
        options["kafka.sasl.login.callback.handler.class"] = (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
        )
        if security.oauth_token_file:
            options["kafka.sasl.oauthbearer.token.endpoint.url"] = (
                Path(security.oauth_token_file).resolve().as_uri()
            )
            options["kafka.sasl.jaas.config"] = f"{module} required;"
            return options
        options["kafka.sasl.oauthbearer.token.endpoint.url"] = security.oauth_token_endpoint
        fields = [
            f"clientId={_jaas(security.oauth_client_id)}",
            f"clientSecret={_jaas(security.client_secret())}",
        ]
        if security.oauth_scope:
            fields.append(f"scope={_jaas(security.oauth_scope)}")
        options["kafka.sasl.jaas.config"] = f"{module} required {' '.join(fields)};"
        return options
    module = (
        "org.apache.kafka.common.security.plain.PlainLoginModule"
        if security.sasl_mechanism == "PLAIN"
        else "org.apache.kafka.common.security.scram.ScramLoginModule"
    )
    options["kafka.sasl.jaas.config"] = (
        f"{module} required username={_jaas(security.sasl_username)} "
        f"password={_jaas(security.password())};"
    )
    return options


def _unencrypted_key(security: KafkaSecuritySettings) -> str:
    """The client key as unencrypted PKCS#8 PEM: the JVM's key factories cannot read
    the PBES2 encryption OpenSSL and ``cryptography`` write (``PBES2 SecretKeyFactory
    not available``). It is as secret as the password option beside it."""
    key_pem = _read("kafka.security.ssl_keyfile", security.ssl_keyfile).encode()
    password = security.key_password()
    try:
        key = serialization.load_pem_private_key(key_pem, password.encode() if password else None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"kafka.security.ssl_keyfile: cannot read {security.ssl_keyfile} with "
            "kafka.security.ssl_key_password"
        ) from exc
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _jaas(value: str) -> str:
    """A JAAS option value: quoted, with quotes and backslashes escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _read(name: str, path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {path}: {exc.strerror}") from exc
