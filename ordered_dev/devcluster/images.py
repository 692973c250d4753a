"""`sidecar image`: the sidecar image (``Dockerfile``) and a Kafka + ZooKeeper test image.

Two ways to get the base images:

``registry``
    The Dockerfiles' defaults, pulled by the engine: ``python:3.11-slim-bookworm`` for
    the sidecar, ``eclipse-temurin:17-jre`` for the test servers. What an ordinary
    machine with Docker Hub access does; ``docker build .`` works the same.
``local``
    No registry needed. Each base is a Debian root filesystem made with
    ``debootstrap --variant=minbase bookworm`` from Debian's mirror (with python3 and
    python3-venv, or with a headless JRE), stripped of apt lists, caches and docs,
    cached as a tarball in ``<cache>/images/`` (``~/.cache/ordered-sidecar``) and
    ``docker import``ed. pip inside the build reaches no index either: a wheelhouse is
    downloaded on the host (where pip's TLS settings work) for the image's Python and
    platform, served on 127.0.0.1 while the build runs, and passed to the unchanged
    Dockerfile as ``PIP_FIND_LINKS`` with ``PIP_NO_INDEX=1``. Builds use the host's
    network (``--network host``), like every container of this project.

``auto`` (the default) is ``local`` as root on Debian, ``registry`` elsewhere.

The test image holds the jars ``sidecar devcluster install`` resolves, started by
``images/test-servers/run-server`` as ``kafka`` or ``zookeeper`` with a configuration
passed in the environment (see ``ordered_dev.devcluster.docker_cluster``).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import hashlib
import http.server
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ordered_dev.devcluster.docker_engine import Log, apt_install, docker_engine
from ordered_dev.devcluster.errors import DevClusterError
from ordered_dev.devcluster.install import (
    KAFKA_VERSION,
    ZOOKEEPER_VERSION,
    cache_root,
    ensure_installed,
)

ROOT = Path(__file__).resolve().parents[2]
SIDECAR_DOCKERFILE = ROOT / "Dockerfile"
LOCK_FILES = ("build.txt", "runtime.txt")
"""What the Dockerfile installs, from ``requirements/`` (``./run lock`` writes them)."""
SERVERS_DIR = ROOT / "images" / "test-servers"
SIDECAR_REPOSITORY = "ordered-sidecar"
SERVERS_IMAGE = f"ordered-sidecar-test-servers:kafka-{KAFKA_VERSION}-zookeeper-{ZOOKEEPER_VERSION}"
MODES = ("auto", "local", "registry")

DEBIAN_SUITE = "bookworm"
# The image's Python: bookworm's python3. The wheelhouse is downloaded for it.
DEBIAN_PYTHON = "3.11"
DEBIAN_GLIBC_MINOR = 36
MIRROR_ENV = "ORDERED_SIDECAR_DEBIAN_MIRROR"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
_IMPORT_CHANGES = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
]
# What a container never needs from a freshly bootstrapped system: package lists and
# downloaded packages (apt-get update restores the lists), logs, docs but the copyright
# files, manuals and translations. Also the host's resolver and name, which Docker
# mounts into every container anyway.
_STRIP = [
    "var/cache/apt/archives",
    "var/cache/apt/pkgcache.bin",
    "var/cache/apt/srcpkgcache.bin",
    "var/cache/debconf/templates.dat-old",
    "var/lib/apt/lists",
    "var/log",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "etc/resolv.conf",
    "etc/hostname",
]


@dataclass(frozen=True)
class BaseRecipe:
    """A Debian root filesystem: minbase plus ``packages``."""

    name: str
    packages: tuple[str, ...]

    @property
    def digest(self) -> str:
        recipe = " ".join([DEBIAN_SUITE, "minbase", *self.packages, *_STRIP])
        return hashlib.sha256(recipe.encode()).hexdigest()[:10]

    @property
    def tag(self) -> str:
        return f"ordered-sidecar-base/{self.name}:{DEBIAN_SUITE}-{self.digest}"

    @property
    def tarball(self) -> Path:
        return cache_root() / "images" / f"{self.name}-{DEBIAN_SUITE}-{self.digest}.tar"


PYTHON_BASE = BaseRecipe("python", ("python3", "python3-venv"))
JRE_BASE = BaseRecipe("jre", ("openjdk-17-jre-headless",))


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    size_bytes: int
    seconds: float


def resolve_mode(mode: str) -> str:
    """``local`` or ``registry`` for ``mode`` (one of MODES)."""
    if mode not in MODES:
        raise DevClusterError(f"image base must be one of {', '.join(MODES)}, not {mode!r}")
    if mode != "auto":
        return mode
    return "local" if _root_on_debian() else "registry"


def sidecar_image_tag() -> str:
    return f"{SIDECAR_REPOSITORY}:{importlib.metadata.version('ordered-sidecar')}"


def build_sidecar_image(mode: str = "auto", log: Log | None = None) -> BuiltImage:
    """Build ``Dockerfile`` into ``ordered-sidecar:<version>``; needs an engine (DOCKER_HOST).

    Raises DevClusterError with the tail of the build's output when it fails.
    """
    say = log or (lambda _message: None)
    began = time.monotonic()
    tag = sidecar_image_tag()
    command = ["build", "--network", "host", "--tag", tag, "--file", str(SIDECAR_DOCKERFILE)]
    command += ["--build-arg", f"VERSION={importlib.metadata.version('ordered-sidecar')}"]
    command += ["--build-arg", f"REVISION={_revision()}"]
    if resolve_mode(mode) == "local":
        base = ensure_base_image(PYTHON_BASE, say)
        wheelhouse = _download_wheelhouse(say)
        with _serve_directory(wheelhouse) as url:
            command += [
                "--build-arg",
                f"PYTHON_IMAGE={base}",
                "--build-arg",
                f"PIP_FIND_LINKS={url}",
                "--build-arg",
                "PIP_NO_INDEX=1",
                str(ROOT),
            ]
            _docker(command, say, legacy_builder=True)
    else:
        _docker([*command, str(ROOT)], say)
    return BuiltImage(tag, image_size(tag), time.monotonic() - began)


def _revision() -> str:
    """The commit the image is built from, for its OCI revision label."""
    result = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else "unknown"


def build_servers_image(mode: str = "auto", log: Log | None = None) -> BuiltImage:
    """Build the Kafka + ZooKeeper test image from the jars ``devcluster install`` resolves."""
    say = log or (lambda _message: None)
    began = time.monotonic()
    installed = ensure_installed()
    local = resolve_mode(mode) == "local"
    with tempfile.TemporaryDirectory(prefix="ordered-sidecar-servers-") as directory:
        context = Path(directory)
        for item in SERVERS_DIR.iterdir():
            shutil.copy2(item, context / item.name)
        _link_tree(installed.kafka_libs, context / "kafka-libs")
        _link_tree(installed.zookeeper_libs, context / "zookeeper-libs")
        command = ["build", "--network", "host", "--tag", SERVERS_IMAGE]
        if local:
            command += ["--build-arg", f"JRE_IMAGE={ensure_base_image(JRE_BASE, say)}"]
        _docker([*command, str(context)], say, legacy_builder=local)
    return BuiltImage(SERVERS_IMAGE, image_size(SERVERS_IMAGE), time.monotonic() - began)


def ensure_servers_image(mode: str = "auto", log: Log | None = None) -> str:
    """The test servers' image tag, built (from cached layers, about a second, when
    nothing changed) so that it matches ``images/test-servers`` and the jars."""
    build_servers_image(mode, log)
    return SERVERS_IMAGE


def ensure_base_image(recipe: BaseRecipe, log: Log) -> str:
    """``recipe``'s image in the engine: imported from the cached tarball, which is made
    with debootstrap first if it is not cached (about a minute or two each)."""
    if image_exists(recipe.tag):
        return recipe.tag
    tarball = recipe.tarball
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with (tarball.parent / ".lock").open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not tarball.exists():
            _debootstrap(recipe, tarball, log)
    changes = [word for change in _IMPORT_CHANGES for word in ("--change", change)]
    _docker(["import", *changes, str(tarball), recipe.tag], log)
    return recipe.tag


def image_exists(tag: str) -> bool:
    result = subprocess.run(
        [_docker_cli(), "image", "inspect", "--format", "{{.Id}}", tag],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode == 0


def image_size(tag: str) -> int:
    result = subprocess.run(
        [_docker_cli(), "image", "inspect", "--format", "{{.Size}}", tag],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(result.stdout.strip())


def _debootstrap(recipe: BaseRecipe, tarball: Path, log: Log) -> None:
    if not _root_on_debian():
        raise DevClusterError("local base images need debootstrap: run as root on Debian")
    if shutil.which("debootstrap") is None:
        log("image: installing Debian's debootstrap")
        apt_install("debootstrap")
    mirror = os.environ.get(MIRROR_ENV, DEFAULT_MIRROR)
    log(f"image: debootstrap {DEBIAN_SUITE} minbase + {' '.join(recipe.packages)} ({mirror})")
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".rootfs-{recipe.name}-", dir=tarball.parent))
    try:
        rootfs = work / "rootfs"
        command = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(recipe.packages)}",
            DEBIAN_SUITE,
            str(rootfs),
            mirror,
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            tail = (result.stdout + result.stderr)[-3000:]
            raise DevClusterError(f"debootstrap failed for the {recipe.name} base:\n{tail}")
        _strip(rootfs)
        partial = work / "rootfs.tar"
        subprocess.run(
            ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."], check=True
        )
        partial.replace(tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = tarball.stat().st_size / 2**20
    log(f"image: {recipe.name} base made in {time.monotonic() - began:.0f} s ({size:.0f} MiB)")


def _strip(rootfs: Path) -> None:
    for relative in _STRIP:
        path = rootfs / relative
        if path.is_dir() and not path.is_symlink():
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        elif path.exists() or path.is_symlink():
            path.unlink()
    (rootfs / "var" / "lib" / "apt" / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (rootfs / "var" / "cache" / "apt" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    docs = rootfs / "usr" / "share" / "doc"
    for path in sorted(docs.rglob("*"), reverse=True):
        if path.is_dir() and not path.is_symlink():
            with contextlib.suppress(OSError):
                path.rmdir()  # only once empty
        elif path.name != "copyright":
            path.unlink()


def _download_wheelhouse(log: Log) -> Path:
    """Wheels of the locked dependencies and build requirements (the files the
    Dockerfile installs, hashes checked) for the image's Python and platform,
    downloaded with the host's pip (and its TLS settings)."""
    requirements = ["--require-hashes"]
    for lock in LOCK_FILES:
        requirements += ["-r", str(ROOT / "requirements" / lock)]
    wheelhouse = ROOT / "var" / "image" / "wheelhouse"
    shutil.rmtree(wheelhouse, ignore_errors=True)
    wheelhouse.mkdir(parents=True)
    machine = platform.machine()
    platforms = [f"manylinux_2_{minor}_{machine}" for minor in range(DEBIAN_GLIBC_MINOR, 4, -1)]
    platforms += [f"manylinux{tag}_{machine}" for tag in ("2014", "2010", "1")]
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--dest",
        str(wheelhouse),
        "--only-binary=:all:",
        "--python-version",
        DEBIAN_PYTHON,
        "--implementation",
        "cp",
        "--abi",
        f"cp{DEBIAN_PYTHON.replace('.', '')}",
        *[word for tag in platforms for word in ("--platform", tag)],
        *requirements,
    ]
    began = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-3000:]
        raise DevClusterError(f"pip could not download the wheelhouse:\n{tail}")
    count = len(list(wheelhouse.glob("*.whl")))
    log(f"image: wheelhouse of {count} wheels in {time.monotonic() - began:.0f} s")
    return wheelhouse


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _serve_directory(directory: Path) -> Iterator[str]:
    """``directory`` over HTTP on 127.0.0.1 for the duration of the block; its URL.

    The port is the same for a checkout whenever it is free: the URL is a build
    argument, and a changed one would invalidate the build's cached pip layer.
    """
    handler = functools.partial(_QuietHandler, directory=str(directory))
    preferred = 20000 + int(hashlib.sha256(str(ROOT).encode()).hexdigest(), 16) % 10000
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", preferred), handler)
    except OSError:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="wheelhouse", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _link_tree(source: Path, target: Path) -> None:
    target.mkdir()
    for item in source.iterdir():
        if item.name.startswith("."):
            continue
        try:
            os.link(item, target / item.name)
        except OSError:
            shutil.copy2(item, target / item.name)


