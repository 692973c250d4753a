"""`sidecar topics create|adopt|describe|expand|shrink|confirm-truncation|compact`.

The topics commands call a running sidecar's admin API (``--url``, token from
``--token`` or ``ORDERED_SIDECAR_ADMIN_TOKEN``), so the sidecar that runs the change
is a registered, barrier-acking member like any other. While an expansion or shrink
runs, the command prints each phase as the operation journal shows it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

import aiohttp

DEFAULT_URL = "http://127.0.0.1:8082"
PROGRESS_POLL_S = 0.2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topics = subparsers.add_parser("topics", help="manage ordered topics through a sidecar")
    topics.add_argument("--url", default=os.environ.get("ORDERED_SIDECAR_URL", DEFAULT_URL))
    topics.add_argument("--token", default=os.environ.get("ORDERED_SIDECAR_ADMIN_TOKEN", ""))
    actions = topics.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a Kafka topic and manage it")
    create.add_argument("topic")
    create.add_argument("--partitions", type=int, required=True)
    create.add_argument("--replication-factor", type=int, default=3)
    create.add_argument("--compacted", action="store_true")
    create.add_argument("--unordered", action="store_true", help="ordered_delivery=false")
    adopt = actions.add_parser("adopt", help="manage an existing Kafka topic (no key moves)")
    adopt.add_argument("topic")
    adopt.add_argument("--compacted", action="store_true")
    adopt.add_argument("--unordered", action="store_true")
    describe = actions.add_parser("describe", help="generations, boundaries, modes, operation")
    describe.add_argument("topic")
    for name in ("expand", "shrink"):
        change = actions.add_parser(name, help=f"{name} to an absolute partition count")
        change.add_argument("topic")
        change.add_argument("--to", type=int, required=True, dest="count")
        change.add_argument("--validate-only", action="store_true")
        if name == "shrink":
            change.add_argument("--delete-after", type=float, dest="delete_after_seconds")
            change.add_argument(
                "--wait-retired",
                action="store_true",
                help="after the commit, show retirement until no partition is read-only",
            )
    confirm = actions.add_parser(
        "confirm-truncation",
        help="accept boundaries lost to an unclean leader election, so the topic changes again",
    )
    confirm.add_argument("topic")
    confirm.add_argument(
        "--yes",
        action="store_true",
        help="confirm that the records truncated below those boundaries are lost",
    )
    compact = actions.add_parser(
        "compact",
        help="fold the generations whose records are gone from every partition, now",
    )
    compact.add_argument("topic")
    topics.set_defaults(handler=run_topics)


def run_topics(args: argparse.Namespace) -> int:
    return asyncio.run(_topics(args))


async def _topics(args: argparse.Namespace) -> int:
    headers = {"Authorization": f"Bearer {args.token}"}
    base = args.url.rstrip("/")
    async with aiohttp.ClientSession(base, headers=headers) as session:
        try:
            if args.action == "create":
                body: dict[str, Any] = {
                    "name": args.topic,
                    "partitions": args.partitions,
                    "replication_factor": args.replication_factor,
                    "compacted": args.compacted,
                    "ordered_delivery": not args.unordered,
                }
                return await _call(session, "POST", "/admin/topics", body)
            if args.action == "adopt":
                body = {"compacted": args.compacted, "ordered_delivery": not args.unordered}
                return await _call(session, "POST", f"/admin/topics/{args.topic}/adopt", body)
            if args.action == "describe":
                return await _call(session, "GET", f"/admin/topics/{args.topic}", None)
            if args.action == "compact":
                return await _call(session, "POST", f"/admin/topics/{args.topic}/compaction", {})
            if args.action == "confirm-truncation":
                return await _confirm_truncation(session, args)
            return await _change(session, args)
        except aiohttp.ClientConnectionError as exc:
            print(f"sidecar: cannot reach {base}: {exc}", file=sys.stderr)
            return 1


async def _call(
    session: aiohttp.ClientSession, method: str, path: str, body: dict[str, Any] | None
) -> int:
    async with session.request(method, path, json=body) as response:
        document = await response.json(content_type=None)
    print(json.dumps(document, indent=2))
    return 0 if response.status < 400 else 1


async def _confirm_truncation(session: aiohttp.ClientSession, args: argparse.Namespace) -> int:
    if not args.yes:
        print(
            "sidecar topics confirm-truncation: confirming accepts that the records an "
            f"unclean leader election truncated in {args.topic} are lost; add --yes",
            file=sys.stderr,
        )
        return 2
    path = f"/admin/topics/{args.topic}/confirm-truncation"
    async with session.post(path, json={}) as response:
        document = await response.json(content_type=None)
    if response.status >= 400:
        print(
            f"sidecar topics confirm-truncation: {document.get('message')} "
            f"(HTTP {response.status}, error_code {document.get('error_code')})",
            file=sys.stderr,
        )
        return 1
    for lost in document["confirmed"]:
        reaches = "an unknown offset" if lost["log_end"] is None else lost["log_end"]
        print(
            f"{args.topic}: confirmed the loss below boundary {lost['boundary']} of "
            f"partition {lost['partition']} (generation {lost['generation']}, leader epoch "
            f"{lost['leader_epoch']}; the log now reaches {reaches})"
        )
    return 0


async def _change(session: aiohttp.ClientSession, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {
        "count": args.count,
        "kind": args.action,
        "validate_only": args.validate_only,
    }
    if getattr(args, "delete_after_seconds", None) is not None:
        body["delete_after_seconds"] = args.delete_after_seconds
    path = f"/admin/topics/{args.topic}/partition-count"
    progress = asyncio.create_task(_show_progress(session, args.topic))
    try:
        async with session.post(path, json=body) as response:
            document = await response.json(content_type=None)
    finally:
        progress.cancel()
    if response.status >= 400:
        print(json.dumps(document, indent=2))
        return 1
    verb = "would change" if args.validate_only else "changed"
    print(
        f"{args.topic}: {verb} {document['from_count']} -> {document['target_count']} partitions"
        f" ({document['phase']})"
    )
    if getattr(args, "wait_retired", False) and not args.validate_only:
        await _show_retirement(session, args.topic)
    return 0


async def _show_retirement(session: aiohttp.ClientSession, topic: str) -> None:
    """Print each partition's mode change until none is read-only (draining)."""
    began = time.monotonic()
    last: list[str] = []
    while True:
        async with session.get(f"/admin/topics/{topic}") as response:
            document = await response.json(content_type=None)
        modes = [p["mode"] for p in document["partitions"]]
        if modes != last:
            draining = [i for i, mode in enumerate(modes) if mode == "read_only"]
            removed = [i for i, mode in enumerate(modes) if mode == "removed"]
            print(
                f"  {time.monotonic() - began:6.2f} s  draining {draining or '-'}"
                f"  removed {removed or '-'}",
                flush=True,
            )
            last = modes
        if "read_only" not in modes:
            return
        await asyncio.sleep(PROGRESS_POLL_S * 2)


async def _show_progress(session: aiohttp.ClientSession, topic: str) -> None:
    began = time.monotonic()
    last = None
    while True:
        await asyncio.sleep(PROGRESS_POLL_S)
        async with session.get(f"/admin/topics/{topic}") as response:
            if response.status != 200:
                continue
            document = await response.json(content_type=None)
        operation = document.get("operation") or {}
        phase = operation.get("phase")
        if phase and phase != last:
            print(f"  {time.monotonic() - began:6.2f} s  {phase}", flush=True)
            last = phase
