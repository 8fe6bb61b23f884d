"""Class "two readings" (DESIGN §1, §3, §8): the sidecar decided on its own reading of
a request target while the upstream acted on another. Each attack below worked against
the code before the target was parsed once and forwarded as parsed:

- `…/secrets?x=1#&fieldSelector=metadata.name%3Dapp-config` by a user allowed to list
  only the secret `app-config`: the sidecar read the selector (allowed), the store
  treated `#…` as a fragment and answered every secret (a watch the same);
- `…/configmaps?resourceVersion=0&watch=true#` and `?%77atch=true` by a user with `list`
  but not `watch`: the sidecar decided a list, the store opened a watch;
- a decision parameter given twice: the sidecar and an upstream may pick different ones.

Real processes: the store, a recording pass-through in front of it, the sidecar with
the shipped policies plus one Role; targets sent as raw bytes (an HTTP client would
drop the fragment itself)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.rigs import raw_http, tenancy

SECRETS = "/api/v1/tenants/acme/namespaces/dev/secrets"
CONFIGMAPS = "/api/v1/tenants/acme/namespaces/dev/configmaps"

# amy (acme, group pod-owners) may list and watch the secret `app-config` only, and
# list configmaps of acme/dev but not watch them.
ROLE = """
kind: Role
metadata: {name: narrow, tenant: acme, namespace: dev}
rules:
- apiGroups: [""]
  resources: [secrets]
  resourceNames: [app-config]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, patch]
---
kind: RoleBinding
metadata: {name: narrow, tenant: acme, namespace: dev}
roleRef: {kind: Role, name: narrow}
subjects:
- {kind: User, name: amy}
"""


# One store and sidecar for the whole module, on the module's event loop: no test here
# changes what another reads (each looks only at what reached the store after it began,
# and the one write, a patch of `settings`, is read by no other test).
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tenancy.Env]:
    tmp_path = tmp_path_factory.mktemp("two-readings")
    policies = tmp_path / "policies"
    shutil.copytree(tenancy.SHIPPED_POLICIES, policies, ignore=shutil.ignore_patterns("tests"))
    (policies / "90-narrow.yaml").write_text(ROLE)
    async with tenancy.running(tmp_path, policies=policies) as running:
        status, body = await running.call(
            "admin", "POST", "/api/v1/tenants", {"metadata": {"name": "acme"}}
        )
        assert status == 201, body
        status, body = await running.call(
            "admin", "POST", "/api/v1/tenants/acme/namespaces", {"metadata": {"name": "dev"}}
        )
        assert status == 201, body
        for name in ("app-config", "db-password"):
            secret = {"metadata": {"name": name}, "data": {"k": "c2VjcmV0"}}
            status, body = await running.call("admin", "POST", SECRETS, secret)
            assert status == 201, body
        status, body = await running.call(
            "admin", "POST", CONFIGMAPS, {"metadata": {"name": "settings"}}
        )
        assert status == 201, body
        yield running


async def raw_get(env: tenancy.Env, token: str, target: str) -> raw_http.Message:
    """GET with the target's bytes exactly as written; the answer (an opened watch
    would never end: the exchange times out and the test fails)."""
    port = int(env.url.rsplit(":", 1)[1])
    data = raw_http.request_bytes(
        "GET", target, [("Authorization", f"Bearer {token}"), ("Connection", "close")]
    )
    answers, _ = await raw_http.exchange(port, data, 1, wait=10)
    assert answers, f"no answer to {target}"
    return answers[0]


async def test_the_narrow_grant_works_as_written(env: tenancy.Env) -> None:
    """The baseline the attacks start from: the selector list is allowed and shows only
    app-config; a plain list and a watch of configmaps are refused or allowed as granted."""
    status, body = await env.call(
        "acme-user", "GET", f"{SECRETS}?fieldSelector=metadata.name%3Dapp-config"
    )
    assert status == 200, body
    assert [i["metadata"]["name"] for i in body["items"]] == ["app-config"]
    status, _ = await env.call("acme-user", "GET", SECRETS)
    assert status == 403
    status, _ = await env.call("acme-user", "GET", f"{CONFIGMAPS}?watch=true")
    assert status == 403


@pytest.mark.parametrize(
    "target",
    [
        f"{SECRETS}?x=1#&fieldSelector=metadata.name%3Dapp-config",
        f"{SECRETS}?watch=true&x=1#&fieldSelector=metadata.name%3Dapp-config",
        f"{SECRETS}#?fieldSelector=metadata.name%3Dapp-config",
    ],
)
async def test_a_fragment_cannot_widen_a_resource_names_grant(
    env: tenancy.Env, target: str
) -> None:
    before = len(env.recorder.seen)
    answer = await raw_get(env, "acme-user", target)
    assert answer.status == 400, answer.body[:300]
    assert b"'#'" in answer.body
    assert b"db-password" not in answer.body
    assert env.recorder.seen[before:] == []  # nothing reached the store


@pytest.mark.parametrize(
    ("target", "status"),
    [
        (f"{CONFIGMAPS}?resourceVersion=0&watch=true#", 400),
        (f"{CONFIGMAPS}?%77atch=true", 403),
        (f"{CONFIGMAPS}?wat%63h=tr%75e", 403),
        (f"{CONFIGMAPS}?watch=t", 403),
        (f"{CONFIGMAPS}?watch=TRUE&resourceVersion=0", 403),
        (f"{CONFIGMAPS}?watch=%2574rue", 400),
        (f"{CONFIGMAPS}?watch=yes", 400),
    ],
)
async def test_a_list_grant_never_opens_a_watch(env: tenancy.Env, target: str, status: int) -> None:
    before = len(env.recorder.seen)
    answer = await raw_get(env, "acme-user", target)
    assert answer.status == status, answer.body[:300]
    assert "stream=watch" not in (answer.header("Content-Type") or "")
    assert env.recorder.seen[before:] == []


@pytest.mark.parametrize(
    "query",
    [
        "fieldSelector=metadata.name%3Dapp-config&fieldSelector=metadata.name%3Ddb-password",
        "fieldSelector=metadata.name%3Ddb-password&fieldSelector=metadata.name%3Dapp-config",
        "fieldSelector=metadata.name%3Dapp-config&%66ieldSelector=metadata.name%3Ddb-password",
        "fieldSelector=metadata.name%3Dapp-config&labelSelector=a&labelSelector=b",
        "watch=false&watch=true",
        "fieldSelector=metadata.name%3Dapp-config&owner=a&owner=b",
    ],
)
async def test_a_decision_parameter_given_twice_is_refused(env: tenancy.Env, query: str) -> None:
    before = len(env.recorder.seen)
    answer = await raw_get(env, "acme-user", f"{SECRETS}?{query}")
    assert answer.status == 400, answer.body[:300]
    assert b"more than once" in answer.body
    assert env.recorder.seen[before:] == []


async def test_what_reaches_the_store_is_the_decided_target(env: tenancy.Env) -> None:
    """An allowed request is forwarded rebuilt from its parse: decoded once, encoded
    canonically, the short path with the caller's tenant."""
    before = len(env.recorder.seen)
    answer = await raw_get(
        env,
        "acme-user",
        "/api/v1/namespaces/dev/secrets?fieldSelector=metadata.name%3D%61pp-config&x=a+b",
    )
    assert answer.status == 200, answer.body[:300]
    assert env.recorder.seen[before:] == [
        ("GET", f"{SECRETS}?fieldSelector=metadata.name%3Dapp-config&x=a%20b")
    ]


