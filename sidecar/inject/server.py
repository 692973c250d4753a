"""`sidecar inject-webhook`: the mutating admission webhook's HTTPS server (aiohttp).

Routes: ``POST /mutate`` (AdmissionReview v1, see ``review.py``) and ``GET /healthz``.
The API server only talks HTTPS to webhooks, so ``--tls-cert`` and ``--tls-key`` are
required unless ``--insecure-http`` is given (tests, or behind a TLS-terminating proxy).
The certificate files are re-read when they change (checked every ``--cert-reload-s``
seconds), so a rotated Secret (cert-manager) is served without a restart.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import ssl
import sys
from pathlib import Path
from typing import Final

from aiohttp import web

from sidecar.inject.patch import InjectConfig
from sidecar.inject.review import admit

CERT_RELOAD_S: Final = 30.0
"""The default of ``--cert-reload-s``."""
MAX_REVIEW_BYTES: Final = 4 * 1024 * 1024
CONFIG_KEY: Final = web.AppKey("inject_config", InjectConfig)

_log = logging.getLogger(__name__)


def build_webhook_app(config: InjectConfig) -> web.Application:
    app = web.Application(client_max_size=MAX_REVIEW_BYTES)
    app[CONFIG_KEY] = config
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/healthz", healthz)
    return app


async def mutate(request: web.Request) -> web.Response:
    """An AdmissionReview answer for every review, or 400 with a JSON error; never 500."""
    try:
        review = json.loads(await request.read())
        answer = admit(review, request.app[CONFIG_KEY])
    except RecursionError:
        return web.json_response({"error": "the body is nested too deeply"}, status=400)
    except ValueError as exc:  # BadReview, json.JSONDecodeError, UnicodeDecodeError
        return web.json_response({"error": str(exc)}, status=400)
    if "patch" in answer["response"]:
        # A patched pod has an object metadata (patch_for checked the shapes it read).
        source = review["request"]
        metadata = source["object"].get("metadata") or {}
        name = metadata.get("name") or metadata.get("generateName", "?")
        _log.info("injected the sidecar into pod %s/%s", source.get("namespace", "?"), name)
    return web.json_response(answer)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


class WebhookServer:
    """The webhook on ``host:port`` (port 0 picks a free one); HTTPS unless ``tls`` is None."""

    def __init__(
        self,
        config: InjectConfig,
        host: str,
        port: int,
        tls: tuple[Path, Path] | None,
        *,
        cert_reload_s: float = CERT_RELOAD_S,
    ) -> None:
        self.app = build_webhook_app(config)
        self.cert_reload_s = cert_reload_s
        self.host = host
        self.port = port
        self._tls = tls
        self._ssl: ssl.SSLContext | None = None
        self._runner: web.AppRunner | None = None
        self._reloader: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self._tls else 'http'}://{self.host}:{self.port}"

    async def start(self) -> None:
        """Listen. Raises OSError (port taken) or ssl.SSLError (unusable certificate)."""
        if self._tls is not None:
            self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._ssl.load_cert_chain(*self._tls)
            self._reloader = asyncio.create_task(self._reload_certificate(*self._tls))
        self._runner = web.AppRunner(self.app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self._ssl)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._reloader is not None:
            self._reloader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reloader
        if self._runner is not None:
            await self._runner.cleanup()

    async def _reload_certificate(self, cert: Path, key: Path) -> None:
        # New handshakes use the chain loaded last; open connections keep theirs.
        assert self._ssl is not None
        seen = _mtimes(cert, key)
        while True:
            await asyncio.sleep(self.cert_reload_s)
            current = _mtimes(cert, key)
            if current == seen:
                continue
            try:
                self._ssl.load_cert_chain(cert, key)
            except (OSError, ssl.SSLError) as exc:
                # Mid-rotation the two files can disagree for a moment: retry next round.
                _log.warning("keeping the current certificate: %s", exc)
                continue
            seen = current
            _log.info("reloaded the TLS certificate from %s", cert)


def _mtimes(*paths: Path) -> tuple[float, ...]:
    try:
        return tuple(path.stat().st_mtime for path in paths)
    except OSError:
        return ()


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "inject-webhook", help="run the Kubernetes mutating webhook that injects the sidecar"
    )
    add_arguments(parser)
    parser.set_defaults(handler=run_webhook)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The webhook's flags (also parsed by the tests from the example Deployment's args)."""
    defaults = InjectConfig(image="unused")
    parser.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8443)
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate chain")
    parser.add_argument("--tls-key", type=Path, help="PEM private key")
    parser.add_argument(
        "--cert-reload-s",
        type=float,
        default=CERT_RELOAD_S,
        help=f"seconds between checks of the certificate files (default {CERT_RELOAD_S:g})",
    )
    parser.add_argument(
        "--insecure-http", action="store_true", help="serve plain HTTP (tests only)"
    )
    parser.add_argument("--image", required=True, help="the sidecar image to inject")
    parser.add_argument("--config-map", default=defaults.config_map)
    parser.add_argument("--admin-token-secret", help="Secret with the admin token")
    parser.add_argument("--admin-token-key", default=defaults.admin_token_key)
    parser.add_argument("--sidecar-port", type=int, default=defaults.port)
    parser.add_argument(
        "--sidecar-ops-port",
        type=int,
        default=defaults.ops_port,
        help="the sidecar's operations port (probes, metrics)",
    )
    parser.add_argument(
        "--default-credential",
        action="append",
        default=[],
        metavar="ANNOTATION=VALUE",
        help="a credential annotation for pods that do not carry it (repeatable), e.g. "
        "ordered-sidecar.io/kafka-sasl-secret=kafka-scram",
    )
    parser.add_argument("--cpu-request", default=defaults.cpu_request)
    parser.add_argument("--memory-request", default=defaults.memory_request)
    parser.add_argument("--memory-limit", default=defaults.memory_limit)
    parser.add_argument("--image-pull-policy", default=defaults.image_pull_policy)


