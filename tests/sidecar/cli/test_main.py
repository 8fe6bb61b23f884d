"""The `sidecar` command itself (sidecar/cli/main.py): what every subcommand shares."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.rigs import paths


def test_a_reader_that_goes_away_is_no_traceback() -> None:
    """`sidecar policy explain --json … | head -c 300` printed a BrokenPipeError
    traceback: the command now stops quietly with exit 1."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes anything
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "sidecar.cli",
                "policy",
                "explain",
                "--user",
                "bob",
                "--tenant",
                "acme",
                "--json",
                "GET",
                "/api/v1/tenants/acme/namespaces/dev/pods",
                str(paths.ROOT / "policies"),
            ],
            stdout=write,
            stderr=subprocess.PIPE,
            cwd=paths.ROOT,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert done.returncode == 1, done.stderr
    assert b"Traceback" not in done.stderr, done.stderr
    assert b"BrokenPipeError" not in done.stderr, done.stderr
