"""Attack: an encoded separator in the API prefix (issue 12, finding 5; DESIGN §3).

`/api/v1%2Ftenants%2Fbeta%2F…` splits into fewer segments than it decodes to. Parsed
as a non-resource URL, the shipped discovery rule (`/api/*`) allowed it and it was
forwarded raw; an upstream that decodes before routing (Go's net/http) then served
another tenant's secrets. An encoded `/` or `\\` in the prefix, group or version, in
a resource or subresource segment, or anywhere in a non-resource URL, is a 400 that
never reaches the upstream; so is a dot-segment hidden behind an encoded separator.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rigs.tenancy import running, seed

ATTACKS = [
    # the reported paths: another tenant's secrets, every tenant's secrets
    "/api/v1%2Ftenants%2Fbeta%2Fnamespaces%2Fdev%2Fsecrets",
    "/api/v1%2Fsecrets",
    "/api/v1%2ftenants%2fbeta%2fnamespaces%2fdev%2fsecrets",  # lower-case hex
    "/api%2Fv1%2Fsecrets",
    "/api%2Fv1/secrets",
    "/apis/apps%2Fv1/deployments",
    "/apis/apps/v1%2Ftenants%2Fbeta%2Fnamespaces%2Fdev%2Fdeployments",
    "/apis%2Fapps%2Fv1%2Fdeployments",
    # backslash, encoded or literal (some upstreams treat it as a separator)
    "/api/v1%5Csecrets",
    "/api/v1%5csecrets",
    "/api\\v1\\secrets",
    "/apis/apps\\v1/deployments",
    # non-resource URLs
    "/version%2F..%2Fapi%2Fv1%2Fsecrets",
    "/openapi/v2%2F..%2F..%2Fapi%2Fv1%2Fsecrets",
    # a resource segment that decodes into a path
    "/api/v1/tenants%2Fbeta%2Fnamespaces%2Fdev%2Fsecrets",
    "/api/v1/tenants/acme/namespaces/dev/secrets%2F..%2F..%2F..%2F..%2Fbeta%2Fnamespaces"
    "%2Fdev%2Fsecrets",
    # a name hiding dot-segments behind encoded separators
    "/api/v1/tenants/acme/namespaces/dev/configmaps/x%2F..%2F..%2F..%2F..%2Fbeta"
    "%2Fnamespaces%2Fdev%2Fsecrets",
]


@pytest.mark.parametrize("token", ["acme-admin", "acme-dev"])
async def test_encoded_separators_are_400_and_never_forwarded(tmp_path: Path, token: str) -> None:
    async with running(tmp_path) as env:
        await seed(env, {})
        for ns_tenant in ("acme", "beta"):
            status, body = await env.call(
                "admin",
                "POST",
                f"/api/v1/tenants/{ns_tenant}/namespaces",
                {"metadata": {"name": "dev"}},
            )
            assert status == 201, body
            status, body = await env.call(
                "admin",
                "POST",
                f"/api/v1/tenants/{ns_tenant}/namespaces/dev/secrets",
                {"metadata": {"name": f"{ns_tenant}-secret"}, "data": {"k": "czNjcjN0"}},
            )
            assert status == 201, body
        before = len(env.recorder.seen)
        for path in ATTACKS:
            for method in ("GET", "DELETE"):
                status, body = await env.call(token, method, path)
                assert status == 400, (method, path, status, body)
                assert isinstance(body, dict), (path, body)
                assert body.get("kind") == "Status", (path, body)
                assert body.get("code") == 400
                assert "beta-secret" not in str(body)
        assert env.recorder.seen[before:] == []


async def test_legitimate_paths_still_pass(tmp_path: Path) -> None:
    """Discovery, a name that merely contains an encoded slash, and a double-encoded
    `%252F` (the literal text `%2F`) are not refused."""
    async with running(tmp_path) as env:
        await seed(env, {})
        for path in ("/version", "/api", "/api/v1", "/apis/apps/v1"):
            status, _ = await env.call("acme-dev", "GET", path)
            assert status != 400, path
        status, body = await env.call(
            "acme-admin", "GET", "/api/v1/tenants/acme/namespaces/dev/configmaps/a%2Fb"
        )
        assert status == 404, body
        assert body["kind"] == "Status", body
        status, body = await env.call("acme-dev", "GET", "/api/v1%252Fsecrets")
        assert status != 400 or "separator" not in str(body)
