"""Tenant-aware locust users: each tenant's users call the API with that tenant's token.

The tenants come from the JSON file named by `LOADTEST_TENANTS`
(`{"tenants": [{"name", "token", "namespace", "weight"?}]}`, written by
`loadtests/run.py mix`); without it, from `LOADTEST_TOKENS` (`tenant=token,...`,
namespace `dev`). One `HttpUser` class is made per tenant (`Tenant_<name>`), so
locust's statistics and `--csv` files show each tenant's calls by name
(`alpha list servers`). Each user mixes list/get/create/delete and tag calls on
`compute/v1` servers in its tenant's namespace, at `LOADTEST_RATE` requests/s per
user (default 2).

HTTPS: `-H https://…`, and `LOADTEST_CA` names the CA file that signed the sidecar's
certificate (`sidecar demo` writes its `ca.crt`); without it the system's CAs are
trusted. locust's client does not read `REQUESTS_CA_BUNDLE`.

    LOADTEST_TOKENS=acme=dev-alice-acme locust -f loadtests/locustfile.py \
        --headless --users 20 --spawn-rate 20 --run-time 30s -H http://127.0.0.1:8443 \
        --csv out/mix
"""

from __future__ import annotations

import itertools
import json
import os
import random
import uuid
from typing import Any

from locust import HttpUser, constant_throughput, task

RATE = float(os.environ.get("LOADTEST_RATE", "2"))
# The CA bundle that verifies an HTTPS sidecar's certificate (None: the system's CAs).
CA_FILE = os.environ.get("LOADTEST_CA") or None
_names = itertools.count()


def _tenants() -> list[dict[str, Any]]:
    path = os.environ.get("LOADTEST_TENANTS")
    if path:
        with open(path) as fh:
            data: dict[str, Any] = json.load(fh)
        return list(data["tenants"])
    pairs = os.environ.get("LOADTEST_TOKENS", "acme=dev-alice-acme")
    out = []
    for pair in pairs.split(","):
        name, _, token = pair.partition("=")
        out.append({"name": name.strip(), "token": token.strip(), "namespace": "dev"})
    return out


class TenantUser(HttpUser):
    """A user of one tenant; subclasses set `tenant`, `token`, `namespace`."""

    abstract = True
    wait_time = constant_throughput(RATE)
    tenant = ""
    token = ""
    namespace = "dev"

    def on_start(self) -> None:
        if CA_FILE is not None:
            self.client.verify = CA_FILE
        self.client.headers["Authorization"] = f"Bearer {self.token}"
        self.base = f"/apis/compute/v1/tenants/{self.tenant}/namespaces/{self.namespace}/servers"
        self.mine: list[str] = []

    def _name(self, op: str) -> str:
        return f"{self.tenant} {op}"

    @task(4)
    def list_servers(self) -> None:
        self.client.get(self.base, name=self._name("list servers"))

    @task(6)
    def get_server(self) -> None:
        name = random.choice(self.mine) if self.mine else f"web-{random.randrange(5)}"
        with self.client.get(
            f"{self.base}/{name}", name=self._name("get server"), catch_response=True
        ) as resp:
            if resp.status_code == 404 and name in self.mine:
                resp.success()  # deleted by a race with our own delete task

    @task(2)
    def create_server(self) -> None:
        name = f"lc-{uuid.uuid4().hex[:10]}-{next(_names)}"
        body = {"metadata": {"name": name}, "spec": {"flavor": "m1.small"}, "tags": ["load"]}
        with self.client.post(
            self.base, json=body, name=self._name("create server"), catch_response=True
        ) as resp:
            if resp.status_code == 201:
                self.mine.append(name)

    @task(1)
    def delete_server(self) -> None:
        if not self.mine:
            return
        name = self.mine.pop(0)
        self.client.delete(f"{self.base}/{name}", name=self._name("delete server"))

    @task(2)
    def tag_server(self) -> None:
        if not self.mine:
            return
        name = random.choice(self.mine)
        self.client.put(f"{self.base}/{name}/tags/red", name=self._name("put tag"))
        self.client.get(f"{self.base}/{name}/tags", name=self._name("get tags"))

    @task(1)
    def list_tagged(self) -> None:
        self.client.get(self.base, params={"tags-any": "load,red"}, name=self._name("list tagged"))


for _t in _tenants():
    _cls_name = "Tenant_" + _t["name"].replace("-", "_")
    globals()[_cls_name] = type(
        _cls_name,
        (TenantUser,),
        {
            "tenant": _t["name"],
            "token": _t["token"],
            "namespace": _t.get("namespace", "dev"),
            "weight": int(_t.get("weight", 1)),
            "abstract": False,
        },
    )
