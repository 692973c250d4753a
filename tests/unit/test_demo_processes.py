"""The demo's sidecar processes get their settings as environment variables
(``ordered_dev.demo.processes.environment``): what they load is what the demo decided."""

from __future__ import annotations

from dataclasses import replace

from ordered_dev.demo.processes import environment
from sidecar.config import ENV_PREFIX, Secret, Settings, load_settings


def test_the_environment_loads_back_as_the_same_settings_nested_sections_included() -> None:
    settings = Settings(sidecar_id="demo-1")
    security = replace(
        settings.kafka.security,
        protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="demo",
        sasl_password=Secret("s3cret"),
    )
    settings = replace(settings, kafka=replace(settings.kafka, security=security))
    env = {k: v for k, v in environment(settings).items() if k.startswith(ENV_PREFIX)}
    loaded = load_settings(None, environ=env)
    assert loaded.kafka.security.protocol == "SASL_PLAINTEXT"
    assert loaded.kafka.security.sasl_password.reveal() == "s3cret"
    assert loaded.http == settings.http
    assert loaded.sidecar_id == "demo-1"