def config_from_args(args: argparse.Namespace) -> InjectConfig:
    """Raises ValueError for an invalid value (image, port, ConfigMap name)."""
    return InjectConfig(
        image=args.image,
        config_map=args.config_map,
        admin_token_secret=args.admin_token_secret,
        admin_token_key=args.admin_token_key,
        port=args.sidecar_port,
        ops_port=args.sidecar_ops_port,
        cpu_request=args.cpu_request,
        memory_request=args.memory_request,
        memory_limit=args.memory_limit,
        image_pull_policy=args.image_pull_policy,
        default_credentials=tuple(_pair(item) for item in args.default_credential),
    )


def _pair(item: str) -> tuple[str, str]:
    annotation, separator, value = item.partition("=")
    if not separator:
        raise ValueError(f"--default-credential {item!r}: expected ANNOTATION=VALUE")
    return annotation.strip(), value.strip()


def run_webhook(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"sidecar inject-webhook: {exc}", file=sys.stderr)
        return 2
    if args.insecure_http:
        tls = None
    elif args.tls_cert is None or args.tls_key is None:
        print(
            "sidecar inject-webhook: --tls-cert and --tls-key are required"
            " (the API server calls webhooks over HTTPS), or --insecure-http",
            file=sys.stderr,
        )
        return 2
    else:
        tls = (args.tls_cert, args.tls_key)
    if not args.cert_reload_s > 0:
        print("sidecar inject-webhook: --cert-reload-s must be positive", file=sys.stderr)
        return 2
    server = WebhookServer(config, args.host, args.port, tls, cert_reload_s=args.cert_reload_s)
    asyncio.run(_serve(server))
    return 0


async def _serve(server: WebhookServer) -> None:
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"inject-webhook ready on {server.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
