"""``sidecar.config.errors``: the one exception an invalid setting raises, whichever
module of ``sidecar.config`` finds it."""

from __future__ import annotations

import pytest

import sidecar.config
from sidecar.config import ConfigError, load_settings
from sidecar.config.errors import ConfigError as ErrorsConfigError


def test_the_package_exports_the_errors_module_class() -> None:
    # ``except ConfigError`` in the commands (imported from ``sidecar.config``) must catch
    # what every module raises (imported from ``sidecar.config.errors``).
    assert sidecar.config.ConfigError is ErrorsConfigError


def test_a_config_error_is_a_value_error() -> None:
    # Code that only knows "a value was wrong" (``except ValueError``) still catches it.
    with pytest.raises(ValueError, match=r"^http\.port must be between 0 and 65535, got -1$"):
        load_settings(environ={"ORDERED_SIDECAR__HTTP__PORT": "-1"})


@pytest.mark.parametrize(
    "environ",
    [
        {"ORDERED_SIDECAR__NOPE__X": "1"},  # loading: unknown section
        {"ORDERED_SIDECAR__HTTP__PORT": "eighty"},  # loading: wrong type
        {"ORDERED_SIDECAR__LOG__FORMAT": "xml"},  # validation: a section's own check
        {"ORDERED_SIDECAR__SIDECAR_ID": "a/b"},  # settings: the checks across sections
    ],
)
def test_every_stage_of_loading_raises_the_same_class(environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ=environ)
    assert type(caught.value) is ConfigError
