"""Fixtures of the whole-system tests: the HTTPS cluster kubectl and the Python client
talk to (one per test module)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.rigs.cluster import ClusterEnv, start_cluster, stop_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterEnv]:
    env = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield env
    stop_cluster(env)
