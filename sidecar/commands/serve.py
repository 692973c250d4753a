"""`sidecar serve`: run one sidecar until SIGTERM or SIGINT, then shut down gracefully."""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys
from pathlib import Path

from sidecar.compose import SidecarServer
from sidecar.config import ConfigError, ProcessSettings, Settings, load_settings
from sidecar.core.errors import (
    KafkaAuthenticationFailed,
    KafkaNotAuthorized,
    MetadataNotAuthorized,
)

REFUSED_AT_START = (KafkaAuthenticationFailed, KafkaNotAuthorized, MetadataNotAuthorized)
"""Errors that end ``serve`` with one line: the cluster refused this sidecar's identity."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = subparsers.add_parser("serve", help="run the sidecar (HTTP on 127.0.0.1)")
    serve.add_argument("--config", type=Path, help="TOML settings file (environment overrides)")
    serve.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return 2
    tune_process(settings.process)
    try:
        asyncio.run(serve(settings))
    except (ConfigError, *REFUSED_AT_START) as exc:
        # A credential, certificate or file the sidecar cannot use: one line that names
        # the setting, no traceback; a restart will not help until it is fixed.
        print(f"sidecar: cannot start: {exc}", file=sys.stderr)
        return 2
    return 0


def tune_process(process: ProcessSettings) -> None:
    """Apply the process settings. Only the youngest generation's threshold changes: the
    older two keep Python's, so a full collection still follows the same ratios."""
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(process.gc_young_threshold, middle, oldest)


async def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    server = SidecarServer(settings)
    try:
        await server.start()
    except BaseException:
        await server.stop()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"sidecar {settings.sidecar_id} ready on {server.url}", flush=True)
    await stop.wait()
    await server.stop()
