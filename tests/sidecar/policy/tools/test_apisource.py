"""The offline tools take the API policy source too (issue 30 item 6): `dump-api` from a
real store, then `explain`, `who-can`, `can-i --list` and `diff` with `--api-dump`
(and `--api URL` straight)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli.main import main
from tests.rigs import processes
from tests.rigs.apipolicy import SYSTEM, _send, binding, ns_path, role
from tests.rigs.paths import SHIPPED_POLICIES

POLICIES = str(SHIPPED_POLICIES)
CM = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["policy", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def dump(tmp_path: Path, procs: processes.Processes, capsys: pytest.CaptureFixture[str]) -> Path:
    store = procs.store()

    async def write() -> None:
        for path, body in [
            ("/api/v1/tenants", {"metadata": {"name": "acme"}}),
            ("/api/v1/tenants/acme/namespaces", {"metadata": {"name": "dev"}}),
            (ns_path("acme", "dev", "roles"), role("r1", CM)),
            (ns_path("acme", "dev", "rolebindings"), binding("amy-reads", "Role", "r1", "amy")),
        ]:
            status, answer = await _send(store.url + path, "POST", dict(SYSTEM), body)
            assert status == 201, answer

    asyncio.run(write())
    out = tmp_path / "dump.json"
    code, _, err = run(capsys, "dump-api", "--api", store.url, "-o", str(out))
    assert code == 0, err
    return out


def test_explain_who_can_can_i_and_diff_see_the_api_objects(
    dump: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = "/api/v1/tenants/acme/namespaces/dev/configmaps"
    code, out, _ = run(
        capsys, "explain", "--user", "amy", "--tenant", "acme", "--json", "GET", path, POLICIES
    )
    assert code == 0
    assert json.loads(out)["decision"] == "deny"  # the files alone
    code, out, _ = run(
        capsys,
        "explain",
        "--user",
        "amy",
        "--tenant",
        "acme",
        "--json",
        "GET",
        path,
        POLICIES,
        "--api-dump",
        str(dump),
    )
    result: dict[str, Any] = json.loads(out)
    assert result["decision"] == "allow"
    assert "rolebinding acme/dev/amy-reads" in result["reason"]
    assert "+" in result["revision"]

    code, out, _ = run(
        capsys,
        "who-can",
        "list",
        "configmaps",
        "--tenant",
        "acme",
        "--namespace",
        "dev",
        "--json",
        "--api-dump",
        str(dump),
        POLICIES,
    )
    assert code == 0
    assert any("User amy" in h["subject"] for h in json.loads(out))

    code, out, _ = run(
        capsys,
        "can-i",
        "--list",
        "--user",
        "amy",
        "--tenant",
        "acme",
        "--namespace",
        "dev",
        "--json",
        "--api-dump",
        str(dump),
        POLICIES,
    )
    assert code == 0
    assert "configmaps" in out

    code, out, _ = run(capsys, "diff", POLICIES, POLICIES, "--api-dump", str(dump))
    assert code == 0


def test_a_bad_dump_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "Something"}')
    code, _, err = run(
        capsys,
        "explain",
        "--user",
        "a",
        "--tenant",
        "acme",
        "GET",
        "/api/v1/nodes",
        POLICIES,
        "--api-dump",
        str(bad),
    )
    assert code == 2
    assert "dump-api" in err
