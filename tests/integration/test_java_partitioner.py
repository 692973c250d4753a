"""Our murmur2 and default partitioner against the Java client's, run from the installed jars."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

from ordered_dev.devcluster.install import ensure_installed
from sidecar.core.routing import default_partition, murmur2

_SOURCE = Path(__file__).parent / "java" / "Murmur2Vectors.java"


def _random_keys(count: int) -> list[bytes]:
    rng = random.Random(253)
    keys = [b"", b"a", b"\x00", b"\xff" * 7, "ключ-ü-🔑".encode()]
    keys += [rng.randbytes(rng.randrange(1, 65)) for _ in range(count)]
    return keys


def test_hashes_and_partitions_match_kafka_clients() -> None:
    installed = ensure_installed()
    keys = _random_keys(2000)
    result = subprocess.run(
        [installed.java, "-cp", installed.kafka_classpath, str(_SOURCE)],
        input="\n".join(key.hex() for key in keys) + "\n",
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    lines = result.stdout.splitlines()
    assert len(lines) == len(keys)
    for key, line in zip(keys, lines, strict=True):
        java_hash, *java_partitions = (int(field) for field in line.split())
        assert murmur2(key) == java_hash, key.hex()
        assert [default_partition(key, n) for n in range(1, 65)] == java_partitions, key.hex()
