"""``sidecar.config.clusters``: the ``kafka`` section is shown without the secrets an
aiokafka setting passed through may hold."""

from __future__ import annotations

from sidecar.config import KafkaSettings


def test_pass_through_settings_that_name_a_secret_are_redacted() -> None:
    settings = KafkaSettings(
        client={
            "linger_ms": 5,
            "sasl_kerberos_service_name": "kafka",
            "SSL_KEY_PASSWORD": "k3y",
            "some_token": "t0k",
            "client_secret_x": "s3c",
            "api_key": "a9i",
        }
    )
    shown = repr(settings)
    assert "'linger_ms': 5" in shown
    assert "'sasl_kerberos_service_name': 'kafka'" in shown
    for secret in ("k3y", "t0k", "s3c", "a9i"):
        assert secret not in shown
    assert "'SSL_KEY_PASSWORD': '***'" in shown
    # Shown redacted, kept as given: aiokafka gets the value.
    assert settings.client["SSL_KEY_PASSWORD"] == "k3y"


def test_the_kafka_section_names_where_it_connects() -> None:
    shown = repr(KafkaSettings(bootstrap_servers="b1:9092,b2:9092", client_id="orders"))
    assert "bootstrap_servers='b1:9092,b2:9092'" in shown
    assert "client_id='orders'" in shown
