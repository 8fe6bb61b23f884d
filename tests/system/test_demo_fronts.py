"""`sidecar demo --front envoy|nginx` (DESIGN §12, §13): the demo behind a front."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from sidecar.cli.fronts_launch import envoy_binary, nginx_binary
from sidecar.cli.launch import StartError
from tests.rigs.paths import ROOT

try:
    envoy_binary()
    nginx_binary()
    _MISSING = ""
except StartError as exc:
    _MISSING = str(exc)
if _MISSING:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {_MISSING}", pytrace=False)
    pytest.skip(_MISSING, allow_module_level=True)


@pytest.mark.parametrize("front", ["envoy", "nginx"])
def test_demo_behind_a_front(front: str) -> None:
    """`sidecar demo --front`: the printed curl lines work through the front (a read
    forwarded by the front, a create through the proxy, the concealing 404, the 401),
    and Ctrl-C stops everything."""

    def get(url: str, token: str | None, data: bytes | None = None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar.cli", "demo", "--front", front, "--seconds", "120"],
        cwd=str(ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    url = ""
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            match = re.search(rf"{front} on (http://127\.0\.0\.1:\d+)", line)
            if match:
                url = match.group(1)
            if "Press Ctrl-C" in line:
                break
        output = "".join(lines)
        assert url, output
        servers = url + "/apis/compute/v1/tenants/{}/namespaces/default/servers"
        assert get(servers.format("acme"), "demo-alice") == 200
        assert get(servers.format("beta"), "demo-alice") == 404
        assert get(url + "/api/v1/nodes", None) == 401
        created = get(servers.format("acme"), "demo-alice", b'{"metadata":{"name":"front-1"}}')
        assert created == 201
        assert get(url + "/healthz", None) == 200
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, rest
        assert "demo stopped" in rest
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
