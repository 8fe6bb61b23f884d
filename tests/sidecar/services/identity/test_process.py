"""`sidecar serve` as a real process in front of the real backing store: identity from
the YAML config file plus an environment override (`SIDECAR_IDENTITY__JWT__SECRET`)."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import jwt

from tests.rigs import processes
from tests.rigs.inprocess import write_policy
from tests.rigs.processes import write_tokens
from tests.rigs.tokens import SECRET, claims, hs256, public_pem, rsa_key
from tests.rigs.waiting import eventually_sync


def call(
    url: str,
    method: str,
    path: str,
    token: str | None = None,
    body: Any = None,
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
    store = processes.start_store(tmp_path)
    try:
        tokens = write_tokens(
            tmp_path,
            [
                {"token": "operator", "user": "root", "tenant": "system", "groups": ["operators"]},
            ],
        )
        config = {
            "upstream": store.url,
            "policies": str(write_policy(tmp_path)),
            "identity": {
                "tokenFile": str(tokens),
                "jwt": {"algorithms": ["HS256"], "audience": "sidecar"},
            },
        }
        sidecar = processes.start_sidecar(
            tmp_path, config, env={"SIDECAR_IDENTITY__JWT__SECRET": SECRET}
        )
        try:
            url = sidecar.url
            assert call(url, "GET", "/healthz")[0] == 200
            status, body = call(url, "GET", "/api/v1/tenants")
            assert status == 401
            assert body["reason"] == "Unauthorized"
            status, body = call(
                url, "POST", "/api/v1/tenants", "operator", {"metadata": {"name": "acme"}}
            )
            assert status == 201, body

            alice = hs256(claims("alice", "acme", ["users"], iss=None))
            status, body = call(
                url,
                "POST",
                "/api/v1/namespaces/default/configmaps",
                alice,
                {"metadata": {"name": "cm1"}},
                headers={"X-Remote-Tenant": "system"},
            )
            assert status == 201, body
            assert body["metadata"]["tenant"] == "acme"
            status, body = call(
                url, "GET", "/api/v1/tenants/acme/namespaces/default/configmaps/cm1", "operator"
            )
            assert status == 200
            assert body["metadata"]["name"] == "cm1"

            expired = hs256(claims("alice", "acme", ["users"], iss=None, lifetime=-60))
            status, body = call(url, "GET", "/api/v1/namespaces/default/configmaps", expired)
            assert status == 401
            assert "expired" in body["message"]
            wrong_aud = hs256(claims("alice", "acme", ["users"], iss=None, aud="other"))
            status, body = call(url, "GET", "/api/v1/namespaces/default/configmaps", wrong_aud)
            assert status == 401
            assert "audience" in body["message"]
        finally:
            sidecar.stop()
    finally:
        store.stop()


def _until(check: Any, limit: float = 10.0) -> Any:
    """`check()`'s first truthy value within `limit` seconds, else its last (falsy) one."""
    try:
        return eventually_sync(check, limit)
    except AssertionError:
        return check()


def test_credential_files_are_reread_without_a_restart(tmp_path: Path) -> None:
    """DESIGN §4: rotating a token or a JWT key needs no restart; a file that fails to
    load keeps the last good credentials and shows in /readyz (no path) and the log."""
    store = processes.start_store(tmp_path)
    key_a, key_b = rsa_key(), rsa_key()
    pem = tmp_path / "issuer.pem"
    pem.write_bytes(public_pem(key_a))
    tokens = write_tokens(
        tmp_path,
        [{"token": "old-token", "user": "root", "tenant": "system", "groups": ["operators"]}],
    )
    sidecar = processes.start_sidecar(
        tmp_path,
        {
            "upstream": store.url,
            "policies": str(write_policy(tmp_path)),
            "identity": {
                "tokenFile": str(tokens),
                "jwt": {"algorithms": ["RS256"], "publicKeyFile": str(pem), "audience": "sidecar"},
            },
        },
    )
    path = "/api/v1/tenants"

    def rs256(key: Any) -> str:
        return jwt.encode(claims("root", "system", ["operators"], iss=None), key, algorithm="RS256")

    try:
        url = sidecar.url
        assert call(url, "GET", path, "old-token")[0] == 200
        assert call(url, "GET", path, rs256(key_a))[0] == 200

        write_tokens(
            tmp_path,
            [{"token": "new-token", "user": "root", "tenant": "system", "groups": ["operators"]}],
        )
        pem.write_bytes(public_pem(key_b))
        assert _until(lambda: call(url, "GET", path, "new-token")[0] == 200)
        assert _until(lambda: call(url, "GET", path, rs256(key_b))[0] == 200)
        assert call(url, "GET", path, "old-token")[0] == 401
        assert call(url, "GET", path, rs256(key_a))[0] == 401

        # A broken file: refused, the last good credentials stay, /readyz says so.
        tokens.write_text("- {token: x, user: eve, tenant: Not_A_Tenant}\n")

        def degraded() -> dict[str, Any] | None:
            status, body = call(url, "GET", "/readyz")
            return body if status == 200 and not body["checks"]["credentials"]["ok"] else None

        body = _until(degraded)
        assert body is not None
        assert body["ready"] is True
        assert str(tmp_path) not in json.dumps(body)
        assert call(url, "GET", path, "new-token")[0] == 200
        assert "credential reload refused" in sidecar.log()
        assert "Not_A_Tenant" in sidecar.log()
    finally:
        sidecar.stop()
        store.stop()


def _rewrite_unnoticed(path: Path, text: str) -> None:
    """Replace a file's bytes in place, keeping its size, inode and mtime: a change
    that polling cannot see, only a forced reload."""
    before = path.stat()
    data = text.encode()
    assert len(data) == before.st_size
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_sighup_rereads_credentials_and_policy(tmp_path: Path) -> None:
    """DESIGN §4: SIGHUP re-reads the credential files (and, through the same one
    handler, the policy) even when nothing a watcher could see has changed."""
    store = processes.start_store(tmp_path)
    tokens = write_tokens(
        tmp_path,
        [{"token": "old-token", "user": "root", "tenant": "system", "groups": ["operators"]}],
    )
    policies = write_policy(tmp_path)
    sidecar = processes.start_sidecar(
        tmp_path,
        {
            "upstream": store.url,
            "policies": str(policies),
            "identity": {"tokenFile": str(tokens)},
            "reload": {"enabled": False},
        },
    )
    path = "/api/v1/tenants"

    def revision() -> str:
        status, body = call(sidecar.url, "GET", "/readyz")
        assert status == 200
        detail: str = body["checks"]["policy"]["detail"]
        return detail.split()[1]

    try:
        url = sidecar.url
        assert call(url, "GET", path, "old-token")[0] == 200
        old_revision = revision()
        _rewrite_unnoticed(tokens, tokens.read_text().replace("old-token", "new-token"))
        policy_file = next(policies.glob("*.yaml"))
        policy_file.write_text(policy_file.read_text() + "\n# touched\n")
        os.kill(sidecar.pid, signal.SIGHUP)
        assert _until(lambda: call(url, "GET", path, "new-token")[0] == 200)
        assert call(url, "GET", path, "old-token")[0] == 401
        assert _until(lambda: revision() != old_revision)
        assert sidecar.proc.poll() is None  # SIGHUP reloads, it does not stop the sidecar
    finally:
        sidecar.stop()
        store.stop()
