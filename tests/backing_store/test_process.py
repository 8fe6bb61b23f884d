"""The backing store as a real process (`backing-store --port`): restart persistence;
and lists over 100,000 stored objects page correctly (figures printed, not asserted)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient

from backing_store.app import STORE_KEY, make_app
from backing_store.resources import SERVERS
from tests.rigs.paths import ROOT
from tests.rigs.processes import Proc, _spawn, free_port, start_store, wait_http

Client = TestClient[web.Request, web.Application]

SYSTEM = {"X-Remote-User": "admin", "X-Remote-Tenant": "system"}
WEB = "/apis/compute/v1/tenants/acme/namespaces/default/servers"


def console_script() -> list[str]:
    """`backing-store`, or (when the project is not pip-installed) the exact entry point
    that pyproject declares for it."""
    exe = shutil.which("backing-store") or shutil.which(
        "backing-store", path=str(Path(sys.executable).parent)
    )
    if exe:
        return [exe]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = scripts["backing-store"].split(":")
    return [sys.executable, "-c", f"import sys; from {module} import {func}; sys.exit({func}())"]


def call(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers=SYSTEM)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_console_script_serves_and_state_survives_restarts(tmp_path: Path) -> None:
    db = tmp_path / "data" / "store.db"  # the directory does not exist yet
    port = free_port()
    args = [*console_script(), "--host", "127.0.0.1", "--port", str(port), "--db", str(db)]
    first = Proc(_spawn(args, tmp_path / "first.log"), port, tmp_path / "first.log")
    try:
        wait_http(f"{first.url}/healthz", first)
        assert call(first.url, "POST", "/api/v1/tenants", {"metadata": {"name": "acme"}})[0] == 201
        status, _ = call(first.url, "POST", WEB, {"metadata": {"name": "web1"}, "tags": ["a"]})
        assert status == 201
        assert call(first.url, "PUT", f"{WEB}/web1/tags/b")[0] == 201
        node = {"metadata": {"name": "n1"}, "spec": {"owner": "acme", "resource_class": "gpu"}}
        assert call(first.url, "POST", "/api/v1/nodes", node)[0] == 201
        _, before = call(first.url, "GET", f"{WEB}/web1")
    finally:
        assert first.stop() == 0, first.log()  # SIGTERM is a clean shutdown
    assert f"127.0.0.1:{port}" in first.log()

    second = start_store(tmp_path, db=db)
    try:
        status, after = call(second.url, "GET", f"{WEB}/web1")
        assert status == 200
        assert after == before
        assert after["tags"] == ["a", "b"]
        _, listed = call(second.url, "GET", "/apis/compute/v1/servers?tags=a,b")
        assert [i["metadata"]["name"] for i in listed["items"]] == ["web1"]
        _, nodes = call(second.url, "GET", "/api/v1/nodes?owner=acme")
        assert [i["metadata"]["name"] for i in nodes["items"]] == ["n1"]
        _, namespaces = call(second.url, "GET", "/api/v1/tenants/acme/namespaces")
        assert len(namespaces["items"]) == 2
        # resourceVersion keeps increasing across restarts
        status, web2 = call(second.url, "POST", WEB, {"metadata": {"name": "web2"}})
        assert int(web2["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
        second.kill()  # even SIGKILL keeps committed writes
    finally:
        second.stop()

    third = start_store(tmp_path, db=db)
    try:
        _, listed = call(third.url, "GET", "/apis/compute/v1/tenants/acme/servers")
        assert [i["metadata"]["name"] for i in listed["items"]] == ["web1", "web2"]
        # reserved tenants were not seeded twice
        _, tenants = call(third.url, "GET", "/api/v1/tenants")
        assert [t["metadata"]["name"] for t in tenants["items"]] == ["acme", "default", "system"]
    finally:
        third.stop()


def test_python_dash_m_and_bad_port_exit_code(tmp_path: Path) -> None:
    busy = start_store(tmp_path)
    try:
        args = [
            sys.executable,
            "-m",
            "backing_store",
            "--port",
            str(busy.port),
            "--db",
            str(tmp_path / "other.db"),
        ]
        done = subprocess.run(args, capture_output=True, timeout=20, cwd=ROOT)
        assert done.returncode == 1
        assert b"backing-store:" in done.stderr
    finally:
        busy.stop()


TENANTS = 10
PER_TENANT = 10_000


async def test_lists_page_through_100k_objects(aiohttp_client: Any, tmp_path: Path) -> None:
    db = str(tmp_path / "big.db")
    app = make_app(db)  # creates the schema and the reserved tenants
    client: Client = await aiohttp_client(app)
    for t in range(TENANTS):
        resp = await client.post("/api/v1/tenants", json={"metadata": {"name": f"t{t}"}})
        assert resp.status == 201

    seed = app[STORE_KEY]  # the service's own connection: bulk seeding, no HTTP
    started = time.perf_counter()
    items = (
        (
            SERVERS.key(f"t{t}", "default", f"s{i:05d}"),
            {
                "kind": "Server",
                "apiVersion": "compute/v1",
                "metadata": {"name": f"s{i:05d}", "tenant": f"t{t}", "namespace": "default"},
                "spec": {"owner": f"t{t}"} if i % 100 == 0 else {},
                "tags": ["gold"] if i % 1000 == 0 else [],
            },
            ["gold"] if i % 1000 == 0 else None,
        )
        for t in range(TENANTS)
        for i in range(PER_TENANT)
    )
    assert seed.bulk_insert(items) == TENANTS * PER_TENANT
    print(f"\nseeded {TENANTS * PER_TENANT} servers in {time.perf_counter() - started:.2f}s")

    # a cluster-wide paged list (what quota reconcile does) sees every object once
    started = time.perf_counter()
    seen = 0
    pages = 0
    last = ""
    token = ""
    while True:
        params = {"limit": "5000", **({"continue": token} if token else {})}
        resp = await client.get("/apis/compute/v1/servers", params=params, headers=SYSTEM)
        assert resp.status == 200
        body = await resp.json()
        keys = [f"{i['metadata']['tenant']}/{i['metadata']['name']}" for i in body["items"]]
        assert keys == sorted(keys)
        assert not keys or keys[0] > last
        last = keys[-1] if keys else last
        seen += len(keys)
        pages += 1
        token = body["metadata"].get("continue", "")
        if not token:
            break
    assert (seen, pages) == (TENANTS * PER_TENANT, 20)
    print(f"paged 100k servers in {pages} pages in {time.perf_counter() - started:.2f}s")

    # filtered and deep pages answer with the right objects
    started = time.perf_counter()
    resp = await client.get("/apis/compute/v1/servers", params={"owner": "t7", "limit": "30"})
    body = await resp.json()
    assert [i["metadata"]["name"] for i in body["items"]][:2] == ["s00000", "s00100"]
    assert len(body["items"]) == 30
    assert body["metadata"]["continue"]
    resp = await client.get("/apis/compute/v1/tenants/t9/servers", params={"tags": "gold"})
    names = [i["metadata"]["name"] for i in (await resp.json())["items"]]
    assert names == [f"s{i:05d}" for i in range(0, PER_TENANT, 1000)]
    resp = await client.get(
        "/apis/compute/v1/tenants/t3/namespaces/default/servers", params={"limit": "1"}
    )
    assert [i["metadata"]["name"] for i in (await resp.json())["items"]] == ["s00000"]
    print(f"three filtered lists in {time.perf_counter() - started:.3f}s")
