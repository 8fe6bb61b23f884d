"""Identity config errors (DESIGN §4, §9): a missing or broken credential file is the
operator's to fix, so `sidecar serve` exits non-zero with ONE line that names the key
and the problem, never a traceback (which buries the cause and prints internals).
Real `sidecar serve` processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.rigs import paths, processes

GOOD_TOKEN = {"token": "t-alice", "user": "alice", "tenant": "acme", "groups": []}


def serve(
    tmp: Path, identity: dict[str, Any], workers: int = 1
) -> subprocess.CompletedProcess[str]:
    config = {
        "workers": workers,
        "listen": f"127.0.0.1:{processes.free_port()}",
        "upstream": "http://127.0.0.1:9",
        "policies": str(paths.ROOT / "policies"),
        "ledger": f"sqlite:///{tmp / 'ledger.db'}",
        "audit": {"path": str(tmp / "audit.log")},
        "identity": identity,
    }
    path = processes.write_config(tmp, config)
    return subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "serve", "--config", str(path)],
        cwd=paths.ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def write(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


CASES: dict[str, tuple[Any, str]] = {
    # name: (identity config, built from tmp; text the one line must contain)
    "missing token file": (lambda t: {"tokenFile": str(t / "nope.yaml")}, "identity.tokenFile"),
    "bad tenant in token file": (
        lambda t: {
            "tokenFile": write(
                t,
                "tokens.yaml",
                yaml.safe_dump(
                    [GOOD_TOKEN, {**GOOD_TOKEN, "token": "t-x", "tenant": "Not_A_Tenant"}]
                ),
            )
        },
        "Not_A_Tenant",
    ),
    "token file not YAML": (
        lambda t: {"tokenFile": write(t, "tokens.yaml", "- {token: [\n")},
        "identity.tokenFile",
    ),
    "token file not a list": (
        lambda t: {"tokenFile": write(t, "tokens.yaml", "a: 1\n")},
        "identity.tokenFile",
    ),
    # DESIGN §4: an empty file (as a half-written one is) fails like a broken one; only
    # an explicit `[]` means "no static tokens".
    "empty token file": (lambda t: {"tokenFile": write(t, "tokens.yaml", "")}, "empty"),
    "whitespace-only token file": (
        lambda t: {"tokenFile": write(t, "tokens.yaml", " \n\t\n")},
        "identity.tokenFile",
    ),
    "comments-only token file": (
        lambda t: {"tokenFile": write(t, "tokens.yaml", "# tokens come later\n")},
        "identity.tokenFile",
    ),
    "empty public key file": (
        lambda t: {"jwt": {"algorithms": ["RS256"], "publicKeyFile": write(t, "key.pem", "")}},
        "identity.jwt.publicKeyFile",
    ),
    "whitespace-only JWKS file": (
        lambda t: {"jwt": {"algorithms": ["RS256"], "jwksFile": write(t, "jwks.json", "\n  \n")}},
        "identity.jwt.jwksFile",
    ),
    "missing public key file": (
        lambda t: {"jwt": {"algorithms": ["RS256"], "publicKeyFile": str(t / "key.pem")}},
        "identity.jwt.publicKeyFile",
    ),
    "public key file not PEM": (
        lambda t: {
            "jwt": {"algorithms": ["RS256"], "publicKeyFile": write(t, "key.pem", "not a key\n")}
        },
        "identity.jwt.publicKeyFile",
    ),
    "missing JWKS file": (
        lambda t: {"jwt": {"algorithms": ["RS256"], "jwksFile": str(t / "jwks.json")}},
        "identity.jwt.jwksFile",
    ),
    "JWKS file not JSON": (
        lambda t: {"jwt": {"algorithms": ["RS256"], "jwksFile": write(t, "jwks.json", "{")}},
        "identity.jwt.jwksFile",
    ),
    "unusable secret": (
        lambda t: {
            "jwt": {
                "algorithms": ["HS256"],
                "secret": "-----BEGIN PUBLIC KEY-----\nabc\n-----END PUBLIC KEY-----",
            }
        },
        "identity.jwt.secret",
    ),
    "secret without an HS algorithm": (
        lambda t: {"jwt": {"algorithms": ["RS256"], "secret": "x" * 32}},
        "identity.jwt.secret",
    ),
    "unknown algorithm": (
        lambda t: {"jwt": {"algorithms": ["HS999"], "secret": "x" * 32}},
        "identity.jwt.algorithms",
    ),
    "bad trusted client": (
        lambda t: {"trustedHeaders": {"enabled": True, "clients": ["not-an-ip"]}},
        "identity.trustedHeaders.clients",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_identity_config_error_is_one_line(tmp_path: Path, case: str) -> None:
    build, expected = CASES[case]
    result = serve(tmp_path, build(tmp_path))
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sidecar: "), lines[0]
    assert expected in lines[0], lines[0]


def test_one_line_with_several_workers(tmp_path: Path) -> None:
    result = serve(tmp_path, {"tokenFile": str(tmp_path / "nope.yaml")}, workers=3)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "identity.tokenFile" in lines[0], result.stderr
