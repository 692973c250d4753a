"""The ZooKeeper adapter when kazoo has already forgotten its session (no server)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kazoo.exceptions import NodeExistsError

from sidecar.adapters.zookeeper import MetadataStore
from sidecar.core.errors import MetadataUnavailable
from sidecar.core.procedures import SessionState


class _SessionLostClient:
    """A lock node exists (someone's), and the session ended between the calls: kazoo
    then reports no client id."""

    client_id = None

    def create(self, *args: object, **kwargs: object) -> None:
        raise NodeExistsError()

    def get(self, path: str) -> tuple[bytes, SimpleNamespace]:
        return b"{}", SimpleNamespace(ephemeralOwner=72, version=0)


async def test_a_lock_attempt_as_the_session_ends_is_unavailable_not_a_bug() -> None:
    store = MetadataStore("127.0.0.1:1")
    store._client = _SessionLostClient()
    store._state = SessionState.CONNECTED  # what the store believed a moment ago
    with pytest.raises(MetadataUnavailable):
        async with store.lock("orders", "sidecar-a", timeout=0):
            pass
