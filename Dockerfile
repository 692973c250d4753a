# syntax=docker/dockerfile:1
# ordered-sidecar image: `sidecar serve` by default; `sidecar inject-webhook ...` for the
# Kubernetes webhook (same image). Two stages: the build stage installs the package into
# a virtualenv, the runtime stage copies only that virtualenv (no pip cache, no sources).
#
# `./run image` builds it on machines without a registry: PYTHON_IMAGE is then a Debian
# bookworm base made locally with debootstrap (see ordered_dev/devcluster/images.py).
#
# The base is pinned by tag. Pin it by digest too where you build, e.g.
#   docker build --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<digest> .
# (the digest is not written here because it could not be read from this build machine).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# pip reads these from the environment. The defaults change nothing (PyPI, as usual); a
# build machine that cannot reach an index passes a wheelhouse, as `./run image` does:
#   --build-arg PIP_FIND_LINKS=http://127.0.0.1:<port>/ --build-arg PIP_NO_INDEX=1
ARG PIP_FIND_LINKS=""
ARG PIP_NO_INDEX=0
# python3, not python: a base made from Debian's python3 package has only python3.
# Every package comes from the lock files (`./run lock` refreshes them), checked against
# their hashes. The build backend gets a virtualenv of its own, so the runtime one holds
# the sidecar and its dependencies only.
WORKDIR /src
COPY requirements/build.txt requirements/runtime.txt ./requirements/
RUN python3 -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir --require-hashes -r requirements/build.txt \
    && python3 -m venv /opt/ordered-sidecar \
    && /opt/ordered-sidecar/bin/pip install --no-cache-dir --require-hashes \
        -r requirements/runtime.txt
# Only what building the package reads: the project metadata (with its readme) and the
# package. Copied after the dependencies, so a change of code reuses their layer.
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
RUN /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /tmp/wheel . \
    && /opt/ordered-sidecar/bin/pip install --no-cache-dir --no-deps /tmp/wheel/*.whl \
    && /opt/ordered-sidecar/bin/python -m compileall -q /opt/ordered-sidecar

FROM ${PYTHON_IMAGE}
# OCI annotations (https://github.com/opencontainers/image-spec/blob/main/annotations.md);
# `./run image` passes the version and the commit.
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="ordered-sidecar" \
      org.opencontainers.image.description="Per-key ordered Kafka delivery across partition-count changes (KIP-253 outside the broker)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="python:3.11-slim-bookworm"
# A fixed numeric non-root uid, so Kubernetes' runAsNonRoot can verify it.
RUN groupadd --system --gid 10001 sidecar \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin sidecar
COPY --from=build /opt/ordered-sidecar /opt/ordered-sidecar
ENV PATH=/opt/ordered-sidecar/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
# The data plane (produce, consume, admin) listens on 127.0.0.1:8082: inside a pod every
# container shares localhost, so the app reaches it and nothing else does. Health,
# readiness and metrics have a listener of their own, 127.0.0.1:8081 by default; set
# ORDERED_SIDECAR__HTTP__OPS_HOST=0.0.0.0 where probes or scrapes come from outside the
# container's network namespace (Kubernetes probes and Prometheus do: the chart sets it).
EXPOSE 8081
# /readyz: 200 once Kafka, ZooKeeper and the transactional producers are there. The check
# runs inside the container's network namespace, so 127.0.0.1 works for either binding;
# a 503 raises HTTPError, which exits 1 too. (Kubernetes ignores HEALTHCHECK: its probes
# are in the chart.)
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('ORDERED_SIDECAR__HTTP__OPS_PORT', '8081'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/readyz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["sidecar"]
CMD ["serve"]
