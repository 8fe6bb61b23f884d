"""`sidecar policy check`: one failing-policy fixture per check, each with its expected
`line: message` lines (tests/fixtures/bad_policies/<check>/expected.txt); plus the
bad inputs that cannot live in the repository (huge file, symlink loop)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.cli.policy import validate
from sidecar.policy.source import files as policy_files
from tests.rigs import paths

ROOT = paths.ROOT
FIXTURES = paths.FIXTURES / "bad_policies"
CASES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


def expected_lines(case: str) -> list[tuple[int, str]]:
    out = []
    for raw in (FIXTURES / case / "expected.txt").read_text().splitlines():
        if raw.strip():
            line, _, message = raw.partition(": ")
            out.append((int(line), message))
    return out


def test_every_check_has_a_fixture() -> None:
    wanted = {
        "unknown_kind",
        "unknown_field",
        "unknown_rule_field",
        "bad_verb",
        "dangling_roleref",
        "cross_tenant_subject",
        "cross_tenant_roleref",
        "role_of_other_tenant",
        "reserved_tenant",
        "duplicate_name",
        "owner_verb",
        "owner_non_resource",
        "not_yaml",
        "not_mapping",
        "no_kind",
        "bad_tenant_name",
        "star_user",
        "tenant_mode_bad",
        "tenant_mode_duplicate",
        "policy_test_bad",
    }
    assert wanted <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_fixture_reports_exactly_its_problems(case: str) -> None:
    policy = FIXTURES / case / "policy.yaml"
    _, problems, _ = validate([str(FIXTURES / case)])
    expected = expected_lines(case)
    assert expected, f"{case} has no expected lines"
    for line, message in expected:
        assert any(
            p.file == str(policy) and p.line == line and message in p.message for p in problems
        ), f"{case}: wanted {line}: {message!r}, got {[str(p) for p in problems]}"
    assert len(problems) == len(expected), [str(p) for p in problems]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "policy", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_prints_all_problems_of_all_files_in_one_run(tmp_path: Path) -> None:
    for case in ("bad_verb", "dangling_roleref", "not_yaml", "tenant_mode_bad"):
        (tmp_path / f"{case}.yaml").write_text((FIXTURES / case / "policy.yaml").read_text())
    result = run_cli("check", str(tmp_path))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 5
    assert f"{tmp_path}/bad_verb.yaml:8: unknown verb 'fetch'" in result.stdout
    assert f"{tmp_path}/dangling_roleref.yaml:5: roleRef:" in result.stdout
    assert f"{tmp_path}/not_yaml.yaml:3: not valid YAML" in result.stdout
    assert f"{tmp_path}/tenant_mode_bad.yaml:6: unknown field 'spec.level'" in result.stdout
    for line in lines:
        file, lineno, message = line.split(":", 2)
        assert Path(file).is_file()
        assert int(lineno) > 0
        assert message.startswith(" ")


def test_cli_check_clean_policy_exits_zero() -> None:
    result = run_cli("check", "policies")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_cli_missing_directory_is_a_problem(tmp_path: Path) -> None:
    result = run_cli("check", str(tmp_path / "nope"))
    assert result.returncode == 1
    assert "no such policy file or directory" in result.stdout


def test_huge_file_is_reported_not_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy_files, "MAX_FILE_BYTES", 1024)
    (tmp_path / "huge.yaml").write_text("kind: ClusterRole\n# " + "x" * 4096 + "\n")
    _, problems, _ = validate([str(tmp_path)])
    assert [p.message for p in problems] == ["file is larger than 1024 bytes"]


def test_symlink_loop_is_reported_once_and_files_still_read(tmp_path: Path) -> None:
    (tmp_path / "roles.yaml").write_text("kind: NotAKind\nmetadata: {name: x}\n")
    (tmp_path / "loop").symlink_to(tmp_path, target_is_directory=True)
    _, problems, _ = validate([str(tmp_path)])
    messages = sorted(p.message for p in problems)
    assert messages == ["symlink loop skipped", "unknown kind 'NotAKind'"]
