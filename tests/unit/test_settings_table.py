"""The README's settings table is generated from ``Settings``: every field of every
section, with its default and its environment variable. A field added, renamed or
given another default fails here until the table is regenerated::

    .venv/bin/python -m tests.unit.test_settings_table   # rewrites the README's table
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from sidecar.config import _SECTIONS, ENV_PREFIX, Secret, Settings

README = Path(__file__).resolve().parents[2] / "README.md"
BEGIN = (
    "<!-- settings table: generated from sidecar/config/ by tests/unit/test_settings_table.py -->"
)
END = "<!-- end of settings table -->"


def _default(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Secret):
        return '""'  # a secret has no default
    if isinstance(value, str | int | float):
        return json.dumps(value)
    return json.dumps(dict(value))  # kafka.client: a table passed through


def _rows(name: str, values: Any) -> list[str]:
    rows = []
    for field in dataclasses.fields(values):
        value = getattr(values, field.name)
        if dataclasses.is_dataclass(value):  # a nested table: kafka.security
            rows += _rows(f"{name}.{field.name}", value)
            continue
        env = f"{ENV_PREFIX}{name.upper().replace('.', '__')}__{field.name.upper()}"
        if field.name == "client":
            env += "__<KEY>"
        rows.append(f"| `{name}.{field.name}` | `{_default(value)}` | `{env}` |")
    return rows


def settings_table() -> str:
    defaults = Settings(sidecar_id="")
    rows = [
        "| setting | default | environment variable |",
        "|---|---|---|",
        f"| `sidecar_id` | host name and a random suffix | `{ENV_PREFIX}SIDECAR_ID` |",
    ]
    for section in _SECTIONS:
        rows += _rows(section, getattr(defaults, section))
    return "\n".join(rows)


def _readme_table(text: str) -> str:
    start = text.index(BEGIN) + len(BEGIN)
    return text[start : text.index(END, start)].strip()


def test_the_readme_lists_every_setting_with_its_default() -> None:
    assert _readme_table(README.read_text()) == settings_table()


def test_every_section_is_in_the_table() -> None:
    table = settings_table()
    for section in _SECTIONS:
        for field in dataclasses.fields(_SECTIONS[section]):
            if field.name == "security":
                assert f"`{section}.security.protocol`" in table or (
                    f"`{section}.security.tls`" in table
                )
                continue
            assert f"`{section}.{field.name}`" in table


if __name__ == "__main__":
    text = README.read_text()
    start = text.index(BEGIN) + len(BEGIN)
    end = text.index(END, start)
    README.write_text(text[:start] + "\n" + settings_table() + "\n" + text[end:])
