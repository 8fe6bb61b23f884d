"""The real `kubectl`: where it is, or a skip where it is absent (a failure under
`CI=true`, where it must be installed). Tests take the `kubectl_binary` fixture of
tests/conftest.py; code that decides late whether it needs kubectl calls
`kubectl_binary()` here. `Kubectl` runs it against one server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest


def kubectl_binary() -> str:
    found = shutil.which("kubectl")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl is not installed (CI=true: this is a failure)")
        pytest.skip("kubectl is not installed")
    return found


class Kubectl:
    """The real kubectl against one server, with a kubeconfig (any bearer token) and a
    discovery cache of its own under `tmp`. The backing store trusts its caller, so a
    store started with `--assume-tenant system` serves kubectl's short paths (tenant
    `default`) directly."""

    def __init__(self, binary: str, server: str, tmp: Path) -> None:
        config = tmp / "kubeconfig"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "store", "cluster": {"server": server}}],
                    "users": [{"name": "any", "user": {"token": "any-token"}}],
                    "contexts": [
                        {
                            "name": "store",
                            "context": {"cluster": "store", "user": "any", "namespace": "default"},
                        }
                    ],
                    "current-context": "store",
                }
            )
        )
        self.base = [binary, "--cache-dir", str(tmp / "kcache")]
        self.env = {**os.environ, "KUBECONFIG": str(config), "HOME": str(tmp)}
        self.tmp = tmp

    def run(
        self, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*self.base, *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            input=stdin,
        )
        if check:
            assert proc.returncode == 0, f"kubectl {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
        return proc

    def names(self, *args: str) -> list[str]:
        out = self.run("get", *args, "-o", "jsonpath={.items[*].metadata.name}").stdout
        return out.split()

    def get(self, *args: str) -> Any:
        return json.loads(self.run("get", *args, "-o", "json").stdout)
