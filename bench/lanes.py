"""Transaction lanes A/B: two sidecars on one cluster, each with its own lane count.

Run from the repository root::

    .venv/bin/python -m bench.lanes [--lanes 3 5] [--rounds 4]

``bench.ab`` with ``kafka.transaction_lanes``: each sidecar writes its own managed topic
(and a plain one) of 6 partitions, replication factor 3; every round measures each in
turn, the order reversed every other round. The baseline is the first lane count,
measured in the same run.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from bench.ab import measure


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--lanes", type=int, nargs="+", default=[3, 5])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    values = [str(lanes) for lanes in args.lanes]
    measure(
        "lanes",
        "Transaction lanes benchmark",
        "kafka.transaction_lanes",
        values,
        args.rounds,
        "bench.lanes",
    )


if __name__ == "__main__":
    main()
