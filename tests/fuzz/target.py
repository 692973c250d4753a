"""A sidecar on the test cluster, its callback sink and its topics, ready to be fuzzed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import ADMIN_TOKEN, running_sidecars
from tests.fuzz.harness import FuzzTarget, callback_sink, delete_topics, new_target, prepare_topics


@asynccontextmanager
async def fuzz_target(cluster: ClusterEndpoints) -> AsyncIterator[FuzzTarget]:
    """One sidecar (admin API on), a sink for its callbacks and the run's topics; the
    topics are deleted afterwards."""
    async with callback_sink() as sink, running_sidecars(cluster, 1) as (sidecar,):
        async with sidecar.http.get("/v3/clusters") as response:
            assert response.status == 200, await response.text()
            cluster_id = (await response.json())["data"][0]["cluster_id"]
        target = new_target(sidecar.url, ADMIN_TOKEN, sink, cluster_id)
        try:
            await prepare_topics(target, cluster.kafka_bootstrap, cluster.replication_factor)
            yield target
        finally:
            await delete_topics(cluster.kafka_bootstrap, target.prefix)
