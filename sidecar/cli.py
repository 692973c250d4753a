"""Command-line entry point: `sidecar <command>`.

The runtime commands (``serve``, ``topics``, ``inject``) are always there. The audit
job (``audit``, package ``ordered_audit``) and the development tooling (``demo``,
``devcluster``, ``image``, package ``ordered_dev``) are added when their packages are
installed: the sidecar image carries only the runtime package.
"""

from __future__ import annotations

import argparse
import importlib
import sys

_OPTIONAL_COMMANDS = (
    "ordered_audit.job",
    "ordered_dev.demo.command",
    "ordered_dev.devcluster.cli",
    "ordered_dev.devcluster.images",
)
"""Modules with an ``add_parser(subparsers)``, imported only if installed."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sidecar", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    from sidecar.commands import serve, topics
    from sidecar.inject import server as inject_server

    serve.add_parser(subparsers)
    topics.add_parser(subparsers)
    inject_server.add_parser(subparsers)
    for name in _OPTIONAL_COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name.split(".")[0]:
                # The package is there but something it needs is not, or one of its own
                # modules (a rename it was not installed with): a broken installation,
                # not a command to leave out without a word.
                raise
            continue
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = args.handler
    result: int = handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
