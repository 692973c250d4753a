"""Command-line entry point: `sidecar <command>`."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sidecar", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    from sidecar import admin_cli
    from sidecar.audit import job as audit_job
    from sidecar.demo import command as demo
    from sidecar.devcluster import cli as devcluster_cli
    from sidecar.devcluster import images
    from sidecar.inject import server as inject_server

    admin_cli.add_parsers(subparsers)
    audit_job.add_parser(subparsers)
    demo.add_parser(subparsers)
    devcluster_cli.add_parser(subparsers)
    images.add_parser(subparsers)
    inject_server.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = args.handler
    result: int = handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
