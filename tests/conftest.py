"""Session fixtures shared by every test.

The ``cluster`` fixture starts one real cluster for the whole run (see
``ordered_dev.devcluster.provider`` for which one). Tests under ``tests/integration`` are
marked ``integration`` automatically; they fail, never skip, when the cluster is down.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from ordered_dev.devcluster.cluster import LocalCluster
from ordered_dev.devcluster.provider import (
    ClusterEndpoints,
    provide_cluster,
    provide_secured_cluster,
)
from ordered_dev.devcluster.security import LIMITED_USER

# The harness's checks assert; pytest explains their failures as it does the tests'.
pytest.register_assert_rewrite("ordered_dev.harness")

# No per-example deadline: on a 2-core machine running three brokers beside the tests,
# example timings vary with load, and a timing is not what these properties check.
settings.register_profile("ordered-sidecar", deadline=None)
settings.load_profile("ordered-sidecar")

_INTEGRATION_DIR = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _INTEGRATION_DIR in Path(item.path).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterEndpoints]:
    with provide_cluster() as endpoints:
        yield endpoints


@pytest.fixture(scope="session")
def secured_cluster() -> Iterator[LocalCluster]:
    """A second, secured cluster (``devcluster up --security sasl_ssl``, one broker),
    started only by the tests that ask for it; ``limited`` may use topics named
    ``granted-*``, any group and transactional id, and write idempotently."""
    with provide_secured_cluster() as secured:
        secured.grant_acls(
            f"User:{LIMITED_USER}",
            "topic:prefixed:granted-",
            "group:literal:*",
            "transactional_id:literal:*",
            # Not ALL: Create on the cluster would allow creating any topic.
            "cluster:literal:kafka-cluster:idempotent_write",
        )
        yield secured
