"""`sidecar.cli.launch`: the store and the sidecar started as real processes, answering, and
stopped; a start that fails leaves nothing running (a sidecar that does not start
never leaves its store behind)."""

from __future__ import annotations

import json
import socket
import sys
import urllib.request
from pathlib import Path
from typing import Any, cast

import pytest

from sidecar.cli import launch
from tests.rigs import stack
from tests.rigs.paths import ROOT


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _running_with(fragment: str) -> list[int]:
    """Pids of live processes whose command line mentions `fragment`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if fragment in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def _sidecar_config(tmp: Path, upstream: str) -> dict[str, Any]:
    return {
        **stack.sidecar_config(tmp, upstream, 5),
        "ledger": f"sqlite:///{tmp / 'ledger.db'}",
    }


def test_store_and_sidecar_start_answer_and_stop(tmp_path: Path) -> None:
    with launch.ProcessGroup() as group:
        store = group.add(launch.start_store(tmp_path, cwd=ROOT))
        config = _sidecar_config(tmp_path, store.url)
        sidecar = group.add(launch.start_sidecar(tmp_path, config, cwd=ROOT))
        assert sidecar.config == tmp_path / f"sidecar-{sidecar.port}.yaml"
        request = urllib.request.Request(
            f"{sidecar.url}/api/v1/tenants", headers={"Authorization": f"Bearer {stack.ADMIN}"}
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 200
            assert json.loads(resp.read())["kind"] == "TenantList"
    for proc in (store, sidecar):
        assert proc.proc.returncode is not None
        assert not _listening(proc.port)
    assert not _running_with(str(tmp_path))


def test_a_sidecar_that_fails_to_start_leaves_no_store(tmp_path: Path) -> None:
    stores: list[launch.Process] = []

    def start_both() -> None:
        with launch.ProcessGroup() as group:
            store = group.add(launch.start_store(tmp_path, cwd=ROOT))
            stores.append(store)
            config = {**_sidecar_config(tmp_path, store.url), "policies": "/nonexistent"}
            group.add(launch.start_sidecar(tmp_path, config, cwd=ROOT))

    with pytest.raises(launch.StartError, match="exited"):
        start_both()
    assert stores[0].proc.returncode is not None
    assert not _running_with(str(tmp_path))


async def test_the_stack_rig_leaves_no_store_when_its_sidecar_fails(tmp_path: Path) -> None:
    with pytest.raises(launch.StartError):
        async with stack.running_env(tmp_path, 5, policies="/nonexistent"):
            raise AssertionError("the sidecar started")
    assert not _running_with(str(tmp_path))


def test_a_child_that_exits_is_reported_at_once(tmp_path: Path) -> None:
    args = [sys.executable, "-c", "raise SystemExit(3)"]
    with pytest.raises(launch.StartError, match="exited with 3") as raised:
        launch.start_command("exits", args, launch.free_port(), tmp_path / "exits.log")
    assert not isinstance(raised.value, launch.AddressInUse)


def test_a_child_that_never_answers_is_killed(tmp_path: Path) -> None:
    args = [sys.executable, "-c", "import time; time.sleep(600)"]
    with pytest.raises(launch.StartError, match="not ready"):
        launch.start_command("silent", args, launch.free_port(), tmp_path / "s.log", timeout=0.2)
    assert not _running_with("time.sleep(600)")


def test_a_taken_port_is_retried_on_new_ports_when_picked() -> None:
    tries: list[int] = []
    started = cast(launch.Process, object())

    def start() -> launch.Process:
        tries.append(1)
        if len(tries) < 3:
            raise launch.AddressInUse("taken")
        return started

    assert launch.start_on_free_ports(start, picked=True) is started
    assert len(tries) == 3
    tries.clear()
    with pytest.raises(launch.AddressInUse):
        launch.start_on_free_ports(start, picked=False)
    assert len(tries) == 1


def test_a_store_on_a_taken_port_given_by_the_caller_fails_with_address_in_use(
    tmp_path: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(launch.AddressInUse):
            launch.start_store(tmp_path, port=port, cwd=ROOT)
