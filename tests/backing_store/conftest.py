"""Fixtures of the backing store's tests: the real kubectl against a real store process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rigs import processes
from tests.rigs.kube import Kubectl


@pytest.fixture
def kubectl(tmp_path: Path, kubectl_binary: str, procs: processes.Processes) -> Kubectl:
    """kubectl talking to a store process directly. kubectl cannot send
    `X-Remote-Tenant`, so the store runs with `--assume-tenant system`: its short paths
    (`/api/v1/namespaces/default/...`) mean tenant `default`."""
    proc = procs.store(extra_args=["--assume-tenant", "system"])
    return Kubectl(kubectl_binary, proc.url, tmp_path)
