"""Discovery documents of the backing store (DESIGN §10), over HTTP against the real
store process, and the real `kubectl` 1.32 driven against it: discovery parses,
short names resolve, typed get/create/label/patch/delete, selectors, server-side
dry runs and a watch work.

The `kubectl` fixture (tests/backing_store/conftest.py) runs its store with
`--assume-tenant system` (short paths then mean tenant `default`). The kubectl tests
skip when the binary is absent, and fail instead under `CI=true`."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from kubernetes.client import ApiClient

from backing_store.resources import table
from tests.rigs import processes
from tests.rigs.kube import Kubectl

SYSTEM = {"X-Remote-User": "admin", "X-Remote-Tenant": "system"}

# The usual Kubernetes abbreviations, and the ones chosen for the seeds' own types.
SHORT_NAMES = {
    "poddisruptionbudgets": ["pdb"],
    "priorityclasses": ["pc"],
    "ingresses": ["ing"],
    "configmaps": ["cm"],
    "services": ["svc"],
    "pods": ["po"],
    "namespaces": ["ns"],
    "nodes": ["no"],
    "serviceaccounts": ["sa"],
    "deployments": ["deploy"],
    "replicasets": ["rs"],
    "statefulsets": ["sts"],
    "daemonsets": ["ds"],
    "cronjobs": ["cj"],
    "persistentvolumes": ["pv"],
    "persistentvolumeclaims": ["pvc"],
    "resourcequotas": ["quota"],
    "events": ["ev"],
    "endpoints": ["ep"],
    "replicationcontrollers": ["rc"],
    "limitranges": ["limits"],
    "servers": ["srv"],
}


@pytest.fixture
async def api(store: processes.Proc) -> AsyncIterator[Any]:
    async with aiohttp.ClientSession(store.url) as session:
        yield session


async def get_json(api: Any, path: str, code: int = 200) -> Any:
    async with api.get(path) as resp:
        assert resp.status == code, await resp.text()
        assert resp.content_type == "application/json"
        return await resp.json()


def resources_by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in doc["resources"]}


async def test_api_versions_and_version(api: Any) -> None:
    doc = await get_json(api, "/api")
    assert doc == {
        "kind": "APIVersions",
        "versions": ["v1"],
        # no address: the store's own is internal (it sits behind the sidecar)
        "serverAddressByClientCIDRs": [],
    }
    # the official Python client requires the field (a list), not an entry in it
    parsed = ApiClient().deserialize(json.dumps(doc), "V1APIVersions", "application/json")
    assert parsed.server_address_by_client_cidrs == []
    version = await get_json(api, "/version")
    assert (version["major"], version["minor"]) == ("1", "32")
    assert version["gitVersion"] == "v1.32.0-sidecar-store"
    assert version["platform"].count("/") == 1


async def test_core_resource_list(api: Any) -> None:
    doc = await get_json(api, "/api/v1")
    assert (doc["kind"], doc["apiVersion"], doc["groupVersion"]) == ("APIResourceList", "v1", "v1")
    res = resources_by_name(doc)
    assert res["configmaps"] == {
        "name": "configmaps",
        "singularName": "configmap",
        "namespaced": True,
        "kind": "ConfigMap",
        "verbs": [
            "get",
            "list",
            "watch",
            "create",
            "update",
            "patch",
            "delete",
            "deletecollection",
        ],
        "shortNames": ["cm"],
    }
    assert "shortNames" not in res["secrets"]
    # tenant-scoped and cluster-scoped types are not namespaced in the Kubernetes sense
    assert res["namespaces"]["namespaced"] is False
    assert res["tenants"]["namespaced"] is False
    assert res["nodes"]["namespaced"] is False
    # namespaces and tenants are deleted one at a time
    assert "deletecollection" not in res["namespaces"]["verbs"]
    assert "deletecollection" not in res["tenants"]["verbs"]
    # subresources the store serves are entries of their own
    assert res["nodes/power"]["kind"] == "NodePower"
    assert res["nodes/power"]["verbs"] == ["get", "update"]
    assert res["namespaces/status"]["verbs"] == ["get", "patch", "update"]
    assert res["pods/status"]["namespaced"] is True
    assert "namespaces/finalize" not in res  # not served: not listed
    assert "all" in res["pods"]["categories"]
    assert "categories" not in res["configmaps"]


async def test_every_table_row_is_discoverable(api: Any) -> None:
    groups = await get_json(api, "/apis")
    assert groups["kind"] == "APIGroupList"
    listed = {g["name"]: g for g in groups["groups"]}
    assert "" not in listed  # the core group is /api, not /apis
    for rt in table():
        if rt.group:
            group = listed[rt.group]
            assert group["preferredVersion"] == {
                "groupVersion": f"{rt.group}/{rt.version}",
                "version": rt.version,
            }
            assert {"groupVersion": f"{rt.group}/{rt.version}", "version": rt.version} in group[
                "versions"
            ]
            single = await get_json(api, f"/apis/{rt.group}")
            assert single["kind"] == "APIGroup"
            assert single["name"] == rt.group
            doc = await get_json(api, f"/apis/{rt.group}/{rt.version}")
        else:
            doc = await get_json(api, f"/api/{rt.version}")
        entry = resources_by_name(doc)[rt.plural]
        assert entry["kind"] == rt.kind
        assert entry["singularName"] == rt.kind.lower()
        assert entry["namespaced"] == (rt.scope == "namespace")
        assert entry.get("shortNames", []) == SHORT_NAMES.get(rt.plural, [])
        assert f"{rt.plural}/status" in resources_by_name(doc)
    compute = resources_by_name(await get_json(api, "/apis/compute/v1"))
    assert compute["servers/tags"]["verbs"] == ["get", "update", "delete"]
    baremetal = resources_by_name(await get_json(api, "/apis/baremetal/v1"))
    assert baremetal["allocations"]["namespaced"] is False


@pytest.mark.parametrize("path", ["/apis/nosuch", "/apis/nosuch/v1", "/apis/compute/v9", "/api/v9"])
async def test_unknown_discovery_paths_are_404_status(api: Any, path: str) -> None:
    body = await get_json(api, path, 404)
    assert body["kind"] == "Status"
    assert body["code"] == 404
    assert body["reason"] == "NotFound"


async def test_an_encoded_slash_in_a_discovery_path_is_400(api: Any) -> None:
    body = await get_json(api, "/apis/compute%2Fv1", 400)
    assert body["kind"] == "Status"
    assert body["code"] == 400


async def test_openapi_v2_is_an_empty_protobuf_document(api: Any) -> None:
    """kubectl's `create -f`/`apply` validation downloads /openapi/v2 (protobuf only) and
    fails on a 404; an empty document means "no schemas": validation skips each kind."""
    async with api.get("/openapi/v2") as resp:
        assert resp.status == 200
        assert resp.content_type.startswith("application/com.github.proto-openapi.spec.v2")
        assert await resp.read() == b""
    await get_json(api, "/openapi/v3", 404)


# -- the real kubectl ------------------------------------------------------------------


def test_kubectl_version_and_api_resources(kubectl: Kubectl) -> None:
    version = json.loads(kubectl.run("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v1.32.0-sidecar-store"
    out = kubectl.run("api-resources", "--no-headers").stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines()}
    assert rows["configmaps"][1:] == ["cm", "v1", "true", "ConfigMap"]
    assert rows["servers"][1:] == ["srv", "compute/v1", "true", "Server"]
    assert rows["namespaces"][1:] == ["ns", "v1", "false", "Namespace"]
    assert rows["allocations"][1:] == ["baremetal/v1", "false", "Allocation"]
    assert not any("/" in name for name in rows)  # subresources are not resources


def test_kubectl_typed_commands(kubectl: Kubectl) -> None:
    assert kubectl.names("configmaps", "-n", "default") == []
    assert kubectl.names("cm") == []
    assert kubectl.names("ns") == ["default", "system"]
    manifest = kubectl.tmp / "cm.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\n  labels: {app: web}\n"
        "data: {a: b}\n"
    )
    # a server-side dry run stores nothing
    out = kubectl.run("create", "-f", str(manifest), "--dry-run=server", "-o", "json").stdout
    assert json.loads(out)["metadata"]["name"] == "web"
    assert kubectl.names("cm") == []

    kubectl.run("create", "-f", str(manifest))
    manifest.write_text(manifest.read_text().replace("web", "db"))
    kubectl.run("create", "-f", str(manifest))
    assert kubectl.names("cm") == ["db", "web"]
    kubectl.run("label", "cm", "web", "tier=front")
    assert kubectl.names("cm", "-l", "tier=front") == ["web"]
    assert kubectl.names("cm", "-l", "app in (web,db),tier!=front") == ["db"]
    assert kubectl.names("cm", "-l", "!tier") == ["db"]
    assert kubectl.names("cm", "--field-selector", "metadata.name!=web") == ["db"]
    bad = kubectl.run("get", "cm", "-l", "app in (", check=False)
    assert bad.returncode != 0
    assert "BadRequest" in bad.stderr
    bad = kubectl.run("get", "cm", "--field-selector", "spec.x=1", check=False)
    assert bad.returncode != 0
    # worded as Kubernetes words it for a kind without selectable fields of its own
    assert '"spec.x" is not a known field selector' in bad.stderr

    kubectl.run(
        "patch", "cm", "web", "--type=json", "-p", '[{"op":"add","path":"/data/z","value":"1"}]'
    )
    got = json.loads(kubectl.run("get", "cm", "web", "-o", "json").stdout)
    assert got["data"] == {"a": "b", "z": "1"}
    assert got["metadata"]["labels"] == {"app": "web", "tier": "front"}

    # delete --dry-run=server puts dryRun in the DeleteOptions body
    kubectl.run("delete", "cm", "web", "--dry-run=server")
    assert kubectl.names("cm") == ["db", "web"]
    kubectl.run("delete", "cm", "-l", "app=db")
    assert kubectl.names("cm") == ["web"]
    assert kubectl.names("srv", "-A") == []


def test_kubectl_watch_with_a_name(kubectl: Kubectl) -> None:
    """`kubectl get cm NAME --watch` lists and watches with fieldSelector=metadata.name."""
    manifest = kubectl.tmp / "cm.json"
    manifest.write_text(
        json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w"}})
    )
    kubectl.run("create", "-f", str(manifest))
    watch = subprocess.Popen(
        [
            *kubectl.base,
            "get",
            "cm",
            "w",
            "--watch",
            "--output-watch-events",
            "-o",
            'jsonpath={.type} {.object.metadata.name} {.object.metadata.labels.step}{"\\n"}',
            "--request-timeout",
            "60s",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=kubectl.env,
    )
    try:
        assert watch.stdout is not None
        assert watch.stdout.readline().split() == ["ADDED", "w"]  # the initial list
        other = kubectl.tmp / "other.json"
        other.write_text(
            json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
        )
        kubectl.run("create", "-f", str(other))  # another name: not in this watch
        kubectl.run("label", "cm", "w", "step=one")
        assert watch.stdout.readline().split() == ["MODIFIED", "w", "one"]
    finally:
        watch.kill()
        watch.wait(5)
