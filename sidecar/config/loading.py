"""Loading the settings: from an optional TOML file, then the environment variables
``ORDERED_SIDECAR__<SECTION>__<KEY>`` (the environment wins), each value converted to its
field's type, each section checked (``sidecar.config.validation``) and then the whole
(``Settings.validate``)."""

from __future__ import annotations

import os
import socket
import tomllib
import uuid
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from sidecar.config.errors import ConfigError
from sidecar.config.security import Secret
from sidecar.config.settings import _SECTIONS, Settings
from sidecar.config.validation import _validate

ENV_PREFIX = "ORDERED_SIDECAR__"


def default_sidecar_id() -> str:
    """Host name plus a short random suffix: unique per process, readable in ZooKeeper."""
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


def load_settings(path: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Build the settings from ``path`` (TOML, optional) and the environment.

    Raises ConfigError for an unknown section or key, or a value of the wrong type.
    """
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            with path.open("rb") as handle:
                raw = tomllib.load(handle)
        except OSError as exc:
            raise ConfigError(f"cannot read configuration file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from exc
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        parts = name[len(ENV_PREFIX) :].lower().split("__")
        target = raw
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = value
    settings = Settings(sidecar_id=str(raw.pop("sidecar_id", "") or default_sidecar_id()))
    for section, values in raw.items():
        if section not in _SECTIONS:
            raise ConfigError(f"unknown configuration section {section!r}")
        if not isinstance(values, dict):
            raise ConfigError(f"section {section!r} must be a table")
        built = _build_section(_SECTIONS[section], section, values)
        _validate(section, built)
        settings = replace(settings, **{section: built})
    return settings.validate()


def _build_section(cls: type[Any], section: str, values: dict[str, Any]) -> Any:
    known = {f.name: f for f in fields(cls)}
    defaults = cls()
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"unknown setting {section}.{key}")
        if key == "client":
            if not isinstance(value, dict):
                raise ConfigError(f"{section}.client must be a table of client settings")
            kwargs[key] = dict(value)
            continue
        if key == "security":
            if not isinstance(value, dict):
                raise ConfigError(f"{section}.security must be a table")
            kwargs[key] = _build_section(type(getattr(defaults, key)), f"{section}.security", value)
            continue
        expected = type(getattr(defaults, key))
        if expected is Secret:
            if not isinstance(value, str):
                raise ConfigError(f"{section}.{key} must be a str")
            kwargs[key] = Secret(value.strip())
            continue
        kwargs[key] = _coerce(f"{section}.{key}", value, expected)
    return cls(**kwargs)


def _coerce(name: str, value: Any, expected: type[Any]) -> Any:
    # Environment values arrive as strings; TOML values already have their types.
    try:
        if expected is bool and isinstance(value, str):
            lowered = value.strip().lower()
            if lowered not in {"true", "false", "1", "0", "yes", "no"}:
                raise ValueError(value)
            return lowered in {"true", "1", "yes"}
        if isinstance(value, str):
            return expected(value.strip())
        # TOML values already carry a type: accept only the expected one (an int where a
        # float is expected), never a silent conversion such as 1.5 -> 1 or true -> 1.
        if isinstance(value, bool) != (expected is bool):
            raise ValueError(value)
        if isinstance(value, expected) or (expected is float and isinstance(value, int)):
            return expected(value)
        raise ValueError(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} must be a {expected.__name__}, got {value!r}") from exc