@pytest.mark.parametrize(
    "target",
    [
        f"{CONFIGMAPS}?watch=true&labelSelector=never%3Dx",
        "/api/v1/watch/tenants/acme/namespaces/dev/configmaps",
    ],
)
async def test_a_head_watch_is_refused(env: tenancy.Env, target: str) -> None:
    """Found by a hostile review: a HEAD answer ends at its headers for the sidecar,
    while the store went on watching on that pooled connection, so the next watch of
    any tenant that drew it hung. A watch is GET alone (405), and nothing is forwarded."""
    before = len(env.recorder.seen)
    port = int(env.url.rsplit(":", 1)[1])
    data = raw_http.request_bytes(
        "HEAD", target, [("Authorization", "Bearer admin"), ("Connection", "close")]
    )
    answers, _ = await raw_http.exchange(port, data, 1, wait=10, head=(True,))
    assert [a.status for a in answers] == [405]
    assert env.recorder.seen[before:] == []


async def test_an_apply_that_creates_needs_create(env: tenancy.Env) -> None:
    """Found by a hostile review: the sidecar decided a server-side apply as `patch`,
    the store created the missing object. As the Kubernetes API server does, an apply
    of an object that does not exist is also decided as `create`; amy may patch
    configmaps but not create them."""
    apply = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: via-apply}\ndata: {a: b}\n"
    url = f"{CONFIGMAPS}/via-apply?fieldManager=kubectl"
    status, body = await env.call_raw(
        "acme-user", "PATCH", url, apply, "application/apply-patch+yaml"
    )
    assert status == 403, body
    assert (await env.call("admin", "GET", f"{CONFIGMAPS}/via-apply"))[0] == 404
    # Applying to an object that exists is a patch, which amy may do.
    status, body = await env.call_raw(
        "acme-user",
        "PATCH",
        f"{CONFIGMAPS}/settings?fieldManager=kubectl",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {a: b}\n",
        "application/apply-patch+yaml",
    )
    assert status == 200, body
    assert body["data"] == {"a": "b"}
