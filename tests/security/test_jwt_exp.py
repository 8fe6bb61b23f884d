"""JWTs without `exp` (DESIGN §4): a token that never expires is a credential that can
never be revoked by time, so it is refused (401 with the reason) unless the operator
turns `identity.jwt.requireExp` off. Real sidecar and backing store processes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.rigs import tenancy
from tests.rigs.tokens import SECRET, hs256

PATH = "/api/v1/namespaces/default/configmaps"


def token(**claims: Any) -> str:
    body: dict[str, Any] = {"sub": "alice", "tenant": "acme", "groups": ["tenant-admins"]}
    body.update(claims)
    return hs256({k: v for k, v in body.items() if v is not None})


def jwt_identity(require_exp: bool | None) -> dict[str, Any]:
    jwt: dict[str, Any] = {"secret": SECRET, "algorithms": ["HS256"]}
    if require_exp is not None:
        jwt["requireExp"] = require_exp
    return {"identity": {"jwt": jwt}}


async def test_token_without_exp_is_refused_by_default(tmp_path: Path) -> None:
    async with tenancy.running(tmp_path, **jwt_identity(None)) as env:
        status, body = await env.call(token(exp=int(time.time()) + 600), "GET", PATH)
        assert status != 401, body
        control = status

        status, body = await env.call(token(), "GET", PATH)
        assert status == 401, body
        assert body["kind"] == "Status", body
        assert "exp" in body["message"], body
        # Asked again (a verification cache must not remember it either).
        status, _ = await env.call(token(), "GET", PATH)
        assert status == 401

        status, body = await env.call(token(exp=int(time.time()) - 30), "GET", PATH)
        assert status == 401, body
        assert "expired" in body["message"], body
        # Only the token with a future exp was forwarded.
        assert control != 401
        assert len(env.upstream_saw("/configmaps")) == 1


async def test_require_exp_false_accepts_it(tmp_path: Path) -> None:
    async with tenancy.running(tmp_path, **jwt_identity(False)) as env:
        with_exp, _ = await env.call(token(exp=int(time.time()) + 600), "GET", PATH)
        without, body = await env.call(token(), "GET", PATH)
        assert without == with_exp != 401, body
        # An expired token stays refused.
        status, body = await env.call(token(exp=int(time.time()) - 30), "GET", PATH)
        assert status == 401, body
        assert "expired" in body["message"], body
