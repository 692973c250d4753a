"""The HTTP edge's own cost: a REST Proxy v2 produce request decoded and its response
encoded, in-process (no cluster, no HTTP), against baselines measured in the same run.

Run from the repository root::

    .venv/bin/python -m bench.codec [--quick]

For a request of 100 binary records (100 B and 1 KiB values, 8-byte keys):

* **decode**: ``decode_produce_request`` against the same request decoded with every
  record through the checked path (``_decode_record``, which builds the messages a
  refusal needs; how every record was decoded before the fast path), and against the
  JSON parse alone (the floor: what no validation can save);
* **encode**: ``encode_produce_response`` (written as text) against ``json.dumps`` of
  the response body (how it was encoded before).

Best of several repeats, one core, microseconds per record.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import time
from collections.abc import Callable, Sequence
from unittest import mock

from bench.report import command_line, machine_lines, markdown_table, write_result
from sidecar.core.produce import RecordWritten
from sidecar.http import produce_codec
from sidecar.http.json_body import parse_json
from sidecar.http.produce_codec import decode_produce_request, encode_produce_response

RECORDS_PER_REQUEST = 100
SIZES = (100, 1024)
BINARY = "application/vnd.kafka.binary.v2+json"


def request_body(value_bytes: int, seed: int = 28) -> bytes:
    rng = random.Random(seed)
    records = [
        {
            "key": base64.b64encode(rng.randbytes(8)).decode(),
            "value": base64.b64encode(rng.randbytes(value_bytes)).decode(),
        }
        for _ in range(RECORDS_PER_REQUEST)
    ]
    return json.dumps({"records": records}).encode()


def best_us_per_record(run: Callable[[], object], repeats: int, loops: int = 200) -> float:
    """The fastest of ``repeats`` timings of ``loops`` calls, per record."""
    fastest = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(loops):
            run()
        fastest = min(fastest, time.perf_counter() - began)
    return fastest / loops / RECORDS_PER_REQUEST * 1e6


def decode_row(size: int, repeats: int) -> list[str]:
    body = request_body(size)

    def decode() -> object:
        return decode_produce_request(body, content_type=BINARY, headers={}, max_body_bytes=1 << 24)

    def decode_checked() -> object:
        # Every record through the checked path: the fast path replaced by it.
        with mock.patch.object(
            produce_codec, "_decode_binary_record", produce_codec._decode_record
        ):
            return decode()

    assert decode() == decode_checked(), "the two paths must decode alike"
    fast = best_us_per_record(decode, repeats)
    checked = best_us_per_record(decode_checked, repeats)
    parse = best_us_per_record(lambda: parse_json(body), repeats)
    return [
        f"decode, {size} B values",
        f"{fast:.2f}",
        f"{checked:.2f}",
        f"{checked / fast:.1f}",
        f"{parse:.2f}",
    ]


def measure(repeats: int) -> list[list[str]]:
    rows = [decode_row(size, repeats) for size in SIZES]
    results = [RecordWritten(i % 6, 10_000_000 + i, 1_700_000_000_000) for i in range(100)]

    def encode() -> bytes:
        return encode_produce_response(results, generation=12, partition_count=6)

    def encode_by_dumps() -> bytes:
        document = produce_codec.produce_response_body(results, generation=12, partition_count=6)
        return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()

    assert encode() == encode_by_dumps(), "the two encodings must be the same bytes"
    text = best_us_per_record(encode, repeats)
    dumps = best_us_per_record(encode_by_dumps, repeats)
    rows.append(["encode the response", f"{text:.2f}", f"{dumps:.2f}", f"{dumps / text:.1f}", ""])
    return rows


def render(rows: list[list[str]], repeats: int) -> list[str]:
    return [
        f"## Produce request and response, {RECORDS_PER_REQUEST} binary records a request "
        f"(best of {repeats}, one core, µs per record)",
        "",
        *markdown_table(["what", "now", "baseline", "baseline / now", "JSON parse alone"], rows),
        "",
        "Baseline: decode with every record through the checked path; encode with",
        "`json.dumps` of the response body. Both are checked to give the same result first.",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one repeat instead of seven")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else 7
    body = render(measure(repeats), repeats)
    header = [
        *machine_lines("not used (codec code only)"),
        f"- command: `{command_line('bench.codec')}`",
    ]
    print("\n".join(body))
    path = write_result("codec", "HTTP edge codec benchmark", header, body)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
