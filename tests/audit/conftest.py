"""One Spark session for every audit test (a JVM start costs about 10 s).

The session has the Kafka connector (resolved by Ivy once into the project cache), so
the integration test reads the real audit topic with it; ``local[2]``, 2 shuffle
partitions, no UI, driver on 127.0.0.1, as the job runs embedded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from ordered_audit.job import SparkOptions, build_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    began = time.monotonic()
    session = build_session(SparkOptions(master="local[2]", shuffle_partitions=2), kafka=True)
    print(f"\nSpark session started in {time.monotonic() - began:.1f} s")
    try:
        yield session
    finally:
        session.stop()
