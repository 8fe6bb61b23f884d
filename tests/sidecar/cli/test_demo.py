"""`sidecar demo`'s policy directory: `--policies`, else ./policies, else the shipped
one next to the package, so the README's `pip install -e . && sidecar demo` works from
any directory (a newcomer started it from another directory and got "no policy
directory")."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.cli.demo import SHIPPED_POLICIES, demo_policies
from tests.rigs.paths import SHIPPED_POLICIES as REPO_POLICIES


def test_the_shipped_policies_are_found_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert SHIPPED_POLICIES == REPO_POLICIES.resolve()
    assert demo_policies(None) == SHIPPED_POLICIES


def test_a_policies_directory_here_comes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "policies").mkdir()
    monkeypatch.chdir(tmp_path)
    assert demo_policies(None) == (tmp_path / "policies").resolve()


def test_a_given_directory_that_is_missing_is_none(tmp_path: Path) -> None:
    assert demo_policies(str(tmp_path / "nope")) is None
    assert demo_policies(str(tmp_path)) == tmp_path.resolve()
