"""What an invalid setting raises, from every module of ``sidecar.config``."""

from __future__ import annotations


class ConfigError(ValueError):
    """The configuration is invalid: a value of the wrong type or out of range."""
