"""OAUTHBEARER against Kafka's own JWT validation, on the secured cluster.

The brokers check tokens with ``OAuthBearerValidatorCallbackHandler`` against the JWKS
file the dev cluster wrote; this test is the token issuer: it signs RS256 JWTs with
the cluster's signing key (``tests.support.oauth_tokens``) and serves them from a local
OIDC token endpoint (client-credentials grant), or writes one to a token file.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from ordered_dev.devcluster.cluster import LocalCluster
from ordered_dev.devcluster.provider import secured_endpoints
from ordered_dev.devcluster.security import OAUTH_AUDIENCE
from ordered_dev.harness.sidecars import RunningSidecar, settings_for, unique
from sidecar.compose import SidecarServer
from sidecar.config import KafkaSecuritySettings, Secret, Settings
from tests.support.oauth_tokens import signed_token

CLIENT_ID, CLIENT_SECRET = "orders-sidecar", "client-s3cret"


class TokenEndpoint:
    """A local OIDC token endpoint for one client; counts the tokens it issued."""

    def __init__(self, cluster: LocalCluster, audience: str = OAUTH_AUDIENCE) -> None:
        self.cluster = cluster
        self.audience = audience
        self.issued = 0

    async def token(self, request: web.Request) -> web.Response:
        expected = base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
        if request.headers.get("Authorization") != f"Basic {expected}":
            return web.json_response({"error": "invalid_client"}, status=401)
        form = await request.post()
        if form.get("grant_type") != "client_credentials":
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        self.issued += 1
        token = signed_token(self.cluster, audience=self.audience)
        return web.json_response({"access_token": token, "token_type": "Bearer", "expires_in": 600})


@pytest.fixture
async def token_endpoint(
    secured_cluster: LocalCluster,
) -> AsyncIterator[tuple[TokenEndpoint, str]]:
    endpoint = TokenEndpoint(secured_cluster)
    app = web.Application()
    app.router.add_post("/oauth2/token", endpoint.token)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield endpoint, f"http://127.0.0.1:{port}/oauth2/token"
    finally:
        await runner.cleanup()


def _oauth_settings(cluster: LocalCluster, security: KafkaSecuritySettings) -> Settings:
    # ZooKeeper as for the other identities; Kafka by OAUTHBEARER on the SASL_SSL listener.
    settings = settings_for(secured_endpoints(cluster), f"/{unique('oauth')}", "oauth")
    return dataclasses.replace(
        settings, kafka=dataclasses.replace(settings.kafka, security=security)
    )


async def _produce_through(settings: Settings) -> None:
    topic = unique("oauth")
    async with running_sidecars_with(settings) as sidecar:
        await sidecar.create_topic(topic, 2, replication_factor=1)
        status, body = await sidecar.produce(topic, [{"key": "k", "value": 1}])
        assert status == 200, body
        assert body["offsets"][0]["error_code"] is None, body


@asynccontextmanager
async def running_sidecars_with(settings: Settings) -> AsyncIterator[RunningSidecar]:
    """One in-process sidecar with exactly ``settings``."""
    server = SidecarServer(settings)
    await server.start()
    try:
        await server.wait_ready()
        async with aiohttp.ClientSession(server.url) as http:
            yield RunningSidecar(server.url, settings.sidecar_id, http, server)
    finally:
        await server.stop()


async def test_client_credentials_tokens_pass_kafkas_jwt_validation(
    secured_cluster: LocalCluster, token_endpoint: tuple[TokenEndpoint, str]
) -> None:
    endpoint, url = token_endpoint
    security = KafkaSecuritySettings(
        protocol="SASL_SSL",
        ssl_cafile=secured_cluster.material.ca,
        sasl_mechanism="OAUTHBEARER",
        oauth_token_endpoint=url,
        oauth_client_id=CLIENT_ID,
        oauth_client_secret=Secret(CLIENT_SECRET),
        oauth_scope="kafka",
    )
    await _produce_through(_oauth_settings(secured_cluster, security))
    # Many connections (producers, admin, consumer), one token while it is fresh.
    assert endpoint.issued == 1


async def test_a_token_file_passes_kafkas_jwt_validation(
    secured_cluster: LocalCluster, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(signed_token(secured_cluster) + "\n")
    security = KafkaSecuritySettings(
        protocol="SASL_SSL",
        ssl_cafile=secured_cluster.material.ca,
        sasl_mechanism="OAUTHBEARER",
        oauth_token_file=str(token_file),
    )
    await _produce_through(_oauth_settings(secured_cluster, security))
