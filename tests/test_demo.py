"""`sidecar demo`: starts store + sidecar, seeds two tenants, serves the printed
curl lines, and stops both cleanly (no stray processes, ports free)."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from tests.harness import ROOT


def _get(url: str, token: str | None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _nothing_listens(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
    return False


def test_demo_runs_serves_and_stops_cleanly() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar.cli", "demo", "--seconds", "60"],
        cwd=str(ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    base = ""
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            match = re.search(r"sidecar on (http://127\.0\.0\.1:(\d+))", line)
            if match:
                base = match.group(1)
            if "Press Ctrl-C" in line:
                break
        output = "".join(lines)
        assert base, output
        assert "curl -s -H 'Authorization: Bearer demo-alice'" in output
        assert "seeding" not in output, output  # every seed call succeeded

        servers = "/apis/compute/v1/tenants/{}/namespaces/default/servers"
        code, body = _get(base + servers.format("acme"), "demo-alice")
        assert code == 200
        assert sorted(i["metadata"]["name"] for i in body["items"]) == ["db-1", "web-1"]
        code, body = _get(base + servers.format("beta"), "demo-alice")
        assert code == 404 and body["reason"] == "NotFound"
        code, body = _get(base + "/api/v1/nodes", "demo-alice")
        assert code == 200
        assert sorted(i["metadata"]["name"] for i in body["items"]) == ["node-a1", "node-a2"]
        code, body = _get(base + "/api/v1/nodes", "demo-admin")
        assert code == 200 and len(body["items"]) == 4
        code, body = _get(base + "/apis/compute/v1/servers", "demo-admin")
        assert code == 200 and len(body["items"]) == 3
        code, _ = _get(base + "/api/v1/nodes", None)
        assert code == 401
        code, body = _get(base + "/quota/v1/tenants/acme", "demo-alice")
        assert code == 200
        sidecar_port = int(base.rsplit(":", 1)[1])

        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, rest
        assert "demo stopped" in rest
        assert _nothing_listens(sidecar_port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
