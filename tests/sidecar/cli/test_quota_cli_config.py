"""`sidecar quota …` reads only the ledger it is pointed at (issue 29 item 5): without
`--config` or `SIDECAR_CONFIG` it refuses (exit 2, saying how to point it at the
running sidecar's config) and creates nothing; with either, it uses that config's
ledger. The real command, as a process, in an empty working directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sidecar.config.settings import load_config

POLICY = """\
kind: QuotaDefaults
metadata: {name: defaults}
spec: {hard: {servers: 3}}
"""


def run(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "quota", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work


@pytest.mark.parametrize(
    "args",
    [
        ["list"],
        ["show", "acme"],
        ["usage", "acme"],
        ["update", "acme", "servers", "5", "--force"],
        ["reconcile"],
        ["defaults"],
    ],
)
def test_without_a_config_it_refuses_and_creates_nothing(workdir: Path, args: list[str]) -> None:
    done = run(workdir, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--config" in done.stderr
    assert "SIDECAR_CONFIG" in done.stderr
    assert "nothing was read or created" in done.stderr
    assert done.stdout == ""
    assert list(workdir.iterdir()) == []  # no ./.sidecar/ledger.db


def _config(tmp: Path) -> Path:
    policies = tmp / "policies"
    policies.mkdir()
    (policies / "quotas.yaml").write_text(POLICY)
    path = tmp / "sidecar.yaml"
    config = {
        "ledger": f"sqlite:///{tmp / 'data' / 'ledger.db'}",
        "policies": str(policies),
        "upstream": "http://127.0.0.1:1",
    }
    path.write_text(yaml.safe_dump(config))
    (tmp / "data").mkdir()
    return path


def test_sidecar_config_in_the_environment_points_it_at_that_ledger(
    tmp_path: Path, workdir: Path
) -> None:
    config = _config(tmp_path)
    env = {"SIDECAR_CONFIG": str(config)}
    done = run(workdir, "update", "acme", "servers", "7", "--force", env=env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "data" / "ledger.db").exists()
    # --config and SIDECAR_CONFIG reach the same ledger; the working directory stays empty
    for how in (env, None):
        extra = [] if how else ["--config", str(config)]
        done = run(workdir, "show", "acme", "--json", *extra, env=how)
        assert done.returncode == 0, done.stderr
        rows = {q["resource"]: q for q in json.loads(done.stdout)["quotas"]}
        assert rows["servers"]["hard_limit"] == 7
        assert rows["servers"]["source"] == "api"
    assert list(workdir.iterdir()) == []


def test_a_config_that_does_not_load_is_exit_2(tmp_path: Path, workdir: Path) -> None:
    done = run(workdir, "list", env={"SIDECAR_CONFIG": str(tmp_path / "missing.yaml")})
    assert done.returncode == 2
    assert "cannot read config file" in done.stderr
    assert list(workdir.iterdir()) == []


def test_defaults_reads_a_policy_directory_without_any_ledger(
    tmp_path: Path, workdir: Path
) -> None:
    config = _config(tmp_path)
    done = run(workdir, "defaults", "--policies", str(config.parent / "policies"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"hard": {"servers": 3}}
    assert list(workdir.iterdir()) == []
    assert not (tmp_path / "data" / "ledger.db").exists()


def test_serve_ignores_sidecar_config_as_a_key() -> None:
    """SIDECAR_CONFIG names a file (set in the manifests for `kubectl exec … sidecar
    quota`); it is not the config key `config`, which does not exist."""
    config = load_config(None, env={"SIDECAR_CONFIG": "/etc/sidecar/config/sidecar.yaml"})
    assert config.ledger.startswith("sqlite://")
