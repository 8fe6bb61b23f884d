"""`dryRun=All` through the real sidecar and the real store (DESIGN §7): a dry-run
write is checked against the quota (403 QuotaExceeded when there is no room) but
reserves and charges nothing, and the store stores nothing; a dry-run delete leaves
the object and its charge in place; any other dryRun value is a 400 from the sidecar
itself, before anything is forwarded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.rigs.stack import ALICE, CONFIGMAPS, Env, running_env

PODS = "/api/v1/namespaces/ns1/pods"


def pod(name: str, cpu: str) -> dict[str, Any]:
    container = {"name": "c", "image": "nginx", "resources": {"requests": {"cpu": cpu}}}
    return {"metadata": {"name": name}, "spec": {"containers": [container]}}


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    """Room for one configmap and one cpu per tenant."""
    async with running_env(tmp_path, limit=1) as e:
        yield e


async def test_dry_run_create_below_the_limit_charges_and_stores_nothing(env: Env) -> None:
    status, body = await env.call(
        ALICE, "POST", f"{CONFIGMAPS}?dryRun=All", {"metadata": {"name": "cm1"}}
    )
    assert status == 201, body
    assert body["metadata"]["name"] == "cm1"
    assert await env.used("acme", "configmaps") == ("0", "0")
    assert await env.stored("acme", "namespaces/ns1/configmaps") == []
    # ... so the one real create the quota allows still passes.
    status, body = await env.call(ALICE, "POST", CONFIGMAPS, {"metadata": {"name": "cm1"}})
    assert status == 201, body
    assert await env.used("acme", "configmaps") == ("1", "0")


async def test_dry_run_create_at_the_limit_is_403(env: Env) -> None:
    status, body = await env.call(ALICE, "POST", CONFIGMAPS, {"metadata": {"name": "cm1"}})
    assert status == 201, body
    status, body = await env.call(
        ALICE, "POST", f"{CONFIGMAPS}?dryRun=All", {"metadata": {"name": "cm2"}}
    )
    assert status == 403, body
    assert body["kind"] == "Status"
    assert body["reason"] == "QuotaExceeded"
    assert await env.used("acme", "configmaps") == ("1", "0")
    assert await env.stored("acme", "namespaces/ns1/configmaps") == ["cm1"]


@pytest.mark.parametrize("how", ["query", "DeleteOptions"])
async def test_dry_run_delete_keeps_the_object_and_its_charge(env: Env, how: str) -> None:
    status, body = await env.call(ALICE, "POST", CONFIGMAPS, {"metadata": {"name": "cm1"}})
    assert status == 201, body
    if how == "query":
        status, body = await env.call(ALICE, "DELETE", f"{CONFIGMAPS}/cm1?dryRun=All")
    else:
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]}
        status, body = await env.call(ALICE, "DELETE", f"{CONFIGMAPS}/cm1", options)
    assert status == 200, body
    assert await env.stored("acme", "namespaces/ns1/configmaps") == ["cm1"]
    assert await env.used("acme", "configmaps") == ("1", "0")
    # The charge is still there: no room for a second configmap.
    status, body = await env.call(ALICE, "POST", CONFIGMAPS, {"metadata": {"name": "cm2"}})
    assert status == 403, body
    # A real delete still returns it.
    status, body = await env.call(ALICE, "DELETE", f"{CONFIGMAPS}/cm1")
    assert status == 200, body
    assert await env.used("acme", "configmaps") == ("0", "0")


async def test_dry_run_namespace_delete_keeps_its_usage(env: Env) -> None:
    """A dry-run delete of a namespace drops none of its objects' charges."""
    status, body = await env.call(ALICE, "POST", CONFIGMAPS, {"metadata": {"name": "cm1"}})
    assert status == 201, body
    status, body = await env.call(ALICE, "DELETE", "/api/v1/namespaces/ns1?dryRun=All")
    assert status == 200, body
    assert await env.stored("acme", "namespaces/ns1/configmaps") == ["cm1"]
    assert await env.used("acme", "configmaps") == ("1", "0")
    status, body = await env.call(ALICE, "POST", CONFIGMAPS, {"metadata": {"name": "cm2"}})
    assert status == 403, body  # still charged: no room for a second one


async def test_dry_run_patch_is_checked_and_charges_nothing(env: Env) -> None:
    status, body = await env.call(ALICE, "POST", PODS, pod("p1", "500m"))
    assert status == 201, body
    before = await env.used("acme", "requests.cpu")
    merge = "application/merge-patch+json"
    status, body = await env.call(
        ALICE, "PATCH", f"{PODS}/p1?dryRun=All", pod("p1", "2"), content_type=merge
    )
    assert status == 403, body
    assert body["reason"] == "QuotaExceeded"
    status, body = await env.call(
        ALICE, "PATCH", f"{PODS}/p1?dryRun=All", pod("p1", "900m"), content_type=merge
    )
    assert status == 200, body
    assert body["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "900m"
    assert await env.used("acme", "requests.cpu") == before
    status, stored = await env.call(ALICE, "GET", f"{PODS}/p1")
    assert stored["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "500m"
    # Nothing was left reserved: the real patch to 900m fits.
    status, body = await env.call(
        ALICE, "PATCH", f"{PODS}/p1", pod("p1", "900m"), content_type=merge
    )
    assert status == 200, body


async def test_dry_run_update_leaves_the_object(env: Env) -> None:
    status, body = await env.call(ALICE, "POST", PODS, pod("p1", "500m"))
    assert status == 201, body
    status, body = await env.call(ALICE, "PUT", f"{PODS}/p1?dryRun=All", pod("p1", "700m"))
    assert status == 200, body
    status, stored = await env.call(ALICE, "GET", f"{PODS}/p1")
    assert stored["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "500m"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", f"{CONFIGMAPS}?dryRun=all", {"metadata": {"name": "cm1"}}),
        ("POST", f"{CONFIGMAPS}?dryRun=", {"metadata": {"name": "cm1"}}),
        ("POST", f"{CONFIGMAPS}?dryRun=All&dryRun=Some", {"metadata": {"name": "cm1"}}),
        ("PUT", f"{CONFIGMAPS}/cm0?dryRun=true", {"metadata": {"name": "cm0"}}),
        ("DELETE", f"{CONFIGMAPS}/cm0?dryRun=yes", None),
        ("DELETE", f"{CONFIGMAPS}/cm0", {"kind": "DeleteOptions", "dryRun": ["Everything"]}),
        ("DELETE", f"{CONFIGMAPS}/cm0", {"kind": "DeleteOptions", "dryRun": "All"}),
    ],
)
async def test_unknown_dry_run_value_is_400_from_the_sidecar(
    tmp_path: Path, method: str, path: str, body: Any
) -> None:
    """Answered by the sidecar before forwarding: with the store stopped it is still a
    400 (a forwarded request would be a 502)."""
    async with running_env(tmp_path, limit=1) as env:
        status, answer = await env.call(ALICE, "POST", CONFIGMAPS, {"metadata": {"name": "cm0"}})
        assert status == 201, answer
        env.stop_store()
        status, answer = await env.call(ALICE, method, path, body)
        assert status == 400, answer
        assert answer["kind"] == "Status"
        assert "dryRun" in answer["message"]
        status, answer = await env.call(ALICE, "DELETE", f"{CONFIGMAPS}/cm0?dryRun=All")
        assert status == 502, answer  # a valid one is forwarded
        assert await env.used("acme", "configmaps") == ("1", "0")
