"""What the configuration tests share."""

from __future__ import annotations

from pathlib import Path


def config_file(tmp_path: Path, text: str) -> Path:
    """A configuration file holding ``text``."""
    path = tmp_path / "sidecar.toml"
    path.write_text(text)
    return path
