"""A real sidecar applies its ``http`` connection settings (``sidecar.http.connections``)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import settings_for, unique
from sidecar.compose import SidecarServer

WITHIN_S = 10.0


async def test_the_settings_close_slow_and_idle_connections_and_bound_their_number(
    cluster: ClusterEndpoints,
) -> None:
    base = settings_for(cluster, f"/{unique('limits')}", "limits")
    http = dataclasses.replace(
        base.http, header_read_timeout_s=0.3, keepalive_timeout_s=0.3, max_connections=2
    )
    server = SidecarServer(dataclasses.replace(base, http=http))
    await server.start()
    await server.wait_ready()
    assert server.port is not None
    try:
        half_sent = await asyncio.open_connection("127.0.0.1", server.port)
        half_sent[1].write(b"GET /healthz HTTP/1.1\r\nHo")
        kept_alive = await asyncio.open_connection("127.0.0.1", server.port)
        kept_alive[1].write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(kept_alive[0].readuntil(b"\r\n\r\n"), WITHIN_S)
        assert head.startswith(b"HTTP/1.1 200")
        # Two connections are open: a third is refused, answered before it is read.
        refused = await asyncio.open_connection("127.0.0.1", server.port)
        answer = await asyncio.wait_for(refused[0].read(), WITHIN_S)
        assert answer.startswith(b"HTTP/1.1 503")
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["error_code"] == 50303
        # The half-sent request and the idle kept-alive connection are both closed.
        assert await asyncio.wait_for(half_sent[0].read(), WITHIN_S) == b""
        await asyncio.wait_for(kept_alive[0].read(), WITHIN_S)
        assert kept_alive[0].at_eof()
        for _, writer in (half_sent, kept_alive, refused):
            writer.close()
        metrics = server.metrics
        assert metrics.http_timeouts.labels("header")._value.get() == 1
        assert metrics.http_connections_refused._value.get() == 1
    finally:
        await server.stop()
