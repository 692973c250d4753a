"""What every benchmark result file starts with, and where it is written.

A figure without the machine it was measured on is not a figure: each result file
opens with the date, the CPU, memory, Python and Kafka it ran against, the load
average before it started (other work on the machine shows there), and the exact
command that reproduces it.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

Results = TypeVar("Results")

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def command_line(module: str) -> str:
    """The command that ran this benchmark, as typed from the repository root."""
    return " ".join([".venv/bin/python", "-m", module, *sys.argv[1:]])


def machine_lines(kafka: str) -> list[str]:
    """Markdown bullet lines describing this machine; ``kafka`` says what it ran against."""
    return [
        f"- date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {len(os.sched_getaffinity(0))} cores (`nproc`), "
        f"{_memory_gib():.1f} GiB memory, {_cpu_model()}",
        f"- load average before the run (1/5/15 min): {_load_average()}",
        f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"{platform.system()} {platform.release()}",
        f"- Kafka: {kafka}",
    ]


def write_result(
    name: str,
    title: str,
    header: Sequence[str],
    body: Sequence[str],
    path: Path | None = None,
) -> Path:
    """Write ``results/<name>.md``, or ``path`` if given (title, header bullets, body),
    and return where it went."""
    path = path or RESULTS_DIR / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([f"# {title}", "", *header, "", *body, ""]))
    return path


def measure_and_write(
    name: str,
    title: str,
    measure: Callable[[IO[bytes]], Coroutine[Any, Any, tuple[Results, str]]],
    render: Callable[[Results], list[str]],
    module: str | None = None,
    path: Path | None = None,
) -> None:
    """Run ``measure`` (given a log file for the sidecars, kept only when it fails; it
    returns its results and what it ran against), print ``render`` of them and write
    them to ``results/<name>.md`` (or ``path``) under the machine's description, whose
    load average is read before the cluster starts. ``module`` is what ran
    (``bench.<name>`` if None), for the command in the header."""
    header_machine = machine_lines("…")
    began = time.monotonic()
    with tempfile.NamedTemporaryFile(prefix="bench-sidecar-", suffix=".log", delete=False) as log:
        results, kafka = asyncio.run(measure(log))
    Path(log.name).unlink()
    header = [
        *(
            line if not line.startswith("- Kafka:") else f"- Kafka: {kafka}"
            for line in header_machine
        ),
        f"- command: `{command_line(module or f'bench.{name}')}` "
        f"({time.monotonic() - began:.0f} s)",
    ]
    body = render(results)
    print("\n".join(body))
    written = write_result(name, title, header, body, path)
    print(f"\nwritten to {written}")


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table, numbers right-aligned (every column but the first)."""
    align = ["---"] + ["---:"] * (len(columns) - 1)
    lines = ["| " + " | ".join(columns) + " |", "| " + " | ".join(align) + " |"]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return lines


def _memory_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / (1024 * 1024)
    return 0.0


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def _load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"