def _docker_cli() -> str:
    docker = shutil.which("docker")
    if docker is None:
        raise DevClusterError("the docker CLI is not installed (Debian's docker.io has it)")
    return docker


def _docker(arguments: list[str], log: Log, *, legacy_builder: bool = False) -> None:
    """Run ``docker <arguments>``; its output goes to ``var/image/docker.log``.

    ``legacy_builder``: Docker's classic builder, which needs no registry (BuildKit
    would fetch its Dockerfile frontend named by the ``# syntax=`` line).
    """
    environment = dict(os.environ)
    if legacy_builder:
        environment["DOCKER_BUILDKIT"] = "0"
    log_path = ROOT / "var" / "image" / "docker.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log(f"image: docker {' '.join(arguments)}")
    with log_path.open("a") as output:
        output.write(f"\n$ docker {' '.join(arguments)}\n")
        output.flush()
        result = subprocess.run(
            [_docker_cli(), *arguments],
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if result.returncode != 0:
        tail = log_path.read_text(errors="replace")[-4000:]
        raise DevClusterError(f"docker {arguments[0]} failed (log {log_path}):\n{tail}")


def _root_on_debian() -> bool:
    return os.geteuid() == 0 and Path("/etc/debian_version").exists()


# The command ----------------------------------------------------------------------------


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "image",
        help="build the sidecar image and the Kafka + ZooKeeper test image",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--base", choices=MODES, default="auto", help="default: %(default)s")
    parser.add_argument(
        "--sidecar-only", action="store_true", help="skip the Kafka + ZooKeeper test image"
    )
    parser.add_argument(
        "--keep-engine",
        action="store_true",
        help="leave the project's dockerd running and print its DOCKER_HOST",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except DevClusterError as exc:
        print(f"image: {exc}")
        return 1


def _run(args: argparse.Namespace) -> int:
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        engine = stack.enter_context(docker_engine(log=print))
        if args.keep_engine and engine.own:
            stack.pop_all()  # leave it running: no exit callbacks
        mode = resolve_mode(args.base)
        source = "debootstrap (local)" if mode == "local" else "the registry"
        print(f"image: base images from {source}")
        built = [build_sidecar_image(mode, print)]
        if not args.sidecar_only:
            built.append(build_servers_image(mode, print))
        for image in built:
            print(f"{image.tag}: {image.size_bytes / 1e6:.0f} MB, built in {image.seconds:.0f} s")
        print(f"done in {time.monotonic() - began:.0f} s (engine {engine.host})")
        if args.keep_engine and engine.own:
            print(f"the project's dockerd keeps running: export DOCKER_HOST={engine.host}")
            print(f"stop it with: kill $(cat {engine.engine_dir / 'dockerd.pid'})")
    return 0
