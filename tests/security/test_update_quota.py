"""Finding 11: updates and patches must not escape the quota (DESIGN §7).

Against the real sidecar and the real backing store (SQLite ledger; one attack also on
Redis): raising an object's charge by merge patch or PUT reserves the increase first
(403 QuotaExceeded, object unchanged, when there is no room), a decrease frees room, a
JSON patch is applied and charged, and a bad patch is a 4xx with nothing reserved.

The charge of an update is that of the object the store's own dry run of the same
request answers, so every patch type is charged exactly as the store applies it: the
real kubectl's strategic merge patch (by container name: a plain merge would drop the
other container and charge less than is stored), `set image`, merge and JSON patches,
and server-side apply — each time the ledger's charge equals the stored object's.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from sidecar.core.quantities import format_units
from sidecar.services.quota.meters import charge_for
from tests.rigs import processes
from tests.rigs.cluster import ClusterEnv, start_cluster, stop_cluster
from tests.rigs.ledgers import ledger_for_kind
from tests.rigs.quota import (
    DEPLOYMENTS,
    PODS,
    Gate,
    deployment,
    pod,
    quota_env,
)

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def cpu_of(obj: dict[str, Any]) -> Any:
    return obj["spec"]["containers"][0]["resources"]["requests"].get("cpu")


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_patching_a_pod_to_5000_cpu_is_refused(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url, extra = ledger_for_kind(kind, tmp_path, request)
    async with quota_env(tmp_path, url, **extra) as env:
        status, _ = await env.send("POST", PODS, pod("p", cpu="100m"))
        assert status == 201
        patch = {
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "x",
                        "resources": {"requests": {"cpu": "5000", "memory": "100Ti"}},
                    }
                ]
            }
        }
        status, body = await env.send("PATCH", PODS + "/p", patch, content_type=MERGE)
        assert status == 403, body
        assert body["reason"] == "QuotaExceeded", body
        stored = await env.stored(PODS + "/p")
        assert cpu_of(stored) == "100m"
        assert await env.usage("requests.cpu") == ("100m", "0")


async def test_put_raising_cpu_is_refused(tmp_path: Path) -> None:
    async with quota_env(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}") as env:
        assert (await env.send("POST", PODS, pod("p", cpu="1")))[0] == 201
        status, body = await env.send("PUT", PODS + "/p", pod("p", cpu="4500m"))
        assert status == 403, body
        assert body["reason"] == "QuotaExceeded", body
        assert cpu_of(await env.stored(PODS + "/p")) == "1"
        status, body = await env.send("PUT", PODS + "/p", pod("p", cpu="3"))
        assert status == 200, body
        assert await env.usage("requests.cpu") == ("3", "0")


async def test_scaling_a_deployment_from_0_to_1000_is_refused(tmp_path: Path) -> None:
    async with quota_env(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}") as env:
        status, body = await env.send("POST", DEPLOYMENTS, deployment("web", 0, "100m"))
        assert status == 201, body
        assert await env.usage("requests.cpu") == ("0", "0")
        status, body = await env.send(
            "PATCH", DEPLOYMENTS + "/web", {"spec": {"replicas": 1000}}, content_type=MERGE
        )
        assert status == 403, body
        assert body["reason"] == "QuotaExceeded", body
        assert (await env.stored(DEPLOYMENTS + "/web"))["spec"]["replicas"] == 0
        # Within the limit it is charged: 40 x 100m = the whole 4 cpu.
        status, body = await env.send(
            "PATCH", DEPLOYMENTS + "/web", {"spec": {"replicas": 40}}, content_type=MERGE
        )
        assert status == 200, body
        assert await env.usage("requests.cpu") == ("4", "0")
        status, body = await env.send("POST", PODS, pod("one-more", cpu="1m"))
        assert status == 403, body


async def test_a_decrease_frees_room(tmp_path: Path) -> None:
    async with quota_env(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}") as env:
        assert (await env.send("POST", PODS, pod("a", cpu="3")))[0] == 201
        assert (await env.send("POST", PODS, pod("b", cpu="1")))[0] == 201
        grow_b = {
            "spec": {
                "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "2"}}}]
            }
        }
        status, _ = await env.send("PATCH", PODS + "/b", grow_b, content_type=MERGE)
        assert status == 403
        shrink_a = {
            "spec": {
                "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]
            }
        }
        status, body = await env.send("PATCH", PODS + "/a", shrink_a, content_type=MERGE)
        assert status == 200, body
        assert await env.usage("requests.cpu") == ("2", "0")
        status, body = await env.send("PATCH", PODS + "/b", grow_b, content_type=MERGE)
        assert status == 200, body
        assert await env.usage("requests.cpu") == ("3", "0")


async def test_json_patch_raising_replicas_is_charged(tmp_path: Path) -> None:
    async with quota_env(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}") as env:
        assert (await env.send("POST", DEPLOYMENTS, deployment("web", 1, "100m")))[0] == 201
        ops = [
            {"op": "test", "path": "/spec/replicas", "value": 1},
            {"op": "replace", "path": "/spec/replicas", "value": 30},
        ]
        status, body = await env.send("PATCH", DEPLOYMENTS + "/web", ops, content_type=JSON_PATCH)
        assert status == 200, body
        assert await env.usage("requests.cpu") == ("3", "0")
        ops = [
            {
                "op": "copy",
                "from": "/spec/template/spec/containers/0",
                "path": "/spec/template/spec/containers/-",
            }
        ]
        status, body = await env.send("PATCH", DEPLOYMENTS + "/web", ops, content_type=JSON_PATCH)
        assert status == 403, body
        assert body["reason"] == "QuotaExceeded", body
        stored = await env.stored(DEPLOYMENTS + "/web")
        assert len(stored["spec"]["template"]["spec"]["containers"]) == 1
        ops = [{"op": "replace", "path": "/spec/replicas", "value": 1000}]
        status, body = await env.send("PATCH", DEPLOYMENTS + "/web", ops, content_type=JSON_PATCH)
        assert status == 403, body
        assert body["reason"] == "QuotaExceeded", body
        assert (await env.stored(DEPLOYMENTS + "/web"))["spec"]["replicas"] == 30


@pytest.mark.parametrize(
    ("content_type", "body", "code"),
    [
        (JSON_PATCH, {"op": "replace"}, 400),
        (JSON_PATCH, [{"op": "replace", "path": "/spec/nothing/here", "value": 1}], 422),
        (JSON_PATCH, [{"op": "test", "path": "/spec/replicas", "value": 7}], 422),
        (JSON_PATCH, [{"op": "jump", "path": "/spec"}], 400),
        (MERGE, b"{not json", 400),
        (MERGE, {"spec": {"replicas": -1}}, 400),
        (
            MERGE,
            {
                "spec": {
                    "template": {
                        "spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}
                    }
                }
            },
            400,
        ),
        (MERGE, [1, 2], 400),
        ("application/apply-patch+yaml", b"spec: {}", 422),
    ],
)
async def test_a_bad_patch_is_4xx_and_reserves_nothing(
    tmp_path: Path, content_type: str, body: Any, code: int
) -> None:
    async with quota_env(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}") as env:
        assert (await env.send("POST", DEPLOYMENTS, deployment("web", 1, "100m")))[0] == 201
        status, answer = await env.send(
            "PATCH", DEPLOYMENTS + "/web", body, content_type=content_type
        )
        assert status == code, answer
        assert answer["kind"] == "Status", answer
        assert await env.usage("requests.cpu") == ("100m", "0")
        assert (await env.stored(DEPLOYMENTS + "/web"))["spec"]["replicas"] == 1


async def test_concurrent_updates_of_one_object_409(tmp_path: Path) -> None:
    """While one update of an object is in flight, another is refused (its charge was
    computed from the object as it was before the first landed)."""
    store = processes.start_store(tmp_path)
    gate = Gate(store.url, lambda r: r.method == "PATCH")
    relay = TestServer(gate.app(), host="127.0.0.1")
    await relay.start_server()
    try:
        async with quota_env(
            tmp_path,
            f"sqlite:///{tmp_path / 'ledger.db'}",
            upstream=str(relay.make_url("")).rstrip("/"),
            store=store,
        ) as env:
            assert (await env.send("POST", DEPLOYMENTS, deployment("web", 1, "100m")))[0] == 201
            first = asyncio.create_task(
                env.send(
                    "PATCH", DEPLOYMENTS + "/web", {"spec": {"replicas": 30}}, content_type=MERGE
                )
            )
            await asyncio.wait_for(gate.held.wait(), 10)
            patch = {
                "spec": {
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}
                            ]
                        }
                    }
                }
            }
            status, body = await env.send("PATCH", DEPLOYMENTS + "/web", patch, content_type=MERGE)
            assert status == 409, body
            gate.open.set()
            status, body = await asyncio.wait_for(first, 20)
            assert status == 200, body
            assert await env.usage("requests.cpu") == ("3", "0")
            status, body = await env.send("PATCH", DEPLOYMENTS + "/web", patch, content_type=MERGE)
            assert status == 403, body  # 30 x 1 cpu
            assert json.dumps(await env.stored(DEPLOYMENTS + "/web")).count('"100m"') == 1
    finally:
        await relay.close()
        store.stop()


# -- every patch type, charged as the store applies it (the upstream's dry run) ----------


@pytest.fixture(scope="module")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterEnv]:
    env = start_cluster(tmp_path_factory.mktemp("patch-cluster"))
    yield env
    stop_cluster(env)


def kubectl(binary: str, env: ClusterEnv, *args: str, stdin: str = "") -> tuple[int, str]:
    proc = subprocess.run(
        [binary, "--kubeconfig", str(env.kubeconfigs["alice"]), "--request-timeout=20s", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(env.tmp), "KUBECACHEDIR": str(env.tmp / "kcache")},
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def two_containers(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {"name": "a", "image": "x:1", "resources": {"requests": {"cpu": "100m"}}},
                        {"name": "b", "image": "y:1", "resources": {"requests": {"cpu": "200m"}}},
                    ]
                },
            },
        },
    }


def charged_as_stored(env: ClusterEnv, name: str) -> tuple[str, str, dict[str, Any]]:
    """(the ledger's cpu used, the cpu of the object the store holds, that object)."""
    status, stored = env.call(
        "admin", "GET", f"/apis/apps/v1/tenants/acme/namespaces/ns1/deployments/{name}"
    )
    assert status == 200, stored
    cpu = charge_for("deployments", stored).get("requests.cpu", 0)
    return env.used("acme", "requests.cpu"), str(format_units("requests.cpu", cpu)), stored


def test_every_patch_type_is_charged_as_the_store_applies_it(
    kube_cluster: ClusterEnv, kubectl_binary: str
) -> None:
    env = kube_cluster

    def ok(*args: str, stdin: str = "") -> None:
        code, out = kubectl(kubectl_binary, env, *args, stdin=stdin)
        assert code == 0, f"kubectl {' '.join(args)}: {out}"

    def agrees(want: str) -> dict[str, Any]:
        used, stored_cpu, stored = charged_as_stored(env, "web")
        assert (used, stored_cpu) == (want, want), stored["spec"]
        return stored

    ok("create", "-f", "-", stdin=json.dumps(two_containers("web")))
    agrees("600m")  # 2 x (100m + 200m)
    # kubectl's default (strategic merge) patch, merged by container name: `a` stays.
    ok(
        "patch",
        "deployment",
        "web",
        "-p",
        json.dumps(
            {
                "spec": {
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "b", "resources": {"requests": {"cpu": "500m"}}}
                            ]
                        }
                    }
                }
            }
        ),
    )
    stored = agrees("1200m")  # 2 x (100m + 500m): a plain merge would have said 1
    assert [c["name"] for c in stored["spec"]["template"]["spec"]["containers"]] == ["a", "b"]
    ok("set", "image", "deployment/web", "a=x:2")
    assert len(agrees("1200m")["spec"]["template"]["spec"]["containers"]) == 2
    ok("patch", "deployment", "web", "--type", "merge", "-p", '{"spec":{"replicas":3}}')
    agrees("1800m")
    ok(
        "patch",
        "deployment",
        "web",
        "--type",
        "json",
        "-p",
        '[{"op":"replace","path":"/spec/replicas","value":1}]',
    )
    agrees("600m")
    # Server-side apply, twice: the second changes nothing.
    applied = two_containers("web")
    applied["spec"]["replicas"] = 1
    applied["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1"
    for _ in range(2):
        ok("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(applied))
        agrees("1200m")  # 1 x (1 + 200m): the applied object whole
    # Over the quota (8 cpu): refused whatever the patch type, nothing changed.
    for args in (
        ("-p", '{"spec":{"replicas":7}}'),
        ("--type", "merge", "-p", '{"spec":{"replicas":7}}'),
        ("--type", "json", "-p", '[{"op":"replace","path":"/spec/replicas","value":7}]'),
    ):
        code, out = kubectl(kubectl_binary, env, "patch", "deployment", "web", *args)
        assert code != 0, out
        assert "exceeded quota" in out, out
        agrees("1200m")
    applied["spec"]["replicas"] = 7
    code, out = kubectl(
        kubectl_binary,
        env,
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "-",
        stdin=json.dumps(applied),
    )
    assert code != 0, out
    assert "exceeded quota" in out, out
    agrees("1200m")
    # A deployment made by server-side apply is a create: charged.
    ok("apply", "--server-side", "-f", "-", stdin=json.dumps(two_containers("made")))
    used, stored_cpu, _ = charged_as_stored(env, "made")
    assert (stored_cpu, used) == ("600m", "1800m")
