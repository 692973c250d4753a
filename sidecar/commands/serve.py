"""`sidecar serve`: run one sidecar until SIGTERM or SIGINT, then shut down gracefully."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from sidecar.commands.logs import configure_logging
from sidecar.compose import SidecarServer
from sidecar.config import ConfigError, ProcessSettings, Settings, load_settings
from sidecar.core.errors import SidecarError

_log = logging.getLogger(__name__)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = subparsers.add_parser(
        "serve", help="run the sidecar (data on 127.0.0.1, probes on http.ops_port)"
    )
    serve.add_argument("--config", type=Path, help="TOML settings file (environment overrides)")
    serve.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    """Exit 2 with one line naming the setting for a configuration error; 0 after a
    graceful stop. Kafka or ZooKeeper away is no reason to exit: the sidecar waits."""
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log)
    tune_process(settings.process)
    try:
        loop_factory = event_loop_factory(settings.process.event_loop)
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve(settings))
    except ConfigError as exc:  # a port, or a certificate or key the clients cannot use
        print(f"sidecar: {exc}", file=sys.stderr)
        return 2
    except SidecarError as exc:
        if not exc.fatal_at_start:
            raise
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


def event_loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop factory for ``process.event_loop`` (None: asyncio's own loop). Raises
    ConfigError when uvloop is asked for by name and is not installed."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(
                "process.event_loop is uvloop, but uvloop is not installed; "
                "install it or use auto or asyncio"
            ) from None
        return None
    return uvloop.new_event_loop


async def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully; print one line on stdout
    once ready (its last word is the data plane's URL). Raises the error that made the
    dependencies' start give up (the cluster refused this sidecar's identity)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    _log.info("event loop: %s.%s", type(loop).__module__, type(loop).__name__)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = SidecarServer(settings)
    await server.start()

    async def announce_ready() -> None:
        await server.wait_ready()
        print(f"sidecar {settings.sidecar_id} ready on {server.url}", flush=True)

    announcing = asyncio.create_task(announce_ready())
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({announcing, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if announcing.done() and announcing.exception() is None:
            await stopping  # ready: run until a signal
    finally:
        stopping.cancel()
        announcing.cancel()
        await server.stop()
    if announcing.done() and not announcing.cancelled() and announcing.exception() is not None:
        raise announcing.exception()  # type: ignore[misc]
