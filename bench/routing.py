"""Routing cost and key movement: murmur2 + linear hashing against Kafka's default partitioner.

Run from the repository root::

    .venv/bin/python -m bench.routing [--quick]

Two questions, both about ``sidecar.core.routing`` (pure Python, no cluster):

* how many keys per second one core routes (murmur2 alone, Kafka's default
  partitioner ``murmur2 % N``, and the sidecar's ``partition_for_key``: murmur2 +
  linear hashing), best of several repeats;
* how many of 100 000 keys change partition when one partition is added, with linear
  hashing (one partition splits: about 1/(2N) of the keys move) and with
  ``hash % N`` (about N/(N+1) of them move).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.report import command_line, machine_lines, markdown_table, write_result
from sidecar.core.routing import (
    default_partition,
    linear_hash_partition,
    murmur2,
    partition_for_key,
    positive_hash,
)

KEY_COUNT = 100_000
KEY_BYTES = 16
# (initial count N, old undeleted count, new undeleted count): one added partition.
CHANGES = [(10, 10, 11), (8, 8, 9)]


@dataclass(frozen=True, slots=True)
class Speed:
    name: str
    keys_per_second: float
    microseconds_per_key: float


@dataclass(frozen=True, slots=True)
class Movement:
    old_count: int
    new_count: int
    linear_moved: int
    default_moved: int
    key_count: int


def make_keys(count: int, seed: int = 253) -> list[bytes]:
    """``count`` random keys of KEY_BYTES bytes, the same on every run."""
    rng = random.Random(seed)
    return [rng.randbytes(KEY_BYTES) for _ in range(count)]


def best_speed(
    name: str, keys: Sequence[bytes], route: Callable[[bytes], int], repeats: int
) -> Speed:
    """Best of ``repeats`` passes over ``keys`` (the least disturbed by other work)."""
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        for key in keys:
            route(key)
        best = min(best, time.perf_counter() - began)
    return Speed(name, len(keys) / best, best / len(keys) * 1e6)


def measure_speeds(keys: Sequence[bytes], repeats: int) -> list[Speed]:
    hashes = [positive_hash(key) for key in keys]
    best_linear = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        for hash_value in hashes:
            linear_hash_partition(hash_value, 10, 11)
        best_linear = min(best_linear, time.perf_counter() - began)
    return [
        best_speed("murmur2 alone", keys, murmur2, repeats),
        best_speed(
            "default partitioner, murmur2 % 11", keys, lambda k: default_partition(k, 11), repeats
        ),
        best_speed(
            "murmur2 + linear hashing, N=10 U=11 (`partition_for_key`)",
            keys,
            lambda k: partition_for_key(k, 10, 11),
            repeats,
        ),
        Speed(
            "linear hashing alone on a precomputed hash",
            len(hashes) / best_linear,
            best_linear / len(hashes) * 1e6,
        ),
    ]


def measure_movement(keys: Sequence[bytes], initial: int, old: int, new: int) -> Movement:
    hashes = [positive_hash(key) for key in keys]
    linear_moved = sum(
        linear_hash_partition(h, initial, old) != linear_hash_partition(h, initial, new)
        for h in hashes
    )
    default_moved = sum(h % old != h % new for h in hashes)
    return Movement(old, new, linear_moved, default_moved, len(keys))


def render(speeds: Sequence[Speed], movements: Sequence[Movement], repeats: int) -> list[str]:
    speed_rows = [
        [s.name, f"{s.keys_per_second:,.0f}", f"{s.microseconds_per_key:.2f}"] for s in speeds
    ]
    movement_rows = []
    for m in movements:
        movement_rows.append(
            [
                f"{m.old_count} → {m.new_count}",
                f"{m.linear_moved:,} ({m.linear_moved / m.key_count:.2%})",
                f"{1 / (2 * m.old_count):.2%}",
                f"{m.default_moved:,} ({m.default_moved / m.key_count:.2%})",
                f"{m.old_count / m.new_count:.2%}",
            ]
        )
    return [
        f"## Routing speed ({KEY_COUNT:,} keys of {KEY_BYTES} random bytes, "
        f"best of {repeats}, one core, pure Python)",
        "",
        *markdown_table(["what", "keys/s", "µs/key"], speed_rows),
        "",
        f"## Keys moved by one added partition ({KEY_COUNT:,} keys)",
        "",
        "Linear hashing with the initial count N equal to the old count: the new partition N",
        "is split from partition 0, so only keys of partition 0 can move. Kafka's default",
        "partitioner `murmur2 % N` moves almost every key.",
        "",
        *markdown_table(
            [
                "change",
                "linear hashing moved",
                "expected 1/(2N)",
                "`hash % N` moved",
                "expected N/(N+1)",
            ],
            movement_rows,
        ),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one repeat instead of five")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else 5
    keys = make_keys(KEY_COUNT)
    speeds = measure_speeds(keys, repeats)
    movements = [measure_movement(keys, *change) for change in CHANGES]
    body = render(speeds, movements, repeats)
    header = [
        *machine_lines("not used (pure routing code)"),
        f"- command: `{command_line('bench.routing')}`",
    ]
    print("\n".join(body))
    path = write_result("routing", "Routing benchmark", header, body)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
