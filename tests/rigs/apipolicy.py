"""Policy objects through the API (DESIGN §5): the real store and two real sidecars on
it (one shared SQLite ledger), the shipped policies, tenants acme and beta with
namespaces dev and prod. `call` sends a request through a chosen sidecar as one of
`TOKENS`; `store_call` goes straight to the store (as the sidecar's own `system`
client would), to see what was stored or to plant what the sidecar would refuse."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tests.rigs import paths, processes

RBAC = "/apis/rbac.authorization.k8s.io/v1"
# token → identity; the shipped policies bind `admin` cluster-wide and the
# `tenant-admins` of acme and beta in their tenant. amy and ben have no grant.
TOKENS = [
    {"token": "admin", "user": "admin", "tenant": "system", "groups": []},
    {"token": "alice", "user": "alice", "tenant": "acme", "groups": ["tenant-admins"]},
    {"token": "amy", "user": "amy", "tenant": "acme", "groups": []},
    {"token": "ben", "user": "ben", "tenant": "acme", "groups": []},
    {"token": "bert", "user": "bert", "tenant": "beta", "groups": ["tenant-admins"]},
]
SYSTEM = {"X-Remote-User": "admin", "X-Remote-Tenant": "system"}


@dataclass
class ApiPolicyEnv:
    tmp: Path
    procs: processes.Processes
    store: processes.Proc
    sidecars: list[processes.Proc]
    configs: list[dict[str, Any]]

    async def call(
        self, token: str, method: str, path: str, body: Any = None, *, via: int = 0, **kw: Any
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"}
        return await _send(self.sidecars[via].url + path, method, headers, body, **kw)

    async def store_call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return await _send(self.store.url + path, method, dict(SYSTEM), body)

    async def ready(self, via: int = 0) -> dict[str, Any]:
        status, body = await _send(self.sidecars[via].url + "/readyz", "GET", {}, None)
        assert isinstance(body, dict), body
        body["status"] = status
        return body

    def restart(self, index: int) -> None:
        self.sidecars[index].stop()
        self.sidecars[index] = self.procs.sidecar(self.configs[index], name=f"sidecar{index}")


async def _send(
    url: str,
    method: str,
    headers: dict[str, str],
    body: Any,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    data = None
    if body is not None:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        headers = {**headers, "Content-Type": content_type}
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, headers=headers, data=data) as resp,
    ):
        raw = await resp.read()
    try:
        return resp.status, json.loads(raw) if raw else None
    except ValueError:
        return resp.status, raw.decode(errors="replace")


def start(tmp: Path, procs: processes.Processes, sidecars: int = 2) -> ApiPolicyEnv:
    tokens = processes.write_tokens(tmp, TOKENS)
    store = procs.store()
    configs = []
    started = []
    for i in range(sidecars):
        config = {
            "upstream": store.url,
            "policies": str(paths.SHIPPED_POLICIES),
            "identity": {"tokenFile": str(tokens)},
            "ledger": f"sqlite:///{tmp / 'ledger.db'}",
            "audit": {"path": str(tmp / f"audit{i}.log")},
            "apiPolicy": {"retrySeconds": 0.2},
        }
        configs.append(config)
        started.append(procs.sidecar(config, name=f"sidecar{i}"))
    return ApiPolicyEnv(tmp, procs, store, started, configs)


async def seed(env: ApiPolicyEnv) -> None:
    for tenant in ("acme", "beta"):
        status, _ = await env.store_call("POST", "/api/v1/tenants", {"metadata": {"name": tenant}})
        assert status in (201, 409)
        for ns in ("dev", "prod"):
            status, _ = await env.store_call(
                "POST", f"/api/v1/tenants/{tenant}/namespaces", {"metadata": {"name": ns}}
            )
            assert status in (201, 409)


def role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "rules": rules}


def binding(name: str, kind: str, ref: str, *users: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": ref},
        "subjects": [
            {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": u} for u in users
        ],
    }


def ns_path(tenant: str, ns: str, resource: str, group: str = RBAC) -> str:
    return f"{group}/tenants/{tenant}/namespaces/{ns}/{resource}"
