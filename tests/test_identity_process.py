"""`sidecar serve` as a real process in front of the real backing store: identity from
the YAML config file plus an environment override (`SIDECAR_IDENTITY__JWT__SECRET`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests import harness
from tests.test_identity_support import SECRET, claims, hs256, write_policy, write_tokens


def call(
    url: str, method: str, path: str, token: str | None = None, body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    h = dict(headers or {})
    if token:
        h["Authorization"] = f"Bearer {token}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    req = urllib.request.Request(url + path, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_sidecar_process_authenticates_from_config_and_env(tmp_path: Path) -> None:
    store = harness.start_store(tmp_path)
    try:
        tokens = write_tokens(tmp_path, [
            {"token": "operator", "user": "root", "tenant": "system",
             "groups": ["operators"]},
        ])
        config = {
            "upstream": store.url,
            "policies": str(write_policy(tmp_path)),
            "identity": {"tokenFile": str(tokens),
                         "jwt": {"algorithms": ["HS256"], "audience": "sidecar"}},
        }
        sidecar = harness.start_sidecar(
            tmp_path, config, env={"SIDECAR_IDENTITY__JWT__SECRET": SECRET}
        )
        try:
            url = sidecar.url
            assert call(url, "GET", "/healthz")[0] == 200
            status, body = call(url, "GET", "/api/v1/tenants")
            assert status == 401 and body["reason"] == "Unauthorized"
            status, body = call(url, "POST", "/api/v1/tenants", "operator",
                                {"metadata": {"name": "acme"}})
            assert status == 201, body

            alice = hs256(claims("alice", "acme", ["users"], iss=None))
            status, body = call(url, "POST", "/api/v1/namespaces/default/configmaps", alice,
                                {"metadata": {"name": "cm1"}},
                                headers={"X-Remote-Tenant": "system"})
            assert status == 201, body
            assert body["metadata"]["tenant"] == "acme"
            status, body = call(url, "GET",
                                "/api/v1/tenants/acme/namespaces/default/configmaps/cm1",
                                "operator")
            assert status == 200 and body["metadata"]["name"] == "cm1"

            expired = hs256(claims("alice", "acme", ["users"], iss=None, lifetime=-60))
            status, body = call(url, "GET", "/api/v1/namespaces/default/configmaps", expired)
            assert status == 401 and "expired" in body["message"]
            wrong_aud = hs256(claims("alice", "acme", ["users"], iss=None, aud="other"))
            status, body = call(url, "GET", "/api/v1/namespaces/default/configmaps",
                                wrong_aud)
            assert status == 401 and "audience" in body["message"]
        finally:
            sidecar.stop()
    finally:
        store.stop()
